"""Finishing an episode attempt: the run's result (``finish_episode``), a failure recorded from outside the run
(``fail_running_episode``) and the grade (``record_grade``), each with the summaries of the stored turns.

The second half of the claim contract of :mod:`db.claims`: a result is written only while the run's claim still
holds, a grade only over an agent exit (or on purpose, ``regrade=True``), so a redelivered message changes nothing.
Each write also fills the episode's summaries of its turns (:func:`turn_totals`), so no job-level read loads turns
(``results.cost``). Like :mod:`db.claims`, functions write in the caller's session and do not commit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from db.claims import Claim, expire_loaded, lock_episode_job, lock_job
from db.connection import begin_write
from db.job_status import refresh_job_status
from db.models import (
    AGENT_EXIT_STATUSES,
    FINISH_STATUSES,
    GRADE_STATUSES,
    RUN_FAILURE_STATUSES,
    VERDICT_STATUSES,
    Episode,
    EpisodeStatus,
    Turn,
    utcnow,
)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def turn_means(turns: Iterable[tuple[int | None, dict[str, Any] | None, int | None]]) -> dict[str, float | None]:
    """``(kv_held_bytes, physical_after, logical_length)`` of an episode's turns, in turn order -> the episode's
    summaries (``results.cost``): ``mean_kv_held_bytes``, the mean of ``kv_held_bytes`` over the turns that report
    it; ``kept_fraction``, the mean of ``physical_after["mean"] / logical_length`` over the turns that report both
    (``None`` when none does, never 0)."""
    held: list[float] = []
    kept: list[float] = []
    for kv_held_bytes, physical_after, logical_length in turns:
        if kv_held_bytes is not None:
            held.append(float(kv_held_bytes))
        slots = (physical_after or {}).get("mean")
        if slots is not None and logical_length:
            kept.append(float(slots) / logical_length)
    return {"mean_kv_held_bytes": _mean(held), "kept_fraction": _mean(kept)}


def turn_totals(session: Session, episode_id: str) -> dict[str, Any]:
    """Sums over the episode's stored turns, its KV peaks (the largest of its turns' peaks, ``None`` when no turn
    reported one) and :func:`turn_means`: every summary a job-level read needs, written with the episode so no
    read loads its turns."""
    n, prompt, appended, generated, peak_held, peak_allocated = session.execute(
        select(
            func.count(Turn.id),
            func.sum(Turn.prompt_tokens),
            func.sum(Turn.tokens_appended),
            func.sum(Turn.tokens_generated),
            func.max(Turn.kv_peak_held_bytes),
            func.max(Turn.kv_peak_allocated_bytes),
        ).where(Turn.episode_id == episode_id)
    ).one()
    means = turn_means(
        session.execute(
            select(Turn.kv_held_bytes, Turn.physical_after, Turn.logical_length)
            .where(Turn.episode_id == episode_id)
            .order_by(Turn.index)
        )
    )
    return {
        "n_turns": n,
        "prompt_tokens": prompt or 0,
        "appended_tokens": appended or 0,
        "generated_tokens": generated or 0,
        "kv_peak_held_bytes": peak_held,
        "kv_peak_allocated_bytes": peak_allocated,
        **means,
    }


FINISH_FIELDS = frozenset(
    {
        "exit_status",
        "error",
        "patch",
        "test_log",
        "grader",
        "grader_version",
        "agent_s",
        "grade_s",
        "wall_s",
        "prompt_tokens",
        "appended_tokens",
        "generated_tokens",
        "n_turns",
        "kv_peak_held_bytes",
        "kv_peak_allocated_bytes",
        "mean_kv_held_bytes",
        "kept_fraction",
        "retention",
        "result",
        "config",
    }
)


def finish_episode(session: Session, claim: Claim, status: str, **fields: Any) -> bool:
    """Write the run's result if ``claim`` still holds; ``True`` when written, ``False`` when the episode
    already has a result (a duplicate delivery), was cancelled, or was taken over.

    ``status``: an agent exit (``submitted`` ... ``format_error_limit``: a grade may follow), a grade status
    when graded in-line, ``timeout`` or ``infra_failure`` (then give ``error``). ``fields``: see
    ``FINISH_FIELDS``; token totals, ``n_turns``, ``kv_peak_held_bytes`` and ``kv_peak_allocated_bytes`` default
    to sums/maxima over the stored turns (the episode's KV peaks are the largest of its turns' peaks).
    """
    if status not in FINISH_STATUSES:
        raise ValueError(f"finish_episode: status {status!r} is not one of {sorted(FINISH_STATUSES)}")
    unknown = sorted(set(fields) - FINISH_FIELDS)
    if unknown:
        raise TypeError(f"finish_episode: unknown field(s) {unknown}; known: {sorted(FINISH_FIELDS)}")
    begin_write(session)
    lock_job(session, claim.job_id)
    now = utcnow()
    values = {**turn_totals(session, claim.episode_id), **fields, "status": status, "finished_at": now}
    if status in GRADE_STATUSES:
        values.setdefault("graded_at", now)
    if status in AGENT_EXIT_STATUSES:  # the run lets go; a grader claims the row next (db.liveness.claim_grade)
        values.update(claim_token=None, heartbeat_at=None)
    written = session.execute(
        update(Episode)
        .where(Episode.id == claim.episode_id, Episode.status == "running", Episode.claim_token == claim.token)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if written.rowcount != 1:
        return False
    expire_loaded(session, {claim.episode_id})
    refresh_job_status(session, claim.job_id, moved=[(claim.episode_id, EpisodeStatus.running.value, status)])
    return True


def fail_running_episode(
    session: Session, episode_id: str, status: str, error: str, *, claim_token: str | None = None
) -> bool:
    """Record ``status`` (``timeout``/``infra_failure``) with ``error`` for an episode that is still
    ``running`` (and, if given, still under ``claim_token``). For failure handlers that run outside the
    worker that held the claim, e.g. after a hard time limit killed it. ``True`` when written."""
    if status not in RUN_FAILURE_STATUSES:
        raise ValueError(f"fail_running_episode: status must be timeout or infra_failure, not {status!r}")
    job_id = lock_episode_job(session, episode_id).id
    conditions = [Episode.id == episode_id, Episode.status == "running"]
    if claim_token is not None:
        conditions.append(Episode.claim_token == claim_token)
    values = {**turn_totals(session, episode_id), "status": status, "error": error, "finished_at": utcnow()}
    written = session.execute(
        update(Episode).where(*conditions).values(**values).execution_options(synchronize_session=False)
    )
    if written.rowcount != 1:
        return False
    expire_loaded(session, {episode_id})
    refresh_job_status(session, job_id, moved=[(episode_id, EpisodeStatus.running.value, status)])
    return True


def record_grade(
    session: Session,
    episode_id: str,
    status: str,
    *,
    test_log: str | None = None,
    grader: str | None = None,
    grader_version: str | None = None,
    grade_s: float | None = None,
    error: str | None = None,
    report: dict[str, Any] | None = None,
    regrade: bool = False,
) -> bool:
    """Record a grading verdict (``resolved``/``unresolved``/``empty_patch``/``patch_failed``, or
    ``infra_failure`` when grading itself failed) over an agent exit status. With ``regrade=True`` an
    earlier verdict is replaced (``regrade JOB``). ``report`` is stored as ``result["grade"]``.
    Returns ``False`` (and writes nothing) when the episode is not awaiting a grade."""
    if status not in VERDICT_STATUSES:
        raise ValueError(f"record_grade: status {status!r} is not one of {sorted(VERDICT_STATUSES)}")
    job_id = lock_episode_job(session, episode_id).id
    gradable = set(AGENT_EXIT_STATUSES)
    if regrade:
        gradable |= VERDICT_STATUSES
    row = session.execute(
        select(Episode).where(Episode.id == episode_id).execution_options(populate_existing=True)
    ).scalar_one()
    # A regrade of an infra_failure only makes sense when the agent left a patch behind.
    if row.status not in gradable or (row.status == "infra_failure" and row.exit_status is None):
        return False
    result = dict(row.result or {})
    if report is not None:
        result["grade"] = report
    # The agent stage's reason comes first and stays: a grade adds its own after it, a regrade replaces only
    # the grade's. (A row graded before the agent's reason was kept has none to keep.)
    if row.status in AGENT_EXIT_STATUSES and row.error:
        result["agent_error"] = row.error
    error = "\n".join(part for part in (result.get("agent_error"), error) if part) or None
    before = row.status
    written = session.execute(
        update(Episode)
        .where(Episode.id == episode_id, Episode.status == row.status)
        .values(
            status=status,
            test_log=test_log,
            grader=grader,
            grader_version=grader_version,
            grade_s=grade_s,
            error=error,
            result=result,
            graded_at=utcnow(),
        )
        .execution_options(synchronize_session=False)
    )
    if written.rowcount != 1:
        return False
    expire_loaded(session, {episode_id})
    refresh_job_status(session, job_id, moved=[(episode_id, before, status)])
    return True
