"""The expert backend: its edit derivation on hand-made files and patches, one episode through the real agent loop
and the real tool scripts on a local copy of a repository (no Docker), and every task of the bundled ``mini``
suite solved in real containers (marked docker)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from agent_runner.backend_settings import ExpertConfig
from agent_runner.backends import ModelError, make_backend
from agent_runner.backends.expert import ExpertModel
from agent_runner.backends.expert_diffs import EditError, parse_patch
from agent_runner.backends.expert_exploration import package_imports, parse_view, parse_wc, search_symbol
from agent_runner.backends.expert_plan import FileText, edit_candidates, locate
from agent_runner.config import AgentConfig, EpisodeSpec
from agent_runner.loaded_models import backend_for
from agent_runner.parsing import parse_response
from agent_runner.records import Message
from env.sandbox.tools import SCRIPTS_DIR, ToolBox
from tests.conftest import docker_status, require, run_task_episode

from .conftest import TinyTask, run_loop

# -- helpers ---------------------------------------------------------------------------------------------------


def git_diff(before: str, after: str, path: str = "pkg/mod.py") -> str:
    """The unified diff git makes between two versions of one file (``git diff --no-index``)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp, "a", path), Path(tmp, "b", path)
        a.parent.mkdir(parents=True)
        b.parent.mkdir(parents=True)
        a.write_text(before)
        b.write_text(after)
        out = subprocess.run(
            ["git", "diff", "--no-index", "--no-color", "--no-prefix", f"a/{path}", f"b/{path}"],
            cwd=tmp,
            capture_output=True,
            text=True,
        ).stdout
    return out


def editor(text: str, edit) -> str:
    """What file_editor does with the edit's values (as sent: stripped) to a file's text."""
    if edit.command == "insert":
        lines = text.split("\n")
        return "\n".join(lines[: edit.insert_line] + edit.new_str.split("\n") + lines[edit.insert_line :])
    assert text.count(edit.old_str) == 1, edit.old_str
    return text.replace(edit.old_str, edit.new_str)


def solve(before: str, after: str, path: str = "pkg/mod.py") -> tuple[str, list]:
    """Derive and apply (as the tool would) the edits of the diff before -> after, as the expert does."""
    (patch,) = parse_patch(git_diff(before, after, path))
    known, text, offset, edits = FileText.of(before), before, 0, []
    for index, hunk in enumerate(patch.hunks):
        label = f"hunk {index + 1} of {path} ({hunk.title})"
        at = locate(known, hunk, offset, label)
        edit = next(edit_candidates(known, hunk, at, label))
        text = editor(text, edit)
        known.apply(edit)
        edits.append(edit)
        offset = at - (hunk.old_start - 1) + hunk.new_len - hunk.old_len
    return text, edits


VIEW_LINE = re.compile(r"^ *\d+ (.*)$")


def copied_from_a_view(old_str: str, observations: list[str]) -> bool:
    """``old_str`` is a run of consecutive lines of one earlier file view (its first line may have lost its
    indentation, its last line trailing blanks, to the parser's strip)."""
    want = old_str.split("\n")
    for observation in observations:
        shown = [m.group(1) for m in map(VIEW_LINE.match, observation.split("\n")) if m]
        for start in range(len(shown) - len(want) + 1):
            got = shown[start : start + len(want)]
            if all(
                w == g or (k == 0 and w == g.lstrip()) or (k == len(want) - 1 and w in (g.rstrip(), g.strip()))
                for k, (w, g) in enumerate(zip(want, got, strict=True))
            ):
                return True
    return False


def check_trajectory(turns) -> None:
    """Every str_replace copies its old_str from an earlier view; no thought holds a line of any old_str."""
    olds = []
    for index, turn in enumerate(turns):
        arguments = turn.action.arguments if turn.action else {}
        if arguments.get("command") == "str_replace":
            assert copied_from_a_view(arguments["old_str"], [t.observation for t in turns[:index]]), arguments
            olds.append(arguments["old_str"])
    lines = {line.strip() for old in olds for line in old.split("\n") if line.strip()}
    for turn in turns:
        assert turn.thought and not [line for line in lines if line in turn.thought], turn.thought
        assert "`" not in turn.thought and "(" not in turn.thought


# -- patch parsing and reading observations ----------------------------------------------------------------------


def test_parse_patch_reads_modified_added_deleted_and_binary_files():
    patch = textwrap.dedent("""\
        diff --git a/pkg/a.py b/pkg/a.py
        index 1..2 100644
        --- a/pkg/a.py
        +++ b/pkg/a.py
        @@ -1,3 +1,3 @@ def f():
         x = 1
        -y = 2
        +y = 3
         z = 4
        \\ No newline at end of file
        diff --git a/pkg/new.py b/pkg/new.py
        new file mode 100644
        --- /dev/null
        +++ b/pkg/new.py
        @@ -0,0 +1,2 @@
        +A = 1
        +B = 2
        diff --git a/pkg/empty.py b/pkg/empty.py
        new file mode 100644
        index 0000000..e69de29
        diff --git a/old.py b/old.py
        deleted file mode 100644
        --- a/old.py
        +++ /dev/null
        @@ -1 +0,0 @@
        -gone = True
        diff --git a/img.png b/img.png
        Binary files a/img.png and b/img.png differ
        """)
    modified, added, empty, deleted, binary = parse_patch(patch)
    assert (modified.kind, modified.path, len(modified.hunks)) == ("modified", "pkg/a.py", 1)
    hunk = modified.hunks[0]
    assert (hunk.header, hunk.old_lines, hunk.new_lines) == (
        "def f():",
        ["x = 1", "y = 2", "z = 4"],
        ["x = 1", "y = 3", "z = 4"],
    )
    assert hunk.core() == (1, 2, ["y = 3"])
    assert (added.kind, added.path, added.new_content()) == ("added", "pkg/new.py", "A = 1\nB = 2\n")
    assert (empty.kind, empty.path, empty.new_content()) == ("added", "pkg/empty.py", "")
    assert (deleted.kind, deleted.path) == ("deleted", "old.py")
    assert binary.binary
    with pytest.raises(EditError, match="does not fit its header"):
        parse_patch("--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n x\n*y\n")


def test_parse_view_strips_the_r2e_prefix_and_drops_a_clipped_line():
    observation = (
        "Execution output of [file_editor]:\nHere's the result of running `cat -n` on the file: /testbed/a.py:\n"
        "     7 def f():\n     8     return 1\n     9 \n    10 x = 2<response clipped><NOTE>...</NOTE>\n"
        "Steps Remaining: 30"
    )
    assert parse_view(observation, 7) == ["def f():", "    return 1", ""]
    assert parse_view(observation, 1) == []
    wc = "[STDOUT]\n\n    9   278 argkit/__init__.py\n  174  6690 ./argkit/parser.py\n  183  6968 total \n"
    assert parse_wc(wc) == {"argkit/__init__.py": (9, 278), "argkit/parser.py": (174, 6690)}


def test_what_to_search_for_and_which_modules_a_file_imports():
    method = (
        "--- a/m.py\n+++ b/m.py\n@@ -5,1 +5,1 @@ def compute(self, value):\n-        return value\n+        return 0\n"
    )
    assert search_symbol(parse_patch(method)) == "compute"
    before = (
        "import os\n\n\nclass Box:\n    def compute(self, value):\n        a = 1\n        b = 2\n        return value\n"
    )
    assert search_symbol(parse_patch(git_diff(before, before.replace("return value", "return a")))) == "Box"
    bare = "--- a/m.py\n+++ b/m.py\n@@ -1,1 +1,1 @@\n-total = compute_total(self.items)\n+total = 0\n"
    assert search_symbol(parse_patch(bare)) == "total"
    lines = ["from pkg.spec import Option, dest_for", "from .errors import Err", "from . import help", "import os"]
    found = package_imports("pkg/parser.py", lines)
    assert found[:2] == ["pkg/spec.py", "pkg/spec/__init__.py"]
    assert "pkg/errors.py" in found and "pkg/help.py" in found and not any("os" in p.split("/") for p in found)


# -- edit derivation -------------------------------------------------------------------------------------------


def test_the_context_grows_until_it_is_unique():
    before = "def a():\n    x = 1\n    return x\n\n\ndef b():\n    x = 1\n    return x + 1\n"
    after = before.replace("    x = 1\n    return x + 1", "    x = 2\n    return x + 1")
    text, (edit,) = solve(before, after)
    assert text == after
    assert edit.old_str == "def b():\n    x = 1"  # "x = 1" alone occurs twice; one more line above: unique
    assert edit.new_str == "def b():\n    x = 2"


def test_several_hunks_in_one_file_each_copy_from_the_file_as_edited_so_far():
    body = "".join(
        f'def f{i}(items):\n    """Sum."""\n    total = 0\n    for item in items:\n        total += item\n'
        "    # done\n    return total\n\n\n"
        for i in range(3)
    )
    after = body.replace("        total += item\n", "        total += item * 2\n")
    text, edits = solve(body, after)
    assert text == after and len(edits) == 3
    assert all("total += item" in e.old_str and "total += item * 2" in e.new_str for e in edits)
    # the last hunk's context must not match the earlier functions, whose edited lines still contain it
    assert edits[-1].old_str.count("\n") >= 1


def test_a_pure_insertion_is_anchored_on_a_neighbouring_line():
    before = '"""Doc."""\n\nimport os\nimport sys\n\n\ndef main():\n    return sys.argv\n'
    after = before.replace("import os\n", "import os\nimport re\n")
    text, (edit,) = solve(before, after)
    assert text == after
    assert edit.command == "str_replace" and edit.old_str == "import os" and edit.new_str == "import os\nimport re"


def test_an_insertion_into_an_empty_file_uses_insert():
    known = FileText(0)
    (patch,) = parse_patch("--- a/pkg/__init__.py\n+++ b/pkg/__init__.py\n@@ -0,0 +1,2 @@\n+A = 1\n+B = 2\n")
    (edit,) = list(edit_candidates(known, patch.hunks[0], locate(known, patch.hunks[0], 0, "h"), "h"))
    assert (edit.command, edit.insert_line, edit.new_str) == ("insert", 0, "A = 1\nB = 2")


def test_the_parsers_stripping_is_accounted_for():
    # a changed indentation: stripped, "x = 1" -> "x = 1" would change nothing; the context starts at column 0
    before = "def f():\n    x = 1\n    return x\n"
    after = "def f():\n        x = 1\n    return x\n"
    text, (edit,) = solve(before, after)
    assert text == after and edit.old_str.startswith("def f():")
    # a deleted line: replacing it by "" would leave its newline; a kept neighbour goes with it
    before = "a = 1\nb = 2\nb = 2\nc = 3\n"
    text, (edit,) = solve(before, "a = 1\nb = 2\nc = 3\n")
    assert text == "a = 1\nb = 2\nc = 3\n" and edit.new_str
    # trailing blank lines added at the end of a block survive only inside a context
    before = "def f():\n    return 1\ndef g():\n    return 2\n"
    after = "def f():\n    return 1\n\n\ndef g():\n    return 2\n"
    text, _ = solve(before, after)
    assert text == after
    # a value starting with "-" would be read as an option by the tool's argparse: never the first line
    before = "X = [\n    1,\n]\nY = -1\nZ = 0\n"
    text, (edit,) = solve(before, before.replace("Y = -1", "Y = -2"))
    assert text == before.replace("Y = -1", "Y = -2") and not edit.old_str.startswith("-")


def test_a_hunk_that_is_not_in_the_viewed_content_is_an_error_naming_it():
    (patch,) = parse_patch(git_diff("a = 1\nb = 2\nc = 3\n", "a = 1\nb = 5\nc = 3\n"))
    known = FileText.of("a = 1\nb = 4\nc = 3\n")
    with pytest.raises(EditError, match=r"hunk 1 of pkg/mod.py \(@@ -1,3 \+1,3 @@\).*line 2 reads 'b = 4'"):
        locate(known, patch.hunks[0], 0, "hunk 1 of pkg/mod.py (@@ -1,3 +1,3 @@)")
    unseen = FileText(3)
    with pytest.raises(EditError, match="were not viewed"):
        locate(unseen, patch.hunks[0], 0, "hunk 1 of pkg/mod.py")


# -- the model, driven by hand ---------------------------------------------------------------------------------

TASK_PATCH = git_diff("def f():\n    return 1\n", "def f():\n    return 2\n")


def drive(model: ExpertModel, observations: list[str]) -> list:
    """Call the model once per observation (the first call sees the task), returning the parsed actions."""
    messages = [Message(role="system", content="s"), Message(role="user", content="task")]
    actions = []
    for observation in [None, *observations]:
        if observation is not None:
            messages += [Message(role="assistant", content="..."), Message(role="user", content=observation)]
        actions.append(parse_response(model.complete(list(messages)).text))
    return actions


def test_a_view_that_does_not_show_the_hunk_is_a_model_error_naming_it():
    wc = "Exit code: 0\nExecution output of [execute_bash]:\n 2 25 pkg/mod.py\n"
    view = "Execution output of [file_editor]:\nHere's the result...:\n     1 def f():\n     2     return 3\n"
    model = ExpertModel(TinyTask(patch=TASK_PATCH), config=ExpertConfig(explore_chars=0))
    actions = drive(model, ["Found 1 matches", wc])
    assert [a.call.name for a in actions] == ["search", "execute_bash", "file_editor"]
    assert actions[2].call.arguments == {"command": "view", "path": "/testbed/pkg/mod.py", "view_range": "[1, -1]"}
    model = ExpertModel(TinyTask(patch=TASK_PATCH), config=ExpertConfig(explore_chars=0))
    with pytest.raises(ModelError, match=r"hunk 1 of pkg/mod.py \(@@ -1,2 \+1,2 @@\): .*'    return 3'"):
        drive(model, ["Found 1 matches", wc, view])
    with pytest.raises(ModelError, match="asked for turn 4 but it failed at turn 4"):
        model.complete([Message(role="user", content="x")])


def test_the_expert_submits_once_and_then_refuses_more_turns():
    wc = "Exit code: 0\nExecution output of [execute_bash]:\n 2 25 pkg/mod.py\n"
    view = "Execution output of [file_editor]:\nHere's the result...:\n     1 def f():\n     2     return 1\n"
    edited = "The file /testbed/pkg/mod.py has been edited. ..."
    model = ExpertModel(TinyTask(patch=TASK_PATCH), config=ExpertConfig(explore_chars=0))
    actions = drive(model, ["Found 1 matches", wc, view, edited])
    edit = actions[3].call.arguments
    assert (edit["command"], edit["old_str"], edit["new_str"]) == ("str_replace", "return 1", "return 2")
    assert actions[-1].call.name == "finish" and actions[-1].call.arguments == {"command": "submit"}
    with pytest.raises(ModelError, match="asked for turn 6 but it submitted at turn 5"):
        model.complete([Message(role="user", content="<<< Finished >>>")])
    model.reset(seed=0)
    assert [a.call.name for a in drive(model, ["Found 1 matches", wc, view, edited])] == [a.call.name for a in actions]


def test_a_long_file_is_viewed_in_a_window_and_a_context_the_editor_finds_twice_is_widened():
    patch = "--- a/pkg/big.py\n+++ b/pkg/big.py\n@@ -1999,3 +1999,3 @@ def f():\n a = 1\n-b = 2\n+b = 3\n c = 4\n"
    wc = "Exit code: 0\nExecution output of [execute_bash]:\n 5000 200000 pkg/big.py\n"
    shown = {1999: "a = 1", 2000: "b = 2", 2001: "c = 4"}
    view = "Execution output of [file_editor]:\nHere's the result of running `cat -n` on the file: ...\n" + "\n".join(
        f"{n:6d} {shown.get(n, f'x{n} = 0')}" for n in range(1979, 2022)
    )
    twice = "Execution output of [file_editor]:\nERROR: Multiple occurrences of 'b = 2' found in /testbed/pkg/big.py."
    edited = "The file /testbed/pkg/big.py has been edited."
    model = ExpertModel(TinyTask(patch=patch), config=ExpertConfig(explore_chars=0))
    actions = drive(model, ["Found 1 matches", wc, view, twice, edited])
    assert actions[2].call.arguments["view_range"] == "[1979, 2021]"  # the hunk with 20 lines around it
    first, wider = actions[3].call.arguments, actions[4].call.arguments
    assert (first["old_str"], first["new_str"]) == ("b = 2", "b = 3")
    assert (wider["old_str"], wider["new_str"]) == ("a = 1\nb = 2", "a = 1\nb = 3") and "widen" in actions[4].thought
    assert actions[5].call.name == "finish"


def test_a_binary_or_non_python_patch_is_refused_at_the_first_turn():
    binary = "diff --git a/a.png b/a.png\nBinary files a/a.png and b/a.png differ\n"
    with pytest.raises(ModelError, match="a binary patch"):
        drive(ExpertModel(TinyTask(patch=binary)), [])
    text = git_diff("a\n", "b\n", "README.md")
    with pytest.raises(ModelError, match="README.md: not a .py file"):
        drive(ExpertModel(TinyTask(patch=text)), [])
    with pytest.raises(ValueError, match="gold patch"):
        ExpertModel(TinyTask())


def test_config_registry_and_backend_for():
    with pytest.raises(ValidationError):
        ExpertConfig(explore_chars=-1)
    with pytest.raises(ValidationError):
        ExpertConfig(max_chars=0)
    config = ExpertConfig(explore_chars=0)
    task = TinyTask(patch=TASK_PATCH)
    assert isinstance(make_backend("expert", task=task, config=config), ExpertModel)
    where = {"suite": "mini", "protocol": "true_eviction", "seed": 0, "grade": True}
    spec = EpisodeSpec(task_id=task.instance_id, backend="expert", eviction={"method": "dense"}, expert=config, **where)
    model = backend_for(spec, task)
    assert isinstance(model, ExpertModel) and model.config == config
    with pytest.raises(ValueError, match="dense"):
        backend_for(EpisodeSpec(task_id="x", backend="expert", eviction={"method": "nexus"}, **where), task)
    from jobs.spec import JobSpec

    job = JobSpec.from_dict({"backend": "expert", "methods": ["dense"], "expert": {"explore_chars": 100}})
    assert job.episode_config("t", "dense", "prefill_decode", "true_eviction", 0).expert.explore_chars == 100


# -- one episode through the loop, with the real tool scripts on a local repository ---------------------------


class LocalSandbox:
    """Runs a rendered tool command line on the host, with ``/testbed`` mapped to a local git repository and
    the real tool scripts on PATH (the editor's undo state kept beside the repository)."""

    def __init__(self, repo: Path, bin_dir: Path) -> None:
        self.repo, self.bin_dir = repo, bin_dir
        bin_dir.mkdir()
        for name in ("file_editor", "search", "execute_bash"):
            source = (SCRIPTS_DIR / f"{name}.py").read_text()
            source = source.replace('"/var/tmp/editor_state.json"', repr(str(bin_dir / "state.json")))
            script = bin_dir / name
            script.write_text(f"#!{sys.executable}\n{source}")
            script.chmod(0o755)

    def run(self, command: str, timeout: float | None = None, workdir: str = "/testbed"):
        env = {
            **os.environ,
            "PATH": f"{self.bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        proc = subprocess.run(
            ["bash", "-c", command.replace("/testbed", str(self.repo))],
            cwd=workdir.replace("/testbed", str(self.repo)),
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        output = (proc.stdout + proc.stderr).replace(str(self.repo), "/testbed")
        return SimpleNamespace(exit_code=proc.returncode, output=output, timed_out=False)


class LocalEnvironment:
    def __init__(self, repo: Path, bin_dir: Path) -> None:
        self.repo, self.toolbox = repo, ToolBox(LocalSandbox(repo, bin_dir))

    def step(self, call):
        return self.toolbox.call(call)

    def diff(self) -> str:
        subprocess.run(["git", "add", "-A"], cwd=self.repo, check=True)
        return subprocess.run(["git", "diff", "--cached"], cwd=self.repo, capture_output=True, text=True).stdout

    def close(self) -> None:
        pass


CART = '''from shop.pricing import discount, with_tax


class Cart:
    """A shopping cart."""

    def __init__(self):
        self.items = []

    def add(self, name, price, qty=1):
        self.items.append((name, price, qty))

    def subtotal(self):
        total = 0
        for name, price, qty in self.items:
            total += price
        return total

    def count(self):
        return sum(qty for _, _, qty in self.items)

    def names(self):
        return [name for name, _, _ in self.items]

    def total(self, percent=0):
        total = 0
        for name, price, qty in self.items:
            total += price
        return with_tax(discount(total, percent))
'''
PRICING = '''"""Prices."""

TAX = 0.2


def with_tax(amount):
    return round(amount * (1 + TAX), 2)


def discount(amount, percent):
    total = amount
    total = amount
    return total - total * percent / 100
'''
TEST_CART = """from shop.cart import Cart


def test_add():
    cart = Cart()
    cart.add("tea", 2.0)
    assert cart.names() == ["tea"]
"""


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def _write(root: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


def make_shop_task(repo: Path) -> tuple[SimpleNamespace, dict[str, str]]:
    """A small repository at its base state and a task whose fix edits two files (one hunk needs a wider
    context, one is a pure deletion) and adds a module in a new folder; the test patch extends a test file and
    adds one."""
    base = {
        ".gitignore": ".pytest_cache/\n__pycache__/\n",
        "shop/__init__.py": "from shop.cart import Cart\n",
        "shop/cart.py": CART,
        "shop/pricing.py": PRICING,
        "tests/test_cart.py": TEST_CART,
    }
    _write(repo, base)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    fixed = {
        "shop/cart.py": CART.replace("total += price\n", "total += price * qty\n"),
        "shop/pricing.py": PRICING.replace("    total = amount\n    total = amount\n", "    total = amount\n"),
        "shop/formats/money.py": 'def money(amount):\n    return f"{amount:.2f} EUR"\n',
    }
    _write(repo, fixed)
    _git(repo, "add", "-A")
    patch = _git(repo, "diff", "--cached")
    _git(repo, "reset", "-q", "--hard")
    _write(
        repo,
        {
            "tests/test_cart.py": TEST_CART
            + '\n\ndef test_quantities():\n    cart = Cart()\n    cart.add("tea", 2.0, qty=3)\n'
            + "    assert cart.subtotal() == 6.0\n    assert cart.total() == 7.2\n",
            "tests/test_money.py": "from shop.formats.money import money\n\n\n"
            + 'def test_money():\n    assert money(2) == "2.00 EUR"\n',
        },
    )
    _git(repo, "add", "-A")
    test_patch = _git(repo, "diff", "--cached")
    _git(repo, "reset", "-q", "--hard")
    _git(repo, "clean", "-qfd")
    task = SimpleNamespace(
        instance_id="demo__shop-1",
        problem_statement="Cart totals ignore quantities.",
        patch=patch,
        test_patch=test_patch,
        FAIL_TO_PASS=["tests/test_cart.py::test_quantities", "tests/test_money.py::test_money"],
    )
    return task, fixed


def test_an_episode_through_the_loop_with_the_real_tools_on_a_local_repository(tmp_path):
    repo = tmp_path / "repo"
    task, fixed = make_shop_task(repo)
    env = LocalEnvironment(repo, tmp_path / "bin")
    model = ExpertModel(task, config=ExpertConfig(explore_chars=3000))
    result = run_loop(model, env, task, AgentConfig())
    assert result.exit_status == "submitted", result.error
    names = [(t.action.name, t.action.arguments.get("command")) for t in result.turns]
    assert names[:3] == [("search", None), ("execute_bash", None), ("file_editor", "view")]
    assert names[-1] == ("finish", "submit")
    runs = [t for t in result.turns if "pytest" in (t.action.arguments.get("cmd") or "")]
    assert len(runs) == 2 and runs[0].observation.startswith("Exit code: Error")  # the new module is missing
    assert runs[1].observation.startswith("Exit code: 0") and "2 passed" in runs[1].observation
    assert any("mkdir -p shop/formats" in (t.action.arguments.get("cmd") or "") for t in result.turns)
    edits = [t.action.arguments for t in result.turns if t.action.arguments.get("command") == "str_replace"]
    assert len(edits) == 4  # one into the test file, three hunks of the fix
    assert all("has been edited" in t.observation for t in result.turns if t.action.arguments.get("old_str"))
    check_trajectory(result.turns)
    for path, text in fixed.items():
        assert (repo / path).read_text().rstrip("\n") == text.rstrip("\n"), path
    assert (repo / "tests/test_cart.py").read_text() == TEST_CART and not (repo / "tests/test_money.py").exists()
    assert sorted(re.findall(r"^\+\+\+ b/(\S+)", env.diff(), re.M)) == sorted(fixed)


# -- every task of the mini suite, in real containers ----------------------------------------------------------


@pytest.mark.docker
@pytest.mark.slow
def test_the_expert_resolves_every_mini_task_in_real_containers():
    ready, reason = docker_status()
    require(ready, reason)
    from env.tasks.loading import load_suite

    tasks = load_suite("mini")
    assert len(tasks) == 16

    def episode(task):
        started = time.monotonic()
        result = run_task_episode(task, ExpertModel(task))
        return task, result, time.monotonic() - started

    with ThreadPoolExecutor(max_workers=4) as pool:
        outcomes = list(pool.map(episode, tasks))
    report = []
    for task, result, seconds in outcomes:
        chars = sum(len(t.observation) for t in result.turns)
        report.append(f"{task.instance_id}: {result.status} turns={len(result.turns)} chars={chars} {seconds:.1f}s")
    print("\n".join(report))
    for task, result, _ in outcomes:
        assert (result.exit_status, result.status) == ("submitted", "resolved"), (
            task.instance_id,
            result.error,
            result.grade,
        )
        check_trajectory(result.turns)
        chars = sum(len(t.observation) for t in result.turns)
        # no exploration by default: 5K-16K characters, 4.5K-7.7K SmolLM2 tokens with the system prompt
        assert 4000 <= chars <= 20000, (task.instance_id, chars)
