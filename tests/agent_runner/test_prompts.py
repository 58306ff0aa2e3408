"""The r2egym-structured prompts: tool manual from env.sandbox.tools.TOOL_SPECS, call format, issue, step budget."""

from __future__ import annotations

import re

from agent_runner import prompts
from agent_runner.parsing import parse_response
from env.sandbox.tools import NO_FUNCTION_CALL_REMINDER, TOOL_SPECS

from .conftest import TinyTask


def test_system_prompt_documents_every_tool_in_order_with_fences():
    text = prompts.system_prompt()
    names = re.findall(r"---- BEGIN FUNCTION #(\d+): (\w+) ----", text)
    assert names == [(str(i), spec["name"]) for i, spec in enumerate(TOOL_SPECS, start=1)]
    assert len(re.findall(r"---- END FUNCTION #\d+ ----", text)) == len(TOOL_SPECS)
    assert "(1) command (string, required)" in text and "(3) file_text (string, optional)" in text
    assert "Allowed values: [`view`, `create`, `str_replace`, `insert`, `undo_edit`]" in text
    assert "(1) cmd (string, required)" in text


def test_the_call_example_in_the_system_prompt_parses_as_a_call():
    example = prompts.CALL_FORMAT[prompts.CALL_FORMAT.index("<function=") :]
    parsed = parse_response(example)
    assert parsed.call is not None and parsed.call.name == "example_function_name"
    assert parsed.call.arguments["example_parameter_2"] == "A value may span\nseveral lines."


def test_instance_prompt_has_the_issue_the_workflow_and_the_budget():
    text = prompts.instance_prompt(TinyTask(problem_statement="  add() is off by one\n"), 40)
    assert "<github_issue>\nadd() is off by one\n</github_issue>" in text
    assert "/testbed" in text and "test files" in text
    assert [int(n) for n in re.findall(r"^(\d)\. ", text, flags=re.M)] == list(range(1, 10))
    assert "/testbed/reproduce_issue.py" in text and "/testbed/edge_case_tests.py" in text
    assert text.endswith("\nSteps Remaining: 40")
    assert not prompts.instance_prompt(TinyTask(), None).endswith("Steps Remaining: 40")


def test_step_budget_text_and_observation_message():
    assert prompts.steps_remaining_text(3) == "Steps Remaining: 3"
    assert "NOW" in prompts.steps_remaining_text(0) and prompts.steps_remaining_text(
        -5
    ) == prompts.steps_remaining_text(0)
    assert prompts.observation_message("out", 2) == "out\nSteps Remaining: 2"
    assert prompts.NO_FUNCTION_CALL_REMINDER == NO_FUNCTION_CALL_REMINDER


def test_tool_manual_accepts_other_spec_shapes():
    listed = [{"name": "t", "description": "d", "parameters": [{"name": "a", "required": True, "description": "x"}]}]
    mapped = {"t": {"description": "d", "parameters": {"a": {"type": "string", "required": True, "description": "x"}}}}
    for specs in (listed, mapped):
        text = prompts.tool_manual(specs)
        assert "---- BEGIN FUNCTION #1: t ----" in text and "(1) a (string, required): x" in text
