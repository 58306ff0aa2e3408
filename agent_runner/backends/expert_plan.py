"""Edit planning for the expert backend (``agent_runner.backends.expert``): from a gold hunk to the editor calls
that apply it, over what the expert has viewed.

* :class:`FileText` is what the expert knows of one file: the lines it viewed (None where it has not), with its
  own edits applied;
* :func:`locate` finds a hunk in a FileText and :func:`edit_candidates` derives the ``str_replace`` calls (or an
  ``insert``) that apply it, smallest context first. An ``old_str`` is copied from viewed lines only (the point of
  the expert: its trajectories test whether a KV cache kept what the agent must copy); it must be unique in the
  known content AFTER the parser strips it, and replacing the stripped ``old_str`` by the stripped ``new_str`` must
  give exactly the patched lines (the parser strips every parameter value, so an indented first line loses its
  indentation; the file keeps it, and so must the replacement).

A hunk that cannot be applied raises ``expert_diffs.EditError`` saying why.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from agent_runner.backends.expert_diffs import EditError, Hunk

#: values a call cannot carry: the parser ends a value / the call at these
FORBIDDEN_IN_VALUES = ("</parameter>", "</function>")
#: how many lines of context an edit may grow to around its change
MAX_GROWTH = 400


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
