"""The action table of compare (results.action_stats) and demonstrations kept apart from Pass@1.

Replay rows are written with ``db.replays.record_replay`` from hand-made scores (the spans' ActionSummary made by
the real ``measure.action_scores.summarize``); the source episodes are an ``expert`` job's dense episodes,
finished through ``db.store`` like a worker finishes them.
"""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from db import job_rows
from db import store as st
from db.replays import record_replay
from jobs.spec import JobSpec
from measure.action_scores import SpanScore, summarize
from results.action_outcomes import DISTANCE_BUCKETS, distance_bucket
from results.compare import compare_jobs
from results.compare_csv import ACTION_COLUMNS, REPLAY_COLUMNS, SUMMARY_COLUMNS
from results.compare_render import render
from results.stats import MIN_BOOTSTRAP_UNITS
from tests.support.db_fixtures import any_db_fixture, sqlite_db_fixture  # noqa: F401  (fixtures)

MODEL = "smollm2-135m"
SCOPE, PROTOCOL = "prefill_decode", "true_eviction"


def span(top1: float, scored: int = 10, *, nll: float | None = None, back: int | None = 100, held: float = 0.5,
         kind: str = "copy", exact: bool | None = None) -> SpanScore:  # fmt: skip
    """One scored span: ``scored`` tokens after its first, ``top1`` of them the argmax."""
    copy = kind == "copy"
    return SpanScore(
        kind=kind,
        function="file_editor",
        param="old_str" if copy else "new_str",
        start=0,
        end=5,
        tokens=scored + 1,
        nll=1.0 - top1 if nll is None else nll,
        top1=top1,
        first_top1=True,
        exact=top1 == 1.0 if exact is None else exact,
        source=1 if copy else None,
        back=back if copy else None,
        source_tokens=30 if copy else None,
        held=[held, held] if copy else None,
        held_mean=held if copy else None,
    )


def score(spans: list[SpanScore]) -> dict:
    """A ReplayScore dump of one turn holding ``spans``."""
    tokens = sum(s.tokens for s in spans)
    turn = {
        "index": 0,
        "tokens": tokens,
        "nll_mean": 1.0,
        "top1": 0.5,
        "spans": [s.model_dump(mode="json") for s in spans],
    }
    return {"tokens": tokens, "nll_mean": 1.0, "top1": 0.5, "turns": [turn], "seconds": 0.1,
            "action": summarize(spans).model_dump(mode="json")}  # fmt: skip


def expert_job(db, tasks: list[str], *, seeds=(0,), backend: str = "expert", verdict: str = "resolved"):
    """A job of ``backend`` whose dense episodes all finished with ``verdict``: (job id, {(task, seed): episode id})."""
    spec = JobSpec.from_dict(
        {"backend": backend, "methods": ["dense"], "seeds": list(seeds), "tasks": {"suite": "mini"}}
    )
    with db.session() as s:
        job = job_rows.create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash())
        rows = job_rows.add_episodes(s, job.id, spec.episodes(tasks))
        ids = {(r.task_id, r.seed): r.id for r in rows}
    for episode_id in ids.values():
        with db.session() as s:
            claim = st.claim_episode(s, episode_id)
        with db.session() as s:
            st.finish_episode(s, claim, "submitted", exit_status="submitted", patch="p")
        with db.session() as s:
            st.record_grade(s, episode_id, verdict, test_log="log", grader="test")
    return job.id, ids


def replay(db, episode_id, method, spans, *, protocol=PROTOCOL, scope=SCOPE, density=0.2, model=MODEL):
    with db.session() as s:
        source = st.get_episode(s, episode_id)
        record_replay(s, source, method=method, scope=scope, protocol=protocol, status="ok", model=model,
                      config={"method": method, "density": density}, score=score(spans))  # fmt: skip


def cell_of(table, method, *, protocol=PROTOCOL, density=0.2, model=MODEL):
    density = None if method == "dense" else density
    return next(
        c for c in table.action if (c.method, c.protocol, c.density, c.model) == (method, protocol, density, model)
    )


def test_per_task_first_two_episodes_of_a_task_do_not_count_twice(sqlite_db):
    """Task A has two episodes (seeds 0, 1), task B one. A's copy tokens are pooled (10 right of 40: 0.25), B's
    copy top-1 is 1.0: the cell is their mean, 0.625, not the episode mean (2/3) or the token pool (20/50)."""
    job, ids = expert_job(sqlite_db, ["A", "B"], seeds=(0, 1))
    for (task, seed), episode in ids.items():
        replay(sqlite_db, episode, "dense", [span(1.0, 10 if task == "B" or seed == 0 else 30)])
    replay(sqlite_db, ids[("A", 0)], "snapkv", [span(1.0, 10, nll=0.5)])
    replay(sqlite_db, ids[("A", 1)], "snapkv", [span(0.0, 30, nll=2.5)])
    replay(sqlite_db, ids[("B", 0)], "snapkv", [span(1.0, 10, nll=0.5)])
    replay(sqlite_db, ids[("B", 1)], "snapkv", [span(1.0, 10, nll=0.5)])
    with sqlite_db.session() as s:
        table = compare_jobs(s, [job])
    cell = cell_of(table, "snapkv")
    assert (cell.episodes, cell.paired, cell.tasks, cell.spans, cell.copy_tokens) == (4, 4, 2, 4, 60)
    assert cell.copy_top1 == pytest.approx((10 / 40 + 1.0) / 2)
    # copy NLL: A pools (10 * 0.5 + 30 * 2.5) / 40 = 2.0, B 0.5; dense's is 0 throughout (top-1 1.0, nll 1 - 1)
    assert cell.copy_nll == pytest.approx((2.0 + 0.5) / 2) and cell.delta_copy_nll == pytest.approx((2.0 + 0.5) / 2)
    # exact: A 1 of 2 spans, B 2 of 2
    assert cell.copy_exact == pytest.approx((0.5 + 1.0) / 2)
    dense = cell_of(table, "dense")
    assert (dense.copy_top1, dense.delta_copy_nll, dense.p_vs_dense) == (1.0, 0.0, None)


def test_no_interval_below_min_bootstrap_units_tasks_and_one_from_it(sqlite_db):
    for n, expect_interval in ((MIN_BOOTSTRAP_UNITS - 1, False), (MIN_BOOTSTRAP_UNITS, True)):
        job, ids = expert_job(sqlite_db, [f"t{i}" for i in range(n)])
        for i, ((_, _), episode) in enumerate(sorted(ids.items())):
            replay(sqlite_db, episode, "dense", [span(1.0)])
            replay(sqlite_db, episode, "snapkv", [span([0.5, 0.7, 0.9][i % 3])])
        with sqlite_db.session() as s:
            table = compare_jobs(s, [job])
        cell = cell_of(table, "snapkv")
        assert cell.tasks == n
        text = render(table, "markdown")
        if expect_interval:
            low, high = cell.copy_top1_ci
            assert low < cell.copy_top1 < high and "too few for an interval" not in text
            assert f"copy top-1 {100 * cell.copy_top1:.1f}% [{100 * low:.1f}–{100 * high:.1f}]" in text
        else:
            assert cell.copy_top1_ci is None and cell.too_few_for_interval
            assert f"copy top-1 {100 * cell.copy_top1:.1f}% ({n} tasks: too few for an interval)" in text
            assert json.loads(render(table, "json"))["action"][1]["copy_top1_ci"] is None


def test_delta_vs_dense_pairs_the_same_episode_protocol_and_model(sqlite_db):
    """e3 has a dense replay only on another model and under another protocol: unpaired, in no mean. The delta is
    per task of (snapkv copy NLL - dense's on the same episode)."""
    job, ids = expert_job(sqlite_db, ["t1", "t2", "t3"])
    e1, e2, e3 = ids[("t1", 0)], ids[("t2", 0)], ids[("t3", 0)]
    replay(sqlite_db, e1, "dense", [span(1.0, nll=0.25)])
    replay(sqlite_db, e2, "dense", [span(1.0, nll=0.5)])
    replay(sqlite_db, e3, "dense", [span(1.0, nll=0.0)], model="qwen3-0.6b")
    replay(sqlite_db, e3, "dense", [span(1.0, nll=0.0)], protocol="full_context")
    replay(sqlite_db, e1, "snapkv", [span(0.5, nll=1.25)])
    replay(sqlite_db, e2, "snapkv", [span(0.5, nll=0.75)])
    replay(sqlite_db, e3, "snapkv", [span(0.0, nll=9.0)])
    with sqlite_db.session() as s:
        table = compare_jobs(s, [job])
    cell = cell_of(table, "snapkv")
    assert (cell.episodes, cell.paired, cell.unpaired, cell.tasks) == (3, 2, 1, 2)
    assert cell.delta_copy_nll == pytest.approx(((1.25 - 0.25) + (0.75 - 0.5)) / 2)
    assert cell.copy_top1 == pytest.approx(0.5) and cell.copy_nll == pytest.approx((1.25 + 0.75) / 2)
    assert cell_of(table, "dense", model="qwen3-0.6b").copy_nll == 0.0  # the other model's cell is apart
    # the replay table pairs by model too: e3's snapkv replay is not measured against the other model's dense
    replayed = next(c for c in table.replay if (c.method, c.model) == ("snapkv", MODEL))
    assert (replayed.n_pairs, replayed.unpaired) == (2, 1)
    assert any("scored on several models" in n for n in table.notes)
    lines = list(csv.DictReader(io.StringIO(render(table, "csv"))))
    dense = [
        (r["replay_model"], r["action_model"]) for r in lines if (r["method"], r["protocol"]) == ("dense", PROTOCOL)
    ]
    assert sorted(dense) == [("qwen3-0.6b", "qwen3-0.6b"), (MODEL, MODEL)]  # each model's cells once, apart
    assert "1 unpaired" in " ".join(render(table, "markdown").splitlines())


def test_the_tests_vs_dense_and_snapkv_are_sign_flips_over_tasks(sqlite_db):
    """Five tasks, each losing half its copy tokens under snapkv: 5 units, all one sign: exact p = 2/32. One task
    with twelve episodes that all lose is one unit (p = 1), however many spans it has."""
    job, ids = expert_job(sqlite_db, [f"t{i}" for i in range(5)])
    for episode in ids.values():
        replay(sqlite_db, episode, "dense", [span(1.0)])
        replay(sqlite_db, episode, "snapkv", [span(0.5), span(0.5)])
        replay(sqlite_db, episode, "nexus", [span(0.9), span(0.9)])
    with sqlite_db.session() as s:
        table = compare_jobs(s, [job])
    snapkv, nexus = cell_of(table, "snapkv"), cell_of(table, "nexus")
    assert (snapkv.p_vs_dense, snapkv.tasks_vs_dense, snapkv.test_vs_dense) == (
        pytest.approx(2 / 32),
        5,
        "sign_flip_exact",
    )
    assert snapkv.p_vs_snapkv is None and snapkv.spans == 10
    assert (nexus.p_vs_snapkv, nexus.tasks_vs_snapkv) == (pytest.approx(2 / 32), 5)
    assert nexus.p_vs_dense == pytest.approx(2 / 32)
    one, ids = expert_job(sqlite_db, ["only"], seeds=tuple(range(12)))
    for episode in ids.values():
        replay(sqlite_db, episode, "dense", [span(1.0)])
        replay(sqlite_db, episode, "snapkv", [span(0.0)] * 5)
    with sqlite_db.session() as s:
        cell = cell_of(compare_jobs(s, [one]), "snapkv")
    assert (cell.spans, cell.tasks, cell.p_vs_dense, cell.tasks_vs_dense) == (60, 1, 1.0, 1)


def test_distance_buckets(sqlite_db):
    assert [label for label, _, _ in DISTANCE_BUCKETS] == ["<1K", "1K-2K", "2K-4K", ">=4K"]
    assert [distance_bucket(b) for b in (0, 999, 1000, 1999, 2000, 3999, 4000, 90_000)] == [
        "<1K", "<1K", "1K-2K", "1K-2K", "2K-4K", "2K-4K", ">=4K", ">=4K"
    ]  # fmt: skip
    job, ids = expert_job(sqlite_db, ["t1", "t2"])
    for task, episode in ((t, e) for (t, _), e in ids.items()):
        replay(sqlite_db, episode, "dense", [span(1.0)])
        near = [span(1.0, 10, back=10), span(0.0, 30, back=999)] if task == "t1" else [span(0.5, 10, back=500)]
        far = [span(0.0, 10, back=5000), span(1.0, 5, back=None)]  # the last: its source was not in the context
        replay(sqlite_db, episode, "snapkv", near + far)
    with sqlite_db.session() as s:
        table = compare_jobs(s, [job])
    split = {d.bucket: d for d in table.action_by_distance if d.method == "snapkv"}
    assert (split["<1K"].spans, split["<1K"].tasks) == (3, 2)
    assert split["<1K"].copy_top1 == pytest.approx((10 / 40 + 0.5) / 2)  # per task (tokens pooled), then mean
    assert (split["1K-2K"].spans, split["1K-2K"].copy_top1, split["2K-4K"].spans) == (0, None, 0)
    assert (split[">=4K"].spans, split[">=4K"].tasks, split[">=4K"].copy_top1) == (2, 2, 0.0)
    assert cell_of(table, "snapkv").spans_unlocated == 2
    text = render(table, "markdown")
    assert "| scope | protocol | density | method | <1K tokens back | 1K-2K tokens back |" in text
    assert (
        f"| {SCOPE} | {PROTOCOL} | 0.2 | snapkv | 37.5% (3 spans, 2 tasks) | - | - | 0.0% (2 spans, 2 tasks) |" in text
    )


def _filled(db) -> tuple[str, dict]:
    """An expert job of two tasks with dense, snapkv and nexus replays (each one copy span and one new span)."""
    job, ids = expert_job(db, ["t1", "t2"])
    for episode in ids.values():
        replay(db, episode, "dense", [span(1.0, back=300), span(0.8, kind="new")])
        replay(db, episode, "snapkv", [span(0.6, back=300), span(0.7, kind="new")])
        replay(db, episode, "nexus", [span(0.9, back=2500), span(0.75, kind="new")])
    return job, ids


def test_json_names_every_field_a_script_reads(any_db):
    job, _ = _filled(any_db)
    with any_db.session() as s:
        data = json.loads(render(compare_jobs(s, [job]), "json"))
    fields = {"method", "scope", "protocol", "density", "model", "copy_top1", "copy_top1_ci", "copy_nll",
              "delta_copy_nll", "copy_exact", "spans", "tasks", "p_vs_dense", "p_vs_snapkv", "new_top1", "new_nll",
              "copy_held", "episodes", "unpaired"}  # fmt: skip
    assert [(c["method"], c["density"]) for c in data["action"]] == [("dense", None), ("snapkv", 0.2), ("nexus", 0.2)]
    for entry in data["action"]:
        assert fields <= set(entry) and entry["model"] == MODEL and entry["scope"] == SCOPE
    nexus = data["action"][2]
    assert (nexus["copy_top1"], nexus["spans"], nexus["tasks"], nexus["copy_top1_ci"]) == (
        pytest.approx(0.9),
        2,
        2,
        None,
    )
    assert nexus["copy_held"] == pytest.approx(0.5) and nexus["new_top1"] == pytest.approx(0.75)
    assert nexus["p_vs_dense"] == pytest.approx(0.5) and nexus["p_vs_snapkv"] == pytest.approx(0.5)
    by = {(d["method"], d["bucket"]): d for d in data["action_by_distance"]}
    assert set(by[("nexus", "2K-4K")]) >= {"method", "scope", "protocol", "density", "model", "bucket", "copy_top1",
                                            "spans", "tasks"}  # fmt: skip
    assert (by[("nexus", "2K-4K")]["spans"], by[("nexus", "<1K")]["spans"]) == (2, 0)
    assert "per task" in data["action_caption"] and "by how far back" in data["action_distance_caption"]
    (demo,) = data["demonstrations"]
    assert (demo["job_id"], demo["backend"], demo["n"], demo["resolved"]) == (job, "expert", 2, 2)


def test_an_expert_job_is_never_a_pass_at_1_cell_only_a_demonstrations_line(sqlite_db):
    job, _ = expert_job(sqlite_db, ["t1", "t2"])
    with sqlite_db.session() as s:
        table = compare_jobs(s, [job])
    assert table.rows == [] and table.grid == {} and table.methods == []
    (demo,) = table.demonstrations
    assert demo.text == f"demonstrations (expert stand-in, not a Pass@1): job {job} (dense): 2/2 resolved"
    assert any("not a model's samples" in n for n in table.notes)
    for fmt in ("table", "markdown"):
        text = render(table, fmt)
        assert "demonstrations (expert stand-in, not a Pass@1)" in text and "No Pass@1 cell" in text
        assert "2/2 100.0%" not in text
    # beside an agent's job of the same keys (the later job wins a key): only the agent's episodes are Pass@1
    agent, _ = expert_job(sqlite_db, ["t1", "t2"], backend="oracle", verdict="unresolved")
    with sqlite_db.session() as s:
        table = compare_jobs(s, [agent, job])
    dense = table.rows[0].cells["dense"]
    assert (dense.n, dense.resolved) == (2, 0)
    assert [d.job_id for d in table.demonstrations] == [job]
    assert not any("ran in more than one job" in n for n in table.notes)
    assert not any(n.startswith("jobs differ in backend") for n in table.notes)
    data = json.loads(render(table, "json"))
    assert data["rows"][0]["cells"]["dense"]["resolved"] == 0 and data["demonstrations"][0]["resolved"] == 2


def test_every_format_shows_the_action_table(sqlite_db):
    job, _ = _filled(sqlite_db)
    with sqlite_db.session() as s:
        table = compare_jobs(s, [job])
    snapkv = cell_of(table, "snapkv")
    top1 = f"copy top-1 {100 * snapkv.copy_top1:.1f}% (2 tasks: too few for an interval)"
    delta = f"ΔNLL {snapkv.delta_copy_nll:+.3f} vs dense"
    counts = "exact 0.0%, 2 spans, 2 tasks"
    tests = "p=0.5 vs dense (2 tasks)"
    for fmt in ("table", "markdown"):
        text = render(table, fmt, width=400)
        flat = re.sub(r"\s+", " ", text)
        assert f"Action table (copy spans), replayed on {MODEL}" in text, fmt
        for part in (top1, delta, counts, tests, "the tokens after each copy span's first"):
            assert part in flat, (fmt, part)
        assert "copy top-1 by distance" in text.lower() and "2K-4K tokens back" in text, fmt
        assert "demonstrations (expert stand-in, not a Pass@1)" in text, fmt
    markdown = render(table, "markdown")
    assert f"| {SCOPE} | {PROTOCOL} | 0.2 | " in markdown and f"{top1}; {delta}; {counts}; {tests}" in markdown
    lines = list(csv.DictReader(io.StringIO(render(table, "csv"))))
    assert list(lines[0]) == SUMMARY_COLUMNS + REPLAY_COLUMNS + ACTION_COLUMNS
    by = {r["method"]: r for r in lines if r["action_episodes"]}
    assert set(by) == {"dense", "snapkv", "nexus"}
    assert float(by["snapkv"]["action_copy_top1"]) == pytest.approx(snapkv.copy_top1)
    assert (by["snapkv"]["action_spans"], by["snapkv"]["action_tasks"], by["snapkv"]["action_model"]) == (
        "2",
        "2",
        MODEL,
    )
    assert by["snapkv"]["action_copy_top1_ci_low"] == "" and by["snapkv"]["n"] == ""  # no Pass@1 cell: blank
    assert (by["nexus"]["action_spans_2k_4k"], by["nexus"]["action_spans_lt1k"]) == ("2", "0")
    assert float(by["snapkv"]["action_p_vs_dense"]) == pytest.approx(0.5)
    data = json.loads(render(table, "json"))
    assert [c["method"] for c in data["action"]] == ["dense", "snapkv", "nexus"]


def test_the_report_and_the_compare_page_show_the_action_table(sqlite_db, tmp_path):
    from fastapi.testclient import TestClient

    from dashboard.app import create_app
    from dashboard.report import report_html

    job, _ = _filled(sqlite_db)
    with sqlite_db.session() as s:
        table = compare_jobs(s, [job])
        report = report_html(s, [job])
    expected = json.loads(render(table, "json"))
    url = sqlite_db.url
    app = create_app(url, token="t" * 16, public=False, allowed_hosts=["testserver"])
    page = TestClient(app).get(f"/jobs/{job}/compare").text
    for html in (report, page):
        assert 'id="action"' in html and 'id="action-distance"' in html and 'id="action-caption"' in html
        assert 'id="demonstrations"' in html and "demonstrations (expert stand-in, not a Pass@1)" in html
        cells = re.findall(r'<td class="cell action-cell"([^>]*)>', html)
        assert len(cells) == 3
        for attrs in cells:
            a = dict(re.findall(r'data-([a-z0-9-]+)="([^"]*)"', attrs))
            entry = next(c for c in expected["action"] if c["method"] == a["method"])
            assert float(a["copy-top1"]) == entry["copy_top1"] and int(a["spans"]) == entry["spans"]
            assert int(a["tasks"]) == entry["tasks"] and a["copy-top1-ci-low"] == ""
            assert a["p-vs-dense"] == ("" if entry["p_vs_dense"] is None else repr(entry["p_vs_dense"]))
        assert "too few for an interval" in html and "2K-4K tokens back" in html


def test_each_cell_holds_the_kv_its_copies_were_scored_at(sqlite_db):
    """Per replay the mean over turns of the bytes held after each turn; per task first, then over tasks."""
    job, ids = expert_job(sqlite_db, ["t1", "t2"], seeds=(0, 1))
    held = {("t1", 0): [100, 300], ("t1", 1): [400, 400], ("t2", 0): [1000, 1000], ("t2", 1): [1000, 1000]}
    for (task, seed), episode in ids.items():
        replay(sqlite_db, episode, "dense", [span(1.0)])
        data = score([span(0.5)])
        data["turns"] = [dict(data["turns"][0], index=i, kv_held_bytes=b) for i, b in enumerate(held[task, seed])]
        with sqlite_db.session() as s:
            record_replay(s, st.get_episode(s, episode), method="snapkv", scope=SCOPE, protocol=PROTOCOL, status="ok",
                          model=MODEL, config={"method": "snapkv", "density": 0.2}, score=data)  # fmt: skip
    with sqlite_db.session() as s:
        table = compare_jobs(s, [job])
    # t1: replays of 200 and 400 bytes a turn -> 300; t2: 1000; the cell: (300 + 1000) / 2
    assert cell_of(table, "snapkv").kv_held_bytes == pytest.approx(650.0)
    assert cell_of(table, "dense").kv_held_bytes is None  # its turns recorded none
    assert "KV held 0.0 MB a turn" in render(table, "table", width=400)
    assert json.loads(render(table, "json"))["action"][1]["kv_held_bytes"] == pytest.approx(650.0)
