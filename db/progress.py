"""What a job's progress displays read: counts and a few narrow columns, never whole episode rows.

``status``, ``status --watch`` and ``run`` redraw a job's progress every second, and a Table-3 job holds 12,800
episode keys: loading every newest attempt as an ``Episode`` (its config, its timings...) on every redraw costs
seconds and hundreds of MB. The displays only ever show counts per (method, scope, protocol, status) of each key's
newest attempt (every driver, as ``db.store.latest_attempts``), the attempts that just ended, and the reasons runs
failed; each is one SQL statement here (a GROUP BY over the covering index ``ix_episodes_job_key_attempt``, or a
SELECT of the few columns shown).

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

from db.job_status import newest_attempts
from db.models import Episode

#: a display row's group: (method, scope, protocol)
Group = tuple[str, str, str]
#: how many ids go into one ``IN (...)`` list
ID_CHUNK = 500


def by_code_point(session: Session, column: Any) -> Any:
    """``column`` to ORDER BY or MIN() in Python's order of ``str`` (code points), whatever the database."""
    return column.collate("C") if session.get_bind().dialect.name == "postgresql" else column


def group_counts(session: Session, job_id: str) -> dict[Group, Counter[str]]:
    """{(method, scope, protocol): {status: number of keys}} over each key's newest attempt (every driver): what the
    status table shows, in one GROUP BY."""
    newest, is_newest = newest_attempts([job_id])
    columns = (Episode.method, Episode.scope, Episode.protocol, Episode.status)
    query = select(*columns, func.count()).join(newest, is_newest).group_by(*columns)
    out: dict[Group, Counter[str]] = {}
    for method, scope, protocol, status, n in session.execute(query):
        out.setdefault((method, scope, protocol), Counter())[status] += n
    return out


def status_counts(session: Session, job_id: str) -> Counter[str]:
    """{status: number of keys} over each key's newest attempt (every driver), counted from the rows: what
    "is the job finished" asks on every poll (never the stored ``jobs.counts``, so a row written by hand counts)."""
    newest, is_newest = newest_attempts([job_id])
    query = select(Episode.status, func.count()).join(newest, is_newest).group_by(Episode.status)
    return Counter({status: n for status, n in session.execute(query)})


def newest_statuses(session: Session, job_id: str) -> list[tuple[str, str]]:
    """(episode id, status) of each key's newest attempt (every driver), by key: two short columns per key, so a
    poll that must know which attempts ended since the last one stays cheap."""
    newest, is_newest = newest_attempts([job_id])
    query = select(Episode.id, Episode.status).join(newest, is_newest)
    return [tuple(r) for r in session.execute(query.order_by(by_code_point(session, Episode.episode_key)))]


def attempt_fields(session: Session, ids: Sequence[str], fields: Sequence[str]) -> dict[str, Any]:
    """{episode id: row of ``fields`` (``Episode`` column names)} for ``ids``, ``ID_CHUNK`` ids a statement."""
    columns = [getattr(Episode, f) for f in fields]
    out: dict[str, Any] = {}
    for chunk in _chunks(ids, ID_CHUNK):
        for row in session.execute(select(Episode.id, *columns).where(Episode.id.in_(chunk))):
            out[row[0]] = row[1:]
    return out


def failure_groups(session: Session, job_id: str, statuses: Collection[str]) -> list[tuple[str, str | None, int]]:
    """(status, error, number of keys) of the newest attempts in ``statuses``, one per distinct (status, error),
    ordered by the first key that has it: the rows the failure summary counts, as many as distinct errors."""
    newest, is_newest = newest_attempts([job_id])
    first = func.min(by_code_point(session, Episode.episode_key))
    query = (
        select(Episode.status, Episode.error, func.count(), first)
        .join(newest, is_newest)
        .where(Episode.status.in_(sorted(statuses)))
        .group_by(Episode.status, Episode.error)
    )
    rows = sorted(session.execute(query), key=lambda r: r[3])
    return [(status, error, n) for status, error, n, _ in rows]


def _chunks(items: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])
