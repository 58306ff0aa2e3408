"""What the expert backend (``agent_runner.backends.expert``) knows and derives, as pure functions.

* :func:`parse_patch` reads a unified diff (git's, or plain ``---``/``+++``) into :class:`FilePatch` es and
  their :class:`Hunk` s;
* :func:`parse_view` reads the file lines back from a ``file_editor view`` observation (R2E's
  ``f"{n:6d} "`` prefix) and :func:`parse_wc` the sizes from ``wc -l -c`` output;
* :class:`FileText` is what the expert knows of one file: the lines it viewed (None where it has not), with
  its own edits applied;
* :func:`locate` finds a hunk in a FileText and :func:`edit_candidates` derives the ``str_replace`` calls (or
  an ``insert``) that apply it, smallest context first. An ``old_str`` is copied from viewed lines only; it
  must be unique in the known content AFTER the parser strips it, and replacing the stripped ``old_str`` by the
  stripped ``new_str`` must give exactly the patched lines (the parser strips every parameter value, so an
  indented first line loses its indentation; the file keeps it, and so must the replacement);
* :func:`search_symbol`, :func:`package_imports` choose what to search for and which related modules to read.

Every failure is an :class:`EditError` whose message says what could not be derived and why.
"""

from __future__ import annotations

import builtins
import keyword
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

#: what file_editor appends where it cut a long output (sandbox/tool_scripts/file_editor.py)
CLIP_MARK = "<response clipped>"
#: values a call cannot carry: the parser ends a value / the call at these
FORBIDDEN_IN_VALUES = ("</parameter>", "</function>")
#: how many lines of context an edit may grow to around its change
MAX_GROWTH = 400
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$")
_WC_RE = re.compile(r"^\s*(\d+)\s+(\d+)\s+(.+?)\s*$")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")
_FROM_RE = re.compile(r"^\s*from\s+(\.*)([\w.]*)\s+import\s+\(?([\w\s,]+)")
_IMPORT_RE = re.compile(r"^\s*import\s+([\w.]+(?:\s*,\s*[\w.]+)*)\s*$")
_COMMON = {"self", "None", "True", "False", "args", "kwargs", "value", "values", "result", "text", "name"}


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


# -- reading observations --------------------------------------------------------------------------------------


def parse_view(observation: str, first: int = 1) -> list[str]:
    """The file lines a ``file_editor view`` printed, starting at line ``first`` (R2E's ``f"{n:6d} "``
    prefix), in order; a line the view's clipping cut short is dropped."""
    found: list[str] = []
    number = first
    for line in observation.split("\n"):
        prefix = f"{number:6d} "
        if line.startswith(prefix) or (line == prefix[:-1] and found):
            if found and CLIP_MARK in found[-1]:
                break
            found.append(line[len(prefix) :])
            number += 1
        elif found:
            break
    if found and CLIP_MARK in found[-1]:
        found.pop()
    return found


def parse_wc(output: str) -> dict[str, tuple[int, int]]:
    """``path -> (lines, bytes)`` from ``wc -l -c`` output (a leading ``./`` dropped; the total left out)."""
    sizes: dict[str, tuple[int, int]] = {}
    for line in output.splitlines():
        match = _WC_RE.match(line)
        if match and match.group(3) != "total":
            sizes[match.group(3).removeprefix("./")] = (int(match.group(1)), int(match.group(2)))
    return sizes


# -- the expert's knowledge of one file ------------------------------------------------------------------------


class FileText:
    """One file as the expert knows it: ``lines[i]`` is line i+1, None where it was never viewed; ``seen[i]``
    says the line came from a view (an old_str may copy only those), False for lines its own edits wrote."""

    def __init__(self, n_lines: int = 0) -> None:
        self.lines: list[str | None] = [None] * n_lines
        self.seen: list[bool] = [False] * n_lines

    @classmethod
    def of(cls, text: str) -> FileText:
        """A file viewed whole, lines split as file_editor's view splits them."""
        known = cls()
        known.learn(1, text.splitlines())
        return known

    def learn(self, first: int, lines: list[str]) -> None:
        """Lines ``first``, ``first + 1``, ... as a view printed them."""
        end = first - 1 + len(lines)
        if end > len(self.lines):
            grow = end - len(self.lines)
            self.lines += [None] * grow
            self.seen += [False] * grow
        for k, line in enumerate(lines):
            self.lines[first - 1 + k] = line
            self.seen[first - 1 + k] = True

    def known(self, start: int, end: int) -> bool:
        """Whether lines ``[start, end)`` (0-based) are all known."""
        return 0 <= start <= end <= len(self.lines) and all(line is not None for line in self.lines[start:end])

    def segments(self) -> list[tuple[int, int]]:
        """The maximal runs ``[start, end)`` of known lines."""
        runs, start = [], None
        for i, line in enumerate([*self.lines, None]):
            if line is not None and start is None:
                start = i
            elif line is None and start is not None:
                runs.append((start, i))
                start = None
        return runs

    def segment_text(self, start: int, end: int) -> str:
        return "\n".join(self.lines[start:end])  # type: ignore[arg-type]

    def count(self, needle: str) -> int:
        """Occurrences of ``needle`` in the known content (what str_replace's count sees there)."""
        return sum(self.segment_text(s, e).count(needle) for s, e in self.segments())

    def apply(self, edit: Edit) -> None:
        self.lines[edit.start : edit.end] = list(edit.replacement)
        self.seen[edit.start : edit.end] = [False] * len(edit.replacement)


@dataclass(frozen=True)
class Edit:
    """One editor call applying one hunk: ``str_replace`` (old_str -> new_str) or ``insert`` (new_str after
    line ``insert_line``); values as they will be sent (stripped). It replaces lines ``[start, end)`` of the
    FileText by ``replacement``."""

    command: Literal["str_replace", "insert"]
    old_str: str
    new_str: str
    start: int
    end: int
    replacement: tuple[str, ...]
    insert_line: int | None = None


def emittable(value: str) -> bool:
    """Whether a stripped value survives the call format: the parser would cut it at ``</parameter>`` /
    ``</function>``, and the tool's argparse reads a value starting with ``-`` as an option."""
    return not value.startswith("-") and not any(mark in value for mark in FORBIDDEN_IN_VALUES)


def locate(known: FileText, hunk: Hunk, offset: int, label: str) -> int:
    """The 0-based line where ``hunk``'s old lines start in ``known`` (its header's line moved by ``offset``,
    the line count the earlier hunks of the file added; else the nearest place they match)."""
    old = hunk.old_lines
    guess = (hunk.old_start - 1 if hunk.old_len else hunk.old_start) + offset
    if not old:
        if not 0 <= guess <= len(known.lines):
            raise EditError(f"{label}: it inserts at line {guess} but the file has {len(known.lines)} lines")
        return guess

    def matches(at: int) -> bool:
        return at >= 0 and at + len(old) <= len(known.lines) and known.lines[at : at + len(old)] == old

    if matches(guess):
        return guess
    hits = [at for at in range(len(known.lines) - len(old) + 1) if matches(at)]
    if hits:
        return min(hits, key=lambda at: (abs(at - guess), at))
    if guess < 0 or not known.known(guess, guess + len(old)):
        raise EditError(
            f"{label}: its lines {guess + 1}-{guess + len(old)} were not viewed, and its removed and context lines "
            "are nowhere in the viewed content"
        )
    k = next(k for k in range(len(old)) if known.lines[guess + k] != old[k])
    raise EditError(
        f"{label}: its removed and context lines are not in the viewed content (line {guess + k + 1} reads "
        f"{known.lines[guess + k]!r}, the hunk expects {old[k]!r})"
    )


def _str_replace(
    known: FileText, texts: list[tuple[int, int, str]], start: int, end: int, a: int, b: int, repl: list[str]
) -> Edit | None:
    """The str_replace of lines ``[start, end)`` (the change ``[a, b)`` -> ``repl`` inside), if it is valid;
    ``texts``: the known segments of ``known`` and their text."""
    if start == end or not all(known.seen[start:end]):
        return None
    old_lines = known.lines[start:end]
    new_lines = [*known.lines[start:a], *repl, *known.lines[b:end]]
    old_str, new_str = "\n".join(old_lines).strip(), "\n".join(new_lines).strip()  # type: ignore[arg-type]
    if not old_str or not emittable(old_str) or not emittable(new_str):
        return None
    if sum(text.count(old_str) for _, _, text in texts) != 1:
        return None
    seg_start, seg_end, text = next((s, e, t) for s, e, t in texts if s <= start and end <= e)
    want = "\n".join([*known.lines[seg_start:a], *repl, *known.lines[b:seg_end]])  # type: ignore[list-item]
    if text.replace(old_str, new_str) != want:
        return None  # the stripping changed the result (indentation or blank lines lost)
    return Edit("str_replace", old_str, new_str, a, b, tuple(repl))


def _insert(known: FileText, a: int, repl: list[str]) -> Edit | None:
    new_str = "\n".join(repl).strip()
    if not new_str or not emittable(new_str) or new_str.split("\n") != repl:
        return None
    return Edit("insert", "", new_str, a, a, tuple(repl), insert_line=a)


def edit_candidates(known: FileText, hunk: Hunk, at: int, label: str) -> Iterator[Edit]:
    """The valid calls applying ``hunk`` (located at line index ``at``), smallest context first: the changed
    lines, then one more line above, one more below, alternately (only over viewed lines). A pure insertion
    with no valid context falls back to ``insert``. EditError when there is none at all."""
    a, b, repl = hunk.core()
    a, b = at + a, at + b
    if not all(known.seen[a:b]):
        raise EditError(f"{label}: its changed lines {a + 1}-{b} were not viewed")
    texts = [(s, e, known.segment_text(s, e)) for s, e in known.segments()]
    up = down = 0
    found = False
    for _ in range(MAX_GROWTH):
        edit = _str_replace(known, texts, a - up, b + down, a, b, repl)
        if edit is not None:
            found = True
            yield edit
        can_up = a - up > 0 and known.seen[a - up - 1]
        can_down = b + down < len(known.lines) and known.seen[b + down]
        if can_up and (up <= down or not can_down):
            up += 1
        elif can_down:
            down += 1
        else:
            break
    if a == b:
        edit = _insert(known, a, repl)
        if edit is not None:
            found = True
            yield edit
    if not found:
        raise EditError(
            f"{label}: no context around the change is unique in the viewed content and survives the parser's "
            "stripping of the values (or the change itself holds '</parameter>' / '</function>')"
        )


# -- choosing what to look at ----------------------------------------------------------------------------------

_BUILTINS = set(dir(builtins))


def _identifiers(lines: list[str]) -> list[str]:
    found = []
    for line in lines:
        for name in _IDENT_RE.findall(line):
            if not keyword.iskeyword(name) and name not in _BUILTINS and name not in _COMMON and name not in found:
                found.append(name)
    return found


def search_symbol(patches: list[FilePatch]) -> str:
    """What to search for first: a function the hunk headers name, else a class, else an identifier of the
    removed lines, of the context lines, of the added lines, else the first file's module name."""
    hunks = [hunk for patch in patches for hunk in patch.hunks]
    for pattern in (r"\bdef\s+(\w+)", r"\bclass\s+(\w+)"):
        for hunk in hunks:
            match = re.search(pattern, hunk.header)
            if match:
                return match.group(1)
    for tag in "- +":
        names = _identifiers([line[1:] for hunk in hunks for line in hunk.lines if line[0] == tag])
        if names:
            return names[0]
    stem = patches[0].path.rsplit("/", 1)[-1].split(".")[0] if patches else ""
    return stem or "def"


def package_imports(path: str, lines: list[str]) -> list[str]:
    """Paths (``pkg/mod.py`` and ``pkg/mod/__init__.py`` forms) of the modules that the module at ``path``
    imports from its own package, in the order of its import lines."""
    parts = path.split("/")[:-1]
    found: list[str] = []

    def add(dotted: list[str], base: list[str]) -> None:
        for candidate in ("/".join([*base, *dotted]) + ".py", "/".join([*base, *dotted, "__init__.py"])):
            if candidate not in found and candidate != path:
                found.append(candidate)

    for line in lines:
        match = _FROM_RE.match(line)
        if match:
            dots, module, names = match.group(1), match.group(2), match.group(3)
            dotted = [p for p in module.split(".") if p]
            if dots:
                base = parts[: len(parts) - len(dots) + 1] if len(dots) <= len(parts) + 1 else []
            elif dotted and dotted[0] in parts:
                base = parts[: parts.index(dotted[0])]
            else:
                continue
            if dotted:
                add(dotted, base)
            for name in re.findall(r"\w+", names):
                add([*dotted, name], base)  # `from pkg import module`
            continue
        match = _IMPORT_RE.match(line)
        if match:
            for module in match.group(1).split(","):
                dotted = module.strip().split(".")
                if dotted[0] in parts:
                    add(dotted, parts[: parts.index(dotted[0])])
    return found
