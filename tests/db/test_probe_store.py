"""Probe runs in SQL (db.probes) on SQLite, and on PostgreSQL under ``services``: the run's life, every
ProbeResult field round-tripped, the first error kept, id lookups shared with jobs."""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from db import job_rows
from db.measure_models import ProbeResultRow, ProbeRun
from db.probes import (
    RESULT_FIELDS,
    add_result,
    add_results,
    create_probe_run,
    finish_probe_run,
    get_probe_run,
    job_or_probe_run,
    list_probe_runs,
    load_probe_run,
    start_probe_run,
)
from measure.probes import ProbeResult, ProbeSettings
from tests.support.db_fixtures import any_db_fixture, sqlite_db_fixture  # noqa: F401  (fixtures)

SETTINGS = ProbeSettings(model="tiny", samples=2, lengths=(256,), variants=("dense", "snapkv"), densities=(0.5,))


def _result(sample: int, **kw) -> dict:
    fields = dict(
        probe="later_turn", variant="nexus(lam=0,block_size=16)", scope="prefill_decode", protocol="true_eviction",
        density=0.125, sample=sample, source="licenses", length=1031, depth=0.3, correct=sample % 2 == 0,
        nll=0.1 + sample / 3, scored_tokens=14, expected="40123", answer="The default port is 40123.\n",
        kept_fraction=0.1337, kv_held_bytes=2 * 2**33, kv_allocated_bytes=3 * 2**33, kv_peak_held_bytes=5 * 2**33,
        kv_peak_allocated_bytes=7 * 2**33, seconds=1.25,
    )  # fmt: skip
    return ProbeResult(**{**fields, **kw}).to_dict()


def _new_run(db) -> str:
    with db.session() as s:
        return create_probe_run(s, settings=SETTINGS.model_dump(mode="json"), provenance={"corpus": {"code": "ab"}},
                                n_planned=4).id  # fmt: skip


def test_result_columns_are_the_probe_result_fields():
    assert tuple(f.name for f in dataclasses.fields(ProbeResult)) == RESULT_FIELDS
    columns = {c.name for c in ProbeResultRow.__table__.columns} - {"id", "run_id"}
    assert columns == set(RESULT_FIELDS)


def test_a_run_from_pending_to_done_keeps_every_field(any_db):
    run_id = _new_run(any_db)
    with any_db.session() as s:
        run = get_probe_run(s, run_id)
        assert (run.status, run.model, run.n_planned, run.n_results, run.finished_at) == ("pending", "tiny", 4, 0, None)
        assert run.settings == SETTINGS.model_dump(mode="json") and len(run_id) == 8
    with any_db.session() as s:
        start_probe_run(s, run_id, device="cpu")
    stored = [_result(i) for i in range(3)] + [_result(3, probe="nll", correct=None, depth=None, answer="")]
    with any_db.session() as s:
        add_result(s, run_id, stored[0])
    with any_db.session() as s:
        assert add_results(s, run_id, stored[1:]) == 3
    with any_db.session() as s:
        finish_probe_run(s, run_id, "done")
    with any_db.session() as s:
        run, rows = load_probe_run(s, run_id[:5])
        assert run.status == "done" and run.finished_at is not None and run.n_results == 4
        assert run.provenance == {"corpus": {"code": "ab"}, "device": "cpu"}
        assert [{name: getattr(r, name) for name in RESULT_FIELDS} for r in rows] == stored
        assert [r.id for r in rows] == sorted(r.id for r in rows)


def test_a_failed_run_keeps_its_first_error_and_its_results(sqlite_db):
    run_id = _new_run(sqlite_db)
    with sqlite_db.session() as s:
        add_result(s, run_id, _result(0))
    with sqlite_db.session() as s:
        finish_probe_run(s, run_id, "failed", error="ValueError: the first cause")
    with sqlite_db.session() as s:
        finish_probe_run(s, run_id, "failed", error="RuntimeError: a later one")
    with sqlite_db.session() as s:
        run, rows = load_probe_run(s, run_id)
        assert (run.status, run.error, run.n_results, len(rows)) == ("failed", "ValueError: the first cause", 1, 1)
    with pytest.raises(ValueError, match="done or failed"), sqlite_db.session() as s:
        finish_probe_run(s, run_id, "running")


def test_bad_results_and_statuses_are_refused(any_db):
    run_id = _new_run(any_db)
    with pytest.raises(ValueError, match=r"missing \['seconds'\], extra \['extra'\]"), any_db.session() as s:
        add_result(s, run_id, {**{k: v for k, v in _result(0).items() if k != "seconds"}, "extra": 1})
    with any_db.session() as s:
        add_result(s, run_id, _result(0))
    with pytest.raises(IntegrityError), any_db.session() as s:  # the same sample of the same cell twice
        add_result(s, run_id, _result(0))
    with pytest.raises(IntegrityError), any_db.session() as s:
        s.add(ProbeRun(model="m", settings={}, status="finished"))
    with pytest.raises(IntegrityError), any_db.session() as s:
        add_result(s, "nosuchrun", _result(1))
    with any_db.session() as s:
        assert get_probe_run(s, run_id).n_results == 1


def test_lookups_and_deleting_a_run_deletes_its_results(any_db):
    first, second = _new_run(any_db), _new_run(any_db)
    with any_db.session() as s:
        add_result(s, first, _result(0))
        job = job_rows.create_job(s, config={}, config_hash="h", name="j", package_versions={}, git_revision="")
        job_id = job.id
    with any_db.session() as s:
        assert [r.id for r in list_probe_runs(s)] == [second, first]
        assert job_or_probe_run(s, first) == ("probe_run", first)
        assert job_or_probe_run(s, job_id[:6]) == ("job", job_id)
        with pytest.raises(LookupError, match="no job with id 'zz'; no probe run with id 'zz' either"):
            job_or_probe_run(s, "zz")
        with pytest.raises(LookupError, match="ambiguous"):
            job_or_probe_run(s, "")
        with pytest.raises(LookupError, match="no probe run with id 'zz'"):
            get_probe_run(s, "zz")
    with any_db.session() as s:
        s.delete(get_probe_run(s, first))
    with any_db.session() as s:
        assert s.execute(select(ProbeResultRow)).scalars().all() == []


def test_a_run_whose_process_is_gone_is_marked_failed_with_why_and_others_are_left_alone(any_db):
    from db.probes import fail_orphaned_probe_runs

    def new(process: str | None) -> str:
        provenance = {"corpus": {"code": "ab"}, **({"process": process} if process else {})}
        with any_db.session() as s:
            return create_probe_run(s, settings=SETTINGS.model_dump(mode="json"), provenance=provenance,
                                    n_planned=4).id  # fmt: skip

    dead, alive, unknown, finished = new("here/111"), new("here/222"), new(None), new("here/333")
    with any_db.session() as s:
        start_probe_run(s, dead)
        add_result(s, dead, _result(0))
    with any_db.session() as s:
        finish_probe_run(s, finished, "done")
    with any_db.session() as s:
        assert fail_orphaned_probe_runs(s, is_dead=lambda p: p in {"here/111", "here/333"}) == [dead]
    with any_db.session() as s:
        runs = {r.id: r for r in list_probe_runs(s)}
    assert runs[dead].status == "failed" and runs[dead].finished_at is not None
    assert runs[dead].error == (
        "the process here/111 that ran it is gone (killed, or its machine restarted) after 1 of 4 results; found at "
        "a later start"
    )
    assert (runs[alive].status, runs[unknown].status, runs[finished].status) == ("pending", "pending", "done")
