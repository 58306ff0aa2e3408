"""``compare``: the paper's Table 3 from the result attempts of one or more jobs.

Layout: one row per (scope, protocol, density) cell, one column per method. Density is the eviction's configured
kept fraction (``episodes.config.eviction.density``); jobs run at several densities (a sweep: ``compare J1 J2
J3``) get one row per density, and dense, which keeps every token, sits in each of them (its cell's density
reads 1.0). What every number means: ``docs/numbers.md``; how a cell counts its episodes, reuses dense and
computes its rate, interval and paired test: :mod:`results.compare_cell`.

Which attempt counts (``db.store.result_attempts``): each key's *first* agent attempt that did not break (a
timeout, infra_failure or cancelled attempt is replaced by the key's next one). A later agent attempt of a key
that already has its sample is a *resample*: never in Pass@1, the rate, pass@k or the test; a cell with resamples
shows them apart as "best of n" (``Cell.best_of_n``: keys resolved by any of their attempts). Interactive reruns,
steered or not, are kept apart and named in a note unless ``include_interactive``, which lets a key's newest
interactive attempt stand in for its result and marks it (``Cell.interactive``, ``CompareTable.drivers``).

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
from nexus.methods import DENSE, METHODS, SCOPES
from results.action_stats import summarize_rows
from results.compare_cell import cell_outcomes, dense_borrowed, dense_for_row, interval_rule, summarize_cell
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
from results.cost import EpisodeCost, episode_cost
from results.replay_stats import current_replays, outcomes_from_rows, replay_notes, summarize_replays


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
            dense, reused, _ = dense_for_row(rows_in, scope, protocol)
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
