"""The agent loop with ScriptedModel (test double for the model) and RecordingEnvironment: every exit."""

from __future__ import annotations

import pytest

from agent_runner import prompts
from agent_runner.agent import AgentConfig
from agent_runner.backends import BACKENDS, make_backend
from agent_runner.backends.scripted import ScriptedModel
from agent_runner.parsing import ParsedAction
from agent_runner.records import Completion
from env.sandbox.tools import ToolCall

from .conftest import RecordingEnvironment, run_loop

LS = "<think>look around</think>\n<function=execute_bash>\n<parameter=cmd>ls</parameter>\n</function>"
FINISH = "<think>done</think>\n<function=finish>\n<parameter=command>submit</parameter>\n</function>"


def test_submitted_records_every_turn_and_builds_the_r2e_conversation(task, environment):
    seen = []
    model = ScriptedModel([LS, FINISH])
    result = run_loop(model, environment, task, AgentConfig(), seed=7, on_turn=seen.append)

    assert result.exit_status == "submitted" and result.error is None
    assert [t.index for t in seen] == [0, 1] and result.turns == seen
    assert [c.name for c in environment.calls] == ["execute_bash", "finish"]
    assert model.seed == 7 and model.max_new_tokens_seen == [None, None]  # the cap is the backend's own
    assert [m.role for m in result.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert task.problem_statement in result.messages[1].content
    assert result.messages[1].content.endswith("Steps Remaining: 40")
    assert result.messages[2].content == LS  # raw history by default
    assert result.messages[3].content == "Execution output of [execute_bash]:\ncmd=ls\nSteps Remaining: 39"
    # the second call saw exactly the first call's messages + one assistant + one user message
    assert model.calls[1][: len(model.calls[0])] == model.calls[0] and len(model.calls[1]) == len(model.calls[0]) + 2
    first = seen[0]
    assert first.thought == "look around" and first.action == ToolCall(name="execute_bash", arguments={"cmd": "ls"})
    assert first.raw == LS and first.steps_remaining == 39 and first.env_s == pytest.approx(0.01)
    assert seen[1].submitted and seen[1].user_message is None
    assert result.totals.turns == 2 and result.totals.tokens_generated == sum(
        t.completion.tokens_generated for t in seen
    )
    assert "seed" not in result.config["agent"]  # the episode's one seed lives in EpisodeSpec, not here


def test_step_limit_and_the_submit_now_text_past_the_soft_limit(task, environment):
    result = run_loop(ScriptedModel([LS] * 3), environment, task, AgentConfig(max_steps=3, soft_step_limit=2))
    assert result.exit_status == "step_limit" and "max_steps=3" in result.error
    assert len(result.turns) == 3 and len(environment.calls) == 3
    assert result.turns[0].user_message.endswith("Steps Remaining: 1")
    assert result.turns[1].user_message.endswith(prompts.steps_remaining_text(0))
    assert "NOW" in result.turns[1].user_message


def test_context_limit_after_the_turn_that_reaches_it(task, environment):
    big = Completion(text=LS, prompt_tokens=900, tokens_generated=200, logical_length=1100)
    result = run_loop(ScriptedModel([LS, big]), environment, task, AgentConfig(max_context_tokens=1000))
    assert result.exit_status == "context_limit" and "1100" in result.error
    assert len(environment.calls) == 2  # the action that fit in the window still ran, as in R2E


def test_prompt_already_over_the_limit_does_not_act(task, environment):
    over = Completion(text=FINISH, prompt_tokens=1000, tokens_generated=5, logical_length=1005)
    result = run_loop(ScriptedModel([over]), environment, task, AgentConfig(max_context_tokens=1000))
    assert result.exit_status == "context_limit" and environment.calls == []


def test_a_full_model_window_ends_the_run_without_acting(task, environment):
    """The backend's window can be tighter than max_context_tokens (the model's own positions): a completion
    that says so ends the run as context_limit and its (empty) action never runs."""
    full = Completion(text="", prompt_tokens=8200, logical_length=8200, finish_reason="length", context_full=True)
    result = run_loop(ScriptedModel([LS, full, LS]), environment, task, AgentConfig(max_context_tokens=65536))
    assert result.exit_status == "context_limit" and "window is full" in result.error
    assert len(environment.calls) == 1 and len(result.turns) == 2


def test_time_limit(task, environment):
    result = run_loop(ScriptedModel([LS, LS]), environment, task, AgentConfig(wall_time_s=1e-9))
    assert result.exit_status == "time_limit" and len(result.turns) == 1


def test_format_errors_count_consecutively_and_get_the_reminder(task, environment):
    script = ["no call here", LS, "<function=execute_bash><parameter=cmd>ls", "still nothing"]
    result = run_loop(ScriptedModel(script), environment, task, AgentConfig(max_format_errors=2))
    assert result.exit_status == "format_error_limit" and len(result.turns) == 4
    assert [t.format_error for t in result.turns] == [True, False, True, True]
    assert result.turns[0].observation == prompts.NO_FUNCTION_CALL_REMINDER
    assert "truncated" in result.turns[2].parse_error
    assert len(environment.calls) == 1 and result.totals.format_errors == 3


def test_environment_failure_is_infra_failure_with_the_cause(task):
    env = RecordingEnvironment(fail_on="execute_bash", error=RuntimeError("container died"))
    result = run_loop(ScriptedModel([LS]), env, task)
    assert result.exit_status == "infra_failure"
    assert "execute_bash failed: RuntimeError: container died" in result.error


def test_sandbox_infra_error_is_wrapped(task):
    from env.sandbox import container as sandbox

    env = RecordingEnvironment(fail_on="execute_bash", error=sandbox.SandboxError("exec: container gone"))
    result = run_loop(ScriptedModel([LS]), env, task)
    assert result.exit_status == "infra_failure" and "SandboxError: exec: container gone" in result.error


def test_model_failure_is_infra_failure_and_keeps_earlier_turns(task, environment):
    result = run_loop(ScriptedModel([LS]), environment, task)
    assert result.exit_status == "infra_failure" and "script exhausted" in result.error
    assert len(result.turns) == 1


def test_on_turn_failure_is_recorded_not_raised(task, environment):
    def broken(turn):
        raise OSError("disk full")

    result = run_loop(ScriptedModel([LS]), environment, task, on_turn=broken)
    assert result.exit_status == "infra_failure" and "disk full" in result.error and len(result.turns) == 1


def test_intervene_replaces_the_action_before_it_runs(task, environment):
    replacement = ToolCall(name="finish", arguments={"command": "submit"})

    def intervene(index, parsed, raw):
        assert raw == LS  # the raw completion comes with the parse (the live prompt shows it)
        return ParsedAction(thought="operator override", call=replacement) if index == 0 else None

    result = run_loop(ScriptedModel([LS]), environment, task, intervene=intervene)
    assert result.exit_status == "submitted" and environment.calls == [replacement]
    assert result.turns[0].intervened and result.turns[0].raw == LS
    assert result.messages[2].content.startswith("<think>\noperator override\n</think>\n\n<function=finish>")


def test_resynthesized_history_option(task, environment):
    messy = "<think> x </think> chatter <function= execute_bash >\n<parameter=cmd>  ls </parameter></function> tail"
    result = run_loop(ScriptedModel([messy, FINISH]), environment, task, AgentConfig(history="resynthesized"))
    assert (
        result.messages[2].content
        == "<think>\nx\n</think>\n\n<function=execute_bash>\n<parameter=cmd>ls</parameter>\n</function>"
    )


def test_config_rejects_unknown_and_bad_fields():
    with pytest.raises(ValueError, match="max_stepz"):
        AgentConfig(max_stepz=3)
    with pytest.raises(ValueError, match="max_steps"):
        AgentConfig(max_steps=0)


def test_registry_builds_by_name_and_explains_missing_entries(monkeypatch):
    model = make_backend("scripted", script=[LS])
    assert isinstance(model, ScriptedModel)
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        make_backend("nope")
    monkeypatch.setitem(BACKENDS, "ghost", "agent_runner.backends.ghost:Ghost")
    with pytest.raises(ValueError, match="does not exist"):
        make_backend("ghost")


def test_episode_result_round_trips_through_json(task, environment):
    result = run_loop(ScriptedModel([LS, FINISH]), environment, task)
    again = type(result).model_validate_json(result.model_dump_json())
    assert again == result and again.turns[0].action == ToolCall(name="execute_bash", arguments={"cmd": "ls"})


def test_forced_prefix_then_live_backend_continues_the_stored_conversation(task, environment):
    from agent_runner.backends.forced_prefix import ForcedPrefix

    live = ScriptedModel([LS, LS, FINISH])
    result = run_loop(ForcedPrefix(["stored 0", "stored 1"], live), environment, task, seed=3)
    assert result.exit_status == "submitted" and len(result.turns) == 3
    assert [t.completion.forced for t in result.turns] == [True, True, False]
    assert [t.raw for t in result.turns[:2]] == ["stored 0", "stored 1"]  # the stored texts, the script stepped
    assert live.seed == 3 and len(live.calls[2]) == 6  # system, user, then the two forced turns
