"""The compare table's values: an :class:`Outcome` per counted attempt, a :class:`Cell` per (row, method), the
:class:`CompareTable` with its rows, captions and notes, and a :class:`Demonstration` line per stand-in job.

What every field means and how a cell is computed: :mod:`results.compare_cell` and ``docs/numbers.md``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from db.models import (
    ACTIVE_STATUSES,
    AGENT_EXIT_STATUSES,
    COUNTED_STATUSES,
    LIMIT_EXIT_STATUSES,
    RUN_FAILURE_STATUSES,
    SERVICE_FAILURE_STATUSES,
    AttemptDriver,
    EpisodeStatus,
    is_interactive,
)
from nexus.methods import DENSE, METHODS
from results.action_render import ActionLayout, layout
from results.action_stats import ActionCell, DistanceCell
from results.cost import CellCost, EpisodeCost
from results.replay_stats import ReplayCell, replay_caption
from results.stats import MIN_BOOTSTRAP_UNITS

#: backends whose episodes are demonstrations, not a model's samples: never in a Pass@1 cell (see the module doc)
DEMONSTRATION_BACKENDS = {"expert": "expert stand-in"}

#: the summary's text when no compared job holds a model's samples (only demonstrations, or no episode at all)
NO_SAMPLES = "No Pass@1 cell: none of the compared jobs has an agent episode (demonstrations are shown apart)."

#: the interval a table's cells get (:func:`results.compare_cell.interval_rule`), and what its caption says of it
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
    cost: EpisodeCost | None = None  # what it stored of its cost (results.cost)
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
    # every episode broke (timeout, infra_failure, cancelled): nothing was measured, so n is 0 and there is no
    # rate, interval or test; the first episode's cause, one line (:func:`not_run_reason`); None otherwise
    not_run: str | None = None

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
        methods=in_canonical_order((o.method for o in outcomes), METHODS),
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
    # replays that scored the calls' spans (results.action_stats): the action table and its split by distance
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
            out["replay_caption"] = replay_caption(self.replay)  # with the model(s) and dtype(s) measured on
        action = self.action_layout
        if action is not None:  # absent without span-scored replays (docs/numbers.md, "The action table")
            out["action"] = [c.to_dict() for c in self.action]
            out["action_by_distance"] = [d.to_dict() for d in self.action_by_distance]
            out["action_caption"] = action.caption
            out["action_distance_caption"] = action.distance_caption
        if self.demonstrations:
            out["demonstrations"] = [d.to_dict() for d in self.demonstrations]
        return out


#: the longest "not run" reason a cell carries (the first line of the first episode's error, shortened)
NOT_RUN_CHARS = 120


def broke_all(outcomes: Sequence[Outcome]) -> bool:
    """Whether every one of ``outcomes`` (there is one at least) is a broken run (``SERVICE_FAILURE_STATUSES``):
    a cell of them measured nothing, and shows "not run" instead of a rate (docs/numbers.md)."""
    return bool(outcomes) and all(o.status in SERVICE_FAILURE_STATUSES for o in outcomes)


def first_outcome(outcomes: Sequence[Outcome]) -> Outcome:
    """The first of ``outcomes`` in the grid's order (task, then seed): whose cause a "not run" cell names."""
    return min(outcomes, key=lambda o: (natural_key(o.task_id), o.seed))


def not_run_reason(status: str, error: str | None) -> str:
    """A "not run" cell's reason: the first non-blank line of the episode's stored ``error``, shortened to
    :data:`NOT_RUN_CHARS`; its ``status`` when it stored none."""
    line = next((part.strip() for part in (error or "").splitlines() if part.strip()), "")
    if not line:
        return status
    return line if len(line) <= NOT_RUN_CHARS else line[: NOT_RUN_CHARS - 1].rstrip() + "…"


def natural_key(text: str) -> list[Any]:
    """Sort key that puts ``t2`` before ``t10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def in_canonical_order(values: Iterable[str], canonical: Sequence[str]) -> list[str]:
    present = set(values)
    return [v for v in canonical if v in present] + sorted(present - set(canonical))


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


def grid_key(row: Row, method: str) -> GridKey:
    """The grid cell behind ``row``'s ``method`` column (dense is keyed without a density)."""
    return (row.scope, row.protocol, None if method == DENSE else row.density, method)
