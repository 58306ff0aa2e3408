"""Text forms of a :class:`results.compare_table.CompareTable`: rich ``table``, ``json``, ``csv``, ``markdown``.

- ``json``: ``CompareTable.to_dict()``: ``rows[].cells[method]`` with every Cell field (fractions in [0, 1]),
  ``grid[]`` per task with the statuses of each scope/protocol/method cell, ordered by seed.
- ``csv``: long format, one line per (scope, protocol, density, method) with :data:`SUMMARY_COLUMNS` (the cost
  columns among them); ``to_csv(..., grid=True)`` gives one line per task x cell x seed instead. ``tsv``: the same,
  tab-separated (:mod:`results.table_formats`).
- ``markdown``: the summary table, the trade-off table (:func:`tradeoff_rows`: quality beside cost, a line per
  cell), then the per-task grid (one symbol per seed, see :data:`LEGEND`).
- ``table``: the same as rich tables (``rich_tables`` for printing to a live console).

A table with counterfactual replays (``CompareTable.replay``) gets more, and only then: ``json`` a top-level
``replay`` list, ``csv`` the :data:`REPLAY_COLUMNS` on every line (and a line for a replayed cell no episode
row has), ``markdown`` / ``table`` a replay table after the summary (:func:`replay_text` per cell).

A table whose replays scored the spans of the agent's calls (``CompareTable.action``, :mod:`results.action_stats`)
gets the action table, and only then: ``json`` the top-level ``action`` and ``action_by_distance`` lists (with
``action_caption`` and ``action_distance_caption``), ``csv`` the :data:`ACTION_COLUMNS` on every line (each action
cell on the line of its (scope, protocol, density, method) cell, or on a line of its own: one whose summary
columns are blank; a line carries one when ``action_episodes`` is set), ``markdown`` / ``table`` (and the dashboard's
partial) the action table (rows scope x protocol x density, columns methods, :func:`results.action_render.cell_lines`
per cell) and the split by distance after the replay table. A table of stand-in jobs' demonstrations
(``CompareTable.demonstrations``) prints one line per job under the summary (``json``: ``demonstrations``).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

from db.models import EpisodeStatus, is_interactive
from results.action_outcomes import DISTANCE_BUCKETS
from results.action_render import ActionLayout, cell_lines
from results.compare_csv import to_csv
from results.compare_table import NO_SAMPLES, TASK_BOOTSTRAP, WILSON, Cell, CompareTable, GridKey, grid_key
from results.cost import human_bytes
from results.replay_stats import ReplayCell, dtype_text, replay_caption, units_text
from results.table_formats import TABLE_FORMATS, csv_to_tsv

FORMATS = TABLE_FORMATS  # the one list (results.table_formats); this name is what the verbs import
SYMBOLS = {
    EpisodeStatus.resolved: "✓",
    EpisodeStatus.unresolved: "✗",
    EpisodeStatus.empty_patch: "∅",
    EpisodeStatus.patch_failed: "P",
    EpisodeStatus.timeout: "T",
    EpisodeStatus.infra_failure: "!",
    EpisodeStatus.cancelled: "-",
}
LEGEND = (
    "✓ resolved  ✗ unresolved  ∅ empty patch  P patch failed  T timeout  ! infra failure  … pending  - cancelled"
    "  * interactive attempt"
)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def cell_text(cell: Cell, *, multiline: bool = False) -> str:
    """Human text of a cell: ``7/10 70.0% [39.7–89.2] p=0.508 (3:6, 10 pairs)`` or ``Pass@1 63.3% [..] pass@3
    90.0% p=0.03 (sign-flip, 12 tasks, 36 pairs)``, then what the cell counts apart."""
    parts = quality_parts(cell)
    if cell.n == 0:  # nothing counted: only what is counted apart, or "-"
        return ("\n" if multiline else " ").join(parts)
    if cell.p_value is not None:
        parts.append(test_text(cell))
    if cell.at_limit:
        parts.append(f"{cell.at_limit} at limit")
    if cell.reused_dense:
        parts.append("(reused)")
    if cell.interactive:
        parts.append(f"({cell.interactive} interactive*)")
    parts += _apart(cell)
    return ("\n" if multiline else " ").join(parts)


def _apart(cell: Cell) -> list[str]:
    """What the cell counts outside n: pending, ungraded, resamples (with their best of n)."""
    parts = []
    if cell.pending:
        parts.append(f"+{cell.pending} pending" if cell.n else "pending")
    if cell.ungraded:
        parts.append(f"{cell.ungraded} ungraded")
    if cell.resamples:
        best = "" if cell.best_of_n is None else f": best of {cell.best_of_attempts} {_pct(cell.best_of_n)}"
        parts.append(f"({cell.resamples} resample(s) apart{best})")
    return parts


def quality_parts(cell: Cell) -> list[str]:
    """The cell's rate and interval: ``["7/10 70.0%", "[39.7–89.2]"]`` or Pass@1, interval, pass@k; the count
    and "too few for an interval" where the cell has fewer units than its interval needs; ``["not run: <first
    cause>"]`` where every episode broke (nothing measured: no rate, interval or p-value)."""
    if cell.not_run is not None:
        return [f"not run: {cell.not_run}"]
    if cell.n == 0:
        return _apart(cell) or ["-"]
    if cell.too_few_for_interval:
        units = f"{cell.n_tasks} tasks" if cell.ci_method == TASK_BOOTSTRAP else f"{cell.n} episodes"
        ci = f"({units}: too few for an interval)"
    else:
        ci = f"[{100 * cell.ci_low:.1f}–{100 * cell.ci_high:.1f}]"
    if cell.ci_method == WILSON:
        return [f"{cell.resolved}/{cell.n} {_pct(cell.rate)}", ci]
    return [f"Pass@1 {_pct(cell.rate)}", ci] + [f"pass@{k} {_pct(v)}" for k, v in cell.pass_at_k.items()]


def test_text(cell: Cell) -> str:
    """The paired test with what it rests on: ``p=0.508 (3:6, 10 pairs)`` (McNemar) or ``p=0.031 (sign-flip,
    12 tasks, 36 pairs)``; counted episodes without a dense counterpart are named."""
    unpaired = f", {cell.unpaired} unpaired" if cell.unpaired else ""
    if (cell.test or "").startswith("sign_flip"):
        return f"p={cell.p_value:.3g} (sign-flip, {cell.pair_tasks} tasks, {cell.n_pairs} pairs{unpaired})"
    return f"p={cell.p_value:.3g} ({cell.b}:{cell.c}, {cell.n_pairs} pairs{unpaired})"


def _grid_cell(table: CompareTable, key: GridKey, task: str) -> str:
    """One symbol per seed; ``*`` after one whose attempt was run interactively (counted by request)."""
    seeds = table.seeds(key, task)
    return "".join(SYMBOLS.get(s, "…") + ("*" if is_interactive(d) else "") for s, d in seeds) or " "


REPLAY_HEADER = [
    "scope",
    "protocol",
    "density",
    "method",
    "episodes",
    "tasks",
    "NLL",
    "top-1",
    "ΔNLL vs dense [95% CI]",
    "pairs (tasks)",
]


def several_dtypes(cells: list[ReplayCell]) -> bool:
    """Whether replay cells measured in more than one dtype (not recorded counting as one) sit in one table."""
    return len({c.dtype for c in cells}) > 1


def replay_text(r: ReplayCell, several: bool = False) -> list[str]:
    """One replay cell as the cells of :data:`REPLAY_HEADER`: ``+0.124 [+0.051, +0.210]`` and so on. ``several``: the
    table holds cells of more than one dtype, so the label names this one's (the caption names a table's only one)."""
    if r.delta_nll is None:
        delta = "-"
    elif r.delta_ci_low is None:
        delta = f"{r.delta_nll:+.3f} ({r.pair_tasks} tasks: too few for an interval)"
    else:
        delta = f"{r.delta_nll:+.3f} [{r.delta_ci_low:+.3f}, {r.delta_ci_high:+.3f}]"
    episodes = str(r.episodes) + "".join(f" +{n} {w}" for n, w in ((r.skipped, "skipped"), (r.failed, "failed")) if n)
    nll = "-" if r.nll_mean is None else f"{r.nll_mean:.3f}"
    pairs = f"{r.n_pairs} ({r.pair_tasks})" + (f", {r.unpaired} unpaired" if r.unpaired else "")
    # what it was measured on: a text trajectory's model, and the dtype where recorded (two cells that differ only in
    # dtype never read alike; a row stored before dtypes were recorded reads as it did)
    measured = ", ".join(v for v in (r.model, r.dtype if several else None) if v is not None)
    method = f"{r.method} ({measured})" if measured else r.method
    return [r.scope, r.protocol, _density(r.density), method, episodes, str(r.tasks), nll, _pct(r.top1), delta, pairs]


def _density(d: float | None) -> str:
    return "-" if d is None else f"{d:g}"


#: the trade-off table: a cell's quality beside its cost, a line per (scope, protocol, density, method)
TRADEOFF_HEADER = [
    "scope",
    "protocol",
    "density",
    "method",
    "resolved [95% CI]",
    "ΔNLL vs dense",
    "kept",
    "KV held",
    "KV held peak",
    "KV alloc peak",
    "turns",
    "gen tokens",
    "wall s",
]


def tradeoff_rows(table: CompareTable) -> list[list[str]]:
    """:data:`TRADEOFF_HEADER` cells, one line per cell of the table that has episodes (dense once per scope
    x protocol: it is the same in every density row). Own-stream replays measured in several dtypes give the cell's
    ΔNLL once per dtype, each named (``+0.124 (float32); +0.131 (bfloat16)``): never one picked silently."""
    replays: dict[GridKey, list[ReplayCell]] = {}
    for r in _own_stream(table):
        replays.setdefault((r.scope, r.protocol, r.density, r.method), []).append(r)
    several = len({r.dtype for r in _own_stream(table)}) > 1
    lines, seen = [], set()
    for row in table.rows:
        for method, c in row.cells.items():
            key = grid_key(row, method)
            if key in seen or (c.n == 0 and not c.pending and c.not_run is None):
                continue
            seen.add(key)
            measured = [r for r in replays.get(key, []) if r.delta_nll is not None]
            if not measured:
                delta = "-"
            elif several:
                delta = "; ".join(f"{r.delta_nll:+.3f} ({dtype_text(r.dtype)})" for r in measured)
            else:
                delta = f"{measured[0].delta_nll:+.3f}"
            cost = c.cost
            lines.append(
                [
                    row.scope,
                    row.protocol,
                    _density(c.density),
                    method,
                    " ".join(quality_parts(c)),
                    delta,
                    _pct(cost.kept_fraction),
                    human_bytes(cost.mean_kv_held_bytes),
                    human_bytes(cost.mean_kv_peak_held_bytes),
                    human_bytes(cost.mean_kv_peak_allocated_bytes),
                    _fixed(cost.turns, 1),
                    _fixed(cost.generated_tokens, 0),
                    _fixed(cost.wall_s, 1),
                ]
            )
    return lines


def _own_stream(table: CompareTable) -> list[ReplayCell]:
    """The replay cells of the sources' own token streams (model ``None``): the only ΔNLL the trade-off table puts
    beside a cell's Pass@1, since a text trajectory's replay measured another model."""
    return [r for r in table.replay if r.model is None]


def tradeoff_caption(table: CompareTable) -> str:
    """:data:`TRADEOFF_CAPTION`, and with a ΔNLL column what its replays were measured on."""
    own = _own_stream(table)
    if not own:
        return TRADEOFF_CAPTION
    units = units_text((r.model, r.dtype) for r in own)
    return f"{TRADEOFF_CAPTION}; ΔNLL vs dense: replays of the sources' own streams, measured on {units}"


def tradeoff_columns(table: CompareTable) -> tuple[list[str], list[list[str]]]:
    """(header, lines) of the trade-off table; the ΔNLL column only when the table carries replays of the sources'
    own streams."""
    header, lines = TRADEOFF_HEADER, tradeoff_rows(table)
    if _own_stream(table):
        return list(header), lines
    drop = header.index("ΔNLL vs dense")
    return [h for i, h in enumerate(header) if i != drop], [[v for i, v in enumerate(x) if i != drop] for x in lines]


def _fixed(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _key_text(key: GridKey, sep: str) -> str:
    scope, protocol, density, method = key
    return sep.join([scope, protocol] + ([] if density is None else [f"d={density:g}"]) + [method])


def to_markdown(table: CompareTable) -> str:
    if table.rows:
        lines = ["| scope | protocol | density | " + " | ".join(table.methods) + " |"]
        lines.append("|---|---|---|" + "---|" * len(table.methods))
        for row in table.rows:
            cells = [cell_text(row.cells[m]) for m in table.methods]
            lines.append(f"| {row.scope} | {row.protocol} | {_density(row.density)} | " + " | ".join(cells) + " |")
        lines += ["", table.caption]
    else:
        lines = [NO_SAMPLES]
    if table.demonstrations:
        lines += [""] + [f"- {d.text}" for d in table.demonstrations]
    if table.rows:
        lines += ["", "Quality beside cost (means per episode of the cell's counted episodes):", ""]
        lines += [_markdown_table(*tradeoff_columns(table))]
    if table.replay:
        lines += ["", f"Counterfactual replay: {replay_caption(table.replay)}.", ""]
        lines += ["| " + " | ".join(REPLAY_HEADER) + " |", "|" + "---|" * len(REPLAY_HEADER)]
        several = several_dtypes(table.replay)
        lines += ["| " + " | ".join(replay_text(r, several)) + " |" for r in table.replay]
    action = table.action_layout
    if action is not None:
        lines += ["", f"{action.title}:", ""]
        lines += [_markdown_table(action_header(action), action_lines(action, sep="; "))]
        lines += ["", action.caption + ".", "", "Copy top-1 by distance:", ""]
        lines += [_markdown_table(action.distance_header, action.distance_lines()), "", action.distance_caption + "."]
    if table.grid:
        lines += ["", "Per task (one symbol per seed): " + LEGEND, ""]
        keys = list(table.grid)
        lines.append("| task | " + " | ".join(_key_text(k, "/") for k in keys) + " |")
        lines.append("|---|" + "---|" * len(keys))
        for task in table.tasks:
            lines.append(f"| {task} | " + " | ".join(_grid_cell(table, k, task) for k in keys) + " |")
    lines += [""] + [f"Note: {n}" for n in table.notes]
    return "\n".join(lines).rstrip() + "\n"


def _markdown_table(header: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(out + ["| " + " | ".join(v) + " |" for v in lines])


def action_header(action: ActionLayout) -> list[str]:
    """The action table's header: the row's label parts, then one column per method."""
    return ["scope", "protocol", "density", *(["model, dtype"] if action.several_models else []), *action.methods]


def action_lines(action: ActionLayout, *, sep: str) -> list[list[str]]:
    """The action table's rows as text cells (a cell's lines joined by ``sep``)."""
    out = []
    for row in action.rows:
        head = [row.scope, row.protocol, _density(row.density)]
        head += [row.unit_text] if action.several_models else []
        out.append(head + [sep.join(cell_lines(row.cells[m])) for m in action.methods])
    return out


#: under the trade-off table: what its cost columns are
TRADEOFF_CAPTION = (
    "kept = cache slots after eviction / tokens seen, mean over turns; KV held = K/V entries held x bytes per "
    "entry after a turn, mean over turns; KV held peak / KV alloc peak = the episode's largest KV held / K/V "
    "buffers allocated (spare capacity and padding included) at any moment, a prefill before its eviction "
    "included; turns, generated tokens and wall time per episode; all means over the cell's episodes"
)


def rich_tables(table: CompareTable) -> list[Any]:
    """rich renderables: the summary table, the trade-off table, then one per-task grid per row."""
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    title = "compare " + " ".join(table.job_ids) if table.job_ids else "compare"
    summary = Table(title=title, show_lines=True, caption="\n".join([table.caption, *table.notes]))
    summary.add_column("scope / protocol", style="bold")
    for method in table.methods:
        summary.add_column(method, justify="center")
    for row in table.rows:
        summary.add_row(
            row.label.replace(" / ", "\n"), *(cell_text(row.cells[m], multiline=True) for m in table.methods)
        )
    renderables: list[Any] = [summary if table.rows else Text("\n".join([NO_SAMPLES, *table.notes]))]
    renderables += [Text(d.text, style="bold") for d in table.demonstrations]
    if table.rows:
        tradeoff = Table(title="quality beside cost", caption=tradeoff_caption(table))
        header, values = tradeoff_columns(table)
        for i, name in enumerate(header):
            tradeoff.add_column(name, justify="left" if i < 4 else "right")
        for v in values:
            tradeoff.add_row(*v)
        renderables.append(tradeoff)
    if table.replay:
        replay = Table(title="counterfactual replay", caption=replay_caption(table.replay))
        for i, name in enumerate(REPLAY_HEADER):
            replay.add_column(name, justify="left" if i < 4 else "right")
        for r in table.replay:  # escaped: a variant's label, nexus[head_scores=per_head], is not rich markup
            replay.add_row(*(escape(v) for v in replay_text(r, several_dtypes(table.replay))))
        renderables.append(replay)
    action = table.action_layout
    if action is not None:
        header = action_header(action)
        labels = len(header) - len(action.methods)
        actions = Table(title=action.title, caption=action.caption, show_lines=True)
        for i, name in enumerate(header):
            actions.add_column(escape(name), justify="left" if i < labels else "center")
        for line in action_lines(action, sep="\n"):
            actions.add_row(*(escape(v) for v in line))
        renderables.append(actions)
        distance = Table(title="copy top-1 by distance", caption=action.distance_caption)
        for i, name in enumerate(action.distance_header):
            distance.add_column(
                name, justify="left" if i < len(action.distance_header) - len(DISTANCE_BUCKETS) else "right"
            )
        for line in action.distance_lines():
            distance.add_row(*(escape(v) for v in line))
        renderables.append(distance)
    for row in table.rows:
        title = f"per task: {row.label}"
        grid = Table(title=title, min_width=len(title) + 4)
        grid.add_column("task")
        for method in table.methods:
            grid.add_column(method, justify="center")
        for task in table.tasks:
            grid.add_row(task, *(_grid_cell(table, grid_key(row, m), task) for m in table.methods))
        renderables.append(grid)
    renderables.append(Text(LEGEND, style="dim"))
    return renderables


def render(table: CompareTable, fmt: str = "table", *, width: int = 140) -> str:
    """The table as text in ``fmt`` (one of :data:`FORMATS`)."""
    return render_as(table, fmt, width=width, csv_of=to_csv, markdown_of=to_markdown, renderables_of=rich_tables)


def render_as(
    table: Any,
    fmt: str,
    *,
    width: int,
    csv_of: Callable[[Any], str],
    markdown_of: Callable[[Any], str],
    renderables_of: Callable[[Any], list[Any]],
) -> str:
    """A results table (one with ``to_dict()``) as text in ``fmt``, one of :data:`FORMATS`, with that table's
    own csv / markdown writers and rich renderables: what every results view (compare, probes) renders through."""
    if fmt == "json":
        return json.dumps(table.to_dict(), indent=2, sort_keys=False) + "\n"
    if fmt == "csv":
        return csv_of(table)
    if fmt == "tsv":
        return csv_to_tsv(csv_of(table))
    if fmt == "markdown":
        return markdown_of(table)
    if fmt == "table":
        from rich.console import Console

        console = Console(file=io.StringIO(), width=width, force_terminal=False, color_system=None)
        for renderable in renderables_of(table):
            console.print(renderable)
        return console.file.getvalue()  # type: ignore[attr-defined]
    raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
