"""The agent's tools, R2E-Gym `r2egym` scaffold compatible: file_editor, search, execute_bash, finish/submit.

Each tool is one of our own stdlib-only scripts (`env/sandbox/tool_scripts/*.py`, Python 3.6+) installed into the
container as `/usr/local/bin/<tool>`, as R2E-Gym does. A call is rendered to the same command line R2E-Gym
renders (`file_editor view --path /testbed/x.py --view_range '[1, 50]'`: the `command` parameter
positional, every other parameter as `--key <shell-quoted value>`) and run in `/testbed` under a 90 s
in-container timeout. Observation text is R2E-Gym's (`Observation.__str__` + `DockerRuntime.run`):

* execute_bash: `Exit code: 0` | `Exit code: Error: Exit code N` | `Exit code: -1` (timeout), then
  `Execution output of [execute_bash]:` and the output; over 80 lines keeps the first and last 40 lines.
* other tools: `Execution output of [<tool>]:` and the output (the editor clips itself at 10,000 chars).
* finish / submit: `<<< Finished >>>`; no call at all: `NO_FUNCTION_CALL_REMINDER`.
* a parameter name that is not a plain option name (`PARAMETER_NAME_RE`; R2E-Gym pastes names into the
  shell line unquoted): `Execution output of [<tool>]:` and an `ERROR: bad parameter name ...` line;
  nothing runs.

tests/env/sandbox/test_tool_differential.py plays the same calls through R2E-Gym's published scripts and compares the
observations; the few deliberate differences and their reasons are in docs/sandbox.md.

Interpreter: the first Python >= 3.6 among the system python3 (ours, most images), the base miniconda
python (SWE-bench images), the R2E venv (`/root/.venv`, `/testbed/.venv`), the conda env `testbed`, then
`python3` on PATH. Tool scripts only need the standard library, so the repo's own env stays untouched;
commands run by execute_bash still see the repo interpreter first on PATH (see env.sandbox.config.SANDBOX_PATH).
"""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from env.sandbox.config import SandboxError
from env.sandbox.container import Sandbox

TOOL_NAMES = ("file_editor", "search", "execute_bash", "finish")
FINISH_NAMES = ("finish", "submit")
STEP_TIMEOUT_S = 90
BASH_KEEP_LINES = 40
INSTALL_DIR = "/usr/local/bin"
SCRIPTS_DIR = Path(__file__).resolve().parent / "tool_scripts"
# Grading material that R2E/SWE-bench images ship; removed from the agent's container (R2E-Gym leaks it).
GRADING_PATHS = (
    "/r2e_tests",
    "/root/r2e_tests",
    "/testbed/r2e_tests",
    "/testbed/run_tests.sh",
    "/root/run_tests.sh",
    "/run_tests.sh",
    "/eval.sh",
    "/root/expected_test_output.json",
)
INTERPRETER_CANDIDATES = (
    "/usr/bin/python3",
    "/opt/miniconda3/bin/python3",
    "/root/.venv/bin/python",
    "/testbed/.venv/bin/python",
    "/opt/miniconda3/envs/testbed/bin/python",
    "/usr/local/bin/python3",
)
# our own wording; with R2E-Gym's prompts loaded, the agent sends R2E-Gym's reply instead (agent_runner.scaffold)
NO_FUNCTION_CALL_REMINDER = (
    "\nYour reply contained no function call. EVERY REPLY MUST END WITH EXACTLY ONE FUNCTION CALL."
    "\n\nDo not ask for help: keep working with the functions until you can call finish.\n"
)
FINISHED_OBSERVATION = "<<< Finished >>>"
_ANSI = re.compile(r"\x1b\[[0-9;]*m|\r")
# A parameter name becomes the option `--<name>` of the tool script. Names outside this pattern are refused
# before anything runs (R2E-Gym put them into the shell line unquoted). Unknown names that fit it still
# reach the script, whose argparse error is the observation, as in R2E-Gym.
PARAMETER_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


class ToolCall(BaseModel):
    """One parsed function call: the tool name and its string parameters (values already trimmed)."""

    name: str
    arguments: dict[str, str] = Field(default_factory=dict)


class ToolResult(BaseModel):
    """What the agent sees (`observation`), whether the episode ended, and how long the call took."""

    observation: str
    submitted: bool = False
    seconds: float = 0.0
    exit_code: int | None = None
    timed_out: bool = False


def _param(name: str, type_: str, description: str, *, enum: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": type_, "description": description}
    if enum:
        spec["enum"] = enum
    return spec


TOOL_SPECS: list[dict[str, Any]] = [
    {
        "name": "file_editor",
        "description": (
            "View, create and edit files. `view` on a file prints it with line numbers (`cat -n` style; "
            "only .py files; a .py file over 110 lines without a view_range is shown condensed), on a "
            "directory lists non-hidden directories and .py files two levels deep. `create` refuses to "
            "overwrite. `str_replace` needs `old_str` to match exactly once. `insert` adds `new_str` after "
            "line `insert_line`. `undo_edit` restores the file before its last edit. Long output is clipped "
            "and marked `<response clipped>`."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "command": _param(
                    "command",
                    "string",
                    "The operation to run.",
                    enum=["view", "create", "str_replace", "insert", "undo_edit"],
                ),
                "path": _param("path", "string", "Absolute path of the file or directory, e.g. /testbed/a.py."),
                "file_text": _param("file_text", "string", "`create`: the content of the new file."),
                "old_str": _param("old_str", "string", "`str_replace`: the exact text to replace."),
                "new_str": _param(
                    "new_str", "string", "`str_replace`: the replacement (empty if omitted); `insert`: the text to add."
                ),
                "insert_line": _param(
                    "insert_line", "integer", "`insert`: the new text goes after this line (0 = top of the file)."
                ),
                "view_range": _param(
                    "view_range", "array", "`view` on a file: [start, end], 1-based; end -1 means to the end."
                ),
                "concise": _param("concise", "boolean", "`view`: condensed view of a .py file."),
                "enable_linting": _param(
                    "enable_linting", "boolean", "Refuse edits that leave a .py file with a syntax error."
                ),
            },
            "required": ["command", "path"],
        },
    },
    {
        "name": "search",
        "description": (
            "Search for a plain term. In a directory (default the current one): counts matching lines per "
            "non-hidden .py file, and asks to narrow the search past 100 files. In a file: `grep -n`."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "search_term": _param("search_term", "string", "The text to look for."),
                "path": _param("path", "string", "A file or directory to search (default `.`)."),
            },
            "required": ["search_term"],
        },
    },
    {
        "name": "execute_bash",
        "description": (
            "Run one shell command in a fresh process in /testbed (no state is kept between calls; 90 s "
            "limit). Commands starting with git, ipython, jupyter or nohup are refused. Prints [STDOUT] and "
            "[STDERR]; the observation starts with the exit code."
        ),
        "parameters": {
            "type": "object",
            "properties": {"cmd": _param("cmd", "string", "The command line to run.")},
            "required": ["cmd"],
        },
    },
    {
        "name": "finish",
        "description": "Submit the current state of /testbed as the solution and end the task.",
        "parameters": {
            "type": "object",
            "properties": {
                "command": _param("command", "string", "Always `submit`.", enum=["submit"]),
                "result": _param("result", "string", "Optional text to submit with it."),
            },
            "required": ["command"],
        },
    },
]


def bad_parameter_names(call: ToolCall) -> list[str]:
    """The parameter names of `call` that are not plain option names (`PARAMETER_NAME_RE`)."""
    return [key for key in call.arguments if not PARAMETER_NAME_RE.fullmatch(key)]


def render_command_line(call: ToolCall) -> str:
    """R2E-Gym's rendering: tool name, `command` positional if present, then `--key 'value'` pairs.

    R2E-Gym pastes the key into the shell line as it is; here `--key` is shell-quoted too (a no-op for the
    plain names `ToolBox.call` lets through), so no key can add shell syntax whoever calls this."""
    parts = [shlex.quote(call.name)]
    if "command" in call.arguments:
        parts.append(shlex.quote(call.arguments["command"]))
    for key, value in call.arguments.items():
        if key != "command":
            parts += [shlex.quote(f"--{key}"), shlex.quote(str(value))]
    return " ".join(parts)


def truncate_bash_output(text: str, keep: int = BASH_KEEP_LINES) -> str:
    """More than 2*keep lines: the first and last `keep` lines around R2E-Gym's divider note."""
    lines = text.splitlines() if text else []
    if len(lines) <= 2 * keep:
        return text
    divider = "-" * 50
    return "\n".join(
        [*lines[:keep], divider, "<Observation truncated in middle for saving context>", divider, *lines[-keep:]]
    )


def str_replace_path(call: ToolCall) -> str | None:
    """The file a ``file_editor str_replace`` call edits (None for any other call): R2E-Gym's filtered patch
    export keeps only these ``.py`` files (``env.grading.export_patch_filtered``)."""
    if call.name.strip() == "file_editor" and call.arguments.get("command") == "str_replace":
        return call.arguments.get("path") or None
    return None


class ToolBox:
    """The four tools, bound to one sandbox. `install()` once, then `call()` per agent action."""

    def __init__(self, sandbox: Sandbox, *, step_timeout_s: float = STEP_TIMEOUT_S) -> None:
        self.sandbox = sandbox
        self.step_timeout_s = step_timeout_s
        self.interpreter: str | None = None
        # paths given to file_editor str_replace: R2E's filtered patch export keeps only these .py files
        self.str_replace_paths: list[str] = []

    def install(self, *, hide_grading_files: bool = True) -> ToolBox:
        """Copy the tool scripts in (shebang = the chosen interpreter); remove grading files if asked."""
        self.interpreter = self._pick_interpreter(hide_grading_files)
        scripts = {name: f"#!{self.interpreter}\n{(SCRIPTS_DIR / f'{name}.py').read_text()}" for name in TOOL_NAMES}
        self.sandbox.write_files(INSTALL_DIR, scripts, mode=0o755)
        return self

    def _pick_interpreter(self, hide_grading_files: bool) -> str:
        """One exec: (optionally) remove grading files, make INSTALL_DIR, print the interpreter to use."""
        probe = "import sys; sys.exit(0 if sys.version_info >= (3, 6) else 1)"
        candidates = " ".join(INTERPRETER_CANDIDATES)
        hide = f"rm -rf {' '.join(GRADING_PATHS)} || exit 2; " if hide_grading_files else ""
        script = (
            f"{hide}mkdir -p {INSTALL_DIR} || exit 2; for p in {candidates} $(command -v python3); do "
            f'[ -x "$p" ] && "$p" -c {shlex.quote(probe)} 2>/dev/null && {{ echo "$p"; exit 0; }}; done; exit 1'
        )
        result = self.sandbox.run(script, timeout=60, workdir="/")
        if result.exit_code != 0 or not result.output.strip():
            raise SandboxError("no Python >= 3.6 in the container to run the tools (looked at " + candidates + ")")
        return result.output.strip().splitlines()[-1]

    def call(self, call: ToolCall) -> ToolResult:
        """Run one tool call; never raises for the agent's mistakes (they become observation text)."""
        started = time.monotonic()
        name = call.name.strip()
        if name in FINISH_NAMES:
            return ToolResult(observation=FINISHED_OBSERVATION, submitted=True, seconds=0.0, exit_code=0)
        if name not in TOOL_NAMES:
            text = (
                f"Execution output of [{name}]:\nERROR: unknown function '{name}'. "
                f"Available functions: {', '.join(TOOL_NAMES)}."
            )
            return ToolResult(observation=text, seconds=time.monotonic() - started)
        bad = bad_parameter_names(call)
        if bad:
            shown = ", ".join(repr(key if len(key) <= 60 else key[:57] + "...") for key in bad)
            text = (
                f"Execution output of [{name}]:\nERROR: bad parameter name {shown}: a parameter name is letters, "
                "digits, '_' and '-', starting with a letter or '_'. Nothing was run."
            )
            return ToolResult(observation=text, seconds=time.monotonic() - started)
        path = str_replace_path(call)
        if path and path not in self.str_replace_paths:
            self.str_replace_paths.append(path)
        result = self.sandbox.run(render_command_line(call), timeout=self.step_timeout_s, workdir="/testbed")
        if result.timed_out:
            limit = int(self.step_timeout_s) if float(self.step_timeout_s).is_integer() else self.step_timeout_s
            output, status = f"The command took too long to execute (>{limit}s)", "-1"
        elif result.exit_code == 0:
            output, status = _ANSI.sub("", result.output), "0"
        else:
            output, status = result.output, f"Error: Exit code {result.exit_code}"
        if name == "execute_bash":
            text = f"Exit code: {status}\nExecution output of [{name}]:\n{truncate_bash_output(output)}"
        else:
            text = f"Execution output of [{name}]:\n{output}"
        return ToolResult(
            observation=text,
            submitted=False,
            seconds=time.monotonic() - started,
            exit_code=result.exit_code,
            timed_out=result.timed_out,
        )
