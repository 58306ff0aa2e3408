"""The dashboard's charts: matplotlib figures rendered server-side to SVG text for inlining in a page.

No pyplot: every chart is its own ``matplotlib.figure.Figure`` (no global current figure shared between the
server's threads), saved through the SVG backend. The SVG is trimmed for inlining in HTML: no XML prologue,
DOCTYPE or metadata, no namespace URLs (an inline ``<svg>`` in HTML needs none), ``href`` instead of
``xlink:href``, and no matplotlib group ids (``figure_1``...) that would repeat across the charts of one page.
A page or report therefore carries no URL at all from its charts.
"""

from __future__ import annotations

import io
import math
import re
import threading
from collections.abc import Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from results.compare_table import CompareTable

# Text as <text> elements (small, selectable, searchable) rather than glyph paths. Set once, at import.
matplotlib.rcParams["svg.fonttype"] = "none"
_SAVE_LOCK = threading.Lock()  # matplotlib's font caches are not documented thread-safe; charts are quick
_NO_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}
MAX_RETENTION_COLUMNS = 1024
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"]


def method_colours(methods: Sequence[str]) -> dict[str, str]:
    """One colour per method, by its column order (the same in every chart of a table)."""
    return {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(methods)}


def to_svg(fig: Figure, label: str) -> str:
    """The figure as an inline ``<svg>`` element (see the module docstring for what is trimmed)."""
    buf = io.StringIO()
    with _SAVE_LOCK:
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata=_NO_METADATA)
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r'\s+xmlns(:xlink)?="[^"]*"', "", text)
    text = text.replace("xlink:href=", "href=")
    text = re.sub(r'\s+id="[a-zA-Z]+[a-zA-Z0-9]*_\d+"', "", text)
    label = label.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
    return text.replace("<svg", f'<svg role="img" aria-label="{label}"', 1)


def _turn_axis(ax: Axes) -> None:
    """Turns are whole numbers: no 0.25 ticks."""
    ax.set_xlabel("turn")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _figure(width: float = 7.0, height: float = 2.6) -> Figure:
    fig = Figure(figsize=(width, height))
    fig.set_layout_engine("constrained")
    return fig


def compare_chart(table: CompareTable) -> str:
    """Resolved rate per method, grouped by scope x protocol row, with the cell's 95% interval as whiskers."""
    fig = _figure(7.5, 3.0)
    ax = fig.add_subplot()
    colours = method_colours(table.methods)
    width = 0.8 / max(1, len(table.methods))
    for j, method in enumerate(table.methods):
        xs, heights, low, high = [], [], [], []
        for i, row in enumerate(table.rows):
            cell = row.cells.get(method)
            if cell is None or cell.rate is None:
                continue
            xs.append(i - 0.4 + width * (j + 0.5))
            heights.append(100 * cell.rate)
            low.append(100 * (cell.rate - (cell.ci_low if cell.ci_low is not None else cell.rate)))
            high.append(100 * ((cell.ci_high if cell.ci_high is not None else cell.rate) - cell.rate))
        ax.bar(xs, heights, width * 0.9, yerr=[low, high], capsize=3, color=colours[method], label=method)
    ax.set_xticks(range(len(table.rows)), [r.label.replace(" / ", "\n") for r in table.rows])
    ax.set_ylim(0, 105)
    ax.set_ylabel("% resolved (95% CI)")
    ax.grid(axis="y", alpha=0.3)
    if table.methods:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return to_svg(fig, "resolved rate per method with 95% intervals")


def _stat(turns: Sequence[Any], attr: str, key: str) -> list[float]:
    return [float((getattr(t, attr) or {}).get(key, math.nan)) for t in turns]


def has_cache_telemetry(turns: Sequence[Any]) -> bool:
    """Whether the backend reported a cache (the oracle and openai backends have none to show)."""
    return any(t.logical_length or t.physical_after or t.eviction_events for t in turns)


def cache_charts(turns: Sequence[Any]) -> list[tuple[str, str]]:
    """(title, svg) per telemetry chart of one episode's turns (objects with TurnView's fields). Without cache
    telemetry only the timing chart is drawn."""
    if not turns:
        return []
    x = [t.index for t in turns]
    charts = []
    if has_cache_telemetry(turns):
        charts.append(("logical length vs physical slots per layer", _slots_chart(x, turns)))
        events = [t.eviction_events for t in turns]
        charts.append(("eviction events per turn", _bar_chart(x, events, "eviction events")))
    if any(getattr(t, name) for t in turns for name, _, _ in KV_LINES):
        charts.append(("KV held and allocated, after each turn and their peaks", _kv_chart(x, turns)))
    charts.append(("prefill / decode seconds and tokens/s", _time_chart(x, turns)))
    return charts


def _slots_chart(x: list[int], turns: Sequence[Any]) -> str:
    fig = _figure()
    ax = fig.add_subplot()
    ax.plot(x, [t.logical_length for t in turns], color="#555", linestyle=":", label="logical length")
    if any(t.physical_after for t in turns):
        lo, mean, hi = (_stat(turns, "physical_after", k) for k in ("min", "mean", "max"))
        ax.fill_between(x, lo, hi, color="#1f77b4", alpha=0.25, label="after eviction: min-max over layers")
        ax.plot(x, mean, color="#1f77b4", marker=".", label="after eviction: mean")
    if any(t.physical_before for t in turns):
        ax.plot(x, _stat(turns, "physical_before", "mean"), color="#ff7f0e", linestyle="--", label="before: mean")
    _turn_axis(ax)
    ax.set_ylabel("KV slots per layer")
    ax.legend(fontsize="small", frameon=False)
    return to_svg(fig, "KV slots per layer per turn")


def _bar_chart(x: list[int], values: list[float], ylabel: str) -> str:
    fig = _figure(7.0, 2.0)
    ax = fig.add_subplot()
    ax.bar(x, values, color="#d62728")
    _turn_axis(ax)
    ax.set_ylabel(ylabel)
    return to_svg(fig, f"{ylabel} per turn")


#: the KV memory figures of a turn (nexus.memory) drawn per turn: (TurnView field, label, line style)
KV_LINES = (
    ("kv_held_bytes", "KV held", "-"),
    ("kv_allocated_bytes", "KV alloc", "--"),
    ("kv_peak_held_bytes", "KV held peak", ":"),
    ("kv_peak_allocated_bytes", "KV alloc peak", "-."),
)


def _kv_chart(x: list[int], turns: Sequence[Any]) -> str:
    """KV held / allocated after each turn and the largest of each during it (MiB); a turn that did not store a
    figure (a row from before it existed) leaves a gap, never a 0."""
    fig = _figure(7.0, 2.4)
    ax = fig.add_subplot()
    for (name, label, style), colour in zip(KV_LINES, ("#9467bd", "#8c564b", "#9467bd", "#8c564b"), strict=True):
        values = [getattr(t, name) for t in turns]
        if any(v is not None for v in values):
            mib = [math.nan if v is None else v / 2**20 for v in values]
            ax.plot(x, mib, marker=".", linestyle=style, color=colour, label=label)
    _turn_axis(ax)
    ax.set_ylabel("MiB")
    ax.legend(fontsize="small", frameon=False)
    return to_svg(fig, "KV held and allocated per turn, and their peaks")


def _time_chart(x: list[int], turns: Sequence[Any]) -> str:
    fig = _figure()
    ax = fig.add_subplot()
    prefill = [t.prefill_s for t in turns]
    ax.bar(x, prefill, color="#2ca02c", label="prefill s")
    ax.bar(x, [t.decode_s for t in turns], bottom=prefill, color="#98df8a", label="decode s")
    _turn_axis(ax)
    ax.set_ylabel("seconds")
    if any(t.tokens_per_s for t in turns):
        rate = ax.twinx()
        rate.plot(x, [t.tokens_per_s or math.nan for t in turns], color="#333", marker=".", label="tokens/s")
        rate.set_ylabel("decode tokens/s")
        rate.legend(loc="upper right", fontsize="small", frameon=False)
    ax.legend(loc="upper left", fontsize="small", frameon=False)
    return to_svg(fig, "prefill and decode time per turn")


def retention_counts(retention: dict[str, Any]) -> np.ndarray:
    """The run-length encoded retention map as a (layers x logical_length) array: how many of the layer's KV
    heads still hold each position. ``ValueError`` when the data is malformed."""
    length, heads, layers = int(retention["logical_length"]), int(retention["kv_heads"]), retention["layers"]
    if length <= 0 or heads <= 0 or not layers:
        raise ValueError("empty retention map")
    full = np.zeros((len(layers), length), dtype=np.int32)
    for i, runs in enumerate(layers):
        pos = 0
        for count, run in runs:
            full[i, pos : pos + int(run)] = int(count)
            pos += int(run)
        if pos != length:
            raise ValueError(f"layer {i}: runs cover {pos} positions, logical_length is {length}")
    return full


def retention_matrix(retention: dict[str, Any], max_columns: int = MAX_RETENTION_COLUMNS) -> np.ndarray:
    """The run-length encoded retention map as a (layers x columns) array of count / kv_heads in [0, 1],
    positions averaged into at most ``max_columns`` bins. ``ValueError`` when the data is malformed."""
    full = retention_counts(retention).astype(np.float32) / int(retention["kv_heads"])
    length = full.shape[1]
    columns = min(length, max_columns)
    edges = np.linspace(0, length, columns + 1).astype(int)
    return np.add.reduceat(full, edges[:-1], axis=1) / np.diff(edges)


def retention_chart(retention: dict[str, Any], turn_starts: Sequence[tuple[int, int]] = ()) -> str:
    """Heatmap of layer x logical position: the share of the layer's KV heads still holding the position, with
    a vertical mark labelled t0, t1, ... where each turn's new tokens begin (``turn_starts``: (turn index,
    position) pairs; a turn that starts past the final stream has none). Each mark's line and label carry
    ``data-turn``."""
    matrix = retention_matrix(retention)
    length = int(retention["logical_length"])
    fig = _figure(7.5, max(2.4, min(6.0, 0.08 * matrix.shape[0] + 1.4)))
    ax = fig.add_subplot()
    image = ax.imshow(
        matrix, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0, vmax=1,
        extent=(0, length, matrix.shape[0] - 0.5, -0.5),
    )  # fmt: skip
    _turn_marks(ax, turn_starts, length)
    ax.set_xlabel("logical position" + (f" (binned to {matrix.shape[1]} columns)" if matrix.shape[1] < length else ""))
    ax.set_ylabel("layer")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.colorbar(image, ax=ax, label="share of KV heads holding it")
    text = to_svg(fig, "retention map: layer by logical position, turn starts marked")
    return re.sub(r'id="turn(mark|label)-(\d+)"', r'class="turn-\1" data-turn="\2"', text)


MAX_TURN_LABELS = 24  # more turns than this: every k-th mark is labelled (every mark is still drawn)


def _turn_marks(ax: Axes, starts: Sequence[tuple[int, int]], length: int) -> None:
    shown = [(i, s) for i, s in starts if 0 <= s < length]
    step = max(1, math.ceil(len(shown) / MAX_TURN_LABELS))
    for n, (i, start) in enumerate(shown):
        ax.axvline(start, color="#ff4d4d", linewidth=0.9, alpha=0.9, gid=f"turnmark-{i}")
        if n % step == 0:
            label = ax.text(start, 1.01, f"t{i}", transform=ax.get_xaxis_transform(), fontsize="x-small",
                            color="#b00", ha="left", va="bottom")  # fmt: skip
            label.set_gid(f"turnlabel-{i}")


def method_charts(
    curves: dict[tuple[str, str], dict[str, list[tuple[int, float, float]]]],
    rows: Sequence[tuple[str, str]],
    methods: Sequence[str],
) -> list[tuple[str, str]]:
    """(title, svg) for the report: mean KV slots after eviction vs turn, and mean eviction events per turn,
    one panel per scope x protocol row, one line per method (averaged over the job's episodes)."""
    rows = [r for r in rows if r in curves]
    if not rows:
        return []
    colours = method_colours(methods)
    charts = []
    for title, column, ylabel in (
        ("mean KV slots per layer after eviction, by turn", 1, "KV slots (mean over layers)"),
        ("mean eviction events per turn", 2, "eviction events"),
    ):
        fig = _figure(3.2 * len(rows) + 1.5, 2.8)
        axes = fig.subplots(1, len(rows), squeeze=False, sharey=True)[0]
        for ax, (scope, protocol) in zip(axes, rows, strict=True):
            for method in methods:
                points = curves[(scope, protocol)].get(method)
                if points:
                    ax.plot([p[0] for p in points], [p[column] for p in points], marker=".", color=colours[method])
            ax.set_title(f"{scope} / {protocol}", fontsize="small")
            _turn_axis(ax)
        axes[0].set_ylabel(ylabel)
        handles = [Line2D([], [], color=colours[m], marker=".") for m in methods]
        fig.legend(handles, list(methods), loc="outside right upper", frameon=False)
        charts.append((title, to_svg(fig, title)))
    return charts


def _probe_metric(cells: Sequence[Any]) -> tuple[str, tuple[str, str, str], float]:
    """What a probe's chart plots, as (y label, the cell's (value, low, high) fields, scale): accuracy with its
    Wilson interval when the probe asks a question; else ΔNLL vs dense with its bootstrap interval; else (no
    dense in the run) the plain NLL, without whiskers."""
    if any(c.accuracy is not None for c in cells):
        return "accuracy % (Wilson 95%)", ("accuracy", "ci_low", "ci_high"), 100.0
    if any(c.delta_nll is not None for c in cells):
        return "ΔNLL vs dense (bootstrap 95%)", ("delta_nll", "delta_ci_low", "delta_ci_high"), 1.0
    return "NLL (nats per token)", ("nll", "nll", "nll"), 1.0


def _scaled(cell: Any, fields: tuple[str, str, str], scale: float) -> tuple[float, float, float, float]:
    """(density, value, low, high) of one probe cell, scaled; a bound the cell has none of (too few samples for an
    interval) is the value itself, so that side gets no whisker."""
    value = getattr(cell, fields[0])
    low, high = (value if getattr(cell, f) is None else getattr(cell, f) for f in fields[1:])
    return cell.density, scale * value, scale * low, scale * high


def probe_chart(probe: str, cells: Sequence[Any], variants: Sequence[str]) -> str:
    """One probe's ``results.probe_stats.ProbeCell``s against density, one line per variant with its interval
    as whiskers, one panel per scope x protocol (see :func:`_probe_metric` for the y axis)."""
    ylabel, fields, scale = _probe_metric(cells)
    panels = list(dict.fromkeys((c.scope, c.protocol) for c in cells))
    densities = sorted({c.density for c in cells})
    step = float(min(np.diff(densities))) if len(densities) > 1 else 0.2
    dodge = 0.06 * step  # the variants' whiskers at one density side by side, not on top of each other
    colours = method_colours(variants)
    drawn: set[str] = set()
    fig = _figure(3.4 * len(panels) + 1.8, 2.8)
    axes = fig.subplots(1, len(panels), squeeze=False, sharey=True)[0]
    for ax, (scope, protocol) in zip(axes, panels, strict=True):
        for j, variant in enumerate(variants):
            mine = [c for c in cells if (c.scope, c.protocol, c.variant) == (scope, protocol, variant)]
            rows = sorted(_scaled(c, fields, scale) for c in mine if getattr(c, fields[0]) is not None)
            if not rows:
                continue
            xs = [d + (j - (len(variants) - 1) / 2) * dodge for d, *_ in rows]
            # clamped: a percentile bootstrap bound may sit a hair inside its mean, and matplotlib refuses negatives
            whiskers = [[max(0.0, y - low) for _, y, low, _ in rows], [max(0.0, high - y) for _, y, _, high in rows]]
            ax.errorbar(xs, [y for _, y, *_ in rows], yerr=whiskers, marker="o", capsize=3, color=colours[variant])
            drawn.add(variant)
        ax.set_xlim(densities[0] - step / 2, densities[-1] + step / 2)
        ax.set_title(f"{scope} / {protocol}", fontsize="small")
        ax.set_xticks(densities, [f"{d:g}" for d in densities])
        ax.set_xlabel("density (kept fraction)")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel(ylabel)
    if fields[0] == "accuracy":
        axes[0].set_ylim(-5, 105)
    shown = [v for v in variants if v in drawn]  # dense has no ΔNLL against itself: no legend entry
    handles = [Line2D([], [], color=colours[v], marker="o") for v in shown]
    fig.legend(handles, shown, loc="outside right upper", frameon=False)
    return to_svg(fig, f"{probe}: {ylabel} by density per variant")


def probe_charts(table: Any) -> dict[str, str]:
    """{probe: svg} for every probe of a ``results.probe_stats.ProbeTable``."""
    variants = list(dict.fromkeys(c.variant for c in table.cells))
    return {probe: probe_chart(probe, table.cells_of(probe), variants) for probe in table.probes}
