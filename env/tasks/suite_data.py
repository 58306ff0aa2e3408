"""Suites stored as data: each project's source tree once, each task as patches on it.

Why: a suite of N tasks over one project used to hold N near-identical copies of its source under
`<task>/repo/`, which linters, duplicate finders and packagers counted as project code. A *packed* suite holds

    _repos/<project>.patch    the project's base tree, as one git-style patch creating every file
    <task_id>/task.json       the local task format (docs/tasks.md) plus "suite_repo": "<project>"
    <task_id>/bug.patch       the diff from that base tree to the task's buggy tree (empty: the base itself)

so nothing under a suite is code. `_repos` starts with `_`, so the suite loaders skip it as they skip any such
folder. The loader materialises a task's `repo/` on demand (`materialise`) into a cache folder named by a hash
of the patches; the task then points at that folder exactly as a local task points at its own folder.

Maintainers: `pack_suite(src, dst)` turns a folder of task folders (local ones with `repo/`, packed ones, or
both) into this form and refuses a result that does not give every task's tree back byte for byte; from a
shell, `python -m env.tasks.suite_data SRC [DST]` (no DST: in place). Adding a task to a bundled suite is dropping
its local task folder into the suite and packing the suite in place.

Patches are made and applied with git (`git diff --binary`, `git apply`), in throw-away repositories and with
the user's and system's git configuration switched off, so neither can change a byte of a tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from env.tasks.images import CONTEXT_IGNORE
from env.tasks.task_model import REPO_DIR, TASK_FILE, TaskError

BASES_DIR = "_repos"
BUG_PATCH = "bug.patch"
SUITE_REPO_FIELD = "suite_repo"
# Bump when the way a tree is rebuilt from its patches changes, so trees cached before are not reused.
TREE_FORMAT = "1"
# The one place the cache lives, beside the project's other caches (~/.cache/nexus-eval/models, .../swebench);
# `cache_dir=` on every loader puts it elsewhere.
SUITE_CACHE_DIR = Path("~/.cache/nexus-eval/suites")

FOLDER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_IGNORED = shutil.ignore_patterns(*CONTEXT_IGNORE)


# ----------------------------------------------------------------------------------------------- git


def _git(*args: str, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """git with no configuration but its defaults and no repository but the one in `cwd`: a user's
    `core.autocrlf`, `apply.whitespace=fix` or `diff.noprefix`, or a GIT_DIR inherited from a hook, would
    otherwise change what is written."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", LC_ALL="C")
    try:
        return subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, env=env, check=False)
    except FileNotFoundError:
        raise TaskError(cwd, "git is needed to pack or materialise a suite's trees and is not installed") from None


def _scratch_repo(path: Path) -> None:
    result = _git("init", "-q", str(path), cwd=path.parent)
    if result.returncode != 0:
        raise TaskError(path, f"git init failed: {result.stderr.decode(errors='replace').strip()}")


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy a task's tree as its image gets it (env.tasks.images: no .git, byte-code or pytest cache)."""
    shutil.copytree(src, dst, symlinks=True, ignore=_IGNORED, dirs_exist_ok=True)


class TreeStore:
    """One scratch git repository that takes in trees (`add`) and gives the git-style patch between any two of
    them (`diff`): text, binary files as git's base85 literals, modes and symlinks kept, no renames.

    One repository for all trees, so packing a suite costs a few git calls per tree and one per patch."""

    def __init__(self, scratch: Path) -> None:
        self.work = scratch
        self.work.mkdir(parents=True)
        _scratch_repo(self.work)
        self.empty = self.add(None)

    def add(self, tree: Path | None) -> str:
        """The git tree id of `tree` (None: the empty tree), read as its image would hold it."""
        _git("read-tree", "--empty", cwd=self.work)
        for entry in self.work.iterdir():
            if entry.name != ".git":
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        if tree is not None:
            _copy_tree(tree, self.work)
        added = _git("add", "-A", "-f", ".", cwd=self.work)
        written = _git("write-tree", cwd=self.work)
        if added.returncode or written.returncode:
            detail = (added.stderr + written.stderr).decode(errors="replace").strip()
            raise TaskError(tree or self.work, f"git cannot read the tree: {detail}")
        return written.stdout.decode().strip()

    def diff(self, old: str, new: str) -> bytes:
        """The patch turning tree id `old` into tree id `new` (empty when they are the same tree)."""
        result = _git("diff", "--binary", "--no-renames", "--no-color", old, new, cwd=self.work)
        if result.returncode != 0:
            raise TaskError(self.work, f"git diff failed: {result.stderr.decode(errors='replace').strip()}")
        return result.stdout


def _apply(patch: bytes, patch_file: Path, repo: Path, task_id: str) -> None:
    if not patch.strip():
        return  # an empty bug patch: the task's tree is the base tree
    result = _git("apply", "--whitespace=nowarn", "-", cwd=repo, stdin=patch)
    if result.returncode != 0:
        detail = result.stderr.decode(errors="replace").strip()[-600:]
        raise TaskError(patch_file, f"task {task_id}: corrupt patch, git apply failed: {detail}")


# ------------------------------------------------------------------------------------- materialising


def tree_key(task_id: str, base_patch: bytes, bug_patch: bytes) -> str:
    """The cache folder's name: a hash of everything the tree is made from, so a changed patch (or a change
    to how trees are made, `TREE_FORMAT`) never reuses a stale tree."""
    digest = hashlib.sha256()
    for part in (TREE_FORMAT.encode(), task_id.encode(), base_patch, bug_patch):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:24]


def _read_patch(path: Path, task_id: str, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise TaskError(path, f"task {task_id}: missing {what}") from None
    except OSError as exc:
        raise TaskError(path, f"task {task_id}: cannot read {what}: {exc}") from None


def materialise(task_id: str, base_patch: Path, bug_patch: Path, *, cache_dir: Path | None = None) -> Path:
    """The folder `<cache_dir>/<key>/<task_id>/` whose `repo/` is the base tree with the bug patch applied,
    built unless already there (`cache_dir`: None is `SUITE_CACHE_DIR`).

    Built in a temporary folder beside the final one and renamed into place in one step, so a reader never
    sees half a tree; when two processes build the same tree at once, one rename wins and both use its tree.
    A missing or unappliable patch raises TaskError naming the task and the file.
    """
    base = _read_patch(base_patch, task_id, "base tree patch")
    if not base.strip():
        raise TaskError(base_patch, f"task {task_id}: the base tree patch is empty")
    bug = _read_patch(bug_patch, task_id, "bug patch")
    cache = Path(cache_dir if cache_dir is not None else SUITE_CACHE_DIR).expanduser()
    key = tree_key(task_id, base, bug)
    final = cache / key
    if (final / task_id / REPO_DIR).is_dir():
        return final / task_id
    try:
        cache.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache))
    except OSError as exc:
        raise TaskError(cache, f"task {task_id}: cannot write the suite tree cache: {exc}") from None
    try:
        repo = building / task_id / REPO_DIR
        repo.mkdir(parents=True)
        _scratch_repo(repo)
        _apply(base, base_patch, repo, task_id)
        _apply(bug, bug_patch, repo, task_id)
        shutil.rmtree(repo / ".git")
        try:
            os.rename(building, final)
        except OSError as exc:
            if not (final / task_id / REPO_DIR).is_dir():  # not a lost race: a real failure
                raise TaskError(final, f"task {task_id}: cannot put the tree in place ({exc}); remove it") from None
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return final / task_id


def packed_task_dir(task_dir: Path, data: dict[str, Any], *, cache_dir: Path | None = None) -> Path:
    """For the loader: the materialised folder (holding `repo/`) of the packed task in `task_dir`, whose
    task.json holds `data`."""
    task_file = task_dir / TASK_FILE
    project = data[SUITE_REPO_FIELD]
    if not isinstance(project, str) or not FOLDER_NAME.match(project):
        raise TaskError(
            task_file, f"{project!r} must name a file of {BASES_DIR}/ (letters, digits, . _ -)", field=SUITE_REPO_FIELD
        )
    if (task_dir / REPO_DIR).exists():
        raise TaskError(
            task_dir, f"a packed task ({SUITE_REPO_FIELD}) must not hold {REPO_DIR}/ as well", field=SUITE_REPO_FIELD
        )
    base_patch = task_dir.parent / BASES_DIR / f"{project}.patch"
    return materialise(str(data["instance_id"]), base_patch, task_dir / BUG_PATCH, cache_dir=cache_dir)


# ----------------------------------------------------------------------------------------------- packing


def tree_files(root: Path) -> dict[str, tuple[str, bytes]]:
    """Every file of a tree as its image would hold it: relative path -> (kind, bytes), the kind being
    `link`, `exec` or `file`; what the round trip must give back."""
    files = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(fnmatch(part, pattern) for part in rel.parts for pattern in CONTEXT_IGNORE):
            continue
        if path.is_symlink():
            files[rel.as_posix()] = ("link", os.readlink(path).encode())
        elif path.is_file():
            files[rel.as_posix()] = ("exec" if os.access(path, os.X_OK) else "file", path.read_bytes())
    return files


def _read_task(task_dir: Path) -> dict[str, Any]:
    task_file = task_dir / TASK_FILE
    try:
        data = json.loads(task_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TaskError(task_file, f"cannot read: {exc}") from None
    task_id = data.get("instance_id") if isinstance(data, dict) else None
    if not isinstance(task_id, str) or not FOLDER_NAME.match(task_id):
        raise TaskError(task_file, "must hold a JSON object whose instance_id is a folder name", field="instance_id")
    extra = sorted(p.name for p in task_dir.iterdir() if p.name not in (TASK_FILE, REPO_DIR, BUG_PATCH))
    if extra:
        raise TaskError(
            task_dir, f"holds {extra[0]!r}; a task folder to pack holds only {TASK_FILE} and {REPO_DIR}/ or {BUG_PATCH}"
        )
    return data


def _project_names(prefixes: list[str]) -> dict[str, str]:
    """`owner__name` -> the base patch's name: `name`, or the whole prefix where two owners share a name."""
    short = {prefix: prefix.split("__", 1)[-1] for prefix in prefixes}
    taken = list(short.values())
    return {prefix: name if taken.count(name) == 1 else prefix for prefix, name in short.items()}


def _gold_tree(repo: Path, patch: Any, into: Path) -> Path | None:
    """`repo` with the gold patch applied (a base candidate: the tasks of a project often share it)."""
    _copy_tree(repo, into)
    _scratch_repo(into)
    ok = (
        isinstance(patch, str)
        and _git("apply", "--whitespace=nowarn", "-", cwd=into, stdin=patch.encode()).returncode == 0
    )
    shutil.rmtree(into / ".git")
    return into if ok else None


def _best_base(store: TreeStore, trees: dict[str, str], candidates: list[str]) -> tuple[str, dict[str, bytes]]:
    """Among candidate base trees (git tree ids), the one whose bug patches to every task's tree (`trees`: task
    id -> tree id) are smallest in total; the first wins a tie. Returns it and those patches."""
    best: tuple[int, str, dict[str, bytes]] | None = None
    for candidate in dict.fromkeys(candidates):  # the same tree twice is tried once
        diffs = {task_id: store.diff(candidate, tree) for task_id, tree in trees.items()}
        size = sum(map(len, diffs.values()))
        if best is None or size < best[0]:
            best = (size, candidate, diffs)
    assert best is not None
    return best[1], best[2]


def pack_suite(src_dir: str | Path, dst_dir: str | Path | None = None) -> list[str]:
    """Write the task folders of `src_dir` (local ones with `repo/`, packed ones, or both) into `dst_dir` in
    the packed form; return the task ids. `dst_dir` must not exist or be empty; None (or `src_dir` itself)
    packs in place: the task folders and `_repos/` are replaced, other files of the suite are kept.

    For each project (tasks sharing `owner__name`) the base tree is whichever of its tasks' trees, or their
    trees with the gold patch applied, makes the bug patches smallest. Every task is then rebuilt from what was
    written and compared with its source tree file by file; a mismatch raises and nothing is replaced.
    """
    src = Path(src_dir).resolve()
    dst = Path(dst_dir).resolve() if dst_dir is not None else src
    in_place = dst == src
    if not in_place and dst.exists() and any(dst.iterdir()):
        raise TaskError(dst, "must be empty or not exist (or be the source, to pack in place)")
    task_dirs = sorted(p for p in src.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    if not task_dirs:
        raise TaskError(src, f"no task folders (each needs {TASK_FILE} and {REPO_DIR}/ or {BUG_PATCH})")
    with tempfile.TemporaryDirectory(prefix=".pack-", dir=dst.parent if in_place else None) as tmp:
        work = Path(tmp)
        tasks = {}  # task id -> (task.json data without suite_repo, its tree)
        for task_dir in task_dirs:
            data = _read_task(task_dir)
            task_id = data["instance_id"]
            if task_id in tasks:
                raise TaskError(task_dir, f"duplicate instance_id {task_id!r}", field="instance_id")
            if SUITE_REPO_FIELD in data:
                tree = packed_task_dir(task_dir, data, cache_dir=work / "source-cache") / REPO_DIR
                data = {k: v for k, v in data.items() if k != SUITE_REPO_FIELD}
            elif (task_dir / REPO_DIR).is_dir():
                tree = task_dir / REPO_DIR
            else:
                raise TaskError(task_dir, f"neither {REPO_DIR}/ nor {SUITE_REPO_FIELD} in {TASK_FILE}")
            tasks[task_id] = (data, tree)

        groups: dict[str, list[str]] = {}
        for task_id in tasks:
            groups.setdefault(task_id.rsplit("-", 1)[0], []).append(task_id)
        names = _project_names(list(groups))
        store = TreeStore(work / "trees")
        out = work / "packed"
        (out / BASES_DIR).mkdir(parents=True)
        for prefix, ids in groups.items():
            trees = {task_id: store.add(tasks[task_id][1]) for task_id in ids}
            golds = [_gold_tree(tasks[i][1], tasks[i][0].get("patch"), work / "gold" / i) for i in ids]
            candidates = [store.add(g) for g in golds if g is not None] + list(trees.values())
            base, bug_patches = _best_base(store, trees, candidates)
            (out / BASES_DIR / f"{names[prefix]}.patch").write_bytes(store.diff(store.empty, base))
            for task_id in ids:
                data = dict(tasks[task_id][0])
                at = list(data).index("repo") + 1 if "repo" in data else len(data)
                items = list(data.items())
                items.insert(at, (SUITE_REPO_FIELD, names[prefix]))
                (out / task_id).mkdir()
                (out / task_id / TASK_FILE).write_text(json.dumps(dict(items), indent=2) + "\n", encoding="utf-8")
                (out / task_id / BUG_PATCH).write_bytes(bug_patches[task_id])

        for task_id, (data, tree) in tasks.items():
            packed = {**data, SUITE_REPO_FIELD: names[task_id.rsplit("-", 1)[0]]}
            rebuilt = packed_task_dir(out / task_id, packed, cache_dir=work / "check-cache")
            if tree_files(rebuilt / REPO_DIR) != tree_files(tree):
                raise TaskError(out / task_id, f"task {task_id}: the packed tree does not give its source tree back")

        if in_place:
            for task_dir in task_dirs:
                shutil.rmtree(task_dir)
            shutil.rmtree(src / BASES_DIR, ignore_errors=True)
        dst.mkdir(parents=True, exist_ok=True)
        for entry in sorted(out.iterdir()):
            shutil.move(str(entry), str(dst / entry.name))
    return sorted(tasks)


def main(argv: list[str] | None = None) -> int:
    """`python -m env.tasks.suite_data SRC [DST]`: pack a folder of task folders (no DST: in place)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2) or args[0].startswith("-"):
        print("usage: python -m env.tasks.suite_data SRC [DST]   (pack SRC's task folders into DST; no DST: in place)")
        return 2
    try:
        ids = pack_suite(args[0], args[1] if len(args) == 2 else None)
    except TaskError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"packed {len(ids)} tasks into {args[-1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
