"""Read-only data access for the dashboard: plain dataclasses out of the results database.

Every function takes a Session (the read-only one of :mod:`dashboard.readonly`) and returns objects that no
longer need it, so templates never touch the ORM (no lazy loads after the session closed, no writes). Bad
ids raise ``LookupError`` with the store's wording ("no job with id 'x'"), which the app turns into a 404.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import LargeBinary, func, select, type_coerce
from sqlalchemy.orm import Session, defer

from dashboard.list_queries import JOBS, BadListParameter, Listing, ListQuery, filtered_jobs
from db import episode_lists, liveness
from db import store as db_store
from db.attempt_roles import apart_text
from db.job_status import JobSummary, summarize, summarize_jobs
from db.models import Episode, Replay, Turn, is_interactive, utcnow
from db.packing import packed_keep
from grading.hostlog import unpack
from nexus.methods import DENSE, METHODS
from results.compare import cell_outcomes, compare_jobs
from results.compare_table import CompareTable
from results.turn_data import TurnExtra

SHORT_TURN_CHARS = 1500  # a turn whose texts are shorter than this is shown open
MAX_SHOWN_CHARS = 20_000  # one observation / thought on the page; `nexus-eval inspect --json` has it whole
MAX_LOG_CHARS = 200_000  # the grading log's tail (the test results are at its end)


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
class TurnView:
    index: int
    action: dict[str, Any] | None
    action_name: str
    action_json: str
    format_error: bool
    thought: str
    observation: str
    completion: str
    intervened: bool
    tokens_appended: int
    tokens_generated: int
    logical_length: int
    physical_before: dict[str, float] | None
    physical_after: dict[str, float] | None
    eviction_events: int
    kv_held_bytes: int | None  # KV memory (nexus.memory): after the turn, and the largest during it
    kv_allocated_bytes: int | None
    kv_peak_held_bytes: int | None
    kv_peak_allocated_bytes: int | None
    prefill_s: float
    decode_s: float
    tokens_per_s: float | None
    prompt_tokens: int = 0  # the prompt this call conditioned on (logical)
    keep: int | None = None  # Turn.tokens["keep"]: the previous stream's tokens this turn's context starts with
    # the assistant text as generated (Turn.completion), its first MAX_SHOWN_CHARS (a replay's spans index it)
    text: str = ""
    text_cut: int = 0  # characters left off its end
    forced: bool = False  # teacher-forced from a stored attempt's turn (``rerun --from-turn``)
    # what the operator did at this turn of an interactive rerun (``agent_runner.records.OperatorAct``), else None
    operator: Any = None
    proposed_json: str = ""  # the model's own action when the operator replaced or skipped it

    @property
    def skipped(self) -> bool:
        return self.operator is not None and self.operator.choice == "skip"

    @property
    def is_short(self) -> bool:
        return len(self.thought) + len(self.observation) + len(self.action_json) <= SHORT_TURN_CHARS

    @property
    def divergence_key(self) -> tuple[bool, str]:
        """What two trajectories must share at a turn to count as not yet diverged: the parsed call (name and
        arguments) and whether the completion was a format error."""
        return self.format_error, json.dumps(self.action, sort_keys=True)


@dataclass
class EpisodeView:
    row: EpisodeRow
    job_id: str
    exit_status: str | None
    error: str | None
    n_turns: int | None
    generated_tokens: int | None
    kv_peak_held_bytes: int | None
    kv_peak_allocated_bytes: int | None
    agent_s: float | None
    patch: str | None
    test_log: str
    test_log_cut: int  # characters left off the front of the shown log
    grader: str | None
    grader_version: str | None
    retention: dict[str, Any] | None
    turns: list[TurnView]
    siblings: list[EpisodeRow]


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
    state: str  # ok | paused (db.models.WorkerState)
    since: datetime  # in this state since
    seen_ago_s: float
    detail: str | None

    @property
    def paused(self) -> bool:
        return self.state == "paused"


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
    """The workers that reported in the last ``within_s`` seconds (``db.liveness.recent_workers``), by name."""
    now = now or utcnow()
    rows = sorted(liveness.recent_workers(session, within_s=within_s, now=now), key=lambda r: r.name)
    return [
        WorkerView(r.name, r.queues, r.state, r.state_since, max(0.0, (now - r.seen_at).total_seconds()), r.detail)
        for r in rows
    ]


def job(session: Session, job_id: str) -> JobRow:
    """One job (id or unique prefix)."""
    return _job_row(session, db_store.get_job(session, job_id))


def progress(session: Session, job_id: str) -> dict[str, Any]:
    """What live.js polls: ``{"job_id", "status", "total", "finished", "counts", "apart"}``: ``counts`` per status
    of each key's result attempt (the rule compare counts by, ``db.attempt_roles``), ``apart`` role -> status ->
    attempts kept apart from them (resamples, interactive and steered attempts)."""
    row = job(session, job_id)
    return {
        "job_id": row.id, "status": row.status, "total": row.total, "finished": row.finished, "counts": row.counts,
        "apart": row.apart,
    }  # fmt: skip


def _episode_row(e: Any) -> EpisodeRow:
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
    return EpisodePage([_episode_row(r) for r in rows], matched, facets.total, page, pages, per_page, facets.values,
                       facets.statuses)  # fmt: skip


def job_interactive(session: Session, job_id: str) -> list[EpisodeRow]:
    """The job's interactive attempts (``rerun --interactive``, steered or not): shown apart, never counted."""
    return [_episode_row(e) for e in db_store.interactive_attempts(session, [job_id])]


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


def _clip(text: str | None) -> str:
    text = text or ""
    if len(text) <= MAX_SHOWN_CHARS:
        return text
    return text[:MAX_SHOWN_CHARS] + f"\n… ({len(text) - MAX_SHOWN_CHARS} more characters: nexus-eval inspect --json)"


def _proposed_json(extra: TurnExtra) -> str:
    """The model's own action of a turn whose action the operator replaced or skipped, as the page shows it."""
    proposed = extra.operator.proposed if extra.operator is not None else None
    return json.dumps(proposed.model_dump(mode="json"), indent=2, ensure_ascii=False) if proposed is not None else ""


def _turn_view(t: Turn, keep: int | None = None) -> TurnView:
    extra = TurnExtra.of_row(t)
    action = t.action
    return TurnView(
        index=t.index,
        action=action,
        action_name=(action or {}).get("name") or "(no call)",
        action_json=json.dumps(action, indent=2, ensure_ascii=False) if action is not None else "",
        format_error=extra.format_error_or(action),
        thought=_clip(t.thought),
        observation=_clip(t.observation),
        completion=_clip(t.completion) if action is None or extra.replaced else "",
        intervened=extra.replaced,
        tokens_appended=t.tokens_appended or 0,
        tokens_generated=t.tokens_generated or 0,
        logical_length=t.logical_length or 0,
        physical_before=t.physical_before,
        physical_after=t.physical_after,
        eviction_events=t.eviction_events or 0,
        kv_held_bytes=t.kv_held_bytes,
        kv_allocated_bytes=t.kv_allocated_bytes,
        kv_peak_held_bytes=t.kv_peak_held_bytes,
        kv_peak_allocated_bytes=t.kv_peak_allocated_bytes,
        prefill_s=t.prefill_s or 0.0,
        decode_s=t.decode_s or 0.0,
        tokens_per_s=t.tokens_per_s,
        prompt_tokens=t.prompt_tokens or 0,
        keep=keep,
        text=(t.completion or "")[:MAX_SHOWN_CHARS],
        text_cut=max(0, len(t.completion or "") - MAX_SHOWN_CHARS),
        forced=extra.forced,
        operator=extra.operator,
        proposed_json=_proposed_json(extra),
    )


def siblings(session: Session, e: Episode) -> list[EpisodeRow]:
    """The result attempts (the first the agent drove alone that did not break) of the same job, task and seed under
    the other methods / scopes / protocols."""
    rows = session.execute(
        select(*episode_lists.ROW_COLUMNS, Episode.episode_key).where(
            Episode.job_id == e.job_id, Episode.task_id == e.task_id, Episode.seed == e.seed
        )
    )
    newest: dict[str, Any] = {}
    for r in rows:
        if r.episode_key == e.episode_key or is_interactive(r.driver):
            continue
        if r.episode_key not in newest or r.attempt > newest[r.episode_key].attempt:
            newest[r.episode_key] = r
    return [_episode_row(r) for _, r in sorted(newest.items())]


def episode(session: Session, episode_id: str) -> EpisodeView:
    """One episode (id or unique prefix) with its turns, patch, grading log and siblings."""
    e = db_store.get_episode(session, episode_id)
    # not the token streams (Turn.tokens, the largest column): the page shows text and telemetry only
    turns = session.execute(
        select(Turn).where(Turn.episode_id == e.id).order_by(Turn.index).options(defer(Turn.tokens))
    ).scalars()
    # ... but where each turn's new tokens start in the stream (the retention map's turn marks): one number each
    keep = select(Turn.index, type_coerce(Turn.tokens, LargeBinary)).where(Turn.episode_id == e.id)
    keeps: dict[int, int | None] = {index: packed_keep(stored) for index, stored in session.execute(keep)}
    log = unpack(e.test_log)
    cut = max(0, len(log) - MAX_LOG_CHARS)
    return EpisodeView(
        row=_episode_row(e),
        job_id=e.job_id,
        exit_status=e.exit_status,
        error=e.error,
        n_turns=e.n_turns,
        generated_tokens=e.generated_tokens,
        kv_peak_held_bytes=e.kv_peak_held_bytes,
        kv_peak_allocated_bytes=e.kv_peak_allocated_bytes,
        agent_s=e.agent_s,
        patch=e.patch,
        test_log=log[cut:],
        test_log_cut=cut,
        grader=e.grader,
        grader_version=e.grader_version,
        retention=getattr(e, "retention", None),  # episodes.retention (migration 0003); None before it
        turns=[_turn_view(t, keeps.get(t.index)) for t in turns],
        siblings=siblings(session, e),
    )


@dataclass
class ReplayOption:
    """One replay row of an episode (``db.models.Replay``), without its per-turn scores."""

    id: int
    method: str
    scope: str
    protocol: str
    density: float | None  # the eviction's kept fraction; None for dense
    model: str | None  # a text trajectory's replay: the model it was scored on
    status: str
    error: str | None
    chunked: bool
    tokens: int | None
    nll_mean: float | None
    top1: float | None
    action: dict[str, Any] | None  # its ActionSummary dump (agent_runner.action_scores); None before spans
    created_at: datetime

    @property
    def label(self) -> str:
        density = "" if self.density is None else f" · density {self.density:g}"
        model = "" if self.model is None else f" · {self.model}"
        return f"{self.method} · {self.scope} / {self.protocol}{density}{model}"

    @property
    def spans(self) -> int | None:
        """How many spans it scored (its action summary's counts), None without an action summary."""
        counts = (self.action or {}).get("spans")
        if not isinstance(counts, dict):
            return None
        return sum(n for n in counts.values() if isinstance(n, int))


@dataclass
class ReplaySection:
    """An episode's replays (``options``, in :func:`replay_order`) and the one shown: ``chosen`` (None when the
    episode has no replay) with ``spans``: turn index -> the stored SpanScore dumps of the turns that have a list
    of them (empty for a token-stream replay or a row from before spans were kept)."""

    options: list[ReplayOption]
    chosen: ReplayOption | None = None
    spans: dict[int, list[Any]] = field(default_factory=dict)


def replay_order(o: ReplayOption) -> tuple:
    """Replays listed by model, scope, protocol, density (dense first), then the methods' canonical order."""
    rank = METHODS.index(o.method) if o.method in METHODS else len(METHODS)
    return (o.model or "", o.scope, o.protocol, -1.0 if o.density is None else o.density, rank, o.method, o.id)


def default_replay(options: Sequence[ReplayOption]) -> ReplayOption | None:
    """The replay the page shows unless ``?replay=`` says otherwise: the first ok one of an evicting method (the
    first ok one when only dense's are, else the first)."""
    ok = [o for o in options if o.status == "ok"]
    return next((o for o in ok if o.method != DENSE), ok[0] if ok else (options[0] if options else None))


def episode_replays(session: Session, episode_id: str, replay_id: int | None = None) -> ReplaySection:
    """The replays of one episode (full id) and the chosen one's spans: ``replay_id`` (``LookupError`` when it is
    not a replay of this episode), else :func:`default_replay`. Only the chosen row's ``turns`` are read."""
    from dashboard.copy_marks import turn_spans

    columns = (
        Replay.id, Replay.method, Replay.scope, Replay.protocol, Replay.config, Replay.model, Replay.status,
        Replay.error, Replay.chunked, Replay.tokens, Replay.nll_mean, Replay.top1, Replay.action, Replay.created_at,
    )  # fmt: skip
    options = []
    for r in session.execute(select(*columns).where(Replay.episode_id == episode_id)):
        density = None if r.method == DENSE else (r.config if isinstance(r.config, dict) else {}).get("density")
        options.append(
            ReplayOption(
                id=r.id,
                method=r.method,
                scope=r.scope,
                protocol=r.protocol,
                density=float(density) if isinstance(density, int | float) else None,
                model=r.model,
                status=r.status,
                error=r.error,
                chunked=bool(r.chunked),
                tokens=r.tokens,
                nll_mean=r.nll_mean,
                top1=r.top1,
                action=r.action if isinstance(r.action, dict) else None,
                created_at=r.created_at,
            )
        )
    options.sort(key=replay_order)
    if replay_id is not None:
        chosen = next((o for o in options if o.id == replay_id), None)
        if chosen is None:
            raise LookupError(f"no replay {replay_id} of episode {episode_id!r}")
    else:
        chosen = default_replay(options)
    if chosen is None:
        return ReplaySection(options)
    turns = session.execute(select(Replay.turns).where(Replay.id == chosen.id)).scalar_one_or_none()
    return ReplaySection(options, chosen, turn_spans(turns))


def divergence(a: list[TurnView], b: list[TurnView]) -> int | None:
    """The first turn index where two trajectories differ (call, format error, or one has ended); None if equal."""
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b) or a[i].divergence_key != b[i].divergence_key:
            return i
    return None


def method_curves(
    session: Session, job_id: str, *, include_interactive: bool = False
) -> dict[tuple[str, str], dict[str, list[tuple[int, float, float]]]]:
    """Per (scope, protocol) and method, per turn: (turn, mean physical slots after eviction, mean eviction
    events), averaged over the job's result attempts that reached that turn (a turn without ``physical_after["mean"]``
    is left out of the slots' mean, NaN when none has it). One GROUP BY in SQL: no turn row comes to Python."""
    full_id = db_store.get_job(session, job_id).id
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
