"""compare: Table 3 numbers from hand-built outcomes, in all four formats, and from the database."""

from __future__ import annotations

import csv
import io
import json

import pytest

from db import store as st
from tests.service.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixture)
from workers.compare import (
    Outcome,
    build_table,
    compare_jobs,
    merge_jobs,
    natural_key,
    summarize_cell,
)
from workers.compare_render import SUMMARY_COLUMNS, render, to_csv
from workers.spec import JobSpec

TASKS = [f"t{i}" for i in range(1, 11)]
DENSE_RESOLVED = {f"t{i}" for i in range(1, 8)}  # 7/10
NEXUS_TE_RESOLVED = {"t1", "t8", "t9", "t10"}  # 4/10: b = 3 (t8-t10), c = 6 (t2-t7)


def outcomes() -> list[Outcome]:
    """Dense ran once (prefill_only/true_eviction); nexus in two protocols; one nexus episode still running."""
    rows = [
        Outcome(
            t,
            "dense",
            "prefill_only",
            "true_eviction",
            0,
            "resolved" if t in DENSE_RESOLVED else "unresolved",
        )
        for t in TASKS
    ]
    rows += [
        Outcome(
            t,
            "nexus",
            "prefill_only",
            "true_eviction",
            0,
            "resolved" if t in NEXUS_TE_RESOLVED else "unresolved",
        )
        for t in TASKS
    ]
    rows += [
        Outcome(t, "nexus", "prefill_only", "full_context", 0, "infra_failure" if t == "t10" else "resolved")
        for t in TASKS
    ]
    rows.append(Outcome("t11", "nexus", "prefill_only", "full_context", 0, "running"))
    return rows


@pytest.fixture
def table():
    return build_table(outcomes(), job_ids=["job1"])


def test_layout_and_numbers(table):
    assert table.methods == ["dense", "nexus"]
    assert [(r.scope, r.protocol) for r in table.rows] == [
        ("prefill_only", "true_eviction"),
        ("prefill_only", "full_context"),
    ]
    te, fc = table.rows
    dense, nexus = te.cells["dense"], te.cells["nexus"]
    assert (dense.n, dense.resolved, dense.rate, dense.ci_method) == (10, 7, 0.7, "wilson")
    assert (round(dense.ci_low, 4), round(dense.ci_high, 4)) == (0.3968, 0.8922)  # Wilson 7/10
    assert dense.p_value is None and not dense.reused_dense
    assert (nexus.n, nexus.resolved, nexus.rate) == (10, 4, 0.4)
    assert (round(nexus.ci_low, 4), round(nexus.ci_high, 4)) == (0.1682, 0.6873)  # Wilson 4/10
    # exact McNemar, b=3, c=6: 2 * (C(9,0)+C(9,1)+C(9,2)+C(9,3)) / 2^9 = 260/512
    assert (nexus.b, nexus.c, nexus.n_pairs, nexus.mcnemar_method) == (3, 6, 10, "exact")
    assert nexus.p_value == pytest.approx(260 / 512)
    # full_context: dense reused from true_eviction; the infra failure counts as not resolved; t11 pending
    assert fc.cells["dense"].reused_dense and fc.cells["dense"].resolved == 7
    fcn = fc.cells["nexus"]
    assert (fcn.n, fcn.resolved, fcn.failures, fcn.pending, fcn.b, fcn.c) == (10, 9, 1, 1, 2, 0)
    assert fcn.p_value == pytest.approx(0.5)  # 2 * (1/2)^2
    assert table.tasks[:3] == ["t1", "t2", "t3"] and table.tasks[-1] == "t11"
    assert table.grid[("prefill_only", "full_context", None, "nexus")]["t10"] == ["infra_failure"]
    assert table.grid[("prefill_only", "full_context", None, "dense")]["t9"] == ["unresolved"]  # reused in the grid too
    assert any("reused" in n for n in table.notes)


def test_several_seeds_pass_at_1_and_pass_at_k():
    statuses = {
        ("A", 0): "resolved",
        ("A", 1): "resolved",
        ("A", 2): "unresolved",
        ("B", 0): "unresolved",
        ("B", 1): "empty_patch",
        ("B", 2): "unresolved",
    }
    rows = [Outcome(t, "snapkv", "prefill_decode", "true_eviction", s, v) for (t, s), v in statuses.items()]
    dense = [Outcome(t, "dense", "prefill_decode", "true_eviction", s, "resolved") for t in "AB" for s in range(3)]
    cell = summarize_cell("snapkv", rows, dense, seed=0)
    assert (cell.n, cell.resolved, cell.n_tasks, cell.n_seeds, cell.ci_method) == (6, 2, 2, 3, "bootstrap")
    assert cell.rate == pytest.approx((2 / 3 + 0) / 2)
    # pass@3: task A has 1 failure < 3 -> 1.0; task B 0 correct -> 0.0
    assert cell.pass_at_k == {3: pytest.approx(0.5)}
    # bootstrap of the per-task rates [2/3, 0]: resampled means are 0, 1/3, 2/3 -> interval [0, 2/3]
    assert (cell.ci_low, cell.ci_high) == (0.0, pytest.approx(2 / 3))
    assert (cell.b, cell.c, cell.p_value) == (0, 4, pytest.approx(2 / 16))  # paired on (task, seed)


def test_json(table):
    data = json.loads(render(table, "json"))
    assert data["job_ids"] == ["job1"] and data["methods"] == ["dense", "nexus"]
    te = data["rows"][0]
    assert (te["scope"], te["protocol"]) == ("prefill_only", "true_eviction")
    assert te["cells"]["nexus"]["resolved"] == 4 and te["cells"]["nexus"]["p_value"] == pytest.approx(0.5078125)
    assert data["rows"][1]["cells"]["dense"]["reused_dense"] is True
    t10 = next(t for t in data["grid"] if t["task_id"] == "t10")
    assert {(c["protocol"], c["method"]): c["statuses"] for c in t10["cells"]}[("full_context", "nexus")] == [
        "infra_failure"
    ]


def test_csv(table):
    lines = list(csv.DictReader(io.StringIO(render(table, "csv"))))
    assert list(lines[0]) == SUMMARY_COLUMNS and len(lines) == 4
    by = {(r["protocol"], r["method"]): r for r in lines}
    assert (by[("true_eviction", "nexus")]["resolved"], by[("true_eviction", "nexus")]["n"]) == ("4", "10")
    assert float(by[("true_eviction", "nexus")]["p_value_vs_dense"]) == pytest.approx(0.507812, abs=1e-6)
    assert float(by[("true_eviction", "dense")]["ci_low"]) == pytest.approx(0.396778, abs=1e-6)
    assert by[("full_context", "dense")]["reused_dense"] == "true" and by[("full_context", "nexus")]["pending"] == "1"
    grid = list(csv.DictReader(io.StringIO(to_csv(table, grid=True))))
    assert len(grid) == 10 * 4 + 1  # 10 tasks x 4 cells + t11 running
    assert {
        "task_id": "t11",
        "scope": "prefill_only",
        "protocol": "full_context",
        "density": "",
        "method": "nexus",
        "seed_index": "0",
        "status": "running",
        "driver": "agent",
    } in grid


def test_markdown(table):
    text = render(table, "markdown")
    assert "| scope | protocol | density | dense | nexus |" in text
    assert (
        "| prefill_only | true_eviction | - | 7/10 70.0% [39.7–89.2] | 4/10 40.0% [16.8–68.7] p=0.508 (3:6) |" in text
    )
    assert (
        "| prefill_only | full_context | - | 7/10 70.0% [39.7–89.2] (reused) | "
        "9/10 90.0% [59.6–98.2] p=0.5 (2:0) +1 pending |" in text
    )
    assert "| t10 | ✗ | ✓ | ✗ | ! |" in text and "| t11 |   |   |   | … |" in text


def test_rich_table(table):
    text = render(table, "table")
    assert "4/10 40.0%" in text and "p=0.508 (3:6)" in text and "(reused)" in text
    assert "per task: prefill_only / full_context" in text
    with pytest.raises(ValueError, match="unknown format 'html'"):
        render(table, "html")


def test_merge_jobs_later_job_wins():
    a = [Outcome("t1", "nexus", "prefill_only", "true_eviction", 0, "unresolved", job_id="a")]
    b = [
        Outcome("t1", "nexus", "prefill_only", "true_eviction", 0, "resolved", job_id="b"),
        Outcome("t2", "nexus", "prefill_only", "true_eviction", 0, "resolved", job_id="b"),
    ]
    merged, notes = merge_jobs([a, b])
    assert sorted((o.task_id, o.status, o.job_id) for o in merged) == [
        ("t1", "resolved", "b"),
        ("t2", "resolved", "b"),
    ]
    assert notes == ["1 episode(s) ran in more than one job; the later job's result is used"]


def test_natural_key():
    assert sorted(["t10", "t2", "a1b10", "a1b9"], key=natural_key) == ["a1b9", "a1b10", "t2", "t10"]


def test_compare_jobs_from_database_uses_latest_attempts(sqlite_db):
    spec = JobSpec.from_dict({"backend": "oracle", "methods": ["dense", "nexus"], "tasks": {"suite": "mini"}})
    with sqlite_db.session() as s:
        job = st.create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash())
        rows = st.add_episodes(s, job.id, spec.episodes(["t1", "t2"]))
        ids = {(r.task_id, r.method): r.id for r in rows}
    verdicts = {
        ("t1", "dense"): "resolved",
        ("t2", "dense"): "resolved",
        ("t1", "nexus"): "infra_failure",
        ("t2", "nexus"): "unresolved",
    }
    for key, verdict in verdicts.items():
        with sqlite_db.session() as s:
            claim = st.claim_episode(s, ids[key])
        with sqlite_db.session() as s:
            if verdict == "infra_failure":
                st.finish_episode(s, claim, "infra_failure", error="container died")
            else:
                st.finish_episode(s, claim, "submitted", patch="p")
                st.record_grade(s, ids[key], verdict)
    with sqlite_db.session() as s:
        before = compare_jobs(s, [job.id[:6]])
        assert before.rows[0].cells["nexus"].resolved == 0 and before.rows[0].cells["nexus"].failures == 1
        (retry,) = st.rerun_job(s, job.id, {"infra_failure"})
    with sqlite_db.session() as s:
        claim = st.claim_episode(s, retry.id)
    with sqlite_db.session() as s:
        st.finish_episode(s, claim, "resolved", patch="p", test_log="ok", grader="test")
    with sqlite_db.session() as s:
        after = compare_jobs(s, [job.id])
    cell = after.rows[0].cells["nexus"]
    assert (cell.n, cell.resolved, cell.failures, cell.b, cell.c) == (2, 1, 0, 0, 1)
    assert json.loads(render(after, "json"))["rows"][0]["cells"]["dense"]["resolved"] == 2


def test_compare_jobs_aligns_merged_jobs_by_density_instead_of_mixing_them(sqlite_db):
    ids = []
    for density, method in ((0.2, "dense"), (0.1, "nexus")):
        spec = JobSpec.from_dict(
            {"backend": "oracle", "methods": [method], "density": density, "tasks": {"suite": "m"}}
        )
        with sqlite_db.session() as s:
            job = st.create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash())
            st.add_episodes(s, job.id, spec.episodes(["t1"]))
            ids.append(job.id)
    with sqlite_db.session() as s:
        table = compare_jobs(s, ids)
    assert table.methods == ["dense", "nexus"]
    assert not [n for n in table.notes if "density" in n]  # aligned, not a difference to warn about
    assert [r.density for r in table.rows] == [0.1]
    nexus, dense = table.rows[0].cells["nexus"], table.rows[0].cells["dense"]
    assert (nexus.density, dense.density) == (0.1, 1.0)
    assert nexus.pending == 1 and nexus.n == 0


def test_compare_notes_name_per_method_settings_and_presets(sqlite_db):
    """Two jobs of the same methods under different presets / overrides: the notes say which method's
    which setting differs, with each job's resolved value (a shared field a job did not override is read
    from that job's eviction block)."""
    ids = []
    for extra in ({}, {"preset": "reference", "method_params": {"nexus": {"reservoir_n": 50}}}):
        spec = JobSpec.from_dict(
            {"backend": "oracle", "methods": ["snapkv", "nexus"], "tasks": {"suite": "m"}, **extra}
        )
        with sqlite_db.session() as s:
            job = st.create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash())
            st.add_episodes(s, job.id, spec.episodes(["t1"]))
            ids.append(job.id)
    with sqlite_db.session() as s:
        notes = compare_jobs(s, ids).notes
    assert f'jobs differ in preset: {ids[0]}="paper", {ids[1]}="reference"' in notes
    assert f"jobs differ in method_params.snapkv.window: {ids[0]}=16, {ids[1]}=32" in notes
    assert f"jobs differ in method_params.nexus.reservoir_n: {ids[0]}=5, {ids[1]}=50" in notes
    assert not any("snapkv.kernel_size" in n or "nexus.lam" in n for n in notes)  # equal values: no note


def test_grading_notes_name_the_tools_and_the_offline_verdicts():
    from types import SimpleNamespace

    from workers.compare import grading_notes

    def ep(task, status, grader="swebench", needs_network=False):
        grade = {"needs_network": needs_network}
        return SimpleNamespace(
            task_id=task, status=status, grader=grader, grader_version="swebench==5.0.2", result={"grade": grade}
        )

    notes = grading_notes(
        [
            ep("psf__requests-1", "unresolved", needs_network=True),
            ep("psf__requests-2", "resolved", needs_network=True),  # resolved anyway: nothing to flag
            ep("django__django-1", "unresolved"),
            ep("x__y-1", "infra_failure", grader=None),
        ]
    )
    assert notes[0] == "graded by swebench (swebench==5.0.2)"
    assert notes[1].startswith("1 task(s) need the network") and notes[1].endswith("psf__requests-1")
    assert grading_notes([ep("a__b-1", "unresolved")]) == ["graded by swebench (swebench==5.0.2)"]


def test_seed_notes_flag_episodes_stored_when_every_seed_sampled_with_seed_0():
    """Rows written before issue 19 carry ``agent.seed`` 0 beside their own seed: compare says their seeds are
    copies. Rows written since have no ``agent.seed``; an oracle backend samples nothing."""
    from types import SimpleNamespace

    from workers.compare import seed_notes

    def ep(seed, agent=None, backend="hf"):
        config = {"backend": backend, "seed": seed, "agent": {"max_steps": 4, **(agent or {})}}
        return SimpleNamespace(seed=seed, config=config)

    old = [ep(0, {"seed": 0}), ep(1, {"seed": 0}), ep(2, {"seed": 0})]
    notes = seed_notes(old)
    assert len(notes) == 1 and notes[0].startswith("2 episode(s) were sampled with seed 0 whatever their seed")
    assert seed_notes([ep(0), ep(1)]) == []  # stored since: the seed is the episode's own
    assert seed_notes([ep(1, {"seed": 0}, backend="oracle")]) == []
