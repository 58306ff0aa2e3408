"""A replay's action spans on the episode page: the assistant text with its spans marked, and the copy table.

A replay of a text trajectory (``nexus-eval replay JOB --model M``) stores per turn the ``SpanScore`` dumps of
``measure.action_scores``: character ranges of the turn's assistant text (``turns.completion``), each a
``function`` name, a ``param`` name or keyword value, or a value that is a ``copy`` of an earlier observation
or ``new`` text, with how well the model still predicted it under the replay's cache. Here they become:

- :func:`mark_text`: the text as HTML, every character escaped, each span a ``<span class="mark ...">`` with
  its numbers in ``data-*`` attributes and a ``title`` tooltip. Stored rows are read defensively: a span that is
  not a mapping or has no integer ``start`` / ``end`` is dropped, one reaching outside the text is cut to it
  (dropped when nothing is left), and where spans overlap (``action_spans`` never makes such, but a row is
  only data) the one starting first keeps the shared characters;
- :func:`copy_rows`: one row per copy span (turn, parameter, where its source was, how far back, how much of
  it the cache still held, how well it was reproduced);
- :func:`action_line`: the replay's ``ActionSummary`` as one line of text.

Pure functions of plain data: no database, no templates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup, escape

KINDS = ("function", "param", "copy", "new")  # measure.action_spans.SPAN_KINDS (no torch import here)


# -- reading stored values ------------------------------------------------------------------------------------


def _int(x: Any) -> int | None:
    """An integer field of a stored span (never a bool, which JSON keeps apart but Python counts as an int)."""
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _float(x: Any) -> float | None:
    """A finite number field of a stored span, else None."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def pct(x: Any, digits: int = 0) -> str:
    """A share as a percentage (``83%``), ``-`` for none."""
    x = _float(x)
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def _fixed(x: Any, digits: int = 3) -> str:
    x = _float(x)
    return "-" if x is None else f"{x:.{digits}f}"


def _attr(x: Any) -> str:
    """A number for a data attribute: ``repr`` of a float, str of an int, '' for none."""
    if isinstance(x, bool):
        return "1" if x else "0"
    if _int(x) is not None:
        return str(x)
    f = _float(x)
    return "" if f is None else repr(f)


def turn_spans(turns: Any) -> dict[int, list[Any]]:
    """A replay row's ``turns`` JSON -> turn index -> that turn's stored spans, for the turns that have a list of
    them (a token-stream replay, or a row from before spans were kept, has none: an empty dict)."""
    out: dict[int, list[Any]] = {}
    for t in turns if isinstance(turns, list) else []:
        if not isinstance(t, Mapping):
            continue
        index, spans = _int(t.get("index")), t.get("spans")
        if index is not None and isinstance(spans, list):
            out[index] = spans
    return out


# -- marking the text -----------------------------------------------------------------------------------------


def span_class(span: Mapping[str, Any]) -> str:
    """The mark's CSS classes: ``mark mark-KIND``, a copy also ``mark-exact`` (greedy-exact) or ``mark-inexact``."""
    kind = span.get("kind")
    if kind not in KINDS:
        return "mark"
    if kind == "copy":
        return "mark mark-copy " + ("mark-exact" if span.get("exact") is True else "mark-inexact")
    return f"mark mark-{kind}"


def span_title(span: Mapping[str, Any]) -> str:
    """The mark's tooltip: kind, parameter, tokens, top-1 and NLL (over the tokens after the first), whether it was
    greedy-exact, and for a copy how far back its source was and how much of it the cache still held."""
    kind = str(span.get("kind") or "?")
    parts = [kind if span.get("param") is None else f"{kind} · {span.get('param')}"]
    if kind == "function" and span.get("function"):
        parts[0] = f"function · {span.get('function')}"
    tokens = _int(span.get("tokens"))
    parts.append(f"{tokens if tokens is not None else '?'} token{'' if tokens == 1 else 's'}")
    if _float(span.get("top1")) is None and tokens == 1:
        parts.append("one token: no top-1 / NLL after the first")
    else:
        parts += [f"top-1 {pct(span.get('top1'), 1)}", f"NLL {_fixed(span.get('nll'))}"]
    parts.append("greedy-exact" if span.get("exact") is True else "not greedy-exact")
    if span.get("first_top1") is False:
        parts.append("first token not the argmax")
    if kind == "copy":
        back = _int(span.get("back"))
        parts.append(f"source {back} tokens back" if back is not None else "source position unknown")
        parts.append(f"source held {pct(span.get('held_mean'), 1)}")
    return " · ".join(parts)


@dataclass(frozen=True)
class Marked:
    """A turn's text as HTML: ``html`` (safe), ``shown`` the indices (in the stored list) of the spans marked,
    ``dropped`` how many stored spans were not (malformed, outside the text, or wholly overlapped)."""

    html: Markup
    shown: frozenset[int]
    dropped: int


def placed_spans(length: int, spans: Sequence[Any]) -> list[tuple[int, int, int, Mapping[str, Any]]]:
    """``(number, start, end, span)`` of the spans that can be marked in a text of ``length`` characters, in text
    order, cut to the text and never overlapping (an earlier-starting span keeps shared characters)."""
    valid = []
    for number, span in enumerate(spans):
        if not isinstance(span, Mapping):
            continue
        start, end = _int(span.get("start")), _int(span.get("end"))
        if start is None or end is None:
            continue
        valid.append((max(start, 0), min(end, length), number, span))
    valid.sort(key=lambda v: (v[0], v[1], v[2]))
    out, pos = [], 0
    for start, end, number, span in valid:
        start = max(start, pos)
        if end <= start:
            continue
        out.append((number, start, end, span))
        pos = end
    return out


def mark_text(text: str, spans: Sequence[Any], *, id_prefix: str = "") -> Marked:
    """``text`` as escaped HTML with ``spans`` (stored ``SpanScore`` dumps) marked. Each mark is
    ``<span class="mark mark-KIND" data-span="N" data-kind data-param data-tokens data-top1 data-nll
    data-first-top1 data-exact [data-back data-source data-held-mean] title="...">``; with ``id_prefix`` also
    ``id="{id_prefix}{N}"`` (N: the span's index in the stored list)."""
    placed = placed_spans(len(text), spans)
    parts: list[str] = []
    pos = 0
    for number, start, end, span in placed:
        parts.append(str(escape(text[pos:start])))
        attrs = {"class": span_class(span)}
        if id_prefix:
            attrs["id"] = f"{id_prefix}{number}"
        attrs |= {
            "data-span": str(number),
            "data-kind": str(span.get("kind") or ""),
            "data-param": "" if span.get("param") is None else str(span.get("param")),
            "data-tokens": _attr(span.get("tokens")),
            "data-top1": _attr(span.get("top1")),
            "data-nll": _attr(span.get("nll")),
            "data-first-top1": _attr(span.get("first_top1")),
            "data-exact": _attr(span.get("exact")),
        }
        if span.get("kind") == "copy":
            attrs |= {
                "data-back": _attr(span.get("back")),
                "data-source": _attr(span.get("source")),
                "data-held-mean": _attr(span.get("held_mean")),
            }
        attrs["title"] = span_title(span)
        rendered = " ".join(f'{name}="{escape(value)}"' for name, value in attrs.items())
        parts.append(f"<span {rendered}>{escape(text[start:end])}</span>")
        pos = end
    parts.append(str(escape(text[pos:])))
    shown = frozenset(p[0] for p in placed)
    return Marked(Markup("".join(parts)), shown, len(spans) - len(shown))


# -- the copies table and the summary line -------------------------------------------------------------------


@dataclass(frozen=True)
class CopyRow:
    """One copy span of a replay: where in the trajectory it is and where its source was."""

    turn: int
    number: int  # the span's index in its turn's stored list
    param: str | None
    source: int | None  # the user message the source is in: 0 the task, k the observation after turn k-1
    back: int | None
    source_tokens: int | None
    held_mean: float | None
    held: tuple[float | None, ...]  # per layer
    tokens: int | None
    top1: float | None
    first_top1: bool | None
    exact: bool | None
    nll: float | None
    anchor: str = ""  # the id of its mark on the page ('' when it is not marked)

    @property
    def source_label(self) -> str:
        if self.source is None:
            return "-"
        return "task" if self.source == 0 else f"t{self.source - 1} observation"

    @property
    def held_title(self) -> str:
        """The per-layer shares, for the held cell's tooltip."""
        if not self.held:
            return "no per-layer shares stored"
        return "per layer: " + " ".join(pct(h) for h in self.held)


def _bool(x: Any) -> bool | None:
    return x if isinstance(x, bool) else None


def copy_rows(
    spans_by_turn: Mapping[int, Sequence[Any]], anchors: Mapping[tuple[int, int], str] | None = None
) -> list[CopyRow]:
    """One :class:`CopyRow` per copy span, by turn then text order; ``anchors[(turn, number)]``: the id of the
    span's mark where it was marked."""
    anchors = anchors or {}
    rows = []
    for turn in sorted(spans_by_turn):
        ordered = [
            (n, s) for n, s in enumerate(spans_by_turn[turn]) if isinstance(s, Mapping) and s.get("kind") == "copy"
        ]
        ordered.sort(key=lambda ns: (_int(ns[1].get("start")) or 0, ns[0]))
        for number, s in ordered:
            held = s.get("held")
            rows.append(
                CopyRow(
                    turn=turn,
                    number=number,
                    param=None if s.get("param") is None else str(s.get("param")),
                    source=_int(s.get("source")),
                    back=_int(s.get("back")),
                    source_tokens=_int(s.get("source_tokens")),
                    held_mean=_float(s.get("held_mean")),
                    held=tuple(_float(h) for h in held) if isinstance(held, list) else (),
                    tokens=_int(s.get("tokens")),
                    top1=_float(s.get("top1")),
                    first_top1=_bool(s.get("first_top1")),
                    exact=_bool(s.get("exact")),
                    nll=_float(s.get("nll")),
                    anchor=anchors.get((turn, number), ""),
                )
            )
    return rows


def _kind_value(table: Any, kind: str) -> Any:
    return table.get(kind) if isinstance(table, Mapping) else None


def action_line(action: Any) -> str:
    """A replay's ``ActionSummary`` dump as one line: the copies' top-1, NLL, greedy-exact share and held share,
    then the spans per kind; '' for none (a token-stream replay or an older row)."""
    if not isinstance(action, Mapping):
        return ""
    spans = action.get("spans") if isinstance(action.get("spans"), Mapping) else {}
    copies = _int(spans.get("copy")) or 0
    exact = _float(_kind_value(action.get("exact"), "copy"))
    parts = [
        f"copies: top-1 {pct(_kind_value(action.get('top1'), 'copy'), 1)}",
        f"NLL {_fixed(_kind_value(action.get('nll'), 'copy'))}",
        "greedy-exact -" if exact is None else f"greedy-exact {round(exact * copies)}/{copies} ({pct(exact)})",
    ]
    if _float(action.get("copy_held")) is not None:
        parts.append(f"source held {pct(action.get('copy_held'), 1)}")
    counts = ", ".join(f"{_int(spans.get(k)) or 0} {k}" for k in KINDS)
    extra = sorted(str(k) for k in spans if k not in KINDS)
    if extra:
        counts += ", " + ", ".join(f"{_int(spans.get(k)) or 0} {k}" for k in extra)
    return " · ".join(parts) + f" · spans: {counts}"
