"""An operator's acts in the agent loop (issue 44): a skip runs nothing, every act is kept with its turn, and an
attempt is steered by anything that changed what the agent saw or what the container holds (a shell included)."""

from __future__ import annotations

import io

from agent_runner.backends.scripted import ScriptedModel
from agent_runner.records import SKIPPED_OBSERVATION, Intervention, OperatorAct, ShellSession
from env.sandbox.tools import ToolCall

from .conftest import run_loop

LS = "<think>look around</think>\n<function=execute_bash>\n<parameter=cmd>ls</parameter>\n</function>"
RM = "<think>clean up</think>\n<function=execute_bash>\n<parameter=cmd>rm -rf /testbed</parameter>\n</function>"
FINISH = "<think>done</think>\n<function=finish>\n<parameter=command>submit</parameter>\n</function>"


def test_a_skipped_action_runs_nothing_and_the_model_is_told(task, environment):
    """Before: skip ran ``echo '[the operator skipped this action]'`` in the container as an edited action."""

    def intervene(index, parsed, raw):
        return Intervention(act=OperatorAct(choice="skip", proposed=parsed.call)) if index == 0 else None

    result = run_loop(ScriptedModel([RM, FINISH]), environment, task, intervene=intervene)
    assert [c.name for c in environment.calls] == ["finish"]  # the rm never reached the environment
    skipped = result.turns[0]
    assert skipped.observation == SKIPPED_OBSERVATION and skipped.env_s == 0.0
    assert skipped.action.arguments == {"cmd": "rm -rf /testbed"}  # the model's own action, kept (not run)
    assert skipped.operator.choice == "skip" and skipped.operator.proposed == skipped.action
    assert skipped.intervened and skipped.steered
    assert result.messages[2].content == RM  # the model's own text stays in its history
    assert SKIPPED_OBSERVATION in result.messages[3].content
    assert not result.turns[1].steered and result.turns[1].operator is None


def test_a_shell_before_continue_keeps_the_models_action_and_steers(task, environment):
    """Before: a shell session left no trace and the attempt stayed ``interactive``."""
    shell = ShellSession(transcript="$ git apply fix.patch\n$ exit\n", seconds=3.0, exit_code=0)

    def intervene(index, parsed, raw):
        return Intervention(act=OperatorAct(choice="continue", shells=[shell])) if index == 0 else None

    result = run_loop(ScriptedModel([LS, FINISH]), environment, task, intervene=intervene)
    assert [c.name for c in environment.calls] == ["execute_bash", "finish"]
    first = result.turns[0]
    assert not first.intervened and first.operator.shells == [shell] and first.steered
    assert result.messages[2].content == LS


def test_a_plain_continue_is_not_a_steer(task, environment):
    result = run_loop(ScriptedModel([LS, FINISH]), environment, task, intervene=lambda index, parsed, raw: None)
    assert not any(t.steered or t.operator for t in result.turns)
    assert not OperatorAct().steers and OperatorAct(shells=[ShellSession(transcript="")]).steers


def test_an_edit_stores_the_models_proposed_action(task, environment):
    from agent_runner.parsing import ParsedAction

    replacement = ParsedAction(thought="op", call=ToolCall(name="execute_bash", arguments={"cmd": "pwd"}))

    def intervene(index, parsed, raw):
        if index:
            return None
        return Intervention(act=OperatorAct(choice="edit", proposed=parsed.call), action=replacement)

    result = run_loop(ScriptedModel([LS, FINISH]), environment, task, intervene=intervene)
    first = result.turns[0]
    assert environment.calls[0].arguments == {"cmd": "pwd"} and first.action == replacement.call
    assert first.operator.proposed.arguments == {"cmd": "ls"} and first.intervened and first.steered


class _Console:
    """What the operator's console printed, as text."""

    def __init__(self) -> None:
        self.out = io.StringIO()

    def print(self, text, style=None, markup=False):
        self.out.write(f"{text}\n")


def _operator(answers, **kwargs):
    from workers.interactive import Operator

    answers = iter(answers)
    console = _Console()
    return Operator(ask=lambda prompt: next(answers), console=console, **kwargs), console


def test_the_live_prompt_shows_the_raw_completion_when_no_call_parses():
    """Before: "thought: (none) / action: (no function call)" and nothing of what the model wrote."""
    from agent_runner.parsing import parse_response

    raw = "I will run <function=execute_bash><parameter=cmd>ls" + "x" * 10_000
    operator, console = _operator(["c"])
    assert operator.intervene(0, parse_response(raw), raw) is None
    shown = console.out.getvalue()
    assert "raw completion (truncated function call" in shown and "I will run <function=execute_bash>" in shown
    assert "characters left out" in shown and len(shown) < 6_000  # bounded


def test_the_operators_skip_and_stop_are_acts_not_commands():
    from agent_runner.parsing import parse_response

    operator, console = _operator(["s"])
    skip = operator.intervene(0, parse_response(LS), LS)
    assert skip.action is None and skip.act.choice == "skip" and skip.act.proposed.arguments == {"cmd": "ls"}
    operator, _ = _operator(["q"])
    stop = operator.intervene(0, parse_response(LS), LS)
    assert stop.act.choice == "stop" and stop.action.call.name == "finish"


def test_a_forced_turn_repeats_the_stored_act():
    from workers.interactive import replayed_act

    edit = OperatorAct(choice="edit", proposed=ToolCall(name="execute_bash", arguments={"cmd": "ls"}))
    action = {"name": "execute_bash", "arguments": {"cmd": "pwd"}}
    again = replayed_act(thought="t", action=action, intervened=True, operator=edit)
    assert again.act.forced and again.act.choice == "edit" and again.action.call.arguments == {"cmd": "pwd"}
    skip = replayed_act(thought="t", action=action, intervened=True, operator=OperatorAct(choice="skip"))
    assert skip.action is None and skip.act.choice == "skip" and skip.act.forced
    legacy = replayed_act(thought="t", action=action, intervened=True, operator=None)  # a row from before
    assert legacy.act.choice == "edit" and legacy.action.call.arguments == {"cmd": "pwd"}
    shell_only = OperatorAct(shells=[ShellSession(transcript="x")])
    assert replayed_act(thought="t", action=action, intervened=False, operator=shell_only) is None
    assert replayed_act(thought="t", action=action, intervened=False, operator=None) is None


def test_a_transcript_is_cleaned_and_bounded():
    from workers.interactive import bounded, clean_transcript

    raw = (
        b'Script started on 2026-01-01 [COMMAND="docker exec -it abc bash"]\n'
        b"\x1b[?2004hroot@abc:/testbed# lsx\x08 \x08\r\n\x1b[?2004l\rREADME.md\r\n"
        b'root@abc:/testbed# exit\r\nexit\r\n\nScript done on 2026-01-01 [COMMAND_EXIT_CODE="0"]\n'
    )
    assert clean_transcript(raw) == "root@abc:/testbed# ls\nREADME.md\nroot@abc:/testbed# exit\nexit"
    text, cut = bounded("a" * 50 + "b" * 50, 20)
    assert cut == 80 and text.startswith("a" * 10) and text.endswith("b" * 10) and "80 characters left out" in text
    assert bounded("short", 20) == ("short", 0)
