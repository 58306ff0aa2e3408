"""compare: Table 3 numbers from hand-built outcomes, in all four formats, and from the database."""

from __future__ import annotations

import csv
import io
import json

import pytest

from db import job_rows
from db import store as st
from jobs.spec import JobSpec
from results.compare import build_table, compare_jobs, merge_jobs
from results.compare_cell import summarize_cell
from results.compare_csv import SUMMARY_COLUMNS, to_csv
from results.compare_render import cell_text, render
from results.compare_table import TASK_BOOTSTRAP, Outcome, natural_key
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixture)

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
    assert (nexus.b, nexus.c, nexus.n_pairs, nexus.test) == (3, 6, 10, "mcnemar_exact")
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
    cell = summarize_cell("snapkv", rows, dense, seed=0, interval=TASK_BOOTSTRAP)
    assert (cell.n, cell.resolved, cell.n_tasks, cell.n_seeds, cell.ci_method) == (6, 2, 2, 3, "bootstrap_tasks")
    assert cell.rate == pytest.approx((2 / 3 + 0) / 2)
    # pass@3: task A has 1 failure < 3 -> 1.0; task B 0 correct -> 0.0
    assert cell.pass_at_k == {3: pytest.approx(0.5)}
    # two tasks are too few for a bootstrap interval (it would read [0, 2/3], the two task rates)
    assert (cell.ci_low, cell.ci_high) == (None, None) and cell.too_few_for_interval
    # the sign-flip test over the 2 tasks' mean differences (-1/3, -1): 2 of the 4 sign vectors reach |-4/3|
    assert (cell.b, cell.c, cell.n_pairs, cell.pair_tasks, cell.test) == (0, 4, 6, 2, "sign_flip_exact")
    assert cell.p_value == pytest.approx(0.5)


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
        "| prefill_only | true_eviction | - | 7/10 70.0% [39.7–89.2] | 4/10 40.0% [16.8–68.7] p=0.508 (3:6, 10 pairs) |"
        in text
    )
    assert (
        "| prefill_only | full_context | - | 7/10 70.0% [39.7–89.2] (reused) | "
        "9/10 90.0% [59.6–98.2] p=0.5 (2:0, 10 pairs) +1 pending |" in text
    )
    assert "| t10 | ✗ | ✓ | ✗ | ! |" in text and "| t11 |   |   |   | … |" in text


def test_rich_table(table):
    text = render(table, "table")
    assert "4/10 40.0%" in text and "p=0.508 (3:6, 10 pairs)" in text and "(reused)" in text
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
        job = job_rows.create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash())
        rows = job_rows.add_episodes(s, job.id, spec.episodes(["t1", "t2"]))
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
            job = job_rows.create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash())
            job_rows.add_episodes(s, job.id, spec.episodes(["t1"]))
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
            job = job_rows.create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash())
            job_rows.add_episodes(s, job.id, spec.episodes(["t1"]))
            ids.append(job.id)
    with sqlite_db.session() as s:
        notes = compare_jobs(s, ids).notes
    assert f'jobs differ in preset: {ids[0]}="paper", {ids[1]}="reference"' in notes
    assert f"jobs differ in method_params.snapkv.window: {ids[0]}=16, {ids[1]}=32" in notes
    assert f"jobs differ in method_params.nexus.reservoir_n: {ids[0]}=5, {ids[1]}=50" in notes
    assert not any("snapkv.kernel_size" in n or "nexus.lam" in n for n in notes)  # equal values: no note


def test_grading_notes_name_the_tools_and_the_offline_verdicts():
    from types import SimpleNamespace

    from results.compare_notes import grading_notes

    def ep(task, status, grader="swebench", needs_network=False):
        return SimpleNamespace(
            task_id=task, status=status, grader=grader, grader_version="swebench==5.0.2", needs_network=needs_network
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

    from results.compare_notes import seed_notes

    def ep(seed, agent=None, backend="hf"):  # the config's values as Episode's column properties read them
        agent_seed = (agent or {}).get("seed")
        return SimpleNamespace(seed=seed, config_backend=backend, config_seed=seed, config_agent_seed=agent_seed)

    old = [ep(0, {"seed": 0}), ep(1, {"seed": 0}), ep(2, {"seed": 0})]
    notes = seed_notes(old)
    assert len(notes) == 1 and notes[0].startswith("2 episode(s) were sampled with seed 0 whatever their seed")
    assert seed_notes([ep(0), ep(1)]) == []  # stored since: the seed is the episode's own
    assert seed_notes([ep(1, {"seed": 0}, backend="oracle")]) == []


# --- issue 31: every number means what its label says ------------------------------------------------------------


def _oracle_job(db, tasks, methods=("dense",), **extra):
    spec = JobSpec.from_dict({"backend": "oracle", "methods": list(methods), "tasks": {"suite": "mini"}, **extra})
    with db.session() as s:
        job = job_rows.create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash())
        rows = job_rows.add_episodes(s, job.id, spec.episodes(tasks))
        return job.id, {(r.task_id, r.method): r.id for r in rows}


def _finish(db, episode_id, verdict, *, exit_status="submitted"):
    with db.session() as s:
        claim = st.claim_episode(s, episode_id)
    with db.session() as s:
        st.finish_episode(s, claim, exit_status, exit_status=exit_status, patch="p")
    if verdict is not None:
        with db.session() as s:
            st.record_grade(s, episode_id, verdict, test_log="log", grader="test")


def test_a_rerun_of_a_verdict_is_a_resample_and_never_makes_pass_at_1_a_best_of_n(sqlite_db):
    """The issue's case: 2 tasks, the first unresolved, rerun, the rerun resolves. Pass@1 stays 1/2: each key
    counts its first verdict. The later attempt is shown apart as best of 2 (2/2), under that label."""
    job_id, ids = _oracle_job(sqlite_db, ["t1", "t2"])
    _finish(sqlite_db, ids[("t1", "dense")], "unresolved")
    _finish(sqlite_db, ids[("t2", "dense")], "resolved")
    for _ in range(2):  # rerunning the verdict twice: the first verdict still counts
        with sqlite_db.session() as s:
            (again,) = st.rerun_job(s, job_id, {"unresolved"})
        _finish(sqlite_db, again.id, "resolved" if _ else "unresolved")
    with sqlite_db.session() as s:
        table = compare_jobs(s, [job_id])
        results = {r.task_id: r.attempt for r in st.result_attempts(s, [job_id])}
        later = [(r.task_id, r.attempt) for r in st.resample_attempts(s, [job_id])]
    assert results == {"t1": 1, "t2": 1} and later == [("t1", 2), ("t1", 3)]
    cell = table.rows[0].cells["dense"]
    assert (cell.n, cell.resolved, cell.rate) == (2, 1, 0.5)
    assert (cell.resamples, cell.best_of_n, cell.best_of_attempts) == (2, 1.0, 3)
    assert "1/2 50.0%" in cell_text(cell) and "(2 resample(s) apart: best of 3 100.0%)" in cell_text(cell)
    assert any(n.startswith("2 resample(s)") and "not Pass@1" in n for n in table.notes)
    data = json.loads(render(table, "json"))["rows"][0]["cells"]["dense"]
    assert (data["rate"], data["resamples"], data["best_of_n"]) == (0.5, 2, 1.0)


def test_a_rerun_of_a_broken_run_replaces_it_and_an_interactive_attempt_stands_in_only_when_asked(sqlite_db):
    job_id, ids = _oracle_job(sqlite_db, ["t1"])
    _finish(sqlite_db, ids[("t1", "dense")], "infra_failure")
    with sqlite_db.session() as s:
        (retry,) = st.rerun_job(s, job_id, {"infra_failure"})
        assert [r.id for r in st.result_attempts(s, [job_id])] == [retry.id]  # queued: the key is pending again
    _finish(sqlite_db, retry.id, "unresolved")
    with sqlite_db.session() as s:
        steered = st.new_attempt(s, retry.id, driver="interactive")
    _finish(sqlite_db, steered.id, "resolved")
    with sqlite_db.session() as s:
        assert [r.id for r in st.result_attempts(s, [job_id])] == [retry.id] and not st.resample_attempts(s, [job_id])
        assert [r.id for r in st.result_attempts(s, [job_id], include_interactive=True)] == [steered.id]
        cell = compare_jobs(s, [job_id]).rows[0].cells["dense"]
    assert (cell.n, cell.resolved, cell.failures, cell.resamples) == (1, 0, 0, 0)


def test_seeds_of_one_task_are_not_independent_pairs():
    """Three tasks, five seeds each. The method loses every seed of one task and ties dense on the others. McNemar
    on the 15 (task, seed) pairs reads 5 discordant pairs as five independent samples (exact p = 0.0625); they
    are one task. The sign-flip test over tasks has one non-zero task difference: p = 1."""
    rows, dense = [], []
    for task in ("a", "b", "c"):
        for seed in range(5):
            dense.append(Outcome(task, "dense", "prefill_only", "true_eviction", seed, "resolved"))
            mine = "unresolved" if task == "a" else "resolved"
            rows.append(Outcome(task, "snapkv", "prefill_only", "true_eviction", seed, mine))
    table = build_table(rows + dense)
    cell = table.rows[0].cells["snapkv"]
    assert table.interval == TASK_BOOTSTRAP and (cell.b, cell.c) == (0, 5)
    assert (cell.test, cell.p_value, cell.pair_tasks, cell.n_pairs, cell.unpaired) == ("sign_flip_exact", 1.0, 3, 15, 0)
    assert "p=1 (sign-flip, 3 tasks, 15 pairs)" in cell_text(cell)


def test_missing_pairs_are_counted_beside_the_p_value():
    rows = [Outcome(f"t{i}", "nexus", "prefill_only", "true_eviction", 0, "resolved") for i in range(4)]
    dense = [Outcome(f"t{i}", "dense", "prefill_only", "true_eviction", 0, "unresolved") for i in range(2)]
    dense += [Outcome("t2", "dense", "prefill_only", "true_eviction", 0, "running")]
    cell = build_table(rows + dense).rows[0].cells["nexus"]
    assert (cell.n_pairs, cell.unpaired, cell.b, cell.c) == (2, 2, 2, 0)
    assert "p=0.5 (2:0, 2 pairs, 2 unpaired)" in cell_text(cell)


def test_one_interval_method_per_table_chosen_by_its_design_and_none_from_too_few_tasks():
    """The job ran two seeds. Method A has both seeds of t1 counted; method B has one (the other still running).
    Both cells use the bootstrap over tasks (today B would switch to a Wilson interval over its 1 episode), and
    neither prints one: 1 task is too few ([33.3-33.3] was printed for a bootstrap over one task)."""
    rows = [
        Outcome("t1", "snapkv", "prefill_only", "true_eviction", 0, "resolved"),
        Outcome("t1", "snapkv", "prefill_only", "true_eviction", 1, "unresolved"),
        Outcome("t1", "nexus", "prefill_only", "true_eviction", 0, "resolved"),
        Outcome("t1", "nexus", "prefill_only", "true_eviction", 1, "running"),
    ]
    table = build_table(rows)
    a, b = table.rows[0].cells["snapkv"], table.rows[0].cells["nexus"]
    assert a.ci_method == b.ci_method == TASK_BOOTSTRAP
    assert a.too_few_for_interval and b.too_few_for_interval and a.ci_low is None and b.ci_high is None
    assert "Pass@1 50.0% (1 tasks: too few for an interval)" in cell_text(a)
    assert "several seeds per task" in table.caption and "docs/numbers.md" in table.caption
    assert "too few" not in render(build_table([r for r in outcomes() if r.seed == 0]), "markdown")  # 10 episodes
    many = [
        Outcome(f"t{i}", "nexus", "prefill_only", "true_eviction", s, "resolved" if (i + s) % 3 else "unresolved")
        for i in range(10)
        for s in range(2)
    ]
    big = build_table(many).rows[0].cells["nexus"]
    assert big.ci_low is not None and big.ci_low < big.rate < big.ci_high  # 10 tasks: an interval


def test_cells_count_verdicts_at_a_limit_and_jobs_without_grading_are_never_pending():
    rows = [
        Outcome("t1", "nexus", "prefill_only", "true_eviction", 0, "unresolved", exit_status="step_limit"),
        Outcome("t2", "nexus", "prefill_only", "true_eviction", 0, "resolved", exit_status="context_limit"),
        Outcome("t3", "nexus", "prefill_only", "true_eviction", 0, "resolved", exit_status="submitted"),
    ]
    table = build_table(rows)
    cell = table.rows[0].cells["nexus"]
    assert (cell.n, cell.at_limit) == (3, 2) and "2 at limit" in cell_text(cell)
    assert any(n.startswith("2 verdict(s) graded the patch an agent left") for n in table.notes)
    ungraded = [Outcome(t, "nexus", "prefill_only", "true_eviction", 0, "submitted", grades=False) for t in "ab"]
    ungraded.append(Outcome("c", "nexus", "prefill_only", "true_eviction", 0, "running", grades=False))
    table = build_table(ungraded)
    cell = table.rows[0].cells["nexus"]
    assert (cell.n, cell.pending, cell.ungraded) == (0, 1, 2)
    assert cell_text(cell) == "pending 2 ungraded" and any("does not grade" in n for n in table.notes)
    assert "+" not in cell_text(cell)


def test_compare_of_a_job_that_does_not_grade_says_ungraded(sqlite_db):
    job_id, ids = _oracle_job(sqlite_db, ["t1", "t2"], grade=False)
    for episode_id in ids.values():
        _finish(sqlite_db, episode_id, None)
    with sqlite_db.session() as s:
        cell = compare_jobs(s, [job_id]).rows[0].cells["dense"]
        assert job_rows.get_job(s, job_id).status == "done"
    assert (cell.n, cell.pending, cell.ungraded) == (0, 0, 2) and cell_text(cell) == "2 ungraded"


def test_a_resample_belongs_to_its_own_density_row_of_a_sweep():
    """A sweep aligns jobs by density; a resample of the 0.1 job's key must not be shown apart in the 0.2 row."""
    rows = [Outcome("t1", "nexus", "prefill_only", "true_eviction", 0, "unresolved", density=d) for d in (0.1, 0.2)]
    later = [Outcome("t1", "nexus", "prefill_only", "true_eviction", 0, "resolved", attempt=2, density=0.1)]
    table = build_table(rows, resamples=later)
    by_density = {r.density: r.cells["nexus"] for r in table.rows}
    assert (by_density[0.1].resamples, by_density[0.1].best_of_n) == (1, 1.0)
    assert (by_density[0.2].resamples, by_density[0.2].best_of_n) == (0, None)


# --- issue 44, item 4: a cell whose every episode broke measured nothing, and says so ----------------------------

LOAD_ERROR = "ValueError: cannot load model 'nosuch-model-xyz': " + "x" * 200 + "\nTraceback (most recent call last):"


def _broken_job(db):
    """Dense ran (1/2 resolved); every nexus episode broke (the model never loaded), in true_eviction only."""
    job_id, ids = _oracle_job(db, ["t1", "t2"], methods=("dense", "nexus"), protocols=["true_eviction"])
    _finish(db, ids[("t1", "dense")], "resolved")
    _finish(db, ids[("t2", "dense")], "unresolved")
    for task in ("t2", "t1"):
        with db.session() as s:
            claim = st.claim_episode(s, ids[(task, "nexus")])
        with db.session() as s:
            st.finish_episode(s, claim, "infra_failure", error=LOAD_ERROR if task == "t1" else "later error")
    return job_id


def test_a_cell_whose_every_episode_broke_is_not_run_with_no_rate_interval_or_p_value(sqlite_db):
    job_id = _broken_job(sqlite_db)
    with sqlite_db.session() as s:
        table = compare_jobs(s, [job_id])
    cell = table.rows[0].cells["nexus"]
    reason = cell.not_run
    assert reason.startswith("ValueError: cannot load model 'nosuch-model-xyz'") and len(reason) <= 120, reason
    assert "\n" not in reason and reason.endswith("…")  # the first episode's (t1's) error, one line, shortened
    assert (cell.n, cell.rate, cell.ci_low, cell.ci_high, cell.p_value, cell.failures) == (0, None, None, None, None, 2)
    assert cell_text(cell) == f"not run: {reason}" and "p=" not in cell_text(cell)
    assert table.rows[0].cells["dense"].rate == 0.5 and table.rows[0].cells["dense"].not_run is None
    assert any(n.startswith("1 cell(s) not run") for n in table.notes)
    text = render(table, "table", width=400)
    assert "not run: ValueError: cannot load model" in text and "p=" not in text
    assert "not run: ValueError" in render(table, "markdown")
    data = json.loads(render(table, "json"))["rows"][0]["cells"]["nexus"]
    assert (data["rate"], data["p_value"], data["ci_low"], data["not_run"]) == (None, None, None, reason)
    lines = {r["method"]: r for r in csv.DictReader(io.StringIO(render(table, "csv")))}
    assert (lines["nexus"]["rate"], lines["nexus"]["p_value_vs_dense"], lines["nexus"]["not_run"]) == ("", "", reason)
    assert lines["dense"]["not_run"] == "" and lines["dense"]["rate"] == "0.5"


def test_a_cell_with_some_broken_episodes_still_counts_them_as_not_resolved():
    rows = [Outcome(t, "dense", "prefill_only", "true_eviction", 0, "resolved") for t in ("t1", "t2")]
    rows += [Outcome("t1", "nexus", "prefill_only", "true_eviction", 0, "infra_failure")]
    rows += [Outcome("t2", "nexus", "prefill_only", "true_eviction", 0, "resolved")]
    cell = build_table(rows).rows[0].cells["nexus"]
    assert (cell.not_run, cell.n, cell.resolved, cell.failures, cell.rate, cell.c) == (None, 2, 1, 1, 0.5, 1)
    assert cell.p_value is not None and "1/2 50.0%" in cell_text(cell)


def test_no_paired_test_against_a_dense_that_was_not_run():
    rows = [Outcome(t, "dense", "prefill_only", "true_eviction", 0, "timeout") for t in ("t1", "t2")]
    rows += [Outcome(t, "nexus", "prefill_only", "true_eviction", 0, "resolved") for t in ("t1", "t2")]
    table = build_table(rows)
    dense, nexus = table.rows[0].cells["dense"], table.rows[0].cells["nexus"]
    assert dense.not_run == "timeout" and dense.rate is None  # no stored error (no database): the status
    assert (nexus.rate, nexus.p_value, nexus.n_pairs) == (1.0, None, 0)
