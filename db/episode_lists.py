"""A job's episode lists in SQL: the dashboard's episode grid (one page of result attempts, filtered and sorted, with
its counts and the values its filter dropdowns offer) and ``nexus-eval episodes`` (every attempt, streamed).

Why here: at Table-3 scale (12,800 episodes) building every row in Python to show 200 of them took seconds and
hundreds of MB. Here the database filters, sorts, counts and pages over :func:`db.store.result_attempt_numbers`
joined to ``episodes``, and reads only the columns a row shows (:data:`ROW_COLUMNS`: no payloads, no turns).

The semantics are those of the Python-side list (``dashboard.list_queries.EPISODES`` / ``ListQuery.apply``), which
``tests/db/test_episode_lists.py`` holds this module to on SQLite and PostgreSQL:

- ``status``, ``method``, ``scope``, ``protocol`` match the whole value; ``task`` is a case-insensitive substring of
  the task id (``%`` and ``_`` are plain characters). Case folding is SQL's ``lower()`` of the column: the same as
  Python's for ASCII, which task ids are; a non-ASCII capital may fold differently per database (deliberate).
- one sort column, missing values (NULL) last in either order, ties by episode key ascending (what the stable sort
  of rows listed by key gives, also under ``desc``); text compares by code point, as Python's ``<`` does
  (PostgreSQL: ``COLLATE "C"``, whatever the database's locale; SQLite's default is already binary).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Boolean, func, select, type_coerce
from sqlalchemy.orm import Session

from db.models import Episode
from db.store import at_numbers, result_attempt_numbers

#: sort key (the names the dashboard's ``?sort=`` takes) -> the column it sorts by
SORTS: dict[str, Any] = {
    "episode": Episode.id,
    "task": Episode.task_id,
    "method": Episode.method,
    "scope": Episode.scope,
    "protocol": Episode.protocol,
    "seed": Episode.seed,
    "attempt": Episode.attempt,
    "status": Episode.status,
    "turns": Episode.n_turns,
    "prompt_tokens": Episode.prompt_tokens,
    "generated_tokens": Episode.generated_tokens,
    "wall_s": Episode.wall_s,
    "kv_peak_held_bytes": Episode.kv_peak_held_bytes,
    "kv_peak_allocated_bytes": Episode.kv_peak_allocated_bytes,
}
EXACT = {"status": Episode.status, "method": Episode.method, "scope": Episode.scope, "protocol": Episode.protocol}
SUBSTRING = {"task": Episode.task_id}
FILTERS = (*EXACT, *SUBSTRING)
ORDERS = ("asc", "desc")
#: what one row of a list carries (the dashboard's ``EpisodeRow``), by attribute name
ROW_COLUMNS = (
    *(Episode.id, Episode.task_id, Episode.method, Episode.scope, Episode.protocol, Episode.seed, Episode.attempt),
    *(Episode.status, Episode.driver, Episode.n_turns, Episode.prompt_tokens, Episode.generated_tokens),
    *(Episode.wall_s, Episode.kv_peak_held_bytes, Episode.kv_peak_allocated_bytes),
)
_TEXT = {Episode.id.key, Episode.task_id.key, Episode.method.key, Episode.scope.key, Episode.protocol.key}
_TEXT |= {Episode.status.key, Episode.episode_key.key}


def check_sort(sort: str, order: str) -> None:
    """``ValueError`` naming what is allowed for an unknown sort key or order."""
    if sort not in SORTS:
        raise ValueError(f"unknown sort key {sort!r} for episodes; allowed: {', '.join(SORTS)}")
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; allowed: {', '.join(ORDERS)}")


def checked(filters: Mapping[str, str | None]) -> dict[str, str]:
    """The filters that are set (values stripped, empty ones dropped); ``ValueError`` naming the allowed filters for
    an unknown one."""
    unknown = sorted(set(filters) - set(FILTERS))
    if unknown:
        raise ValueError(f"unknown episode filter(s) {', '.join(unknown)}; allowed: {', '.join(FILTERS)}")
    return {k: v.strip() for k, v in filters.items() if v and v.strip()}


def _conditions(filters: Mapping[str, str]) -> list[Any]:
    out = [EXACT[name] == value for name, value in filters.items() if name in EXACT]
    for name, value in filters.items():
        if name in SUBSTRING:
            out.append(func.lower(SUBSTRING[name]).contains(value.lower(), autoescape=True))
    return out


def _binary(session: Session, column: Any) -> Any:
    """``column`` compared by code point (Python's string order) on every backend."""
    if column.key in _TEXT and session.get_bind().dialect.name == "postgresql":
        return column.collate("C")
    return column


def _results(job_id: str) -> Any:
    numbers = result_attempt_numbers([job_id])
    return select(*ROW_COLUMNS).join(numbers, at_numbers(numbers))


@dataclass(frozen=True)
class Facets:
    """What the job's result attempts hold, whatever the filters: how many, how many per status, and the values of
    each exact filter's column (sorted: what its dropdown offers)."""

    total: int
    statuses: dict[str, int]
    values: dict[str, list[str]] = field(default_factory=dict)


def facets(session: Session, job_id: str) -> Facets:
    """One GROUP BY over the result attempts by the four exact-filter columns: the total, the per-status counts and
    every column's distinct values at once (a few hundred groups at most: one scan of the job, not four)."""
    numbers = result_attempt_numbers([job_id])
    columns = list(EXACT.values())
    query = select(*columns, func.count()).join(numbers, at_numbers(numbers)).group_by(*columns)
    seen: dict[str, set[str]] = {name: set() for name in EXACT}
    statuses: Counter[str] = Counter()
    for *values, n in session.execute(query):
        for name, value in zip(EXACT, values, strict=True):
            seen[name].add(value)
        statuses[values[0]] += n
    return Facets(sum(statuses.values()), dict(statuses), {name: sorted(v) for name, v in seen.items()})


def count(session: Session, job_id: str, filters: Mapping[str, str | None] | None = None) -> int:
    """How many of the job's result attempts pass ``filters`` (``SELECT count``)."""
    inner = _results(job_id).where(*_conditions(checked(filters or {}))).subquery()
    return session.execute(select(func.count()).select_from(inner)).scalar_one()


def page(
    session: Session,
    job_id: str,
    *,
    filters: Mapping[str, str | None] | None = None,
    sort: str = "task",
    order: str = "asc",
    limit: int | None = None,
    offset: int = 0,
) -> list[Any]:
    """The job's result attempts that pass ``filters``, sorted by ``sort`` (module docstring), rows
    ``offset`` .. ``offset + limit`` (every one without ``limit``): rows of :data:`ROW_COLUMNS` by attribute name."""
    check_sort(sort, order)
    wanted = checked(filters or {})
    if (limit is not None and limit < 1) or offset < 0:
        raise ValueError(f"limit must be at least 1 and offset at least 0, not {limit} and {offset}")
    column = SORTS[sort]
    by = _binary(session, column)
    query = _results(job_id).where(*_conditions(wanted))
    query = query.order_by(column.is_(None), by.desc() if order == "desc" else by.asc())
    query = query.order_by(_binary(session, Episode.episode_key)).limit(limit).offset(offset or None)
    return list(session.execute(query))


def attempts(
    session: Session,
    job_id: str,
    *,
    statuses: Collection[str] | None = None,
    method: str | None = None,
    results_only: bool = False,
    chunk: int = 500,
) -> Iterator[Any]:
    """Every attempt of the job (or only each key's result attempt), by key then attempt, in one query read
    ``chunk`` rows at a time (a server-side cursor on PostgreSQL): rows of :data:`ROW_COLUMNS` plus ``result``, True
    for the attempt that is its key's result (``db.store.result_attempts``)."""
    numbers = result_attempt_numbers([job_id])
    result = type_coerce(numbers.c.attempt.is_not(None), Boolean).label("result")
    query = select(*ROW_COLUMNS, result).join(numbers, at_numbers(numbers), isouter=not results_only)
    query = query.where(Episode.job_id == job_id)
    if statuses is not None:
        query = query.where(Episode.status.in_(sorted(statuses)))
    if method is not None:
        query = query.where(Episode.method == method)
    query = query.order_by(_binary(session, Episode.episode_key), Episode.attempt)
    yield from session.execute(query, execution_options={"yield_per": chunk})
