"""The R2E-Gym-compatible tools in a real container: parameters, observation text, limits."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from env.sandbox.tools import (
    FINISHED_OBSERVATION,
    NO_FUNCTION_CALL_REMINDER,
    TOOL_SPECS,
    ToolBox,
    ToolCall,
    render_command_line,
    truncate_bash_output,
)
from tests.conftest import r2egym_peer

SOURCE = "def f(x):\n    return x + 1\n\n\ndef g(y):\n    return y * 2\n"
REPO_ROOT = Path(__file__).resolve().parents[3]
PEER = r2egym_peer()
PEER_EDITOR = PEER / "src" / "r2egym" / "agenthub" / "tools" / "file_editor.py"
OUR_EDITOR = REPO_ROOT / "env" / "sandbox" / "tool_scripts" / "file_editor.py"

CONCISE_SOURCES = [
    "def three(x):\n    a = x\n    b = a\n    return b\n\n\n"
    "def four(x):\n    a = x\n    b = a\n    c = b\n    return c\n",
    'def doc_only():\n    """One.\n\n    Two.\n    """\n\n\n'
    'def doc_and_body(x):\n    """Doc."""\n    a = x\n    b = a\n    return b\n',
    "def outer(x):\n    def inner(y):\n        z = y\n        z += 1\n        z *= 2\n        return z\n\n"
    "    return inner(x)\n",
    'class Five:\n    """1\n    2\n    3\n    4\n    """\n    x = 1\n\n\n'
    'class Four:\n    """1\n    2\n    3\n    """\n',
    "class NoDoc:\n    x = 1\n\n    async def method(self):\n        await self.a()\n        await self.b()\n"
    "        await self.c()\n        return 1\n",
    "def call_last(x):\n    a = x\n    b = a\n    return dict(\n        a=a,\n        b=b,\n    )\n",
    "@decorator\ndef decorated(\n    a,\n    b,\n):\n    c = a\n    d = c\n    e = d\n    return e\n"
    "f = lambda x: x\ndef one_line(): return 1\n",
    'def ends_in_string():\n    a = 1\n    b = 2\n    c = 3\n    return """x\ny\nz"""\n',
]
# Runs in a fresh interpreter: R2E-Gym's editor replaces sys.stdout when it is imported.
CONCISE_PROBE = textwrap.dedent(
    """
    import ast, importlib.util, json, sys, tempfile
    from pathlib import Path

    def load(name, path):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    peer, ours = load("peer_editor", sys.argv[1]), load("our_editor", sys.argv[2])
    sources = json.loads(sys.argv[3])
    parse = ast.parse

    def parse_without_end_lineno(*args, **kwargs):  # what an interpreter before 3.8 gives
        tree = parse(*args, **kwargs)
        for node in ast.walk(tree):
            if hasattr(node, "end_lineno"):
                node.end_lineno = node.end_col_offset = None
        return tree

    out = []
    for legacy in (False, True):
        ast.parse = parse_without_end_lineno if legacy else parse
        for source in sources:
            with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
                handle.write(source)
            theirs = peer.StrReplaceEditor({})._get_elided_lines(Path(handle.name))
            mine = ours.elided_lines(handle.name, ours.read_file(handle.name)[0])
            out.append({"legacy": legacy, "theirs": theirs, "ours": mine})
    sys.__stdout__.write(json.dumps(out))
    """
)


@pytest.fixture()
def toolbox(sandbox):
    sandbox.check(
        "mkdir -p /testbed/pkg/sub /testbed/.hidden && echo 'notes' > /testbed/README.txt && "
        "echo 'X = 1' > /testbed/.hidden/h.py && echo 'Y = 2' > /testbed/pkg/sub/deep.py",
        workdir="/",
    )
    sandbox.write_file("/testbed/pkg/a.py", SOURCE)
    return ToolBox(sandbox).install()


def editor(box: ToolBox, **arguments: str) -> str:
    return box.call(ToolCall(name="file_editor", arguments=arguments)).observation


def bash(box: ToolBox, cmd: str):
    return box.call(ToolCall(name="execute_bash", arguments={"cmd": cmd}))


# ------------------------------------------------------------------------------- no container needed


def test_render_command_line_matches_r2e():
    call = ToolCall(name="file_editor", arguments={"command": "view", "path": "/testbed/x.py", "view_range": "[1, 50]"})
    assert render_command_line(call) == "file_editor view --path /testbed/x.py --view_range '[1, 50]'"
    assert render_command_line(ToolCall(name="execute_bash", arguments={"cmd": "pytest -q"})) == (
        "execute_bash --cmd 'pytest -q'"
    )


def test_truncate_bash_output_keeps_40_head_and_40_tail():
    text = "\n".join(str(i) for i in range(200))
    out = truncate_bash_output(text).splitlines()
    assert out[:40] == [str(i) for i in range(40)]
    assert out[-40:] == [str(i) for i in range(160, 200)]
    assert out[41] == "<Observation truncated in middle for saving context>"
    assert truncate_bash_output("\n".join(["x"] * 80)) == "\n".join(["x"] * 80)


def test_tool_specs_name_the_four_tools_and_required_parameters():
    specs = {spec["name"]: spec for spec in TOOL_SPECS}
    assert set(specs) == {"file_editor", "search", "execute_bash", "finish"}
    assert specs["file_editor"]["parameters"]["required"] == ["command", "path"]
    assert specs["execute_bash"]["parameters"]["required"] == ["cmd"]
    assert specs["search"]["parameters"]["required"] == ["search_term"]
    assert "EVERY REPLY MUST END WITH EXACTLY ONE FUNCTION CALL" in NO_FUNCTION_CALL_REMINDER


def test_concise_view_is_computed_as_r2e_gym_computes_it():
    """Our elision (function bodies, class docstrings) equals R2E-Gym's `_get_elided_lines` on the same files,
    with `end_lineno` (Python 3.8+) and with its fallback for older interpreters (simulated by removing it)."""
    if not PEER_EDITOR.is_file():
        pytest.skip(f"R2E-Gym peer snapshot not found at {PEER} (set NEXUS_R2EGYM_PEER)")
    proc = subprocess.run(
        [sys.executable, "-c", CONCISE_PROBE, str(PEER_EDITOR), str(OUR_EDITOR), json.dumps(CONCISE_SOURCES)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    assert len(results) == 2 * len(CONCISE_SOURCES)
    for result in results:
        assert result["ours"] == result["theirs"], result
    assert any(any("eliding" in line for _, line in r["ours"]) for r in results if r["legacy"])
    assert [r["ours"] for r in results if r["legacy"]] != [r["ours"] for r in results if not r["legacy"]]


# ------------------------------------------------------------------------------- in the container


@pytest.mark.docker
def test_view_file_uses_cat_n_numbering(toolbox):
    obs = editor(toolbox, command="view", path="/testbed/pkg/a.py")
    assert obs == (
        "Execution output of [file_editor]:\nHere's the result of running `cat -n` on the file: "
        "/testbed/pkg/a.py:\n     1 def f(x):\n     2     return x + 1\n     3 \n     4 \n"
        "     5 def g(y):\n     6     return y * 2\n"
    )


@pytest.mark.docker
def test_view_range_and_bad_range(toolbox):
    obs = editor(toolbox, command="view", path="/testbed/pkg/a.py", view_range="[5, -1]")
    assert obs.endswith("     5 def g(y):\n     6     return y * 2\n")
    assert "     1 def f" not in obs
    bad = editor(toolbox, command="view", path="/testbed/pkg/a.py", view_range="[9, 10]")
    assert "ERROR: Invalid view_range [9, 10]: start line must be in [1, 6]" in bad


@pytest.mark.docker
def test_view_directory_lists_dirs_and_py_two_levels_excluding_hidden(toolbox):
    obs = editor(toolbox, command="view", path="/testbed")
    assert "Here's the files and directories up to 2 levels deep in /testbed, excluding hidden:" in obs
    listed = set(obs.splitlines()[2:])
    assert {"/testbed", "/testbed/pkg", "/testbed/pkg/a.py", "/testbed/pkg/sub"} <= listed
    assert "/testbed/README.txt" not in listed  # non-.py files are not shown
    assert not any(".hidden" in line for line in listed)
    assert "/testbed/pkg/sub/deep.py" not in listed  # deeper than 2 levels


@pytest.mark.docker
def test_view_of_non_python_file_is_refused(toolbox):
    obs = editor(toolbox, command="view", path="/testbed/README.txt")
    assert (
        "ERROR: ERROR: Viewing non-Python files is disallowed for saving context. File 'README.txt' is not a .py file."
    ) in obs


@pytest.mark.docker
def test_long_python_file_gets_condensed_view(toolbox, sandbox):
    body = "".join(f"    v{i} = {i}\n" for i in range(20))
    text = "".join(f"def fn{k}():\n{body}    return 0\n\n\n" for k in range(6))
    sandbox.write_file("/testbed/big.py", text)
    obs = editor(toolbox, command="view", path="/testbed/big.py")
    assert "Here is a condensed view for file: /testbed/big.py;" in obs
    assert "... eliding lines 2-22 ..." in obs
    assert "v5 = 5" not in obs
    full = editor(toolbox, command="view", path="/testbed/big.py", view_range="[1, 30]")
    assert "v5 = 5" in full


@pytest.mark.docker
def test_output_is_clipped_at_10000_characters(toolbox, sandbox):
    sandbox.write_file("/testbed/huge.py", "".join(f"x{i} = {i}  # {'p' * 60}\n" for i in range(300)))
    obs = editor(toolbox, command="view", path="/testbed/huge.py", view_range="[1, -1]")
    assert "<response clipped><NOTE>To save on context only part of this file has been shown to you." in obs
    body = obs.split("\n", 1)[1]
    assert len(body) < 10000 + 300


@pytest.mark.docker
def test_create_refuses_to_overwrite_and_undo_history_persists(toolbox, sandbox):
    created = editor(toolbox, command="create", path="/testbed/new.py", file_text="A = 1\n")
    assert created.startswith(
        "Execution output of [file_editor]:\nFile created at /testbed/new.py. "
        "Here's the result of running `cat -n` on /testbed/new.py:\n     1\tA = 1\n"
    )
    again = editor(toolbox, command="create", path="/testbed/new.py", file_text="B = 2\n")
    assert "ERROR: File already exists at: /testbed/new.py. Cannot overwrite with 'create'." in again
    assert sandbox.read_file("/testbed/new.py") == b"A = 1\n"
    assert b"/testbed/new.py" in sandbox.read_file("/var/tmp/editor_state.json")


@pytest.mark.docker
def test_str_replace_unique_missing_multiple_and_undo(toolbox, sandbox):
    obs = editor(toolbox, command="str_replace", path="/testbed/pkg/a.py", old_str="x + 1", new_str="x + 10")
    assert "The file /testbed/pkg/a.py has been edited. Here's the result of running `cat -n` on a snippet "
    assert "     2\t    return x + 10" in obs
    assert obs.endswith("Review the changes and make sure they are as expected. Edit the file again if necessary.\n")
    missing = editor(toolbox, command="str_replace", path="/testbed/pkg/a.py", old_str="nope", new_str="z")
    assert "ERROR: No occurrences of 'nope' found in /testbed/pkg/a.py for replacement." in missing
    multiple = editor(toolbox, command="str_replace", path="/testbed/pkg/a.py", old_str="return", new_str="r")
    assert "ERROR: Multiple occurrences of 'return' found in /testbed/pkg/a.py." in multiple
    undone = editor(toolbox, command="undo_edit", path="/testbed/pkg/a.py")
    assert "Last edit to /testbed/pkg/a.py undone successfully." in undone
    assert sandbox.read_file("/testbed/pkg/a.py").decode() == SOURCE
    nothing = editor(toolbox, command="undo_edit", path="/testbed/pkg/a.py")
    assert "ERROR: No previous edits found for /testbed/pkg/a.py to undo." in nothing
    assert toolbox.str_replace_paths == ["/testbed/pkg/a.py"]


@pytest.mark.docker
def test_insert_after_line_and_bounds(toolbox, sandbox):
    obs = editor(toolbox, command="insert", path="/testbed/pkg/a.py", insert_line="0", new_str="import os")
    assert "Here's the result of running `cat -n` on a snippet of the edited file:\n     1\timport os\n" in obs
    assert sandbox.read_file("/testbed/pkg/a.py").decode().startswith("import os\ndef f(x):")
    bad = editor(toolbox, command="insert", path="/testbed/pkg/a.py", insert_line="99", new_str="x")
    assert "ERROR: Invalid insert_line 99. Must be in [0, 8]." in bad


@pytest.mark.docker
def test_editor_path_errors(toolbox):
    assert "ERROR: The path '/testbed/nope.py' does not exist." in editor(
        toolbox, command="view", path="/testbed/nope.py"
    )
    assert "Only 'view' can be used on directories." in editor(
        toolbox, command="str_replace", path="/testbed/pkg", old_str="a", new_str="b"
    )


@pytest.mark.docker
def test_search_directory_file_and_no_match(toolbox):
    obs = toolbox.call(ToolCall(name="search", arguments={"search_term": "return"})).observation
    assert obs == (
        'Execution output of [search]:\nFound 2 matches for "return" in /testbed:\n'
        './pkg/a.py (2 matches)\nEnd of matches for "return" in /testbed\n'
    )
    in_file = toolbox.call(
        ToolCall(name="search", arguments={"search_term": "def g", "path": "/testbed/pkg/a.py"})
    ).observation
    assert 'Matches for "def g" in /testbed/pkg/a.py:\n5:def g(y):' in in_file
    none = toolbox.call(ToolCall(name="search", arguments={"search_term": "zzz_absent"})).observation
    assert 'No matches found for "zzz_absent" in /testbed' in none


@pytest.mark.docker
def test_execute_bash_exit_code_lines(toolbox):
    ok = bash(toolbox, "echo hello")
    assert ok.observation == ("Exit code: 0\nExecution output of [execute_bash]:\n[STDOUT]\n\nhello \n\n[STDERR]\n\n\n")
    failed = bash(toolbox, "echo oops >&2; exit 3")
    assert failed.observation.startswith(
        "Exit code: Error: Exit code 3\nExecution output of [execute_bash]:\nError executing command:\n"
    )
    assert "[STDERR]\n\noops" in failed.observation
    assert failed.exit_code == 3


@pytest.mark.docker
def test_execute_bash_fresh_process_per_call(toolbox):
    bash(toolbox, "export FOO=bar; cd /tmp")
    assert "[STDOUT]\n\n/testbed \n" in bash(toolbox, "pwd; echo ${FOO:-unset}").observation.replace("\nunset", "")


@pytest.mark.docker
@pytest.mark.parametrize("word", ["git", "ipython", "jupyter", "nohup"])
def test_execute_bash_blocks_first_words(toolbox, word):
    obs = bash(toolbox, f"{word} status").observation
    assert obs == (
        f"Exit code: Error: Exit code 1\nExecution output of [execute_bash]:\nBash command '{word}' "
        "is not allowed. Please use a different command or tool.\n"
    )


@pytest.mark.docker
def test_execute_bash_long_output_is_cut_to_head_and_tail(toolbox):
    lines = bash(toolbox, "seq 1 500").observation.splitlines()
    assert "<Observation truncated in middle for saving context>" in lines
    assert lines[2:5] == ["[STDOUT]", "", "1"]
    assert "250" not in lines
    # 2 header lines, 40 head lines, divider / note / divider, 40 tail lines (the last one empty: dropped)
    assert lines[42] == lines[44] == "-" * 50
    assert lines[-4:] == ["500 ", "", "[STDERR]", ""]
    assert len(lines) == 2 + 40 + 3 + 39


@pytest.mark.docker
def test_execute_bash_timeout_kills_and_reports(sandbox):
    box = ToolBox(sandbox, step_timeout_s=2).install()
    result = box.call(ToolCall(name="execute_bash", arguments={"cmd": "sleep 1000"}))
    assert result.timed_out
    assert result.observation == (
        "Exit code: -1\nExecution output of [execute_bash]:\nThe command took too long to execute (>2s)"
    )
    assert "sleep 1000" not in sandbox.run("ps -eo args", workdir="/").output


@pytest.mark.docker
def test_finish_submit_and_unknown_tool(toolbox):
    done = toolbox.call(ToolCall(name="finish", arguments={"command": "submit"}))
    assert done.submitted and done.observation == FINISHED_OBSERVATION
    assert toolbox.call(ToolCall(name="submit")).submitted
    unknown = toolbox.call(ToolCall(name="teleport", arguments={}))
    assert not unknown.submitted and "unknown function 'teleport'" in unknown.observation
