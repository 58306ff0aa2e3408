"""A job's progress while ``run`` (and ``status --watch``) waits for it, by the rule of ``_progress.live``.

On a terminal: the job's status table (``workers.embedded.progress_table``), redrawn live. Anywhere else (a
pipe, a log file): one line per attempt as it ends, then the status table once, e.g.::

    [3/10] unresolved nexus prefill_decode true_eviction humanfmt__humanfmt-1 seed 0 (1 resolved, 2 unresolved, 7 left)
    [10/10] resample: resolved dense prefill_decode true_eviction humanfmt__humanfmt-1 seed 0 attempt 2 (...)

that is ``[ended/episodes] STATUS METHOD SCOPE PROTOCOL TASK seed SEED`` (`` attempt N`` after a retry), then
the counts so far: resolved always, each other end status that occurred, and how many are left. The counts are
those of each key's result attempt, by the rule ``compare`` counts by (``db.attempt_roles``); an attempt kept
apart from the results (a resample, an interactive or steered attempt) gets its own line, marked with its role,
and counts in none of them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from db import progress as db_progress
from db.models import EpisodeStatus
from nexus_eval.commands._progress import line, live, say
from workers.embedded import ENDED_STATUSES, progress_table, wait_for_job

if TYPE_CHECKING:
    from db import Database
    from workers.embedded import EmbeddedWorker


@dataclass(frozen=True)
class Attempt:
    """What a progress line says about one episode attempt (read out of its row)."""

    id: str
    status: str
    method: str
    scope: str
    protocol: str
    task_id: str
    seed: int
    attempt: int = 1
    role: str = "result"

    @classmethod
    def of(cls, row: Any) -> Attempt:
        return cls(**{f.name: getattr(row, f.name) for f in fields(cls) if f.name != "role"})


def counts_text(counts: Counter, left: int) -> str:
    """``1 resolved, 2 unresolved, 7 left``: resolved always, every other end status that occurred (in
    ``EpisodeStatus`` order), and how many attempts have not ended."""
    others = [f"{counts[s]} {s}" for s in EpisodeStatus if s != "resolved" and counts[s]]
    return ", ".join([f"{counts['resolved']} resolved", *others, f"{left} left"])


def attempt_line(attempt: Attempt, counts: Counter, total: int) -> str:
    """The progress line of ``attempt``, which just ended; ``counts``: the end statuses so far, it included."""
    retry = f" attempt {attempt.attempt}" if attempt.attempt > 1 else ""
    apart = f"{attempt.role}: " if attempt.role != "result" else ""
    what = f"{apart}{attempt.status} {attempt.method} {attempt.scope} {attempt.protocol} {attempt.task_id}"
    done = sum(counts.values())
    return line(done, total, f"{what} seed {attempt.seed}{retry} ({counts_text(counts, total - done)})")


class EndedLines:
    """Says each attempt once, when it ends: :meth:`report` takes the attempts a view shows (each key's result and
    the attempts kept apart), poll after poll.

    A poll (:meth:`poll`) reads three short columns per attempt (id, status, role) and the shown fields of only the
    attempts that ended since the last poll, so a 12,800-episode job's log line costs milliseconds, not whole rows."""

    def __init__(self, console: Any) -> None:
        self.console = console
        self.said: set[str] = set()

    def report(self, attempts: list[Attempt]) -> None:
        by_id = {a.id: a for a in attempts}
        statuses = [(a.id, a.status, a.role) for a in attempts]
        self._report(statuses, lambda ids: {i: by_id[i] for i in ids})

    def poll(self, database: Database, job_id: str) -> None:
        shown = [f.name for f in fields(Attempt) if f.name not in ("id", "role")]  # id first, the rest in row order
        with database.session() as s:

            def details(ids: list[str]) -> dict[str, Attempt]:
                rows = db_progress.attempt_fields(s, ids, shown)
                return {i: Attempt(i, *rows[i]) for i in ids}

            self._report(db_progress.shown_statuses(s, job_id), details)

    def _report(self, statuses: list[tuple[str, str, str]], details: Callable[[list[str]], dict[str, Attempt]]) -> None:
        """``statuses``: (id, status, role) of every attempt shown, by key; ``details``: the Attempts of some ids."""
        keys = sum(1 for _i, _status, role in statuses if role == "result")
        ended = [(i, status, role) for i, status, role in statuses if status in ENDED_STATUSES]
        # a result attempt said before counts; one that is no longer its key's result (a retry replaced it) not
        counts = Counter(status for i, status, role in ended if i in self.said and role == "result")
        new = [(i, status, role) for i, status, role in ended if i not in self.said]
        shown = details([i for i, _, _ in new]) if new else {}
        for i, status, role in new:
            attempt = replace(shown[i], status=status, role=role)  # the status this poll read, as the counts do
            self.said.add(i)
            if role == "result":
                counts[status] += 1
            say(self.console, attempt_line(attempt, counts, keys))


def watch_job(
    database: Database, job_id: str, console: Any, *, worker: EmbeddedWorker | None = None, timeout: float | None = None
) -> bool:
    """Show the job's progress on ``console`` until it is finished (``workers.embedded.wait_for_job``: False on
    timeout or when ``worker`` died first). Ends with the status table and a newline either way."""
    if live(console):
        from rich.live import Live

        with Live(progress_table(database, job_id), console=console, refresh_per_second=2) as display:

            def redraw() -> None:
                display.update(progress_table(database, job_id))

            return wait_for_job(database, job_id, on_poll=redraw, worker=worker, timeout=timeout)
    lines = EndedLines(console)
    finished = wait_for_job(
        database, job_id, on_poll=lambda: lines.poll(database, job_id), worker=worker, timeout=timeout
    )
    console.print(progress_table(database, job_id))
    return finished
