"""The compare table as long-format CSV (``compare --format csv``, the dashboard's download).

One line per (scope, protocol, density, method) cell with :data:`SUMMARY_COLUMNS` (the cost columns among them);
with replays the :data:`REPLAY_COLUMNS`, with an action table the :data:`ACTION_COLUMNS` on every line (a replayed
or action cell no episode row has gets a line of its own, its summary columns blank); ``to_csv(..., grid=True)``
gives one line per task x cell x seed instead. Numbers as plain text: counts as they are, floats to 6 digits.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from results.action_outcomes import DISTANCE_BUCKETS
from results.action_stats import ActionCell, DistanceCell
from results.compare_table import Cell, CompareTable, GridKey, grid_key
from results.cost import COST_FIELDS
from results.replay_stats import ReplayCell

SUMMARY_COLUMNS = [
    "scope",
    "protocol",
    "row_density",  # the row's density (the alignment key); the cell's own is ``density`` (1.0 for dense)
    "method",
    "density",
    "n",
    "resolved",
    "rate",
    "ci_low",
    "ci_high",
    "ci_method",
    "pass_at_k",
    "p_value_vs_dense",
    "test",
    "b",
    "c",
    "n_pairs",
    "pair_tasks",
    "unpaired",
    "n_tasks",
    "n_seeds",
    "pending",
    "ungraded",
    "cancelled",
    "failures",
    "at_limit",
    "resamples",
    "best_of_n",
    "best_of_attempts",
    "reused_dense",
    "interactive",
    "not_run",  # every episode broke: the first one's cause (rate, interval and p-value are blank); else blank
    *(f"cost_{name}" if name == "episodes" else name for name in COST_FIELDS),
]


REPLAY_COLUMNS = [
    "replay_episodes",
    "replay_tasks",
    "replay_nll",
    "replay_top1",
    "delta_nll_vs_dense",
    "delta_nll_ci_low",
    "delta_nll_ci_high",
    "replay_pairs",
    "replay_pair_tasks",
    "replay_unpaired",
    "replay_skipped",
    "replay_failed",
    "replay_model",  # a text trajectory's replay: the model it was scored on ('' for the source's own stream)
    "replay_dtype",  # the dtype the measuring model ran in ('' where not recorded)
]


def _replay_values(r: ReplayCell | None) -> list[Any]:
    if r is None:
        return [""] * len(REPLAY_COLUMNS)
    return [
        r.episodes,
        r.tasks,
        number_text(r.nll_mean),
        number_text(r.top1),
        number_text(r.delta_nll),
        number_text(r.delta_ci_low),
        number_text(r.delta_ci_high),
        r.n_pairs,
        r.pair_tasks,
        r.unpaired,
        r.skipped,
        r.failed,
        r.model or "",
        r.dtype or "",
    ]


def to_csv(table: CompareTable, *, grid: bool = False) -> str:
    """Long-format CSV: one line per cell (default) or, with ``grid=True``, one per task x cell x seed."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if grid:
        writer.writerow(["task_id", "scope", "protocol", "density", "method", "seed_index", "status", "driver"])
        for key in table.grid:
            for task in table.tasks:
                for i, (status, driver) in enumerate(table.seeds(key, task)):
                    writer.writerow([task, key[0], key[1], number_text(key[2]), key[3], i, status, driver])
        return out.getvalue()
    with_replays, with_actions = bool(table.replay), bool(table.action)
    writer.writerow(
        SUMMARY_COLUMNS + (REPLAY_COLUMNS if with_replays else []) + (ACTION_COLUMNS if with_actions else [])
    )
    # each replay and action cell once: the first of its (scope, protocol, density, method) on that cell's line,
    # any other (another model's or dtype's) on a line of its own, whose summary columns are blank
    replays: dict[GridKey, list[ReplayCell]] = {}
    for r in table.replay:
        replays.setdefault((r.scope, r.protocol, r.density, r.method), []).append(r)
    actions: dict[GridKey, list[ActionCell]] = {}
    for a in table.action:
        actions.setdefault((a.scope, a.protocol, a.density, a.method), []).append(a)
    splits = _distance_of(table)

    def extra(key: GridKey) -> list[Any]:
        waiting_r, waiting_a = replays.get(key), actions.get(key)
        out = _replay_values(waiting_r.pop(0) if waiting_r else None) if with_replays else []
        if with_actions:
            out += _action_values(waiting_a.pop(0), splits) if waiting_a else [""] * len(ACTION_COLUMNS)
        return out

    for row in table.rows:
        for method, c in row.cells.items():
            key = grid_key(row, method)
            writer.writerow([row.scope, row.protocol, number_text(row.density), method, *_cell_values(c), *extra(key)])
    blanks = [""] * (len(SUMMARY_COLUMNS) - 5)
    for key in list(dict.fromkeys([*replays, *actions])):  # replayed cells without a line of their own yet
        scope, protocol, density, method = key
        while replays.get(key) or actions.get(key):
            writer.writerow([scope, protocol, number_text(density), method, number_text(density), *blanks, *extra(key)])
    return out.getvalue()


def bucket_slug(label: str) -> str:
    """A distance bucket's label as a column-name part: ``<1K`` -> ``lt1k``, ``1K-2K`` -> ``1k_2k``, ``>=4K`` ->
    ``ge4k``."""
    return label.replace(">=", "ge").replace("<", "lt").replace("-", "_").lower()


#: the action cell's columns of the csv (only when the table has an action table); the split by distance as
#: ``action_copy_top1_<bucket>``, ``action_spans_<bucket>``, ``action_tasks_<bucket>`` per :data:`DISTANCE_BUCKETS`
ACTION_FIELDS = [
    "model",
    "dtype",
    "episodes",
    "paired",
    "unpaired",
    "tasks",
    "spans",
    "copy_tokens",
    "copy_top1",
    "copy_top1_ci_low",
    "copy_top1_ci_high",
    "copy_nll",
    "delta_copy_nll",
    "delta_copy_nll_ci_low",
    "delta_copy_nll_ci_high",
    "copy_exact",
    "copy_held",
    "new_top1",
    "new_nll",
    "new_tokens",
    "p_vs_dense",
    "tasks_vs_dense",
    "p_vs_snapkv",
    "tasks_vs_snapkv",
    "spans_unlocated",
    "kv_held_bytes",
]


ACTION_COLUMNS = [f"action_{name}" for name in ACTION_FIELDS] + [
    f"action_{what}_{bucket_slug(label)}"
    for label, _, _ in DISTANCE_BUCKETS
    for what in ("copy_top1", "spans", "tasks")
]


def _distance_of(table: CompareTable) -> dict[tuple[Any, ...], dict[str, DistanceCell]]:
    out: dict[tuple[Any, ...], dict[str, DistanceCell]] = {}
    for d in table.action_by_distance:
        out.setdefault((d.method, d.scope, d.protocol, d.density, d.model, d.dtype), {})[d.bucket] = d
    return out


def _action_values(a: ActionCell, splits: dict[tuple[Any, ...], dict[str, DistanceCell]]) -> list[Any]:
    """An action cell's values for :data:`ACTION_COLUMNS` (counts as they are, floats to 6 digits, '' for none)."""
    low, high = a.copy_top1_ci or (None, None)
    dlow, dhigh = a.delta_copy_nll_ci or (None, None)
    ci = {
        "copy_top1_ci_low": low,
        "copy_top1_ci_high": high,
        "delta_copy_nll_ci_low": dlow,
        "delta_copy_nll_ci_high": dhigh,
    }
    values: list[Any] = []
    for name in ACTION_FIELDS:
        v = ci[name] if name in ci else getattr(a, name)
        values.append((v or "") if name in ("model", "dtype") else v if isinstance(v, int) else number_text(v))
    split = splits.get((a.method, a.scope, a.protocol, a.density, a.model, a.dtype), {})
    for label, _, _ in DISTANCE_BUCKETS:
        d = split.get(label)
        values += ["", 0, 0] if d is None else [number_text(d.copy_top1), d.spans, d.tasks]
    return values


def _cell_values(c: Cell) -> list[Any]:
    """A cell's values for :data:`SUMMARY_COLUMNS` after scope, protocol, row_density and method."""
    cost = c.cost
    return [
        number_text(c.density),
        c.n,
        c.resolved,
        number_text(c.rate),
        number_text(c.ci_low),
        number_text(c.ci_high),
        c.ci_method or "",
        ";".join(f"{k}={v:.6g}" for k, v in c.pass_at_k.items()),
        number_text(c.p_value),
        c.test or "",
        c.b,
        c.c,
        c.n_pairs,
        c.pair_tasks,
        c.unpaired,
        c.n_tasks,
        c.n_seeds,
        c.pending,
        c.ungraded,
        c.cancelled,
        c.failures,
        c.at_limit,
        c.resamples,
        number_text(c.best_of_n),
        c.best_of_attempts,
        str(c.reused_dense).lower(),
        c.interactive,
        c.not_run or "",
        *(_cost_value(name, getattr(cost, name)) for name in COST_FIELDS),
    ]


def _cost_value(name: str, value: float | None) -> Any:
    """Bytes as whole numbers (a mean of byte counts, rounded), counts as they are, fractions to 6 digits."""
    if value is None:
        return ""
    return f"{value:.0f}" if name.endswith("_bytes") else value if name == "episodes" else f"{value:.6g}"


def number_text(x: float | None) -> str:
    return "" if x is None else f"{x:.6g}"
