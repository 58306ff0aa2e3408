"""Tasks: one pydantic `Task` for SWE-bench, R2E-Gym and local task folders, and the loaders.

Row kinds (see docs/tasks.md):
- `swebench`: a SWE-bench classic row (`instance_id`, `repo`, `base_commit`, ..., FAIL_TO_PASS/PASS_TO_PASS
  as JSON-encoded strings or lists; optional `docker_image`, or 5.x's `image`).
- `r2e_swebench`: the same row as republished by R2E-Gym, with `docker_image` like
  `slimshetty/swebench-verified:sweb.eval.x86_64.<instance_id>` (and often `parsed_commit`).
- `r2e`: an R2E-native row (`repo_name`, `docker_image`, `expected_output_json`, no `instance_id`); the id is
  derived as `<repo_name>__<commit_hash[:12]>` (rLLM's convention), stable across loads. Without a `patch`,
  its gold patch is rebuilt from `parsed_commit_content` as R2E-Gym builds it (`env.tasks.r2e_gold_patch`).
- `local`: a folder with `task.json` and `repo/` (the source tree at the base state); or, in a packed suite
  such as the bundled ones, `task.json` naming its project (`suite_repo`) and `bug.patch`, whose `repo/` is
  rebuilt from patches into a cache (`env.tasks.suite_data`).

Sources: a `.json` / `.jsonl` / `.parquet` file, a local task folder, a folder of task folders (a suite), or a
Hugging Face dataset name (through `datasets.load_dataset`). Bad input raises `TaskError` naming the file and
field; nothing is silently dropped.

Every loader takes `ceilings` (`env.tasks.ceilings.GradingCeilings`, the operator's ceilings on a task's own
`grading` limits; None: the defaults): a task asking for more is a `TaskError` naming the task, the field,
the value and the ceiling (in a file or dataset, that row is skipped like any other bad row).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from env.tasks.ceilings import DEFAULT_CEILINGS, GradingCeilings
from env.tasks.dataset_rows import R2E_SWEBENCH_IMAGE, r2e_instance_id, task_from_row
from env.tasks.task_model import DEFAULT_TEST_CMD, REPO_DIR, TASK_FILE, Task, TaskError, TaskKind, validate_fields

__all__ = [
    "DEFAULT_CEILINGS",
    "DEFAULT_TEST_CMD",
    "R2E_SWEBENCH_IMAGE",
    "GradingCeilings",
    "Task",
    "TaskError",
    "TaskKind",
    "TaskList",
    "TaskNotFound",
    "find_task",
    "known_suites",
    "load_local_task",
    "load_source",
    "load_suite",
    "load_task_folder",
    "load_tasks",
    "r2e_instance_id",
    "task_from_row",
]

log = logging.getLogger(__name__)
SUITES_DIR = Path(__file__).resolve().parent / "suites"

# `owner__name-N` as SWE-bench spells ids; local ids must match so they are safe as folder and image-tag parts.
LOCAL_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*__[A-Za-z0-9][A-Za-z0-9_.-]*-[0-9]+$")
FILE_SUFFIXES = (".json", ".jsonl", ".parquet")

# Keys a local task.json may carry: the Task fields an author sets, plus SWE-bench metadata we tolerate.
LOCAL_REQUIRED = (
    "instance_id",
    "repo",
    "problem_statement",
    "patch",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
)
LOCAL_OPTIONAL = ("version", "test_cmd", "setup", "grading", "hints_text", "created_at")
LOCAL_FORBIDDEN = ("base_commit", "docker_image", "image")


def load_local_task(
    task_dir: str | Path, *, ceilings: GradingCeilings | None = None, cache_dir: Path | None = None
) -> Task:
    """Load one local task folder (`task.json` + `repo/`); its `grading` block must stay within `ceilings`.

    A packed suite's task folder (`task.json` with `suite_repo`, and `bug.patch`) loads the same way: its
    `repo/` is materialised under `cache_dir` (None: `env.tasks.suite_data.SUITE_CACHE_DIR`) and the Task's
    `local_dir` is that folder.
    """
    # Imported here, not at the top, so `python -m env.tasks.suite_data` (the maintainer's packing command) does not
    # find its own module already imported through `env/tasks/__init__.py`.
    from env.tasks.suite_data import SUITE_REPO_FIELD, packed_task_dir

    task_dir = Path(task_dir).resolve()
    task_file = task_dir / TASK_FILE
    if not task_file.is_file():
        raise TaskError(task_dir, f"not a local task folder: no {TASK_FILE}")
    try:
        data = json.loads(task_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TaskError(task_file, f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise TaskError(task_file, f"must hold a JSON object, got {type(data).__name__}")
    for key in LOCAL_REQUIRED:
        if key not in data:
            raise TaskError(task_file, "missing required field", field=key)
    for key in LOCAL_FORBIDDEN:
        if key in data:
            raise TaskError(task_file, "not allowed in a local task: the image is built from repo/", field=key)
    unknown = sorted(set(data) - set(LOCAL_REQUIRED) - set(LOCAL_OPTIONAL) - {SUITE_REPO_FIELD})
    if unknown:
        raise TaskError(
            task_file,
            f"unknown field (allowed: {', '.join(LOCAL_REQUIRED + LOCAL_OPTIONAL)})",
            field=unknown[0],
        )
    instance_id = data["instance_id"]
    if not isinstance(instance_id, str) or not LOCAL_ID_PATTERN.match(instance_id):
        raise TaskError(
            task_file,
            f"{instance_id!r} must look like 'project__name-N' (letters, digits, . _ -)",
            field="instance_id",
        )
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS", "setup"):
        # Local tasks are written by hand: insist on real lists (rows from datasets may be JSON strings).
        if key in data and not (isinstance(data[key], list) and all(isinstance(t, str) for t in data[key])):
            raise TaskError(task_file, f"must be a list of strings, got {data[key]!r:.80}", field=key)
    if not data["FAIL_TO_PASS"]:
        raise TaskError(
            task_file,
            "must name at least one test, or any patch would resolve the task",
            field="FAIL_TO_PASS",
        )
    for key in ("patch", "test_patch"):
        if not isinstance(data[key], str) or not data[key].strip():
            raise TaskError(task_file, "must be a non-empty unified diff", field=key)
    if SUITE_REPO_FIELD in data:
        task_dir = packed_task_dir(task_dir, data, cache_dir=cache_dir)
    repo = task_dir / REPO_DIR
    if not repo.is_dir() or not any(repo.iterdir()):
        raise TaskError(
            task_dir,
            f"missing or empty {REPO_DIR}/ (the source tree at the base state)",
            field=f"{REPO_DIR}/",
        )
    fields = {key: data[key] for key in LOCAL_REQUIRED + ("version", "test_cmd", "setup", "grading") if key in data}
    return validate_fields(str(task_file), {**fields, "kind": "local", "local_dir": task_dir}, ceilings=ceilings)


def load_task_folder(
    folder: str | Path, *, ceilings: GradingCeilings | None = None, cache_dir: Path | None = None
) -> list[Task]:
    """Load a suite: every sub-folder of `folder` is a local task (folders starting with `.` or `_` are
    skipped, a packed suite's `_repos/` among them); `cache_dir` as in `load_local_task`."""
    folder = Path(folder).resolve()
    if (folder / TASK_FILE).is_file():
        return [load_local_task(folder, ceilings=ceilings, cache_dir=cache_dir)]
    task_dirs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    if not task_dirs:
        raise TaskError(folder, f"no task folders (each needs {TASK_FILE} and {REPO_DIR}/)")
    return _unique(folder, [load_local_task(d, ceilings=ceilings, cache_dir=cache_dir) for d in task_dirs])


def _unique(source: str | Path, tasks: list[Task]) -> list[Task]:
    seen: set[str] = set()
    for task in tasks:
        if task.instance_id in seen:
            raise TaskError(source, f"duplicate instance_id {task.instance_id!r}", field="instance_id")
        seen.add(task.instance_id)
    return tasks


def _read_rows(path: Path) -> Iterable[tuple[str, Any]]:
    """Yield (source label, row) for each row of a JSON / JSONL / parquet file."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow raises several types for a corrupt file
            raise TaskError(path, f"unreadable parquet: {exc}") from None
        yield from ((f"{path} row {i}", row) for i, row in enumerate(rows))
        return
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TaskError(path, f"not UTF-8 text: {exc}") from None
    if suffix == ".jsonl":
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                yield f"{path} line {number}", json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskError(f"{path} line {number}", f"malformed JSON: {exc}") from None
        return
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TaskError(path, f"malformed JSON: {exc}") from None
    rows = data if isinstance(data, list) else [data]
    yield from ((f"{path} row {i}", row) for i, row in enumerate(rows))


class TaskList(list):
    """The tasks a source yielded; `skipped` holds one TaskError per row that was reported and left out."""

    def __init__(self, tasks: Iterable[Task] = (), skipped: Iterable[TaskError] = ()) -> None:
        super().__init__(tasks)
        self.skipped: list[TaskError] = list(skipped)


def _rows_to_tasks(
    source: str | Path, rows: Iterable[tuple[str, Any]], *, ceilings: GradingCeilings | None = None
) -> TaskList:
    """Map each row; a row with bad fields is logged and skipped, the rest load (none loading is an error)."""
    tasks, skipped = [], []
    for label, row in rows:
        try:
            tasks.append(task_from_row(row, source=label, ceilings=ceilings))
        except TaskError as exc:
            skipped.append(exc)
            log.warning("skipping a task row: %s", exc)
    if not tasks:
        if skipped:
            raise TaskError(source, f"no usable task rows ({len(skipped)} skipped); first: {skipped[0]}")
        raise TaskError(source, "holds no task rows")
    return TaskList(_unique(source, tasks), skipped)


def _load_hf(name: str, split: str, *, ceilings: GradingCeilings | None = None) -> TaskList:
    """A Hugging Face dataset by name (e.g. `R2E-Gym/SWE-Bench-Verified`), through `datasets`."""
    import datasets

    try:
        dataset = datasets.load_dataset(name, split=split)
    except Exception as exc:  # offline, unknown name, unknown split: all surface as a TaskError
        raise TaskError(name, f"cannot load Hugging Face dataset (split {split!r}): {exc}") from None
    rows = ((f"{name}[{split}] row {i}", dict(row)) for i, row in enumerate(dataset))
    return _rows_to_tasks(name, rows, ceilings=ceilings)


def load_tasks(
    source: str | Path,
    *,
    split: str = "test",
    ceilings: GradingCeilings | None = None,
    cache_dir: Path | None = None,
) -> list[Task]:
    """Load tasks from a JSON/JSONL/parquet file, a local task folder or suite, a bundled suite's name, or a
    Hugging Face dataset name. `split` applies only to Hugging Face datasets (R2E-Gym's sets are `train`).

    For files and datasets the result is a :class:`TaskList`: rows with bad fields are skipped and listed in
    its `skipped` (each a TaskError naming the row and field); a file that cannot be read at all raises.
    `ceilings` bounds each task's own `grading` limits (None: the defaults). `cache_dir` is where a packed
    suite's trees are materialised (None: `env.tasks.suite_data.SUITE_CACHE_DIR`).
    """
    path = Path(source).expanduser()
    if path.is_dir():
        return load_task_folder(path, ceilings=ceilings, cache_dir=cache_dir)
    if path.is_file():
        if path.suffix.lower() not in FILE_SUFFIXES:
            raise TaskError(path, f"unsupported file type (use {', '.join(FILE_SUFFIXES)})")
        return _rows_to_tasks(path, list(_read_rows(path)), ceilings=ceilings)
    text = str(source)
    if isinstance(source, str) and source in known_suites():
        return load_task_folder(SUITES_DIR / source, ceilings=ceilings, cache_dir=cache_dir)
    looks_like_path = isinstance(source, Path) or text.startswith((".", "/", "~")) or text.endswith(FILE_SUFFIXES)
    if looks_like_path or text.count("/") > 1:
        raise TaskError(text, "no such file or folder")
    return _load_hf(text, split, ceilings=ceilings)


def known_suites() -> list[str]:
    """Names of the suites bundled under env/tasks/suites/."""
    if not SUITES_DIR.is_dir():
        return []
    return sorted(p.name for p in SUITES_DIR.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def load_suite(
    name_or_path: str | Path, *, ceilings: GradingCeilings | None = None, cache_dir: Path | None = None
) -> list[Task]:
    """A bundled suite by name (`"mini"` -> env/tasks/suites/mini/) or any folder of local tasks; a packed suite's
    trees are materialised under `cache_dir` (None: `env.tasks.suite_data.SUITE_CACHE_DIR`)."""
    if isinstance(name_or_path, str) and name_or_path in known_suites():
        return load_task_folder(SUITES_DIR / name_or_path, ceilings=ceilings, cache_dir=cache_dir)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return load_task_folder(path, ceilings=ceilings, cache_dir=cache_dir)
    raise TaskError(
        str(name_or_path),
        f"unknown suite (bundled: {', '.join(known_suites()) or 'none'}; or pass a folder of local tasks)",
    )


class TaskNotFound(LookupError, ValueError):
    """No task with that id in the source (a LookupError for the service, a ValueError for the CLI)."""


def load_source(
    *,
    suite: str | Path | None = None,
    file: str | Path | None = None,
    split: str = "test",
    ceilings: GradingCeilings | None = None,
) -> list[Task]:
    """The tasks of exactly one source: a bundled suite or task folder (``suite``), or a task file or Hugging
    Face dataset (``file``, with ``split``); ``ceilings`` bounds each task's own grading limits."""
    if (suite is None) == (file is None):
        raise ValueError("give exactly one task source: a suite or a file")
    if suite is not None:
        return load_suite(suite, ceilings=ceilings)
    return load_tasks(file, split=split, ceilings=ceilings)  # type: ignore[arg-type]


def find_task(
    task_id: str,
    *,
    suite: str | Path | None = None,
    file: str | Path | None = None,
    split: str = "test",
    ceilings: GradingCeilings | None = None,
) -> Task:
    """The task ``task_id`` of one source (see :func:`load_source`); :class:`TaskNotFound` names the source and
    some of the ids it does have."""
    tasks = load_source(suite=suite, file=file, split=split, ceilings=ceilings)
    return pick_task(tasks, task_id, source=str(file or suite))


def pick_task(tasks: list[Task], task_id: str, *, source: str) -> Task:
    """The task ``task_id`` among a loaded source's ``tasks``; :class:`TaskNotFound` names ``source`` and some
    of the ids it does have."""
    for task in tasks:
        if task.instance_id == task_id:
            return task
    known = ", ".join(t.instance_id for t in tasks[:20]) + (", ..." if len(tasks) > 20 else "")
    raise TaskNotFound(f"no task {task_id!r} in {source}; known: {known}")
