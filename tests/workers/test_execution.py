"""execute_episode without Docker: time limits are recognised by exception type, and the turns are kept.

The model and the sandbox are test doubles (the model's choices and the container are not what is tested
here); the claim, the stored turns and the final row are the real database code on a SQLite file.
"""

from __future__ import annotations

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from agent_runner.backends.scripted import ScriptedModel
from db import store as db_store
from jobs.spec import JobSpec
from jobs.submit import create_job_rows, load_job_tasks, plan_job
from tests.agent_runner.conftest import RecordingEnvironment
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixture)
from tests.support.worker_fixtures import oracle_job
from workers.execution import EpisodeHooks, SoftTimeout, execute_episode

LS = "<function=execute_bash>\n<parameter=cmd>ls</parameter>\n</function>"


class RaisesOnSecondCall(ScriptedModel):
    """Test double: one scripted turn, then ``error`` is raised from inside the model call (as Celery raises
    its soft time limit wherever the worker happens to be, usually in decode)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__([LS])
        self.error = error

    def complete(self, messages, *, max_new_tokens=None):
        if self._next >= 1:
            raise self.error
        return super().complete(messages, max_new_tokens=max_new_tokens)


def _run(db, error: BaseException, time_limits: tuple[type[BaseException], ...]):
    spec = JobSpec.from_dict(oracle_job(["humanfmt__humanfmt-1"], ["dense"], ["true_eviction"]))
    _, (episode_id,) = create_job_rows(db, plan_job(spec, load_job_tasks(spec)))
    hooks = EpisodeHooks(
        wrap_model=lambda model: RaisesOnSecondCall(error),
        open_environment=lambda task, **kw: RecordingEnvironment(),
        time_limits=time_limits,
    )
    outcome = execute_episode(db, episode_id, hooks=hooks)
    with db.session() as s:
        row = db_store.get_episode(s, episode_id)
        return outcome, row.status, row.error or "", len(row.turns)


@pytest.mark.parametrize("error", [SoftTimeLimitExceeded(), SoftTimeout("our own deadline")])
def test_a_declared_time_limit_raised_in_the_model_is_a_timeout_with_the_turns_kept(sqlite_db, error):
    outcome, status, message, turns = _run(sqlite_db, error, (SoftTimeLimitExceeded,))
    assert outcome.written and outcome.status == status == "timeout"
    assert message.startswith("soft time limit reached; partial trajectory kept")
    assert turns == 1


def test_a_crash_is_an_infra_failure_even_when_its_text_mentions_a_time_limit(sqlite_db):
    outcome, status, message, turns = _run(sqlite_db, RuntimeError("SoftTimeLimitExceeded in the log"), ())
    assert status == "infra_failure" and "SoftTimeLimitExceeded in the log" in message
    assert turns == 1


def test_an_undeclared_exception_type_is_not_a_time_limit(sqlite_db):
    _, status, _, _ = _run(sqlite_db, SoftTimeLimitExceeded(), ())
    assert status == "infra_failure"
