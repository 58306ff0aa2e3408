"""Unified diffs as the expert backend (``agent_runner.backends.expert``) reads its gold patch.

:func:`parse_patch` reads a unified diff (git's, or plain ``---``/``+++``) into :class:`FilePatch` es and their
:class:`Hunk` s. A hunk keeps its lines with their tags, because the edit planning (``expert_plan``) needs the
changed lines and the context around them apart: the context is what an ``old_str`` may grow into.

Every failure of the expert's derivations is an :class:`EditError` whose message says what could not be derived
and why (this module, where the derivations start, defines it; ``expert_plan`` raises it too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$")


class EditError(ValueError):
    """The expert cannot derive an action; the message says exactly why."""


@dataclass(frozen=True)
class Hunk:
    """One ``@@`` block: ``lines`` keep their tag (``' '``, ``'-'``, ``'+'``), without a trailing CR."""

    old_start: int
    old_len: int
    new_start: int
    new_len: int
    header: str
    lines: tuple[str, ...]

    @property
    def title(self) -> str:
        return f"@@ -{self.old_start},{self.old_len} +{self.new_start},{self.new_len} @@"

    @property
    def old_lines(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " -"]

    @property
    def new_lines(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " +"]

    @property
    def removes(self) -> bool:
        return any(line[0] == "-" for line in self.lines)

    def core(self) -> tuple[int, int, list[str]]:
        """``(a, b, replacement)``: old lines ``[a, b)`` run from the first to the last changed line of the hunk
        (a == b for a pure insertion, at old line index a) and ``replacement`` is what the patch puts there."""
        old = new = 0
        first: tuple[int, int] | None = None
        last = (0, 0)
        for line in self.lines:
            tag = line[0]
            if tag != " " and first is None:
                first = (old, new)
            old += tag in " -"
            new += tag in " +"
            if tag != " ":
                last = (old, new)
        if first is None:
            raise EditError(f"hunk {self.title} changes nothing")
        return first[0], last[0], self.new_lines[first[1] : last[1]]


@dataclass(frozen=True)
class FilePatch:
    """One file of a patch. ``old_path`` None: the patch creates it; ``new_path`` None: it deletes it."""

    old_path: str | None
    new_path: str | None
    hunks: tuple[Hunk, ...] = ()
    binary: bool = False

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""

    @property
    def kind(self) -> Literal["added", "deleted", "renamed", "modified"]:
        if self.old_path is None:
            return "added"
        if self.new_path is None:
            return "deleted"
        return "renamed" if self.old_path != self.new_path else "modified"

    def new_content(self) -> str:
        """The whole text of an added file."""
        return "".join(line + "\n" for hunk in self.hunks for line in hunk.new_lines)


def _diff_path(text: str) -> str | None:
    path = text.split("\t")[0].strip()
    if path == "/dev/null":
        return None
    if path.startswith('"'):
        raise EditError(f"quoted path {path} in the patch is not supported")
    return path[2:] if path[:2] in ("a/", "b/") else path


def _git_header_paths(rest: str) -> tuple[str, str]:
    """``a/X b/Y`` of a ``diff --git`` line (for a file without ``---``/``+++``, e.g. an empty new file)."""
    if rest.startswith("a/"):
        half = (len(rest) - 1) // 2  # "a/X b/X": the split that gives equal halves
        if rest[half] == " " and rest[half + 1 : half + 3] == "b/" and rest[2:half] == rest[half + 3 :]:
            return rest[2:half], rest[half + 3 :]
        where = rest.find(" b/")
        if where > 0:
            return rest[2:where], rest[where + 3 :]
    raise EditError(f"cannot read the paths of 'diff --git {rest}'")


class _Builder:
    def __init__(self, old: str | None = None, new: str | None = None) -> None:
        self.old, self.new = old, new
        self.added = self.deleted = self.binary = False
        self.hunks: list[Hunk] = []
        self.minus_seen = False

    def build(self) -> FilePatch:
        old = None if self.added else self.old
        new = None if self.deleted else self.new
        return FilePatch(old_path=old, new_path=new, hunks=tuple(self.hunks), binary=self.binary)


def parse_patch(text: str) -> list[FilePatch]:
    """The files of a unified diff, in order. EditError for a hunk whose body does not match its header."""
    lines = text.split("\n")
    files: list[_Builder] = []
    current: _Builder | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith("diff --git "):
            current = _Builder(*_git_header_paths(line[len("diff --git ") :].rstrip("\r")))
            files.append(current)
        elif line.startswith("--- ") and (current is None or current.minus_seen or current.hunks):
            current = _Builder(_diff_path(line[4:]), None)
            current.minus_seen = True
            files.append(current)
        elif current is None:
            continue
        elif line.startswith("--- "):
            current.old, current.minus_seen = _diff_path(line[4:]), True
            current.added = current.added or current.old is None
        elif line.startswith("+++ "):
            current.new = _diff_path(line[4:])
            current.deleted = current.deleted or current.new is None
        elif line.startswith("new file mode"):
            current.added = True
        elif line.startswith("deleted file mode"):
            current.deleted = True
        elif line.startswith("rename from "):
            current.old = line[len("rename from ") :].strip()
        elif line.startswith("rename to "):
            current.new = line[len("rename to ") :].strip()
        elif line.startswith("Binary files ") or line.startswith("GIT binary patch"):
            current.binary = True
        elif line.startswith("@@ "):
            hunk, i = _read_hunk(line, lines, i, current.new or current.old or "?")
            current.hunks.append(hunk)
    return [builder.build() for builder in files]


def _read_hunk(header: str, lines: list[str], i: int, path: str) -> tuple[Hunk, int]:
    match = _HUNK_RE.match(header.rstrip("\r"))
    if match is None:
        raise EditError(f"{path}: unreadable hunk header {header!r}")
    old_start, new_start = int(match.group(1)), int(match.group(3))
    old_len = 1 if match.group(2) is None else int(match.group(2))
    new_len = 1 if match.group(4) is None else int(match.group(4))
    body: list[str] = []
    old_left, new_left = old_len, new_len
    while old_left > 0 or new_left > 0:
        if i >= len(lines):
            raise EditError(f"{path}: hunk {header.strip()} ends before its {old_len}/{new_len} lines")
        line = lines[i].removesuffix("\r")
        i += 1
        if line.startswith("\\"):
            continue  # "\ No newline at end of file"
        tag = line[:1] or " "  # a blank context line whose space was trimmed
        if tag == " " and old_left > 0 and new_left > 0:
            old_left, new_left = old_left - 1, new_left - 1
        elif tag == "-" and old_left > 0:
            old_left -= 1
        elif tag == "+" and new_left > 0:
            new_left -= 1
        else:
            raise EditError(f"{path}: hunk {header.strip()} has a line that does not fit its header: {line!r}")
        body.append(tag + line[1:])
    hunk = Hunk(old_start, old_len, new_start, new_len, match.group(5).strip(), tuple(body))
    return hunk, i
