"""Suites stored as data (`env.tasks.suite_data`): pack a folder of task folders, materialise a task's tree back.

The round trip is checked on hand-made trees holding what a tree can hold (binary and non-UTF-8 bytes, an
executable, a symlink, an empty file, no trailing newline, nested folders, files added or deleted by one task);
the bundled `mini` suite itself is checked by tests/env/tasks/test_suite_mini.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from env.tasks.loading import SUITES_DIR, TaskError, load_local_task, load_task_folder, load_tasks
from env.tasks.suite_data import BASES_DIR, BUG_PATCH, SUITE_REPO_FIELD, materialise, pack_suite

ROOT = Path(__file__).resolve().parents[3]
TESTS = (
    "diff --git a/tests/test_calc.py b/tests/test_calc.py\nnew file mode 100644\n--- /dev/null\n"
    "+++ b/tests/test_calc.py\n@@ -0,0 +1,2 @@\n+def test_x():\n+    import calc; assert calc.X == 2\n"
)
BASE_FILES = {
    "calc.py": b"X = 2\n",
    "pkg/y.py": b"Y = 2\n",
    "pkg/z.py": b"Z = 2\n",
    "pkg/__init__.py": b"",
    "pkg/deep/mod.py": b"def f():\n    return 'no newline at the end'",
    "data/blob.bin": bytes(range(256)) * 3,
    "data/latin1.txt": "caf\xe9\n".encode("latin-1"),
    "README.md": b"# calc\n\ntrailing spaces   \n\tand tabs\n",
}


def gold(path: str, name: str) -> str:
    """The gold patch of a task whose bug is `<name> = 1` in `path` (the fixed value is 2)."""
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-{name} = 1\n+{name} = 2\n"


GOLD = gold("calc.py", "X")


def tree(root: Path) -> dict[str, tuple[str, bytes]]:
    """Every file under `root`: path -> (kind, bytes); the test's own reading, independent of the module's."""
    found = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            found[rel] = ("link", os.readlink(path).encode())
        elif path.is_file():
            found[rel] = ("exec" if os.access(path, os.X_OK) else "file", path.read_bytes())
    return found


def write_local(root: Path, task_id: str, files: dict[str, bytes], *, gold: str = GOLD, link: bool = True) -> Path:
    folder = root / task_id
    for rel, content in files.items():
        (folder / "repo" / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / "repo" / rel).write_bytes(content)
    (folder / "repo" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (folder / "repo" / "run.sh").chmod(0o755)
    if link:
        (folder / "repo" / "pkg" / "alias.py").symlink_to("__init__.py")
    spec = {
        "instance_id": task_id,
        "repo": f"example/{task_id.split('__')[0]}",
        "problem_statement": f"X should be 2 ({task_id})",
        "patch": gold,
        "test_patch": TESTS,
        "FAIL_TO_PASS": ["tests/test_calc.py::test_x"],
        "PASS_TO_PASS": [],
        "setup": ["true"],
    }
    (folder / "task.json").write_text(json.dumps(spec, indent=2) + "\n")
    return folder


@pytest.fixture()
def local_suite(tmp_path: Path) -> Path:
    """Four tasks over two projects; each calc task plants its own bug in the shared fixed state, and two of
    them change the tree besides (a file added, a file deleted)."""
    src = tmp_path / "src"
    write_local(src, "calc__calc-1", {**BASE_FILES, "calc.py": b"X = 1\n"})
    write_local(
        src,
        "calc__calc-2",
        {**BASE_FILES, "pkg/y.py": b"Y = 1\n", "pkg/new_in_2.py": b"NEW = True\n"},
        gold=gold("pkg/y.py", "Y"),
    )
    without_readme = {k: v for k, v in BASE_FILES.items() if k != "README.md"}
    write_local(src, "calc__calc-3", {**without_readme, "pkg/z.py": b"Z = 1\n"}, gold=gold("pkg/z.py", "Z"))
    write_local(src, "other__calc-1", {"calc.py": b"X = 1\n", "pkg/__init__.py": b""}, link=False)
    (src / "calc__calc-1" / "repo" / "__pycache__").mkdir()  # never packed: an image leaves it out too
    (src / "calc__calc-1" / "repo" / "__pycache__" / "calc.cpython-311.pyc").write_bytes(b"\0junk")
    return src


def without_caches(files: dict[str, tuple[str, bytes]]) -> dict[str, tuple[str, bytes]]:
    return {path: value for path, value in files.items() if "__pycache__" not in path}


def test_no_python_files_under_suites():
    """Suites are data: nothing under env/tasks/suites/ is linted, imported or counted as project code."""
    found = sorted(p.relative_to(ROOT).as_posix() for p in SUITES_DIR.rglob("*.py"))
    assert found == []
    assert not list(SUITES_DIR.rglob("repo")), "a bundled suite stores patches, not repo/ copies"


def test_pack_then_materialise_round_trips(local_suite: Path, tmp_path: Path):
    dst, cache = tmp_path / "packed", tmp_path / "cache"
    assert pack_suite(local_suite, dst) == ["calc__calc-1", "calc__calc-2", "calc__calc-3", "other__calc-1"]
    assert not list(dst.rglob("*.py")) and not list(dst.rglob("repo"))
    # each project once; two owners with the same name keep apart; a task folder is task.json + bug.patch
    assert sorted(p.name for p in (dst / BASES_DIR).iterdir()) == ["calc__calc.patch", "other__calc.patch"]
    assert sorted(p.name for p in (dst / "calc__calc-2").iterdir()) == [BUG_PATCH, "task.json"]
    # the base is the shared gold-fixed state, so a bug patch holds only the task's own change
    bug_1, bug_2 = ((dst / f"calc__calc-{n}" / BUG_PATCH).read_text() for n in (1, 2))
    assert "-X = 2\n+X = 1\n" in bug_1 and "y.py" not in bug_1 and "new_in_2.py" not in bug_1
    assert "-Y = 2\n+Y = 1\n" in bug_2 and "new_in_2.py" in bug_2 and "calc.py" not in bug_2

    before = {t.instance_id: t for t in load_task_folder(local_suite)}
    after = {t.instance_id: t for t in load_task_folder(dst, cache_dir=cache)}
    assert sorted(after) == sorted(before)
    for task_id, task in after.items():
        assert tree(task.repo_dir) == without_caches(tree(before[task_id].repo_dir)), task_id
        assert task.model_dump(exclude={"local_dir"}) == before[task_id].model_dump(exclude={"local_dir"})
        assert task.local_dir.name == task_id and task.local_dir.is_relative_to(cache)
    assert tree(after["calc__calc-1"].repo_dir)["run.sh"][0] == "exec"
    assert tree(after["calc__calc-1"].repo_dir)["pkg/alias.py"] == ("link", b"__init__.py")
    assert "README.md" not in tree(after["calc__calc-3"].repo_dir)
    # one task folder of a packed suite loads on its own too, and the task.json is the local one plus one field
    assert load_tasks(dst / "calc__calc-2", cache_dir=cache)[0].repo_dir == after["calc__calc-2"].repo_dir
    spec = json.loads((dst / "calc__calc-2" / "task.json").read_text())
    assert spec.pop(SUITE_REPO_FIELD) == "calc__calc"
    assert spec == json.loads((local_suite / "calc__calc-2" / "task.json").read_text())


def test_pack_in_place_adds_a_task(local_suite: Path, tmp_path: Path):
    """Adding a task to a packed suite: drop its local folder in and pack the suite in place."""
    pack_suite(local_suite)
    (local_suite / "NOTES.md").write_text("kept\n")
    expected = tree(load_local_task(local_suite / "calc__calc-1", cache_dir=tmp_path / "c").repo_dir)
    write_local(local_suite, "calc__calc-4", {**BASE_FILES, "calc.py": b"X = 4\n"})
    new_tree = without_caches(tree(local_suite / "calc__calc-4" / "repo"))
    assert len(pack_suite(local_suite, local_suite)) == 5
    assert not list(local_suite.rglob("repo")) and (local_suite / "NOTES.md").read_text() == "kept\n"
    loaded = {t.instance_id: t for t in load_task_folder(local_suite, cache_dir=tmp_path / "c2")}
    assert tree(loaded["calc__calc-1"].repo_dir) == expected
    assert tree(loaded["calc__calc-4"].repo_dir) == new_tree


def test_pack_refuses_a_non_empty_destination_and_stray_files(local_suite: Path, tmp_path: Path):
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "x").write_text("")
    with pytest.raises(TaskError, match="must be empty"):
        pack_suite(local_suite, tmp_path / "dst")
    (local_suite / "calc__calc-1" / "notes.txt").write_text("would be lost")
    with pytest.raises(TaskError, match="notes.txt") as info:
        pack_suite(local_suite, tmp_path / "out")
    assert "calc__calc-1" in info.value.source


@pytest.fixture()
def packed(local_suite: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "packed"
    pack_suite(local_suite, dst)
    return dst


def patches(suite: Path, task_id: str) -> tuple[Path, Path]:
    project = json.loads((suite / task_id / "task.json").read_text())[SUITE_REPO_FIELD]
    return suite / BASES_DIR / f"{project}.patch", suite / task_id / BUG_PATCH


def test_concurrent_materialisations_agree(packed: Path, tmp_path: Path):
    """Threads racing on one empty cache all get the same complete tree and leave no temporary folder."""
    cache = tmp_path / "cache"
    base, bug = patches(packed, "calc__calc-2")
    start = threading.Barrier(8)
    results: list[Path | BaseException] = []

    def worker() -> None:
        start.wait()
        try:
            results.append(materialise("calc__calc-2", base, bug, cache_dir=cache))
        except BaseException as exc:  # reported below
            results.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(isinstance(r, Path) for r in results), results
    assert len(set(results)) == 1
    assert "pkg/new_in_2.py" in tree(results[0] / "repo")
    assert [p.name for p in cache.iterdir()] == [results[0].parent.name]


def test_concurrent_processes_agree(packed: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    base, bug = patches(packed, "calc__calc-1")
    code = (
        "import sys; from pathlib import Path; from env.tasks.suite_data import materialise; "
        "print(materialise('calc__calc-1', Path(sys.argv[1]), Path(sys.argv[2]), cache_dir=Path(sys.argv[3])))"
    )
    argv = [sys.executable, "-c", code, str(base), str(bug), str(cache)]
    procs = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], [err.decode() for _, err in outputs]
    folders = {out.decode().strip() for out, _ in outputs}
    assert len(folders) == 1
    assert tree(Path(folders.pop()) / "repo") == tree(materialise("calc__calc-1", base, bug, cache_dir=cache) / "repo")


def test_a_changed_bug_patch_gives_a_new_folder(packed: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    first = load_local_task(packed / "calc__calc-1", cache_dir=cache)
    bug = packed / "calc__calc-1" / BUG_PATCH
    bug.write_text(bug.read_text().replace("+X = 1", "+X = 3"))
    second = load_local_task(packed / "calc__calc-1", cache_dir=cache)
    assert second.local_dir != first.local_dir
    assert (second.repo_dir / "calc.py").read_bytes() == b"X = 3\n"
    assert (first.repo_dir / "calc.py").read_bytes() == b"X = 1\n"  # the old tree is left as it was
    assert load_local_task(packed / "calc__calc-1", cache_dir=cache).local_dir == second.local_dir  # reused


def test_missing_or_corrupt_patches_name_the_task_and_file(packed: Path, tmp_path: Path):
    task_dir = packed / "calc__calc-1"
    bug = task_dir / BUG_PATCH
    bug.write_text(bug.read_text().replace("-X = 2", "-X = 7"))
    with pytest.raises(TaskError, match="task calc__calc-1: corrupt patch") as info:
        load_local_task(task_dir, cache_dir=tmp_path / "c1")
    assert info.value.source == str(bug)
    bug.unlink()
    with pytest.raises(TaskError, match="task calc__calc-1: missing bug patch") as info:
        load_local_task(task_dir, cache_dir=tmp_path / "c2")
    assert info.value.source == str(bug)
    base = packed / BASES_DIR / "calc__calc.patch"
    base.write_text("this is not a patch\n")
    with pytest.raises(TaskError, match="task calc__calc-2: corrupt patch") as info:
        load_local_task(packed / "calc__calc-2", cache_dir=tmp_path / "c3")
    assert info.value.source == str(base)
    base.unlink()
    with pytest.raises(TaskError, match="task calc__calc-2: missing base tree patch"):
        load_local_task(packed / "calc__calc-2", cache_dir=tmp_path / "c4")
    assert not any((tmp_path / name).exists() and list((tmp_path / name).iterdir()) for name in ("c1", "c3"))


def test_bad_suite_repo_and_a_repo_beside_it_are_refused(packed: Path, tmp_path: Path):
    task_dir = packed / "calc__calc-1"
    spec = json.loads((task_dir / "task.json").read_text())
    (task_dir / "task.json").write_text(json.dumps({**spec, SUITE_REPO_FIELD: "../../etc/x"}))
    with pytest.raises(TaskError, match=f"{BASES_DIR}/") as info:
        load_local_task(task_dir, cache_dir=tmp_path / "c")
    assert info.value.field == SUITE_REPO_FIELD
    (task_dir / "task.json").write_text(json.dumps(spec))
    (task_dir / "repo").mkdir()
    with pytest.raises(TaskError, match="must not hold repo/") as info:
        load_local_task(task_dir, cache_dir=tmp_path / "c")
    assert info.value.field == SUITE_REPO_FIELD
