"""Getting every episode to exactly one result after a fault: the sweeper, ``resume``, and infra retries.

The database is the source of truth; a broker message only starts work. After a crash, a lost send or an
outage, some rows wait for a message that will never come. This module finds them and sends them again:

- :func:`sweep` (every worker, every ``sweep_s``, on every broker): episodes whose holder is gone (heartbeat
  older than ``stale_after_s``, or a dead process of this pid namespace; ``db.liveness``) are handed back and
  sent again, runs to ``gpu`` and grades to ``grade``, and this host's containers that their run or grade no
  longer holds (finished, handed back, or taken over by another process on any host) are removed. With the
  embedded SQLite broker, which never redelivers a message its consumer took, the first sweep of a worker also
  sends every unsent row of every unfinished job (:func:`recover_at_start`). And on every broker, an agent exit
  whose grade nobody started for ``grade_resend_s`` has its grade sent again, once per that bound
  (:func:`resend_due_grades`): a hand-off the broker lost (issue 48) no longer leaves its job running. And a
  ``queued`` row whose message was taken by a worker that died before claiming it (waiting for Docker) is sent
  again (:func:`resend_taken`, ``db.taken_messages``), not left to the broker's visibility timeout (hours).
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
from db.liveness import due_grades, release, stranded, take_due_grade, unfinished_jobs, unsent
from db.models import AGENT_EXIT_STATUSES, AttemptDriver, Episode, EpisodeStatus, JobStatus, utcnow
from db.taken_messages import clear_taken, gone_takers, mark_again, take_back
from env.sandbox.config import EPISODE_LABEL, WORKER_LABEL
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
    resent_grades: list[str] = field(default_factory=list)  # grades nobody started for grade_resend_s, sent again
    ended: list[str] = field(default_factory=list)  # interactive reruns whose process is gone: infra_failure
    taken: list[str] = field(default_factory=list)  # queued runs whose message a gone worker took, sent again
    containers: int = 0  # containers removed

    def __bool__(self) -> bool:
        sent = self.sent_runs or self.sent_grades or self.resent_grades or self.taken
        return bool(self.runs or self.grades or sent or self.ended or self.containers)

    def describe(self) -> str:
        parts = [
            (len(self.runs), "run(s) taken over"),
            (len(self.grades), "grade(s) taken over"),
            (len(self.sent_runs), "queued run(s) sent again (a duplicate is a no-op)"),
            (len(self.sent_grades), "unstarted grade(s) sent again"),
            (len(self.resent_grades), "grade(s) nobody started sent again"),
            (len(self.taken), "queued run(s) whose message a gone worker took sent again"),
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
            if released is not None and released.run and not released.ended:
                clear_taken(s, [episode_id])  # sent again below: no message of it is taken now
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
    handed_back = {*out.runs, *out.grades, *out.taken}  # sent a moment ago
    runs = [i for i in todo.runs if i not in handed_back]
    with db.session() as s:
        clear_taken(s, runs)  # sent again below: no message of them is taken now
    for episode_id in runs:
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
    remove the containers their episodes' holders no longer hold (:func:`reap_lost_containers`)."""
    out = Recovered()
    _hand_back(db, liveness, None, out, send_run, send_grade)
    resend_taken(db, liveness, out, send_run)
    resend_due_grades(db, liveness, out, send_grade)
    if docker_up:
        out.containers += reap_lost_containers(db)
    return out


def resend_due_grades(db: Database, liveness: Liveness, out: Recovered, send_grade: Send) -> None:
    """Send again the grade of every agent exit nobody has started grading for ``liveness.grade_resend_s`` since it
    finished or its grade was last sent (``db.liveness.due_grades``): its hand-off may have been lost with the
    broker. Each is taken by a compare-and-swap first, so of all the sweepers one sends it, once per bound; a grade
    that is claimed, graded or sent within the bound is left alone (a duplicate would only find it claimed)."""
    with db.session() as s:
        due = due_grades(s, after_s=liveness.grade_resend_s)
    for episode_id in due:
        with db.session() as s:
            taken = take_due_grade(s, episode_id, after_s=liveness.grade_resend_s)
        if taken:
            after = liveness.grade_resend_s
            log.warning("episode %s: no grade started %.0f s after its hand-off; sent again", episode_id, after)
            send_grade(episode_id)
            out.resent_grades.append(episode_id)


def resend_taken(db: Database, liveness: Liveness, out: Recovered, send_run: Send) -> None:
    """Send again every ``queued`` row of an unfinished job whose message was taken by a worker that is gone before it
    claimed the row (``db.taken_messages.gone_takers``: its process is dead here, or its ``workers`` row is gone or
    older than ``worker_gone_after_s``). Each mark is cleared by a compare-and-swap first, so of all the sweepers
    one sends it; a send that fails puts the mark back for the next sweep."""
    with db.session() as s:
        gone = gone_takers(s, gone_after_s=liveness.worker_gone_after_s, now=utcnow())
    for taken in gone:
        with db.session() as s:
            if not take_back(s, taken):
                continue
        log.warning("episode %s: %s took its message and is gone; sent again", taken.episode_id, taken.taken_by)
        try:
            send_run(taken.episode_id)
        except Exception:
            with db.session() as s:
                mark_again(s, taken)
            raise
        out.taken.append(taken.episode_id)


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


def reap_lost_containers(db: Database) -> int:
    """Remove the containers (on this host's Docker daemon) of this database's episodes that their run or grade
    no longer holds: nobody holds the episode (not running, not being graded), or another process does (the
    container's ``nexus-eval.worker`` label names a claim that was taken over, on this host or another:
    :func:`lost_containers`). Each host's worker does this at its start (its first sweep) and every sweep, so a
    host that died and restarted, or that never saw its claim go, removes what it left. Containers of episodes
    this database does not know (another deployment, an ad-hoc grade) are left alone."""
    try:
        import docker
        from env.sandbox.reaping import remove_containers

        client = docker.from_env(timeout=30)
        boxes = client.containers.list(all=True, ignore_removed=True, filters={"label": EPISODE_LABEL})
        ids = {box.labels.get(EPISODE_LABEL) for box in boxes}
        with db.session() as s:
            rows = s.execute(
                select(Episode.id, Episode.status, Episode.claim_token, Episode.worker).where(Episode.id.in_(ids))
            )
            # held: running, or an agent exit being graded (its grading box); the holder is the claim's process
            holders = {
                i: worker if status == "running" or (status in AGENT_EXIT_STATUSES and token) else None
                for i, status, token, worker in rows
            }
        return remove_containers(lost_containers(boxes, holders))
    except Exception as exc:  # Docker went away mid-sweep: the next sweep tries again
        log.warning("could not remove finished episodes' containers: %s", exc)
        return 0


def lost_containers(boxes: list, holders: dict[str, str | None]) -> list:
    """The ``boxes`` whose episode (known to the database: a key of ``holders``, mapped to the process holding it,
    None when nobody does) is no longer held for them: nobody holds it, or the box's ``nexus-eval.worker`` label
    names another process than the holder. A box without that label (made before labels named the holder) is kept
    while anyone holds its episode; a box of an episode ``holders`` does not know is kept."""
    lost = []
    for box in boxes:
        episode = box.labels.get(EPISODE_LABEL)
        if episode not in holders:
            continue
        holder, made_for = holders[episode], box.labels.get(WORKER_LABEL)
        if holder is None or (made_for is not None and made_for != holder):
            lost.append(box)
    return lost
