"""The trade-off figures of a compare table: quality against cost, and quality against density.

- :func:`quality_vs_cost_chart`: resolved rate (95% interval as whiskers) against KV held (``nexus.memory``: K/V
  entries held x bytes per entry after a turn, mean over turns, then over the cell's episodes), a point per
  cell, a line per method through its cells in order of cost; one panel per scope x protocol. Points of equal
  cost (one spot on the axis) are drawn side by side a small fixed step apart (:func:`dodge_equal`), in column
  order, so none hides another; each point's tooltip and ``data-kv-held-mib`` carry its true cost and rate.
- :func:`quality_vs_density_chart`: resolved rate against the configured density, a line per evicting method
  with one point per density, dense (which keeps every token) as a dashed reference line at its rate; one
  panel per scope x protocol. Drawn only when the table spans two densities or more (a sweep of jobs).
- :func:`delta_nll_vs_density_chart`: the counterfactual replays' ΔNLL vs dense (bootstrap 95% whiskers) against
  density, a line per method (and per model and dtype measured on, each its own line style, when the replays hold
  several: a bfloat16 point is never on a float32 line); drawn when the replays span two densities or more
  (``replay --densities``).

Every series and point is findable in the SVG: a method's line is ``<g class="series" data-method="M">``, a
cell's marker ``<g class="point" data-method="M" data-density="D">`` (what the page tests count).
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from dashboard.charts import _figure, method_colours, to_svg
from nexus.methods import DENSE
from results.compare_table import Cell, CompareTable, Row
from results.replay_stats import unit_order, unit_text

MIB = 2**20
DODGE = 0.03  # the step between equal-cost points, a fraction of the panel's cost span
#: the ΔNLL chart's line style per (model, dtype) the replays were measured on, in ``unit_order``
UNIT_STYLES = ("-", ":", "-.", (0, (5, 1)))


def _cells(table: CompareTable, panel: tuple[str, str], method: str) -> list[tuple[Row, Cell]]:
    """The method's cells with a rate in one panel, dense once (it is the same cell in every density row)."""
    rows = [r for r in table.rows if (r.scope, r.protocol) == panel]
    found = [(r, r.cells[method]) for r in rows if method in r.cells and r.cells[method].rate is not None]
    return found[:1] if method == DENSE else found


def _point(
    ax: Axes,
    x: float,
    y: float,
    ci: tuple[float | None, float | None],
    colour: str,
    method: str,
    density: float | None,
    tip: int | None = None,
) -> None:
    """One cell's marker at (x, y) with its interval ``ci`` as whiskers (none where a bound is unknown); ``tip``:
    the index of its tooltip (:func:`_tips`)."""
    low, high = (y if bound is None else bound for bound in ci)
    bars = ax.errorbar([x], [y], yerr=[[y - low], [high - y]], fmt="o", color=colour, capsize=3)
    suffix = "" if tip is None else f"--t{tip}"
    bars[0].set_gid(f"point--{method}--{'' if density is None else f'{density:g}'}{suffix}")


def _rate_point(
    ax: Axes, x: float, cell: Cell, colour: str, method: str, density: float | None, tip: int | None = None
) -> None:
    """A resolved-rate marker in percent, its Wilson or bootstrap interval as whiskers."""
    low, high = (None if v is None else 100 * v for v in (cell.ci_low, cell.ci_high))
    _point(ax, x, 100 * (cell.rate or 0.0), (low, high), colour, method, density, tip)


def dodge_equal(xs: Sequence[float], step: float = DODGE) -> list[float]:
    """Where each x is drawn: the x's of one spot on the axis (equal to 4 significant digits) side by side around
    it, ``step`` x the span of ``xs`` apart, in the order given; an x alone stays where it is."""
    if not xs:
        return []
    span = (max(xs) - min(xs)) or abs(max(xs)) or 1.0
    groups: dict[str, list[int]] = {}
    for i, x in enumerate(xs):
        groups.setdefault(f"{x:.4g}", []).append(i)
    shown = list(xs)
    for members in groups.values():
        for k, i in enumerate(members):
            shown[i] = xs[i] + (k - (len(members) - 1) / 2) * step * span
    return shown


def _tips(svg: str, tips: list[tuple[float, str]]) -> str:
    """Each point's true cost as ``data-kv-held-mib`` and its tooltip (a ``<title>``): what it is, not where a
    dodge drew it."""

    def one(m: re.Match[str]) -> str:
        mib, text = tips[int(m[2])]
        return f'<g id="{m[1]}" data-kv-held-mib="{mib!r}">\n<title>{html.escape(text)}</title>'

    return re.sub(r'<g id="(point--\w+--[\d.]*)--t(\d+)">', one, svg)


def _finish(fig, axes: Sequence[Axes], panels: list[tuple[str, str]], methods: Sequence[str], xlabel: str) -> None:
    colours = method_colours(methods)
    for ax, (scope, protocol) in zip(axes, panels, strict=True):
        ax.set_title(f"{scope} / {protocol}", fontsize="small")
        ax.set_xlabel(xlabel)
        ax.set_ylim(-5, 105)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("% resolved (95% CI)")
    handles = [Line2D([], [], color=colours[m], marker="o", linestyle="--" if m == DENSE else "-") for m in methods]
    fig.legend(handles, list(methods), loc="outside right upper", frameon=False)


def quality_vs_cost_chart(table: CompareTable) -> str:
    """Resolved rate against mean KV held (MiB); '' when no cell stored its KV held bytes."""
    panels = table.panels
    have = any(
        c.cost.mean_kv_held_bytes is not None and c.rate is not None for r in table.rows for c in r.cells.values()
    )
    if not panels or not have:
        return ""
    colours = method_colours(table.methods)
    fig = _figure(3.4 * len(panels) + 1.6, 3.0)
    axes = fig.subplots(1, len(panels), squeeze=False, sharey=True)[0]
    tips: list[tuple[float, str]] = []
    for ax, panel in zip(axes, panels, strict=True):
        drawn = {
            method: sorted(
                ((r, c) for r, c in _cells(table, panel, method) if c.cost.mean_kv_held_bytes is not None),
                key=lambda rc: rc[1].cost.mean_kv_held_bytes,
            )
            for method in table.methods
        }
        points = [(m, r, c) for m in table.methods for r, c in drawn[m]]
        shown = iter(dodge_equal([c.cost.mean_kv_held_bytes / MIB for _, _, c in points]))
        for method in table.methods:
            cells = drawn[method]
            if not cells:
                continue
            xs = [next(shown) for _ in cells]
            ax.plot(xs, [100 * c.rate for _, c in cells], color=colours[method], alpha=0.6, gid=f"series--{method}")
            for x, (row, cell) in zip(xs, cells, strict=True):
                density = None if method == DENSE else row.density
                mib = cell.cost.mean_kv_held_bytes / MIB
                where = method if density is None else f"{method} at density {density:g}"
                tips.append((mib, f"{where}: {100 * cell.rate:.1f}% resolved, {mib:.4g} MiB KV held"))
                _rate_point(ax, x, cell, colours[method], method, density, len(tips) - 1)
    _finish(fig, axes, panels, table.methods, "KV held after a turn, mean MiB")
    return _tag(_tips(to_svg(fig, "resolved rate against mean KV held after a turn, per method"), tips))


def quality_vs_density_chart(table: CompareTable) -> str:
    """Resolved rate against density, one point per density; '' unless the table spans two densities."""
    if len(table.densities) < 2:
        return ""
    panels = table.panels
    colours = method_colours(table.methods)
    fig = _figure(3.4 * len(panels) + 1.6, 3.0)
    axes = fig.subplots(1, len(panels), squeeze=False, sharey=True)[0]
    lo, hi = min(table.densities), max(table.densities)
    for ax, panel in zip(axes, panels, strict=True):
        for method in table.methods:
            cells = _cells(table, panel, method)
            if not cells:
                continue
            if method == DENSE:  # keeps every token at any budget: a reference line, not a curve
                rate = 100 * cells[0][1].rate
                ax.plot([lo, hi], [rate, rate], color=colours[method], linestyle="--", gid=f"series--{method}")
                continue
            # dodge: methods at one density side by side, so their whiskers do not hide each other
            shift = (table.methods.index(method) - (len(table.methods) - 1) / 2) * 0.012 * (hi - lo)
            xs = [r.density + shift for r, _ in cells]
            ax.plot(xs, [100 * c.rate for _, c in cells], color=colours[method], gid=f"series--{method}")
            for x, (row, cell) in zip(xs, cells, strict=True):
                _rate_point(ax, x, cell, colours[method], method, row.density)
        ax.set_xticks(table.densities, [f"{d:g}" for d in table.densities])
    _finish(fig, axes, panels, table.methods, "density (kept fraction of the tokens)")
    return _tag(to_svg(fig, "resolved rate against density, per method"))


def _tag(svg: str) -> str:
    """matplotlib writes a gid as an ``id``; make ours classes and data attributes (ids would repeat)."""
    svg = re.sub(r'id="series--([\w.-]+)"', r'class="series" data-method="\1"', svg)
    return re.sub(r'id="point--([\w]+)--([\d.]*)"', r'class="point" data-method="\1" data-density="\2"', svg)


def delta_nll_vs_density_chart(table: CompareTable) -> str:
    """Replay ΔNLL vs dense against density, a point per replayed (method, density, model, dtype), a line per method
    and (model, dtype); '' unless the replays of some method span two densities."""
    cells = [c for c in table.replay if c.method != DENSE and c.density is not None and c.delta_nll is not None]
    densities = sorted({c.density for c in cells})
    if len(densities) < 2:
        return ""
    panels = list(dict.fromkeys((c.scope, c.protocol) for c in cells))
    methods = [m for m in table.methods if any(c.method == m for c in cells)]
    methods += sorted({c.method for c in cells} - set(methods))
    colours = method_colours([DENSE, *methods])
    units = unit_order((c.model, c.dtype) for c in cells)
    styles = {u: UNIT_STYLES[i % len(UNIT_STYLES)] for i, u in enumerate(units)}
    fig = _figure(3.4 * len(panels) + 1.6, 3.0)
    axes = fig.subplots(1, len(panels), squeeze=False, sharey=True)[0]
    for ax, panel in zip(axes, panels, strict=True):
        ax.axhline(0.0, color=colours[DENSE], linestyle="--", linewidth=1)  # dense vs itself
        for method in methods:
            for unit in units:
                here = (
                    c for c in cells if (c.scope, c.protocol, c.method, c.model, c.dtype) == (*panel, method, *unit)
                )
                mine = sorted(here, key=lambda c: c.density)
                if not mine:
                    continue
                ax.plot(
                    [c.density for c in mine],
                    [c.delta_nll for c in mine],
                    color=colours[method],
                    linestyle=styles[unit],
                    gid=f"series--{method}",
                )
                for c in mine:
                    ci = (c.delta_ci_low, c.delta_ci_high)
                    _point(ax, c.density, c.delta_nll, ci, colours[method], method, c.density)
        ax.set_title(f"{panel[0]} / {panel[1]}", fontsize="small")
        ax.set_xlabel("density (kept fraction of the tokens)")
        ax.set_xticks(densities, [f"{d:g}" for d in densities])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("ΔNLL vs dense, nats/token")
    handles = [Line2D([], [], color=colours[m], marker="o") for m in methods]
    labels = list(methods)
    if len(units) > 1:  # which line is which model and dtype: never one line through two
        handles += [Line2D([], [], color="grey", linestyle=styles[u]) for u in units]
        labels += [unit_text(*u) for u in units]
    fig.legend(handles, labels, loc="outside right upper", frameon=False)
    return _tag(to_svg(fig, "replay delta-NLL vs dense against density, per method, model and dtype"))
