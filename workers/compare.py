"""``compare``: the paper's Table 3 from the result attempts of one or more jobs.

Layout: one row per (scope, protocol, density) cell, one column per method. Density is the eviction's configured
kept fraction (``episodes.config.eviction.density``); jobs run at several densities (a sweep: ``compare J1 J2
J3``) get one row per density, and dense, which keeps every token, sits in each of them (its cell's density
reads 1.0). What every number means, with the rules below: ``docs/numbers.md``. A cell reports

- its cost beside its quality (``Cell.cost``, :mod:`workers.cost`): kept fraction of the logical tokens,
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
of these is in ``n``.

Dense evicts nothing, so a job runs it in one cell only (see ``workers.spec``): a row without its own
dense episodes reuses the dense episodes of another cell, and the cell says ``reused_dense``.

When dense trajectories of the jobs were replayed (``nexus-eval replay``, ``workers.replay``), the table also
carries one :class:`workers.replay_stats.ReplayCell` per replayed (scope, protocol, method): mean delta-NLL vs
dense with a bootstrap interval over tasks, and top-1 agreement. Without replays nothing changes. Replays that
scored the spans of the agent's calls (``Replay.action``: text trajectories replayed with ``--model``) add the
action table (:mod:`workers.action_stats`: copy top-1 per task then over tasks, ΔNLL vs dense, tests vs dense and
SnapKV) and its split by how far back each copied source was.

Demonstrations are not samples: a job whose stored spec has a backend of :data:`DEMONSTRATION_BACKENDS` (``expert``:
a deterministic stand-in that applies the gold patch through the agent's tools) never puts an episode into a
Pass@1 cell, a paired test or the per-task grid. The table carries one :class:`Demonstration` line per such job
instead (``demonstrations (expert stand-in, not a Pass@1): 16/16 resolved``); its replays still make the replay and
action tables, which is what the demonstrations are for. The ``oracle`` backend (a test double, also a stand-in) is
kept as it was: the service's own tests and fixtures measure the table's arithmetic on oracle jobs.

Everything here is a pure function over :class:`Outcome` rows (testable without a database), except
:func:`compare_jobs`, the database entry point. ``workers.compare_render.render`` turns a table into text
(``table``, ``json``, ``csv``, ``markdown``).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from agent_runner.config import PROTOCOLS
from db.models import (
    ACTIVE_STATUSES,
    AGENT_EXIT_STATUSES,
    COUNTED_STATUSES,
    LIMIT_EXIT_STATUSES,
    RUN_FAILURE_STATUSES,
    AttemptDriver,
    EpisodeStatus,
    is_interactive,
)
from nexus.methods import DENSE, METHODS, SCOPES
from nexus.presets import stored_settings
from workers.action_render import ACTION_CAPTION, DISTANCE_CAPTION, ActionLayout, layout
from workers.action_stats import ActionCell, DistanceCell, summarize_rows
from workers.cost import CellCost, EpisodeCost, episode_costs, summarize_cost
from workers.replay_stats import ReplayCell, current_replays, outcomes_from_rows, replay_notes, summarize_replays
from workers.stats import (
    MIN_BOOTSTRAP_UNITS,
    bootstrap_mean_ci,
    mcnemar_paired,
    pass_at_k,
    sign_flip_test,
    wilson_interval,
)

#: backends whose episodes are demonstrations, not a model's samples: never in a Pass@1 cell (see the module doc)
DEMONSTRATION_BACKENDS = {"expert": "expert stand-in"}

#: the summary's text when no compared job holds a model's samples (only demonstrations, or no episode at all)
NO_SAMPLES = "No Pass@1 cell: none of the compared jobs has an agent episode (demonstrations are shown apart)."

#: the interval a table's cells get (:func:`interval_rule`), and what its caption says of it
WILSON = "wilson"
TASK_BOOTSTRAP = "bootstrap_tasks"


@dataclass(frozen=True)
class Outcome:
    """One attempt of one episode key, as far as compare is concerned: its result attempt, or a resample."""

    task_id: str
    method: str
    scope: str
    protocol: str
    seed: int
    status: str
    job_id: str = ""
    attempt: int = 1
    episode_id: str = ""  # the attempt's row (links from a rendered grid back to the episode)
    driver: str = AttemptDriver.agent.value  # who chose the attempt's actions (db.models.AttemptDriver)
    density: float | None = None  # the eviction's kept fraction; None for dense, which keeps everything
    cost: EpisodeCost | None = None  # what it stored of its cost (workers.cost)
    exit_status: str | None = None  # how the agent loop ended (a limit: the verdict judged a partial patch)
    grades: bool = True  # whether its job grades agent exits (JobSpec.grade); False: an exit is final, ungraded

    @property
    def key(self) -> tuple[str, str, str, str, float | None, int]:
        """What makes an outcome one sample of a cell across merged jobs: (task, method, scope, protocol, density,
        seed); a job's attempt number and id are not part of it."""
        return (self.task_id, self.method, self.scope, self.protocol, self.density, self.seed)

    @property
    def interactive(self) -> bool:
        return is_interactive(self.driver)

    @property
    def counted(self) -> bool:
        return self.status in COUNTED_STATUSES

    @property
    def resolved(self) -> bool:
        return self.status == EpisodeStatus.resolved

    @property
    def pending(self) -> bool:
        """Still running, or an agent exit whose grade is to come."""
        return self.status in ACTIVE_STATUSES or (self.status in AGENT_EXIT_STATUSES and self.grades)

    @property
    def ungraded(self) -> bool:
        """An agent exit of a job that does not grade: final, with no verdict."""
        return self.status in AGENT_EXIT_STATUSES and not self.grades

    @property
    def at_limit(self) -> bool:
        """A counted verdict on the patch the agent left when a limit stopped it."""
        return self.counted and self.exit_status in LIMIT_EXIT_STATUSES


@dataclass
class Cell:
    """One method in one scope x protocol row. ``rate``/``ci_*`` are fractions in [0, 1] (``None`` if n=0, and
    the interval ``None`` too when the cell has too few units for its ``ci_method``)."""

    method: str
    n: int = 0
    resolved: int = 0
    n_tasks: int = 0
    n_seeds: int = 0  # the most counted seeds of any task
    rate: float | None = None  # resolved / n (one seed) or Pass@1 (several): the mean over tasks either way
    ci_low: float | None = None
    ci_high: float | None = None
    ci_method: str | None = None  # "wilson" | "bootstrap_tasks": the table's rule (interval_rule)
    pass_at_k: dict[int, float] = field(default_factory=dict)
    p_value: float | None = None  # paired test vs dense; None for dense itself or without pairs
    test: str | None = None  # "mcnemar_exact" | "mcnemar_chi2_cc" | "sign_flip_exact" | "sign_flip_mc"
    b: int = 0  # pairs only this method resolved
    c: int = 0  # pairs only dense resolved
    n_pairs: int = 0  # (task, seed) pairs with a counted outcome on both sides
    pair_tasks: int = 0  # tasks with at least one pair: the units of the sign-flip test
    unpaired: int = 0  # counted outcomes with no dense counterpart (left out of the test)
    pending: int = 0
    ungraded: int = 0  # agent exits of a job that does not grade (never pending: no grade will come)
    cancelled: int = 0
    failures: int = 0  # timeout + infra_failure (inside n)
    at_limit: int = 0  # counted verdicts graded on the patch left at a step/context/time/format-error limit
    resamples: int = 0  # agent attempts after a key's result (new samples of it): never in n
    best_of_n: float | None = None  # with resamples: share of counted keys resolved by any of their attempts
    best_of_attempts: int = 0  # the n of best_of_n: the most counted attempts of any key
    reused_dense: bool = False
    interactive: int = 0  # counted outcomes from interactive attempts (only with include_interactive)
    density: float | None = None  # the row's density; 1.0 for dense (keeps every token)
    cost: CellCost = field(default_factory=CellCost)

    @property
    def too_few_for_interval(self) -> bool:
        """Counted outcomes, but fewer units than the cell's interval needs: no interval is printed."""
        return self.n > 0 and self.ci_low is None


@dataclass
class Demonstration:
    """A job of a stand-in backend (:data:`DEMONSTRATION_BACKENDS`), summarized apart from every Pass@1 cell: its
    result attempts' verdicts (``n`` counted as in a cell: verdicts and run failures), never a rate with an
    interval, since a deterministic stand-in is not a sample of anything."""

    job_id: str
    backend: str
    methods: list[str]
    n: int = 0
    resolved: int = 0
    failures: int = 0  # timeout + infra_failure (inside n)
    pending: int = 0
    ungraded: int = 0
    cancelled: int = 0

    @property
    def text(self) -> str:
        label = DEMONSTRATION_BACKENDS.get(self.backend, self.backend)
        apart = (
            (self.failures, "run failure(s), in n"),
            (self.pending, "pending"),
            (self.ungraded, "ungraded"),
            (self.cancelled, "cancelled"),
        )
        parts = [f"{self.resolved}/{self.n} resolved"] + [f"{n} {what}" for n, what in apart if n]
        methods = ", ".join(self.methods) or "no episodes"
        return f"demonstrations ({label}, not a Pass@1): job {self.job_id} ({methods}): " + ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "text": self.text}


def demonstration(job: Any, outcomes: Sequence[Outcome]) -> Demonstration:
    """The demonstrations line of ``job`` from its result attempts' outcomes."""
    counted = [o for o in outcomes if o.counted]
    return Demonstration(
        job_id=job.id,
        backend=(job.config or {}).get("backend", ""),
        methods=_order((o.method for o in outcomes), METHODS),
        n=len(counted),
        resolved=sum(o.resolved for o in counted),
        failures=sum(o.status in RUN_FAILURE_STATUSES for o in counted),
        pending=sum(o.pending for o in outcomes),
        ungraded=sum(o.ungraded for o in outcomes),
        cancelled=sum(o.status == EpisodeStatus.cancelled for o in outcomes),
    )


def is_demonstration(job: Any) -> bool:
    """Whether ``job`` (a ``db.models.Job``) ran a stand-in backend whose episodes are demonstrations."""
    return (job.config or {}).get("backend") in DEMONSTRATION_BACKENDS


#: a cell of the per-task grid: (scope, protocol, density, method); density None for dense
GridKey = tuple[str, str, float | None, str]


@dataclass
class Row:
    scope: str
    protocol: str
    cells: dict[str, Cell]
    density: float | None = None  # None: a row of dense alone (no evicting method ran in this cell)

    @property
    def label(self) -> str:
        return f"{self.scope} / {self.protocol}" + ("" if self.density is None else f" / density {self.density:g}")


@dataclass
class CompareTable:
    """The whole comparison. ``grid[(scope, protocol, density, method)][task_id]`` = statuses ordered by seed."""

    job_ids: list[str]
    methods: list[str]
    rows: list[Row]
    tasks: list[str]
    grid: dict[GridKey, dict[str, list[str]]]
    notes: list[str] = field(default_factory=list)
    # same shape as grid (build_table fills both): the driver of each status's attempt
    drivers: dict[GridKey, dict[str, list[str]]] = field(default_factory=dict)
    replay: list[ReplayCell] = field(default_factory=list)  # counterfactual replays, when any were stored
    # replays that scored the calls' spans (workers.action_stats): the action table and its split by distance
    action: list[ActionCell] = field(default_factory=list)
    action_by_distance: list[DistanceCell] = field(default_factory=list)
    demonstrations: list[Demonstration] = field(default_factory=list)  # stand-in jobs: never in a Pass@1 cell
    interval: str = WILSON  # the interval every cell uses (interval_rule)
    # the outcomes the table was built from (not serialized): which episode is behind each grid status
    outcomes: list[Outcome] = field(default_factory=list, repr=False)

    @property
    def caption(self) -> str:
        """What the summary's numbers are, with the rules this table used (printed under it)."""
        return table_caption(self.interval)

    @property
    def no_samples(self) -> str:
        """What the summary says instead of a table when no compared job has an agent episode ('' when one has)."""
        return "" if self.rows else NO_SAMPLES

    @property
    def action_layout(self) -> ActionLayout | None:
        """How every renderer lays out the action table (``None`` without one)."""
        return layout(self.action, self.action_by_distance) if self.action else None

    @property
    def panels(self) -> list[tuple[str, str]]:
        """The (scope, protocol) pairs of the rows, in row order, each once (a sweep has a row per density)."""
        return list(dict.fromkeys((r.scope, r.protocol) for r in self.rows))

    @property
    def densities(self) -> list[float]:
        """The densities the table's rows span (one for a single job; several for a sweep)."""
        return sorted({r.density for r in self.rows if r.density is not None})

    def seeds(self, key: GridKey, task: str) -> list[tuple[str, str]]:
        """(status, driver) of each seed of ``task`` in the grid cell ``key`` (scope, protocol, density, method)."""
        return list(zip(self.grid[key].get(task, []), self.drivers[key].get(task, []), strict=True))

    def to_dict(self) -> dict[str, Any]:
        out = {
            "job_ids": self.job_ids,
            "methods": self.methods,
            "rows": [
                {
                    "scope": r.scope,
                    "protocol": r.protocol,
                    "density": r.density,
                    "cells": {m: asdict(c) for m, c in r.cells.items()},
                }
                for r in self.rows
            ],
            "grid": [
                {
                    "task_id": t,
                    "cells": [
                        {
                            "scope": s,
                            "protocol": p,
                            "density": d,
                            "method": m,
                            "statuses": by_task.get(t, []),
                            "drivers": self.drivers[(s, p, d, m)].get(t, []),
                        }
                        for (s, p, d, m), by_task in self.grid.items()
                    ],
                }
                for t in self.tasks
            ],
            "notes": self.notes,
            "interval": self.interval,
            "caption": self.caption,
        }
        if self.replay:  # absent without replays: the table of a job never replayed stays as it was
            out["replay"] = [asdict(c) for c in self.replay]
        if self.action:  # absent without span-scored replays (docs/numbers.md, "The action table")
            out["action"] = [c.to_dict() for c in self.action]
            out["action_by_distance"] = [d.to_dict() for d in self.action_by_distance]
            out["action_caption"] = ACTION_CAPTION
            out["action_distance_caption"] = DISTANCE_CAPTION
        if self.demonstrations:
            out["demonstrations"] = [d.to_dict() for d in self.demonstrations]
        return out


def natural_key(text: str) -> list[Any]:
    """Sort key that puts ``t2`` before ``t10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _order(values: Iterable[str], canonical: Sequence[str]) -> list[str]:
    present = set(values)
    return [v for v in canonical if v in present] + sorted(present - set(canonical))


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


def _dense_for(outcomes: list[Outcome], scope: str, protocol: str) -> tuple[list[Outcome], bool]:
    """Dense outcomes for a row: its own, else those of another cell (one per task and seed)."""
    dense = [o for o in outcomes if o.method == DENSE]
    own = [o for o in dense if (o.scope, o.protocol) == (scope, protocol)]
    if own or not dense:
        return own, False
    chosen: dict[tuple[str, int], Outcome] = {}
    cell_rank = {c: i for i, c in enumerate((s, p) for s in SCOPES for p in PROTOCOLS)}
    for o in sorted(dense, key=lambda o: cell_rank.get((o.scope, o.protocol), len(cell_rank))):
        chosen.setdefault((o.task_id, o.seed), o)
    return list(chosen.values()), True


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


def table_caption(interval: str) -> str:
    """The caption of a compare table whose cells use ``interval``."""
    if interval == WILSON:
        rule = "one seed per task: resolved / n with a Wilson 95% interval over episodes; p: McNemar vs dense"
    else:
        rule = (
            f"several seeds per task: Pass@1 = mean over tasks of resolved / counted seeds, 95% bootstrap over tasks "
            f"(seeds resampled with their task; from {MIN_BOOTSTRAP_UNITS} tasks, else 'too few for an interval'); "
            "p: sign-flip test over tasks vs dense"
        )
    return (
        f"{rule}, with its pairs (and tasks) beside it. Each key counts its first attempt that did not break; "
        "later attempts are resamples, shown apart as best of n. What each number means: docs/numbers.md"
    )


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
    methods = _order((o.method for o in rows_in), METHODS)
    evicting = [o for o in rows_in if o.method != DENSE]
    cells_present = {(o.scope, o.protocol) for o in evicting} or {(o.scope, o.protocol) for o in rows_in}
    rows: list[Row] = []
    grid: dict[GridKey, dict[str, list[str]]] = {}
    drivers: dict[GridKey, dict[str, list[str]]] = {}
    for scope in _order((s for s, _ in cells_present), SCOPES):
        for protocol in _order((p for s, p in cells_present if s == scope), PROTOCOLS):
            dense, reused = _dense_for(rows_in, scope, protocol)
            here = {o.density for o in evicting if (o.scope, o.protocol) == (scope, protocol)}
            for density in sorted(here) or [None]:  # type: ignore[type-var]  # None only without evicting methods
                cells = {}
                for method in methods:
                    key = (scope, protocol, None if method == DENSE else density, method)
                    mine = dense if method == DENSE else cell_outcomes(rows_in, key)
                    keys = {o.key for o in mine}
                    extra = [o for o in later if o.key in keys]
                    cell = summarize_cell(
                        method,
                        mine,
                        dense if dense else None,
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
    if any(c.reused_dense for r in rows for c in r.cells.values()):
        table.notes.append("dense ran in one scope/protocol cell and is reused for the other rows (it evicts nothing)")
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


def outcome_density(method: str, config: dict[str, Any] | None) -> float | None:
    """The density an episode ran at, from its stored config; ``None`` for dense (it keeps everything)."""
    if method == DENSE:
        return None
    density = ((config or {}).get("eviction") or {}).get("density")
    return None if density is None else float(density)


def outcomes_from_episodes(
    episodes: Iterable[Any], costs: dict[str, EpisodeCost] | None = None, *, grades: bool = True
) -> list[Outcome]:
    """``db.models.Episode`` rows (or anything with the same attributes) -> outcomes; ``costs`` by episode id
    (:func:`workers.cost.episode_costs`), when the table should carry them; ``grades``: whether their job grades."""
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
            density=outcome_density(e.method, e.config),
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
    from db.job_status import job_grades
    from db.store import get_job, interactive_attempts, resample_attempts, result_attempts

    jobs = [get_job(session, j) for j in job_ids]
    ids = [job.id for job in jobs]
    agent = [result_attempts(session, [j]) for j in ids]  # also what replays are sources of
    episodes = [result_attempts(session, [j], include_interactive=True) for j in ids] if include_interactive else agent
    every = [e for per_job in episodes for e in per_job]
    grading = [job_grades(job) for job in jobs]
    demos = [is_demonstration(job) for job in jobs]  # stand-ins: a demonstrations line each, never a Pass@1 cell
    samples = [e for per_job, demo in zip(episodes, demos, strict=True) if not demo for e in per_job]
    costs = episode_costs(session, samples)
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
    notes += setting_notes([job for job, demo in zip(jobs, demos, strict=True) if not demo])
    notes += grading_notes(every) + seed_notes(samples)
    table = build_table(outcomes, job_ids=ids, confidence=confidence, seed=seed, notes=notes, resamples=resamples)
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


def demonstration_notes(table: CompareTable) -> list[str]:
    """What the table did with stand-in jobs, and with replays scored on several models."""
    notes = []
    if table.demonstrations:
        named = ", ".join(d.job_id for d in table.demonstrations)
        notes.append(
            f"job(s) {named} ran a stand-in backend ({', '.join(sorted(DEMONSTRATION_BACKENDS))}): demonstrations, "
            "not a model's samples, so none of their episodes is in a Pass@1 cell, a paired test or the per-task "
            "grid; their replays are in the replay and action tables"
        )
    models = {c.model for c in table.replay}
    if len(models) > 1:
        shown = ", ".join(m or "the source's own stream" for m in sorted(models, key=lambda m: m or ""))
        notes.append(f"replays were scored on several models ({shown}): each model's cells are apart")
    return notes


def interactive_notes(interactive: Sequence[Any], *, counted: Sequence[Outcome]) -> list[str]:
    """What the table did with the jobs' interactive attempts (``interactive``: their rows; ``counted``: the
    outcomes of them the table counts, empty unless ``include_interactive``)."""
    if not interactive:
        return []
    steered = sum(e.driver == AttemptDriver.steered for e in interactive)
    if not counted:
        return [
            f"{len(interactive)} interactive attempt(s) ({steered} steered by an operator) are kept apart: each "
            "key's result is the agent's own attempt; `--include-interactive` counts them (marked *)"
        ]
    steered_counted = sum(o.driver == AttemptDriver.steered for o in counted)
    return [
        f"{len(counted)} result(s) (marked *) come from interactive attempts ({steered_counted} steered by an "
        "operator), counted in place of the agent's own: a person chose to run them, so they are not the "
        "method's samples"
    ]


def grading_notes(episodes: Sequence[Any]) -> list[str]:
    """Which tools graded the table, and the verdicts on tasks that needed a network grading did not have."""
    graders = sorted({f"{e.grader} ({e.grader_version})" for e in episodes if e.grader})
    notes = [f"graded by {', '.join(graders)}"] if graders else []
    offline = sorted(
        {
            e.task_id
            for e in episodes
            if ((e.result or {}).get("grade") or {}).get("needs_network") and e.status != "resolved"
        }
    )
    if offline:
        notes.append(
            f"{len(offline)} task(s) need the network and were graded without it; their unresolved verdicts may "
            f"not be the agent's: {', '.join(offline[:10])}{' ...' if len(offline) > 10 else ''}"
        )
    return notes


def seed_notes(episodes: Sequence[Any]) -> list[str]:
    """A warning for episodes stored before the episode's seed reached its sampler: their config's ``agent.seed``
    (always 0) is what sampled, whatever their ``seed``, so their seeds are copies, not independent samples."""
    stale = [
        e
        for e in episodes
        if (e.config or {}).get("backend", "hf") not in ("oracle", *DEMONSTRATION_BACKENDS)
        and "seed" in ((e.config or {}).get("agent") or {})
        and e.config["agent"]["seed"] != e.config.get("seed", e.seed)
    ]
    if not stale:
        return []
    return [
        f"{len(stale)} episode(s) were sampled with seed {stale[0].config['agent']['seed']} whatever their seed "
        "(stored before each seed sampled apart): across seeds they are copies, not independent samples, so "
        "Pass@1 over seeds, pass@k and McNemar pairs overstate the evidence; `nexus-eval rerun` them"
    ]


#: Job settings that change what a column means; merged jobs that differ in them get a warning note. Density is
#: not one of them: cells are aligned by it (a row per density), so a sweep's jobs differ in it by design.
COMPARED_SETTINGS = ("model", "backend", "limits", "sampling", "eviction", "preset")
ALIGNED_SETTINGS = frozenset({"density"})


def setting_notes(jobs: Sequence[Any]) -> list[str]:
    """Warnings for merged jobs whose configs differ in a setting that changes results (the columns are
    keyed by method alone, and rows by scope, protocol and density only). A method's own settings
    (``method_params``, resolved from the job's preset) are compared per method, value by value, among the
    jobs that ran that method."""
    notes = []
    for key in COMPARED_SETTINGS:
        notes += _differences(key, {job.id: (job.config or {}).get(key) for job in jobs})
    per_method: dict[str, dict[str, dict[str, Any]]] = {}
    shared: dict[str, dict[str, Any]] = {}  # job -> its eviction block (what a method without an override uses)
    for job in jobs:
        shared[job.id] = (job.config or {}).get("eviction") or {}
        for method, settings in ((job.config or {}).get("method_params") or {}).items():
            per_method.setdefault(method, {})[job.id] = stored_settings(method, settings or {})
    for method, by_job in per_method.items():
        if len(by_job) < 2:
            continue
        for name in sorted({name for settings in by_job.values() for name in settings} - ALIGNED_SETTINGS):
            values = {j: settings.get(name, shared[j].get(name)) for j, settings in by_job.items()}
            notes += _differences(f"method_params.{method}.{name}", values)
    return notes


def _differences(label: str, values: dict[str, Any]) -> list[str]:
    """One note naming each job's value of ``label``, when the jobs do not all agree (else none)."""
    shown = {job: json.dumps(value, sort_keys=True) for job, value in values.items()}
    if len(set(shown.values())) < 2:
        return []
    return [f"jobs differ in {label}: " + ", ".join(f"{j}={v}" for j, v in shown.items())]
