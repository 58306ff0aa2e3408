"""R2E-native gold patches rebuilt from `parsed_commit_content` (env.tasks.r2e_gold_patch).

The commits are made here, in throwaway git repositories (`SCENARIOS`). `data/r2e_parsed_commits.json` holds,
for each, the `parsed_commit_content` R2E-Gym's own parser (`r2egym.commit_models.parse_diff.CommitParser`)
wrote for that commit and the row's `patch`: git's diff of the files R2E-Gym's gold patch keeps. Rows that
carry both must agree; the peer test reruns R2E-Gym's parser and its gold patch on the same commits (set
`NEXUS_R2EGYM_PEER` to an R2E-Gym checkout with `src/r2egym/commit_models`), and regenerates the data file
with `python -m tests.env.grading.test_r2e_gold_patch` when the recipes change.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from env.tasks.loading import TaskError, load_tasks, task_from_row
from env.tasks.r2e_gold_patch import r2e_gold_patch, r2e_is_test_file
from nexus_eval.cli import app
from tests.conftest import docker_status, r2egym_peer, require
from tests.mimic import projects as mimic

DATA = Path(__file__).resolve().parent / "data" / "r2e_parsed_commits.json"
# Fixed identities and dates, and no user or system git config: the same commits (and hashes) every time.
GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "nexus",
    "GIT_AUTHOR_EMAIL": "nexus@example.invalid",
    "GIT_COMMITTER_NAME": "nexus",
    "GIT_COMMITTER_EMAIL": "nexus@example.invalid",
    "GIT_AUTHOR_DATE": "2024-05-06T07:08:09+00:00",
    "GIT_COMMITTER_DATE": "2024-05-06T07:08:09+00:00",
}

CORE = """import os


class Store:
    def get(self, key):
        return self.data[key]

    def put(self, key, value):
        self.data[key] = value


def one():
    return 1


def two():
    return 2


def three():
    return 3


def four():
    return 4


def five():
    return 5
"""
CORE_FIXED = (
    CORE.replace("import os\n", "import os\nimport sys\n")
    .replace("return self.data[key]", "return self.data.get(key)")
    .replace("def five():\n    return 5\n", "def five():\n    return 5.0\n")
)
# Each scenario: the files at the base commit, the files the fix commit writes (None deletes one), the files
# it makes executable, and the gold files R2E-Gym keeps (its non-test .py files), spelled out by hand.
SCENARIOS: dict[str, dict] = {
    "mixed": {
        "base": {
            "README.md": "# demo\n",
            "pkg/__init__.py": "",
            "pkg/core.py": CORE,
            "pkg/gone.py": "GONE = 'this module is deleted by the fix'\n",
            "pkg/fast.pyx": "cdef int x = 1\n",
            "pkg/script.py": "print('run')\n",
            "pkg/modeonly.py": "print('mode')\n",
            "pkg/testing.py": "HELPER = 1\n",
            "pkg/core_test.py": "def test_core():\n    pass\n",
            "pkg/tests/helpers.py": "X = 1\n",
            "pkg/Test/case.py": "X = 1\n",
            "test_top.py": "def test_top():\n    pass\n",
            "tests/test_core.py": "def test_one():\n    assert True\n",
            "café.py": "NAME = 'cafe'\n",
            "zlast.py": "A = 1\nB = 2",
        },
        "fix": {
            "README.md": "# demo\n\nFixed.\n",
            "pkg/core.py": CORE_FIXED,
            "pkg/gone.py": None,
            "pkg/new.py": "def brand_new():\n    return 'new'\n",
            "pkg/empty.py": "",
            "pkg/fast.pyx": "cdef int x = 2\n",
            "pkg/script.py": "print('run fixed')\n",
            "pkg/testing.py": "HELPER = 2\n",
            "pkg/core_test.py": "def test_core():\n    assert True\n",
            "pkg/tests/helpers.py": "X = 2\n",
            "pkg/Test/case.py": "X = 2\n",
            "test_top.py": "def test_top():\n    assert True\n",
            "tests/test_core.py": "def test_one():\n    assert True\n\n\ndef test_two():\n    assert True\n",
            "café.py": "NAME = 'café'\n",
            "zlast.py": "A = 1\nB = 3",
        },
        "chmod": ["pkg/script.py", "pkg/modeonly.py"],
        "gold": [
            "café.py",
            "pkg/core.py",
            "pkg/empty.py",
            "pkg/gone.py",
            "pkg/modeonly.py",
            "pkg/new.py",
            "pkg/script.py",
            "pkg/testing.py",
            "zlast.py",
        ],
    },
    "one_file": {
        "base": {"lib/util.py": "def f():\n    return 1\n"},
        "fix": {"lib/util.py": "def f():\n    return 2\n"},
        "chmod": [],
        "gold": ["lib/util.py"],
    },
    "tests_only": {
        "base": {"src/a.py": "A = 1\n", "tests/test_a.py": "def test_a():\n    pass\n"},
        "fix": {"tests/test_a.py": "def test_a():\n    assert True\n", "docs/a.md": "about a\n"},
        "chmod": [],
        "gold": [],
    },
    # the R2E-native mimic image's project (tests/mimic): the fix of mul, a hidden-side test and a note
    "calcpkg": {
        "base": {"calcpkg/__init__.py": "", "calcpkg/ops.py": mimic.R2E_OPS, "setup.cfg": "[metadata]\n"},
        "fix": {
            "calcpkg/ops.py": mimic.R2E_OPS.replace(
                "def mul(a, b):\n    return a + b", "def mul(a, b):\n    return a * b"
            ),
            "tests/test_ops.py": "from calcpkg.ops import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n",
            "CHANGES.md": "- mul multiplies\n",
        },
        "chmod": [],
        "gold": ["calcpkg/ops.py"],
    },
}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def write_files(repo: Path, files: dict[str, str | None]) -> None:
    for rel, text in files.items():
        path = repo / rel
        if text is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def make_commit(root: Path, name: str) -> tuple[Path, str, str]:
    """The scenario's repository with its base and fix commits: (repo, base sha, fix sha)."""
    scenario = SCENARIOS[name]
    repo = root / name
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    write_files(repo, scenario["base"])
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    write_files(repo, scenario["fix"])
    for rel in scenario["chmod"]:
        (repo / rel).chmod(0o755)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", f"fix {name}")
    return repo, git(repo, "rev-parse", "HEAD^").strip(), git(repo, "rev-parse", "HEAD").strip()


def gold_diff(repo: Path, base: str, fix: str, paths: list[str]) -> str:
    """git's own diff of the gold files (what a row's `patch` holds)."""
    return git(repo, "diff", "-p", base, fix, "--", *paths) if paths else ""


def stored() -> dict[str, dict[str, str]]:
    return json.loads(DATA.read_text())


def r2e_row(**fields) -> dict:
    row = {
        "repo_name": "demo",
        "docker_image": "namanjain12/demo_final:0123456789abcdef0123456789abcdef01234567",
        "problem_statement": "[ISSUE]something is wrong[/ISSUE]",
        "expected_output_json": json.dumps({"test_a": "PASSED"}),
    }
    return {**row, **fields}


# ------------------------------------------------------------------ rows that carry both: they must agree


@pytest.mark.parametrize("name", sorted(name for name, scenario in SCENARIOS.items() if scenario["gold"]))
def test_rebuilt_gold_patch_equals_the_rows_own_patch(name, tmp_path):
    row = stored()[name]
    assert r2e_gold_patch(row["parsed_commit_content"]) == row["patch"]
    assert r2e_gold_patch(json.loads(row["parsed_commit_content"])) == row["patch"]
    # the data file is this scenario's commit: its `patch` is git's diff of the gold files listed by hand
    assert sorted(stored()) == sorted(SCENARIOS)
    repo, base, fix = make_commit(tmp_path, name)
    assert row["patch"] == gold_diff(repo, base, fix, SCENARIOS[name]["gold"])
    commit = json.loads(row["parsed_commit_content"])
    assert (commit["old_commit_hash"], commit["new_commit_hash"]) == (base, fix)


def test_a_row_without_patch_gets_the_rebuilt_one_and_it_applies(tmp_path):
    row = stored()["mixed"]
    task = task_from_row(r2e_row(parsed_commit_content=row["parsed_commit_content"]))
    assert task.kind == "r2e"
    assert task.patch == row["patch"] and task.patch.count("diff --git ") == len(SCENARIOS["mixed"]["gold"])
    assert task.base_commit == json.loads(row["parsed_commit_content"])["old_commit_hash"]
    # a row's own patch wins over the rebuilt one; an empty or blank one does not
    assert task_from_row(r2e_row(parsed_commit_content=row["parsed_commit_content"], patch="X")).patch == "X"
    assert task_from_row(r2e_row(parsed_commit_content=row["parsed_commit_content"], patch=" \n")).patch == task.patch

    repo, base, fix = make_commit(tmp_path, "mixed")
    git(repo, "checkout", "-q", base)
    (tmp_path / "gold.diff").write_text(task.patch)
    git(repo, "apply", str(tmp_path / "gold.diff"))
    git(repo, "add", "-A")
    gold = SCENARIOS["mixed"]["gold"]
    assert git(repo, "diff", "--cached", fix, "--", *gold) == ""  # the gold files are now as the fix left them
    changed = git(repo, "diff", "--cached", "--name-only", "-z", base).split("\0")
    assert sorted(p for p in changed if p) == sorted(gold)


def test_the_gold_file_set_is_r2e_gyms():
    mixed = SCENARIOS["mixed"]
    changed = {*mixed["fix"], *mixed["chmod"]}
    assert sorted(p for p in changed if p.endswith(".py") and not r2e_is_test_file(p)) == sorted(mixed["gold"])
    assert r2e_gold_patch(stored()["tests_only"]["parsed_commit_content"]) == ""
    for path in ("test_x.py", "a/test_x.py", "a/x_test.py", "tests/a.py", "a/Tests/b.py", "test/a.py", "Test/a.py"):
        assert r2e_is_test_file(path), path
    for path in ("pkg/testing.py", "contest.py", "a/latest.py", "a/mytests/b.py", "x_tests.py", "a/TESTS/b.py"):
        assert not r2e_is_test_file(path), path


# ------------------------------------------------------------------ malformed content is an error, never ""


def broken(edit) -> str:
    """The one_file commit record, edited (`edit` a function of the decoded record), or `edit` itself (text)."""
    if isinstance(edit, str):
        return edit
    commit = json.loads(stored()["one_file"]["parsed_commit_content"])
    edit(commit)
    return json.dumps(commit)


def _hunk(commit):
    return commit["file_diffs"][0]["hunks"][0]


MALFORMED = {
    "not JSON": ("{not json", "not JSON"),
    "no file_diffs": (json.dumps({"old_commit_hash": "abc"}), "'file_diffs' must be list, got nothing"),
    "a line too many": (
        lambda c: _hunk(c)["line_group"]["all_lines"].insert(0, {"content": "x", "type": "added"}),
        r"file_diffs\[0\] \(lib/util.py\)\.hunks\[0\]: '@@ -1,2 \+1,2 @@' counts 2 old and 2 new lines",
    ),
    "an unknown line type": (
        lambda c: _hunk(c)["line_group"]["all_lines"][0].update(type="moved"),
        r"hunks\[0\]\.line_group\.all_lines\[0\]: unknown line type 'moved'",
    ),
    "no range start": (
        lambda c: _hunk(c)["descriptor"]["old_range"].pop("start"),
        r"descriptor\.old_range: 'start' must be int",
    ),
    "hunks without --- / +++": (
        lambda c: c["file_diffs"][0].update(minus_file=None, plus_file=None),
        "has hunks but no 'minus_file' / 'plus_file'",
    ),
    "no path": (
        lambda c: c["file_diffs"][0]["header"].pop("file"),
        r"file_diffs\[0\]\.header: 'file' must be dict",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_content_is_an_error_naming_the_row_and_field(case):
    edit, message = MALFORMED[case]
    content = broken(edit)
    with pytest.raises(TaskError, match=message) as caught:
        task_from_row(r2e_row(parsed_commit_content=content), source="rows.jsonl line 7")
    assert caught.value.field == "parsed_commit_content"
    assert str(caught.value).startswith("rows.jsonl line 7: field 'parsed_commit_content': cannot rebuild")


def test_a_file_with_a_malformed_row_skips_it_and_says_why(tmp_path):
    good = r2e_row(parsed_commit_content=stored()["one_file"]["parsed_commit_content"])
    bad = r2e_row(parsed_commit_content=broken(MALFORMED["a line too many"][0]), commit_hash="f" * 40)
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    tasks = load_tasks(path)
    assert [t.patch for t in tasks] == [stored()["one_file"]["patch"]]
    assert [(e.source, e.field) for e in tasks.skipped] == [(f"{path} line 2", "parsed_commit_content")]


# ------------------------------------------------------------------ against R2E-Gym's own code

PEER_SCRIPT = r"""
import json, sys
from datetime import datetime, timezone
from pathlib import Path
from r2egym.commit_models.diff_classes import FileDiff, FileDiffHeader, FileInfo, ParsedCommit
from r2egym.commit_models.parse_diff import CommitParser

job = json.loads(sys.stdin.read())
out = {"commits": {}, "is_test": {}}
for name, (repo, base, fix, diff) in job["commits"].items():
    date = datetime(2024, 5, 6, 7, 8, 9, tzinfo=timezone.utc)
    parsed = CommitParser().parse_commit(base, fix, diff, "fix " + name, date, Path(repo))
    content = parsed.model_dump_json(indent=4)
    out["commits"][name] = {
        "parsed_commit_content": content,
        "gold": ParsedCommit(**json.loads(content)).get_patch(test_file=False),
    }
for path in job["paths"]:
    header = FileDiffHeader(file=FileInfo(path=path))
    out["is_test"][path] = FileDiff(old_file_content="", new_file_content="", header=header).is_test_file
print(json.dumps(out))
"""
TEST_PATHS = [
    *SCENARIOS["mixed"]["fix"],
    *("test_x.py", "a/test_x.py", "a/x_test.py", "tests/a.py", "a/Tests/b.py", "test/a.py", "Test/a.py"),
    *("pkg/testing.py", "contest.py", "a/mytests/b.py", "x_tests.py", "a/TESTS/b.py", "test_dir/a.py", "tests"),
]


def r2e_gym_run(root: Path) -> tuple[dict, dict]:
    """R2E-Gym's parser and gold patch on every scenario's commit, and its test-file rule on TEST_PATHS."""
    peer = r2egym_peer()
    if not (peer / "src/r2egym/commit_models/parse_diff.py").is_file():
        pytest.skip(f"no R2E-Gym commit_models at {peer} (set NEXUS_R2EGYM_PEER to an R2E-Gym checkout)")
    commits = {}
    for name in SCENARIOS:
        repo, base, fix = make_commit(root, name)
        commits[name] = (str(repo), base, fix, git(repo, "diff", "-p", base, fix))  # as R2E-Gym's crawler asks
    job = json.dumps({"commits": commits, "paths": TEST_PATHS})
    env = {**os.environ, "PYTHONPATH": str(peer / "src")}
    proc = subprocess.run(
        [sys.executable, "-c", PEER_SCRIPT], input=job, capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    return out["commits"], out["is_test"]


def r2e_gym_text_as_git_writes_it(text: str) -> str:
    """R2E-Gym's gold text with its two known departures from git's text undone: it drops the quotes git puts
    around an escaped path, and its parser turns the diff's final newline into one more, empty context line
    (git apply accepts both; the rebuilt patch is git's own text)."""
    text = text.replace(
        "diff --git a/caf\\303\\251.py b/caf\\303\\251.py", 'diff --git "a/caf\\303\\251.py" "b/caf\\303\\251.py"'
    )
    return text.removesuffix("\n \n") + "\n" if text.endswith("\n \n") else text


def test_r2e_gyms_parser_and_gold_patch_agree_with_ours(tmp_path):
    theirs, is_test = r2e_gym_run(tmp_path)
    for path, verdict in is_test.items():
        assert r2e_is_test_file(path) == verdict, path
    rows = stored()
    mismatched = [
        name for name in SCENARIOS if theirs[name]["parsed_commit_content"] != rows[name]["parsed_commit_content"]
    ]
    assert not mismatched, (
        f"the data file is stale for {mismatched}: run python -m tests.env.grading.test_r2e_gold_patch"
    )
    for name, out in theirs.items():
        ours = r2e_gold_patch(out["parsed_commit_content"])
        assert ours == r2e_gym_text_as_git_writes_it(out["gold"]), name
        if SCENARIOS[name]["gold"] and SCENARIOS[name]["gold"][-1] == "zlast.py":
            assert out["gold"].endswith("\n \n") and not ours.endswith("\n \n")  # the departure is really there
    # and both texts take the base tree to the same gold tree
    trees = set()
    for text in (theirs["mixed"]["gold"], r2e_gold_patch(theirs["mixed"]["parsed_commit_content"])):
        repo, base, _ = make_commit(tmp_path / f"apply{len(trees)}", "mixed")
        git(repo, "checkout", "-q", base)
        (repo.parent / "gold.diff").write_text(text)
        git(repo, "apply", str(repo.parent / "gold.diff"))
        git(repo, "add", "-A")
        trees.add(git(repo, "write-tree").strip())
    assert len(trees) == 1


# ------------------------------------------------------------------ `tasks validate` on an R2E-native image


@pytest.mark.docker
def test_tasks_validate_rebuilds_an_r2e_native_rows_gold_patch_and_it_resolves(tmp_path):
    """The R2E-native mimic image (tests/mimic) with rows that carry `parsed_commit_content` and no `patch`:
    the rebuilt gold resolves; a commit that touches only tests and docs has an empty gold, and says so."""
    ready, reason = docker_status()
    require(ready, reason)
    from env.tasks.images import docker_client
    from tests.mimic.build import Mimics, _digest, _r2e_native

    client = docker_client()
    mimics = Mimics()
    _r2e_native(client, _digest(client), mimics)
    rows = []
    for name, instance_id in (("calcpkg", None), ("tests_only", "calcpkg__tests-only-1")):
        row = {k: v for k, v in mimics.rows["r2e_native"].items() if k != "patch"}
        commit = json.loads(stored()[name]["parsed_commit_content"])
        commit["old_commit_hash"] = row["commit_hash"]
        row["parsed_commit_content"] = json.dumps(commit)
        rows.append({**row, "instance_id": instance_id} if instance_id else row)
    native = task_from_row(rows[0])
    assert native.patch == stored()["calcpkg"]["patch"] and native.patch.startswith("diff --git a/calcpkg/ops.py")

    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = CliRunner().invoke(app, ["tasks", "validate", "--file", str(path), "--json"])
    verdicts = {v["instance_id"]: v for v in json.loads(result.stdout[result.stdout.index("[") :])}
    gold = verdicts[native.instance_id]
    assert (gold["valid"], gold["gold_status"], gold["base_status"], gold["grader"]) == (
        True,
        "resolved",
        "unresolved",
        "r2e-native",
    ), gold
    empty = verdicts["calcpkg__tests-only-1"]
    assert (empty["valid"], empty["gold_status"]) == (False, "empty_patch")
    assert any("parsed_commit_content` changes no non-test Python file" in p for p in empty["problems"]), empty
    assert result.exit_code == 1


def write_data() -> None:
    """Regenerate the data file with R2E-Gym's parser (NEXUS_R2EGYM_PEER must have commit_models)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        theirs, _ = r2e_gym_run(Path(tmp))
        rows = {}
        for name, scenario in SCENARIOS.items():
            repo, base, fix = make_commit(Path(tmp) / "again", name)
            rows[name] = {
                "patch": gold_diff(repo, base, fix, scenario["gold"]),
                "parsed_commit_content": theirs[name]["parsed_commit_content"],
            }
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    write_data()
