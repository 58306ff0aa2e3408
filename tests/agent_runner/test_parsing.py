"""R2E-Gym call format: thought, first function block, trimmed parameters, format errors."""

from __future__ import annotations

from agent_runner.parsing import NO_CALL_ERROR, ParsedAction, parse_response, render_call, resynthesize
from env.sandbox.tools import ToolCall

TYPICAL = """<think>
The bug is in add(); let me look.
</think>

<function=file_editor>
<parameter=command>view</parameter>
<parameter=path>  /testbed/calc.py
</parameter>
<parameter=view_range>[1, 50]</parameter>
</function>
trailing text is ignored"""


def test_typical_completion_gives_thought_and_trimmed_string_parameters():
    parsed = parse_response(TYPICAL)
    assert parsed.thought == "The bug is in add(); let me look."
    assert parsed.error is None
    assert parsed.call == ToolCall(
        name="file_editor", arguments={"command": "view", "path": "/testbed/calc.py", "view_range": "[1, 50]"}
    )


def test_multiline_value_keeps_inner_whitespace():
    text = "<function=file_editor><parameter=file_text>\n  def f():\n      return 1\n\n</parameter></function>"
    assert parse_response(text).call.arguments["file_text"] == "def f():\n      return 1"


def test_no_think_block_means_empty_thought_and_text_outside_is_discarded():
    parsed = parse_response("I will list files.\n<function=execute_bash><parameter=cmd>ls</parameter></function>")
    assert parsed.thought == ""
    assert parsed.call == ToolCall(name="execute_bash", arguments={"cmd": "ls"})


def test_closing_think_without_opener_takes_the_text_before_it():
    parsed = parse_response(
        "reasoning here\n</think>\n<function=finish><parameter=command>submit</parameter></function>"
    )
    assert parsed.thought == "reasoning here"
    assert parsed.call.name == "finish"


def test_only_the_first_function_block_counts():
    text = (
        "<function=execute_bash><parameter=cmd>ls</parameter></function>"
        "<function=finish><parameter=command>submit</parameter></function>"
    )
    assert parse_response(text).call == ToolCall(name="execute_bash", arguments={"cmd": "ls"})


def test_duplicate_parameters_last_wins_by_default_like_r2e_and_first_on_request():
    text = "<function=execute_bash><parameter=cmd>one</parameter><parameter=cmd>two</parameter></function>"
    assert parse_response(text).call.arguments == {"cmd": "two"}
    assert parse_response(text, duplicates="first").call.arguments == {"cmd": "one"}


def test_no_call_is_a_format_error_with_the_thought_kept():
    parsed = parse_response("<think>hmm</think> I am done here.")
    assert parsed == ParsedAction(thought="hmm", call=None, error=NO_CALL_ERROR)


def test_truncated_function_block_is_a_format_error():
    for text in (
        "<function=execute_bash><parameter=cmd>ls</parameter>",
        "<function=execute_bash",
        "<function=execute_bash>\n<parameter=cmd>ls -la",
    ):
        parsed = parse_response(text)
        assert parsed.call is None and "truncated" in parsed.error, text


def test_bad_function_name_is_a_format_error():
    parsed = parse_response("<function=rm -rf />x</function>")
    assert parsed.call is None and "bad function name" in parsed.error


def test_unclosed_parameter_is_dropped_and_nested_opener_stays_in_the_outer_value():
    assert parse_response("<function=f><parameter=a>1</parameter><parameter=b>2</function>").call.arguments == {
        "a": "1"
    }
    nested = parse_response("<function=f><parameter=a>x<parameter=b>y</parameter></parameter></function>")
    assert nested.call.arguments == {"a": "x<parameter=b>y"}


def test_non_string_input_does_not_raise():
    assert parse_response(None).error == NO_CALL_ERROR  # type: ignore[arg-type]


def test_render_and_resynthesize_round_trip():
    call = ToolCall(name="file_editor", arguments={"command": "create", "path": "/testbed/x.py", "file_text": "a\nb"})
    assert parse_response(render_call(call)).call == call
    text = resynthesize(ParsedAction(thought="why", call=call))
    assert text.startswith("<think>\nwhy\n</think>\n\n<function=file_editor>")
    assert parse_response(text) == ParsedAction(thought="why", call=call)
