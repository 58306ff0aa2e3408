"""The pieces behind docs/service.md's "Faults", on SQLite with no broker, engine or worker: liveness and
hand-back (``db.liveness``), database retries, the Docker gate, automatic infra retries, the sweep and resume
(``workers.recovery``), and the settings that time them. The fault tests themselves run real services
(``test_fault_recovery.py``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError, OperationalError

from db import store as st
from db.liveness import claim_grade, give_back, recent_workers, release, report_worker, stranded, unsent
from db.models import Job, Turn, utcnow
from tests.service.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixtures)
from tests.service.test_db_store import Key, _job_with
from workers.app import ServiceSettings
from workers.db_retry import DatabaseUnavailable, retrying
from workers.docker_gate import EngineDown, wait_for_engine
from workers.heartbeat import LIVENESS, Heartbeat, Liveness
from workers.recovery import recover_at_start, resume_job, retry_infra_failure, sweep

BOUND = 60.0
LATER = timedelta(seconds=BOUND + 1)


def _claimed(db, episode_id: str, worker: str = "hostA/1"):
    with db.session() as s:
        return st.claim_episode(s, episode_id, worker=worker)


def _turns(db, episode_id: str) -> int:
    with db.session() as s:
        return s.execute(select(func.count(Turn.id)).where(Turn.episode_id == episode_id)).scalar_one()


class Senders:
    """Test double for the broker side: records what would be sent."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.grades: list[str] = []

    def kw(self) -> dict:
        return {"send_run": self.runs.append, "send_grade": self.grades.append}


def test_a_silent_run_is_handed_back_once_its_claim_void_and_the_next_claim_a_takeover(sqlite_db):
    _, (ep,) = _job_with(sqlite_db, [Key("a", "nexus")])
    claim = _claimed(sqlite_db, ep)
    with sqlite_db.session() as s:
        st.record_turn(s, claim, 0, completion="x")
    alive = {"is_dead": lambda _w: False}
    with sqlite_db.session() as s:
        assert stranded(s, stale_after_s=BOUND, **alive) == []
        assert stranded(s, stale_after_s=BOUND, now=utcnow() + LATER, **alive) == [ep]
        assert stranded(s, stale_after_s=BOUND, is_dead=lambda w: w == "hostA/1") == [ep]  # a dead pid: at once
    with sqlite_db.session() as s:
        released = release(s, ep, stale_after_s=BOUND, now=utcnow() + LATER, **alive)
    assert (released.holder, released.run) == ("hostA/1", True)
    with sqlite_db.session() as s:  # a second sweeper finds nothing to hand back
        assert release(s, ep, stale_after_s=BOUND, now=utcnow() + LATER, **alive) is None
        row = st.get_episode(s, ep)
        assert (row.status, row.claim_token) == ("queued", None)
    assert _turns(sqlite_db, ep) == 0
    with sqlite_db.session() as s, pytest.raises(st.ClaimLost):  # the gone worker can no longer write
        st.record_turn(s, claim, 1, completion="y")
    with sqlite_db.session() as s:
        assert not st.finish_episode(s, claim, "submitted")
    again = _claimed(sqlite_db, ep, worker="hostB/2")
    assert again.took_over_from == "hostA/1"
    with sqlite_db.session() as s:
        assert st.get_episode(s, ep).n_claims == 2


def test_a_cancelled_jobs_episodes_are_never_stranded(sqlite_db):
    job_id, (ep,) = _job_with(sqlite_db, [Key("a", "nexus")])
    _claimed(sqlite_db, ep)
    with sqlite_db.session() as s:
        s.execute(select(Job).where(Job.id == job_id)).scalar_one().status = "cancelled"
    with sqlite_db.session() as s:
        assert stranded(s, stale_after_s=BOUND, now=utcnow() + LATER) == []


def test_give_back_only_hands_back_its_own_claim(sqlite_db):
    _, (ep,) = _job_with(sqlite_db, [Key("a", "nexus")])
    first = _claimed(sqlite_db, ep)
    with sqlite_db.session() as s:
        release(s, ep, stale_after_s=BOUND, is_dead=lambda _w: True)
    second = _claimed(sqlite_db, ep, worker="hostB/2")
    with sqlite_db.session() as s:
        assert not give_back(s, first)  # the old claim cannot hand back the new holder's run
        assert give_back(s, second)
        assert st.get_episode(s, ep).status == "queued"


def test_a_grade_is_claimed_once_and_a_silent_grader_is_replaced(sqlite_db):
    _, (ep,) = _job_with(sqlite_db, [Key("a", "nexus")])
    run = _claimed(sqlite_db, ep)
    with sqlite_db.session() as s:
        assert st.finish_episode(s, run, "submitted", patch="diff")
        assert st.get_episode(s, ep).claim_token is None  # the run let go: no grade in progress
        assert unsent(s, [run.job_id]).grades == [ep]
    with sqlite_db.session() as s:
        grader = claim_grade(s, ep, stale_after_s=BOUND, worker="g/1", is_dead=lambda _w: False)
    with sqlite_db.session() as s:
        assert claim_grade(s, ep, stale_after_s=BOUND, worker="g/2", is_dead=lambda _w: False) is None  # duplicate
        st.heartbeat(s, grader)
        assert unsent(s, [run.job_id]).grades == []
    later = utcnow() + LATER
    with sqlite_db.session() as s:
        second = claim_grade(s, ep, stale_after_s=BOUND, worker="g/2", is_dead=lambda _w: False, now=later)
    assert second is not None
    with sqlite_db.session() as s, pytest.raises(st.ClaimLost):
        st.heartbeat(s, grader)
    with sqlite_db.session() as s:
        assert st.record_grade(s, ep, "resolved")
        assert not st.record_grade(s, ep, "unresolved")  # exactly one verdict
        assert st.get_episode(s, ep).status == "resolved"


def test_a_stale_grade_claim_is_released_and_listed_unsent_again(sqlite_db):
    _, (ep,) = _job_with(sqlite_db, [Key("a", "nexus")])
    run = _claimed(sqlite_db, ep)
    with sqlite_db.session() as s:
        st.finish_episode(s, run, "submitted", patch="diff")
    with sqlite_db.session() as s:
        claim_grade(s, ep, stale_after_s=BOUND, worker="g/1")
    with sqlite_db.session() as s:
        released = release(s, ep, stale_after_s=BOUND, is_dead=lambda w: w == "g/1")
    assert (released.holder, released.run) == ("g/1", False)
    with sqlite_db.session() as s:
        assert st.get_episode(s, ep).status == "submitted"
        assert unsent(s, [run.job_id]).grades == [ep]


def test_unsent_lists_queued_runs_and_unstarted_grades_only(sqlite_db):
    job_id, (queued, running, waiting) = _job_with(sqlite_db, [Key("a", "x"), Key("b", "x"), Key("c", "x")])
    _claimed(sqlite_db, running)
    done = _claimed(sqlite_db, waiting)
    with sqlite_db.session() as s:
        st.finish_episode(s, done, "step_limit", patch="")
    with sqlite_db.session() as s:
        found = unsent(s, [job_id])
        assert (found.runs, found.grades) == ([queued], [waiting])
        s.execute(select(Job).where(Job.id == job_id)).scalar_one().config = {"grade": False}
    with sqlite_db.session() as s:
        assert unsent(s, [job_id]).grades == []  # a job that does not grade waits for no grade


def test_a_worker_row_keeps_when_its_state_began(sqlite_db):
    t0 = utcnow()
    with sqlite_db.session() as s:
        report_worker(s, "h/1", queues="gpu", state="ok", now=t0)
        report_worker(s, "h/1", queues="gpu", state="paused", detail="engine down", now=t0 + timedelta(seconds=5))
        row = report_worker(s, "h/1", queues="gpu", state="paused", detail="engine down", now=t0 + timedelta(seconds=9))
        assert (row.state, row.state_since, row.seen_at) == (
            "paused",
            t0 + timedelta(seconds=5),
            t0 + timedelta(seconds=9),
        )
        report_worker(s, "h/2", queues="grade", state="ok", now=t0 - timedelta(seconds=300))
    with sqlite_db.session() as s:
        assert [w.name for w in recent_workers(s, within_s=90, now=t0 + timedelta(seconds=10))] == ["h/1"]


def test_the_heartbeat_thread_beats_and_stops_when_the_claim_is_lost(sqlite_db):
    import time

    _, (ep,) = _job_with(sqlite_db, [Key("a", "nexus")])
    claim = _claimed(sqlite_db, ep)
    with sqlite_db.session() as s:
        first = st.get_episode(s, ep).heartbeat_at
    with Heartbeat(sqlite_db, claim, every_s=0.05) as beating:
        time.sleep(0.4)
        with sqlite_db.session() as s:
            assert st.get_episode(s, ep).heartbeat_at > first and beating.beats > 0
            release(s, ep, stale_after_s=BOUND, is_dead=lambda _w: True)
        time.sleep(0.3)
        assert beating.lost is not None and "no longer holds" in beating.lost


def test_retrying_rides_out_a_transient_error_and_gives_up_after_its_budget():
    slept, clock = [], [0.0]
    attempts = iter([OperationalError("x", {}, Exception("down")), OperationalError("x", {}, Exception("down")), 7])

    def work():
        value = next(attempts)
        if isinstance(value, Exception):
            raise value
        return value

    def sleep(s):
        slept.append(s)
        clock[0] += s

    assert retrying(work, budget_s=10, what="w", sleep=sleep, clock=lambda: clock[0]) == 7
    assert slept == [0.5, 1.0]

    def down():
        raise OperationalError("x", {}, Exception("connection refused"))

    with pytest.raises(DatabaseUnavailable, match="did not answer for 5 s") as raised:
        retrying(down, budget_s=5, what="w", sleep=sleep, clock=lambda: clock[0])
    assert isinstance(raised.value.__cause__, OperationalError)

    calls = []

    def broken():
        calls.append(1)
        raise IntegrityError("x", {}, Exception("unique"))

    with pytest.raises(IntegrityError):
        retrying(broken, budget_s=5, what="w", sleep=sleep)
    assert calls == [1]  # a statement error is not retried


def test_the_docker_gate_waits_for_the_engine_then_gives_up():
    clock, slept = [0.0], []

    def sleep(s):
        slept.append(s)
        clock[0] += s

    wait_for_engine(60, what="t", probe=lambda: None, sleep=sleep, clock=lambda: clock[0])
    assert slept == []
    answers = iter(["down", "down", None])
    wait_for_engine(60, what="t", probe=lambda: next(answers), sleep=sleep, clock=lambda: clock[0])
    assert slept == [1.0, 2.0]
    with pytest.raises(EngineDown, match="connection refused"):
        wait_for_engine(30, what="t", probe=lambda: "connection refused", sleep=sleep, clock=lambda: clock[0])


def _infra_failure(db, episode_id: str) -> None:
    claim = _claimed(db, episode_id)
    with db.session() as s:
        st.finish_episode(s, claim, "infra_failure", error="engine gone")


def test_an_infra_failure_is_retried_as_new_attempts_up_to_the_configured_count(sqlite_db):
    _, (ep,) = _job_with(sqlite_db, [Key("a", "nexus")])
    sent = Senders()
    chain = [ep]
    for _ in range(3):
        _infra_failure(sqlite_db, chain[-1])
        new = retry_infra_failure(sqlite_db, chain[-1], retries=2, send_run=sent.runs.append)
        if new is None:
            break
        chain.append(new)
    assert len(chain) == 3 and sent.runs == chain[1:]  # 2 retries in a row, then the key keeps its failure
    with sqlite_db.session() as s:
        rows = {r.id: r for r in st.episodes_for_job(s, st.get_episode(s, ep).job_id)}
        assert [rows[i].attempt for i in chain] == [1, 2, 3]
        assert rows[chain[1]].result["retry_of"] == ep
    assert retry_infra_failure(sqlite_db, chain[0], retries=5, send_run=sent.runs.append) is None  # not newest


def test_no_automatic_retry_for_a_verdict_an_interactive_attempt_or_a_cancelled_job(sqlite_db):
    job_id, (a, b) = _job_with(sqlite_db, [Key("a", "nexus"), Key("b", "nexus")])
    claim = _claimed(sqlite_db, a)
    with sqlite_db.session() as s:
        st.finish_episode(s, claim, "resolved")
    assert retry_infra_failure(sqlite_db, a, retries=2, send_run=print) is None
    with sqlite_db.session() as s:
        interactive = st.new_attempt(s, a, driver="interactive").id
    _infra_failure(sqlite_db, interactive)
    assert retry_infra_failure(sqlite_db, interactive, retries=2, send_run=print) is None
    _infra_failure(sqlite_db, b)
    with sqlite_db.session() as s:
        s.execute(select(Job).where(Job.id == job_id)).scalar_one().status = "cancelled"
    assert retry_infra_failure(sqlite_db, b, retries=2, send_run=print) is None


def test_a_sweep_sends_a_gone_holders_episode_once(sqlite_db):
    fast = Liveness(heartbeat_s=0.01, stale_after_s=0.05, sweep_s=0.05, db_retry_s=1)
    _, (ep,) = _job_with(sqlite_db, [Key("a", "nexus")])
    _claimed(sqlite_db, ep)
    sent = Senders()
    import time

    time.sleep(0.1)
    assert sweep(sqlite_db, fast, engine_up=False, **sent.kw()).runs == [ep]
    assert not sweep(sqlite_db, fast, engine_up=False, **sent.kw())
    assert sent.runs == [ep]


def test_the_first_sweep_on_the_embedded_broker_resends_what_it_may_have_lost(sqlite_db):
    _, (queued, waiting) = _job_with(sqlite_db, [Key("a", "x"), Key("b", "x")])
    claim = _claimed(sqlite_db, waiting)
    with sqlite_db.session() as s:
        st.finish_episode(s, claim, "submitted", patch="d")
    redis_like, embedded = Senders(), Senders()
    recover_at_start(sqlite_db, LIVENESS, embedded=False, **redis_like.kw())
    recover_at_start(sqlite_db, LIVENESS, embedded=True, **embedded.kw())
    assert (redis_like.runs, redis_like.grades) == ([], [])
    assert (embedded.runs, embedded.grades) == ([queued], [waiting])


def test_resume_sends_a_lost_jobs_episodes_clears_its_note_and_recomputes_its_status(sqlite_db):
    job_id, ids = _job_with(sqlite_db, [Key("a", "x"), Key("b", "x")])
    with sqlite_db.session() as s:
        st.note_job_error(s, job_id, "not all episodes were sent: job ...")
        s.execute(select(Job).where(Job.id == job_id)).scalar_one().status = "failed"  # an older version's mark
    sent = Senders()
    done = resume_job(sqlite_db, job_id[:4], LIVENESS, **sent.kw())
    assert sorted(done.sent_runs) == sorted(sent.runs) == sorted(ids)
    with sqlite_db.session() as s:
        job = st.get_job(s, job_id)
        assert (job.status, job.error) == ("running", None)
    resume_job(sqlite_db, job_id, LIVENESS, **sent.kw())  # again: the same rows, still queued, still one claim each
    assert sorted(sent.runs) == sorted(ids * 2)
    with pytest.raises(LookupError):
        resume_job(sqlite_db, "nope", LIVENESS, **sent.kw())


def test_the_liveness_settings_default_to_liveness_and_are_checked():
    settings = ServiceSettings.from_env({})
    assert settings.liveness == LIVENESS and settings.infra_retries == 2
    env = {"NEXUS_EVAL_HEARTBEAT": "5", "NEXUS_EVAL_STALE_AFTER": "40", "NEXUS_EVAL_SWEEP": "10"}
    assert ServiceSettings.from_env({**env, "NEXUS_EVAL_INFRA_RETRIES": "0"}).liveness.stale_after_s == 40
    with pytest.raises(ValueError, match="at least 4 heartbeats"):
        ServiceSettings.from_env({**env, "NEXUS_EVAL_STALE_AFTER": "19"})
    with pytest.raises(ValueError, match="must not exceed stale_after_s"):
        ServiceSettings.from_env({**env, "NEXUS_EVAL_SWEEP": "41"})
    with pytest.raises(ValueError):
        ServiceSettings.from_env({"NEXUS_EVAL_INFRA_RETRIES": "-1"})
