"""``rerun EPISODE --interactive`` driven through a real pseudo-terminal (pexpect): replay turn 0 from the
stored trajectory, edit the action of turn 1, continue turn 2, finish; the new attempt is in the database."""

from __future__ import annotations

import os
import sys

import pytest

from db import connect, sqlite_url
from db import store as db_store
from jobs.spec import JobSpec
from jobs.submit import create_job_rows, load_job_tasks, plan_job
from tests.conftest import docker_status, require
from tests.support.worker_fixtures import ROOT, oracle_job
from workers.execution import execute_episode
from workers.grade_stored import grade_stored_episode
from workers.interactive import parse_edit

EDITED = (
    "base64 -d /tmp/gold.patch.b64 > /tmp/gold.patch && cd /testbed && "
    "git apply /tmp/gold.patch && echo EDITED_BY_OPERATOR"
)


def test_parse_edit_takes_a_bash_command_or_a_function_call():
    assert parse_edit("ls -la", "t").call.model_dump() == {"name": "execute_bash", "arguments": {"cmd": "ls -la"}}
    call = parse_edit(
        "<function=file_editor><parameter=command>view</parameter><parameter=path>/testbed</parameter></function>", "t"
    ).call
    assert (call.name, call.arguments) == ("file_editor", {"command": "view", "path": "/testbed"})


def test_forced_prefix_steps_a_backend_without_forcing_and_keeps_the_stored_text():
    from agent_runner.backends.forced_prefix import ForcedPrefix
    from agent_runner.backends.scripted import ScriptedModel

    live = ScriptedModel(["live-0", "live-1", "live-2"])
    prefix = ForcedPrefix(["stored-0"], live)
    prefix.reset(seed=0)
    assert not prefix.teacher_forces
    first = prefix.complete([])
    assert (first.text, first.forced) == ("stored-0", True)
    assert prefix.complete([]).text == "live-1"  # the script advanced past the forced turn


def _graded_oracle_source(tmp_path):
    """A resolved oracle episode to rerun, in a fresh SQLite database, and the environment a terminal runs the CLI
    in: (db, job id, source episode id, env)."""
    url = sqlite_url(tmp_path / "nexus-eval.db")
    db = connect(url)
    spec = JobSpec.from_dict(oracle_job(["humanfmt__humanfmt-1"], ["nexus"], ["true_eviction"]))
    job_id, (source_id,) = create_job_rows(db, plan_job(spec, load_job_tasks(spec)))
    assert execute_episode(db, source_id).needs_grade
    assert grade_stored_episode(db, source_id) == "resolved"
    env = {**os.environ, "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "200", "NEXUS_EVAL_DB": url}
    return db, job_id, source_id, env


@pytest.mark.docker
@pytest.mark.slow
def test_interactive_rerun_edit_continue_finish_in_a_real_terminal(tmp_path):
    require(*docker_status())
    import pexpect

    db, job_id, source_id, env = _graded_oracle_source(tmp_path)

    def rerun_in_a_terminal(episode_id: str, from_turn: int, log_name: str):
        child = pexpect.spawn(
            sys.executable,
            ["-m", "nexus_eval.cli", "rerun", episode_id, "--interactive", "--from-turn", str(from_turn)],
            cwd=str(ROOT),
            env=env,
            encoding="utf-8",
            timeout=120,
            dimensions=(50, 200),
        )
        child.logfile_read = open(tmp_path / log_name, "w")  # noqa: SIM115
        return child

    child = rerun_in_a_terminal(source_id, 1, "terminal.log")
    child.expect_exact("--- turn 0 (forced from the stored attempt) ---")
    child.expect_exact("--- turn 1 ---")
    child.expect_exact("action: execute_bash")
    child.expect_exact("[c]ontinue")
    child.sendline("e")
    child.expect_exact("new action")
    child.sendline(EDITED)
    child.expect_exact("EDITED_BY_OPERATOR")  # the edited command's own output, streamed as the observation
    child.expect_exact("--- turn 2 ---")
    child.expect_exact("action: finish")
    child.expect_exact("[c]ontinue")
    child.sendline("c")
    child.expect(r"RESULT (\w+) (\w+)")
    new_id, verdict = child.match.group(1), child.match.group(2)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert verdict == "resolved"

    with db.session() as s:
        rows = db_store.episodes_for_job(s, job_id)
        assert [(r.id, r.attempt) for r in rows] == [(source_id, 1), (new_id, 2)]  # a new row, the old one kept
        new = rows[1]
        assert new.status == "resolved" and rows[0].status == "resolved"
        turns = new.turns
        assert [t.index for t in turns] == [0, 1, 2]
        assert turns[0].extra.get("forced") is True
        assert turns[1].extra["intervened"] is True and "EDITED_BY_OPERATOR" in turns[1].action["arguments"]["cmd"]
        assert "EDITED_BY_OPERATOR" in turns[1].observation
        assert turns[2].action["name"] == "finish" and not turns[2].extra["intervened"]
        assert (rows[0].driver, new.driver) == ("agent", "steered")  # the operator's attempt is kept apart
        assert [r.id for r in db_store.result_attempts(s, [job_id])] == [source_id]

    # a rerun of the steered attempt past its edited turn runs the operator's stored action again
    child = rerun_in_a_terminal(new_id, 2, "terminal2.log")
    child.expect_exact("--- turn 1 (forced from the stored attempt repeating its operator's edit) ---")
    child.expect_exact("EDITED_BY_OPERATOR")
    child.expect_exact("--- turn 2 ---")
    child.expect_exact("[c]ontinue")
    child.sendline("c")
    child.expect(r"RESULT (\w+) (\w+)")
    third_id = child.match.group(1)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    with db.session() as s:
        third = db_store.get_episode(s, third_id)
        assert (third.attempt, third.driver) == (3, "steered")
        assert "EDITED_BY_OPERATOR" in third.turns[1].observation and third.turns[1].extra["intervened"] is True


@pytest.mark.docker
@pytest.mark.slow
def test_interactive_shell_and_skip_are_on_the_record_in_a_real_terminal(tmp_path):
    """Issue 44: ``h`` then ``c`` at turn 0, ``h`` (the fix applied in the shell) then ``s`` at turn 1, ``c`` at the
    finish. Before: the attempt was stored ``interactive`` with no trace of either shell, and the skip ran an echo
    in the container shown as "observation (edited)". Now: ``steered``, each shell's transcript (the commands and
    their output) on its turn, and the skipped action never ran."""
    require(*docker_status())
    import pexpect

    from agent_runner.records import SKIPPED_OBSERVATION
    from tests.cli.test_cli import read_cli

    db, _, source_id, env = _graded_oracle_source(tmp_path)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "nexus_eval.cli", "rerun", source_id, "--interactive"],
        cwd=str(ROOT),
        env=env,
        encoding="utf-8",
        timeout=120,
        dimensions=(50, 200),
    )
    child.logfile_read = open(tmp_path / "terminal.log", "w")  # noqa: SIM115
    child.expect_exact("--- turn 0 ---")
    child.expect_exact("[c]ontinue")
    child.sendline("h")
    child.expect_exact("the session is recorded")
    child.sendline("echo SHELL_LOOKED_$((6*7)) && ls /testbed | head -3")
    child.expect_exact("SHELL_LOOKED_42")  # computed: the echoed command line does not match it
    child.sendline("exit")
    child.expect_exact("shell session recorded")
    child.expect_exact("[c]ontinue")
    child.sendline("c")
    child.expect_exact("--- turn 1 ---")
    child.expect_exact("[c]ontinue")
    child.sendline("h")
    child.expect_exact("the session is recorded")
    child.sendline(f"{EDITED.replace('EDITED_BY_OPERATOR', 'SHELL_FIXED_$((6*7))')}")
    child.expect_exact("SHELL_FIXED_42")
    child.sendline("exit")
    child.expect_exact("shell session recorded")
    child.expect_exact("[c]ontinue")
    child.sendline("s")
    child.expect_exact("observation (the operator skipped the action: nothing ran)")
    child.expect_exact("--- turn 2 ---")
    child.expect_exact("action: finish")
    child.expect_exact("[c]ontinue")
    child.sendline("c")
    child.expect(r"RESULT (\w+) (\w+)")
    new_id, verdict = child.match.group(1), child.match.group(2)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert verdict == "resolved"  # the fix the operator applied in the shell

    with db.session() as s:
        new = db_store.get_episode(s, new_id)
        assert new.driver == "steered"
        turns = new.turns
        looked = turns[0].extra["operator"]
        assert looked["choice"] == "continue" and not turns[0].extra["intervened"]
        (session,) = looked["shells"]
        assert "echo SHELL_LOOKED_$((6*7))" in session["transcript"] and "SHELL_LOOKED_42" in session["transcript"]
        assert "\x1b" not in session["transcript"] and session["exit_code"] == 0
        fixed = turns[1].extra["operator"]
        assert fixed["choice"] == "skip" and "SHELL_FIXED_42" in fixed["shells"][0]["transcript"]
        assert fixed["proposed"] == turns[1].action  # the model's own action, kept and not run
        assert turns[1].observation == SKIPPED_OBSERVATION and turns[1].env_s == 0.0
        assert "SHELL_FIXED_42" not in (turns[1].observation or "")
    shown = read_cli("inspect", new_id, db=db)
    assert "SHELL_LOOKED_42" in shown and "SHELL_FIXED_42" in shown and "[skipped]" in shown
