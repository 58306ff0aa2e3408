"""One cell of ``compare``'s table (a method in a (scope, protocol, density) row): which outcomes it summarizes
and its statistics. :mod:`results.compare` builds the table of these cells; what every number means:
``docs/numbers.md``. A cell reports

- its cost beside its quality (``Cell.cost``, :mod:`results.cost`): kept fraction of the logical tokens,
  KV bytes held and allocated, turns, generated tokens and wall time, means over its counted episodes;
- resolved / n and Pass@1 = the mean over tasks of (resolved seeds / counted seeds) (with one seed per task,
  resolved / n); with several seeds also pass@k (Chen et al.) with k = the fewest counted seeds of any task;
- one 95% interval, chosen for the whole table by its design (:func:`interval_rule`): one seed per task, a Wilson
  interval over episodes; several seeds, a percentile bootstrap over tasks (a task's seeds resampled together,
  since they are not independent), shown only from ``MIN_BOOTSTRAP_UNITS`` tasks: below that the cell says "too
  few for an interval" instead of printing [min, max];
- a paired test against dense: one seed per task, McNemar over the (task, seed) pairs (exact below 25 discordant
  pairs, chi-square with continuity correction above; ``b`` = pairs only the method resolved, ``c`` = only dense);
  several seeds, a sign-flip test over tasks on each task's mean difference (clusters respected); ``n_pairs``,
  ``pair_tasks`` and ``unpaired`` (counted episodes with no dense counterpart) beside every p.

What counts: verdicts (resolved, unresolved, empty_patch, patch_failed) and the run failures timeout and
infra_failure are in ``n`` (a failure is "not resolved", as in SWE-bench, and is also counted in
``failures``); ``at_limit`` counts the verdicts graded on the patch an agent left at its step, context, time or
format-error limit. Queued/running episodes and agent exits still waiting for their grade are ``pending``; agent
exits of a job that does not grade are ``ungraded`` (they never will be); cancelled ones are ``cancelled``; none
of these is in ``n``. A cell whose *every* episode broke (timeout, infra_failure or cancelled) measured nothing: it is
"not run" (``Cell.not_run``: the first episode's stored error, one line, shortened), with ``n`` 0 and no rate,
interval or p-value, and no method is tested against a dense cell that was not run. A cell with some broken and some
measured episodes counts its broken ones as above.

Dense evicts nothing, so a job runs it in one scope only, under each protocol unless its model renders a history
alike under both (see ``jobs.spec``, ``agent_runner.dense_reuse``): a row without its own dense episodes reuses
its protocol's dense from another scope, and only where its protocol has none another protocol's; the cell says
``reused_dense``, a note says when dense crossed protocols, and a note per job why (``dense_protocol_notes``).

Pure functions over :class:`results.compare_table.Outcome` rows, testable without a database.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from agent_runner.config import PROTOCOLS
from db.models import RUN_FAILURE_STATUSES, EpisodeStatus
from nexus.methods import DENSE, SCOPES
from results.compare_table import (
    TASK_BOOTSTRAP,
    WILSON,
    Cell,
    GridKey,
    Outcome,
    Row,
    broke_all,
    first_outcome,
    in_canonical_order,
)
from results.cost import summarize_cost
from results.stats import (
    bootstrap_mean_ci,
    mcnemar_paired,
    pass_at_k,
    sign_flip_test,
    wilson_interval,
)


def dense_for_row(outcomes: list[Outcome], scope: str, protocol: str) -> tuple[list[Outcome], bool, tuple[str, ...]]:
    """Dense outcomes for a row (one per task and seed): its own; else those of another scope under the row's
    protocol (dense has no scope: the same computation); else those of another protocol, which is the same
    computation only where the job's model renders a history alike under both (``jobs.spec``, planning's
    ``dense_rendering``). Returns (outcomes, reused, the other protocols they ran under: empty unless borrowed)."""
    dense = [o for o in outcomes if o.method == DENSE]
    own = [o for o in dense if (o.scope, o.protocol) == (scope, protocol)]
    if own or not dense:
        return own, False, ()
    same_protocol = [o for o in dense if o.protocol == protocol]
    pool = same_protocol or dense
    chosen: dict[tuple[str, int], Outcome] = {}
    cell_rank = {c: i for i, c in enumerate((s, p) for s in SCOPES for p in PROTOCOLS)}
    for o in sorted(pool, key=lambda o: cell_rank.get((o.scope, o.protocol), len(cell_rank))):
        chosen.setdefault((o.task_id, o.seed), o)
    borrowed = () if same_protocol else tuple(in_canonical_order({o.protocol for o in chosen.values()}, PROTOCOLS))
    return list(chosen.values()), True, borrowed


def dense_borrowed(outcomes: list[Outcome], rows: Iterable[Row]) -> dict[str, tuple[str, ...]]:
    """Per row protocol whose dense column came from another protocol: the protocols it ran under."""
    found = {r.protocol: dense_for_row(outcomes, r.scope, r.protocol)[2] for r in rows}
    return {protocol: sources for protocol, sources in found.items() if sources}


def cell_outcomes(outcomes: list[Outcome], key: GridKey) -> list[Outcome]:
    """The outcomes one table cell ``(scope, protocol, density, method)`` summarizes: the method's own at that
    density; for dense, the row's dense outcomes (whatever the density), reused from another cell when the
    row has none of its own (see :func:`results.compare.build_table`)."""
    scope, protocol, density, method = key
    if method == DENSE:
        return dense_for_row(outcomes, scope, protocol)[0]
    return [o for o in outcomes if (o.method, o.scope, o.protocol, o.density) == (method, scope, protocol, density)]


def interval_rule(outcomes: Iterable[Outcome]) -> str:
    """The interval a table uses, from its design, never from which seeds happen to have finished: a Wilson interval
    over episodes when every key group (task x configuration) was run with one seed, else a bootstrap over tasks."""
    seeds: dict[tuple[str, str, str, str, float | None], set[int]] = defaultdict(set)
    for o in outcomes:
        seeds[(o.task_id, o.method, o.scope, o.protocol, o.density)].add(o.seed)
    return TASK_BOOTSTRAP if any(len(v) > 1 for v in seeds.values()) else WILSON


def summarize_cell(
    method: str,
    outcomes: list[Outcome],
    dense: list[Outcome] | None,
    *,
    confidence: float = 0.95,
    seed: int = 0,
    interval: str = WILSON,
    resamples: Sequence[Outcome] = (),
) -> Cell:
    """Statistics for one method's outcomes in one row; ``dense`` (the row's dense outcomes) for the paired test;
    ``interval`` the table's rule (:func:`interval_rule`); ``resamples`` the cell's later attempts (best of n)."""
    cell = Cell(method=method)
    counted = [o for o in outcomes if o.counted]
    if broke_all(outcomes):  # nothing measured: no n, rate, interval or test; compare_jobs names its cause
        cell.not_run = first_outcome(outcomes).status
        cell.cancelled = sum(o.status == EpisodeStatus.cancelled for o in outcomes)
        cell.failures = sum(o.status in RUN_FAILURE_STATUSES for o in outcomes)
        cell.resamples = len(resamples)
        cell.ci_method = interval
        return cell
    cell.pending = sum(o.pending for o in outcomes)
    cell.ungraded = sum(o.ungraded for o in outcomes)
    cell.cancelled = sum(o.status == EpisodeStatus.cancelled for o in outcomes)
    cell.failures = sum(o.status in RUN_FAILURE_STATUSES for o in counted)
    cell.at_limit = sum(o.at_limit for o in counted)
    cell.interactive = sum(o.interactive for o in counted)
    cell.n, cell.resolved = len(counted), sum(o.resolved for o in counted)
    cell.cost = summarize_cost([o.cost for o in counted])
    per_task: dict[str, list[bool]] = defaultdict(list)
    for o in counted:
        per_task[o.task_id].append(o.resolved)
    cell.n_tasks = len(per_task)
    cell.n_seeds = max((len(v) for v in per_task.values()), default=0)
    _best_of_n(cell, counted, resamples)
    cell.ci_method = interval
    if cell.n == 0:
        return cell
    task_rates = [sum(v) / len(v) for v in per_task.values()]
    cell.rate = sum(task_rates) / len(task_rates)
    if interval == WILSON:
        cell.ci_low, cell.ci_high = wilson_interval(cell.resolved, cell.n, confidence)
    else:
        ci = bootstrap_mean_ci(task_rates, confidence=confidence, seed=seed)
        cell.ci_low, cell.ci_high = ci if ci is not None else (None, None)
        k = min(len(v) for v in per_task.values())
        if k >= 2:
            cell.pass_at_k[k] = sum(pass_at_k(len(v), sum(v), k) for v in per_task.values()) / len(per_task)
    if dense is not None and method != DENSE:
        _paired_test(cell, counted, dense, clustered=interval != WILSON, seed=seed)
    return cell


def _paired_test(cell: Cell, counted: list[Outcome], dense: list[Outcome], *, clustered: bool, seed: int) -> None:
    """The paired test against dense over the (task, seed) pairs both counted: McNemar with one seed per task,
    a sign-flip test over tasks (each task's mean difference over its pairs) with several."""
    dense_by_pair = {(o.task_id, o.seed): o.resolved for o in dense if o.counted}
    pairs = [
        (o.task_id, o.resolved, dense_by_pair[(o.task_id, o.seed)])
        for o in counted
        if (o.task_id, o.seed) in dense_by_pair
    ]
    cell.n_pairs, cell.unpaired = len(pairs), len(counted) - len(pairs)
    if not pairs:
        return
    test = mcnemar_paired((mine, theirs) for _, mine, theirs in pairs)
    cell.b, cell.c = test.b, test.c
    by_task: dict[str, list[float]] = defaultdict(list)
    for task, mine, theirs in pairs:
        by_task[task].append(float(mine) - float(theirs))
    cell.pair_tasks = len(by_task)
    if not clustered:
        cell.p_value, cell.test = test.p_value, f"mcnemar_{test.method}"
        return
    flip = sign_flip_test([sum(d) / len(d) for d in by_task.values()], seed=seed)
    cell.p_value, cell.test = flip.p_value, flip.method


def _best_of_n(cell: Cell, counted: list[Outcome], resamples: Sequence[Outcome]) -> None:
    """The cell's resamples, and (when there are any) the share of its counted keys that any attempt resolved."""
    later = [o for o in resamples if o.counted]
    cell.resamples = len(resamples)
    if not later or not counted:
        return
    attempts: dict[tuple[str, int], list[bool]] = {(o.task_id, o.seed): [o.resolved] for o in counted}
    for o in later:
        if (o.task_id, o.seed) in attempts:
            attempts[(o.task_id, o.seed)].append(o.resolved)
    cell.best_of_n = sum(any(v) for v in attempts.values()) / len(attempts)
    cell.best_of_attempts = max(len(v) for v in attempts.values())
