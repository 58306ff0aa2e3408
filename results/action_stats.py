"""The action table ``compare`` adds when replays scored the spans of an agent's calls (``Replay.action``).

The per-replay sums it averages (copy and new spans, how far back each copied source was) are
:mod:`results.action_outcomes`'; this module turns them into cells and their tests.

One :class:`ActionCell` per (method, scope, protocol, density, model, dtype). As ``compare``'s Pass@1 and the replay
table, **per task first**: the copy tokens of a task's replays (several episodes or seeds of one task) are pooled,
token-weighted, into one value per task, and the cell's number is the mean over tasks, so a task with many
episodes or many spans never weighs more than one with few. Spans of one task are never treated as independent:
the interval is a seeded percentile bootstrap over tasks (only from ``MIN_BOOTSTRAP_UNITS`` tasks; fewer: none,
and the renderers say so) and the paired tests are sign-flip tests over per-task differences.

Every mean of a cell is over the same episodes: those with a dense replay of the *same* episode, protocol, model
and dtype (``paired``; dense's scope is moot: it evicts nothing). A (model, dtype) pair is a unit
(``results.replay_stats.Unit``): a replay measured in bfloat16 is never paired with one measured in float32, as the
dense baseline, the SnapKV baseline or in a sign-flip test. A replay without that baseline is ``unpaired`` and
in no mean. The split by distance (:class:`DistanceCell`) is over the same episodes, span by span, with the
buckets of ``results.action_outcomes.DISTANCE_BUCKETS``. Pure functions over ``ActionOutcome``, like
``results.replay_stats``.

A replay run under settings other than its job's own for the method (``replay --method-params``) is a **variant**:
its cells (and its column) are apart from the method's default ones, named by its label,
``nexus[head_scores=per_head]`` (``jobs.variants``). Only plain ``dense`` rows are the dense baseline, and only
plain ``snapkv`` rows the SnapKV one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent_runner.config import PROTOCOLS
from jobs.variants import order_labels
from nexus.methods import DENSE, SCOPES
from results.action_outcomes import DISTANCE_BUCKETS, ActionOutcome, SpanSums, outcomes_from_rows
from results.replay_stats import BaselineKey, unit_order
from results.stats import bootstrap_mean_ci, sign_flip_test

#: the second baseline every cell is tested against (same scope, protocol, density, model and dtype)
SNAPKV = "snapkv"


@dataclass
class ActionCell:
    """One (method, scope, protocol, density, model, dtype). Every mean is per task first (a task's copy tokens pooled
    over its episodes), then over tasks; all over the ``paired`` episodes. Fractions in [0, 1]; NLL in nats per
    token; ``None`` where there is nothing to average (and the interval ``None`` below ``MIN_BOOTSTRAP_UNITS``)."""

    method: str  # the method, or a variant's label (jobs.variants): a variant's rows are never a default's cell
    scope: str
    protocol: str
    density: float | None  # None for dense (it keeps every token)
    model: str | None
    dtype: str | None = None  # the dtype the measuring model ran in (None: not recorded)
    episodes: int = 0  # ok replays with an action summary
    paired: int = 0  # of them, with a dense replay of the same episode, protocol, model and dtype
    unpaired: int = 0  # without one: in no mean
    tasks: int = 0  # tasks of the paired episodes with scored copy tokens: the units of the interval and tests
    spans: int = 0  # copy spans of the paired episodes
    copy_tokens: int = 0  # their scored tokens (after each span's first)
    copy_top1: float | None = None  # share of those tokens that were the argmax, per task, mean over tasks
    copy_top1_ci: tuple[float, float] | None = None  # bootstrap over tasks; None with fewer than MIN_BOOTSTRAP_UNITS
    copy_nll: float | None = None
    delta_copy_nll: float | None = None  # copy NLL minus dense's on the same episodes, per task, mean over tasks
    delta_copy_nll_ci: tuple[float, float] | None = None
    copy_exact: float | None = None  # share of copy spans greedy-exact (every token argmax), per task, mean
    copy_held: float | None = None  # share of a copy's source the cache held when the copy began, per task, mean
    new_top1: float | None = None  # the same over new spans (values not copied)
    new_nll: float | None = None
    new_tokens: int = 0
    p_vs_dense: float | None = None  # sign-flip over tasks of (copy top-1 - dense's), paired by episode
    tasks_vs_dense: int = 0
    test_vs_dense: str | None = None
    p_vs_snapkv: float | None = None  # the same against snapkv at this scope, protocol, density, model and dtype
    tasks_vs_snapkv: int = 0
    test_vs_snapkv: str | None = None
    spans_unlocated: int = 0  # copy spans whose source was not in the context: in no distance bucket
    #: the KV held: per replay the mean over its turns of the bytes held after each turn, per task then mean over
    #: tasks (equal memory is what makes two cells comparable: observation_masking's paper rule keeps what it keeps)
    kv_held_bytes: float | None = None

    @property
    def too_few_for_interval(self) -> bool:
        return self.copy_top1 is not None and self.copy_top1_ci is None

    def to_dict(self) -> dict[str, Any]:
        return {name: _jsonable(getattr(self, name)) for name in self.__dataclass_fields__}


@dataclass
class DistanceCell:
    """Copy top-1 of one cell's copy spans whose source was ``bucket`` tokens back (:data:`DISTANCE_BUCKETS`):
    per task (tokens pooled), then the mean over ``tasks``; ``spans`` copy spans in the bucket."""

    method: str
    scope: str
    protocol: str
    density: float | None
    model: str | None
    dtype: str | None
    bucket: str
    copy_top1: float | None = None
    spans: int = 0
    tasks: int = 0  # tasks with scored copy tokens in the bucket
    copy_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {name: _jsonable(getattr(self, name)) for name in self.__dataclass_fields__}


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _order(values: Iterable[str], canonical: Sequence[str]) -> list[str]:
    present = set(values)
    return [v for v in canonical if v in present] + sorted(present - set(canonical))


def _per_task(outcomes: Iterable[ActionOutcome]) -> dict[str, SpanSums]:
    """Each task's pooled sums over its outcomes."""
    tasks: dict[str, SpanSums] = {}
    for o in outcomes:
        tasks.setdefault(o.task_id, SpanSums()).add(o.pool)
    return dict(sorted(tasks.items()))


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _dense_baseline(outcomes: Sequence[ActionOutcome]) -> dict[BaselineKey, ActionOutcome]:
    """Dense outcomes by (episode, protocol, model, dtype, scope); scope ``""`` holds the first scope's, the fallback
    for a method replayed under a scope dense was not (dense evicts nothing: its scope is moot)."""
    baseline: dict[BaselineKey, ActionOutcome] = {}
    rank = {s: i for i, s in enumerate(SCOPES)}
    for o in sorted((o for o in outcomes if o.method == DENSE), key=lambda o: rank.get(o.scope, len(rank))):
        baseline[(o.episode_id, o.protocol, o.model, o.dtype, o.scope)] = o
        baseline.setdefault((o.episode_id, o.protocol, o.model, o.dtype, ""), o)
    return baseline


def _paired_difference(
    mine: Sequence[ActionOutcome], theirs: dict[str, ActionOutcome], *, seed: int
) -> tuple[float | None, int, str | None]:
    """(p, tasks, test): a sign-flip test over tasks of (my copy top-1 - theirs), each task's values pooled over
    the episodes both sides have (``theirs``: by episode id)."""
    both = [o for o in mine if o.episode_id in theirs]
    a, b = _per_task(both), _per_task(theirs[o.episode_id] for o in both)
    diffs = [
        a[t].copy_top1 - b[t].copy_top1  # type: ignore[operator]
        for t in a
        if a[t].copy_top1 is not None and b[t].copy_top1 is not None
    ]
    if not diffs:
        return None, 0, None
    test = sign_flip_test(diffs, seed=seed)
    return test.p_value, len(diffs), test.method


def summarize_cell(
    method: str,
    scope: str,
    protocol: str,
    density: float | None,
    model: str | None,
    outcomes: Sequence[ActionOutcome],
    baseline: dict[BaselineKey, ActionOutcome],
    snapkv: Sequence[ActionOutcome] = (),
    *,
    confidence: float = 0.95,
    seed: int = 0,
    dtype: str | None = None,
) -> tuple[ActionCell, list[DistanceCell]]:
    """One cell and its split by distance; ``baseline`` from :func:`_dense_baseline`, ``snapkv``: snapkv's
    outcomes at the same scope, protocol, density, model and dtype (none for snapkv itself and dense)."""
    cell = ActionCell(method, scope, protocol, density, model, dtype, episodes=len(outcomes))
    paired: list[tuple[ActionOutcome, ActionOutcome]] = []
    for o in outcomes:
        dense = baseline.get(
            (o.episode_id, protocol, model, dtype, scope), baseline.get((o.episode_id, protocol, model, dtype, ""))
        )
        if dense is not None:
            paired.append((o, dense))
    cell.paired, cell.unpaired = len(paired), len(outcomes) - len(paired)
    mine = [o for o, _ in paired]
    tasks = _per_task(mine)
    dense_tasks = _per_task(d for _, d in paired)
    cell.spans = sum(p.copy_spans for p in tasks.values())
    cell.copy_tokens = sum(p.copy_tokens for p in tasks.values())
    cell.new_tokens = sum(p.new_tokens for p in tasks.values())
    cell.spans_unlocated = sum(p.unlocated for p in tasks.values())
    top1 = [p.copy_top1 for p in tasks.values() if p.copy_top1 is not None]
    cell.tasks = len(top1)
    cell.copy_top1 = _mean(top1)
    ci = bootstrap_mean_ci(top1, confidence=confidence, seed=seed) if top1 else None
    cell.copy_top1_ci = ci
    cell.copy_nll = _mean([p.copy_nll for p in tasks.values() if p.copy_nll is not None])
    delta = [
        tasks[t].copy_nll - dense_tasks[t].copy_nll  # type: ignore[operator]
        for t in tasks
        if tasks[t].copy_nll is not None and dense_tasks[t].copy_nll is not None
    ]
    cell.delta_copy_nll = _mean(delta)
    cell.delta_copy_nll_ci = bootstrap_mean_ci(delta, confidence=confidence, seed=seed) if delta else None
    cell.copy_exact = _mean([p.copy_exact / p.copy_spans for p in tasks.values() if p.copy_spans])
    cell.copy_held = _mean([p.held_sum / p.held_spans for p in tasks.values() if p.held_spans])
    cell.new_top1 = _mean([p.new_top1_sum / p.new_tokens for p in tasks.values() if p.new_tokens])
    cell.new_nll = _mean([p.new_nll_sum / p.new_tokens for p in tasks.values() if p.new_tokens])
    cell.kv_held_bytes = _mean(
        [p.held_bytes_sum / p.held_bytes_replays for p in tasks.values() if p.held_bytes_replays]
    )
    if method != DENSE:
        cell.p_vs_dense, cell.tasks_vs_dense, cell.test_vs_dense = _paired_difference(
            mine, {o.episode_id: d for o, d in paired}, seed=seed
        )
    if snapkv:
        theirs = {o.episode_id: o for o in snapkv}
        cell.p_vs_snapkv, cell.tasks_vs_snapkv, cell.test_vs_snapkv = _paired_difference(mine, theirs, seed=seed)
    by_distance = []
    for label, _, _ in DISTANCE_BUCKETS:
        d = DistanceCell(method, scope, protocol, density, model, dtype, label)
        values = []
        for p in tasks.values():
            tokens, top1_sum, spans = p.by_distance.get(label, (0.0, 0.0, 0.0))
            d.spans += int(spans)
            d.copy_tokens += int(tokens)
            if tokens:
                values.append(top1_sum / tokens)
        d.tasks, d.copy_top1 = len(values), _mean(values)
        by_distance.append(d)
    return cell, by_distance


def summarize_actions(
    outcomes: Iterable[ActionOutcome], *, confidence: float = 0.95, seed: int = 0
) -> tuple[list[ActionCell], list[DistanceCell]]:
    """One cell per ((model, dtype), scope, protocol, density, method) present, ordered like ``compare``'s rows and
    columns (dense, whose density is ``None``, first in its scope x protocol), and their splits by distance."""
    rows = list(outcomes)
    baseline = _dense_baseline(rows)
    cells: list[ActionCell] = []
    distance: list[DistanceCell] = []
    for model, dtype in unit_order((o.model, o.dtype) for o in rows):
        of_model = [o for o in rows if (o.model, o.dtype) == (model, dtype)]
        for scope in _order((o.scope for o in of_model), SCOPES):
            for protocol in _order((o.protocol for o in of_model if o.scope == scope), PROTOCOLS):
                here = [o for o in of_model if (o.scope, o.protocol) == (scope, protocol)]
                for density in sorted({o.density for o in here}, key=lambda d: -1.0 if d is None else d):
                    at = [o for o in here if o.density == density]
                    snapkv = [o for o in at if o.method == SNAPKV]
                    for method in order_labels(o.method for o in at):  # each method's variants after it
                        mine = [o for o in at if o.method == method]
                        others = snapkv if method not in (SNAPKV, DENSE) else ()
                        cell, split = summarize_cell(
                            method,
                            scope,
                            protocol,
                            density,
                            model,
                            mine,
                            baseline,
                            others,
                            confidence=confidence,
                            seed=seed,
                            dtype=dtype,
                        )
                        cells.append(cell)
                        distance += split
    return cells, distance


def summarize_rows(
    rows: Iterable[Any], *, confidence: float = 0.95, seed: int = 0, job_configs: Mapping[str, Any] | None = None
) -> tuple[list[ActionCell], list[DistanceCell]]:
    """:func:`summarize_actions` of replay rows (``db.measure_models.Replay``, oldest first, current sources only);
    ``job_configs`` as for :func:`outcomes_from_rows`."""
    return summarize_actions(outcomes_from_rows(rows, job_configs=job_configs), confidence=confidence, seed=seed)
