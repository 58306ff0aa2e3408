"""The repository: fan-out, attempts as new rows, latest attempts, reruns, cancel, job status."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from sqlalchemy import select

from db import Episode, Job, job_rows
from db import store as st
from tests.support.db_fixtures import any_db_fixture, sqlite_db_fixture  # noqa: F401  (fixtures)


@dataclass(frozen=True)
class Key:
    task_id: str
    method: str
    scope: str = "prefill_only"
    protocol: str = "true_eviction"
    seed: int = 0


def _job_with(db, keys) -> tuple[str, list[str]]:
    with db.session() as s:
        job = job_rows.create_job(s, config={"methods": ["dense", "nexus"]}, config_hash="ab" * 32, name="t")
        rows = job_rows.add_episodes(s, job.id, keys, config={"density": 0.2})
        return job.id, [r.id for r in rows]


def _run_to(db, episode_id: str, exit_status: str = "submitted", grade: str | None = None) -> None:
    with db.session() as s:
        claim = st.claim_episode(s, episode_id)
    assert claim is not None
    with db.session() as s:
        assert st.finish_episode(s, claim, exit_status, exit_status=exit_status, patch="diff")
    if grade:
        with db.session() as s:
            assert st.record_grade(s, episode_id, grade, test_log="log", grader="test", grader_version="1")


def test_create_job_records_provenance(sqlite_db):
    with sqlite_db.session() as s:
        job = job_rows.create_job(s, config={"a": 1}, config_hash="f" * 64)
        assert job.package_versions["sqlalchemy"].startswith("2.")
        assert "torch" in job.package_versions
        assert job.git_revision is None or len(job.git_revision.split("-")[0]) == 40


def test_fan_out_and_keys(any_db):
    keys = [Key(t, m) for t in ("a", "b") for m in ("dense", "nexus")]
    job_id, ids = _job_with(any_db, keys)
    with any_db.session() as s:
        rows = st.episodes_for_job(s, job_id)
        assert len(rows) == 4 == len(set(ids))
        assert {r.episode_key for r in rows} == {
            f"{t}|{m}|prefill_only|true_eviction|0" for t in "ab" for m in ("dense", "nexus")
        }
        assert all(r.status == "queued" and r.attempt == 1 and r.config == {"density": 0.2} for r in rows)
        assert [j.id for j in job_rows.list_jobs(s)] == [job_id]
        summary = job_rows.job_summary(s, job_id[:5])  # a unique prefix works
        assert (summary.status, summary.total, summary.active, summary.counts) == ("pending", 4, 4, {"queued": 4})


def test_attempts_are_new_rows_and_latest_attempts(any_db):
    job_id, (e1, e2) = _job_with(any_db, [Key("a", "nexus"), Key("b", "nexus")])
    _run_to(any_db, e1, "submitted", grade="unresolved")
    _run_to(any_db, e2, "step_limit", grade="resolved")
    with any_db.session() as s:
        assert s.get(Job, job_id).status == "done"
        with pytest.raises(ValueError, match="unknown episode status"):
            st.rerun_job(s, job_id, {"unresolvd"})
        reruns = st.rerun_job(s, job_id, {"unresolved"})
        assert [(r.task_id, r.attempt, r.status) for r in reruns] == [("a", 2, "queued")]
        assert s.get(Job, job_id).status == "running"  # reopened
        new_id = reruns[0].id
    with any_db.session() as s:
        with pytest.raises(ValueError, match="only a finished episode"):
            st.new_attempt(s, new_id)
        old = s.get(Episode, e1)
        assert (old.status, old.patch, old.test_log) == ("unresolved", "diff", "log")  # untouched
        latest = st.latest_attempts(s, [job_id])
        assert [(r.task_id, r.attempt, r.status) for r in latest] == [("a", 2, "queued"), ("b", 1, "resolved")]
        assert len(st.episodes_for_job(s, job_id)) == 3
    _run_to(any_db, new_id, "submitted", grade="resolved")
    with any_db.session() as s:
        assert s.get(Job, job_id).status == "done"
        summary = job_rows.job_summary(s, job_id)  # the resample is kept apart from the key's result (db.attempt_roles)
        assert (summary.counts, summary.apart) == ({"resolved": 1, "unresolved": 1}, {"resample": {"resolved": 1}})
        third = st.new_attempt(s, e1, config_overrides={"temperature": 0.1})  # from an old attempt: max + 1
        assert (third.attempt, third.config) == (3, {"density": 0.2, "temperature": 0.1})


def test_cancel_job_stops_claims_and_finishes(any_db):
    job_id, (e1, e2) = _job_with(any_db, [Key("a", "nexus"), Key("b", "nexus")])
    with any_db.session() as s:
        claim = st.claim_episode(s, e1, celery_task_id="celery-1")
        assert st.assign_celery_task(s, e2, "celery-2")
    with any_db.session() as s:
        assert job_rows.cancel_job(s, job_id, reason="user said stop") == ["celery-1", "celery-2"]
    with any_db.session() as s:
        assert st.claim_episode(s, e2) is None
        with pytest.raises(st.ClaimLost):
            st.record_turn(s, claim, 0, completion="late")
    with any_db.session() as s:
        assert st.finish_episode(s, claim, "submitted") is False
        rows = st.episodes_for_job(s, job_id)
        assert [(r.status, r.error) for r in rows] == [("cancelled", "user said stop")] * 2
        assert s.get(Job, job_id).status == "cancelled"


def test_lookup_errors(sqlite_db):
    with sqlite_db.session() as s:
        with pytest.raises(LookupError, match="no job with id 'zzz'"):
            job_rows.get_job(s, "zzz")
        with pytest.raises(LookupError, match="no episode"):
            st.claim_episode(s, "nope")


def test_a_job_error_note_leaves_its_status_to_its_episodes(sqlite_db):
    job_id, (ep,) = _job_with(sqlite_db, [Key("a", "dense")])
    with sqlite_db.session() as s:
        job_rows.note_job_error(s, job_id, "not all episodes were sent: ...")
        s.execute(select(Job)).scalar_one().status = "failed"  # what an older version wrote for a failed send
    with sqlite_db.session() as s:
        claim = st.claim_episode(s, ep)
    with sqlite_db.session() as s:
        st.finish_episode(s, claim, "infra_failure", error="x")
    with sqlite_db.session() as s:
        job = s.execute(select(Job)).scalar_one()
        assert (job.status, job.error) == ("done", "not all episodes were sent: ...")


def test_job_is_done_only_after_grading_unless_it_does_not_grade(sqlite_db):
    for grades in (True, False):
        with sqlite_db.session() as s:
            job = job_rows.create_job(
                s, config={"grade": grades}, config_hash="g" * 64, package_versions={}, git_revision="x"
            )
            (ep,) = job_rows.add_episodes(s, job.id, [Key("a", "nexus")])
        with sqlite_db.session() as s:
            claim = st.claim_episode(s, ep.id)
        with sqlite_db.session() as s:
            assert st.finish_episode(s, claim, "step_limit", exit_status="step_limit", patch="p")
            summary = job_rows.job_summary(s, job.id)
            assert (summary.status, summary.awaiting_grade, summary.active, summary.finished) == (
                ("running", 1, 1, 0) if grades else ("done", 0, 0, 1)
            )
