"""``db.liveness`` and ``workers.faults.heartbeat`` on SQLite: who holds an episode, when its holder is gone, handing a
run or a grade back (compare-and-swap), what only a message would start (``unsent``), the workers' own rows, and
the heartbeat thread. Times are explicit (``now=``, a claim made in the past) and deaths are ``is_dead=``
callables, so nothing sleeps except the heartbeat thread's own test."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from db import job_rows
from db import store as st
from db.claims import ClaimLost, claim_episode, heartbeat, record_turn
from db.finishing import finish_episode, record_grade
from db.liveness import (
    Released,
    claim_grade,
    give_back,
    holder_gone,
    release,
    stranded,
    unfinished_jobs,
    unsent,
)
from db.models import Episode, Job, Turn, utcnow
from db.worker_rows import recent_workers, report_worker
from tests.db.test_db_store import Key, _run_to
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixtures)
from workers.faults.heartbeat import Heartbeat

BOUND = 60.0  # stale_after_s in these tests
SILENT = timedelta(seconds=BOUND + 5)  # a holder silent this long is gone


def _alive(_worker: str) -> bool:
    return False


def _dead(_worker: str) -> bool:
    return True


def _job(db, n: int, config: dict | None = None) -> tuple[str, list[str]]:
    keys = [Key(f"t{i}", "nexus") for i in range(n)]
    with db.session() as s:
        job = job_rows.create_job(s, config=config or {}, config_hash="cd" * 32, name="liveness")
        return job.id, [r.id for r in job_rows.add_episodes(s, job.id, keys)]


def _claim(db, episode_id: str, worker: str = "hostA/1", *, ago: timedelta | None = None):
    """A run claim; with ``ago`` it was taken (and last beat) that long ago."""
    with db.session() as s:
        claim = claim_episode(s, episode_id, worker=worker, now=utcnow() - ago if ago else None)
    assert claim is not None
    return claim


def _submitted(db, episode_id: str, turns: int = 0) -> None:
    """Run ``episode_id`` to an agent exit (``submitted``) that waits for its grade, with ``turns`` stored."""
    claim = _claim(db, episode_id, worker="runner/1")
    for i in range(turns):
        with db.session() as s:
            record_turn(s, claim, i, completion=f"turn {i}")
    with db.session() as s:
        assert finish_episode(s, claim, "submitted", exit_status="submitted", patch="diff")


def _grade_claim(db, episode_id: str, worker: str = "g/1", *, ago: timedelta | None = None):
    with db.session() as s:
        now = utcnow() - ago if ago else None
        claim = claim_grade(s, episode_id, stale_after_s=BOUND, worker=worker, is_dead=_alive, now=now)
    assert claim is not None
    return claim


def _row(db, episode_id: str) -> Episode:
    with db.session() as s:
        row = st.get_episode(s, episode_id)
        s.expunge(row)
        return row


def _turns(db, episode_id: str) -> int:
    with db.session() as s:
        return s.execute(select(func.count(Turn.id)).where(Turn.episode_id == episode_id)).scalar_one()


# 1. who is stranded


def test_holder_gone_is_a_silence_longer_than_the_bound_or_a_dead_worker():
    now = utcnow()
    at_bound = Episode(worker="h/1", heartbeat_at=now - timedelta(seconds=BOUND))
    assert not holder_gone(at_bound, stale_after_s=BOUND, now=now, is_dead=_alive)  # exactly the bound: alive
    past = Episode(worker="h/1", heartbeat_at=now - timedelta(seconds=BOUND, microseconds=1))
    assert holder_gone(past, stale_after_s=BOUND, now=now, is_dead=_alive)
    assert holder_gone(Episode(worker="h/1", heartbeat_at=None), stale_after_s=BOUND, now=now, is_dead=_alive)
    fresh = Episode(worker="h/1", heartbeat_at=now)
    assert holder_gone(fresh, stale_after_s=BOUND, now=now, is_dead=lambda w: w == "h/1")  # dead pid: at once
    assert not holder_gone(fresh, stale_after_s=BOUND, now=now, is_dead=lambda w: w == "h/2")


def test_a_silent_run_is_stranded_a_beating_one_is_not_and_a_dead_worker_at_once(sqlite_db):
    job_id, (fresh, silent, crashed, queued) = _job(sqlite_db, 4)
    other_job, (elsewhere,) = _job(sqlite_db, 1)
    _claim(sqlite_db, fresh, "hostA/1")
    _claim(sqlite_db, silent, "hostA/2", ago=SILENT)
    _claim(sqlite_db, crashed, "hostA/3")
    _claim(sqlite_db, elsewhere, "hostA/4", ago=SILENT)
    with sqlite_db.session() as s:
        assert sorted(stranded(s, stale_after_s=BOUND, is_dead=_alive)) == sorted([silent, elsewhere])
        assert stranded(s, stale_after_s=BOUND, job_id=job_id, is_dead=_alive) == [silent]
        assert sorted(stranded(s, stale_after_s=BOUND, job_id=job_id, is_dead=lambda w: w == "hostA/3")) == sorted(
            [silent, crashed]
        )
        assert stranded(s, stale_after_s=BOUND + 3600, is_dead=_alive) == []  # a longer bound: all still alive
        later = utcnow() + SILENT  # the fresh one too once it stops beating; a queued row is held by nobody
        assert sorted(stranded(s, stale_after_s=BOUND, job_id=job_id, is_dead=_alive, now=later)) == sorted(
            [fresh, silent, crashed]
        )
        assert queued not in stranded(s, stale_after_s=BOUND, is_dead=_dead, now=later)


def test_a_cancelled_jobs_episodes_are_never_stranded(sqlite_db):
    job_id, (running, grading) = _job(sqlite_db, 2)
    _claim(sqlite_db, running, ago=SILENT)
    _submitted(sqlite_db, grading)
    _grade_claim(sqlite_db, grading, ago=SILENT)
    with sqlite_db.session() as s:
        assert sorted(stranded(s, stale_after_s=BOUND, is_dead=_dead)) == sorted([running, grading])
        job_rows.cancel_job(s, job_id)
    assert _row(sqlite_db, grading).claim_token is not None  # cancel leaves an agent exit (and its grade claim)
    with sqlite_db.session() as s:
        assert stranded(s, stale_after_s=BOUND, is_dead=_dead, now=utcnow() + SILENT) == []
        assert stranded(s, stale_after_s=BOUND, job_id=job_id, is_dead=_dead) == []


def test_a_running_row_of_a_job_marked_cancelled_is_not_stranded(sqlite_db):
    job_id, (ep,) = _job(sqlite_db, 1)
    _claim(sqlite_db, ep, ago=SILENT)
    with sqlite_db.session() as s:
        s.execute(update(Job).where(Job.id == job_id).values(status="cancelled"))
    with sqlite_db.session() as s:
        assert stranded(s, stale_after_s=BOUND, is_dead=_dead) == []


# 2. handing a run back


def test_a_released_run_goes_back_to_queued_its_claim_void_and_its_turns_deleted(sqlite_db):
    job_id, (ep,) = _job(sqlite_db, 1)
    gone = _claim(sqlite_db, ep, "hostA/1")
    for i in range(2):
        with sqlite_db.session() as s:
            record_turn(s, gone, i, completion=f"turn {i}")
    with sqlite_db.session() as s:  # still beating: not handed back
        assert release(s, ep, stale_after_s=BOUND, is_dead=_alive) is None
    assert _row(sqlite_db, ep).status == "running" and _turns(sqlite_db, ep) == 2

    with sqlite_db.session() as s:
        released = release(s, ep, stale_after_s=BOUND, is_dead=_alive, now=utcnow() + SILENT)
    assert released == Released(holder="hostA/1", run=True)
    row = _row(sqlite_db, ep)
    assert (row.status, row.claim_token, row.heartbeat_at, row.n_claims) == ("queued", None, None, 1)
    assert _turns(sqlite_db, ep) == 0

    with sqlite_db.session() as s, pytest.raises(ClaimLost):  # the gone worker can no longer write a turn
        record_turn(s, gone, 2, completion="late")
    with sqlite_db.session() as s, pytest.raises(ClaimLost):  # nor beat
        heartbeat(s, gone)
    with sqlite_db.session() as s:  # nor finish
        assert not finish_episode(s, gone, "submitted", exit_status="submitted", patch="late")
    assert _row(sqlite_db, ep).status == "queued" and _turns(sqlite_db, ep) == 0

    with sqlite_db.session() as s:
        taker = claim_episode(s, ep, worker="hostB/2")
    assert taker is not None and taker.took_over_from == "hostA/1"
    row = _row(sqlite_db, ep)
    assert (row.status, row.worker, row.claim_token, row.n_claims) == ("running", "hostB/2", taker.token, 2)


def test_a_fresh_queued_row_is_no_takeover(sqlite_db):
    _, (ep,) = _job(sqlite_db, 1)
    assert _claim(sqlite_db, ep).took_over_from is None


def test_of_two_releases_of_one_row_only_the_first_gets_it(sqlite_db):
    _, (ep,) = _job(sqlite_db, 1)
    _claim(sqlite_db, ep, "hostA/1")
    with sqlite_db.session() as s:
        first = release(s, ep, stale_after_s=BOUND, is_dead=_dead)
    with sqlite_db.session() as s:
        second = release(s, ep, stale_after_s=BOUND, is_dead=_dead)
    assert (first, second) == (Released("hostA/1", True), None)
    with sqlite_db.session() as s, pytest.raises(LookupError):
        release(s, "no-such-episode", stale_after_s=BOUND)


def test_release_swaps_only_the_claim_it_read(sqlite_db):
    """Another writer re-claims the row between release's read and its UPDATE (simulated in the same
    transaction, from inside the liveness check): the compare-and-swap hands nothing back."""
    _, (ep,) = _job(sqlite_db, 1)
    _claim(sqlite_db, ep, "hostA/1")
    with sqlite_db.session() as s:

        def reclaimed_meanwhile(_worker: str) -> bool:
            s.execute(
                update(Episode)
                .where(Episode.id == ep)
                .values(claim_token="new-holder", worker="hostB/2", heartbeat_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            return True

        assert release(s, ep, stale_after_s=BOUND, is_dead=reclaimed_meanwhile) is None
    row = _row(sqlite_db, ep)
    assert (row.status, row.claim_token, row.worker) == ("running", "new-holder", "hostB/2")


# 3. giving back one's own claim


def test_give_back_hands_back_only_the_holders_own_claim(sqlite_db):
    _, (ep,) = _job(sqlite_db, 1)
    old = _claim(sqlite_db, ep, "hostA/1")
    with sqlite_db.session() as s:
        assert release(s, ep, stale_after_s=BOUND, is_dead=_dead) is not None
    new = _claim(sqlite_db, ep, "hostB/2")
    with sqlite_db.session() as s:
        record_turn(s, new, 0, completion="x")
    with sqlite_db.session() as s:
        assert not give_back(s, old)  # a void claim cannot hand back the new holder's run
    assert (_row(sqlite_db, ep).status, _row(sqlite_db, ep).claim_token) == ("running", new.token)
    with sqlite_db.session() as s:
        assert give_back(s, new)
    with sqlite_db.session() as s:
        assert not give_back(s, new)  # once
    row = _row(sqlite_db, ep)
    assert (row.status, row.claim_token, _turns(sqlite_db, ep)) == ("queued", None, 0)
    assert _claim(sqlite_db, ep, "hostC/3").took_over_from == "hostB/2"


# 4. grades


def test_an_agent_exit_lets_go_of_its_run_claim(sqlite_db):
    job_id, (ep,) = _job(sqlite_db, 1)
    _submitted(sqlite_db, ep)
    row = _row(sqlite_db, ep)
    assert (row.status, row.claim_token, row.heartbeat_at) == ("submitted", None, None)
    with sqlite_db.session() as s:
        assert unsent(s, [job_id]).grades == [ep]


def test_a_grade_is_claimed_once_while_its_grader_beats_and_taken_over_when_it_is_silent(sqlite_db):
    job_id, (ep,) = _job(sqlite_db, 1)
    _submitted(sqlite_db, ep)
    first = _grade_claim(sqlite_db, ep, "g/1")
    assert (first.episode_id, first.job_id, first.worker, first.attempt) == (ep, job_id, "g/1", 1)
    assert _row(sqlite_db, ep).claim_token == first.token
    with sqlite_db.session() as s:  # a duplicate grade message while the first grader beats
        assert claim_grade(s, ep, stale_after_s=BOUND, worker="g/2", is_dead=_alive) is None
        heartbeat(s, first)
        assert unsent(s, [job_id]).grades == []
    with sqlite_db.session() as s:
        second = claim_grade(s, ep, stale_after_s=BOUND, worker="g/2", is_dead=_alive, now=utcnow() + SILENT)
    assert second is not None and second.token != first.token
    with sqlite_db.session() as s, pytest.raises(ClaimLost):
        heartbeat(s, first)
    with sqlite_db.session() as s:
        heartbeat(s, second)
    with sqlite_db.session() as s:
        assert record_grade(s, ep, "resolved", test_log="ok", grader="t", grader_version="1")
    with sqlite_db.session() as s:
        assert not record_grade(s, ep, "unresolved", test_log="late", grader="t", grader_version="1")
        assert claim_grade(s, ep, stale_after_s=BOUND, is_dead=_dead) is None  # graded: nothing to claim
    row = _row(sqlite_db, ep)
    assert (row.status, row.test_log) == ("resolved", "ok")


def test_a_dead_graders_claim_is_taken_over_at_once(sqlite_db):
    _, (ep,) = _job(sqlite_db, 1)
    _submitted(sqlite_db, ep)
    _grade_claim(sqlite_db, ep, "g/1")
    with sqlite_db.session() as s:
        taker = claim_grade(s, ep, stale_after_s=BOUND, worker="g/2", is_dead=lambda w: w == "g/1")
    assert taker is not None and _row(sqlite_db, ep).worker == "g/2"


def test_claim_grade_refuses_a_row_that_awaits_no_grade(sqlite_db):
    _, (queued, running) = _job(sqlite_db, 2)
    _claim(sqlite_db, running)
    with sqlite_db.session() as s:
        assert claim_grade(s, queued, stale_after_s=BOUND) is None
        assert claim_grade(s, running, stale_after_s=BOUND, is_dead=_dead) is None
        with pytest.raises(LookupError):
            claim_grade(s, "no-such-episode", stale_after_s=BOUND)


def test_a_silent_grade_claim_is_released_keeping_the_agents_turns(sqlite_db):
    job_id, (ep,) = _job(sqlite_db, 1)
    _submitted(sqlite_db, ep, turns=2)
    grader = _grade_claim(sqlite_db, ep, "g/1", ago=SILENT)
    with sqlite_db.session() as s:
        assert stranded(s, stale_after_s=BOUND, is_dead=_alive) == [ep]
        released = release(s, ep, stale_after_s=BOUND, is_dead=_alive)
    assert released == Released(holder="g/1", run=False)
    row = _row(sqlite_db, ep)
    assert (row.status, row.claim_token, row.heartbeat_at, row.patch) == ("submitted", None, None, "diff")
    assert _turns(sqlite_db, ep) == 2  # a grade hand-back keeps the run
    with sqlite_db.session() as s, pytest.raises(ClaimLost):
        heartbeat(s, grader)
    with sqlite_db.session() as s:
        assert release(s, ep, stale_after_s=BOUND, is_dead=_dead) is None  # nobody holds it now
        assert unsent(s, [job_id]).grades == [ep]
        assert stranded(s, stale_after_s=BOUND, is_dead=_dead) == []


def test_a_grader_gives_back_its_own_grade_claim_and_the_grade_is_unsent_again(sqlite_db):
    job_id, (ep,) = _job(sqlite_db, 1)
    _submitted(sqlite_db, ep, turns=1)
    grader = _grade_claim(sqlite_db, ep)
    with sqlite_db.session() as s:
        assert unsent(s, [job_id]).grades == []
        assert give_back(s, grader)
    with sqlite_db.session() as s:
        assert not give_back(s, grader)
        assert unsent(s, [job_id]).grades == [ep]
    row = _row(sqlite_db, ep)
    assert (row.status, row.claim_token, _turns(sqlite_db, ep)) == ("submitted", None, 1)
    assert _grade_claim(sqlite_db, ep, "g/2") is not None  # the next grade message finds it free


# 5. what only a message would start


def test_unsent_lists_queued_rows_and_unstarted_grades_only(sqlite_db):
    job_id, (queued, running, waiting, grading, graded, failed) = _job(sqlite_db, 6)
    _claim(sqlite_db, running)
    for ep in (waiting, grading, graded):
        _submitted(sqlite_db, ep)
    _grade_claim(sqlite_db, grading)
    with sqlite_db.session() as s:
        assert record_grade(s, graded, "resolved")
    claim = _claim(sqlite_db, failed)
    with sqlite_db.session() as s:
        assert finish_episode(s, claim, "infra_failure", error="engine gone")
    with sqlite_db.session() as s:
        found = unsent(s, [job_id])
    assert (found.runs, found.grades) == ([queued], [waiting])

    with sqlite_db.session() as s:  # only the newest attempt counts: a rerun of the failed row is queued
        retry = st.new_attempt(s, failed).id
    with sqlite_db.session() as s:
        assert sorted(unsent(s, [job_id]).runs) == sorted([queued, retry])


def test_unsent_waits_for_no_grade_when_the_job_does_not_grade(sqlite_db):
    job_id, (queued, waiting) = _job(sqlite_db, 2, config={"grade": False})
    _submitted(sqlite_db, waiting)
    with sqlite_db.session() as s:
        found = unsent(s, [job_id])
    assert (found.runs, found.grades) == ([queued], [])


def test_unsent_lists_nothing_of_a_cancelled_job_and_covers_several_jobs(sqlite_db):
    cancelled, (_, waiting) = _job(sqlite_db, 2)
    _submitted(sqlite_db, waiting)
    live, (queued,) = _job(sqlite_db, 1)
    with sqlite_db.session() as s:
        assert unsent(s, [cancelled, live]).grades == [waiting]
        job_rows.cancel_job(s, cancelled)
    with sqlite_db.session() as s:
        found = unsent(s, [cancelled, live])
        assert (found.runs, found.grades) == ([queued], [])
        assert (unsent(s, []).runs, unsent(s, []).grades) == ([], [])


def test_unfinished_jobs_are_neither_done_nor_cancelled_oldest_first(sqlite_db):
    done, (d,) = _job(sqlite_db, 1)
    _run_to(sqlite_db, d, grade="resolved")
    pending, _ = _job(sqlite_db, 1)
    cancelled, _ = _job(sqlite_db, 1)
    running, (r,) = _job(sqlite_db, 1)
    _claim(sqlite_db, r)
    with sqlite_db.session() as s:
        job_rows.cancel_job(s, cancelled)
    with sqlite_db.session() as s:
        assert job_rows.get_job(s, done).status == "done"
        assert unfinished_jobs(s) == [pending, running]


# 6. the workers' own rows


def test_report_worker_inserts_then_updates_and_keeps_when_the_state_began(sqlite_db):
    t0 = utcnow()
    with sqlite_db.session() as s:
        row = report_worker(s, "h/1", queues="gpu", state="ok", now=t0)
        assert (row.state, row.started_at, row.seen_at, row.state_since, row.detail) == ("ok", t0, t0, t0, None)
    with sqlite_db.session() as s:
        row = report_worker(s, "h/1", queues="gpu,grade", state="ok", detail="x", now=t0 + timedelta(seconds=30))
        assert (row.queues, row.seen_at, row.state_since, row.detail) == (
            "gpu,grade",
            t0 + timedelta(seconds=30),
            t0,  # same state: it began at t0
            "x",
        )
    with sqlite_db.session() as s:
        row = report_worker(
            s, "h/1", queues="gpu", state="paused", detail="engine down", now=t0 + timedelta(seconds=60)
        )
        assert (row.state, row.state_since, row.detail) == ("paused", t0 + timedelta(seconds=60), "engine down")
    with sqlite_db.session() as s:
        row = report_worker(s, "h/1", queues="gpu", state="ok", now=t0 + timedelta(seconds=90))
        assert (row.state, row.state_since, row.started_at, row.detail) == ("ok", t0 + timedelta(seconds=90), t0, None)
    with sqlite_db.session() as s, pytest.raises(ValueError):
        report_worker(s, "h/1", queues="gpu", state="dead")


def test_recent_workers_are_those_seen_within_the_window_newest_first(sqlite_db):
    t0 = utcnow()
    with sqlite_db.session() as s:
        report_worker(s, "old/1", queues="gpu", state="ok", now=t0 - timedelta(seconds=300))
        report_worker(s, "edge/2", queues="grade", state="ok", now=t0 - timedelta(seconds=90))
        report_worker(s, "new/3", queues="gpu", state="paused", now=t0 - timedelta(seconds=5))
    with sqlite_db.session() as s:
        assert [w.name for w in recent_workers(s, within_s=90, now=t0)] == ["new/3", "edge/2"]
        assert [w.name for w in recent_workers(s, within_s=10, now=t0)] == ["new/3"]
        assert [w.name for w in recent_workers(s, within_s=3600, now=t0)] == ["new/3", "edge/2", "old/1"]


# 7. the heartbeat thread


def _until(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_the_heartbeat_thread_beats_a_held_run_and_stops_when_it_is_released(sqlite_db):
    _, (ep,) = _job(sqlite_db, 1)
    claim = _claim(sqlite_db, ep, ago=SILENT)  # last beat long ago: the thread's beats are visible
    before = _row(sqlite_db, ep).heartbeat_at
    with Heartbeat(sqlite_db, claim, every_s=0.05) as beating:
        assert _until(lambda: beating.beats >= 2)
        assert _row(sqlite_db, ep).heartbeat_at > before
        with sqlite_db.session() as s:
            assert stranded(s, stale_after_s=BOUND, is_dead=_alive) == []  # the beats keep it held
            assert release(s, ep, stale_after_s=BOUND, is_dead=_dead) is not None
        assert _until(lambda: beating.lost is not None)
        beats = beating.beats
        time.sleep(0.2)
        assert beating.beats == beats  # stopped
    assert "no longer holds" in beating.lost
    assert _row(sqlite_db, ep).heartbeat_at is None  # the thread did not revive the handed-back row


def test_the_heartbeat_thread_stops_when_the_job_is_cancelled(sqlite_db):
    job_id, (ep,) = _job(sqlite_db, 1)
    claim = _claim(sqlite_db, ep)
    with Heartbeat(sqlite_db, claim, every_s=0.05) as beating:
        assert _until(lambda: beating.beats >= 1)
        with sqlite_db.session() as s:
            job_rows.cancel_job(s, job_id)
        assert _until(lambda: beating.lost is not None)
    assert _row(sqlite_db, ep).status == "cancelled"


def test_the_heartbeat_thread_beats_a_grade_claim_and_ends_quietly_with_its_block(sqlite_db):
    _, (ep,) = _job(sqlite_db, 1)
    _submitted(sqlite_db, ep)
    grader = _grade_claim(sqlite_db, ep, ago=SILENT)
    with Heartbeat(sqlite_db, grader, every_s=0.05) as beating:
        assert _until(lambda: beating.beats >= 1)
    with sqlite_db.session() as s:
        assert stranded(s, stale_after_s=BOUND, is_dead=_alive) == []
    assert beating.lost is None
