"""Grading a stored episode: the ``grade`` queue's work after a run, and re-deriving verdicts from stored logs.

:func:`grade_stored_episode` grades the stored patch of an episode awaiting its grade in a fresh container; it is
claimed and beats a heartbeat like a run (``db.liveness``), so a duplicate message grades nothing and a gone
grader's claim is taken over. :func:`regrade_job` re-reads every stored test log without a container.
Kept apart from running (``workers.execution``): the agent stage and the grade stage are separate messages, on
separate queues, often on separate hosts.

Nothing here imports Celery; the tasks in :mod:`workers.celery_tasks` wrap these functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent_runner.config import EpisodeSpec
from agent_runner.status import status_of
from db import Database, job_rows
from db import store as db_store
from db.liveness import claim_grade, give_back
from env.tasks.task_cache import TaskCache
from workers.execution import WorkerContext
from workers.faults.db_retry import retrying
from workers.faults.heartbeat import Heartbeat


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
    raised (the caller requeues the grade). Database outages raise ``workers.faults.db_retry.DatabaseStillDown``
    likewise."""
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
            from env.grading import grade
            from env.grading.hostlog import pack as pack_log

            if patch is None:
                raise RuntimeError("the agent stage left no patch (the diff could not be taken)")
            spec = EpisodeSpec.model_validate(config)
            tasks = worker.tasks or TaskCache()
            # the labels find a gone grader's box; the ceilings are the operator's, as when the task was loaded
            labels = spec.grade_config(job=job_id, episode=episode_id, ceilings=tasks.ceilings, worker=claim.worker)
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
    from env.grading import regrade

    with db.session() as s:
        ids = [
            r.id
            for r in db_store.result_attempts(
                s, [job_rows.get_job(s, job_id).id], include_interactive=include_interactive
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
