"""Read-only data access for the dashboard: plain dataclasses out of the results database.

Every function takes a Session (the read-only one of :mod:`dashboard.readonly`) and returns objects that no
longer need it, so templates never touch the ORM (no lazy loads after the session closed, no writes). Bad
ids raise ``LookupError`` with the store's wording ("no job with id 'x'"), which the app turns into a 404.

Here: the jobs list, one job's page (its progress, episode grid, interactive attempts, method curves), compare
and the workers. One episode's page reads :mod:`dashboard.episode_queries`, its replays
:mod:`dashboard.replay_queries`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dashboard.list_queries import JOBS, BadListParameter, Listing, ListQuery, filtered_jobs
from db import episode_lists, job_rows, worker_rows
from db import store as db_store
from db.attempt_roles import apart_text
from db.job_status import JobSummary, summarize, summarize_jobs
from db.models import Episode, Turn, is_interactive, utcnow
from results.compare import compare_jobs
from results.compare_cell import cell_outcomes
from results.compare_table import CompareTable


@dataclass
class JobRow:
    id: str
    name: str | None
    status: str
    created_at: datetime
    total: int
    finished: int
    counts: dict[str, int]
    error: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    git_revision: str | None = None
    #: the attempts kept apart from the results (``db.attempt_roles``): role -> status -> attempts
    apart: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def apart_text(self) -> str:
        """``1 resample (1 resolved)``: the attempts kept apart, or "" (``db.attempt_roles.apart_text``)."""
        return apart_text(self.apart)

    @property
    def live(self) -> bool:
        """Whether the page should keep polling: the job may still change by itself."""
        return self.status in ("pending", "running")


@dataclass
class EpisodeRow:
    id: str
    task_id: str
    method: str
    scope: str
    protocol: str
    seed: int
    attempt: int
    status: str
    driver: str = "agent"  # db.models.AttemptDriver: who chose the attempt's actions
    # what the attempt cost (the episodes columns; None until it ran, or from before a column existed)
    n_turns: int | None = None
    prompt_tokens: int | None = None
    generated_tokens: int | None = None
    wall_s: float | None = None
    kv_peak_held_bytes: int | None = None  # the episode's KV peaks (nexus.memory)
    kv_peak_allocated_bytes: int | None = None

    @property
    def interactive(self) -> bool:
        return is_interactive(self.driver)


@dataclass
class CompareView:
    table: CompareTable
    # (scope, protocol, density, method, task) -> [(episode id, status, driver)] ordered by seed, as table.grid's
    links: dict[tuple[str, str, float | None, str, str], list[tuple[str, str, str]]]


@dataclass
class WorkerView:
    """One worker's last report (``db.models.WorkerRow``) and how long ago it came."""

    name: str
    queues: str
    state: str  # ok | paused | gone (db.models.WorkerState)
    since: datetime  # in this state since
    seen_ago_s: float
    detail: str | None

    @property
    def paused(self) -> bool:
        return self.state == "paused"

    @property
    def gone(self) -> bool:
        return self.state == "gone"


def _job_row(session: Session, job: Any, summary: JobSummary | None = None) -> JobRow:
    summary = summary or summarize(session, job)
    return JobRow(
        job.id, job.name, job.status, job.created_at, summary.total, summary.finished, summary.counts,
        job.error, job.config or {}, job.git_revision, summary.apart,
    )  # fmt: skip


def list_jobs(session: Session, *, limit: int = 100, query: ListQuery | None = None) -> Listing:
    """The first ``limit`` jobs of ``query`` (default: every job, newest first) with their progress."""
    query = query or JOBS.parse(None, None, {})
    jobs, total = filtered_jobs(session, query)
    summaries = summarize_jobs(session, jobs)
    matched = query.apply(_job_row(session, j, summaries[j.id]) for j in jobs)
    return Listing(matched[:limit], len(matched), total)


def recent_workers(session: Session, *, within_s: float, now: datetime | None = None) -> list[WorkerView]:
    """The workers that reported in the last ``within_s`` seconds, and those marked gone in the last hour
    (``db.worker_rows.recent_workers``), by name."""
    now = now or utcnow()
    rows = worker_rows.recent_workers(session, within_s=within_s, now=now, gone_within_s=worker_rows.GONE_LISTED_S)
    rows = sorted(rows, key=lambda r: r.name)
    return [
        WorkerView(r.name, r.queues, r.state, r.state_since, max(0.0, (now - r.seen_at).total_seconds()), r.detail)
        for r in rows
    ]


def job(session: Session, job_id: str) -> JobRow:
    """One job (id or unique prefix)."""
    return _job_row(session, job_rows.get_job(session, job_id))


def progress(session: Session, job_id: str) -> dict[str, Any]:
    """What live.js polls: ``{"job_id", "status", "total", "finished", "counts", "apart"}``: ``counts`` per status
    of each key's result attempt (the rule compare counts by, ``db.attempt_roles``), ``apart`` role -> status ->
    attempts kept apart from them (resamples, interactive and steered attempts)."""
    row = job(session, job_id)
    return {
        "job_id": row.id, "status": row.status, "total": row.total, "finished": row.finished, "counts": row.counts,
        "apart": row.apart,
    }  # fmt: skip


def episode_row(e: Any) -> EpisodeRow:
    """A grid row of any object with an episode's columns (an ORM row or a plain SELECT row)."""
    return EpisodeRow(
        e.id, e.task_id, e.method, e.scope, e.protocol, e.seed, e.attempt, e.status, e.driver,
        e.n_turns, e.prompt_tokens, e.generated_tokens, e.wall_s, e.kv_peak_held_bytes, e.kv_peak_allocated_bytes,
    )  # fmt: skip


@dataclass
class EpisodePage:
    """One page of a job's episode grid (``db.episode_lists``): its rows, how many pass the filters (``matched``) of
    how many result attempts (``total``), which page of how many, what each filter's dropdown offers, and how many
    result attempts have each status (what ``job_actions`` needs)."""

    rows: list[EpisodeRow]
    matched: int
    total: int
    page: int
    pages: int
    per_page: int
    options: dict[str, list[str]]
    result_statuses: dict[str, int]

    @property
    def first(self) -> int:
        """The 1-based position of the page's first row in the list (0 when the page is empty)."""
        return (self.page - 1) * self.per_page + 1 if self.rows else 0

    @property
    def last(self) -> int:
        return self.first + len(self.rows) - 1 if self.rows else 0


def job_episode_page(session: Session, job_id: str, query: ListQuery, *, page: int, per_page: int) -> EpisodePage:
    """Page ``page`` (1-based, ``per_page`` rows) of the result attempt of each of the job's episode keys (the first
    the agent drove alone that did not break), filtered and sorted by ``query``, all in SQL: three small queries
    however large the job. ``BadListParameter`` for a page past the last one."""
    facets = episode_lists.facets(session, job_id)
    matched = episode_lists.count(session, job_id, query.values) if query.filtered else facets.total
    pages = max(1, math.ceil(matched / per_page))
    if page > pages:
        raise BadListParameter(f"page {page} is past the last page of this list ({pages}); allowed: 1 to {pages}")
    rows = episode_lists.page(session, job_id, filters=query.values, sort=query.sort, order=query.order,
                              limit=per_page, offset=(page - 1) * per_page)  # fmt: skip
    return EpisodePage([episode_row(r) for r in rows], matched, facets.total, page, pages, per_page, facets.values,
                       facets.statuses)  # fmt: skip


def job_interactive(session: Session, job_id: str) -> list[EpisodeRow]:
    """The job's interactive attempts (``rerun --interactive``, steered or not): shown apart, never counted."""
    return [episode_row(e) for e in db_store.interactive_attempts(session, [job_id])]


def compare_view(session: Session, job_ids: Sequence[str], *, include_interactive: bool = False) -> CompareView:
    """``compare_jobs`` for one job or a sweep of several, plus the episode behind every status of the grid."""
    table = compare_jobs(session, job_ids, include_interactive=include_interactive)
    links: dict[tuple[str, str, float | None, str, str], list[tuple[str, str, str]]] = {}
    for key in table.grid:
        # the grid's dense column may reuse another cell's dense episodes: ask compare which ones it used
        per_task: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
        for o in sorted(cell_outcomes(table.outcomes, key), key=lambda o: o.seed):
            per_task[o.task_id].append((o.episode_id, o.status, o.driver))
        for task, items in per_task.items():
            links[(*key, task)] = items
    return CompareView(table, links)


def method_curves(
    session: Session, job_id: str, *, include_interactive: bool = False
) -> dict[tuple[str, str], dict[str, list[tuple[int, float, float]]]]:
    """Per (scope, protocol) and method, per turn: (turn, mean physical slots after eviction, mean eviction
    events), averaged over the job's result attempts that reached that turn (a turn without ``physical_after["mean"]``
    is left out of the slots' mean, NaN when none has it). One GROUP BY in SQL: no turn row comes to Python."""
    full_id = job_rows.get_job(session, job_id).id
    numbers = db_store.result_attempt_numbers([full_id], include_interactive=include_interactive)
    slots = Turn.physical_after["mean"].as_float()
    cell = (Episode.scope, Episode.protocol, Episode.method, Turn.index)
    query = (
        select(
            *cell, func.sum(slots), func.count(slots), func.sum(func.coalesce(Turn.eviction_events, 0)), func.count()
        )
        .select_from(Turn)
        .join(Episode, Episode.id == Turn.episode_id)
        .join(numbers, db_store.at_numbers(numbers))
        .group_by(*cell)
    )
    out: dict[tuple[str, str], dict[str, list[tuple[int, float, float]]]] = defaultdict(lambda: defaultdict(list))
    for scope, protocol, method, index, slot_sum, n_slots, events, n in sorted(session.execute(query)):
        mean_slots = float(slot_sum) / n_slots if n_slots else float("nan")
        out[(scope, protocol)][method].append((index, mean_slots, (events or 0) / n))
    return {k: dict(v) for k, v in out.items()}
