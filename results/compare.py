"""``compare``: the paper's Table 3 from the result attempts of one or more jobs.

Layout: one row per (scope, protocol, density) cell, one column per method. Density is the eviction's configured
kept fraction (``episodes.config.eviction.density``); jobs run at several densities (a sweep: ``compare J1 J2
J3``) get one row per density, and dense, which keeps every token, sits in each of them (its cell's density
reads 1.0). What every number means, with the rules below: ``docs/numbers.md``. A cell reports

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

Which attempt counts (``db.store.result_attempts``): each key's *first* agent attempt that did not break (a
timeout, infra_failure or cancelled attempt is replaced by the key's next one). A later agent attempt of a key
that already has its sample is a *resample*: never in Pass@1, the rate, pass@k or the test; a cell with resamples
shows them apart as "best of n" (``Cell.best_of_n``: keys resolved by any of their attempts). Interactive reruns,
steered or not, are kept apart and named in a note unless ``include_interactive``, which lets a key's newest
interactive attempt stand in for its result and marks it (``Cell.interactive``, ``CompareTable.drivers``).

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

When dense trajectories of the jobs were replayed (``nexus-eval replay``, ``measure.replay``), the table also
carries one :class:`results.replay_stats.ReplayCell` per replayed (scope, protocol, method): mean delta-NLL vs
dense with a bootstrap interval over tasks, and top-1 agreement. Without replays nothing changes. Replays that
scored the spans of the agent's calls (``Replay.action``: text trajectories replayed with ``--model``) add the
action table (:mod:`results.action_stats`: copy top-1 per task then over tasks, ΔNLL vs dense, tests vs dense and
SnapKV) and its split by how far back each copied source was.

Demonstrations are not samples: a job whose stored spec has a backend of :data:`DEMONSTRATION_BACKENDS` (``expert``:
a deterministic stand-in that applies the gold patch through the agent's tools) never puts an episode into a
Pass@1 cell, a paired test or the per-task grid. The table carries one :class:`Demonstration` line per such job
instead (``demonstrations (expert stand-in, not a Pass@1): 16/16 resolved``); its replays still make the replay and
action tables, which is what the demonstrations are for. The ``oracle`` backend (a test double, also a stand-in) is
kept as it was: the service's own tests and fixtures measure the table's arithmetic on oracle jobs.

Everything here is a pure function over :class:`Outcome` rows (testable without a database), except
:func:`compare_jobs`, the database entry point. ``results.compare_render.render`` turns a table into text
(``table``, ``json``, ``csv``, ``markdown``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from agent_runner.config import PROTOCOLS
from db.models import (
    RUN_FAILURE_STATUSES,
    EpisodeStatus,
)
from nexus.methods import DENSE, METHODS, SCOPES
from results.action_stats import summarize_rows
from results.compare_notes import (
    demonstration_notes,
    dense_protocol_notes,
    grading_notes,
    interactive_notes,
    not_run_notes,
    seed_notes,
    setting_notes,
)
from results.compare_table import (
    TASK_BOOTSTRAP,
    WILSON,
    Cell,
    CompareTable,
    GridKey,
    Outcome,
    Row,
    broke_all,
    demonstration,
    first_outcome,
    grid_key,
    in_canonical_order,
    is_demonstration,
    natural_key,
    not_run_reason,
)
from results.cost import EpisodeCost, episode_cost, summarize_cost
from results.replay_stats import current_replays, outcomes_from_rows, replay_notes, summarize_replays
from results.stats import (
    bootstrap_mean_ci,
    mcnemar_paired,
    pass_at_k,
    sign_flip_test,
    wilson_interval,
)


def merge_jobs(outcomes_per_job: Sequence[Sequence[Outcome]]) -> tuple[list[Outcome], list[str]]:
    """Union of several jobs' outcomes; when two jobs ran the same (task, method, scope, protocol, density,
    seed), the later job in the list wins (and a note says how often)."""
    merged: dict[tuple[str, str, str, str, float | None, int], Outcome] = {}
    replaced = 0
    for outcomes in outcomes_per_job:
        for o in outcomes:
            replaced += o.key in merged
            merged[o.key] = o
    notes = [f"{replaced} episode(s) ran in more than one job; the later job's result is used"] if replaced else []
    return list(merged.values()), notes


def _dense_for(outcomes: list[Outcome], scope: str, protocol: str) -> tuple[list[Outcome], bool, tuple[str, ...]]:
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
    found = {r.protocol: _dense_for(outcomes, r.scope, r.protocol)[2] for r in rows}
    return {protocol: sources for protocol, sources in found.items() if sources}


def cell_outcomes(outcomes: list[Outcome], key: GridKey) -> list[Outcome]:
    """The outcomes one table cell ``(scope, protocol, density, method)`` summarizes: the method's own at that
    density; for dense, the row's dense outcomes (whatever the density), reused from another cell when the
    row has none of its own (see :func:`build_table`)."""
    scope, protocol, density, method = key
    if method == DENSE:
        return _dense_for(outcomes, scope, protocol)[0]
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
    if broke_all(outcomes):  # nothing measured: no n, rate, interval or test; compare_jobs names the cause
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


def build_table(
    outcomes: Iterable[Outcome],
    *,
    job_ids: Sequence[str] = (),
    confidence: float = 0.95,
    seed: int = 0,
    notes: Sequence[str] = (),
    resamples: Iterable[Outcome] = (),
) -> CompareTable:
    """The comparison of ``outcomes`` (one per episode key; use :func:`merge_jobs` for several jobs);
    ``resamples``: the keys' later attempts, shown apart as best of n."""
    rows_in = list(outcomes)
    later = list(resamples)
    interval = interval_rule(rows_in)
    methods = in_canonical_order((o.method for o in rows_in), METHODS)
    evicting = [o for o in rows_in if o.method != DENSE]
    cells_present = {(o.scope, o.protocol) for o in evicting} or {(o.scope, o.protocol) for o in rows_in}
    by_cell: dict[tuple, list[Outcome]] = defaultdict(list)  # cell_outcomes for every cell in one pass
    for o in evicting:
        by_cell[(o.scope, o.protocol, o.density, o.method)].append(o)
    rows: list[Row] = []
    grid: dict[GridKey, dict[str, list[str]]] = {}
    drivers: dict[GridKey, dict[str, list[str]]] = {}
    for scope in in_canonical_order((s for s, _ in cells_present), SCOPES):
        for protocol in in_canonical_order((p for s, p in cells_present if s == scope), PROTOCOLS):
            dense, reused, _ = _dense_for(rows_in, scope, protocol)
            here = {o.density for o in evicting if (o.scope, o.protocol) == (scope, protocol)}
            for density in sorted(here) or [None]:  # type: ignore[type-var]  # None only without evicting methods
                cells = {}
                for method in methods:
                    key = (scope, protocol, None if method == DENSE else density, method)
                    mine = dense if method == DENSE else by_cell.get(key, [])
                    keys = {o.key for o in mine}
                    extra = [o for o in later if o.key in keys]
                    cell = summarize_cell(
                        method,
                        mine,
                        dense if dense and not broke_all(dense) else None,  # a dense that ran nothing pairs nothing
                        confidence=confidence,
                        seed=seed,
                        interval=interval,
                        resamples=extra,
                    )
                    cell.reused_dense = method == DENSE and reused
                    cell.density = 1.0 if method == DENSE else density
                    cells[method] = cell
                    grid[key], drivers[key] = _by_task(mine)
                rows.append(Row(scope, protocol, cells, density))
    table = CompareTable(
        job_ids=list(job_ids),
        methods=methods,
        rows=rows,
        tasks=sorted({o.task_id for o in rows_in}, key=natural_key),
        grid=grid,
        notes=list(notes),
        drivers=drivers,
        interval=interval,
        outcomes=rows_in,
    )
    borrowed = dense_borrowed(rows_in, rows)
    if any(c.reused_dense for r in rows if r.protocol not in borrowed for c in r.cells.values()):
        table.notes.append(
            "dense ran in one scope and is reused for the other scopes' rows of its protocol (it evicts nothing)"
        )
    for protocol, sources in borrowed.items():
        table.notes.append(
            f"dense ran under {', '.join(sources)} only and is reused for the {protocol} rows (their paired tests "
            "are against it): the same computation only where the model renders a history alike under both "
            "protocols"
        )
    if len(table.densities) > 1:
        table.notes.append(
            f"cells are aligned by density ({', '.join(f'{d:g}' for d in table.densities)}): one row per density; "
            "dense keeps every token and is the same in each"
        )
    table.notes += _count_notes(table)
    return table


def _count_notes(table: CompareTable) -> list[str]:
    """Notes for what the cells count apart: resamples, verdicts at a limit, ungraded agent exits."""
    cells = [c for r in table.rows for c in r.cells.values()]
    notes = []
    resamples = sum(c.resamples for c in cells)
    if resamples:
        notes.append(
            f"{resamples} resample(s) (agent attempts of keys that already had their sample) are kept apart: each "
            "key counts its first attempt; 'best of n' is the share resolved by any attempt and is not Pass@1"
        )
    at_limit = sum(c.at_limit for c in cells)
    if at_limit:
        notes.append(
            f"{at_limit} verdict(s) graded the patch an agent left when a step, context, time or format-error limit "
            "stopped it ('at limit' in the cells)"
        )
    if any(c.ungraded for c in cells):
        notes.append("this job does not grade (grade: false): its agent exits are final and ungraded, not pending")
    return notes


def _by_task(outcomes: Sequence[Outcome]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(statuses, drivers) per task, each ordered by seed: one grid cell."""
    statuses: dict[str, list[str]] = defaultdict(list)
    driven: dict[str, list[str]] = defaultdict(list)
    for o in sorted(outcomes, key=lambda o: o.seed):
        statuses[o.task_id].append(o.status)
        driven[o.task_id].append(o.driver)
    return dict(statuses), dict(driven)


def name_not_run(session: Any, table: CompareTable) -> None:
    """Give each "not run" cell (every episode broke) its first episode's cause: the first line of the error it
    stored, shortened (``results.compare_table.not_run_reason``); one query for the whole table."""
    from sqlalchemy import select

    from db.models import Episode

    firsts = {
        (i, method): first_outcome(cell_outcomes(table.outcomes, grid_key(row, method)))
        for i, row in enumerate(table.rows)
        for method, cell in row.cells.items()
        if cell.not_run is not None
    }
    ids = sorted({o.episode_id for o in firsts.values() if o.episode_id})
    errors = dict(session.execute(select(Episode.id, Episode.error).where(Episode.id.in_(ids))).all()) if ids else {}
    for (i, method), first in firsts.items():
        table.rows[i].cells[method].not_run = not_run_reason(first.status, errors.get(first.episode_id))


def outcome_density(method: str, density: float | None) -> float | None:
    """The density an episode ran at (its config's ``eviction.density``, ``Episode.config_density``); ``None`` for
    dense (it keeps everything)."""
    if method == DENSE:
        return None
    return None if density is None else float(density)


def outcomes_from_episodes(
    episodes: Iterable[Any], costs: dict[str, EpisodeCost] | None = None, *, grades: bool = True
) -> list[Outcome]:
    """``db.models.Episode`` rows (or anything with the same attributes) -> outcomes; ``costs`` by episode id
    (:func:`results.cost.episode_cost`), when the table should carry them; ``grades``: whether their job grades."""
    costs = costs or {}
    return [
        Outcome(
            e.task_id,
            e.method,
            e.scope,
            e.protocol,
            e.seed,
            e.status,
            job_id=e.job_id,
            attempt=e.attempt,
            episode_id=e.id,
            driver=e.driver,
            density=outcome_density(e.method, e.config_density),
            cost=costs.get(e.id),
            exit_status=e.exit_status,
            grades=grades,
        )
        for e in episodes
    ]


def compare_jobs(
    session: Any,
    job_ids: Sequence[str],
    *,
    confidence: float = 0.95,
    seed: int = 0,
    include_interactive: bool = False,
) -> CompareTable:
    """The database entry point: the table over the result attempts of ``job_ids`` (ids or unique prefixes): each
    key's first agent attempt that did not break (``db.store.result_attempts``); with ``include_interactive`` a
    key's newest interactive attempt stands in, counted and marked. Later agent attempts are resamples."""
    from db.job_rows import get_job
    from db.job_status import job_grades
    from db.store import interactive_attempts, resample_attempts, result_rows

    jobs = [get_job(session, j) for j in job_ids]
    ids = [job.id for job in jobs]
    # plain rows of the summary columns, not ORM objects: what keeps a 12,800-episode job under a second
    agent = [result_rows(session, [j]) for j in ids]  # also what replays are sources of
    episodes = [result_rows(session, [j], include_interactive=True) for j in ids] if include_interactive else agent
    every = [e for per_job in episodes for e in per_job]
    grading = [job_grades(job) for job in jobs]
    demos = [is_demonstration(job) for job in jobs]  # stand-ins: a demonstrations line each, never a Pass@1 cell
    samples = [e for per_job, demo in zip(episodes, demos, strict=True) if not demo for e in per_job]
    costs = {e.id: episode_cost(e) for e in samples}
    outcomes, notes = merge_jobs(
        [
            outcomes_from_episodes(e, costs, grades=g)
            for e, g, demo in zip(episodes, grading, demos, strict=True)
            if not demo
        ]
    )
    resamples = [
        o
        for j, g, demo in zip(ids, grading, demos, strict=True)
        if not demo
        for o in outcomes_from_episodes(resample_attempts(session, [j]), grades=g)
    ]
    sampled_ids = [j for j, demo in zip(ids, demos, strict=True) if not demo]
    notes += interactive_notes(
        interactive_attempts(session, sampled_ids), counted=[o for o in outcomes if o.interactive]
    )
    sampled_jobs = [job for job, demo in zip(jobs, demos, strict=True) if not demo]
    notes += setting_notes(sampled_jobs) + dense_protocol_notes(sampled_jobs)
    notes += grading_notes(every) + seed_notes(samples)
    table = build_table(outcomes, job_ids=ids, confidence=confidence, seed=seed, notes=notes, resamples=resamples)
    name_not_run(session, table)
    table.notes += not_run_notes(table)
    table.demonstrations = [
        demonstration(job, outcomes_from_episodes(e, grades=g))
        for job, e, g, demo in zip(jobs, episodes, grading, demos, strict=True)
        if demo
    ]
    replays, superseded = current_replays(session, ids, [e for per_job in agent for e in per_job])
    table.replay = summarize_replays(outcomes_from_rows(replays), confidence=confidence, seed=seed)
    table.notes += replay_notes(table.replay, superseded=superseded)
    table.action, table.action_by_distance = summarize_rows(replays, confidence=confidence, seed=seed)
    table.notes += demonstration_notes(table)
    return table
