"""The gold patch of an R2E-native row, rebuilt from its `parsed_commit_content` as R2E-Gym builds it.

An R2E-native row usually has no `patch`, so the patch a grader checks the task with comes from R2E-Gym's
record of the upstream commit. `parsed_commit_content` is that record as JSON: a list `file_diffs`, one per
changed file, each with the lines of its `git diff` header (`header.file.path`, `header.misc_line` for mode
lines, `index_line`, `binary_line`, `minus_file` / `plus_file` for the `---` / `+++` lines) and its `hunks`
(`descriptor` with `old_range` / `new_range` {start, length} and `section`, then `line_group.all_lines`, each
{content, type: context | added | deleted | note}). R2E-Gym's gold patch for the agent's task (its
trajectories' `gt_patch`: the commit's patch without test files, Python files only) is the diff of the files
that are `.py` and not tests, in the record's order.
"""

from __future__ import annotations

import json
from typing import Any

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
