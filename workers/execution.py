"""Running one stored episode: the code every service path shares (Celery task, embedded, interactive).

:func:`execute_episode` is claim -> ``agent_runner.episode.run_episode`` (with an ``on_turn`` that stores each
turn) -> finish. It is idempotent through ``db.claims``: a duplicate or redelivered message gets no claim and
does nothing. The worker host's settings come as one :class:`WorkerContext`, what the caller adds around the run as
one ``agent_runner.episode.EpisodeHooks``; the stored status is ``agent_runner.status.status_of``'s. How turns and
the runner's record are stored is ``workers.stored_records``; grading the stored patch afterwards (the ``grade``
queue) is ``workers.grade_stored``.

Nothing here imports Celery; the tasks in :mod:`workers.celery_tasks` wrap these functions.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from agent_runner.backend_settings import AllowedEndpoints, EndpointNotAllowed, OpenAIConfig
from agent_runner.config import EpisodeSpec
from agent_runner.episode import EpisodeHooks, run_episode  # callers of the worker import EpisodeHooks from here
from agent_runner.status import TIMEOUT, status_of
from db import Database
from db import store as db_store
from db.liveness import give_back
from db.models import AGENT_EXIT_STATUSES
from env.sandbox.config import EPISODE_LABEL, WORKER_LABEL
from env.tasks.task_cache import TaskCache
from jobs.episode_config import stored_episode_spec
from jobs.settings import LIVENESS, Liveness
from workers.faults.db_retry import DatabaseStillDown, retrying
from workers.faults.heartbeat import Heartbeat
from workers.faults.recovery import NOT_RETRIED
from workers.stored_records import runner_record, turn_row

if TYPE_CHECKING:
    from agent_runner.records import TurnRecord


class SoftTimeout(Exception):
    """Raised into the agent loop (from ``on_turn``) when the episode's own soft deadline has passed."""


@dataclass(frozen=True)
class WorkerContext:
    """The worker host's settings one run is executed under (a Celery worker builds it from its ``ServiceSettings``;
    the defaults are a one-off run's: the interactive rerun, a test).

    tasks:            the worker process's task sources (None: a fresh cache, so this one episode loads its own).
    liveness:         the heartbeat the run beats while it holds the episode, the bound after which a silent holder's
                      row is taken over, and how long each database call is retried.
    episodes_per_gpu: > 1 decodes this episode together with the process's other episodes (a multi-episode worker;
                      the worker builds the backend with ``agent_runner.loaded_models.backend_for``).
    device:           the host's device for the model (``ServiceSettings.device``: the host's, not the job's).
    allowed:          where the worker lets an openai episode send requests (``ServiceSettings.openai_allowed``).
    soft_deadline_s:  seconds from the start after which the run stops at its next turn, stored as ``timeout``.
    celery_task_id:   the message's task id, stored with the claim.
    """

    tasks: TaskCache | None = None
    liveness: Liveness = LIVENESS
    episodes_per_gpu: int = 1
    device: str | None = None
    allowed: AllowedEndpoints = AllowedEndpoints()
    soft_deadline_s: float | None = None
    celery_task_id: str | None = None


@dataclass
class ExecutionOutcome:
    """What :func:`execute_episode` did. ``ran`` is False when it had no claim (``reason`` says why)."""

    episode_id: str
    ran: bool
    status: str | None = None
    reason: str | None = None
    written: bool = False  # the result row was written (False: cancelled or taken over meanwhile)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def needs_grade(self) -> bool:
        return self.written and self.status in AGENT_EXIT_STATUSES


def check_episode_endpoint(spec: EpisodeSpec, allowed: AllowedEndpoints) -> None:
    """``backend=openai``: the episode's endpoint as this worker's operator allows it (``ServiceSettings``
    ``openai_key_envs`` / ``openai_hosts``), checked again here because the stored job may predate the check or
    come from a host with other settings. ValueError naming the field, before any request or container."""
    if spec.backend == "openai":
        allowed.check(OpenAIConfig(**spec.openai))


def _reap_episode_containers(job_id: str, episode_id: str) -> int:
    """Remove the containers a dead run of this episode left behind (its labels name the episode)."""
    try:
        from env.sandbox.reaping import reap

        return reap(older_than_s=0, label_filter={"nexus-eval.job": job_id, "nexus-eval.episode": episode_id})
    except Exception:  # no Docker here: the new run will fail to open its sandbox and say so
        return 0


def _hand_back(db: Database, claim: db_store.Claim) -> None:
    """Return a run this worker cannot record to ``queued`` (best effort: the database may still be down)."""
    try:
        with db.session() as s:
            give_back(s, claim)
    except Exception:  # still down: the row's heartbeat has stopped, so a sweeper hands it back later
        pass


def execute_episode(
    db: Database,
    episode_id: str,
    *,
    worker: WorkerContext = WorkerContext(),
    hooks: EpisodeHooks = EpisodeHooks(),
) -> ExecutionOutcome:
    """Claim, run and finish ``episode_id`` on a host set up as ``worker``. Never raises for episode failures
    (they become statuses, ``agent_runner.status.status_of``).

    ``worker.soft_deadline_s`` passing, or any of ``hooks.time_limits`` raised into the run, stores the run as
    ``timeout`` with its partial trajectory. A database call that stays down past ``worker.liveness.db_retry_s``
    raises :class:`DatabaseStillDown` (the caller requeues its message; nothing was acknowledged into nothing).
    An openai episode whose endpoint ``worker.allowed`` refuses ends as ``infra_failure`` naming why, before any
    request. ``hooks``: see ``EpisodeHooks``; its ``on_turn`` sees each turn after it is stored, and the container
    labels name the job and the episode. The runner's record of what ran (``EpisodeResult.config``: the spec as the
    worker ran it, the device included) is stored as ``result["runner"]``.
    """
    started = time.monotonic()
    timings: dict[str, float] = {}
    liveness = worker.liveness

    def claim_it():
        with db.session() as s:
            claim = db_store.claim_episode(
                s, episode_id, celery_task_id=worker.celery_task_id, stale_after_s=liveness.stale_after_s
            )
            row = db_store.get_episode(s, episode_id)
            return claim, dict(row.config or {}), row.job_id, row.status, dict(row.result or {})

    claim, config, job_id, status_now, noted = retrying(
        claim_it, budget_s=liveness.db_retry_s, what=f"claim {episode_id}"
    )
    timings["claim_s"] = time.monotonic() - started
    if claim is None:
        return ExecutionOutcome(episode_id, ran=False, reason=f"not claimed (episode is {status_now})")
    if claim.took_over_from:
        _reap_episode_containers(job_id, episode_id)

    out_of_time = (SoftTimeout, *hooks.time_limits)
    state: dict[str, Any] = {"db_s": 0.0, "claim_lost": None, "db_lost": None}
    soft_deadline_s = worker.soft_deadline_s
    deadline = None if soft_deadline_s is None else time.monotonic() + soft_deadline_s

    def store_turn(turn: TurnRecord) -> None:
        with db.session() as s:
            db_store.record_turn(s, claim, turn.index, steered=turn.steered, **turn_row(turn))

    def persist(turn: TurnRecord) -> None:
        t0 = time.monotonic()
        try:
            retrying(lambda: store_turn(turn), budget_s=liveness.db_retry_s, what=f"turn {turn.index} of {episode_id}")
        except DatabaseStillDown as exc:
            state["db_lost"] = exc
            raise
        except db_store.ClaimLost as exc:
            state["claim_lost"] = str(exc)
            raise
        finally:
            state["db_s"] += time.monotonic() - t0
        if hooks.progress is not None:
            action = turn.action.name if turn.action else None
            hooks.progress({"turn": turn.index + 1, "max_steps": spec.agent.max_steps, "action": action})
        if hooks.on_turn is not None:
            hooks.on_turn(turn)
        if deadline is not None and time.monotonic() > deadline:
            raise SoftTimeout(f"soft deadline of {soft_deadline_s:.0f}s passed after turn {turn.index}")

    result, error, interrupted = None, None, None
    try:
        from agent_runner.loaded_models import backend_for  # torch: loaded by the first run, not by importing this

        spec = stored_episode_spec(config, device=worker.device)
        check_episode_endpoint(spec, worker.allowed)
        # the claim's holder labels the container: once another process holds the episode (a takeover, on any
        # host) or nobody does, this host's sweeps remove it (workers.faults.recovery.reap_lost_containers)
        labels = {**hooks.labels, "nexus-eval.job": job_id, EPISODE_LABEL: episode_id, WORKER_LABEL: claim.worker}
        with Heartbeat(db, claim, every_s=liveness.heartbeat_s):
            task = (worker.tasks or TaskCache()).task(spec)
            # the host's model: with episodes_per_gpu > 1 its turns go through the process's batched engine
            model = backend_for(spec, task, episodes_per_gpu=worker.episodes_per_gpu)
            result = run_episode(spec, task=task, model=model, hooks=replace(hooks, on_turn=persist, labels=labels))
        interrupted = result.exception
    except BaseException as exc:  # noqa: BLE001 - a time limit, a bad config, a broken model host
        error = f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exception(exc)).strip()
        interrupted = exc
        if not isinstance(exc, (Exception, *out_of_time)):
            raise  # KeyboardInterrupt / SystemExit (warm shutdown): the message is redelivered
    timings["run_s"] = time.monotonic() - started - timings["claim_s"]

    status = status_of(result.exit_status if result is not None else None, interrupted, time_limits=out_of_time)
    fields: dict[str, Any] = {"wall_s": time.monotonic() - started}
    if result is not None:
        agent_s = result.timings.get("agent_s")
        fields.update(exit_status=result.exit_status, error=result.error, patch=result.patch, agent_s=agent_s)
        fields["retention"] = result.retention  # the final cache's retention map (None without a cache)
    else:
        fields["error"] = error
    if status == TIMEOUT:
        fields["error"] = f"soft time limit reached; partial trajectory kept\n{fields.get('error') or ''}".strip()
    timings["db_turns_s"] = state["db_s"]
    fields["result"] = {
        **{k: noted[k] for k in ("retry_of", "retry") if k in noted},  # set on an automatic retry's row
        "service_timings": dict(timings),
        "episode_timings": dict(result.timings) if result else {},
        "took_over_from": claim.took_over_from,
        "worker": claim.worker,  # `episodes.worker` names the grader once a grade is claimed
        "scaffold": result.scaffold.model_dump(mode="json") if result is not None and result.scaffold else None,
        # what ran, as the runner recorded it: the spec with the host's device (stored as what it changed from the
        # episode's config: stored_records.runner_spec reads it whole), the sandbox, the backend's class and the
        # device the model is on (None: the run did not start)
        "runner": runner_record(config, result.config) if result is not None else None,
    }
    if isinstance(interrupted, EndpointNotAllowed):  # the operator's settings: a new attempt is refused alike
        fields["result"][NOT_RETRIED] = "the worker's allow-lists refuse this endpoint"
    if state["db_lost"] is not None:
        # turns could not be stored: this run cannot be recorded whole. Hand the row back (it runs again from
        # turn 0) if the database answers by now; else its silent heartbeat lets a sweeper do it later
        _hand_back(db, claim)
        raise state["db_lost"]

    def finish() -> bool:
        with db.session() as s:
            return db_store.finish_episode(s, claim, status, **fields)

    t0 = time.monotonic()
    written = retrying(finish, budget_s=liveness.db_retry_s, what=f"finish {episode_id}")
    timings["finish_s"] = time.monotonic() - t0
    reason = state["claim_lost"] or (None if written else "the claim was lost before finishing")
    return ExecutionOutcome(episode_id, ran=True, status=status, reason=reason, written=written, timings=timings)
