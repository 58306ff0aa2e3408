"""``replay_job``: score a job's dense trajectories under other methods' caches, without running an agent.

An episode costs thousands of decode steps and a container; "how much does method X perturb this agent?" can
be measured far more cheaply by teacher-forcing the token stream a dense run produced through a cache managed
by X (``agent_runner.counterfactual``) and storing how well the model still predicts its own completions.

What is replayed: every **dense** replay source of the job (``db.replays.replay_sources``: a key's result attempt,
driven by the agent alone, whose trajectory is a whole sample: never an interactive or steered attempt, a resample,
a run that broke or one still running) whose turns all carry their token stream
(``turns.tokens``, written by the hf backend), under every requested (method, scope, protocol). By default
those are the job's own; a method is replayed with exactly the settings that job gave it (``JobSpec`` resolves
them from the stored preset and overrides, with the source episode's seed), so a replay row and the job's live
episodes of that method are comparable. Dense itself is replayed once per protocol (its scope is moot): it is
the baseline of ``compare``'s delta-NLL. Asked for other methods only, dense is still replayed where an
episode has no dense replay under that protocol yet.

Every planned replay ends as a row: ``ok`` with its scores, ``skipped`` when the stream cannot be replayed
that way (a ``ReplayError``, e.g. a full_context stream under true_eviction), ``failed`` with the error for
anything else. Bad names, an unknown job or a job without dense episodes fail in :func:`plan_replays`, before
a model is loaded.
"""

from __future__ import annotations

import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from agent_runner.config import ModelSpec, check_protocol
from db import Database
from db import store as db_store
from db.models import ACTIVE_STATUSES, Replay
from db.replays import is_replay_source, record_replay, replay_sources, replays_for_jobs, turn_streams
from nexus.config import EvictionConfig
from nexus.methods import DENSE, check_method, check_scope
from workers.execution import worker_episode_spec
from workers.replay_stats import ReplayCell, outcomes_from_rows, summarize_replays
from workers.spec import JobSpec

_EVICTION = TypeAdapter(EvictionConfig)


@dataclass(frozen=True)
class ReplayItem:
    """One replay to run: a source episode under one method's eviction settings and one protocol."""

    episode_id: str
    task_id: str
    method: str
    scope: str
    protocol: str
    eviction: dict[str, Any]  # the EvictionConfig, as an episode config stores it


@dataclass
class ReplayPlan:
    job_id: str
    model: ModelSpec | None
    items: list[ReplayItem]
    combos: list[tuple[str, str, str]]  # (method, scope, protocol) asked for
    protocols: list[str]
    missing: list[tuple[str, str, str]] = field(default_factory=list)  # (episode, task, why it is not replayed)


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


def _check_names(methods: Sequence[str] | None, scopes: Sequence[str] | None, protocols: Sequence[str] | None):
    for m in methods or ():
        check_method(m, noun="method")
    for s in scopes or ():
        check_scope(s)
    for p in protocols or ():
        check_protocol(p)


def _job_spec(job: Any, methods: Sequence[str]) -> JobSpec:
    """The job's spec, extended to ``methods`` it did not run (their settings resolved from its preset)."""
    config = dict(job.config or {})
    extra = [m for m in methods if m not in config.get("methods", [])]
    try:
        return JobSpec.from_stored({**config, "methods": [*config.get("methods", []), *extra]})
    except ValidationError as exc:
        raise ValueError(f"job {job.id}: its stored spec does not validate: {exc}") from None


def plan_replays(
    db: Database,
    job_id: str,
    *,
    methods: Sequence[str] | None = None,
    scopes: Sequence[str] | None = None,
    protocols: Sequence[str] | None = None,
    densities: Sequence[float] | None = None,
    device: str | None = None,
) -> ReplayPlan:
    """What :func:`replay_job` would run (on ``device``, default the job's own model device). ``densities``: replay
    each method at each of these densities instead of the job's own (a sweep over the budget on the same dense
    trajectories; a method whose ``method_params`` fix its density keeps it). ``LookupError`` for an unknown job,
    ``ValueError`` for a bad name or density or a job without dense episodes. Loads no model and imports no torch."""
    _check_names(methods, scopes, protocols)
    for d in densities or ():
        if not 0 < d <= 1:
            raise ValueError(f"density must be in (0, 1], got {d!r}")
    with db.session() as s:
        job = db_store.get_job(s, job_id)
        methods = list(methods or (job.config or {}).get("methods") or [])
        spec = _job_spec(job, methods)
        specs = [spec.model_copy(update={"density": d}) for d in densities] if densities else [spec]
        scopes, protocols = list(scopes or spec.scopes), list(protocols or spec.protocols)
        dense = [e for e in db_store.result_attempts(s, [job.id]) if e.method == DENSE]
        if not dense:
            raise ValueError(f"job {job.id} has no dense episode the agent ran: a replay scores a dense trajectory")
        have_dense = {
            (r.episode_id, r.protocol) for r in replays_for_jobs(s, [job.id]) if r.method == DENSE and r.status == "ok"
        }
        combos = [(m, sc, p) for m in methods for sc in (scopes[:1] if m == DENSE else scopes) for p in protocols]
        plan = ReplayPlan(job.id, None, [], combos, protocols)
        for episode in dense:
            if not is_replay_source(episode, DENSE):
                why = (
                    f"still {episode.status}"
                    if episode.status in ACTIVE_STATUSES
                    else f"not a sample: {episode.status}"
                )
                plan.missing.append((episode.id, episode.task_id, why))
                continue
            if turn_streams(s, episode.id) is None:
                why = "no turns" if not episode.n_turns else "no stored token stream (a backend that reports none?)"
                plan.missing.append((episode.id, episode.task_id, why))
                continue
            plan.model = plan.model or worker_episode_spec(episode.config, device=device).model
            wanted = list(combos)
            if DENSE not in methods:  # the delta-NLL baseline, where this episode has none yet
                wanted += [(DENSE, scopes[0], p) for p in protocols if (episode.id, p) not in have_dense]
            for method, scope, protocol in wanted:
                for at in [spec] if method == DENSE else specs:  # dense keeps every token: the job's own settings
                    config = _EVICTION.dump_python(at.eviction_config(method, scope, episode.seed), mode="json")
                    plan.items.append(ReplayItem(episode.id, episode.task_id, method, scope, protocol, config))
    return plan


def run_plan(
    db: Database, plan: ReplayPlan, *, chunked: bool = True, host: Any = None, progress: Progress | None = None
) -> ReplaySummary:
    """Run every item of ``plan`` and store its row. ``host``: a loaded ``ModelHost`` (default: the job's
    model through ``agent_runner.model_cache.host_for``); a model that cannot load raises before any row is written."""
    results: list[ReplayResult] = []
    if plan.items:
        from agent_runner.counterfactual import model_forward
        from agent_runner.records import TurnTokens

        if host is None:
            from agent_runner.model_cache import host_for

            host = host_for(plan.model or ModelSpec())
        forward = model_forward(host.model, host.device)
        streams: dict[str, list[TurnTokens] | Exception] = {}
        for item in plan.items:
            if item.episode_id not in streams:
                streams.clear()  # items are grouped by source: hold one episode's stream at a time
                streams[item.episode_id] = _load_stream(db, item.episode_id)
            result = _replay_one(db, item, streams[item.episode_id], forward, host.model.config, chunked)
            results.append(result)
            if progress is not None:
                progress(result, len(results), len(plan.items))
    with db.session() as s:
        current = {e.id for e in replay_sources(s, [plan.job_id], method=DENSE)}
        rows = [
            r
            for r in replays_for_jobs(s, [plan.job_id])
            if r.episode_id in current
            and ((r.method, r.scope, r.protocol) in plan.combos or (r.method == DENSE and r.protocol in plan.protocols))
        ]
        cells = summarize_replays(outcomes_from_rows(rows))
    return ReplaySummary(plan.job_id, results, plan.missing, cells)


def replay_job(
    db: Database,
    job_id: str,
    *,
    methods: Sequence[str] | None = None,
    scopes: Sequence[str] | None = None,
    protocols: Sequence[str] | None = None,
    densities: Sequence[float] | None = None,
    chunked: bool = True,
    host: Any = None,
    progress: Progress | None = None,
) -> ReplaySummary:
    """Plan (:func:`plan_replays`) and run (:func:`run_plan`) the replays of ``job_id``'s dense episodes."""
    plan = plan_replays(db, job_id, methods=methods, scopes=scopes, protocols=protocols, densities=densities)
    return run_plan(db, plan, chunked=chunked, host=host, progress=progress)


def _load_stream(db: Database, episode_id: str) -> list[Any] | Exception:
    """The episode's TurnTokens, or the exception that says why they do not parse (stored on each row)."""
    from agent_runner.records import TurnTokens

    with db.session() as s:
        raw = turn_streams(s, episode_id) or []
    try:
        return [TurnTokens.model_validate(t) for t in raw]
    except ValidationError as exc:
        return ValueError(f"stored token stream does not parse: {exc}")


def _replay_one(db: Database, item: ReplayItem, turns: Any, forward: Any, model_config: Any, chunked: bool):
    from agent_runner.counterfactual import ReplayError, replay_episode

    status, error, score = "ok", None, None
    t0 = time.perf_counter()
    try:
        if isinstance(turns, Exception):
            raise turns
        eviction = EvictionConfig(**item.eviction)  # builds the policy: a bad parameter fails this row only
        score = replay_episode(forward, model_config, turns, eviction, item.protocol, chunked=chunked)
        score = score.model_dump(mode="json")
    except ReplayError as exc:
        status, error = "skipped", str(exc)
    except Exception as exc:  # noqa: BLE001 - stored as the row's error, never swallowed
        status = "failed"
        error = f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exception(exc)).strip()
    if score is None:
        score = {"seconds": time.perf_counter() - t0}
    with db.session() as s:
        source = db_store.get_episode(s, item.episode_id)
        fields = {k: getattr(item, k) for k in ("method", "scope", "protocol")}
        row: Replay = record_replay(
            s, source, **fields, config=item.eviction, status=status, error=error, score=score, chunked=chunked
        )
        nll, top1 = row.nll_mean, row.top1
    return ReplayResult(item, status, error, nll, top1)
