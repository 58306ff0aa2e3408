"""Running a replay plan (``workers.replay.plan_replays``): score each item's source stream under its method's cache.

:func:`run_plan` teacher-forces each planned item's token stream (``agent_runner.counterfactual``) through a cache
managed by the item's method, one source episode at a time (its stream, or its text rendered into the model, read
once); full_context items of one source share every turn's prefill. Each item's row is stored as it finishes.

Every planned replay ends as a row: ``ok`` with its scores, ``skipped`` when the stream cannot be replayed
that way (a ``ReplayError``, e.g. a full_context stream under true_eviction), ``failed`` with the error for
anything else.

The plan's data types (:class:`ReplayItem`, :class:`ReplayPlan`, :class:`ReplayResult`, :class:`ReplaySummary`)
live here, below ``workers.replay``, which re-exports them with :func:`run_plan`: planning imports running, never
the other way round.
"""

from __future__ import annotations

import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from pydantic import ValidationError

from agent_runner.config import ModelSpec
from db import Database
from db import store as db_store
from db.models import Replay
from db.replays import record_replay, replay_sources, replays_for_jobs, turn_streams
from nexus.config import EvictionConfig
from nexus.methods import DENSE
from results.replay_stats import ReplayCell, outcomes_from_rows, summarize_replays


@dataclass(frozen=True)
class ReplayItem:
    """One replay to run: a source episode under one method's eviction settings and one protocol."""

    episode_id: str
    task_id: str
    method: str
    scope: str
    protocol: str
    eviction: dict[str, Any]  # the EvictionConfig, as an episode config stores it
    model: str | None = None  # a text trajectory's replay: the model it is rendered into (None: the stored stream)


@dataclass
class ReplayPlan:
    job_id: str
    model: ModelSpec | None
    items: list[ReplayItem]
    combos: list[tuple[str, str, str]]  # (method, scope, protocol) asked for
    protocols: list[str]
    missing: list[tuple[str, str, str]] = field(default_factory=list)  # (episode, task, why it is not replayed)
    text_model: str | None = None  # the model text trajectories are rendered into (None: stored streams)


@dataclass
class ReplayResult:
    item: ReplayItem
    status: str  # ok | failed | skipped
    error: str | None = None
    nll_mean: float | None = None
    top1: float | None = None


@dataclass
class ReplaySummary:
    job_id: str
    results: list[ReplayResult]
    missing: list[tuple[str, str, str]]
    cells: list[ReplayCell]  # over the job's stored rows of the planned combos and dense (earlier runs' too)

    @property
    def counts(self) -> dict[str, int]:
        counted = Counter(r.status for r in self.results)
        return {status: counted.get(status, 0) for status in ("ok", "skipped", "failed")}


Progress = Callable[[ReplayResult, int, int], None]  # (result, done, total)


def run_plan(
    db: Database, plan: ReplayPlan, *, chunked: bool = True, host: Any = None, progress: Progress | None = None
) -> ReplaySummary:
    """Run every item of ``plan`` and store its row. ``host``: a loaded ``ModelHost`` (default: the job's
    model through ``agent_runner.model_cache.host_for``); a model that cannot load raises before any row is written."""
    results: list[ReplayResult] = []
    if plan.items:
        from agent_runner.counterfactual import model_forward

        if host is None:
            from agent_runner.model_cache import host_for

            host = host_for(plan.model or ModelSpec())
        forward = model_forward(host.model, host.device)

        def emit(item: ReplayItem, outcome: Outcome) -> None:
            results.append(_store(db, item, *outcome, chunked=chunked))
            if progress is not None:
                progress(results[-1], len(results), len(plan.items))

        for _, grouped in groupby(plan.items, key=lambda i: i.episode_id):  # one source episode at a time
            group, sources = list(grouped), {}
            for item in group:
                if item.protocol != "full_context":
                    emit(item, _score(item, _source(sources, db, item, host), forward, host.model.config, chunked))
            # full_context: every turn's prefill is paid once for all of this source's settings
            shared = [i for i in group if i.protocol == "full_context"]
            if shared:
                outcomes = _score_shared(shared, _source(sources, db, shared[0], host), host.model, forward, chunked)
                for item, outcome in zip(shared, outcomes, strict=True):
                    emit(item, outcome)
    with db.session() as s:
        current = {e.id for e in replay_sources(s, [plan.job_id], method=DENSE)}
        rows = [
            r
            for r in replays_for_jobs(s, [plan.job_id])
            if r.episode_id in current
            and r.model == plan.text_model
            and ((r.method, r.scope, r.protocol) in plan.combos or (r.method == DENSE and r.protocol in plan.protocols))
        ]
        cells = summarize_replays(outcomes_from_rows(rows))
    return ReplaySummary(plan.job_id, results, plan.missing, cells)


@dataclass
class _Source:
    """What one source episode is replayed from: its turns' token streams, and for a text trajectory the spans of
    each turn's call (``agent_runner.action_scores.plan_spans``); or the error that says why it cannot be."""

    turns: list[Any] | None = None
    actions: list[Any] | None = None
    error: Exception | None = None


def _source(sources: dict[str | None, _Source], db: Database, item: ReplayItem, host: Any) -> _Source:
    """``item``'s source from ``sources`` (one episode's), loaded on first use: a text trajectory per protocol."""
    key = item.protocol if item.model else None
    if key not in sources:
        sources[key] = _load_source(db, item, host)
    return sources[key]


def _load_source(db: Database, item: ReplayItem, host: Any) -> _Source:
    """The stored stream of ``item``'s episode, or (``item.model``) its text rendered into ``host``'s model under
    ``item.protocol``; a source that cannot be read becomes the error stored on each of its rows."""
    from agent_runner.records import TurnTokens

    if item.model is None:
        with db.session() as s:
            raw = turn_streams(s, item.episode_id) or []
        try:
            return _Source(turns=[TurnTokens.model_validate(t) for t in raw])
        except ValidationError as exc:
            return _Source(error=ValueError(f"stored token stream does not parse: {exc}"))
    from agent_runner.action_scores import plan_spans
    from agent_runner.chat_stream import RenderError, render_trajectory
    from agent_runner.counterfactual import ReplayError
    from workers.text_trajectories import TextTrajectoryError, conversation

    try:
        messages = conversation(db, item.episode_id)
        positions = getattr(host.model.config.get_text_config(), "max_position_embeddings", None)
        rendered = render_trajectory(host.tokenizer, messages, item.protocol, max_positions=positions)
    except (TextTrajectoryError, RenderError) as exc:
        return _Source(error=ReplayError(str(exc)))
    if not rendered.turns:
        return _Source(error=ReplayError(f"the first turn does not fit the model's {positions} positions"))
    return _Source(turns=rendered.turns, actions=plan_spans(rendered))


Outcome = tuple[str, str | None, dict[str, Any]]  # (status, error, score dump)


def _failure(exc: Exception) -> Outcome:
    from agent_runner.counterfactual import ReplayError

    if isinstance(exc, ReplayError):
        return "skipped", str(exc), {}
    return "failed", f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exception(exc)).strip(), {}


def _score(item: ReplayItem, source: _Source, forward: Any, model_config: Any, chunked: bool) -> Outcome:
    """Replay one item (never raises: a failure is the outcome's status and error)."""
    from agent_runner.counterfactual import replay_episode

    t0 = time.perf_counter()
    try:
        if source.error is not None:
            raise source.error
        eviction = EvictionConfig(**item.eviction)  # builds the policy: a bad parameter fails this row only
        score = replay_episode(
            forward, model_config, source.turns, eviction, item.protocol, chunked=chunked, actions=source.actions
        )
        return "ok", None, score.model_dump(mode="json")
    except Exception as exc:  # noqa: BLE001 - stored as the row's error, never swallowed
        status, error, _ = _failure(exc)
        return status, error, {"seconds": time.perf_counter() - t0}


def _score_shared(items: list[ReplayItem], source: _Source, model: Any, forward: Any, chunked: bool) -> list[Outcome]:
    """Replay full_context items of one source together (``replay_full_context_shared``): one prefill per turn."""
    from agent_runner.counterfactual import replay_full_context_shared

    t0 = time.perf_counter()
    outcomes: list[Outcome | None] = [None] * len(items)
    evictions = {}
    for k, item in enumerate(items):
        try:
            if source.error is not None:
                raise source.error
            evictions[k] = EvictionConfig(**item.eviction)  # a bad parameter fails this row only
        except Exception as exc:  # noqa: BLE001 - stored as the row's error
            outcomes[k] = _failure(exc)
    if evictions:
        try:
            scores = replay_full_context_shared(
                model, forward, source.turns, list(evictions.values()), chunked=chunked, actions=source.actions
            )
            for k, score in zip(evictions, scores, strict=True):
                outcomes[k] = ("ok", None, score.model_dump(mode="json"))
        except Exception as exc:  # noqa: BLE001 - every row of the batch carries the error
            failed = _failure(exc)
            for k in evictions:
                outcomes[k] = (failed[0], failed[1], {"seconds": time.perf_counter() - t0})
    return [o for o in outcomes if o is not None]


def _store(db: Database, item: ReplayItem, status: str, error: str | None, score: dict, *, chunked: bool):
    """Write ``item``'s row (replacing the row of the same configuration) and say what it holds."""
    with db.session() as s:
        episode = db_store.get_episode(s, item.episode_id)
        row: Replay = record_replay(
            s,
            episode,
            method=item.method,
            scope=item.scope,
            protocol=item.protocol,
            config=item.eviction,
            status=status,
            error=error,
            score=score,
            chunked=chunked,
            model=item.model,
        )
        nll, top1 = row.nll_mean, row.top1
    return ReplayResult(item, status, error, nll, top1)
