"""The action table's text: what every renderer of it prints (``results.compare_render``, the dashboard's partial).

The statistics are ``results.action_stats``' (:class:`~results.action_stats.ActionCell`, one per method, scope,
protocol, density, model and dtype, and its split by distance, :class:`~results.action_stats.DistanceCell`); this
module only says how they are shown: the captions under the table and its split by distance (each saying the model
and dtype the cells were measured on), a cell as text lines (:func:`cell_lines`) or as an HTML element's ``data-*``
attributes (:func:`data_attributes`), and :class:`ActionLayout`, the rows scope x protocol x density (x model and
dtype) and method columns every renderer lays out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jobs.variants import order_labels
from nexus.methods import DENSE, SCOPES
from results.action_outcomes import DISTANCE_BUCKETS
from results.action_stats import SNAPKV, ActionCell, DistanceCell
from results.replay_stats import Unit, unit_text, units_text
from results.stats import MIN_BOOTSTRAP_UNITS

#: under the action table
ACTION_CAPTION = (
    "Action table: replayed calls scored span by span. copy top-1 = share of the tokens after each copy span's first "
    "(a value copied verbatim from an earlier observation) that were the model's argmax, tokens pooled over a "
    "task's replays, then the mean over tasks; [95% percentile bootstrap over tasks], only from "
    f"{MIN_BOOTSTRAP_UNITS} tasks (fewer: none, and the cell says so). ΔNLL = copy NLL (nats per token) minus dense's "
    "on the same episode, protocol, model and dtype, per task then mean. exact = share of copy spans greedy-exact "
    "(every token argmax, the first included), per task then mean. p = sign-flip test over tasks of per-task copy "
    "top-1 differences vs dense and vs SnapKV (same scope, protocol, density, model and dtype; spans of a task are "
    "never independent). spans, tasks: copy spans and tasks of the replays paired with their dense replay; an unpaired "
    "replay is in no number. What each number means: docs/numbers.md"
)

#: under the split by distance
DISTANCE_CAPTION = (
    "Copy top-1 by how far back the copied source was (tokens from the source's last token to the copy's first; "
    "K = 1,000 tokens): the same tokens and pairing as the action table, per task then mean over tasks, with the "
    "bucket's copy spans and tasks. Copy spans whose source was not in the context have no distance and are left out"
)


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def density_text(d: float | None) -> str:
    return "-" if d is None else f"{d:g}"


def cell_unit_text(cell: ActionCell | DistanceCell) -> str:
    """The model and dtype a cell was measured on: ``smollm2-135m, bfloat16``."""
    return unit_text(cell.model, cell.dtype)


def cell_lines(cell: ActionCell | None) -> list[str]:
    """One action cell as text lines: copy top-1 with its interval (or why none), ΔNLL vs dense, exact with the
    span and task counts, the KV held a turn, and the tests with the tasks they rest on."""
    if cell is None:
        return ["-"]
    if cell.paired == 0:
        return [f"no dense baseline ({cell.unpaired} unpaired)"]
    if cell.copy_top1 is None:
        lines = ["copy top-1 - (no scored copy tokens)"]
    elif cell.copy_top1_ci is None:
        lines = [f"copy top-1 {pct(cell.copy_top1)} ({cell.tasks} tasks: too few for an interval)"]
    else:
        low, high = cell.copy_top1_ci
        lines = [f"copy top-1 {pct(cell.copy_top1)} [{100 * low:.1f}–{100 * high:.1f}]"]
    if cell.method == DENSE:
        lines.append("ΔNLL 0 (the baseline)")
    elif cell.delta_copy_nll is not None:
        lines.append(f"ΔNLL {cell.delta_copy_nll:+.3f} vs dense")
    exact = "" if cell.copy_exact is None else f"exact {pct(cell.copy_exact)}, "
    unpaired = f", {cell.unpaired} unpaired" if cell.unpaired else ""
    lines.append(f"{exact}{cell.spans} spans, {cell.tasks} tasks{unpaired}")
    if cell.kv_held_bytes is not None:  # the memory the copies were scored at, beside them
        lines.append(f"KV held {cell.kv_held_bytes / 1e6:.1f} MB a turn")
    tests = [
        f"p={p:.3g} vs {name} ({n} tasks)"
        for p, name, n in (
            (cell.p_vs_dense, "dense", cell.tasks_vs_dense),
            (cell.p_vs_snapkv, SNAPKV, cell.tasks_vs_snapkv),
        )
        if p is not None
    ]
    if tests:
        lines.append(", ".join(tests))
    return lines


def data_attributes(cell: ActionCell | DistanceCell | None) -> dict[str, str]:
    """A cell's numbers for an HTML element's ``data-*`` attributes, named like its JSON fields (``_`` -> ``-``,
    an interval as ``...-ci-low`` / ``...-ci-high``): floats as ``repr`` (exact, as the JSON has them), '' for none."""
    out: dict[str, str] = {}
    for name, value in (cell.to_dict() if cell is not None else {}).items():
        key = name.replace("_", "-")
        if name.endswith("_ci"):
            low, high = value or ("", "")
            out[f"{key}-low"], out[f"{key}-high"] = (v if v == "" else repr(float(v)) for v in (low, high))
        else:
            out[key] = "" if value is None else repr(value) if isinstance(value, float) else str(value)
    return out


def distance_text(d: DistanceCell) -> str:
    """``82.0% (40 spans, 10 tasks)``; ``-`` for a bucket without a copy span."""
    if not d.spans:
        return "-"
    return f"{pct(d.copy_top1)} ({d.spans} spans, {d.tasks} tasks)"


@dataclass
class ActionRow:
    """One row of the rendered action table: a (scope, protocol, density[, model and dtype]) with a cell per
    method."""

    scope: str
    protocol: str
    density: float | None
    model: str | None
    cells: dict[str, ActionCell | None]
    dtype: str | None = None  # the dtype its cells were measured in (None: not recorded)

    @property
    def unit_text(self) -> str:
        """``smollm2-135m, bfloat16``: the row's model and dtype (its label column when the table has several)."""
        return unit_text(self.model, self.dtype)


@dataclass
class ActionLayout:
    """The action table as every renderer lays it out: rows scope x protocol x density (x model and dtype when the
    replays were measured on several (model, dtype) units), columns methods; dense's cell is the dense replay of the
    row's protocol, model and dtype (of the row's scope, else another: dense evicts nothing). ``distance``: a line per
    cell with the :data:`DISTANCE_BUCKETS` columns."""

    methods: list[str]
    units: list[Unit]  # the (model, dtype) pairs, in row order
    rows: list[ActionRow]
    distance: list[tuple[ActionCell, list[DistanceCell]]]

    @property
    def several_models(self) -> bool:
        """Whether the rows hold several (model, dtype) units: then each row names its model and dtype."""
        return len(self.units) > 1

    @property
    def title(self) -> str:
        return "Action table (copy spans), replayed on " + "; ".join(unit_text(m, d) for m, d in self.units)

    @property
    def caption(self) -> str:
        """:data:`ACTION_CAPTION` and what the cells were measured on (``... Measured on smollm2-135m, bfloat16``)."""
        return f"{ACTION_CAPTION}. Measured on {units_text(self.units)}"

    @property
    def distance_caption(self) -> str:
        """:data:`DISTANCE_CAPTION` and what the cells were measured on."""
        return f"{DISTANCE_CAPTION}. Measured on {units_text(self.units)}"

    @staticmethod
    def lines(cell: ActionCell | None) -> list[str]:
        return cell_lines(cell)

    @staticmethod
    def data(cell: ActionCell | None) -> dict[str, str]:
        return data_attributes(cell)

    @property
    def buckets(self) -> list[str]:
        return [label for label, _, _ in DISTANCE_BUCKETS]

    @property
    def distance_header(self) -> list[str]:
        extra = ["model, dtype"] if self.several_models else []
        return ["scope", "protocol", "density", "method", *extra, *(f"{b} tokens back" for b in self.buckets)]

    def distance_rows(self) -> list[tuple[ActionCell, list[str], list[tuple[str, DistanceCell]]]]:
        """Per cell: (the cell, its label columns, (text, bucket cell) per bucket)."""
        out = []
        for cell, split in self.distance:
            extra = [cell_unit_text(cell)] if self.several_models else []
            head = [cell.scope, cell.protocol, density_text(cell.density), cell.method, *extra]
            out.append((cell, head, [(distance_text(d), d) for d in split]))
        return out

    def distance_lines(self) -> list[list[str]]:
        """The split by distance as text cells under :attr:`distance_header`."""
        return [head + [text for text, _ in buckets] for _, head, buckets in self.distance_rows()]


def layout(cells: Sequence[ActionCell], by_distance: Sequence[DistanceCell]) -> ActionLayout:
    """How the action ``cells`` (and their ``by_distance`` split) are shown; see :class:`ActionLayout`."""
    methods = order_labels(c.method for c in cells)  # each method's variants in a column of its own, after it
    units = list(dict.fromkeys((c.model, c.dtype) for c in cells))
    rank = {s: i for i, s in enumerate(SCOPES)}
    rows = []
    for model, dtype in units:
        mine = [c for c in cells if (c.model, c.dtype) == (model, dtype)]
        evicting = [c for c in mine if c.method != DENSE] or mine
        keys = list(dict.fromkeys((c.scope, c.protocol, c.density) for c in evicting))
        dense = sorted((c for c in mine if c.method == DENSE), key=lambda c: rank.get(c.scope, len(rank)))
        for scope, protocol, density in keys:
            row = ActionRow(scope, protocol, density, model, {}, dtype)
            for method in methods:
                if method == DENSE:
                    same = [c for c in dense if c.protocol == protocol]
                    row.cells[method] = next((c for c in same if c.scope == scope), same[0] if same else None)
                else:
                    key = (method, scope, protocol, density)
                    row.cells[method] = next(
                        (c for c in mine if (c.method, c.scope, c.protocol, c.density) == key), None
                    )
            rows.append(row)
    splits: dict[tuple[Any, ...], list[DistanceCell]] = defaultdict(list)
    for d in by_distance:
        splits[(d.method, d.scope, d.protocol, d.density, d.model, d.dtype)].append(d)
    distance = [(c, splits[(c.method, c.scope, c.protocol, c.density, c.model, c.dtype)]) for c in cells]
    return ActionLayout(methods, units, rows, [(c, s) for c, s in distance if s])
