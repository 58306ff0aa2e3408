"""Tasks: one pydantic `Task` for SWE-bench, R2E-Gym and local task folders, and the loaders.

Row kinds (see docs/tasks.md):
- `swebench`: a SWE-bench classic row (`instance_id`, `repo`, `base_commit`, ..., FAIL_TO_PASS/PASS_TO_PASS
  as JSON-encoded strings or lists; optional `docker_image`, or 5.x's `image`).
- `r2e_swebench`: the same row as republished by R2E-Gym, with `docker_image` like
  `slimshetty/swebench-verified:sweb.eval.x86_64.<instance_id>` (and often `parsed_commit`).
- `r2e`: an R2E-native row (`repo_name`, `docker_image`, `expected_output_json`, no `instance_id`); the id is
  derived as `<repo_name>__<commit_hash[:12]>` (rLLM's convention), stable across loads.
- `local`: a folder with `task.json` and `repo/` (the source tree at the base state).

Sources: a `.json` / `.jsonl` / `.parquet` file, a local task folder, a folder of task folders (a suite), or a
Hugging Face dataset name (through `datasets.load_dataset`). Bad input raises `TaskError` naming the file and
field; nothing is silently dropped.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

TaskKind = Literal["swebench", "r2e_swebench", "r2e", "local"]

DEFAULT_TEST_CMD = "python -m pytest -rA"
SUITES_DIR = Path(__file__).resolve().parent / "suites"
TASK_FILE = "task.json"
REPO_DIR = "repo"

# `owner__name-N` as SWE-bench spells ids; local ids must match so they are safe as folder and image-tag parts.
LOCAL_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*__[A-Za-z0-9][A-Za-z0-9_.-]*-[0-9]+$")
R2E_SWEBENCH_IMAGE = re.compile(r"^slimshetty/swebench-[a-z]+:sweb\.eval\.")
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
LOCAL_OPTIONAL = ("version", "test_cmd", "setup", "hints_text", "created_at")
LOCAL_FORBIDDEN = ("base_commit", "docker_image", "image")


class TaskError(ValueError):
    """Bad task input. `source` is the file (and row) it came from, `field` the offending field (or None)."""

    def __init__(self, source: str | Path, message: str, *, field: str | None = None) -> None:
        self.source = str(source)
        self.field = field
        where = f"{self.source}: field '{field}'" if field else self.source
        super().__init__(f"{where}: {message}")


class Task(BaseModel):
    """One task an agent is evaluated on. Test ids are pytest node ids as swebench's log parser reports them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_id: str
    repo: str
    base_commit: str | None = None
    problem_statement: str
    patch: str
    test_patch: str
    FAIL_TO_PASS: list[str]
    PASS_TO_PASS: list[str]
    version: str | None = None
    docker_image: str | None = None
    test_cmd: str = DEFAULT_TEST_CMD
    setup: list[str] = []
    expected_output_json: str | None = None
    kind: TaskKind
    local_dir: Path | None = None

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _decode_test_list(cls, value: Any) -> Any:
        # SWE-bench stores both lists as JSON-encoded strings; parquet/HF can hand us tuples or arrays.
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else []
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a JSON-encoded list: {exc}") from None
        if not isinstance(value, list | tuple) and hasattr(value, "tolist"):
            value = value.tolist()
        if not isinstance(value, list | tuple):
            raise ValueError(f"must be a list of test ids, got {type(value).__name__}")
        return list(value)

    @field_validator("version", mode="before")
    @classmethod
    def _version_as_text(cls, value: Any) -> Any:
        # Some dumps store "3.0" as a float; keep the text form the harness keys on.
        return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value

    @field_validator("instance_id", "repo")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @property
    def repo_dir(self) -> Path | None:
        """Local tasks: the source tree at the base state (`<local_dir>/repo`)."""
        return self.local_dir / REPO_DIR if self.local_dir is not None else None


def _validate(source: str, fields: dict[str, Any]) -> Task:
    """Build a Task, turning pydantic's error into a TaskError that names the source and the field."""
    try:
        return Task(**fields)
    except ValidationError as exc:
        errors = exc.errors()
        locs = [".".join(str(p) for p in e["loc"]) for e in errors]
        messages = [e["msg"].removeprefix("Value error, ") + f" (got {e['input']!r:.80})" for e in errors]
        also = "".join(f"; also field '{loc}': {msg}" for loc, msg in zip(locs[1:], messages[1:], strict=True))
        raise TaskError(source, messages[0] + also, field=locs[0] or None) from None


def _row_kind(row: dict[str, Any]) -> TaskKind:
    # R2E-native rows: `repo_name` and the exact-match oracle, no SWE-bench base commit (and usually no id).
    if (
        row.get("repo_name")
        and not row.get("base_commit")
        and (not row.get("instance_id") or "expected_output_json" in row)
    ):
        return "r2e"
    image = row.get("docker_image") or ""
    if "parsed_commit" in row or R2E_SWEBENCH_IMAGE.match(image):
        return "r2e_swebench"
    return "swebench"


def r2e_instance_id(row: dict[str, Any]) -> str:
    """A stable id for an R2E-native row: `<repo_name>__<commit_hash[:12]>` (rLLM's spelling).

    Without `commit_hash` it falls back to the image tag (R2E tags images by commit), then to a hash of
    image + problem statement, so the id never changes between loads of the same row.
    """
    repo_name = str(row.get("repo_name") or "").strip()
    commit = str(row.get("commit_hash") or "").strip()
    image = str(row.get("docker_image") or "")
    tag = image.rsplit(":", 1)[1] if ":" in image else ""
    if not commit and tag and "/" not in tag:  # "registry:5000/name" has a port, not a tag
        commit = tag
    if not commit:
        seed = f"{image}\n{row.get('problem_statement') or ''}".encode()
        commit = hashlib.sha256(seed).hexdigest()
    return f"{repo_name}__{commit[:12]}"


def _r2e_base_commit(row: dict[str, Any]) -> str | None:
    content = row.get("parsed_commit_content")
    if isinstance(content, str):
        try:
            content = json.loads(content)
        except json.JSONDecodeError:
            return None
    return content.get("old_commit_hash") if isinstance(content, dict) else None


def task_from_row(row: dict[str, Any], *, source: str = "<row>") -> Task:
    """Map one dataset row (SWE-bench classic, R2E SWE-bench or R2E-native) onto a Task."""
    if not isinstance(row, dict):
        raise TaskError(source, f"a task row must be an object, got {type(row).__name__}")
    kind = _row_kind(row)
    if kind == "r2e":
        for key in ("repo_name", "docker_image", "problem_statement", "expected_output_json"):
            if not row.get(key):
                raise TaskError(source, "required for an R2E-native row", field=key)
        expected = row["expected_output_json"]
        if not isinstance(expected, str):
            expected = json.dumps(expected)
        fields = {
            "instance_id": row.get("instance_id") or r2e_instance_id(row),
            "repo": row["repo_name"],
            "base_commit": _r2e_base_commit(row),
            "problem_statement": row["problem_statement"],
            "patch": row.get("patch") or "",
            "test_patch": row.get("test_patch") or "",
            "FAIL_TO_PASS": row.get("FAIL_TO_PASS") or [],
            "PASS_TO_PASS": row.get("PASS_TO_PASS") or [],
            "docker_image": row["docker_image"],
            "expected_output_json": expected,
        }
    else:
        required = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch")
        for key in (*required, "FAIL_TO_PASS", "PASS_TO_PASS"):
            if key not in row or row[key] is None:
                raise TaskError(source, f"required for a {kind} row", field=key)
        fields = {key: row[key] for key in (*required, "FAIL_TO_PASS", "PASS_TO_PASS")}
        fields["version"] = row.get("version")
        fields["docker_image"] = row.get("docker_image") or row.get("image")
    for key in ("test_cmd", "setup"):
        if row.get(key):
            fields[key] = row[key]
    return _validate(source, {**fields, "kind": kind})


def load_local_task(task_dir: str | Path) -> Task:
    """Load one local task folder (`task.json` + `repo/`)."""
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
    unknown = sorted(set(data) - set(LOCAL_REQUIRED) - set(LOCAL_OPTIONAL))
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
    repo = task_dir / REPO_DIR
    if not repo.is_dir() or not any(repo.iterdir()):
        raise TaskError(
            task_dir,
            f"missing or empty {REPO_DIR}/ (the source tree at the base state)",
            field=f"{REPO_DIR}/",
        )
    fields = {key: data[key] for key in LOCAL_REQUIRED + ("version", "test_cmd", "setup") if key in data}
    return _validate(str(task_file), {**fields, "kind": "local", "local_dir": task_dir})


def load_task_folder(folder: str | Path) -> list[Task]:
    """Load a suite: every sub-folder of `folder` is a local task (hidden folders are skipped)."""
    folder = Path(folder).resolve()
    if (folder / TASK_FILE).is_file():
        return [load_local_task(folder)]
    task_dirs = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    if not task_dirs:
        raise TaskError(folder, f"no task folders (each needs {TASK_FILE} and {REPO_DIR}/)")
    return _unique(folder, [load_local_task(d) for d in task_dirs])


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


def _load_hf(name: str, split: str) -> list[Task]:
    """A Hugging Face dataset by name (e.g. `R2E-Gym/SWE-Bench-Verified`), through `datasets`."""
    import datasets

    try:
        dataset = datasets.load_dataset(name, split=split)
    except Exception as exc:  # offline, unknown name, unknown split: all surface as a TaskError
        raise TaskError(name, f"cannot load Hugging Face dataset (split {split!r}): {exc}") from None
    return _unique(name, [task_from_row(dict(row), source=f"{name}[{split}] row {i}") for i, row in enumerate(dataset)])


def load_tasks(source: str | Path, *, split: str = "test") -> list[Task]:
    """Load tasks from a JSON/JSONL/parquet file, a local task folder or suite, a bundled suite's name, or a
    Hugging Face dataset name. `split` applies only to Hugging Face datasets.
    """
    path = Path(source).expanduser()
    if path.is_dir():
        return load_task_folder(path)
    if path.is_file():
        if path.suffix.lower() not in FILE_SUFFIXES:
            raise TaskError(path, f"unsupported file type (use {', '.join(FILE_SUFFIXES)})")
        tasks = [task_from_row(row, source=label) for label, row in _read_rows(path)]
        if not tasks:
            raise TaskError(path, "holds no task rows")
        return _unique(path, tasks)
    text = str(source)
    if isinstance(source, str) and source in known_suites():
        return load_task_folder(SUITES_DIR / source)
    looks_like_path = isinstance(source, Path) or text.startswith((".", "/", "~")) or text.endswith(FILE_SUFFIXES)
    if looks_like_path or text.count("/") > 1:
        raise TaskError(text, "no such file or folder")
    return _load_hf(text, split)


def known_suites() -> list[str]:
    """Names of the suites bundled under env/suites/."""
    if not SUITES_DIR.is_dir():
        return []
    return sorted(p.name for p in SUITES_DIR.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def load_suite(name_or_path: str | Path) -> list[Task]:
    """A bundled suite by name (`"mini"` -> env/suites/mini/) or any folder of local tasks."""
    if isinstance(name_or_path, str) and name_or_path in known_suites():
        return load_task_folder(SUITES_DIR / name_or_path)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return load_task_folder(path)
    raise TaskError(
        str(name_or_path),
        f"unknown suite (bundled: {', '.join(known_suites()) or 'none'}; or pass a folder of local tasks)",
    )


class TaskNotFound(LookupError, ValueError):
    """No task with that id in the source (a LookupError for the service, a ValueError for the CLI)."""


def load_source(*, suite: str | Path | None = None, file: str | Path | None = None, split: str = "test") -> list[Task]:
    """The tasks of exactly one source: a bundled suite or task folder (``suite``), or a task file or Hugging
    Face dataset (``file``, with ``split``)."""
    if (suite is None) == (file is None):
        raise ValueError("give exactly one task source: a suite or a file")
    return load_suite(suite) if suite is not None else load_tasks(file, split=split)  # type: ignore[arg-type]


def find_task(
    task_id: str, *, suite: str | Path | None = None, file: str | Path | None = None, split: str = "test"
) -> Task:
    """The task ``task_id`` of one source (see :func:`load_source`); :class:`TaskNotFound` names the source and
    some of the ids it does have."""
    tasks = load_source(suite=suite, file=file, split=split)
    for task in tasks:
        if task.instance_id == task_id:
            return task
    known = ", ".join(t.instance_id for t in tasks[:20]) + (", ..." if len(tasks) > 20 else "")
    raise TaskNotFound(f"no task {task_id!r} in {file or suite}; known: {known}")
