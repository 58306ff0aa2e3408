"""Tool parameter names never reach the shell as shell syntax (issue 33 item 7). No container needed."""

from __future__ import annotations

import shlex

import pytest

from env.sandbox.tools import ToolBox, ToolCall, render_command_line

HOSTILE = ["x;git log --all #", "a b", "$(touch /tmp/pwned)", "x`id`", "--path", "p\nid", "view_range=1|cat", ""]


class RecordingSandbox:
    """Stands in for a Sandbox: records every command instead of running it."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    def run(self, cmd, **_kwargs):  # pragma: no cover - a refused call must never get here
        self.commands.append(cmd)
        raise AssertionError(f"the call reached the shell: {cmd!r}")


@pytest.mark.parametrize("key", HOSTILE)
def test_bad_parameter_name_is_refused_before_anything_runs(key):
    sandbox = RecordingSandbox()
    result = ToolBox(sandbox).call(ToolCall(name="execute_bash", arguments={"cmd": "ls", key: "1"}))
    assert sandbox.commands == []
    assert result.observation.startswith("Execution output of [execute_bash]:\nERROR: bad parameter name ")
    assert not result.submitted


@pytest.mark.parametrize("key", HOSTILE)
def test_render_command_line_keeps_any_name_one_word(key):
    line = render_command_line(ToolCall(name="search", arguments={"search_term": "t", key: "v"}))
    assert shlex.split(line) == ["search", "--search_term", "t", f"--{key}", "v"]


def test_plain_names_render_as_r2e_gym_renders_them():
    call = ToolCall(name="file_editor", arguments={"command": "view", "path": "/testbed/x.py", "view-range": "[1]"})
    assert render_command_line(call) == "file_editor view --path /testbed/x.py --view-range '[1]'"
