"""Split an assistant turn's tool call into scored spans, marking the values the agent COPIES from observations.

Agent trajectories are teacher-forced through a model to score the tokens an agent must reproduce; the
decisive ones are copies (a ``str_replace`` ``old_str`` repeats lines of a file viewed turns earlier).
:func:`action_spans` returns, in text order and never overlapping:

* ``function``: the NAME in ``<function=NAME>``; ``param``: each NAME in ``<parameter=NAME>``, and the whole
  stripped VALUE of keyword parameters (``command`` of ``file_editor`` and ``finish``: view, str_replace,
  submit...), which are never copy/new. Call and parameter boundaries are those of
  :func:`agent_runner.parsing.parse_response`: the first function block, values stripped, a value runs to the
  first ``</parameter>``, duplicate keys: only the last one (the one the parser keeps) gets spans. No parsable
  call (none, truncated, bad name): no spans.
* every other value is cut into lines (of the stripped value) and each non-blank character lands in exactly
  one ``copy`` or ``new`` span:

  - **line runs**: greedily from the top, the longest run of consecutive value lines found as consecutive
    lines of ONE earlier observation (ties: the most recent observation, then the latest place in it). An
    observation line matches when it equals the value line as is, after a line-number prefix
    (``^[ \\t]*\\d+([ \\t]|$)``: a view's ``"{n:6d} "``, an edit snippet's ``"{n:6}\\t"``) or after a grep prefix
    (``^([^:]*:)?\\d+:``: ``search`` on a file prints ``grep -n``'s ``lineno:text``; ``grep -rn`` in bash gives
    ``path:lineno:text``). The value's FIRST line lost its indentation to the strip, so it may equal the
    content with leading whitespace removed; the value's LAST line may equal it with trailing whitespace
    removed. A blank value line matches a blank content line; a run never starts or ends on one (trailing
    blanks are trimmed off the run). Tabs are compared expanded (edit snippets expand them). A run needs one
    line with >= 4 non-blank characters, else its first line is not a run start. The span covers the run's
    lines as written (a run starting mid-value keeps that line's indentation); ``source_start:source_end``
    run from the first line's matched content start to the last line's matched content end.
  - **substring copies**: a line outside any run whose stripped text has >= 6 non-blank characters and occurs
    verbatim inside an earlier observation (e.g. a path in a view header, a test id in pytest output); the
    source is its last occurrence in the most recent observation holding it. The span is the stripped line.
  - **new**: each stretch of consecutive lines that are not copies is ONE span, from its first to its last
    non-blank character (a stretch of blank lines gives none).

``observations`` are the earlier user messages in order (index 0: the task). Every observation is indexed
once per call (a dict from normalized line to line numbers), so matching is linear in practice.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from agent_runner.parsing import FUNCTION_CLOSE, FUNCTION_OPEN, PARAMETER_CLOSE, PARAMETER_OPEN, parse_response

SpanKind = Literal["function", "param", "copy", "new"]
SPAN_KINDS: tuple[SpanKind, ...] = ("function", "param", "copy", "new")

KEYWORD_PARAMS: dict[str, frozenset[str]] = {"file_editor": frozenset({"command"}), "finish": frozenset({"command"})}
MIN_RUN_CHARS = 4  # a run of lines needs one line with this many non-blank characters
MIN_SUBSTRING_CHARS = 6  # a single-line substring copy needs this many non-blank characters

_NUMBER_PREFIX = re.compile(r"[ \t]*\d+(?:[ \t]|$)")
_GREP_PREFIX = re.compile(r"(?:[^:\n]*:)?\d+:")


@dataclass(frozen=True)
class Span:
    kind: SpanKind
    start: int  # char offset in the assistant text (inclusive)
    end: int  # char offset (exclusive); text[start:end] is the span
    function: str  # the call's function name
    param: str | None  # the parameter the span belongs to (None for the function name)
    source: int | None = None  # copy spans: index into `observations` of the source
    source_start: int | None = None  # copy spans: char offsets of the copied text inside observations[source]
    source_end: int | None = None


@dataclass(frozen=True)
class ParamLayout:
    key: str
    key_start: int
    key_end: int
    value_start: int  # the stripped value: text[value_start:value_end] == parse_response(text) argument
    value_end: int


@dataclass(frozen=True)
class CallLayout:
    name: str
    name_start: int
    name_end: int
    params: tuple[ParamLayout, ...]  # the parameters the parser keeps (last of duplicates), in text order


def _stripped(text: str, start: int, end: int) -> tuple[int, int]:
    piece = text[start:end]
    if not piece.strip():
        return start, start
    return start + len(piece) - len(piece.lstrip()), end - (len(piece) - len(piece.rstrip()))


def call_layout(text: str) -> CallLayout | None:
    """Character offsets of the call :func:`parse_response` reads from ``text``; None when it reads none."""
    call = parse_response(text).call
    if call is None:
        return None
    name_start = text.find(FUNCTION_OPEN) + len(FUNCTION_OPEN)
    name_end = text.find(">", name_start)
    body_end = text.find(FUNCTION_CLOSE, name_end + 1)
    found: dict[str, ParamLayout] = {}
    pos = name_end + 1
    while True:
        start = text.find(PARAMETER_OPEN, pos, body_end)
        key_end = text.find(">", start + len(PARAMETER_OPEN), body_end) if start >= 0 else -1
        value_end = text.find(PARAMETER_CLOSE, key_end + 1, body_end) if key_end >= 0 else -1
        if value_end < 0:
            break
        ks, ke = _stripped(text, start + len(PARAMETER_OPEN), key_end)
        if ke > ks:
            found.pop(text[ks:ke], None)  # last wins, and its place in text order is its own
            found[text[ks:ke]] = ParamLayout(text[ks:ke], ks, ke, *_stripped(text, key_end + 1, value_end))
        pos = value_end + len(PARAMETER_CLOSE)
    ns, ne = _stripped(text, name_start, name_end)
    layout = CallLayout(text[ns:ne], ns, ne, tuple(found.values()))
    assert layout.name == call.name and {p.key: text[p.value_start : p.value_end] for p in layout.params} == dict(
        call.arguments
    ), "call_layout disagrees with parse_response"
    return layout


def _nonblank(s: str) -> int:
    return sum(not c.isspace() for c in s)


def _key(s: str) -> str:
    if not s.strip():
        return ""
    return s.expandtabs() if "\t" in s else s


# match modes: how a value line may compare with an observation line's content
_EXACT, _FIRST, _LAST, _BOTH = 0, 1, 2, 3


class _ObservationIndex:
    """Per line of one observation: its content variants (as is, without a number / grep prefix) by key."""

    def __init__(self, text: str):
        self.text = text
        self.lines: list[tuple[dict[str, tuple[int, int]], ...]] = []
        self.where: tuple[dict[str, list[int]], ...] = ({}, {}, {}, {})
        pos = 0
        for number, line in enumerate(text.split("\n")):
            starts = [0]
            for prefix in (_NUMBER_PREFIX, _GREP_PREFIX):
                m = prefix.match(line)
                if m and m.end() not in starts:
                    starts.append(m.end())
            by_mode: tuple[dict[str, tuple[int, int]], ...] = ({}, {}, {}, {})
            for cs in starts:
                content = line[cs:]
                a, b = pos + cs, pos + len(line)
                lead, trail = len(content) - len(content.lstrip()), len(content) - len(content.rstrip())
                variants = ((content, a, b), (content.lstrip(), a + lead, b), (content.rstrip(), a, b - trail))
                variants += ((content.strip(), a + lead, b - trail),)
                for mode, (stripped, vs, ve) in enumerate(variants):
                    if mode != _EXACT and not stripped:
                        continue
                    key = _key(stripped)
                    if key not in by_mode[mode]:
                        by_mode[mode][key] = (vs, ve)
                        self.where[mode].setdefault(key, []).append(number)
            self.lines.append(by_mode)
            pos += len(line) + 1

    def match(self, number: int, mode: int, key: str) -> tuple[int, int] | None:
        return self.lines[number][mode].get(key) if number < len(self.lines) else None


def _value_spans(text: str, start: int, end: int, function: str, param: str, indexes: list[_ObservationIndex]):
    lines = text[start:end].split("\n")
    offsets = [start]
    for line in lines[:-1]:
        offsets.append(offsets[-1] + len(line) + 1)
    n = len(lines)
    keys = [_key(line) for line in lines]

    def mode(p: int) -> int:
        return (_FIRST if p == 0 else _EXACT) | (_LAST if p == n - 1 else _EXACT)

    spans: list[Span] = []
    copied = [False] * n
    i = 0
    while i < n:
        if not keys[i]:
            i += 1
            continue
        best: tuple[int, int, int] | None = None  # (length, observation, first line)
        for o in reversed(range(len(indexes))):
            index = indexes[o]
            for j in reversed(index.where[mode(i)].get(keys[i], ())):
                length = 1
                while i + length < n and index.match(j + length, mode(i + length), keys[i + length]):
                    length += 1
                while not keys[i + length - 1]:
                    length -= 1
                if best is None or length > best[0]:
                    best = (length, o, j)
            if best is not None and best[0] == n - i:
                break
        if best is None or max(_nonblank(line) for line in lines[i : i + best[0]]) < MIN_RUN_CHARS:
            i += 1
            continue
        length, o, j = best
        last = i + length - 1
        source_start = indexes[o].match(j, mode(i), keys[i])[0]
        source_end = indexes[o].match(j + length - 1, mode(last), keys[last])[1]
        end_at = offsets[last] + len(lines[last])
        spans.append(Span("copy", offsets[i], end_at, function, param, o, source_start, source_end))
        copied[i : i + length] = [True] * length
        i += length
    for p, line in enumerate(lines):
        needle = line.strip()
        if copied[p] or _nonblank(needle) < MIN_SUBSTRING_CHARS:
            continue
        for o in reversed(range(len(indexes))):
            at = indexes[o].text.rfind(needle)
            if at >= 0:
                s = offsets[p] + len(line) - len(line.lstrip())
                spans.append(Span("copy", s, s + len(needle), function, param, o, at, at + len(needle)))
                copied[p] = True
                break
    p = 0
    while p < n:
        if copied[p]:
            p += 1
            continue
        q = p
        while q < n and not copied[q]:
            q += 1
        s, e = _stripped(text, offsets[p], offsets[q - 1] + len(lines[q - 1]))
        if e > s:
            spans.append(Span("new", s, e, function, param))
        p = q
    return spans


def action_spans(text: str, observations: Sequence[str]) -> list[Span]:
    """Spans of the call in `text` (none when there is no parsable call), in text order, not overlapping."""
    layout = call_layout(text)
    if layout is None:
        return []
    name = layout.name
    spans = [Span("function", layout.name_start, layout.name_end, name, None)]
    keywords = KEYWORD_PARAMS.get(name, frozenset())
    indexes: list[_ObservationIndex] | None = None
    for p in layout.params:
        spans.append(Span("param", p.key_start, p.key_end, name, p.key))
        if p.value_end <= p.value_start:
            continue
        if p.key in keywords:
            spans.append(Span("param", p.value_start, p.value_end, name, p.key))
            continue
        if indexes is None:
            indexes = [_ObservationIndex(obs) for obs in observations]
        spans.extend(_value_spans(text, p.value_start, p.value_end, name, p.key, indexes))
    return sorted(spans, key=lambda span: span.start)


def summarize(spans: Sequence[Span]) -> dict[str, int]:
    """How many spans of each kind (every kind present, 0 when absent)."""
    counts = dict.fromkeys(SPAN_KINDS, 0)
    for span in spans:
        counts[span.kind] += 1
    return counts
