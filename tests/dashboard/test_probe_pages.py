"""The probe pages and the probe report without a browser: FastAPI's TestClient over a SQLite file whose probe
runs are written through db.probes, as ``nexus-eval probe run`` writes them (the results are hand-made: the
pages are about what is stored, not about a model)."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient

from dashboard.app import create_app
from dashboard.report import write_report
from db import connect, sqlite_url
from db.probes import add_results, create_probe_run, finish_probe_run, start_probe_run
from results.probe_render import render, to_csv
from results.probe_stats import load_probe_table

VARIANTS = ("dense", "snapkv", "nexus(lam=0)")
DENSITIES = (0.1, 0.3)
SETTINGS = {
    "model": "smollm2-135m", "probes": ["needle", "later_turn", "nll"], "variants": list(VARIANTS),
    "scopes": ["prefill_only"], "protocols": ["true_eviction", "full_context"], "densities": list(DENSITIES),
    "samples": 6, "lengths": [1024], "depths": [0.5], "continuation": 64, "preset": "paper", "seed": 0,
}  # fmt: skip


@dataclass
class Probes:
    url: str
    run_id: str  # done: every probe, three variants, two densities
    failed_id: str  # failed after two results


def _results(rng: random.Random) -> list[dict]:
    rows = []
    for probe in SETTINGS["probes"]:
        protocols = SETTINGS["protocols"] if probe == "later_turn" else ["single_prefill"]
        for density in DENSITIES:
            for protocol in protocols:
                for variant in VARIANTS:
                    for sample in range(SETTINGS["samples"]):
                        kept = 1.0 if variant == "dense" else density
                        rows.append(dict(
                            probe=probe, variant=variant, scope="prefill_only", protocol=protocol, density=density,
                            sample=sample, source="code", length=1030, depth=None if probe == "nll" else 0.5,
                            correct=None if probe == "nll" else rng.random() < kept + 0.4,
                            nll=None if probe == "needle" else 1.0 + rng.random() / kept, scored_tokens=12,
                            answer="<b>12345</b>", expected="12345", kept_fraction=kept,
                            kv_held_bytes=int(2**20 * kept), kv_allocated_bytes=int(2**20 * kept) + 4096,
                            kv_peak_held_bytes=2**20, kv_peak_allocated_bytes=2**20 + 2**16, seconds=rng.random(),
                        ))  # fmt: skip
    return rows


@pytest.fixture(scope="module")
def probes(tmp_path_factory) -> Probes:
    path = tmp_path_factory.mktemp("probe-pages") / "results.db"
    db = connect(sqlite_url(path))
    rows = _results(random.Random(7))
    with db.session() as s:
        run_id = create_probe_run(s, settings=SETTINGS, provenance={"corpus": {"code": "abc"}}, n_planned=len(rows)).id
        start_probe_run(s, run_id, device="cpu")
        add_results(s, run_id, rows)
        finish_probe_run(s, run_id, "done")
    with db.session() as s:
        failed_id = create_probe_run(s, settings={**SETTINGS, "model": "tiny"}, provenance={}, n_planned=10).id
        add_results(s, failed_id, rows[:2])
        finish_probe_run(s, failed_id, "failed", error="ValueError: <boom>\n\nTraceback ...")
    db.dispose()
    return Probes(sqlite_url(path), run_id, failed_id)


def client(p: Probes) -> TestClient:
    return TestClient(create_app(p.url, token=None, public=False, allowed_hosts=["testserver"]))


def _expected(p: Probes, run_id: str) -> dict:
    db = connect(p.url)
    with db.session() as s:
        table = load_probe_table(s, run_id)
    db.dispose()
    return table.to_dict()


def test_the_probe_list_is_in_the_main_nav(probes):
    c = client(probes)
    assert 'href="/probes"' in c.get("/jobs").text  # every page's header links to the probe runs
    page = c.get("/probes").text
    assert page.index(f'data-probe-run="{probes.failed_id}"') < page.index(f'data-probe-run="{probes.run_id}"')
    assert f'href="/probes/{probes.run_id}"' in page and "smollm2-135m" in page and "nexus(lam=0)" in page


def _number(attr: str) -> float | None:
    return None if attr == "" else float(attr)


def test_the_run_page_shows_exactly_the_cells_json(probes):
    c = client(probes)
    expected = _expected(probes, probes.run_id)
    assert c.get(f"/probes/{probes.run_id}/cells.json").json() == expected
    csv = c.get(f"/probes/{probes.run_id}/cells.csv")
    assert csv.headers["content-type"].startswith("text/csv") and csv.text.startswith("run_id,probe,variant,")
    page = c.get(f"/probes/{probes.run_id[:5]}").text
    rows = re.findall(r'<tr class="probe-cell"([^>]*)>', page)
    assert len(rows) == len(expected["cells"]) == 3 * 2 * (1 + 2 + 1)
    for attrs in rows:
        a = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', attrs))
        key = (a["probe"], a["variant"], a["protocol"], float(a["density"]))
        cell = next(x for x in expected["cells"] if (x["probe"], x["variant"], x["protocol"], x["density"]) == key)
        for name in ("accuracy", "ci_low", "ci_high", "nll", "delta_nll", "delta_ci_low", "delta_ci_high", "seconds"):
            assert _number(a[name.replace("_", "-")]) == cell[name], (name, a, cell)
        for base in ("dense", "snapkv"):
            test = cell["vs"].get(base)
            assert _number(a[f"p-vs-{base}"]) == (test["p_value"] if test else None), (base, a, cell)
    for probe in ("needle", "later_turn", "nll"):
        assert re.search(rf'<div class="chart probe-chart" id="probe-chart-{probe}"><svg', page), probe
    assert '<table id="probe-settings"' in page and "code=abc" in page and '<ul id="notes">' in page
    assert "ΔNLL vs dense" in page and "vs snapkv" in page


def test_a_failed_run_shows_its_error_escaped(probes):
    page = client(probes).get(f"/probes/{probes.failed_id}").text
    assert "ValueError: &lt;boom&gt;" in page and "<boom>" not in page and "failed after 2 of 10 results" in page
    assert "tiny model: random weights" in page


@pytest.mark.parametrize("path", ["/probes/nope", "/probes/nope/cells.json", "/probes/nope/cells.csv"])
def test_unknown_probe_runs_are_404_pages(probes, path):
    done = client(probes).get(path)
    assert done.status_code == 404 and "no probe run with id &#39;nope&#39;" in done.text


def test_the_report_of_a_probe_run_is_one_self_contained_file(probes, tmp_path):
    out = write_report(probes.url, probes.run_id[:6], tmp_path / "probe.html")
    html = out.read_text(encoding="utf-8")
    assert html.count("<svg") == 3 and html.count('<table class="grid probe-cells"') == 3 and "<style>" in html
    assert not re.search(r"https?://", html) and "<script" not in html
    assert not re.search(r'(src|href)\s*=\s*"(?!#|data:)', html)  # nothing loaded or linked from elsewhere
    assert '<table id="probe-provenance"' in html and "report written" in html
    db = connect(probes.url)
    with db.session() as s:
        table = load_probe_table(s, probes.run_id)
    db.dispose()
    assert json.loads(render(table, "json")) == _expected(probes, probes.run_id)
    for line in to_csv(table).splitlines()[1:]:
        variant = line.split(",")[2]
        assert variant in html


def test_nexus_eval_report_takes_a_probe_run_id(probes, tmp_path):
    from typer.testing import CliRunner

    from nexus_eval.cli import app

    out = tmp_path / "r.html"
    done = CliRunner().invoke(app, ["report", probes.run_id, "-o", str(out), "--db", probes.url])
    assert done.exit_code == 0 and '<table class="grid probe-cells"' in out.read_text(encoding="utf-8")
    done = CliRunner().invoke(app, ["report", "nope", "-o", str(out), "--db", probes.url])
    assert done.exit_code == 2 and "no job with id 'nope'; no probe run with id 'nope' either" in done.output
