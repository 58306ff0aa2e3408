"""The operator's hand is on the record (issue 44, item 2): every act of an interactive rerun (a shell session with
its transcript, an edit with the model's own action, a skip, a stop, a forced turn) is stored with its turn, makes
the attempt ``steered`` when it changed anything, and is shown by ``inspect`` and on the dashboard's episode page.

Turns are written the way ``workers.execution.execute_episode`` writes them (``record_turn(steered=turn.steered,
**turn_row(turn))``) on SQLite; the terminal itself is test_interactive.py's (pexpect, Docker)."""

from __future__ import annotations

import pytest

from agent_runner.records import SKIPPED_OBSERVATION, Completion, OperatorAct, ShellSession, TurnRecord
from db import connect, sqlite_url
from db import store as db_store
from env.sandbox.tools import ToolCall
from jobs.spec import JobSpec
from jobs.submit import create_job_rows, load_job_tasks, plan_job
from tests.cli.test_cli import PATCH, read_cli
from tests.support.worker_fixtures import oracle_job
from workers.stored_records import turn_row

TRANSCRIPT = "root@c0ffee:/testbed# git apply /tmp/fix.patch && echo APPLIED\nAPPLIED\nroot@c0ffee:/testbed# exit\n"
LS = ToolCall(name="execute_bash", arguments={"cmd": "ls"})
PWD = ToolCall(name="execute_bash", arguments={"cmd": "pwd"})
FINISH = ToolCall(name="finish", arguments={"command": "submit"})


def _turn(index, action, *, forced=False, intervened=False, operator=None, observation="out") -> TurnRecord:
    return TurnRecord(
        index=index,
        completion=Completion(text=f"<think>turn {index}</think>", forced=forced),
        thought=f"turn {index}",
        action=action,
        intervened=intervened,
        operator=operator,
        observation=observation,
    )


def _attempt(db, source_id, turns) -> str:
    """A new interactive attempt of ``source_id`` with ``turns``, stored as the worker stores them; graded."""
    with db.session() as s:
        new_id = db_store.new_attempt(s, source_id, driver="interactive").id
    with db.session() as s:
        claim = db_store.claim_episode(s, new_id)
    for turn in turns:
        with db.session() as s:
            db_store.record_turn(s, claim, turn.index, steered=turn.steered, **turn_row(turn))
    with db.session() as s:
        db_store.finish_episode(s, claim, "submitted", patch=PATCH)
    with db.session() as s:
        db_store.record_grade(s, new_id, "resolved", test_log="log", grader="test")
    return new_id


@pytest.fixture
def job(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # inspect's table whole, its action names unclipped
    db = connect(sqlite_url(tmp_path / "nexus-eval.db"))
    spec = JobSpec.from_dict(oracle_job(["humanfmt__humanfmt-1"], ["nexus"], ["true_eviction"]))
    _, (source_id,) = create_job_rows(db, plan_job(spec, load_job_tasks(spec)))
    with db.session() as s:
        claim = db_store.claim_episode(s, source_id)
    with db.session() as s:
        db_store.record_turn(s, claim, 0, **turn_row(_turn(0, FINISH)))
    with db.session() as s:
        db_store.finish_episode(s, claim, "submitted", patch=PATCH)
    with db.session() as s:
        db_store.record_grade(s, source_id, "unresolved", test_log="log", grader="test")
    return db, source_id


def _driver(db, episode_id) -> str:
    with db.session() as s:
        return db_store.get_episode(s, episode_id).driver


def test_a_shell_then_continue_is_steered_and_its_transcript_is_shown(job):
    """The user's report: ``h``, fix it in the shell, ``c``. Before: driver ``interactive`` and no trace of the
    shell anywhere."""
    db, source_id = job
    shell = ShellSession(transcript=TRANSCRIPT, seconds=12.0, exit_code=0)
    new_id = _attempt(
        db, source_id, [_turn(0, LS, operator=OperatorAct(choice="continue", shells=[shell])), _turn(1, FINISH)]
    )
    assert _driver(db, new_id) == "steered"
    shown = read_cli("inspect", new_id, db=db)
    assert "execute_bash [shell]" in shown and "the operator opened a shell in the container" in shown
    assert "operator shell session 1" in shown and "git apply /tmp/fix.patch && echo APPLIED" in shown
    assert "an operator replaced the action" not in shown  # no turn's action was replaced
    full = read_cli("inspect", new_id, "--full", db=db)
    assert "git apply /tmp/fix.patch && echo APPLIED\nAPPLIED" in full


def test_a_plain_interactive_rerun_stays_interactive(job):
    db, source_id = job
    new_id = _attempt(db, source_id, [_turn(0, LS), _turn(1, FINISH)])
    assert _driver(db, new_id) == "interactive"


def test_the_replaced_legend_only_where_an_action_was_replaced(job):
    """Before: every ``inspect`` printed "* an operator replaced the action", an agent's episode too."""
    db, source_id = job
    shown = read_cli("inspect", source_id, db=db)
    assert "operator replaced" not in shown and "[forced]" not in shown and "[skipped]" not in shown
    edited = _attempt(db, source_id, [_turn(0, PWD, intervened=True, operator=OperatorAct(choice="edit", proposed=LS))])
    shown = read_cli("inspect", edited, db=db)
    assert "* an operator replaced the action" in shown and "pwd" not in shown.split("operator")[0]
    assert "operator edited the action; the model proposed" in shown and '"cmd": "ls"' in shown


def test_skip_forced_and_stop_are_shown_by_inspect_full(job):
    """Before: a skip showed as "observation (edited)" of an echo command; ``forced`` was in the row's extra only."""
    db, source_id = job
    skip = OperatorAct(choice="skip", proposed=LS)
    stop = OperatorAct(choice="stop", proposed=PWD)
    turns = [
        _turn(0, LS, forced=True),
        _turn(1, LS, intervened=True, operator=skip, observation=SKIPPED_OBSERVATION),
        _turn(2, FINISH, intervened=True, operator=stop),
    ]
    new_id = _attempt(db, source_id, turns)
    assert _driver(db, new_id) == "steered"
    shown = read_cli("inspect", new_id, db=db)
    assert "execute_bash [forced]" in shown and "execute_bash [skipped]" in shown and "finish *" in shown
    assert "forced from the stored attempt (rerun --from-turn)" in shown
    full = read_cli("inspect", new_id, "--full", db=db)
    assert "turn 0 (forced from the stored attempt)" in full
    assert "operator skipped the action: nothing ran; the model proposed" in full
    assert "observation (the operator skipped the action: nothing ran)" in full
    assert "operator stopped the run (submitted); the model proposed" in full and '"cmd": "pwd"' in full
    assert "raw completion (replaced by the operator)" in full.split("turn 2 ─")[-1]
    assert "raw completion" not in full.split("turn 2 ─")[0]  # a skip did not replace the model's action


def test_the_episode_page_shows_every_operator_act(job):
    from fastapi.testclient import TestClient

    from dashboard.app import create_app
    from tests.dashboard.test_app_unit import TOKEN, FakeCelery

    db, source_id = job
    shell = ShellSession(transcript=TRANSCRIPT + "<script>alert(1)</script>", seconds=4.0, exit_code=0, cut=7)
    turns = [
        _turn(0, LS, forced=True),
        _turn(1, LS, operator=OperatorAct(choice="continue", shells=[shell])),
        _turn(2, LS, intervened=True, operator=OperatorAct(choice="skip", proposed=LS), observation="skipped"),
        _turn(3, PWD, intervened=True, operator=OperatorAct(choice="edit", proposed=LS)),
    ]
    new_id = _attempt(db, source_id, turns)
    app = create_app(db.url, token=TOKEN, public=False, allowed_hosts=["testserver"], celery_app=FakeCelery)
    page = TestClient(app).get(f"/episodes/{new_id}").text
    assert page.count('<span class="badge forced">forced</span>') == 1
    assert '<section class="operator" data-turn="1" data-choice="continue" data-shells="1">' in page
    assert "git apply /tmp/fix.patch &amp;&amp; echo APPLIED" in page and "&lt;script&gt;alert(1)" in page
    assert "7 characters left out of its middle" in page
    assert 'data-turn="2" data-choice="skip"' in page and "(the operator skipped the action: nothing ran)" in page
    assert 'data-turn="3" data-choice="edit"' in page and "the model proposed" in page
    assert "operator: skip" in page and "operator: continue + shell" in page
    app.state.ctx.dispose()


def test_a_rerun_forcing_a_source_shell_session_is_steered_from_its_start(job):
    """A shell session cannot be repeated, but the forced completions after it were written against what it
    changed: the rerun is steered before its first live turn (before: ``interactive`` when the operator only
    continued)."""
    from db.job_status import recount
    from db.models import Job
    from workers.interactive import start_rerun

    db, source_id = job
    shell = ShellSession(transcript=TRANSCRIPT, seconds=3.0, exit_code=0)
    shelled = _attempt(db, source_id, [_turn(0, LS, operator=OperatorAct(choice="continue", shells=[shell])),
                                       _turn(1, FINISH)])  # fmt: skip
    with db.session() as s:
        past_it = start_rerun(s, shelled, from_turn=1)
        before_it = start_rerun(s, source_id, from_turn=1)
        job_id = db_store.get_episode(s, shelled).job_id
    assert past_it.unrepeated_shells == [0] and _driver(db, past_it.new_id) == "steered"
    assert before_it.unrepeated_shells == [] and _driver(db, before_it.new_id) == "interactive"
    with db.session() as s:
        assert s.get(Job, job_id).counts == recount(s, job_id)
        assert s.get(Job, job_id).counts["steered"] == {"queued": 1, "resolved": 1}
