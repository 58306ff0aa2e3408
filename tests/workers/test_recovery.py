"""Riding out faults without a broker, engine or worker, on SQLite: database retries (``workers.faults.db_retry``), the
Docker gate (``workers.faults.docker_gate``), automatic infra retries, the sweep, the first sweep of a worker and
``resume`` (``workers.faults.recovery``, ``workers.celery_tasks``), and the settings that time them
(``jobs.settings.ServiceSettings``). Clocks and sleeps are fakes; senders and brokers are recording test doubles
(a broker is outside our control); container removal is replaced by a recorder (the Docker engine is too)."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from sqlalchemy import update
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError

from db import job_rows
from db import store as st
from db.finishing import finish_episode
from db.liveness import claim_grade, unsent
from db.models import Episode, Job, utcnow
from jobs.control import NotEnqueued, enqueue_pending, note_unsent
from jobs.queue import EPISODE_TASK, GRADE_TASK
from jobs.settings import LIVENESS, Liveness, ServiceSettings
from tests.db.test_db_store import _run_to
from tests.db.test_liveness import _claim, _job, _row, _submitted
from tests.jobs.test_rerun import RecordingBroker
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixtures)
from workers import celery_tasks
from workers.faults import recovery as rec
from workers.faults.db_retry import DatabaseStillDown, is_transient, retrying
from workers.faults.docker_gate import DockerDown, wait_for_docker
from workers.faults.recovery import UNSENT_NOTE, Recovered, recover_at_start, resume_job, retry_infra_failure, sweep

SILENT = timedelta(seconds=LIVENESS.stale_after_s + 30)  # older than the bound: the holder is gone


class FakeTime:
    """A clock that only ``sleep`` moves, recording each sleep."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class Senders:
    """Test double for the broker side of ``workers.faults.recovery``: records what would be sent."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.grades: list[str] = []

    def kw(self) -> dict:
        return {"send_run": self.runs.append, "send_grade": self.grades.append}


class SettingsBroker(RecordingBroker):
    """The recording broker with the app's settings, as ``workers.celery_tasks`` reads them."""

    def __init__(self, db_url: str) -> None:
        super().__init__()
        self.conf = SimpleNamespace(nexus_settings=ServiceSettings(db_url=db_url))


@pytest.fixture(name="reaped")
def reaped_fixture(monkeypatch) -> dict[str, list]:
    """Container removal recorded instead of done (each call removes "1" container)."""
    calls: dict[str, list] = {"episode": [], "finished": []}

    def episode(_db, episode_id: str) -> int:
        calls["episode"].append(episode_id)
        return 1

    def finished(_db) -> int:
        calls["finished"].append(True)
        return 0

    monkeypatch.setattr(rec, "reap_episode_containers", episode)
    monkeypatch.setattr(rec, "reap_lost_containers", finished)
    return calls


def _grade_claim(db, episode_id: str, worker: str = "g/1", *, ago: timedelta | None = None):
    with db.session() as s:
        now = utcnow() - ago if ago else None
        claim = claim_grade(s, episode_id, stale_after_s=LIVENESS.stale_after_s, worker=worker, now=now)
    assert claim is not None
    return claim


def _infra_failure(db, episode_id: str) -> None:
    claim = _claim(db, episode_id)
    with db.session() as s:
        assert finish_episode(s, claim, "infra_failure", error="the engine went away")


def _job_row(db, job_id: str) -> Job:
    with db.session() as s:
        job = job_rows.get_job(s, job_id)
        s.expunge(job)
        return job


def _down(message: str = "connection refused") -> OperationalError:
    return OperationalError("SELECT 1", {}, Exception(message))


# 8. database retries


def test_retrying_rides_out_transient_errors_with_a_doubling_backoff():
    t = FakeTime()
    outcomes = [_down(), _down(), "value"]

    def work():
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert retrying(work, budget_s=30, what="claim", sleep=t.sleep, clock=t.clock) == "value"
    assert t.slept == [0.5, 1.0] and outcomes == []


def test_retrying_gives_up_after_its_budget_chaining_the_last_error():
    t = FakeTime()
    raised: list[Exception] = []

    def down():
        raised.append(_down(f"refused #{len(raised)}"))
        raise raised[-1]

    with pytest.raises(DatabaseStillDown) as gave_up:
        retrying(down, budget_s=40, what="finish e1", sleep=t.sleep, clock=t.clock)
    assert t.slept == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]  # doubling, capped at 10 s, within the budget
    assert sum(t.slept) <= 40 and len(raised) == 8
    assert gave_up.value.__cause__ is raised[-1]
    message = str(gave_up.value)
    assert "finish e1" in message and "40 s" in message and "8 tries" in message and "OperationalError" in message


@pytest.mark.parametrize("error", [IntegrityError("INSERT", {}, Exception("unique")), ValueError("a bug")])
def test_retrying_raises_a_statement_error_or_a_bug_at_once(error):
    t = FakeTime()
    calls = []

    def work():
        calls.append(1)
        raise error

    with pytest.raises(type(error)):
        retrying(work, budget_s=30, what="w", sleep=t.sleep, clock=t.clock)
    assert calls == [1] and t.slept == []


def test_is_transient_means_the_connection_not_the_statement():
    assert is_transient(_down())
    assert is_transient(InterfaceError("SELECT 1", {}, Exception("closed")))
    assert is_transient(DBAPIError("SELECT 1", {}, Exception("reset"), connection_invalidated=True))
    assert not is_transient(DBAPIError("SELECT 1", {}, Exception("syntax")))
    assert not is_transient(IntegrityError("INSERT", {}, Exception("unique")))
    assert not is_transient(ValueError("x"))


# 9. the Docker gate


def test_the_gate_passes_at_once_when_docker_answers():
    t = FakeTime()
    wait_for_docker(300, what="episode e1", probe=lambda: None, sleep=t.sleep, clock=t.clock)
    assert t.slept == []


def test_the_gate_waits_while_docker_is_down_and_returns_when_it_answers():
    t = FakeTime()
    answers = ["engine restarting", "engine restarting", "engine restarting", None]
    wait_for_docker(300, what="episode e1", probe=lambda: answers.pop(0), sleep=t.sleep, clock=t.clock)
    assert t.slept == [1.0, 2.0, 4.0] and answers == []


def test_the_gate_gives_up_after_its_budget_with_the_reason():
    t = FakeTime()
    probes = []

    def probe():
        probes.append(1)
        return "the Docker engine at unix:///var/run/docker.sock does not answer: connection refused"

    with pytest.raises(DockerDown, match="grade of e1: .*connection refused") as gave_up:
        wait_for_docker(30, what="grade of e1", probe=probe, sleep=t.sleep, clock=t.clock)
    assert t.slept == [1.0, 2.0, 4.0, 8.0] and sum(t.slept) <= 30  # never sleeps past the budget
    assert len(probes) == 5 and "waited 15 s" in str(gave_up.value)


# 10. automatic infra retries


def test_an_infra_failure_is_retried_as_new_attempts_twice_in_a_row(sqlite_db):
    job_id, (ep,) = _job(sqlite_db, 1)
    sent: list[str] = []
    _infra_failure(sqlite_db, ep)
    assert _job_row(sqlite_db, job_id).status == "done"
    second = retry_infra_failure(sqlite_db, ep, retries=2, send_run=sent.append)
    assert second is not None and sent == [second]
    row = _row(sqlite_db, second)
    assert (row.status, row.attempt, row.driver, row.episode_key) == (
        "queued",
        2,
        "agent",
        _row(sqlite_db, ep).episode_key,
    )
    assert row.result == {"retry_of": ep, "retry": 1}
    assert _job_row(sqlite_db, job_id).status == "running"  # reopened until the retry finishes
    assert _row(sqlite_db, ep).status == "infra_failure"  # the failed attempt is kept

    _infra_failure(sqlite_db, second)
    third = retry_infra_failure(sqlite_db, second, retries=2, send_run=sent.append)
    assert third is not None and sent == [second, third]
    assert (_row(sqlite_db, third).attempt, _row(sqlite_db, third).result) == (3, {"retry_of": second, "retry": 2})

    _infra_failure(sqlite_db, third)
    assert retry_infra_failure(sqlite_db, third, retries=2, send_run=sent.append) is None  # 2 retries spent
    assert sent == [second, third]
    with sqlite_db.session() as s:
        assert len(st.episodes_for_job(s, job_id)) == 3
        assert job_rows.get_job(s, job_id).status == "done"


def test_no_infra_retry_when_retries_is_zero(sqlite_db):
    _, (ep,) = _job(sqlite_db, 1)
    _infra_failure(sqlite_db, ep)
    assert retry_infra_failure(sqlite_db, ep, retries=0, send_run=pytest.fail) is None


def test_the_infra_retry_count_restarts_after_an_attempt_that_did_not_fail_so(sqlite_db):
    _, (ep,) = _job(sqlite_db, 1)
    _infra_failure(sqlite_db, ep)
    second = retry_infra_failure(sqlite_db, ep, retries=1, send_run=lambda _e: None)
    _run_to(sqlite_db, second, grade="unresolved")
    with sqlite_db.session() as s:  # rerun --failed
        third = st.new_attempt(s, second).id
    _infra_failure(sqlite_db, third)
    fourth = retry_infra_failure(sqlite_db, third, retries=1, send_run=lambda _e: None)
    assert fourth is not None and _row(sqlite_db, fourth).result == {"retry_of": third, "retry": 1}
    _infra_failure(sqlite_db, fourth)
    assert retry_infra_failure(sqlite_db, fourth, retries=1, send_run=pytest.fail) is None


def test_no_infra_retry_for_a_verdict_an_interactive_attempt_an_older_attempt_or_a_cancelled_job(sqlite_db):
    job_id, (graded, interactive_source, older, cancelled) = _job(sqlite_db, 4)
    _run_to(sqlite_db, graded, grade="resolved")
    assert retry_infra_failure(sqlite_db, graded, retries=2, send_run=pytest.fail) is None

    _run_to(sqlite_db, interactive_source, grade="unresolved")
    with sqlite_db.session() as s:
        interactive = st.new_attempt(s, interactive_source, driver="interactive").id
    _infra_failure(sqlite_db, interactive)
    assert retry_infra_failure(sqlite_db, interactive, retries=2, send_run=pytest.fail) is None

    _infra_failure(sqlite_db, older)
    with sqlite_db.session() as s:  # a newer attempt exists already (a rerun by hand)
        st.new_attempt(s, older)
    assert retry_infra_failure(sqlite_db, older, retries=2, send_run=pytest.fail) is None

    _infra_failure(sqlite_db, cancelled)
    with sqlite_db.session() as s:
        job_rows.cancel_job(s, job_id)
    assert retry_infra_failure(sqlite_db, cancelled, retries=2, send_run=pytest.fail) is None
    with sqlite_db.session() as s:
        assert len(st.episodes_for_job(s, job_id)) == 6  # only the two made by hand above


# 11. the sweep and a worker's first sweep


def test_a_sweep_hands_back_and_sends_a_gone_run_and_a_gone_grade_once(sqlite_db, reaped):
    _, (stale_run, live_run, stale_grade, live_grade, queued, waiting) = _job(sqlite_db, 6)
    _claim(sqlite_db, stale_run, "hostA/1", ago=SILENT)
    _claim(sqlite_db, live_run, "hostA/2")
    for ep in (stale_grade, live_grade, waiting):
        _submitted(sqlite_db, ep)
    _grade_claim(sqlite_db, stale_grade, "g/1", ago=SILENT)
    _grade_claim(sqlite_db, live_grade, "g/2")
    sent = Senders()

    out = sweep(sqlite_db, LIVENESS, docker_up=False, **sent.kw())
    assert (out.runs, out.grades, out.sent_runs, out.sent_grades) == ([stale_run], [stale_grade], [], [])
    assert (sent.runs, sent.grades) == ([stale_run], [stale_grade])  # a sweep does not send unsent rows
    assert sorted(reaped["episode"]) == sorted([stale_run, stale_grade]) and out.containers == 2
    assert reaped["finished"] == []  # docker_up=False: no Docker call
    assert "1 run(s) taken over" in out.describe() and "1 grade(s) taken over" in out.describe()
    assert (_row(sqlite_db, stale_run).status, _row(sqlite_db, stale_run).claim_token) == ("queued", None)
    assert (_row(sqlite_db, stale_grade).status, _row(sqlite_db, stale_grade).claim_token) == ("submitted", None)
    assert _row(sqlite_db, live_run).status == "running" and _row(sqlite_db, live_grade).claim_token is not None

    again = sweep(sqlite_db, LIVENESS, docker_up=False, **sent.kw())
    assert not again and again.describe() == "nothing to recover"
    assert (sent.runs, sent.grades) == ([stale_run], [stale_grade])


def test_a_sweep_with_docker_up_removes_finished_episodes_containers(sqlite_db, reaped):
    assert not sweep(sqlite_db, LIVENESS, docker_up=True, **Senders().kw())
    assert reaped["finished"] == [True]


def test_a_sweep_leaves_a_cancelled_jobs_grade_claim_alone(sqlite_db, reaped):
    job_id, (ep,) = _job(sqlite_db, 1)
    _submitted(sqlite_db, ep)
    _grade_claim(sqlite_db, ep, ago=SILENT)
    with sqlite_db.session() as s:
        job_rows.cancel_job(s, job_id)
    sent = Senders()
    assert not sweep(sqlite_db, LIVENESS, docker_up=False, **sent.kw())
    assert (sent.runs, sent.grades, reaped["episode"]) == ([], [], [])


def test_the_first_sweep_resends_what_the_embedded_broker_may_have_lost(sqlite_db, reaped):
    job_id, (stale, queued, waiting, graded, never_sent) = _job(sqlite_db, 5)
    with sqlite_db.session() as s:
        st.assign_celery_task(s, queued, "sent-once")  # a message was sent; the broker may have lost it
    _claim(sqlite_db, stale, ago=SILENT)
    _submitted(sqlite_db, waiting)
    _run_to(sqlite_db, graded, grade="resolved")
    done_job, (done_ep,) = _job(sqlite_db, 1)
    _run_to(sqlite_db, done_ep, grade="resolved")
    cancelled_job, (_, cancelled_wait) = _job(sqlite_db, 2)
    _submitted(sqlite_db, cancelled_wait)
    with sqlite_db.session() as s:
        job_rows.cancel_job(s, cancelled_job)

    redis_like = Senders()
    out = recover_at_start(sqlite_db, LIVENESS, embedded=False, **redis_like.kw())
    assert (out.runs, out.sent_runs, out.sent_grades) == ([stale], [], [])
    assert (redis_like.runs, redis_like.grades) == ([stale], [])
    assert reaped["finished"] == [True]  # the first sweep also removes finished episodes' containers

    embedded = Senders()
    out = recover_at_start(sqlite_db, LIVENESS, embedded=True, **embedded.kw())
    # `stale` was never sent by a broker (claimed directly here); `never_sent` waits for `resume`
    assert out.sent_runs == embedded.runs == [queued]
    assert out.sent_grades == embedded.grades == [waiting]
    assert done_ep not in embedded.runs + embedded.grades and cancelled_wait not in embedded.grades


# 12. resume


def test_resume_sends_a_lost_jobs_queued_rows_clears_its_note_and_recomputes_its_status(sqlite_db, reaped):
    job_id, ids = _job(sqlite_db, 3)
    noted = note_unsent(sqlite_db, job_id, ids, ConnectionError("broker refused"))
    assert isinstance(noted, NotEnqueued) and f"nexus-eval resume {job_id}" in str(noted)
    with sqlite_db.session() as s:  # an older version marked a failed send as a failed job
        s.execute(update(Job).where(Job.id == job_id).values(status="failed"))
    assert _job_row(sqlite_db, job_id).error.startswith(UNSENT_NOTE)

    sent = Senders()
    out = resume_job(sqlite_db, job_id[:6], LIVENESS, **sent.kw())
    assert isinstance(out, Recovered) and sorted(out.sent_runs) == sorted(sent.runs) == sorted(ids)
    job = _job_row(sqlite_db, job_id)
    assert (job.status, job.error) == ("running", None)

    _claim(sqlite_db, ids[0])  # one of them started meanwhile
    again = resume_job(sqlite_db, job_id, LIVENESS, **sent.kw())
    assert sorted(again.sent_runs) == sorted(ids[1:])  # the running row is not sent again; the rest are
    assert [_row(sqlite_db, i).n_claims for i in ids] == [1, 0, 0]
    with pytest.raises(LookupError):
        resume_job(sqlite_db, "no-such-job", LIVENESS, **sent.kw())


def test_resume_of_a_failed_job_whose_episodes_all_finished_marks_it_done(sqlite_db, reaped):
    job_id, (a, b) = _job(sqlite_db, 2)
    _run_to(sqlite_db, a, grade="resolved")
    _run_to(sqlite_db, b, grade="unresolved")
    with sqlite_db.session() as s:
        s.execute(update(Job).where(Job.id == job_id).values(status="failed", error="not all episodes were sent: x"))
    sent = Senders()
    assert not resume_job(sqlite_db, job_id, LIVENESS, **sent.kw())
    assert (sent.runs, sent.grades) == ([], [])
    job = _job_row(sqlite_db, job_id)
    assert (job.status, job.error) == ("done", None)


def test_resume_hands_back_gone_holders_and_sends_unstarted_grades_but_keeps_other_notes(sqlite_db, reaped):
    job_id, (stale, waiting, stale_grade) = _job(sqlite_db, 3)
    _claim(sqlite_db, stale, ago=SILENT)
    for ep in (waiting, stale_grade):
        _submitted(sqlite_db, ep)
    _grade_claim(sqlite_db, stale_grade, ago=SILENT)
    with sqlite_db.session() as s:
        job_rows.note_job_error(s, job_id, "an operator's note")
    sent = Senders()
    out = resume_job(sqlite_db, job_id, LIVENESS, **sent.kw())
    assert (out.runs, out.grades) == ([stale], [stale_grade])
    # what was handed back is sent once: the unsent pass skips it although it is queued (awaiting a grade) again
    assert sent.runs == [stale] and sorted(sent.grades) == sorted([waiting, stale_grade])
    assert (out.sent_runs, out.sent_grades) == ([], [waiting])
    assert _row(sqlite_db, stale).status == "queued" and _row(sqlite_db, stale_grade).claim_token is None
    assert _job_row(sqlite_db, job_id).error == "an operator's note"


def test_celery_resume_sends_through_the_apps_broker_and_counts(sqlite_db, reaped, monkeypatch):
    monkeypatch.setitem(celery_tasks._DB, sqlite_db.url, sqlite_db)  # the process's database is the test's
    job_id, (queued, waiting, stale) = _job(sqlite_db, 3)
    _submitted(sqlite_db, waiting)
    _claim(sqlite_db, stale, ago=SILENT)
    broker = SettingsBroker(sqlite_db.url)
    counts = celery_tasks.resume(sqlite_db, job_id, app=broker)
    runs = [args[0] for name, args in broker.sent if name == EPISODE_TASK]
    grades = [args[0] for name, args in broker.sent if name == GRADE_TASK]
    assert sorted(runs) == sorted([stale, queued]) and grades == [waiting]  # each sent once
    assert (counts["taken_over"], counts["grades_taken_over"], counts["grades_sent"]) == (1, 0, 1)
    assert counts["sent"] == len(runs) - counts["taken_over"]  # every run message is counted once
    assert _row(sqlite_db, queued).celery_task_id == "celery-task-1"  # enqueue_episode remembered the task


def test_a_gone_interactive_rerun_ends_as_infra_failure_and_is_never_sent_to_a_worker(sqlite_db, reaped):
    job_id, (source,) = _job(sqlite_db, 1)
    _run_to(sqlite_db, source, grade="unresolved")
    with sqlite_db.session() as s:
        rerun_id = st.new_attempt(s, source, driver="interactive").id
    with sqlite_db.session() as s:
        assert unsent(s, [job_id]).runs == []  # queued, but only its operator runs it
    claim = _claim(sqlite_db, rerun_id, "operator/9")
    with sqlite_db.session() as s:
        st.record_turn(s, claim, 0, completion="kept")
        s.execute(update(Episode).where(Episode.id == rerun_id).values(heartbeat_at=utcnow() - SILENT))
    sent = Senders()
    out = sweep(sqlite_db, LIVENESS, docker_up=False, **sent.kw())
    assert (out.ended, out.runs, sent.runs) == ([rerun_id], [], [])
    row = _row(sqlite_db, rerun_id)
    assert (row.status, row.n_turns, row.driver) == ("infra_failure", 1, "interactive")
    assert "interactive rerun's process operator/9 is gone" in row.error
    assert retry_infra_failure(sqlite_db, rerun_id, retries=2, send_run=sent.runs.append) is None
    assert _job_row(sqlite_db, job_id).status == "done"


def test_enqueue_pending_sends_queued_rows_and_unstarted_grades(sqlite_db):
    job_id, (queued, running, waiting) = _job(sqlite_db, 3)
    _claim(sqlite_db, running)
    _submitted(sqlite_db, waiting)
    broker = RecordingBroker()
    assert enqueue_pending(sqlite_db, job_id, app=broker) == {"episodes": 1, "grades": 1}
    assert broker.sent == [(EPISODE_TASK, (queued,)), (GRADE_TASK, (waiting,))]


# 13. the settings


def test_the_liveness_settings_default_to_liveness():
    settings = ServiceSettings.from_env({})
    assert settings.liveness == LIVENESS
    assert (settings.heartbeat_s, settings.stale_after_s, settings.sweep_s, settings.db_retry_s) == (
        LIVENESS.heartbeat_s,
        LIVENESS.stale_after_s,
        LIVENESS.sweep_s,
        LIVENESS.db_retry_s,
    )
    assert (settings.docker_wait_s, settings.infra_retries) == (300.0, 2)
    assert ServiceSettings().liveness == LIVENESS


def test_the_liveness_settings_are_read_from_the_environment():
    env = {
        "NEXUS_EVAL_HEARTBEAT": "5",
        "NEXUS_EVAL_STALE_AFTER": "20",
        "NEXUS_EVAL_SWEEP": "20",
        "NEXUS_EVAL_DB_RETRY": "45.5",
        "NEXUS_EVAL_DOCKER_WAIT": "90",
        "NEXUS_EVAL_INFRA_RETRIES": "0",
    }
    settings = ServiceSettings.from_env(env)
    assert settings.liveness == Liveness(heartbeat_s=5.0, stale_after_s=20.0, sweep_s=20.0, db_retry_s=45.5)
    assert (settings.docker_wait_s, settings.infra_retries) == (90.0, 0)
    assert ServiceSettings.from_env(env, infra_retries=4).infra_retries == 4  # a flag over the variable


def test_a_stale_bound_under_four_heartbeats_is_rejected():
    with pytest.raises(ValueError, match=r"stale_after_s \(19\.0\) must be at least 4 heartbeats \(5\.0 s each\)"):
        ServiceSettings.from_env({"NEXUS_EVAL_HEARTBEAT": "5", "NEXUS_EVAL_STALE_AFTER": "19", "NEXUS_EVAL_SWEEP": "5"})
    with pytest.raises(ValueError, match="at least 4 heartbeats"):  # the default bound against a slow heartbeat
        ServiceSettings.from_env({"NEXUS_EVAL_HEARTBEAT": "40"})


def test_a_sweep_slower_than_the_stale_bound_is_rejected():
    with pytest.raises(ValueError, match=r"sweep_s \(151\.0\) must not exceed stale_after_s \(150\.0\)"):
        ServiceSettings.from_env({"NEXUS_EVAL_SWEEP": "151"})
    with pytest.raises(ValueError, match="must not exceed stale_after_s"):
        ServiceSettings(sweep_s=200)


@pytest.mark.parametrize("value", ["-1", "x", "1.5"])
def test_a_bad_infra_retries_value_is_rejected(value):
    with pytest.raises(ValueError):
        ServiceSettings.from_env({"NEXUS_EVAL_INFRA_RETRIES": value})


@pytest.mark.parametrize("var", ["NEXUS_EVAL_HEARTBEAT", "NEXUS_EVAL_STALE_AFTER", "NEXUS_EVAL_DOCKER_WAIT"])
def test_a_liveness_variable_that_is_not_a_number_is_rejected_by_name(var):
    with pytest.raises(ValueError, match=rf"\${var}='soon' is not a number of seconds"):
        ServiceSettings.from_env({var: "soon"})


@pytest.mark.parametrize("value", ["-1", "x"])
def test_a_bad_infra_retries_value_is_named_in_the_error(value):
    """An operator must be told which setting is wrong (as for the seconds variables and episodes_per_gpu)."""
    with pytest.raises(ValueError, match="INFRA_RETRIES|infra_retries"):
        ServiceSettings.from_env({"NEXUS_EVAL_INFRA_RETRIES": value})
