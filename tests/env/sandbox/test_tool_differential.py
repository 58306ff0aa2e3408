"""Differential test: our tool scripts against R2E-Gym's published ones, call by call, observation by observation.

One container from the base image holds both: R2E-Gym's scripts (the peer snapshot, commit 69bc953, read from
`shared/peers/r2egym` at test time and run unmodified) in /opt/r2e/bin with their `#!/root/.venv/bin/python`
shebang satisfied by a venv that gets the host's chardet, and ours installed by `ToolBox.install()`. Each test
resets /testbed to the same fixture tree, plays a sequence of calls through R2E-Gym's path, resets, plays the
same calls through ours, and compares what the agent sees.

* Ours: `ToolBox.call()`, the function the agent loop uses.
* R2E-Gym: reproduced here from the peer's `runtime/docker.py` (`DockerRuntime.run`: `timeout T <cmd>` under
  `/bin/sh -c`, PATH with /root/.venv/bin first, exit 124 = timeout, other non-zero exits raw, ANSI and `\\r`
  stripped on exit 0), its `Action.to_bashcmd` rendering, `RepoEnv.step` and `Observation.__str__` (reference
  notes §2.2-2.4) and `Agent.run` (an exception in `env.step` becomes the observation text).

Every call must give the same text on both sides, except the cases in KNOWN_DIFFERENCES: each is listed in
docs/sandbox.md ("Differences from R2E-Gym's tool scripts", by its key) and checked to still differ the
documented way, so a fixed or stale entry fails.
"""

from __future__ import annotations

import concurrent.futures
import importlib.metadata
import io
import re
import shlex
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from env.sandbox.tools import FINISHED_OBSERVATION, ToolBox, ToolCall
from tests.conftest import TEST_JOB, r2egym_peer

pytestmark = [pytest.mark.docker]

REPO_ROOT = Path(__file__).resolve().parents[3]
PEER = r2egym_peer()
PEER_TOOLS = PEER / "src" / "r2egym" / "agenthub" / "tools"
PEER_SCRIPTS = ("file_editor", "search", "execute_bash", "finish")
DOCS = REPO_ROOT / "docs" / "sandbox.md"
DOCS_SECTION = "## Differences from R2E-Gym's tool scripts"

R2E_BIN = "/opt/r2e/bin"
# runtime/docker.py DOCKER_PATH, with the peer scripts' directory in front (R2E-Gym copies them to /usr/local/bin,
# where ours are installed here)
DOCKER_PATH = (
    "/root/.venv/bin:/root/.local/bin:/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)
R2E_PATH = f"{R2E_BIN}:{DOCKER_PATH}"
R2E_COMMANDS = PEER_SCRIPTS  # the tools edit_non_fn_calling.yaml registers (RepoEnv.add_commands)
STEP_TIMEOUT_S = 5  # both sides: R2E-Gym's `timeout T` and ToolBox(step_timeout_s=T); 90 in production
ANSI = re.compile(r"\x1b\[[0-9;]*m|\r")


# ---------------------------------------------------------------------------------------------- fixture tree


def _big_module() -> str:
    """A .py file over 110 lines exercising every branch of the concise view."""
    parts = [
        '"""Module docstring."""\n\nimport os\n\n\n',
        "def tiny(x):\n    return x\n\n\n",
        "def three_lines(x):\n    a = x\n    b = a\n    return b\n\n\n",
        "def four_lines(x):\n    a = x\n    b = a\n    c = b\n    return c\n\n\n",
        'def with_doc(x):\n    """Doc.\n\n    More doc.\n    """\n    return x\n\n\n',
        "def outer(x):\n    def inner(y):\n        z = y\n        z += 1\n        z *= 2\n        return z\n\n"
        "    total = inner(x)\n    return total\n\n\n",
        "async def fetch(url):\n    data = url\n    data = data.strip()\n    data = data.lower()\n"
        "    return data\n\n\n",
        'class Short:\n    """One line."""\n\n    value = 1\n\n\n',
        'class Documented:\n    """Line one.\n\n    Line three.\n    Line four.\n    Line five.\n    """\n\n'
        "    def method(self, a):\n        if a:\n            return 1\n        elif a is None:\n"
        "            return 2\n        return 3\n\n    @property\n    def prop(self):\n        return 4\n\n\n",
        "@staticmethod\ndef decorated(\n    a,\n    b,\n):\n    c = a + b\n    d = c * 2\n    e = d - 1\n"
        "    return e\n\n\n",
        "TEXT = '''\nmulti\nline\nstring\n'''\n\n\n",
        "def tabs():\n\tx = 1\n\ty = 2\n\tz = 3\n\treturn x + y + z\n\n\n",
    ]
    text = "".join(parts)
    filler = "".join(
        f"def filler_{i}(v):\n    w = v + {i}\n    w = w * 2\n    w = w - 1\n    return w\n\n\n" for i in range(9)
    )
    return text + filler + "if __name__ == '__main__':\n    print(tiny(1))\n"


ORDER_WORDS = ("kilo", "alpha", "zulu", "echo", "mike", "bravo", "yankee", "delta", "oscar")
SOURCE_A = "import os\n\n\ndef f(x):\n    return x + 1\n\n\ndef g(y):\n\treturn y * 2  # tab\n"
LATIN1_TEXT = "# Fichier de test\ndef salut():\n    return 'café crème à la mode, déjà vu, naïve, Müller, Straße'\n"
FIXTURE: dict[str, bytes] = {
    "pkg/__init__.py": b"",
    "pkg/a.py": SOURCE_A.encode(),
    "pkg/big.py": _big_module().encode(),
    "pkg/big_bad.py": ("x = (\n" + "y = 1\n" * 120).encode(),
    "pkg/huge.py": "".join(f"x{i} = {i}  # {'p' * 60}\n" for i in range(300)).encode(),
    "pkg/sub/deep.py": b"Y = 2\n",
    "pkg/notes.md": b"# notes\nreturn of the notes\n",
    ".hidden/h.py": b"def hidden():\n    return 1\n",
    "README.txt": b"notes\n",
    "enc/crlf.py": b"def f():\r\n    a = 1\r\n    return a\r\n\r\n\r\ndef g():\r\n    return 2\r\n",
    "enc/oldmac.py": b"a = 1\rb = 2\rc = 3\r",
    "enc/bom.py": "\ufeffx = 'caf\u00e9'\ny = 2\n".encode(),
    "enc/latin1.py": LATIN1_TEXT.encode("latin-1"),
    "enc/utf8.py": "# -*- coding: utf-8 -*-\ns = 'naïve résumé – ok'\n".encode(),
    **{f"many/m{i:03d}.py": f"NEEDLE = {i}\n".encode() for i in range(101)},
    "links/real.py": b"def real():\n    return 'LINKTERM'\n",
    "pkg/nul.py": b"x = 1\x00\n",
    # many matching files in one directory: listed in the file system's order on both sides, not sorted
    **{f"order/{word}.py": b"ORDERTERM = 1\n" for word in ORDER_WORDS},
}


def _fixture_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs = sorted({str(Path(p).parent) for p in FIXTURE} - {"."})
        for name in dirs:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
            tar.addfile(info)
        for name, data in FIXTURE.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------- the container


def _distribution_tar(name: str) -> bytes:
    """The installed files of a host distribution that live in site-packages (a compiled chardet has a
    top-level extension module next to its package), as a tar to extract into the container's site-packages."""
    dist = importlib.metadata.distribution(name)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel in dist.files or []:
            if rel.parts[0] == ".." or "__pycache__" in rel.parts:
                continue
            tar.add(str(dist.locate_file(rel)), arcname=str(rel))
    return buf.getvalue()


@dataclass
class Rig:
    box: object  # env.sandbox.container.Sandbox
    toolbox: ToolBox
    tree: bytes = field(repr=False)

    def reset(self) -> None:
        """The same /testbed and no editor history, before each side plays its sequence."""
        self.box.check("rm -rf /testbed /var/tmp/editor_state.json && mkdir -p /testbed", workdir="/")
        assert self.box.container.put_archive("/testbed", self.tree)


@pytest.fixture(scope="module")
def rig(docker_client, base_image):
    if not (PEER_TOOLS / "file_editor.py").is_file():
        pytest.skip(f"R2E-Gym peer snapshot not found at {PEER} (set NEXUS_R2EGYM_PEER)")
    from env.sandbox.config import SandboxConfig
    from env.sandbox.container import Sandbox

    box = Sandbox.start(base_image, config=SandboxConfig(), job=TEST_JOB, client=docker_client)
    try:
        # R2E-Gym's setup_env: a venv at /root/.venv (its scripts' shebang) with chardet; the test installs nothing
        # from a network: chardet is the host's own package (swebench depends on it), copied in.
        site = box.check(
            "python3 -m venv --without-pip /root/.venv && /root/.venv/bin/python -c "
            "'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'",
            workdir="/",
        ).strip()
        assert box.container.put_archive(site, _distribution_tar("chardet"))
        box.check("/root/.venv/bin/python -c 'import chardet'", workdir="/")
        box.check(f"mkdir -p {R2E_BIN}", workdir="/")
        box.write_files(R2E_BIN, {name: (PEER_TOOLS / f"{name}.py").read_bytes() for name in PEER_SCRIPTS}, mode=0o755)
        toolbox = ToolBox(box, step_timeout_s=STEP_TIMEOUT_S).install()
        yield Rig(box=box, toolbox=toolbox, tree=_fixture_tar())
    finally:
        box.close()


# ---------------------------------------------------------------------------------------------- R2E-Gym's side


def r2e_bashcmd(name: str, params: dict[str, str]) -> str:
    """Action.to_bashcmd: finish is an echo; else the name, `command` positional, `--key 'value'` for the rest."""
    if name == "finish":
        return "echo '<<<Finished>>>'"
    parts = [shlex.quote(name)]
    if params.get("command") is not None:
        parts.append(shlex.quote(params["command"]))
    for key, value in params.items():
        if key != "command":
            parts += [f"--{key}", shlex.quote(str(value))]
    return " ".join(parts)


def r2e_run(rig: Rig, code: str, timeout: int = STEP_TIMEOUT_S, path: str = R2E_PATH) -> tuple[str, str]:
    """DockerRuntime.run: (output, status) with status "0", "Error: Exit code N" or "-1"."""
    command = f"timeout {timeout} {code} "
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(
            rig.box.container.exec_run,
            cmd=["/bin/sh", "-c", command],
            workdir="/testbed",
            stdout=True,
            stderr=True,
            environment={"PATH": path},
        )
        try:
            result = future.result(timeout=timeout + 5)
        except concurrent.futures.TimeoutError:
            return f"The command took too long to execute (>{timeout}s)", "-1"
    output = result.output.decode("utf-8", errors="replace")
    if result.exit_code == 124:
        return f"The command took too long to execute (>{timeout}s)", "-1"
    if result.exit_code != 0:
        return output, f"Error: Exit code {result.exit_code}"
    return ANSI.sub("", output), str(result.exit_code)


def _r2e_run_action_unregistered(name: str) -> tuple[str, str]:
    """RepoEnv.run_action for a name that is not a registered command: the assert fails inside the `try`, the
    `except` only logs, and the `return` reads variables the `try` never set."""
    try:
        assert name in R2E_COMMANDS, f"Invalid Action: input action must be one of allowed actions: {name}"
        bash_output, error_code = "", "0"
    except AssertionError:
        pass
    return bash_output, error_code  # noqa: F821 (unbound on purpose: this is what R2E-Gym's env does)


def r2e_observation(rig: Rig, name: str, params: dict[str, str]) -> str:
    """What R2E-Gym's agent puts in its history for one call: str(Observation), or str(exception)."""
    if name not in R2E_COMMANDS:
        try:
            _r2e_run_action_unregistered(name)
        except Exception as exc:  # Agent.run: obs = str(e)
            return str(exc)
    output, status = r2e_run(rig, r2e_bashcmd(name, params))
    if name in ("finish", "submit"):
        return "<<< Finished >>>"
    if name in ("execute_bash", "bash"):
        lines = output.splitlines() if output else []
        if len(lines) > 80:
            divider = "-" * 50
            output = "\n".join(
                [*lines[:40], divider, "<Observation truncated in middle for saving context>", divider, *lines[-40:]]
            )
        return f"Exit code: {status}\nExecution output of [{name}]:\n{output}"
    return f"Execution output of [{name}]:\n{output}"


# ---------------------------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    label: str
    name: str
    args: dict[str, str] = field(default_factory=dict)


def E(label: str, **args: str) -> Case:  # noqa: N802
    return Case(label, "file_editor", args)


def B(label: str, cmd: str) -> Case:  # noqa: N802
    return Case(label, "execute_bash", {"cmd": cmd})


def S(label: str, **args: str) -> Case:  # noqa: N802
    return Case(label, "search", args)


BLOCKED = "Bash command '{}' is not allowed. Please use a different command or tool.\n"
UNBOUND = re.compile(r"local variable 'bash_output'")  # the UnboundLocalError text (wording varies by Python)


def _bash_obs(status: str, output: str) -> str:
    return f"Exit code: {status}\nExecution output of [execute_bash]:\n{output}"


def _ran(obs: str) -> bool:
    return "[STDOUT]" in obs


@dataclass(frozen=True)
class Known:
    """A documented difference: `check(r2e, ours)` states how the two observations differ."""

    why: str
    check: Callable[[str, str], bool]


KNOWN_DIFFERENCES: dict[str, Known] = {
    "blocked-words": Known(
        "ours block git/ipython/jupyter/nohup (DeepSWE's r2egym scaffold), the peer cd/ipython/jupyter/pip/nohup",
        lambda r2e, ours: _ran(r2e) and ours == _bash_obs("Error: Exit code 1", BLOCKED.format("git")),
    ),
    "blocked-words:cd": Known(
        "the peer refuses cd, ours run it",
        lambda r2e, ours: r2e == _bash_obs("Error: Exit code 1", BLOCKED.format("cd")) and _ran(ours),
    ),
    "blocked-words:pip": Known(
        "the peer refuses pip, ours run it (pip is not installed in the base image)",
        lambda r2e, ours: r2e == _bash_obs("Error: Exit code 1", BLOCKED.format("pip")) and _ran(ours),
    ),
    "empty-command": Known(
        "the peer crashes on an empty command (IndexError traceback); ours refuse it",
        lambda r2e, ours: "IndexError" in r2e and ours == _bash_obs("Error: Exit code 1", BLOCKED.format("")),
    ),
    "undecodable-output": Known(
        "the peer crashes on output that is not UTF-8 (UnicodeDecodeError); ours show U+FFFD",
        lambda r2e, ours: "UnicodeDecodeError" in r2e and "\ufffd" in ours and ours.startswith("Exit code: 0\n"),
    ),
    "exit-124": Known(
        "R2E-Gym's runtime reports any exit status 124 as a timeout; ours only a real one",
        lambda r2e, ours: (
            r2e == _bash_obs("-1", f"The command took too long to execute (>{STEP_TIMEOUT_S}s)")
            and ours.startswith("Exit code: Error: Exit code 124\n")
        ),
    ),
    "command-environment": Known(
        "commands see our sandbox PATH (repo interpreters first), not R2E-Gym's DOCKER_PATH",
        lambda r2e, ours: DOCKER_PATH in r2e and "/testbed/.venv/bin:/root/.venv/bin" in ours,
    ),
    "output-cap": Known(
        "our sandbox keeps the first and last 128 KiB of a command's output; R2E-Gym's runtime keeps all of it",
        lambda r2e, ours: len(r2e) > 300_000 and len(ours) < 270_000 and "output truncated" in ours,
    ),
    "timeout-leftovers": Known(
        "R2E-Gym's `timeout` kills its process group only, a process in a new session runs on; ours kill it too",
        lambda r2e, ours: "[STDOUT]\n\n1 \n" in r2e and "[STDOUT]\n\n0 \n" in ours,
    ),
    "traceback-text": Known(
        "where both editors crash, the `ERROR: Unhandled exception` line is the same, the traceback is each one's own",
        lambda r2e, ours: all(
            "Traceback (most recent call last)" in obs
            and "ERROR: Unhandled exception: source code string cannot contain null bytes" in obs
            for obs in (r2e, ours)
        ),
    ),
    "missing-path": Known(
        "the peer crashes on a call without `path` (TypeError + traceback); ours name the missing parameter",
        lambda r2e, ours: (
            "ERROR: Unhandled exception: expected str, bytes or os.PathLike object" in r2e
            and "Traceback" in r2e
            and ours == "Execution output of [file_editor]:\nERROR: Missing required parameter 'path'.\n"
        ),
    ),
    "missing-insert-line": Known(
        "the peer crashes on insert without `insert_line` (TypeError + traceback); ours name it",
        lambda r2e, ours: (
            "ERROR: Unhandled exception: '<' not supported" in r2e
            and ours
            == "Execution output of [file_editor]:\nERROR: Missing required parameter 'insert_line' for 'insert'.\n"
        ),
    ),
    "unreadable-file-in-search": Known(
        "the peer's directory search stops with a traceback at a file it cannot open (dangling symlink); ours skip it",
        lambda r2e, ours: (
            "FileNotFoundError" in r2e and "Found 1 matches" in ours and "./links/real.py (1 matches)" in ours
        ),
    ),
    "unknown-tool": Known(
        "R2E-Gym's env fails its assert and the agent shows the resulting UnboundLocalError; ours name the tool",
        lambda r2e, ours: bool(UNBOUND.search(r2e)) and "ERROR: unknown function 'teleport'" in ours,
    ),
    "submit-alias": Known(
        "`submit` is not a registered command in the r2egym scaffold (UnboundLocalError, episode goes on); ours finish",
        lambda r2e, ours: bool(UNBOUND.search(r2e)) and ours == FINISHED_OBSERVATION,
    ),
}


# Differences in what an edit leaves on disk (not in any observation), checked on file bytes.
FILE_DIFFERENCES = {
    "line-ends-and-encoding-kept": "an edit keeps CRLF line ends, a Latin-1 encoding and a UTF-8 BOM; R2E-Gym "
    "writes every edited file as UTF-8 with LF",
    "chardet-guess": "R2E-Gym decodes with chardet's guess, ours UTF-8 then Latin-1",
}


def play(
    rig: Rig, cases: list[Case], snapshot: tuple[str, ...] = ()
) -> tuple[list[tuple[Case, str, str]], dict[str, dict[str, bytes]]]:
    """Both sides from the same fresh tree: all R2E-Gym calls, reset, all of ours. Returns the observations and
    the bytes of the `snapshot` files each side left."""
    labels = [case.label for case in cases]
    assert len(labels) == len(set(labels)), "case labels must be unique"
    files: dict[str, dict[str, bytes]] = {}
    rig.reset()
    theirs = [r2e_observation(rig, case.name, case.args) for case in cases]
    files["r2e"] = {path: rig.box.read_file(path) for path in snapshot}
    rig.reset()
    ours = [rig.toolbox.call(ToolCall(name=case.name, arguments=case.args)).observation for case in cases]
    files["ours"] = {path: rig.box.read_file(path) for path in snapshot}
    return list(zip(cases, theirs, ours, strict=True)), files


def compare(results: list[tuple[Case, str, str]]) -> None:
    """Equal, or the documented difference (a KNOWN_DIFFERENCES key, optionally with a `:detail` suffix)."""
    problems = []
    for case, theirs, ours in results:
        key = case.label if case.label in KNOWN_DIFFERENCES else None
        if key is None:
            if theirs != ours:
                problems.append(f"[{case.label}] {case.name} {case.args}\n--- R2E-Gym:\n{theirs}\n--- ours:\n{ours}")
        elif theirs == ours or not KNOWN_DIFFERENCES[key].check(theirs, ours):
            problems.append(
                f"[{case.label}] documented difference no longer as documented ({KNOWN_DIFFERENCES[key].why})\n"
                f"--- R2E-Gym:\n{theirs}\n--- ours:\n{ours}"
            )
    assert not problems, "\n\n".join(problems)


# ---------------------------------------------------------------------------------------------- the tests

A, BIG = "/testbed/pkg/a.py", "/testbed/pkg/big.py"

VIEW_CASES = [
    E("view dir", command="view", path="/testbed"),
    E("view dir trailing slash", command="view", path="/testbed/pkg/"),
    E("view dir dot-dot path", command="view", path="/testbed/pkg/../pkg/sub"),
    E("view empty path (cwd)", command="view", path=""),
    E("view short .py", command="view", path=A),
    E("view short .py via //", command="view", path="/testbed//pkg/./a.py"),
    E("view short .py concise", command="view", path=A, concise="True"),
    E("view long .py (auto concise)", command="view", path=BIG),
    E("view long .py concise false", command="view", path=BIG, concise="false"),
    E("view long .py range", command="view", path=BIG, view_range="[20, 40]"),
    E("view long .py range to -1", command="view", path=BIG, view_range="[100, -1]"),
    E("view long .py concise + range", command="view", path=BIG, concise="True", view_range="[1, 30]"),
    E("view range start 0", command="view", path=A, view_range="[0, 3]"),
    E("view range end too big", command="view", path=A, view_range="[3, 99]"),
    E("view range end < start", command="view", path=A, view_range="[5, 2]"),
    E("view range one number", command="view", path=A, view_range="[5]"),
    E("view range not numbers", command="view", path=A, view_range="[a, b]"),
    E("view range spaces", command="view", path=A, view_range="2 4"),
    E("view clipped at 10000", command="view", path="/testbed/pkg/huge.py", view_range="[1, -1]"),
    E("view long .py with syntax error", command="view", path="/testbed/pkg/big_bad.py"),
    E("view non-.py file", command="view", path="/testbed/README.txt"),
    E("view missing file", command="view", path="/testbed/nope.py"),
    E("view hidden-dir file", command="view", path="/testbed/.hidden/h.py"),
    E("traceback-text", command="view", path="/testbed/pkg/nul.py", concise="True"),
    E("view file with NUL byte", command="view", path="/testbed/pkg/nul.py"),
    E("unknown command", command="delete", path=A),
    E("unknown parameter", command="view", path=A, foo="1"),
    Case("no command", "file_editor", {"path": A}),
    E("missing-path", command="view"),
]


def test_file_editor_view_matches_r2e(rig):
    compare(play(rig, VIEW_CASES)[0])


EDIT_CASES = [
    E("create new", command="create", path="/testbed/new.py", file_text="A = 1\nB = 2\n"),
    E("create existing", command="create", path="/testbed/new.py", file_text="C = 3\n"),
    E("create no file_text", command="create", path="/testbed/other.py"),
    E("create in missing dir", command="create", path="/testbed/nodir/x.py", file_text="x = 1\n"),
    E("create long (clipped echo)", command="create", path="/testbed/long.py", file_text="z = 0  # pad\n" * 900),
    E("create on a dir", command="create", path="/testbed/pkg", file_text="x"),
    E("str_replace 0 matches", command="str_replace", path=A, old_str="nope", new_str="z"),
    E("str_replace 2 matches", command="str_replace", path=A, old_str="return", new_str="r"),
    E("str_replace 1 match", command="str_replace", path=A, old_str="x + 1", new_str="x + 10"),
    E(
        "str_replace multi-line",
        command="str_replace",
        path=A,
        old_str="def g(y):\n\treturn",
        new_str="def g(y):\n    return",
    ),
    E("str_replace no new_str (delete)", command="str_replace", path=A, old_str="import os\n"),
    E("str_replace no old_str", command="str_replace", path=A, new_str="q"),
    E("str_replace on dir", command="str_replace", path="/testbed/pkg", old_str="a", new_str="b"),
    E("str_replace missing file", command="str_replace", path="/testbed/none.py", old_str="a", new_str="b"),
    E("view after edits", command="view", path=A),
    E("insert at 0", command="insert", path=A, insert_line="0", new_str="# top\n# two"),
    E("insert middle", command="insert", path=A, insert_line="5", new_str="    # inside f"),
    E("insert bad line", command="insert", path=A, insert_line="99", new_str="x"),
    E("insert negative line", command="insert", path=A, insert_line="-1", new_str="x"),
    E("insert not a number", command="insert", path=A, insert_line="two", new_str="x"),
    E("insert no new_str", command="insert", path=A, insert_line="1"),
    E("missing-insert-line", command="insert", path=A, new_str="x"),
    E("undo 1", command="undo_edit", path=A),
    E("undo 2", command="undo_edit", path=A),
    E("undo 3", command="undo_edit", path=A),
    E("undo 4", command="undo_edit", path=A),
    E("undo 5", command="undo_edit", path=A),
    E("undo no more history", command="undo_edit", path=A),
    E("undo never edited", command="undo_edit", path="/testbed/pkg/sub/deep.py"),
    E("undo after create", command="undo_edit", path="/testbed/new.py"),
    B("state after undo", "cat pkg/a.py new.py; ls nodir 2>&1"),
    # enable_linting: R2E-Gym parses it with bool(), so any non-empty value (even "false") turns it on
    E("lint str_replace true", command="str_replace", path=A, old_str="x + 1", new_str="x +", enable_linting="true"),
    E("lint str_replace false", command="str_replace", path=A, old_str="x + 1", new_str="x +", enable_linting="false"),
    E("lint insert", command="insert", path=A, insert_line="1", new_str="def (:", enable_linting="True"),
    E("lint create", command="create", path="/testbed/bad.py", file_text="if x\n", enable_linting="1"),
    E("lint create non-.py", command="create", path="/testbed/bad.txt", file_text="if x\n", enable_linting="1"),
    E("lint empty value = off", command="str_replace", path=A, old_str="x + 1", new_str="x +", enable_linting=""),
    E("no lint: broken edit applies", command="str_replace", path=A, old_str="y * 2", new_str="y *"),
    E("view after a broken edit (concise)", command="view", path=A, concise="True"),
    E("lint ok edit", command="str_replace", path=A, old_str="y *", new_str="y * 3", enable_linting="true"),
]


def test_file_editor_edits_match_r2e(rig):
    compare(play(rig, EDIT_CASES)[0])


CRLF, LATIN1, BOM, OLDMAC = (
    "/testbed/enc/crlf.py",
    "/testbed/enc/latin1.py",
    "/testbed/enc/bom.py",
    "/testbed/enc/oldmac.py",
)
UTF8 = "/testbed/enc/utf8.py"

ENCODING_CASES = [
    E("crlf view", command="view", path=CRLF),
    E("crlf str_replace one line", command="str_replace", path=CRLF, old_str="a = 1", new_str="a = 10"),
    E(
        "crlf str_replace across lines",
        command="str_replace",
        path=CRLF,
        old_str="a = 10\n    return a",
        new_str="return 10",
    ),
    E("crlf insert", command="insert", path=CRLF, insert_line="2", new_str="    # note"),
    E("crlf view after edits", command="view", path=CRLF),
    S("crlf search in file", search_term="return", path=CRLF),
    E("oldmac (lone CR) view", command="view", path=OLDMAC),
    E("oldmac str_replace", command="str_replace", path=OLDMAC, old_str="a = 1\nb", new_str="a = 0\nb"),
    E("bom view", command="view", path=BOM),
    E("bom str_replace", command="str_replace", path=BOM, old_str="y = 2", new_str="y = 3"),
    E("utf8 view", command="view", path=UTF8),
    E("utf8 str_replace", command="str_replace", path=UTF8, old_str="naïve", new_str="naive"),
]
UNDO_ALL_CRLF = [E(f"crlf undo {i}", command="undo_edit", path=CRLF) for i in (1, 2, 3)]


def test_line_ends_and_encodings_match_r2e(rig):
    """Same observations on CRLF, lone-CR, BOM and UTF-8 files; on disk, ours keep CRLF and the BOM
    (`line-ends-and-encoding-kept`)."""
    results, files = play(rig, ENCODING_CASES, snapshot=(CRLF, BOM, OLDMAC, UTF8))
    compare(results)
    crlf_edited = "def f():\n    return 10\n    # note\n\n\ndef g():\n    return 2\n"
    assert files["r2e"][CRLF] == crlf_edited.encode()
    assert files["ours"][CRLF] == crlf_edited.replace("\n", "\r\n").encode()
    assert files["r2e"][BOM] == "x = 'caf\u00e9'\ny = 3\n".encode()
    assert files["ours"][BOM] == "\ufeffx = 'caf\u00e9'\ny = 3\n".encode()
    assert files["r2e"][OLDMAC] == files["ours"][OLDMAC] == b"a = 0\nb = 2\nc = 3\n"
    assert files["r2e"][UTF8] == files["ours"][UTF8]

    results, files = play(rig, ENCODING_CASES + UNDO_ALL_CRLF, snapshot=(CRLF,))
    compare(results)
    original = FIXTURE["enc/crlf.py"]
    assert files["ours"][CRLF] == original
    assert files["r2e"][CRLF] == original.replace(b"\r\n", b"\n")


def test_latin1_file_view_and_edits(rig):
    """R2E-Gym decodes with chardet's guess, ours UTF-8 then Latin-1 (`chardet-guess`): the same text when chardet
    guesses a code page that agrees with Latin-1 on the file's bytes (chardet 5.2: ISO-8859-9), mojibake on
    R2E-Gym's side when it does not (chardet 7.x reads this French text as MacCyrillic). Both outcomes are
    checked. On disk ours stay Latin-1 (`line-ends-and-encoding-kept`), R2E-Gym's become UTF-8."""
    cases = [
        E("latin1 view", command="view", path=LATIN1),
        E("latin1 str_replace", command="str_replace", path=LATIN1, old_str="salut", new_str="hello"),
        E("latin1 insert", command="insert", path=LATIN1, insert_line="1", new_str="SALUT = 1"),
    ]
    rig.reset()
    guess = rig.box.check(
        "/root/.venv/bin/python -c "
        "\"import chardet; print(chardet.detect(open('enc/latin1.py', 'rb').read())['encoding'])\""
    ).strip()
    raw = LATIN1_TEXT.encode("latin-1")
    try:
        theirs_text = raw.decode(guess)
    except (LookupError, UnicodeDecodeError):
        theirs_text = None
    results, files = play(rig, cases, snapshot=(LATIN1,))
    accented = "    return 'café crème à la mode, déjà vu, naïve, Müller, Straße'"
    assert f"     3 {accented}" in results[0][2]
    assert f"\t{accented}" in results[1][2]
    edited = LATIN1_TEXT.replace("salut", "hello").replace("test\n", "test\nSALUT = 1\n")
    assert files["ours"][LATIN1] == edited.encode("latin-1")
    if theirs_text == LATIN1_TEXT:
        compare(results)
        assert files["r2e"][LATIN1] == edited.encode("utf-8")
    elif theirs_text is not None:
        for _case, theirs, ours in results:
            assert theirs != ours
        assert theirs_text.splitlines()[2] in results[0][1], (guess, results[0][1])
        expected = theirs_text.replace("salut", "hello").replace("test\n", "test\nSALUT = 1\n")
        assert files["r2e"][LATIN1] == expected.encode("utf-8")
    else:
        assert "ERROR" in results[0][1], (guess, results[0][1])


SEARCH_CASES = [
    S("search dir default path", search_term="def"),
    S("search dir", search_term="return", path="/testbed/pkg"),
    S("search dir relative", search_term="return", path="pkg"),
    S("search dir no match", search_term="zzz_absent", path="/testbed/pkg"),
    S("search >100 files", search_term="NEEDLE"),
    S("search exactly 101 with dir", search_term="NEEDLE", path="/testbed/many"),
    S("search python_only false (still .py)", search_term="notes", path="/testbed/pkg", python_only="false"),
    S("search python_only empty (all files)", search_term="notes", path="/testbed/pkg", python_only=""),
    S("search file", search_term="def g", path=A),
    S("search file regex chars", search_term="x + 1", path=A),
    S("search file no match", search_term="zzz_absent", path=A),
    S("search missing path", search_term="x", path="/testbed/nope"),
    S("search hidden not searched", search_term="hidden", path="/testbed"),
    S("search file system order", search_term="ORDERTERM"),
    Case("search no term", "search", {"path": "/testbed"}),
    B("make a dangling link", "ln -s /nonexistent links/dangling.py && echo made"),
    S("unreadable-file-in-search", search_term="LINKTERM", path="/testbed/links"),
]


def test_search_matches_r2e(rig):
    compare(play(rig, SEARCH_CASES)[0])


BASH_CASES = [
    B("bash echo", "echo hello"),
    B("bash no output", "true"),
    B("bash stderr and stdout", "echo out; echo err >&2"),
    B("bash long output", "seq 1 200"),
    B("bash 81 lines", "seq 1 79"),
    B("bash non-zero exit", "echo oops >&2; exit 3"),
    B("bash killed by a signal", "echo before; kill -9 $$"),
    B("bash child killed by a signal", "sh -c 'kill -TERM $$'"),
    B("bash timeout", "sleep 8"),
    B("bash timeout, setsid", "setsid sleep 9"),
    B("timeout-leftovers", "ps -eo args | grep -c '^sleep [89]$'"),
    B("bash CR and CRLF output", "printf 'a\\r\\nb\\rc\\n'"),
    B("bash ANSI on success", "printf '\\033[31mred\\033[0m\\n'"),
    B("bash ANSI on failure", "printf '\\033[31mred\\033[0m\\r\\n'; exit 2"),
    B("bash cwd", "pwd"),
    B("bash python on PATH", "python -c 'import sys; print(sys.version_info[0])'"),
    B("bash fresh shell per call", "echo ${FOO:-unset}"),
    B("bash ipython blocked", "ipython -c 1"),
    B("bash nohup blocked", "nohup true"),
    B("blocked-words", "git status"),
    B("blocked-words:cd", "cd /tmp"),
    B("blocked-words:pip", "pip --version"),
    B("empty-command", ""),
    B("undecodable-output", "printf 'ok \\377\\n'"),
    B("exit-124", "exit 124"),
    B("command-environment", "echo $PATH"),
    B("output-cap", "python3 -c \"print('a' * 300000)\""),
    Case("bash no cmd", "execute_bash", {}),
]


def test_execute_bash_matches_r2e(rig):
    compare(play(rig, BASH_CASES)[0])


FINISH_CASES = [
    Case("finish submit", "finish", {"command": "submit"}),
    Case("finish with result", "finish", {"command": "submit", "result": "done"}),
    Case("unknown-tool", "teleport", {}),
    Case("submit-alias", "submit", {}),
]


def test_finish_and_unknown_tools_match_r2e(rig):
    compare(play(rig, FINISH_CASES)[0])


@pytest.mark.parametrize("line", ["finish submit --result x", "finish submit", "finish stop", "finish"])
def test_finish_script_output_matches_r2e(rig, line):
    """The finish script itself (the agent path never runs it, both sides answer from the call's name)."""
    theirs = r2e_run(rig, line, path=R2E_PATH)
    ours = r2e_run(rig, line, path=DOCKER_PATH)  # /usr/local/bin/finish: ours
    assert theirs == ours


def test_every_known_difference_is_played_and_documented():
    played = {
        case.label
        for cases in (VIEW_CASES, EDIT_CASES, ENCODING_CASES, SEARCH_CASES, BASH_CASES, FINISH_CASES)
        for case in cases
    }
    assert set(KNOWN_DIFFERENCES) <= played, set(KNOWN_DIFFERENCES) - played
    text = DOCS.read_text()
    assert DOCS_SECTION in text
    section = text.split(DOCS_SECTION, 1)[1].split("\n## ", 1)[0]
    keys = {key.split(":")[0] for key in KNOWN_DIFFERENCES} | set(FILE_DIFFERENCES)
    missing = sorted(key for key in keys if f"`{key}`" not in section)
    assert not missing, f"not in docs/sandbox.md's differences section: {missing}"
