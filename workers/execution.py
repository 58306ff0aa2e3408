"""Running and grading one stored episode: the code every service path shares (Celery task, embedded, interactive).

:func:`execute_episode` is claim -> ``agent_runner.episode.run_episode`` (with an ``on_turn`` that stores each
turn) -> finish. It is idempotent through ``db.claims``: a duplicate or redelivered message gets no claim and
does nothing. :func:`grade_stored_episode` grades the stored patch in a fresh container (the ``grade`` queue).
The worker host's settings come as one :class:`WorkerContext`, what the caller adds around the run as one
``agent_runner.episode.EpisodeHooks``; the stored status is ``agent_runner.status.status_of``'s.

Nothing here imports Celery; the tasks in :mod:`workers.celery_tasks` wrap these functions.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from agent_runner import spec_diff
from agent_runner.backend_settings import AllowedEndpoints, EndpointNotAllowed, OpenAIConfig
from agent_runner.config import EpisodeSpec
from agent_runner.episode import EpisodeHooks, run_episode  # callers of the worker import EpisodeHooks from here
from agent_runner.status import TIMEOUT, status_of
from db import Database
from db import store as db_store
from db.liveness import claim_grade, give_back
from db.models import AGENT_EXIT_STATUSES
from jobs.settings import LIVENESS, Liveness
from nexus.presets import stored_settings
from results.turn_data import TurnExtra
from workers.faults.db_retry import DatabaseStillDown, retrying
from workers.faults.heartbeat import Heartbeat
from workers.faults.recovery import NOT_RETRIED
from workers.task_cache import TaskCache

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
                      the worker builds the backend with ``agent_runner.model_cache.backend_for``).
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


def worker_episode_spec(config: dict[str, Any], *, device: str | None = None) -> EpisodeSpec:
    """The stored per-episode config (an ``EpisodeSpec`` dump, see ``jobs.spec.JobSpec.episode_config``) ->
    the EpisodeSpec a worker runs: grading left to the ``grade`` queue, and the model on ``device`` when the
    worker host names one (``ServiceSettings.device``: it belongs to the host, not to the job). A method setting
    stored before it existed reads as the value the episode ran with (``nexus.presets.stored_settings``)."""
    config = dict(config)
    eviction = config.get("eviction")
    if isinstance(eviction, dict) and isinstance(eviction.get("method_params"), dict):
        # a setting added since it was stored: what it ran with
        params = stored_settings(eviction.get("method", ""), eviction["method_params"])
        config["eviction"] = {**eviction, "method_params": params}
    spec = EpisodeSpec.model_validate(config)
    update: dict[str, Any] = {"grade": False}
    if device:
        update["model"] = spec.model.model_copy(update={"device": device})
    return spec.model_copy(update=update)


#: the completion fields that have columns of their own (``db.models.Turn``; the turn's: index, thought, action,
#: observation, env_s); every other field of the turn and of its completion is ``results.turn_data.TurnExtra``
_COMPLETION_COLUMNS = {
    *("text", "tokens", "tokens_appended", "tokens_generated", "prompt_tokens", "logical_length"),
    *("physical_before", "physical_after", "eviction_events", "prefill_s", "decode_s", "tokens_per_s"),
    *("kv_held_bytes", "kv_allocated_bytes", "kv_peak_held_bytes", "kv_peak_allocated_bytes"),
}


def check_episode_endpoint(spec: EpisodeSpec, allowed: AllowedEndpoints) -> None:
    """``backend=openai``: the episode's endpoint as this worker's operator allows it (``ServiceSettings``
    ``openai_key_envs`` / ``openai_hosts``), checked again here because the stored job may predate the check or
    come from a host with other settings. ValueError naming the field, before any request or container."""
    if spec.backend == "openai":
        allowed.check(OpenAIConfig(**spec.openai))


def turn_row(turn: TurnRecord) -> dict[str, Any]:
    """A ``TurnRecord`` -> the ``db.models.Turn`` columns ``record_turn`` takes, the record stored whole: the
    fields queried by SQL are columns, every other field of the turn and of its completion goes into ``extra`` as
    ``results.turn_data.TurnExtra`` (typed, under its own name; ``Completion.info`` under ``info``, the backend's
    free-form ``Completion.extra`` under ``backend``), which every reader parses back."""
    c = turn.completion
    dumped = c.model_dump(mode="json")
    return {
        **{name: dumped[name] for name in _COMPLETION_COLUMNS if name not in ("text", "tokens")},
        "env_s": turn.env_s,
        "completion": c.text,
        "thought": turn.thought,
        "action": turn.action.model_dump(mode="json") if turn.action else None,
        "observation": turn.observation,
        "tokens": dumped["tokens"],  # the token stream counterfactual replay feeds (None without one)
        "extra": TurnExtra.of(turn).stored(turn.observation),
    }


def _runner_record(config: dict[str, Any], ran: dict[str, Any]) -> dict[str, Any]:
    record = dict(ran)
    if "episode" in record:
        record["episode_changes"] = spec_diff.changes(config, record.pop("episode"))
    return record


def runner_spec(config: dict[str, Any], result: dict[str, Any] | None) -> dict[str, Any] | None:
    """The episode spec as the worker ran it, from an episode's ``config`` and ``result`` (``None``: the run did not
    start). Rows stored before the record was kept as changes hold the spec whole."""
    runner = (result or {}).get("runner")
    if runner is None:
        return None
    if "episode" in runner:
        return runner["episode"]
    return spec_diff.apply(config, runner.get("episode_changes") or {})


def _reap_episode_containers(job_id: str, episode_id: str) -> int:
    """Remove the containers a dead run of this episode left behind (its labels name the episode)."""
    try:
        from sandbox.container import reap

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
        from agent_runner.model_cache import backend_for  # torch: loaded by the first run, not by importing this

        spec = worker_episode_spec(config, device=worker.device)
        check_episode_endpoint(spec, worker.allowed)
        labels = {**hooks.labels, "nexus-eval.job": job_id, "nexus-eval.episode": episode_id}
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
        # episode's config: runner_spec reads it whole), the sandbox, the backend's class and the device the model
        # is on (None: the run did not start)
        "runner": _runner_record(config, result.config) if result is not None else None,
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


def grade_report(graded) -> dict[str, Any]:
    """What is stored of a grade beside its status (``result["grade"]``): the tests, the tool's own report,
    and whether the task needs a network the grading container did not have."""
    return {
        "tests": graded.tests,
        "fail_to_pass": graded.fail_to_pass,
        "pass_to_pass": graded.pass_to_pass,
        "tool_report": graded.report,
        "needs_network": graded.needs_network,
    }


def grade_stored_episode(
    db: Database,
    episode_id: str,
    *,
    worker: WorkerContext = WorkerContext(),
    docker_check: Callable[[], str | None] | None = None,
) -> str | None:
    """Grade the stored patch of an episode awaiting its grade; returns the verdict, or None when there was
    nothing to grade (already graded, or another grader holds it: a duplicate message). ``worker``: the host's
    settings (its task sources and liveness; the rest is a run's). The grade is claimed and beats a heartbeat
    like a run (``db.liveness``).

    ``docker_check`` (``workers.faults.docker_gate.docker_down``): asked when grading ends in an infra failure; when it
    says Docker is down, nothing is recorded, the grade claim is given back and ``DockerDown`` is
    raised (the caller requeues the grade). Database outages raise :class:`DatabaseStillDown` likewise."""
    liveness = worker.liveness

    def claim_it():
        with db.session() as s:
            claim = claim_grade(s, episode_id, stale_after_s=liveness.stale_after_s)
            row = db_store.get_episode(s, episode_id)
            return claim, row.patch, dict(row.config or {}), row.job_id

    claim, patch, config, job_id = retrying(
        claim_it, budget_s=liveness.db_retry_s, what=f"claim the grade of {episode_id}"
    )
    if claim is None:
        return None

    def record(status: str, **fields: Any) -> None:
        def write() -> None:
            with db.session() as s:
                db_store.record_grade(s, episode_id, status, **fields)

        retrying(write, budget_s=liveness.db_retry_s, what=f"record the grade of {episode_id}")

    with Heartbeat(db, claim, every_s=liveness.heartbeat_s):
        try:
            from grading import grade
            from grading.hostlog import pack as pack_log

            if patch is None:
                raise RuntimeError("the agent stage left no patch (the diff could not be taken)")
            spec = EpisodeSpec.model_validate(config)
            tasks = worker.tasks or TaskCache()
            # the labels find a gone grader's box; the ceilings are the operator's, as when the task was loaded
            labels = spec.grade_config(job=job_id, episode=episode_id, ceilings=tasks.ceilings)
            graded = grade(tasks.task(spec), patch, config=labels)
        except Exception as exc:  # grading infrastructure broke: recorded, the agent's patch stays for a regrade
            graded, failure = None, f"grading failed: {type(exc).__name__}: {exc}"
            failed = status_of(interrupted=exc)
        else:
            failure = failed = None
    down = docker_check() if docker_check is not None and (graded is None or graded.status == "infra_failure") else None
    if down is not None:
        from workers.faults.docker_gate import DockerDown

        with db.session() as s:
            give_back(s, claim)
        raise DockerDown(f"grading {episode_id} was cut short: {down}; the grade is sent again")
    if graded is None:
        record(failed, error=failure)
        return failed
    record(
        graded.status,
        test_log=pack_log(graded.log),
        grader=graded.grader,
        grader_version=graded.grader_version,
        grade_s=graded.seconds,
        error=graded.error,
        report=grade_report(graded),
    )
    return graded.status


def regrade_job(db: Database, job_id: str, *, include_interactive: bool = False) -> list[tuple[str, str | None, str]]:
    """Re-derive every result attempt's verdict from its stored test log and patch (no agent, no container):
    each key's result attempt (``db.store.result_attempts``), or with ``include_interactive`` its newest interactive
    one.

    Returns ``(episode_id, old_status, new_status)`` for each episode that had a log; others are skipped."""
    from grading import regrade

    with db.session() as s:
        ids = [
            r.id
            for r in db_store.result_attempts(
                s, [db_store.get_job(s, job_id).id], include_interactive=include_interactive
            )
        ]
    changes, tasks = [], TaskCache()
    for episode_id in ids:  # one episode's log and patch in memory at a time, whatever the job's size
        with db.session() as s:
            r = db_store.get_episode(s, episode_id)
            old, patch, log, config = r.status, r.patch, r.test_log, dict(r.config or {})
        if not log and not (patch is not None and not patch.strip()):
            continue
        spec = EpisodeSpec.model_validate(config)
        graded = regrade(tasks.task(spec), log or "", patch or "", config=spec.grade_config())
        with db.session() as s:
            db_store.record_grade(
                s,
                episode_id,
                graded.status,
                test_log=log,
                grader=graded.grader,
                grader_version=graded.grader_version,
                error=graded.error,
                report=grade_report(graded),
                regrade=True,
            )
        changes.append((episode_id, old, graded.status))
    return changes
