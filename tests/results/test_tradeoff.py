"""Cost beside quality (issue 23): every compare format carries each cell's density and cost, equal to what the
episodes stored; a sweep of jobs at several densities is aligned by density, not mixed into one column; the
dashboard's multi-job compare, the trade-off charts and the report show the same numbers.

The sweep (``tests.support.sweep_fixtures``) is written through the real claim / record_turn / finish API."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
from fastapi.testclient import TestClient

from dashboard.app import create_app
from dashboard.report import write_report
from dashboard.tradeoff_charts import quality_vs_cost_chart, quality_vs_density_chart
from db import connect, sqlite_url
from db.finishing import turn_means
from results.compare import compare_jobs
from results.compare_csv import to_csv
from results.compare_render import render
from results.cost import COST_FIELDS, EpisodeCost, summarize_cost
from results.replay_stats import ReplayOutcome, summarize_replays
from tests.cli.test_cli import invoke
from tests.support.sweep_fixtures import DENSITIES, METHODS, TASKS, expected_cost, store_sweep


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    db = connect(sqlite_url(tmp_path_factory.mktemp("sweep") / "sweep.db"))
    return store_sweep(db)


@pytest.fixture(scope="module")
def table(sweep):
    with sweep.db.session() as s:
        return compare_jobs(s, sweep.job_ids)


def _cells(sweep):
    """(method, density, the episode ids the cell summarizes): dense once, each method at each density."""
    yield "dense", None, [sweep.episode_ids[(t, "dense", None)] for t in TASKS]
    for density in DENSITIES:
        for method in METHODS:
            yield method, density, [sweep.episode_ids[(t, method, density)] for t in TASKS]


def test_a_sweep_is_aligned_by_density_with_dense_in_each_row(table, sweep):
    assert table.job_ids == sweep.job_ids
    assert [r.density for r in table.rows] == list(DENSITIES) and table.densities == list(DENSITIES)
    assert not [n for n in table.notes if "differ in density" in n]
    assert any("aligned by density (0.1, 0.2, 0.5)" in n for n in table.notes)
    for row in table.rows:  # dense keeps every token: the same 3/3 in every row, its density 1.0
        assert (row.cells["dense"].resolved, row.cells["dense"].density) == (3, 1.0)
        assert (row.cells["nexus"].resolved, row.cells["nexus"].density) == (
            {0.1: 1, 0.2: 2, 0.5: 3}[row.density],
            row.density,
        )
        assert row.cells["snapkv"].resolved == {0.1: 0, 0.2: 1, 0.5: 2}[row.density]


def test_every_cells_cost_equals_what_its_episodes_stored(table, sweep):
    for method, density, episode_ids in _cells(sweep):
        row = next(r for r in table.rows if density is None or r.density == density)
        cost = row.cells[method].cost
        want = expected_cost(sweep.db, episode_ids)
        assert cost.episodes == len(TASKS)
        for name, value in want.items():
            assert getattr(cost, name) == pytest.approx(value, rel=1e-12), (method, density, name)
    # the toy telemetry keeps about the density, dense everything: the column means what its label says
    assert table.rows[0].cells["dense"].cost.kept_fraction == 1.0
    assert table.rows[1].cells["snapkv"].cost.kept_fraction == pytest.approx(0.2, abs=0.002)


def test_json_and_csv_carry_density_and_cost_for_every_cell(table, sweep):
    data = json.loads(render(table, "json"))
    lines = list(csv.DictReader(io.StringIO(to_csv(table))))
    assert len(lines) == len(DENSITIES) * (1 + len(METHODS))
    for method, density, episode_ids in _cells(sweep):
        want = expected_cost(sweep.db, episode_ids)
        for row_json in data["rows"]:
            if density is not None and row_json["density"] != density:
                continue
            cell = row_json["cells"][method]
            assert cell["density"] == (1.0 if density is None else density)
            for name, value in want.items():
                assert cell["cost"][name] == pytest.approx(value, rel=1e-12)
        for line in lines:
            if line["method"] != method or (density is not None and float(line["row_density"]) != density):
                continue
            assert float(line["density"]) == (1.0 if density is None else density)
            for name, value in want.items():  # bytes as whole numbers, the rest to 6 significant digits
                close = pytest.approx(value, abs=0.5) if name.endswith("_bytes") else pytest.approx(value, rel=1e-5)
                assert float(line[name]) == close, (method, density, name)
            assert int(line["cost_episodes"]) == len(TASKS)
    assert {name if name != "episodes" else "cost_episodes" for name in COST_FIELDS} <= set(lines[0])
    grid = list(csv.DictReader(io.StringIO(to_csv(table, grid=True))))
    assert {g["density"] for g in grid} == {"", "0.1", "0.2", "0.5"}


def test_markdown_and_table_show_the_density_rows_and_quality_beside_cost(table):
    md = render(table, "markdown")
    assert "| scope | protocol | density | dense | snapkv | nexus |" in md
    assert "| prefill_decode | true_eviction | 0.2 | 3/3 100.0% [43.9–100.0] |" in md
    assert re.search(
        r"\| prefill_decode \| true_eviction \| 0\.5 \| nexus \| 3/3 100\.0% \[43\.9–100\.0\] \| 50\.1% \|", md
    )
    assert "| task | prefill_decode/true_eviction/dense | prefill_decode/true_eviction/d=0.1/snapkv |" in md
    text = render(table, "table", width=160)
    assert "quality beside cost" in text and "density 0.5" in text
    assert "KV held" in text and "KV held peak" in text and "KV alloc peak" in text
    assert "KV held peak | KV alloc peak" in md


def test_cost_summary_skips_what_a_backend_did_not_report():
    assert summarize_cost([None, EpisodeCost()]).episodes == 0
    costs = [
        EpisodeCost(n_turns=2, kv_peak_held_bytes=10, kv_peak_allocated_bytes=30, mean_kv_held_bytes=4.0),
        EpisodeCost(n_turns=4, wall_s=3.0),  # stored before the KV figures existed, or by a backend without a cache
        EpisodeCost(n_turns=3, kv_peak_held_bytes=20, kv_peak_allocated_bytes=50, mean_kv_held_bytes=8.0),
    ]
    cost = summarize_cost(costs)
    assert (cost.episodes, cost.turns, cost.wall_s) == (3, 3.0, 3.0)
    assert (cost.mean_kv_held_bytes, cost.mean_kv_peak_held_bytes) == (6.0, 15.0)  # the others' means, not /3
    assert (cost.mean_kv_peak_allocated_bytes, cost.max_kv_peak_allocated_bytes) == (40.0, 50)
    assert cost.kept_fraction is None  # no turn reported its slots: not 0
    none = summarize_cost([EpisodeCost(n_turns=1)])
    assert [getattr(none, name) for name in COST_FIELDS if "kv" in name] == [None] * 4
    means = turn_means([(100, {"mean": 10}, 40), (None, {"mean": 30}, 60), (300, None, 0)])
    assert means == {"mean_kv_held_bytes": 200.0, "kept_fraction": pytest.approx((0.25 + 0.5) / 2)}


def test_replays_at_two_densities_are_two_cells():
    outcomes = [
        ReplayOutcome("e1", "t1", "dense", "prefill_only", "true_eviction", "ok", 1.0, 1.0, 10),
        ReplayOutcome("e1", "t1", "nexus", "prefill_only", "true_eviction", "ok", 1.5, 0.9, 10, density=0.1),
        ReplayOutcome("e1", "t1", "nexus", "prefill_only", "true_eviction", "ok", 1.2, 0.95, 10, density=0.5),
    ]
    cells = summarize_replays(outcomes)
    assert [(c.method, c.density, c.delta_nll) for c in cells] == [
        ("dense", None, 0.0),
        ("nexus", 0.1, pytest.approx(0.5)),
        ("nexus", 0.5, pytest.approx(0.2)),
    ]


def test_density_chart_has_a_series_per_method_and_a_point_per_density(table):
    svg = quality_vs_density_chart(table)
    assert set(re.findall(r'class="series" data-method="(\w+)"', svg)) == {"dense", *METHODS}
    for method in METHODS:
        points = re.findall(rf'class="point" data-method="{method}" data-density="([\d.]+)"', svg)
        assert sorted(map(float, points)) == list(DENSITIES)
    assert len(re.findall(r'class="point"', quality_vs_cost_chart(table))) == 1 + len(METHODS) * len(DENSITIES)


def test_one_density_draws_no_density_chart(sweep):
    with sweep.db.session() as s:
        one = compare_jobs(s, sweep.job_ids[:1])
    assert one.densities == [0.1] and quality_vs_density_chart(one) == ""
    assert quality_vs_cost_chart(one)


def test_dashboard_compares_a_sweep_and_its_downloads_are_the_clis(sweep, table):
    client = TestClient(create_app(sweep.db.url, token=None, public=False, allowed_hosts=["testserver"]))
    jobs = ",".join(j[:6] for j in sweep.job_ids)
    page = client.get(f"/compare?jobs={jobs}")
    assert page.status_code == 200
    html = page.text
    assert 'id="density-chart"' in html and 'id="cost-chart"' in html and 'id="tradeoff"' in html
    cell = re.search(r'<td class="cell"[^>]*data-method="nexus" data-density="0\.2"[^>]*>', html).group(0)
    want = table.rows[1].cells["nexus"].cost
    assert f'data-cost-mean-kv-held-bytes="{want.mean_kv_held_bytes!r}"' in cell
    assert f'data-cost-max-kv-peak-allocated-bytes="{float(want.max_kv_peak_allocated_bytes)!r}"' in cell
    assert f'data-cost-kept-fraction="{want.kept_fraction!r}"' in cell
    assert client.get(f"/compare.json?jobs={jobs}").json() == json.loads(render(table, "json"))
    assert client.get(f"/compare.csv?jobs={jobs}").text == to_csv(table)
    assert client.get("/compare?jobs=,").status_code == 400
    missing = client.get("/compare?jobs=zzzzzz")
    assert missing.status_code == 404 and "zzzzzz" in missing.text


def test_cli_compare_of_a_sweep_and_its_report(sweep, table, tmp_path):
    done = invoke("compare", *sweep.job_ids, "--format", "csv", "--db", sweep.db.url)
    assert done.exit_code == 0, done.output
    assert done.output.strip() == to_csv(table).strip()
    out = write_report(sweep.db.url, sweep.job_ids, tmp_path / "sweep.html").read_text()
    assert out.count('class="job-settings"') == 3 and 'id="density-chart"' in out
    for job_id in sweep.job_ids:
        assert f'data-job="{job_id}"' in out
    assert '<tr data-setting="density"><th>density</th><td>0.5</td></tr>' in out
    assert 'data-setting="git_revision"' in out and 'class="grid versions"' in out


def test_cancel_on_a_finished_job_changes_nothing_and_says_so(sweep):
    """A finished job is not cancellable (the dashboard no longer offers it); the CLI says so, the status stays."""
    from db import job_rows

    done = invoke("cancel", sweep.job_ids[0], "--db", sweep.db.url)
    assert done.exit_code == 0 and "nothing cancelled" in done.output
    with sweep.db.session() as s:
        job = job_rows.get_job(s, sweep.job_ids[0])
        assert job.status != "cancelled" and not job.error


def test_episodes_stored_before_the_kv_figures_show_a_dash_never_0(tmp_path):
    """A job stored before revision 0007: its turns have kv_allocated_bytes (then cache_bytes) and nothing else,
    its episodes no peaks. Every KV column of compare's table, markdown and CSV shows "-" (or empty), never 0."""
    from db import job_rows
    from db import store as db_store
    from tests.support import sweep_fixtures as sf

    db = connect(sqlite_url(tmp_path / "old.db"))
    spec = sf._spec(0.2, ["snapkv"])
    with db.session() as s:
        job = job_rows.create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash())
        job_rows.add_episodes(s, job.id, spec.episodes(["t1"]))
        (episode_id,) = [e.id for e in db_store.episodes_for_job(s, job.id)]
        job_id = job.id
    old = {"logical_length": 400, "physical_after": {"min": 80, "mean": 80, "max": 80}, "kv_allocated_bytes": 4096}
    sf._run(db, episode_id, [old, old], True, wall_s=5.0)
    with db.session() as s:
        table = compare_jobs(s, [job_id])
    cost = table.rows[0].cells["snapkv"].cost
    assert cost.episodes == 1 and cost.kept_fraction == pytest.approx(0.2)
    assert [getattr(cost, name) for name in COST_FIELDS if "kv" in name] == [None] * 4
    md = render(table, "markdown")
    header = next(line for line in md.splitlines() if "KV held peak" in line)
    line = next(line for line in md.splitlines() if line.startswith("| prefill_decode | true_eviction | 0.2 | snapkv"))
    cells = dict(zip(header.strip("|").split(" | "), line.strip("|").split(" | "), strict=True))
    assert [cells[k].strip() for k in ("KV held", "KV held peak", "KV alloc peak")] == ["-", "-", "-"]
    (row,) = list(csv.DictReader(io.StringIO(to_csv(table))))
    assert [row[name] for name in COST_FIELDS if "kv" in name] == ["", "", "", ""]


def test_equal_cost_points_are_all_visible_and_keep_their_true_values(table):
    """Cells of one cost would be drawn on one spot: they are dodged side by side, each point's tooltip and
    ``data-kv-held-mib`` keeping its true cost (issue 44)."""
    import copy
    import itertools

    same = copy.deepcopy(table)
    for row in same.rows:
        for cell in row.cells.values():
            cell.cost.mean_kv_held_bytes = 3 * 2**20
    svg = quality_vs_cost_chart(same)
    point = r'<g class="point" data-method="(\w+)" data-density="([\d.]*)" data-kv-held-mib="([^"]+)">\s*<title>([^<]*)'
    points = re.findall(point + r'</title>.*?<use [^>]*\bx="([\d.]+)" y="([\d.]+)"', svg, re.S)
    assert len(points) == len(re.findall(r'class="point"', svg)) == 1 + len(METHODS) * len(DENSITIES)
    assert len({(x, y) for *_, x, y in points}) == len(points)  # no marker on top of another
    assert all(float(mib) == 3.0 and "3 MiB KV held" in tip for _, _, mib, tip, _, _ in points)
    cell = same.rows[0].cells["nexus"]
    tip = next(t for m, d, _, t, _, _ in points if (m, d) == ("nexus", f"{same.rows[0].density:g}"))
    assert f"{100 * cell.rate:.1f}% resolved" in tip
    apart = sorted(float(x) for *_, x, _ in points)
    assert min(b - a for a, b in itertools.pairwise(apart)) > 1  # SVG points apart: visibly side by side
