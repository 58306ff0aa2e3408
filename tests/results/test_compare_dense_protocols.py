"""compare pairs each protocol's rows with their own protocol's dense, and says when and why dense was reused
across protocols (``jobs.spec``: dense runs under each protocol unless the model renders a history alike)."""

from __future__ import annotations

from db import job_rows
from jobs.spec import JobSpec
from jobs.submit import plan_job
from results.compare import build_table, compare_jobs
from results.compare_table import Outcome
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixture)

TASKS = [f"t{i}" for i in range(1, 7)]
SCOPES = ("prefill_only", "prefill_decode")


def _rows(dense_protocols: tuple[str, ...]) -> list[Outcome]:
    """Dense in the first scope under ``dense_protocols``: every task resolved under true eviction, none under full
    context; nexus in both scopes and protocols resolves none."""
    rows = [
        Outcome(t, "dense", "prefill_only", p, 0, "resolved" if p == "true_eviction" else "unresolved")
        for p in dense_protocols
        for t in TASKS
    ]
    rows += [
        Outcome(t, "nexus", s, p, 0, "unresolved")
        for s in SCOPES
        for p in ("true_eviction", "full_context")
        for t in TASKS
    ]
    return rows


def test_dense_per_protocol_pairs_each_protocol_with_its_own_dense():
    table = build_table(_rows(("true_eviction", "full_context")))
    for row in table.rows:
        dense, nexus = row.cells["dense"], row.cells["nexus"]
        own = 6 if row.protocol == "true_eviction" else 0
        assert dense.resolved == own, row.label  # the row's own protocol's dense, in either scope
        assert dense.reused_dense == (row.scope == "prefill_decode")  # reused across scopes only
        # full context pairs with full context's dense (no discordant pair), never with true eviction's
        assert (nexus.n_pairs, nexus.b, nexus.c) == (6, 0, own), row.label
    assert not [n for n in table.notes if "only and is reused for the" in n]
    assert any("reused for the other scopes' rows of its protocol" in n for n in table.notes)


def test_dense_reused_across_protocols_is_said_so():
    table = build_table(_rows(("true_eviction",)))
    fc = [r for r in table.rows if r.protocol == "full_context"]
    assert all(r.cells["dense"].reused_dense and r.cells["nexus"].c == 6 for r in fc)
    assert (
        "dense ran under true_eviction only and is reused for the full_context rows (their paired tests are against "
        "it): the same computation only where the model renders a history alike under both protocols"
    ) in table.notes


def _stored_job(db, spec: JobSpec) -> str:
    with db.session() as s:
        job = job_rows.create_job(s, config=spec.model_dump(mode="json"), config_hash=spec.config_hash())
        job_rows.add_episodes(s, job.id, spec.episodes(["t1"]))
        return job.id


def _spec(**extra) -> JobSpec:
    return JobSpec.from_dict(
        {
            "backend": "hf",
            "model": {"name": "tiny", "device": "cpu"},
            "methods": ["dense", "nexus"],
            "protocols": ["true_eviction", "full_context"],
            "tasks": {"suite": "mini"},
            **extra,
        }
    )


def test_compare_notes_say_which_plan_dense_ran_under_and_why(sqlite_db):
    planned = plan_job(_spec(), []).spec  # the real Qwen3 template: differs
    per_protocol = _stored_job(sqlite_db, planned)
    with sqlite_db.session() as s:
        table = compare_jobs(s, [per_protocol])
    assert {r.protocol: r.cells["dense"].reused_dense for r in table.rows} == {
        "true_eviction": False,
        "full_context": False,
    }
    assert any(
        n.startswith(f"job {per_protocol}: dense ran under each protocol") and "checked" in n for n in table.notes
    )

    shared = _stored_job(sqlite_db, _spec().model_copy(update={"dense_rendering": "identical"}))
    with sqlite_db.session() as s:
        notes = compare_jobs(s, [shared]).notes
    assert any(
        n.startswith(f"job {shared}: dense ran under true_eviction only and stands for every protocol")
        and "identically" in n
        and "checked at planning" in n
        for n in notes
    )
    assert any("reused for the full_context rows" in n for n in notes)

    unchecked = _stored_job(sqlite_db, _spec().model_copy(update={"dense_rendering": "identical"}))
    with sqlite_db.session() as s:  # a job stored before the check: no answer in its config
        job = job_rows.get_job(s, unchecked)
        job.config = {k: v for k, v in job.config.items() if k != "dense_rendering"}
    with sqlite_db.session() as s:
        notes = compare_jobs(s, [unchecked]).notes
    assert any(n.startswith(f"job {unchecked} was planned before dense's rendering check") for n in notes)
