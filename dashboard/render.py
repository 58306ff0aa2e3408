"""Templates and what they show: one Jinja2 environment for the server's pages and the standalone report.

The environment autoescapes everything (every string from the database is text to show, never markup);
the only markup passed in is the charts' SVG, wrapped in ``Markup`` where it is made. The pages and the
report include the same partials (``_compare.html``), so the compare table's markup exists once.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from db.models import is_interactive
from results.compare_render import (
    LEGEND,
    REPLAY_HEADER,
    SYMBOLS,
    cell_text,
    replay_text,
    several_dtypes,
    tradeoff_caption,
    tradeoff_columns,
)
from results.compare_table import Cell, CompareTable
from results.cost import COST_FIELDS, human_bytes
from results.probe_render import layout as probe_layout
from results.probe_stats import BASELINES, KV_FIELDS, ProbeCell
from results.replay_stats import ReplayCell, replay_caption

TEMPLATES = Path(__file__).with_name("templates")
STATIC = Path(__file__).with_name("static")


def num(x: float | None) -> str:
    """A float for a data attribute: ``repr`` (exact round trip, as JSON writes it) or '' for None."""
    return "" if x is None else repr(float(x))


def when(dt: datetime | str | None) -> str:
    """A stored time (a datetime, or the ISO text of a table's JSON form) to the minute, in UTC."""
    if isinstance(dt, str):
        dt = datetime.fromisoformat(dt)
    return "" if dt is None else f"{dt:%Y-%m-%d %H:%M} UTC"


def symbol(status: str) -> str:
    """The CLI grid's symbol for a status (``…`` for anything still pending)."""
    return SYMBOLS.get(status, "…")


def diff_lines(patch: str | None) -> list[tuple[str, str]]:
    """(css class, line) per line of a unified diff: add / del / hunk / file (headers) / ctx."""
    out = []
    for line in (patch or "").splitlines():
        if line.startswith(("+++", "---", "diff --git", "index ", "new file", "deleted file")):
            cls = "file"
        elif line.startswith("@@"):
            cls = "hunk"
        elif line.startswith("+"):
            cls = "add"
        elif line.startswith("-"):
            cls = "del"
        else:
            cls = "ctx"
        out.append((cls, line))
    return out


def cell_view(scope: str, protocol: str, cell: Cell) -> dict[str, Any]:
    """One compare cell: the exact numbers of ``CompareTable.to_dict()`` as data attributes (its cost under
    ``cost``: field name -> number), and the CLI's text."""
    return {
        "scope": scope,
        "protocol": protocol,
        "density": num(cell.density),
        "cost": {name.replace("_", "-"): num(getattr(cell.cost, name)) for name in COST_FIELDS},
        "method": cell.method,
        "n": cell.n,
        "resolved": cell.resolved,
        "rate": num(cell.rate),
        "ci_low": num(cell.ci_low),
        "ci_high": num(cell.ci_high),
        "p_value": num(cell.p_value),
        "not_run": cell.not_run or "",  # every episode broke: the first one's cause, and no rate
        "lines": cell_text(cell, multiline=True).split("\n"),
    }


def compare_rows(table: CompareTable) -> list[dict[str, Any]]:
    rows = []
    for r in table.rows:
        cells = [cell_view(r.scope, r.protocol, r.cells[m]) for m in table.methods]
        rows.append({"scope": r.scope, "protocol": r.protocol, "density": r.density, "cells": cells})
    return rows


def replay_rows(table: CompareTable) -> list[tuple[ReplayCell, list[str]]]:
    """(cell, its text cells under ``REPLAY_HEADER``) per replay cell: the row's data-* attributes name its model
    and dtype."""
    return [(r, replay_text(r, several_dtypes(table.replay))) for r in table.replay]


def probe_cell_data(c: ProbeCell) -> dict[str, Any]:
    """One probe cell's numbers for its row's data-* attributes: the fields of the run's JSON (``vs`` flattened
    to ``p-vs-dense``, ``b-vs-dense`` ...), floats as ``repr`` (exact), '' for None."""
    data: dict[str, Any] = {"probe": c.probe, "variant": c.variant, "scope": c.scope, "protocol": c.protocol}
    for name in ("density", "accuracy", "ci_low", "ci_high", "nll", "delta_nll", "delta_ci_low", "delta_ci_high",
                 "kept_fraction", *KV_FIELDS, "seconds"):  # fmt: skip
        data[name.replace("_", "-")] = num(getattr(c, name))
    data["n"], data["n-correct"] = c.n, "" if c.n_correct is None else c.n_correct
    for b in BASELINES:
        test = c.vs.get(b)
        data[f"p-vs-{b}"] = "" if test is None else num(test.p_value)
        data[f"b-vs-{b}"], data[f"c-vs-{b}"] = ("", "") if test is None else (test.b, test.c)
    return data


def plain(value: Any) -> str:
    """A settings or provenance value as text: lists joined by commas, mappings as ``key=value`` pairs."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={plain(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(plain(v) for v in value)
    return "" if value is None else str(value)


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=num, when=when, symbol=symbol, plain=plain, interactive=is_interactive)
    env.globals.update(
        human_bytes=human_bytes,  # every page's byte format (results.cost): the job list, the episode page
        diff_lines=diff_lines,
        compare_rows=compare_rows,
        replay_rows=replay_rows,
        tradeoff_columns=tradeoff_columns,
        tradeoff_caption=tradeoff_caption,  # with a ΔNLL column: the model(s) and dtype(s) its replays ran in
        LEGEND=LEGEND,
        replay_caption=replay_caption,  # with the model(s) and dtype(s) the replay cells were measured on
        REPLAY_HEADER=REPLAY_HEADER,
        probe_layout=probe_layout,
        probe_cell_data=probe_cell_data,
    )
    return env


ENV = _environment()


def render(template: str, *, standalone: bool = False, inline_style: bool = False, **context: Any) -> str:
    """A page. ``standalone=True`` (the report) inlines the stylesheet and leaves out every server link;
    ``inline_style=True`` (error pages) only inlines the stylesheet, so a page refused for want of a token
    does not fetch /static/style.css, which would be refused too."""
    css = Markup((STATIC / "style.css").read_text(encoding="utf-8")) if standalone or inline_style else None
    return ENV.get_template(template).render(standalone=standalone, inline_css=css, **context)


def svg(markup: str) -> Markup:
    """Chart SVG made by :mod:`dashboard.charts` (our own markup, never database text), marked safe."""
    return Markup(markup)
