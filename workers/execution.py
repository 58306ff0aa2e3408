"""Running and grading one stored episode: the code every service path shares (Celery task, embedded, interactive).

:func:`execute_episode` is claim -> ``agent_runner.episode.run_episode`` (with an ``on_turn`` that stores each
turn) -> finish. It is idempotent through ``db.claims``: a duplicate or redelivered message gets no claim and
does nothing. :func:`grade_stored_episode` grades the stored patch in a fresh container (the ``grade`` queue).

Nothing here imports Celery; the tasks in :mod:`workers.celery_tasks` wrap these functions.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent_runner.backends.openai import AllowedEndpoints, EndpointNotAllowed, OpenAIConfig
from agent_runner.config import EpisodeSpec
from db import Database
from db import store as db_store
from db.liveness import claim_grade, give_back
from db.models import AGENT_EXIT_STATUSES, EpisodeStatus
from nexus.presets import stored_settings
from workers.db_retry import DatabaseUnavailable, retrying
from workers.heartbeat import LIVENESS, Heartbeat, Liveness
from workers.recovery import NOT_RETRIED
from workers.task_cache import TaskCache

if TYPE_CHECKING:
    from agent_runner.agent import Intervene
    from agent_runner.backends import Model
    from agent_runner.environment import Environment
    from agent_runner.records import TurnRecord


class SoftTimeout(Exception):
    """Raised into the agent loop (from ``on_turn``) when the episode's own soft deadline has passed."""


@dataclass(frozen=True)
class EpisodeHooks:
    """What a caller may add around one run; every field is optional.

    progress:         receives ``{"turn", "max_steps", "action"}`` after each stored turn (Celery's PROGRESS).
    wrap_model:       ``wrap_model(model)`` returns the backend to use (``--from-turn``: ``ForcedPrefix``).
    on_turn:          sees each TurnRecord after it is stored (the interactive operator prints it).
    intervene:        may replace an action before it runs (``agent_runner.agent.Intervene``).
    open_environment: replaces ``DockerEnvironment.open`` (the interactive rerun wraps it).
    time_limits:      exception types that mean "out of time" when raised into the run (Celery's
                      ``SoftTimeLimitExceeded``); the run is then stored as ``timeout``, like :class:`SoftTimeout`.
    """

    progress: Callable[[dict[str, Any]], None] | None = None
    wrap_model: Callable[[Model], Model] | None = None
    on_turn: Callable[[TurnRecord], Any] | None = None
    intervene: Intervene | None = None
    open_environment: Callable[..., Environment] | None = None
    time_limits: tuple[type[BaseException], ...] = ()


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
    """The stored per-episode config (an ``EpisodeSpec`` dump, see ``workers.spec.JobSpec.episode_config``) ->
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


#: the turn fields that have columns of their own (``db.models.Turn``), beside the completion's
_TURN_COLUMNS = {"index", "completion", "thought", "action", "observation", "env_s"}
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
    fields queried by SQL are columns, every other field of the turn and of its completion goes into ``extra``
    under its own name (a field added to either model is stored without a change here), the backend's own
    ``Completion.extra`` under ``backend``."""
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
        "extra": {
            **turn.model_dump(mode="json", exclude=_TURN_COLUMNS),
            **{k: v for k, v in dumped.items() if k not in _COMPLETION_COLUMNS and k != "extra"},
            "backend": dumped["extra"],
        },
    }


def _reap_episode_containers(job_id: str, episode_id: str) -> int:
    """Remove the containers a dead run of this episode left behind (its labels name the episode)."""
    try:
        from env.sandbox import reap

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
    tasks: TaskCache | None = None,
    celery_task_id: str | None = None,
    soft_deadline_s: float | None = None,
    liveness: Liveness = LIVENESS,
    episodes_per_gpu: int = 1,
    device: str | None = None,
    hooks: EpisodeHooks = EpisodeHooks(),
    allowed: AllowedEndpoints = AllowedEndpoints(),
) -> ExecutionOutcome:
    """Claim, run and finish ``episode_id``. Never raises for episode failures (they become statuses).

    ``tasks``: the worker process's task sources (default: a fresh cache, so this one episode loads its own).
    ``soft_deadline_s``: seconds from now after which the run stops at its next turn and is stored as
    ``timeout`` with its partial trajectory (so does any of ``hooks.time_limits`` raised into the run).
    ``liveness``: the heartbeat this run beats while it holds the episode, the bound after which a silent
    holder's row is taken over, and how long each database call is retried (then :class:`DatabaseUnavailable`
    is raised: the caller requeues its message; nothing was acknowledged into nothing).
    ``episodes_per_gpu``: > 1 decodes this episode together with the process's other episodes (a multi-episode
    worker; see ``agent_runner.model_cache.backend_for``). ``device``: the worker host's device for the model.
    ``allowed``: where the worker lets an openai episode send requests (``ServiceSettings.openai_allowed``);
    an openai episode whose endpoint they refuse ends as ``infra_failure`` naming why, before any request.
    """
    started = time.monotonic()
    timings: dict[str, float] = {}

    def claim_it():
        with db.session() as s:
            claim = db_store.claim_episode(
                s, episode_id, celery_task_id=celery_task_id, stale_after_s=liveness.stale_after_s
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
    deadline = None if soft_deadline_s is None else time.monotonic() + soft_deadline_s

    def store_turn(turn: TurnRecord) -> None:
        with db.session() as s:
            db_store.record_turn(s, claim, turn.index, **turn_row(turn))

    def persist(turn: TurnRecord) -> None:
        t0 = time.monotonic()
        try:
            retrying(lambda: store_turn(turn), budget_s=liveness.db_retry_s, what=f"turn {turn.index} of {episode_id}")
        except DatabaseUnavailable as exc:
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
        from agent_runner.episode import run_episode

        spec = worker_episode_spec(config, device=device)
        check_episode_endpoint(spec, allowed)
        with Heartbeat(db, claim, every_s=liveness.heartbeat_s):
            result = run_episode(
                spec,
                task=(tasks or TaskCache()).task(spec),
                episodes_per_gpu=episodes_per_gpu,
                wrap_model=hooks.wrap_model,
                labels={"nexus-eval.job": job_id, "nexus-eval.episode": episode_id},
                on_turn=persist,
                intervene=hooks.intervene,
                open_environment=hooks.open_environment,
            )
        interrupted = result.exception
    except BaseException as exc:  # noqa: BLE001 - a time limit, a bad config, a broken model host
        error = f"{type(exc).__name__}: {exc}\n" + "".join(traceback.format_exception(exc)).strip()
        interrupted = exc
        if not isinstance(exc, (Exception, *out_of_time)):
            raise  # KeyboardInterrupt / SystemExit (warm shutdown): the message is redelivered
    timings["run_s"] = time.monotonic() - started - timings["claim_s"]

    fields: dict[str, Any] = {"wall_s": time.monotonic() - started}
    if result is not None:
        status = result.exit_status
        agent_s = result.timings.get("agent_s")
        fields.update(exit_status=result.exit_status, error=result.error, patch=result.patch, agent_s=agent_s)
        fields["retention"] = result.retention  # the final cache's retention map (None without a cache)
    else:
        status, fields["error"] = EpisodeStatus.infra_failure, error
    if isinstance(interrupted, out_of_time):
        status = EpisodeStatus.timeout
        fields["error"] = f"soft time limit reached; partial trajectory kept\n{fields.get('error') or ''}".strip()
    timings["db_turns_s"] = state["db_s"]
    fields["result"] = {
        **{k: noted[k] for k in ("retry_of", "retry") if k in noted},  # set on an automatic retry's row
        "service_timings": dict(timings),
        "episode_timings": dict(result.timings) if result else {},
        "took_over_from": claim.took_over_from,
        "worker": claim.worker,  # `episodes.worker` names the grader once a grade is claimed
        "scaffold": result.scaffold.model_dump(mode="json") if result is not None and result.scaffold else None,
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
    tasks: TaskCache | None = None,
    liveness: Liveness = LIVENESS,
    engine_check: Callable[[], str | None] | None = None,
) -> str | None:
    """Grade the stored patch of an episode awaiting its grade; returns the verdict, or None when there was
    nothing to grade (already graded, or another grader holds it: a duplicate message). ``tasks``: the
    worker's task sources. The grade is claimed and beats a heartbeat like a run (``db.liveness``).

    ``engine_check`` (``workers.docker_gate.engine_down``): asked when grading ends in an infra failure; when it
    says the Docker engine is down, nothing is recorded, the grade claim is given back and ``EngineDown`` is
    raised (the caller requeues the grade). Database outages raise :class:`DatabaseUnavailable` likewise."""

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
            from env.grading import grade
            from env.grading.hostlog import pack as pack_log

            if patch is None:
                raise RuntimeError("the agent stage left no patch (the diff could not be taken)")
            spec = EpisodeSpec.model_validate(config)
            tasks = tasks or TaskCache()
            # the labels find a gone grader's box; the ceilings are the operator's, as when the task was loaded
            labels = spec.grade_config(job=job_id, episode=episode_id, ceilings=tasks.ceilings)
            graded = grade(tasks.task(spec), patch, config=labels)
        except Exception as exc:  # grading infrastructure broke: recorded, the agent's patch stays for a regrade
            graded, failure = None, f"grading failed: {type(exc).__name__}: {exc}"
        else:
            failure = None
    down = engine_check() if engine_check is not None and (graded is None or graded.status == "infra_failure") else None
    if down is not None:
        from workers.docker_gate import EngineDown

        with db.session() as s:
            give_back(s, claim)
        raise EngineDown(f"grading {episode_id} was cut short: {down}; the grade is sent again")
    if graded is None:
        record("infra_failure", error=failure)
        return "infra_failure"
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
    from env.grading import regrade

    with db.session() as s:
        rows = [
            (r.id, r.status, r.patch, r.test_log, dict(r.config or {}))
            for r in db_store.result_attempts(
                s, [db_store.get_job(s, job_id).id], include_interactive=include_interactive
            )
        ]
    changes, tasks = [], TaskCache()
    for episode_id, old, patch, log, config in rows:
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
