"""The `Task` model and how one dataset row becomes a Task (SWE-bench classic and 5.x, R2E-Gym's SWE-bench
republication, R2E-native). Loading files, folders and datasets is `env.tasks.loading`.

A Task keeps what its row carries: the fields grading needs are typed (`eval_script`, `log_parser`,
`eval_type`, `image_assets` for SWE-bench 5.x rows; `expected_output_json` for R2E rows), and the whole row
stays in `source_row`, so nothing a later grader or report needs is lost at load time.

An R2E-native row usually has no `patch`: its gold patch is rebuilt from `parsed_commit_content` (R2E-Gym's
record of the upstream commit, file by file and hunk by hunk) as R2E-Gym builds the agent's gold patch:
the commit's non-test Python files only (`r2e_gold_patch`).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from env.tasks.ceilings import GradingCeilings, GradingLimitError, check_limits

TaskKind = Literal["swebench", "r2e_swebench", "r2e", "local"]

DEFAULT_TEST_CMD = "python -m pytest -rA"
REPO_DIR = "repo"
TASK_FILE = "task.json"  # a local task folder: TASK_FILE and REPO_DIR/ (or a packed suite's bug patch)
R2E_SWEBENCH_IMAGE = re.compile(r"^slimshetty/swebench-[a-z]+:sweb\.eval\.")
# R2E-Gym shows the agent only the text between the first [ISSUE] and the last [/ISSUE] (greedy, any lines).
R2E_ISSUE_TAGS = re.compile(r"\[ISSUE\](.*)\[/ISSUE\]", re.DOTALL)
# Repositories whose tests reach out to the internet (requests' tests call httpbin.org); a row may say
# otherwise with its own `needs_network`.
NETWORK_REPOS = frozenset({"psf/requests"})
# A setup line becomes one Dockerfile `RUN` line (env.tasks.images): a line break would start a new instruction
# (`ADD http://...`, fetched by the daemon outside the build's network_mode none, or a new `FROM`), so no
# control character but tab may appear in it, nor a trailing backslash (it would join the next line).
SETUP_FORBIDDEN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]|\\\s*$")


def setup_problem(task_id: str, lines: list[str]) -> str | None:
    """Why `lines` cannot be `task_id`'s setup lines (each one Dockerfile RUN instruction), naming the first bad
    line; None when every line is fine."""
    for number, line in enumerate(lines, start=1):
        match = SETUP_FORBIDDEN.search(line)
        if match is None:
            continue
        if match.group(0).startswith("\\"):
            why = "ends with a backslash, which would join the next Dockerfile line to it"
        else:
            why = (
                f"holds the control character {match.group(0)!r} "
                "(a setup line must be a single line; only tab is allowed)"
            )
        return f"task {task_id}: setup line {number} {why}: {line!r:.120}"
    return None


class TaskError(ValueError):
    """Bad task input. `source` is the file (and row) it came from, `field` the offending field (or None)."""

    def __init__(self, source: str | Path, message: str, *, field: str | None = None) -> None:
        self.source = str(source)
        self.field = field
        where = f"{self.source}: field '{field}'" if field else self.source
        super().__init__(f"{where}: {message}")


class GradingLimits(BaseModel):
    """A task's own grading limits; unset fields take the grader's defaults (see docs/tasks.md). Each must stay
    within the operator's ceilings (`env.tasks.ceilings.GradingCeilings`), checked by the loaders and again
    when the task is graded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float | None = Field(None, gt=0, description="the test run's limit")
    memory: str | None = Field(None, description="docker memory limit, e.g. '8g'")
    cpus: float | None = Field(None, gt=0)
    pids: int | None = Field(None, ge=16)
    network: bool | None = Field(None, description="give the grading container a network")


class Task(BaseModel):
    """One task an agent is evaluated on. Test ids are spelled as the task's log parser reports them."""

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
    # SWE-bench 5.x grading metadata (absent on classic rows until `nexus-eval tasks convert` adds it)
    eval_script: str | None = None
    log_parser: str | None = None
    eval_type: str | None = None
    image_assets: dict[str, Any] | None = None
    converted_by: str | None = None
    environment_setup_commit: str | None = None
    needs_network: bool = False
    grading: GradingLimits = GradingLimits()
    source_row: dict[str, Any] = Field(default_factory=dict, repr=False)

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

    @field_validator("image_assets", mode="before")
    @classmethod
    def _decode_assets(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else None
            except json.JSONDecodeError as exc:
                raise ValueError(f"not JSON: {exc}") from None
        return value or None

    @field_validator("version", mode="before")
    @classmethod
    def _version_as_text(cls, value: Any) -> Any:
        # Some dumps store "3.0" as a float; keep the text form the harness keys on.
        return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value

    @field_validator("setup")
    @classmethod
    def _single_lines(cls, value: list[str], info: ValidationInfo) -> list[str]:
        problem = setup_problem(info.data.get("instance_id", "?"), value)
        if problem:
            raise ValueError(problem)
        return value

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

    @property
    def has_swebench_metadata(self) -> bool:
        """True when swebench 5.x can build this row's test spec as it is (no conversion needed)."""
        return bool(self.eval_script and self.log_parser and self.eval_type)


def validate_fields(source: str, fields: dict[str, Any], *, ceilings: GradingCeilings | None = None) -> Task:
    """Build a Task, turning pydantic's error into a TaskError that names the source and the field; a `grading`
    block over the operator's `ceilings` (None: `env.tasks.ceilings.DEFAULT_CEILINGS`) is a TaskError too."""
    try:
        task = Task(**fields)
    except ValidationError as exc:
        errors = exc.errors()
        locs = [".".join(str(p) for p in e["loc"]) for e in errors]
        messages = [e["msg"].removeprefix("Value error, ") + f" (got {e['input']!r:.80})" for e in errors]
        also = "".join(f"; also field '{loc}': {msg}" for loc, msg in zip(locs[1:], messages[1:], strict=True))
        raise TaskError(source, messages[0] + also, field=locs[0] or None) from None
    try:
        check_limits(task.instance_id, task.grading, ceilings)
    except GradingLimitError as exc:  # the same message grading gives, located at the source
        raise TaskError(source, str(exc), field=f"grading.{exc.field}") from None
    return task


def row_kind(row: dict[str, Any]) -> TaskKind:
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


def r2e_problem_statement(text: str) -> str:
    """What R2E-Gym shows the agent: the text inside `[ISSUE]...[/ISSUE]` when the tags are there."""
    match = R2E_ISSUE_TAGS.search(text)
    return match.group(1) if match else text


# -- the gold patch of an R2E-native row, rebuilt from `parsed_commit_content` ---------------------------------
#
# `parsed_commit_content` is R2E-Gym's JSON record of the upstream commit a task was made from: a list
# `file_diffs`, one per changed file, each with the lines of its `git diff` header (`header.file.path`,
# `header.misc_line` for mode lines, `index_line`, `binary_line`, `minus_file` / `plus_file` for the
# `---` / `+++` lines) and its `hunks` (`descriptor` with `old_range` / `new_range` {start, length} and
# `section`, then `line_group.all_lines`, each {content, type: context | added | deleted | note}).
# R2E-Gym's gold patch for the agent's task (its trajectories' `gt_patch`: the commit's patch without test
# files, Python files only) is the diff of the files that are `.py` and not tests, in the record's order.

R2E_COMMIT_FIELD = "parsed_commit_content"
# A path component with one of these names makes a file a test file in R2E-Gym's split of a commit.
R2E_TEST_DIRS = frozenset({"test", "tests", "Test", "Tests"})
_LINE_MARK = {"context": " ", "added": "+", "deleted": "-", "note": "\\ "}


def r2e_is_test_file(path: str) -> bool:
    """R2E-Gym's test-file rule: a `test_*` or `*_test.py` file name, a path that starts with `test_`, or a
    folder (or name) `test`, `tests`, `Test` or `Tests` anywhere in the path."""
    parts = path.split("/")
    return (
        path.startswith("test_")
        or parts[-1].startswith("test_")
        or path.endswith("_test.py")
        or not R2E_TEST_DIRS.isdisjoint(parts)
    )


def _get(obj: Any, key: str, kind: type, where: str, *, optional: bool = False) -> Any:
    """`obj[key]`, which must be of `kind` (or missing / null when `optional`); else a ValueError at `where`."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected an object, got {type(obj).__name__}")
    value = obj.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        got = "nothing" if value is None else type(value).__name__
        raise ValueError(f"{where}: '{key}' must be {kind.__name__}, got {got}")
    return value


def _diff_path(path: str, side: str) -> str:
    # git quotes a path it must escape (`"a/caf\303\251.py"`); R2E-Gym keeps it escaped but unquoted.
    return f'"{side}/{path}"' if "\\" in path else f"{side}/{path}"


def _hunk_text(hunk: Any, where: str) -> str:
    descriptor = _get(hunk, "descriptor", dict, where)
    spans = []
    for key in ("old_range", "new_range"):
        span = _get(descriptor, key, dict, f"{where}.descriptor")
        start = _get(span, "start", int, f"{where}.descriptor.{key}")
        length = _get(span, "length", int, f"{where}.descriptor.{key}", optional=True)
        spans.append((start, length))
    section = _get(descriptor, "section", str, f"{where}.descriptor", optional=True) or ""
    header = "@@ -{} +{} @@".format(
        *(f"{start}" if length is None else f"{start},{length}" for start, length in spans)
    ) + (f" {section}" if section else "")

    lines = []
    for i, line in enumerate(_get(_get(hunk, "line_group", dict, where), "all_lines", list, f"{where}.line_group")):
        at = f"{where}.line_group.all_lines[{i}]"
        kind = _get(line, "type", str, at)
        if kind not in _LINE_MARK:
            raise ValueError(f"{at}: unknown line type {kind!r} (context, added, deleted or note)")
        lines.append((kind, _get(line, "content", str, at)))
    # The header's counts (a missing length means 1) must match the lines. R2E-Gym's parser reads the diff's
    # final newline as one more, empty context line at the end of the commit's last hunk: drop it, as git
    # (which stops at the counts) would.
    want_old, want_new = (1 if length is None else length for _, length in spans)
    has_old = sum(kind in ("context", "deleted") for kind, _ in lines)
    has_new = sum(kind in ("context", "added") for kind, _ in lines)
    while has_old > want_old and has_new > want_new and lines and lines[-1] == ("context", ""):
        lines.pop()
        has_old, has_new = has_old - 1, has_new - 1
    if (has_old, has_new) != (want_old, want_new):
        raise ValueError(
            f"{where}: '{header}' counts {want_old} old and {want_new} new lines, "
            f"but the hunk has {has_old} and {has_new}"
        )
    return header + "\n" + "".join(f"{_LINE_MARK[kind]}{text}\n" for kind, text in lines)


def _file_diff_text(diff: dict[str, Any], path: str, where: str) -> str:
    text = f"diff --git {_diff_path(path, 'a')} {_diff_path(path, 'b')}\n"
    misc = _get(_get(diff, "header", dict, where), "misc_line", str, f"{where}.header", optional=True)
    if misc:  # mode lines: "new file mode 100644", "old mode ...\nnew mode ...", "deleted file mode ..."
        text += misc + "\n"
    index = _get(diff, "index_line", dict, where, optional=True)
    if index is not None:
        old, new = (_get(index, key, str, f"{where}.index_line") for key in ("old_commit_hash", "new_commit_hash"))
        mode = _get(index, "mode", str, f"{where}.index_line", optional=True)
        text += f"index {old}..{new}" + (f" {mode}" if mode else "") + "\n"
    if _get(diff, "is_binary_file", bool, where, optional=True):
        text += _get(diff, "binary_line", str, where) + "\n"
    minus = _get(diff, "minus_file", dict, where, optional=True)
    plus = _get(diff, "plus_file", dict, where, optional=True)
    if (minus is None) != (plus is None):
        raise ValueError(f"{where}: has only one of 'minus_file' and 'plus_file' (the '---' and '+++' lines)")
    hunks = _get(diff, "hunks", list, where, optional=True) or []
    if minus is not None:
        text += f"--- {_get(minus, 'path', str, f'{where}.minus_file')}\n"
        text += f"+++ {_get(plus, 'path', str, f'{where}.plus_file')}\n"
    elif hunks:
        raise ValueError(f"{where}: has hunks but no 'minus_file' / 'plus_file' (the '---' and '+++' lines)")
    return text + "".join(_hunk_text(hunk, f"{where}.hunks[{i}]") for i, hunk in enumerate(hunks))


def r2e_gold_patch(content: str | dict[str, Any]) -> str:
    """The gold patch R2E-Gym gives an R2E-native task, rebuilt from the row's `parsed_commit_content` (JSON
    text or the decoded object): the `git diff` of the commit's non-test `.py` files, in the record's order.

    Malformed content raises a ValueError that says where (`file_diffs[2].hunks[0]: ...`). The result is empty
    when the commit changes no such file (R2E-Gym's gold patch is then empty too)."""
    if isinstance(content, str):
        try:
            content = json.loads(content)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from None
    diffs = _get(content, "file_diffs", list, "the commit record")
    patch = []
    for i, diff in enumerate(diffs):
        where = f"file_diffs[{i}]"
        file = _get(_get(diff, "header", dict, where), "file", dict, f"{where}.header")
        path = _get(file, "path", str, f"{where}.header.file")
        if not path:
            raise ValueError(f"{where}: the file path is empty")
        if path.endswith(".py") and not r2e_is_test_file(path):
            patch.append(_file_diff_text(diff, path, f"{where} ({path})"))
    return "".join(patch)


def _r2e_commit(row: dict[str, Any]) -> dict[str, Any] | None:
    """The row's `parsed_commit_content` decoded, or None when it is absent or not a JSON object."""
    content = row.get(R2E_COMMIT_FIELD)
    if isinstance(content, str):
        try:
            content = json.loads(content) if content.strip() else None
        except json.JSONDecodeError:
            return None
    return content if isinstance(content, dict) else None


def _r2e_base_commit(row: dict[str, Any]) -> str | None:
    commit = _r2e_commit(row)
    return commit.get("old_commit_hash") if commit else None


def _r2e_patch(row: dict[str, Any], source: str) -> str:
    """The row's own `patch` when it has one; else the gold patch rebuilt from `parsed_commit_content`
    (an error naming the row and that field when it cannot be); else empty."""
    patch = row.get("patch") or ""
    content = row.get(R2E_COMMIT_FIELD)
    if patch.strip() or content is None or (isinstance(content, str) and not content.strip()):
        return patch
    try:
        return r2e_gold_patch(content)
    except ValueError as exc:
        raise TaskError(source, f"cannot rebuild the gold patch: {exc}", field=R2E_COMMIT_FIELD) from None


def _r2e_fields(row: dict[str, Any], source: str) -> dict[str, Any]:
    for key in ("repo_name", "docker_image", "problem_statement", "expected_output_json"):
        if not row.get(key):
            raise TaskError(source, "required for an R2E-native row", field=key)
    expected = row["expected_output_json"]
    if not isinstance(expected, str):
        expected = json.dumps(expected)
    try:
        decoded = json.loads(expected)
    except json.JSONDecodeError as exc:
        raise TaskError(source, f"not JSON: {exc}", field="expected_output_json") from None
    if not isinstance(decoded, dict) or not decoded:
        raise TaskError(source, "must be a non-empty JSON object of test -> status", field="expected_output_json")
    return {
        "instance_id": row.get("instance_id") or r2e_instance_id(row),
        "repo": row["repo_name"],
        "base_commit": _r2e_base_commit(row),
        "problem_statement": r2e_problem_statement(row["problem_statement"]),
        "patch": _r2e_patch(row, source),
        "test_patch": row.get("test_patch") or "",
        "FAIL_TO_PASS": row.get("FAIL_TO_PASS") or [],
        "PASS_TO_PASS": row.get("PASS_TO_PASS") or [],
        "docker_image": row["docker_image"],
        "expected_output_json": expected,
    }


SWEBENCH_REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch")
SWEBENCH_OPTIONAL = ("version", "eval_script", "log_parser", "eval_type", "image_assets", "converted_by")


def task_from_row(row: dict[str, Any], *, source: str = "<row>", ceilings: GradingCeilings | None = None) -> Task:
    """Map one dataset row (SWE-bench classic or 5.x, R2E SWE-bench or R2E-native) onto a Task; its `grading`
    block must stay within `ceilings` (None: the default ceilings, `env.tasks.ceilings`)."""
    if not isinstance(row, dict):
        raise TaskError(source, f"a task row must be an object, got {type(row).__name__}")
    kind = row_kind(row)
    if kind == "r2e":
        fields = _r2e_fields(row, source)
    else:
        for key in (*SWEBENCH_REQUIRED, "FAIL_TO_PASS", "PASS_TO_PASS"):
            if key not in row or row[key] is None:
                raise TaskError(source, f"required for a {kind} row", field=key)
        fields = {key: row[key] for key in (*SWEBENCH_REQUIRED, "FAIL_TO_PASS", "PASS_TO_PASS")}
        fields.update({key: row[key] for key in SWEBENCH_OPTIONAL if row.get(key) is not None})
        fields["environment_setup_commit"] = row.get("environment_setup_commit") or None
        fields["docker_image"] = row.get("docker_image") or row.get("image") or None
        if kind == "r2e_swebench":
            fields["problem_statement"] = r2e_problem_statement(fields["problem_statement"])
    for key in ("test_cmd", "setup", "grading"):
        if row.get(key):
            fields[key] = row[key]
    fields["needs_network"] = bool(row.get("needs_network", fields["repo"] in NETWORK_REPOS))
    return validate_fields(source, {**fields, "kind": kind, "source_row": dict(row)}, ceilings=ceilings)
