"""``jobs.counts`` is kept in step by every status writer (no write or read scans the job's episodes), and always
equals the slow definition: a recount over each key's newest attempt. A seeded random walk through every writer
(claim, finish, fail, grade, regrade, release, give back, rerun, cancel) checks it after each step, on SQLite and
PostgreSQL."""

from __future__ import annotations

import random

from sqlalchemy import select

from db import store as st
from db.claims import fail_running_episode
from db.job_status import recount, summarize
from db.liveness import give_back, release
from db.models import AGENT_EXIT_STATUSES, GRADE_STATUSES, Episode, Job
from tests.service.db_fixtures import any_db_fixture  # noqa: F401  (fixture)
from tests.service.test_db_store import Key


def _rows(db, job_id: str) -> list[tuple[str, str]]:
    with db.session() as s:
        return [tuple(r) for r in s.execute(select(Episode.id, Episode.status).where(Episode.job_id == job_id))]


def _step(db, rng: random.Random, job_id: str, claims: dict) -> str:
    """One random write through the store's functions; returns what it did."""
    rows = _rows(db, job_id)
    episode_id, status = rng.choice(rows)
    with db.session() as s:
        if status == "queued":
            claims[episode_id] = st.claim_episode(s, episode_id)
            return "claim"
        if status == "running" and episode_id in claims:
            claim = claims.pop(episode_id)
            pick = rng.random()
            if pick < 0.5:
                st.finish_episode(s, claim, rng.choice(sorted(AGENT_EXIT_STATUSES | GRADE_STATUSES)))
                return "finish"
            if pick < 0.65:
                fail_running_episode(s, episode_id, "timeout", "slow")
                return "fail"
            if pick < 0.8:
                give_back(s, claim)
                return "give back"
            release(s, episode_id, stale_after_s=0.0, is_dead=lambda _w: True)
            return "release"
        if status in AGENT_EXIT_STATUSES:
            st.record_grade(s, episode_id, rng.choice(sorted(GRADE_STATUSES)))
            return "grade"
        if status in GRADE_STATUSES and rng.random() < 0.3:
            st.record_grade(s, episode_id, "unresolved", regrade=True)
            return "regrade"
        if status not in ("queued", "running"):
            # a rerun, possibly of an attempt that is no longer its key's newest
            st.new_attempt(s, episode_id)
            return "rerun"
    return "nothing"


def test_counts_equal_a_recount_after_every_write(any_db):
    rng = random.Random(35)
    with any_db.session() as s:
        job = st.create_job(s, config={"grade": True}, config_hash="c" * 64, name="walk")
        st.add_episodes(s, job.id, [Key(f"t{i}", m) for i in range(4) for m in ("dense", "snapkv")])
        job_id = job.id
    claims: dict = {}
    done = set()
    for _ in range(160):
        done.add(_step(any_db, rng, job_id, claims))
        with any_db.session() as s:
            stored = s.get(Job, job_id).counts
            assert stored == recount(s, job_id), done
    assert {"claim", "finish", "fail", "grade", "rerun", "release", "give back"} <= done
    with any_db.session() as s:
        st.cancel_job(s, job_id)
    with any_db.session() as s:
        job = s.get(Job, job_id)
        assert job.counts == recount(s, job_id) and job.status == "cancelled"
        summary = summarize(s, job)
        assert summary.total == 8 and summary.counts == job.counts


def test_a_job_stored_without_counts_is_recounted_once(any_db):
    with any_db.session() as s:
        job = st.create_job(s, config={}, config_hash="c" * 64, name="old")
        st.add_episodes(s, job.id, [Key("a", "dense"), Key("b", "dense")])
        job.counts = None  # as revision 0009 found a job it had not counted
        job_id = job.id
    with any_db.session() as s:
        assert summarize(s, s.get(Job, job_id)).counts == {"queued": 2}
        (first, _) = st.episodes_for_job(s, job_id)
        claim = st.claim_episode(s, first.id)
    with any_db.session() as s:
        assert s.get(Job, job_id).counts == {"queued": 1, "running": 1} == recount(s, job_id)
        assert claim is not None
