"""Getting every episode to exactly one result after a fault: the sweeper, ``resume``, and infra retries.

The database is the source of truth; a broker message only starts work. After a crash, a lost send or an
outage, some rows wait for a message that will never come. This module finds them and sends them again:

- :func:`sweep` (every worker, every ``sweep_s``, on every broker): episodes whose holder is gone (heartbeat
  older than ``stale_after_s``, or a dead process on this host; ``db.liveness``) are handed back and sent
  again, runs to ``gpu`` and grades to ``grade``, and containers of episodes that are no longer running are
  removed. With the embedded SQLite broker, which never redelivers a message its consumer took, the first
  sweep of a worker also sends every unsent row of every unfinished job (:func:`recover_at_start`).
- :func:`resume_job` (``nexus-eval resume JOB``): the same for one job, plus its ``queued`` rows and agent
  exits awaiting a grade nobody started; then the job's status is recomputed from its episodes.
- :func:`retry_infra_failure`: an ``infra_failure`` is followed by a new attempt (the failed one is kept, so
  the denominator stays honest), up to ``infra_retries`` in a row per episode key; not one whose
  ``result[NOT_RETRIED]`` says a new attempt would only repeat it (an endpoint the operator's settings refuse).

Sending twice is harmless (the claim decides who runs an episode), so every step here is idempotent.
Senders are passed in (``send_run``, ``send_grade``): this module does not import Celery.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import select

from db import Database, job_rows
from db import store as db_store
from db.claims import lock_job
from db.connection import begin_write
from db.job_status import refresh_job_status
from db.liveness import release, stranded, unfinished_jobs, unsent
from db.models import AGENT_EXIT_STATUSES, AttemptDriver, Episode, EpisodeStatus, JobStatus
from jobs.control import UNSENT_NOTE
from jobs.settings import Liveness

#: ``episodes.result`` key of an infra failure a new attempt would only repeat (its value says why)
NOT_RETRIED = "not_retried"

log = logging.getLogger(__name__)
Send = Callable[[str], object]
#: the prefix of ``jobs.error`` when a job's messages could not all be sent (``resume`` clears it)


@dataclass
class Recovered:
    """What one sweep or resume did."""

    runs: list[str] = field(default_factory=list)  # runs handed back from a gone holder and sent again
    grades: list[str] = field(default_factory=list)  # grades handed back and sent again
    sent_runs: list[str] = field(default_factory=list)  # unsent queued rows sent
    sent_grades: list[str] = field(default_factory=list)  # unstarted grades sent
    ended: list[str] = field(default_factory=list)  # interactive reruns whose process is gone: infra_failure
    containers: int = 0  # containers removed

    def __bool__(self) -> bool:
        return bool(self.runs or self.grades or self.sent_runs or self.sent_grades or self.ended or self.containers)

    def describe(self) -> str:
        parts = [
            (len(self.runs), "run(s) taken over"),
            (len(self.grades), "grade(s) taken over"),
            (len(self.sent_runs), "queued run(s) sent again (a duplicate is a no-op)"),
            (len(self.sent_grades), "unstarted grade(s) sent again"),
            (len(self.ended), "interactive rerun(s) ended"),
            (self.containers, "container(s) removed"),
        ]
        return ", ".join(f"{n} {what}" for n, what in parts if n) or "nothing to recover"


def _hand_back(
    db: Database, liveness: Liveness, job_id: str | None, out: Recovered, send_run: Send, send_grade: Send
) -> None:
    with db.session() as s:
        gone = stranded(s, stale_after_s=liveness.stale_after_s, job_id=job_id)
    for episode_id in gone:
        with db.session() as s:
            released = release(s, episode_id, stale_after_s=liveness.stale_after_s)
        if released is None:  # another sweeper got it, or its holder beat meanwhile
            continue
        if released.ended:
            log.warning(
                "episode %s: its interactive rerun %s is gone; ended as infra_failure", episode_id, released.holder
            )
            out.ended.append(episode_id)
            continue
        what = "run" if released.run else "grade"
        log.warning("episode %s: its %s's holder %s is gone; sent again", episode_id, what, released.holder)
        out.containers += reap_episode_containers(db, episode_id)
        (send_run if released.run else send_grade)(episode_id)
        (out.runs if released.run else out.grades).append(episode_id)


def _send_unsent(
    db: Database, job_ids: list[str], out: Recovered, send_run: Send, send_grade: Send, *, sent_before: bool = False
) -> None:
    with db.session() as s:
        todo = unsent(s, job_ids, sent_before=sent_before)
    handed_back = {*out.runs, *out.grades}  # sent a moment ago
    for episode_id in (i for i in todo.runs if i not in handed_back):
        send_run(episode_id)
        out.sent_runs.append(episode_id)
    for episode_id in (i for i in todo.grades if i not in handed_back):
        send_grade(episode_id)
        out.sent_grades.append(episode_id)


def sweep(
    db: Database,
    liveness: Liveness,
    *,
    send_run: Send,
    send_grade: Send,
    docker_up: bool = True,
) -> Recovered:
    """One sweep over every job: hand back and resend what a gone holder left, and (when Docker answers)
    remove the containers of episodes that are no longer running."""
    out = Recovered()
    _hand_back(db, liveness, None, out, send_run, send_grade)
    if docker_up:
        out.containers += reap_finished_containers(db)
    return out


def recover_at_start(
    db: Database, liveness: Liveness, *, send_run: Send, send_grade: Send, embedded: bool
) -> Recovered:
    """A worker's first sweep. On the embedded broker (one consumer, which may have been killed holding a
    message it will never get back) also send again every queued row of an unfinished job that was sent once,
    and every grade nobody started. Rows stored and never sent wait for ``resume``."""
    out = sweep(db, liveness, send_run=send_run, send_grade=send_grade)
    if embedded:
        with db.session() as s:
            jobs = unfinished_jobs(s)
        _send_unsent(db, jobs, out, send_run, send_grade, sent_before=True)
    return out


def resume_job(db: Database, job_id: str, liveness: Liveness, *, send_run: Send, send_grade: Send) -> Recovered:
    """Send again every episode of ``job_id`` that no live message or holder will finish: runs and grades
    whose holder is gone, ``queued`` rows, agent exits whose grade nobody started. Idempotent. Clears the
    job's "not all episodes were sent" note and recomputes its status. ``LookupError`` for an unknown job."""
    with db.session() as s:
        job_id = job_rows.get_job(s, job_id).id
    out = Recovered()
    _hand_back(db, liveness, job_id, out, send_run, send_grade)
    _send_unsent(db, [job_id], out, send_run, send_grade)
    with db.session() as s:
        begin_write(s)
        job = lock_job(s, job_id)
        if job.error and job.error.startswith(UNSENT_NOTE):
            job.error = None
        if job.status == JobStatus.failed:  # a failed send: the episodes say where the job is
            job.status = JobStatus.running.value
        refresh_job_status(s, job_id)
    return out


def retry_infra_failure(db: Database, episode_id: str, *, retries: int, send_run: Send) -> str | None:
    """A new attempt for ``episode_id`` when it is its key's newest attempt, an ``infra_failure`` the service
    ran (not an interactive rerun), and fewer than ``retries`` infra failures in a row precede it; the new
    row is sent and its id returned (``result["retry_of"]`` names the failed attempt). Else ``None``."""
    with db.session() as s:
        begin_write(s)
        row = db_store.get_episode(s, episode_id)
        job = lock_job(s, row.job_id)
        s.refresh(row)
        if row.status != EpisodeStatus.infra_failure or row.driver != AttemptDriver.agent or job.status == "cancelled":
            return None
        if (row.result or {}).get(NOT_RETRIED):
            return None
        attempts = s.execute(
            select(Episode)
            .where(Episode.job_id == row.job_id, Episode.episode_key == row.episode_key)
            .order_by(Episode.attempt.desc())
        ).scalars()
        in_a_row = 0
        for i, attempt in enumerate(attempts):
            if i == 0 and attempt.id != row.id:
                return None  # a newer attempt exists already
            if attempt.status != EpisodeStatus.infra_failure or attempt.driver != AttemptDriver.agent:
                break
            in_a_row += 1
        if in_a_row > retries:
            return None
        new = db_store.new_attempt(s, row.id)
        new.result = {"retry_of": row.id, "retry": in_a_row}
        new_id = new.id
    log.warning("episode %s: infra_failure, retry %d of %d as %s", episode_id, in_a_row, retries, new_id)
    send_run(new_id)
    return new_id


def reap_episode_containers(db: Database, episode_id: str) -> int:
    """Remove the containers a gone run of ``episode_id`` left behind (labelled with its job and id)."""
    try:
        from env.sandbox.reaping import reap

        with db.session() as s:
            job_id = db_store.get_episode(s, episode_id).job_id
        return reap(older_than_s=0, label_filter={"nexus-eval.job": job_id, "nexus-eval.episode": episode_id})
    except Exception as exc:  # no Docker now: the sweep after it returns removes them
        log.warning("could not remove the containers of episode %s: %s", episode_id, exc)
        return 0


def reap_finished_containers(db: Database) -> int:
    """Remove the containers of this database's episodes that nobody holds (left behind when Docker
    restarted under a run, or when a worker died): not running, not being graded. Containers of episodes this
    database does not know (another deployment, an ad-hoc grade) are left alone."""
    try:
        import docker
        from env.sandbox.reaping import remove_containers

        client = docker.from_env(timeout=30)
        boxes = client.containers.list(all=True, ignore_removed=True, filters={"label": "nexus-eval.episode"})
        ids = {box.labels.get("nexus-eval.episode") for box in boxes}
        with db.session() as s:
            rows = s.execute(select(Episode.id, Episode.status, Episode.claim_token).where(Episode.id.in_(ids)))
            # held: running, or an agent exit being graded (its grading box, and the agent's until then)
            known = {i: status == "running" or (status in AGENT_EXIT_STATUSES and token) for i, status, token in rows}
        return remove_containers([box for box in boxes if known.get(box.labels.get("nexus-eval.episode")) is False])
    except Exception as exc:  # Docker went away mid-sweep: the next sweep tries again
        log.warning("could not remove finished episodes' containers: %s", exc)
        return 0
