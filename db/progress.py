"""What a job's progress displays read: counts and a few narrow columns, never whole episode rows.

``status``, ``status --watch`` and ``run`` redraw a job's progress every second, and a Table-3 job holds 12,800
episode keys: loading every attempt as an ``Episode`` (its config, its timings...) on every redraw costs seconds
and hundreds of MB. The displays show counts per (method, scope, protocol, status) of each key's *result* attempt,
the attempts kept apart from the results (resamples, interactive and steered attempts) as their own counts, the
attempts that just ended, and the reasons runs failed: all by the one result rule of ``db.attempt_roles``, as
``compare`` counts; each is one SQL statement here (a GROUP BY over the covering index
``ix_episodes_job_key_attempt``, or a SELECT of the few columns shown).

Order: the displays list attempts in the order Python sorts their episode keys (code points). SQLite compares text
that way; PostgreSQL's default collation may not (a locale collation skips punctuation), so the SQL orders by
the ``"C"`` collation there (:func:`by_code_point`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db.attempt_roles import result_attempt_numbers, with_roles
from db.models import Episode
from db.store import at_numbers

#: a display row's group: (method, scope, protocol)
Group = tuple[str, str, str]
#: how many ids go into one ``IN (...)`` list
ID_CHUNK = 500


def by_code_point(session: Session, column: Any) -> Any:
    """``column`` to ORDER BY or MIN() in Python's order of ``str`` (code points), whatever the database."""
    return column.collate("C") if session.get_bind().dialect.name == "postgresql" else column


def group_counts(session: Session, job_id: str) -> dict[Group, dict[str, Counter[str]]]:
    """{(method, scope, protocol): {role: {status: attempts}}} by the result rule (``db.attempt_roles``; the
    ``result`` role counts one attempt per key): what the status table shows, in one GROUP BY."""
    columns = (Episode.method, Episode.scope, Episode.protocol, Episode.status)
    query, role = with_roles([job_id], *columns, func.count())
    out: dict[Group, dict[str, Counter[str]]] = {}
    for method, scope, protocol, status, n, role_value in session.execute(query.group_by(*columns, role)):
        out.setdefault((method, scope, protocol), {}).setdefault(role_value, Counter())[status] += n
    return out


def status_counts(session: Session, job_id: str) -> Counter[str]:
    """{status: attempts} over every attempt a view shows (each key's result, and the attempts kept apart),
    counted from the rows: what "is the job finished" asks on every poll (never the stored ``jobs.counts``, so a
    row written by hand counts)."""
    query, role = with_roles([job_id], Episode.status, func.count())
    out: Counter[str] = Counter()
    for status, n, _role in session.execute(query.group_by(Episode.status, role)):
        out[status] += n
    return out


def shown_statuses(session: Session, job_id: str) -> list[tuple[str, str, str]]:
    """(episode id, status, role) of each key's result attempt and of every attempt kept apart from it, by key
    then attempt: three short columns per attempt, so a poll that must know which attempts ended since the last
    one stays cheap."""
    query, _role = with_roles([job_id], Episode.id, Episode.status)
    query = query.order_by(by_code_point(session, Episode.episode_key), Episode.attempt)
    return [tuple(r) for r in session.execute(query)]


def attempt_fields(session: Session, ids: Sequence[str], fields: Sequence[str]) -> dict[str, Any]:
    """{episode id: row of ``fields`` (``Episode`` column names)} for ``ids``, ``ID_CHUNK`` ids a statement."""
    columns = [getattr(Episode, f) for f in fields]
    out: dict[str, Any] = {}
    for chunk in _chunks(ids, ID_CHUNK):
        for row in session.execute(select(Episode.id, *columns).where(Episode.id.in_(chunk))):
            out[row[0]] = row[1:]
    return out


def failure_groups(session: Session, job_id: str, statuses: Collection[str]) -> list[tuple[str, str | None, int]]:
    """(status, error, number of keys) of the result attempts in ``statuses``, one per distinct (status, error),
    ordered by the first key that has it: the rows the failure summary counts, as many as distinct errors."""
    numbers = result_attempt_numbers([job_id])
    first = func.min(by_code_point(session, Episode.episode_key))
    query = (
        select(Episode.status, Episode.error, func.count(), first)
        .join(numbers, at_numbers(numbers))
        .where(Episode.status.in_(sorted(statuses)))
        .group_by(Episode.status, Episode.error)
    )
    rows = sorted(session.execute(query), key=lambda r: r[3])
    return [(status, error, n) for status, error, n, _ in rows]


def _chunks(items: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])
