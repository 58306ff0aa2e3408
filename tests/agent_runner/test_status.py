"""The one status rule (``agent_runner.status.status_of``) and the stored words: every status it can return is an
``EpisodeStatus`` value, and each layer's case gives the status it gave before the rule was one function."""

from __future__ import annotations

import pytest
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded

from agent_runner import status as st
from db.models import AGENT_EXIT_STATUSES, RUN_FAILURE_STATUSES, EpisodeStatus
from workers.execution import SoftTimeout

EXITS = [st.Submitted, st.StepLimit, st.ContextLimit, st.TimeLimit, st.FormatErrorLimit, st.InfraFailure]


def _every_answer() -> set[str]:
    """What status_of answers over every kind of input the layers give it."""
    interruptions = [None, RuntimeError("a bug"), SoftTimeout("deadline"), SoftTimeLimitExceeded(), TimeLimitExceeded()]
    interruptions += [cls("why") for cls in EXITS]
    limits = [(), (SoftTimeout, SoftTimeLimitExceeded), (TimeLimitExceeded,)]
    exits = [None, *sorted(st.AGENT_EXITS), st.INFRA_FAILURE]
    return {
        st.status_of(exit_status, interrupted, time_limits=time_limits)
        for exit_status in exits
        for interrupted in interruptions
        for time_limits in limits
    }


def test_every_status_the_rule_can_return_is_a_stored_episode_status():
    assert _every_answer() == st.STATUSES
    assert st.STATUSES.issubset(s.value for s in EpisodeStatus)
    assert st.AGENT_EXITS == AGENT_EXIT_STATUSES and {st.INFRA_FAILURE, st.TIMEOUT} == RUN_FAILURE_STATUSES
    assert {cls.exit_status for cls in EXITS} == st.AGENT_EXITS | {st.INFRA_FAILURE}


def test_the_status_words_are_defined_once_and_stored_as_they_are():
    """Every word is a member of ``agent_runner.status.EpisodeStatus``, the one definition (issue 45); the schema's
    enum is that very class, and no module of ours spells a status word as a string literal in its sets."""
    assert EpisodeStatus is st.EpisodeStatus
    words = {name: value for name, value in vars(st).items() if name.isupper() and isinstance(value, str)}
    assert words == {name: st.EpisodeStatus[name.lower()].value for name in words}
    assert set(words.values()) == st.STATUSES


@pytest.mark.parametrize(
    ("exit_status", "interrupted", "time_limits", "expected"),
    [
        # the agent loop: the AgentExit that ended it, or anything unexpected
        (None, st.Submitted("submitted at step 3"), (), "submitted"),
        (None, st.FormatErrorLimit("3 turns without a call"), (), "format_error_limit"),
        (None, st.InfraFailure("model: down"), (), "infra_failure"),
        (None, RuntimeError("on_turn failed"), (), "infra_failure"),
        (None, SoftTimeLimitExceeded(), (), "infra_failure"),  # the loop knows no time limits: the worker does
        # the runner: the sandbox did not open, the diff could not be taken (whatever the agent's exit)
        (None, OSError("no docker"), (), "infra_failure"),
        # the worker: the exit stands unless one of its time limits interrupted the run
        ("step_limit", None, (SoftTimeout,), "step_limit"),
        ("submitted", RuntimeError("closing failed"), (SoftTimeout,), "submitted"),
        ("infra_failure", SoftTimeLimitExceeded(), (SoftTimeout, SoftTimeLimitExceeded), "timeout"),
        ("step_limit", SoftTimeout("deadline"), (SoftTimeout,), "timeout"),
        (None, SoftTimeLimitExceeded(), (SoftTimeout,), "infra_failure"),  # not declared: a crash
        (None, ValueError("bad config"), (SoftTimeout,), "infra_failure"),
        # Celery's failure handler: the hard limit is a timeout, anything else an infra failure
        (None, TimeLimitExceeded(), (TimeLimitExceeded,), "timeout"),
        (None, RuntimeError("worker lost"), (TimeLimitExceeded,), "infra_failure"),
        (None, None, (), "infra_failure"),
    ],
)
def test_each_layers_case(exit_status, interrupted, time_limits, expected):
    assert st.status_of(exit_status, interrupted, time_limits=time_limits) == expected


@pytest.mark.parametrize(
    ("error", "expected"),
    [(TimeLimitExceeded(600), "timeout"), (MemoryError("killed"), "infra_failure")],
)
def test_celerys_failure_handler_records_the_rules_status(tmp_path, error, expected):
    """``EpisodeTask.on_failure`` (the hard time limit killed the task, or its body raised) fails the running row
    with the status the rule gives, and names the exception and the task."""
    from db import connect, sqlite_url
    from db import store as db_store
    from jobs.queue import EPISODE_TASK, make_app
    from jobs.settings import ServiceSettings
    from jobs.spec import JobSpec
    from jobs.submit import create_job_rows, load_job_tasks, plan_job
    from tests.support.worker_fixtures import oracle_job
    from workers import celery_tasks  # noqa: F401 - registers the episode task on the app

    url = sqlite_url(tmp_path / "nexus-eval.db")
    app = make_app(ServiceSettings(db_url=url, infra_retries=0))
    db = connect(url)
    spec = JobSpec.from_dict(oracle_job(["humanfmt__humanfmt-1"], ["dense"], ["true_eviction"]))
    _, (episode_id,) = create_job_rows(db, plan_job(spec, load_job_tasks(spec)))
    with db.session() as s:
        assert db_store.claim_episode(s, episode_id) is not None  # running, as when the worker died
    app.tasks[EPISODE_TASK].on_failure(error, "task-1", (episode_id,), {}, None)
    with db.session() as s:
        row = db_store.get_episode(s, episode_id)
        assert row.status == expected and row.error == f"{type(error).__name__}: {error} (task task-1)"
