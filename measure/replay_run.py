"""Running a replay plan (``measure.replay.plan_replays``): score each item's source stream under its method's cache.

:func:`run_plan` teacher-forces each planned item's token stream through a cache managed by the item's method, one
source episode and protocol at a time (its stream, or its text rendered into the model, read once): every item of
the group is a row of one stack (``measure.replay_cells``: shared dense prefills where exact, then the rows
fed together, each equal to its replay alone). Each item's row is stored as its group finishes.

Every cache is told each turn's segments (its ChatML messages, read with the host's tokenizer) before the forward
that feeds the turn, as the hf backend tells it live: ``observation_masking`` and ``candidates: newest_turn``
decide by them (a row of those without segments is ``skipped``, saying why). ``observation_masking`` with the
paper's rule under full context is the text-level method: its rows are fed the history with old observations
replaced by the placeholder (``measure.replay_cells.mask_turns``), a stream of their own.

Every planned replay ends as a row: ``ok`` with its scores, ``skipped`` when the stream cannot be replayed
that way (a ``ReplayError``, e.g. a full_context stream under true_eviction), ``failed`` with the error for
anything else.

The plan's data types (:class:`ReplayItem`, :class:`ReplayPlan`, :class:`ReplayResult`, :class:`ReplaySummary`)
live here, below ``measure.replay``, which re-exports them with :func:`run_plan`: planning imports running, never
the other way round.
"""

from __future__ import annotations

import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pydantic import ValidationError

from agent_runner.config import ModelSpec
from agent_runner.measuring_dtypes import REFERENCE_DTYPE
from db import Database
from db import store as db_store
from db.connection import begin_write
from db.measure_models import Replay
from db.replays import record_replay, replay_sources, replayable_token_streams, replays_for_jobs
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
    dtype: str = REFERENCE_DTYPE  # what the measuring model runs in (measure.measuring_dtype); stored with the row


@dataclass
class ReplayPlan:
    job_id: str
    model: ModelSpec | None
    items: list[ReplayItem]
    combos: list[tuple[str, str, str]]  # (method, scope, protocol) asked for
    protocols: list[str]
    missing: list[tuple[str, str, str]] = field(default_factory=list)  # (episode, task, why it is not replayed)
    text_model: str | None = None  # the model text trajectories are rendered into (None: stored streams)
    done: list[ReplayItem] = field(default_factory=list)  # left out: already stored ok, measured the same way
    dtype: str = REFERENCE_DTYPE  # what the model is measured in: every item's, and the summary's rows'


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
    db: Database,
    plan: ReplayPlan,
    *,
    chunked: bool = True,
    host: Any = None,
    progress: Progress | None = None,
    processes: int = 1,
    threads: int = 1,
) -> ReplaySummary:
    """Run every item of ``plan`` and store its row. ``host``: a loaded ``ModelHost`` (default: the job's
    model through ``agent_runner.loaded_models.host_for``); a model that cannot load raises before any row is written.
    ``processes`` > 1: the groups (a source episode under one protocol) spread over that many processes
    (``measure.processes.run_pool``), each loading the model with ``threads`` torch threads, taking the next
    group when done with one and storing its own rows."""
    results: list[ReplayResult] = []
    by_source: dict[tuple[str, str], list[ReplayItem]] = {}
    for item in plan.items:  # one source episode and protocol: its settings as rows of one stack
        by_source.setdefault((item.episode_id, item.protocol), []).append(item)
    groups = {(*key, k): chunk for key, items in by_source.items() for k, chunk in enumerate(_chunks(items))}
    if len(groups) > 1 and host is None and processes > 1:
        from measure.processes import run_pool

        url = db.engine.url.render_as_string(hide_password=False)
        setup = partial(_open_share, url, plan.model or ModelSpec())
        for result in run_pool(setup, partial(_run_group, chunked), list(groups.values()), processes=processes,
                               threads=threads):  # fmt: skip
            results.append(result)
            if progress is not None:
                progress(result, len(results), len(plan.items))
    elif plan.items:
        if host is None:
            from agent_runner.loaded_models import host_for

            host = host_for(plan.model or ModelSpec())

        def emit(result: ReplayResult) -> None:
            results.append(result)
            if progress is not None:
                progress(result, len(results), len(plan.items))

        sources: dict[str, dict] = {}
        for group in groups.values():
            _run_group(chunked, (db, host, sources), group, emit)
    with db.session() as s:
        current = {e.id for e in replay_sources(s, [plan.job_id], method=DENSE)}
        rows = [
            r
            for r in replays_for_jobs(s, [plan.job_id])
            if r.episode_id in current
            and r.model == plan.text_model
            and r.dtype == plan.dtype
            and ((r.method, r.scope, r.protocol) in plan.combos or (r.method == DENSE and r.protocol in plan.protocols))
        ]
        cells = summarize_replays(outcomes_from_rows(rows))
    return ReplaySummary(plan.job_id, results, plan.missing, cells)


#: most settings replayed in one call of ``replay_cells`` (a source under one protocol): that call feeds them in
#: stacks of one (scope, density) each, so its memory is one such stack's; a larger group is split in balanced
#: chunks, each paying the shared prefills again. A full sweep's 55 settings of a source are one call
MAX_GROUP_ROWS = 64


def _chunks(items: list[ReplayItem]) -> list[list[ReplayItem]]:
    """`items` in consecutive chunks of at most ``MAX_GROUP_ROWS``, as equal as possible (a method's densities stay
    together where they can: plan order is method by method, so what H2O observes is shared within a chunk)."""
    n = -(-len(items) // MAX_GROUP_ROWS)
    size = -(-len(items) // n)
    return [items[i : i + size] for i in range(0, len(items), size)]


def _run_group(chunked: bool, state: tuple, group: list[ReplayItem], emit) -> None:
    """Replay and store one group (a source episode under one protocol, every setting a row), emitting each row's
    result. ``state``: (database, loaded host, the sources read so far per episode)."""
    db, host, sources = state
    source = _source(sources.setdefault(group[0].episode_id, {}), db, group[0], host)
    for item, outcome in zip(group, _score_cells(group, source, host, chunked), strict=True):
        emit(_store(db, item, *outcome, chunked=chunked))


def _open_share(url: str, model: ModelSpec) -> tuple:
    """A measuring process's state (``measure.processes.run_pool``): its own connection and model."""
    from agent_runner.loaded_models import host_for
    from db.connection import connect

    return connect(url, upgrade=False), host_for(model), {}


@dataclass
class _Source:
    """What one source episode is replayed from: its turns' token streams, each turn's segments
    (``measure.counterfactual.turn_segments``, read with the host's tokenizer; None: none, ``unsegmented`` says why)
    and for a text trajectory the spans of each turn's call (``measure.action_scores.plan_spans``); or the error
    that says why it cannot be."""

    turns: list[Any] | None = None
    actions: list[Any] | None = None
    error: Exception | None = None
    segments: list[Any] | None = None
    markers: Any = None  # the tokenizer's ChatMarkers (what the text-level masking needs), None without segments
    unsegmented: str = "the host has no tokenizer"


def _source(sources: dict[str | None, _Source], db: Database, item: ReplayItem, host: Any) -> _Source:
    """``item``'s source from ``sources`` (one episode's), loaded on first use: a text trajectory per protocol."""
    key = item.protocol if item.model else None
    if key not in sources:
        sources[key] = _load_source(db, item, host)
    return sources[key]


def _load_source(db: Database, item: ReplayItem, host: Any) -> _Source:
    """The stored stream of ``item``'s episode, or (``item.model``) its text rendered into ``host``'s model under
    ``item.protocol``, with its turns' segments; a source that cannot be read becomes the error stored on each of
    its rows."""
    return _segmented(_read_source(db, item, host), host.tokenizer)


def _segmented(source: _Source, tokenizer: Any) -> _Source:
    """``source`` with each turn's segments, read from its ChatML ids with ``tokenizer`` (as the hf backend tells
    the cache live); a host without a tokenizer, or whose chat template is not ChatML, gives none."""
    from agent_runner.chat_segments import ChatMarkers
    from measure.counterfactual import ReplayError, turn_segments

    if source.error is not None or tokenizer is None:
        return source
    try:
        source.markers = ChatMarkers.of(tokenizer)
    except ValueError as exc:
        source.unsegmented = str(exc)
        return source
    try:
        source.segments = turn_segments(source.turns, source.markers)
    except ReplayError as exc:  # a stream whose turns do not chain: every row would fail the same way
        return _Source(error=exc)
    return source


def _read_source(db: Database, item: ReplayItem, host: Any) -> _Source:
    from agent_runner.records import TurnTokens

    if item.model is None:
        with db.session() as s:
            raw = replayable_token_streams(s, item.episode_id) or []
        try:
            return _Source(turns=[TurnTokens.model_validate(t) for t in raw])
        except ValidationError as exc:
            return _Source(error=ValueError(f"stored token stream does not parse: {exc}"))
    from agent_runner.chat_stream import RenderError, render_trajectory
    from measure.action_scores import plan_spans
    from measure.counterfactual import ReplayError
    from measure.text_trajectories import TextTrajectoryError, conversation

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
    from measure.counterfactual import ReplayError

    if isinstance(exc, ReplayError):
        return "skipped", str(exc), {}
    return "failed", f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exception(exc)).strip(), {}


def _score_cells(items: list[ReplayItem], source: _Source, host: Any, chunked: bool) -> list[Outcome]:
    """Replay items of one source and protocol together (``measure.replay_cells``): every setting a row of one
    stack, each equal to its replay alone. The paper's text-level observation masking (full context, rule latest)
    is fed the masked history instead (``measure.replay_cells.mask_turns``): its rows are a call of their own per
    masking, results back in the items' order. Never raises: a bad setting fails its own row; a stream that
    cannot be replayed under the protocol is every row of its call ``skipped``, any other error ``failed``."""
    from agent_runner.chat_segments import text_masking
    from measure.counterfactual import ReplayError
    from measure.replay_cells import mask_turns, reads_segments, replay_cells

    t0 = time.perf_counter()
    outcomes: list[Outcome | None] = [None] * len(items)
    streams: dict[Any, dict[int, EvictionConfig]] = {}  # None: the source stream
    for k, item in enumerate(items):
        try:
            if source.error is not None:
                raise source.error
            eviction = EvictionConfig(**item.eviction)  # builds the policy: a bad parameter fails this row only
            if source.segments is None and reads_segments(eviction):
                raise ReplayError(
                    f"{item.method} decides by the turns' segments, which this stream cannot give: {source.unsegmented}"
                )
            streams.setdefault(text_masking(eviction, item.protocol), {})[k] = eviction
        except Exception as exc:  # noqa: BLE001 - stored as the row's error, never swallowed
            outcomes[k] = _failure(exc)
    for masking, evictions in streams.items():
        turns, segments, actions = source.turns, source.segments, source.actions
        try:
            if masking is not None:
                keep_latest, placeholder = masking
                masked = mask_turns(turns, actions, host.tokenizer, source.markers, keep_latest=keep_latest,
                                    placeholder=placeholder)  # fmt: skip
                turns, segments, actions = masked.turns, masked.segments, masked.actions
            scores = replay_cells(
                host.model, turns, list(evictions.values()), items[0].protocol, chunked=chunked, actions=actions,
                segments=segments,
            )  # fmt: skip
            for k, score in zip(evictions, scores, strict=True):
                outcomes[k] = ("ok", None, score.model_dump(mode="json"))
        except Exception as exc:  # noqa: BLE001 - every row of the call carries the error
            failed = _failure(exc)
            for k in evictions:
                outcomes[k] = (failed[0], failed[1], {"seconds": time.perf_counter() - t0})
    return [o for o in outcomes if o is not None]


def _store(db: Database, item: ReplayItem, status: str, error: str | None, score: dict, *, chunked: bool):
    """Write ``item``'s row (replacing the row of the same configuration) and say what it holds."""
    with db.session() as s:
        # a write from the start: a read first would leave a snapshot that another process's write makes stale,
        # and SQLite refuses to upgrade it ("database is locked") instead of waiting
        begin_write(s)
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
            dtype=item.dtype,
        )
        nll, top1 = row.nll_mean, row.top1
    return ReplayResult(item, status, error, nll, top1)
