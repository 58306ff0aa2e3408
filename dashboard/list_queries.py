"""The jobs list and a job's episode table: server-side sort and filter from query parameters.

Each list is a :class:`ListSpec`: its sort keys (the allowed list, with the value each sorts by), its default
sort, and its filters (those with a fixed allowed list, and free-text ones). :meth:`ListSpec.parse` turns the
request's parameters into a :class:`ListQuery` or raises :class:`BadListParameter` (the page answers 400);
the query sorts and filters plain rows and writes the links that keep every other parameter.
Missing values (an episode that never ran has no turns) sort last in either order.

A job's episodes are sorted, filtered and paged in SQL (``db.episode_lists``, whose sort keys and filters are
:data:`EPISODES`'s); :meth:`ListQuery.apply` is the Python-side definition that module is tested against.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from db.models import CANCELLABLE_STATUSES, RUN_FAILURE_STATUSES, EpisodeStatus, Job, JobStatus
from results.cost import human_bytes  # noqa: F401  (the pages' byte format, defined once)

ORDERS = ("asc", "desc")


class BadListParameter(ValueError):
    """A sort key, order or filter value that is not in the list's allowed list (a 400 page)."""


@dataclass(frozen=True)
class ListSpec:
    what: str  # "jobs" | "episodes": for messages
    sorts: Mapping[str, Callable[[Any], Any]]  # key -> the row's value it sorts by (None: missing, last)
    default_sort: str
    default_order: str
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # filter -> allowed values
    exact: tuple[str, ...] = ()  # filters matched exactly against the row's attribute of that name
    text: Mapping[str, Callable[[Any], Iterable[str | None]]] = field(default_factory=dict)  # substring filters

    @property
    def filters(self) -> tuple[str, ...]:
        return (*self.choices, *self.exact, *self.text)

    def parse(self, sort: str | None, order: str | None, filters: Mapping[str, str | None]) -> ListQuery:
        sort = sort or self.default_sort
        order = order or (self.default_order if sort == self.default_sort else "asc")
        if sort not in self.sorts:
            raise BadListParameter(f"unknown sort key {sort!r} for {self.what}; allowed: {', '.join(self.sorts)}")
        if order not in ORDERS:
            raise BadListParameter(f"unknown order {order!r}; allowed: {', '.join(ORDERS)}")
        values = {k: (v or "").strip() for k, v in filters.items() if (v or "").strip()}
        for name, value in values.items():
            allowed = self.choices.get(name)
            if allowed is not None and value not in allowed:
                raise BadListParameter(f"unknown {name} {value!r} for {self.what}; allowed: {', '.join(allowed)}")
        return ListQuery(self, sort, order, values)


@dataclass(frozen=True)
class ListQuery:
    spec: ListSpec
    sort: str
    order: str
    values: Mapping[str, str]  # the filters that are set
    keep: Mapping[str, str] = field(default_factory=dict)  # other parameters the links carry (e.g. limit)

    def value(self, name: str) -> str:
        return self.values.get(name, "")

    def matches(self, row: Any) -> bool:
        for name, value in self.values.items():
            if name in self.spec.text:
                needle = value.lower()
                if not any(needle in (s or "").lower() for s in self.spec.text[name](row)):
                    return False
            elif str(getattr(row, name)) != value:
                return False
        return True

    def apply(self, rows: Iterable[Any]) -> list[Any]:
        """The rows that match the filters, sorted (stable: ties keep the given order; missing values last)."""
        key = self.spec.sorts[self.sort]
        kept = [r for r in rows if self.matches(r)]
        present = [r for r in kept if key(r) is not None]
        missing = [r for r in kept if key(r) is None]
        return sorted(present, key=key, reverse=self.order == "desc") + missing

    def params(self, **changes: str) -> dict[str, str]:
        """Every parameter of this view (defaults left out), with ``changes``."""
        out = {**self.keep, **self.values}
        if (self.sort, self.order) != (self.spec.default_sort, self.spec.default_order):
            out.update(sort=self.sort, order=self.order)
        out.update(changes)
        return {k: v for k, v in out.items() if v != ""}

    def sort_link(self, key: str) -> str:
        """The query string that sorts by ``key``: the other order when it is the current key, else ascending."""
        order = ("asc" if self.order == "desc" else "desc") if key == self.sort else "asc"
        return "?" + urlencode(self.params(sort=key, order=order))

    def page_link(self, page: int) -> str:
        """The query string of page ``page`` of this view (page 1: no ``page`` parameter); sort links and the filter
        form carry no page, so a new sort or filter starts at page 1."""
        return "?" + urlencode(self.params(page=str(page) if page > 1 else ""))

    def hidden(self) -> dict[str, str]:
        """The parameters a filter form carries unchanged (sort, order, limit ...): every one but the filters."""
        return {k: v for k, v in self.params().items() if k not in self.spec.filters}

    def clear_link(self) -> str:
        return "?" + urlencode(self.hidden())

    def aria_sort(self, key: str) -> str:
        if key != self.sort:
            return "none"
        return "ascending" if self.order == "asc" else "descending"

    @property
    def filtered(self) -> bool:
        return bool(self.values)


@dataclass
class Listing:
    """The rows shown and how many exist: ``matched`` pass the filters (before any limit), ``total`` in all."""

    rows: list[Any]
    matched: int
    total: int


JOBS = ListSpec(
    "jobs",
    sorts={
        "created": lambda j: j.created_at,
        "status": lambda j: j.status,
        "name": lambda j: None if j.name is None else j.name.lower(),
        "progress": lambda j: (j.finished / j.total if j.total else 0.0, j.total),
    },
    default_sort="created",
    default_order="desc",
    choices={"status": tuple(s.value for s in JobStatus)},
    text={"q": lambda j: (j.id, j.name)},
)

EPISODES = ListSpec(
    "episodes",
    sorts={
        "episode": lambda e: e.id,
        "task": lambda e: e.task_id,
        "method": lambda e: e.method,
        "scope": lambda e: e.scope,
        "protocol": lambda e: e.protocol,
        "seed": lambda e: e.seed,
        "attempt": lambda e: e.attempt,
        "status": lambda e: e.status,
        "turns": lambda e: e.n_turns,
        "prompt_tokens": lambda e: e.prompt_tokens,
        "generated_tokens": lambda e: e.generated_tokens,
        "wall_s": lambda e: e.wall_s,
        "kv_peak_held_bytes": lambda e: e.kv_peak_held_bytes,
        "kv_peak_allocated_bytes": lambda e: e.kv_peak_allocated_bytes,
    },
    default_sort="task",  # the store's order is by key (task first): the default keeps it
    default_order="asc",
    choices={"status": tuple(s.value for s in EpisodeStatus)},
    exact=("method", "scope", "protocol"),
    text={"task": lambda e: (e.task_id,)},
)


def filtered_jobs(session: Session, query: ListQuery) -> tuple[list[Job], int]:
    """The jobs that pass the SQL part of the filters (status, the id/name text), and how many jobs exist."""
    total = session.execute(select(func.count()).select_from(Job)).scalar_one()
    stmt = select(Job).order_by(Job.created_at.desc())
    if query.value("status"):
        stmt = stmt.where(Job.status == query.value("status"))
    if query.value("q"):
        text = query.value("q")
        stmt = stmt.where(or_(Job.id.icontains(text, autoescape=True), Job.name.icontains(text, autoescape=True)))
    return list(session.execute(stmt).scalars()), total


NOTHING_TO_CANCEL = "nothing to cancel: no episode is queued, running or waiting for its grade"
NOTHING_TO_RERUN = "nothing to rerun: no result is a timeout or an infra failure (a verdict is never rerun: best-of-n)"


@dataclass
class Actions:
    """Which of the job page's two write actions apply, and why not when one does not."""

    cancel: bool
    cancel_why: str
    rerun: int  # result attempts `rerun failed` would rerun
    rerun_why: str


def job_actions(
    counts: Mapping[str, int], result_statuses: Mapping[str, int], apart: Mapping[str, Mapping[str, int]] | None = None
) -> Actions:
    """``counts``: the job's status counts (result attempts, ``jobs.counts``), ``apart``: those of the attempts kept
    apart (role -> status -> n); ``result_statuses``: how many of its result attempts (the ones
    ``db.store.rerun_job`` picks from) have each status (``db.episode_lists.facets``), so neither needs the job's
    rows."""
    every = [counts, *(apart or {}).values()]
    active = sum(by.get(s, 0) for by in every for s in CANCELLABLE_STATUSES)
    failed = sum(result_statuses.get(s, 0) for s in RUN_FAILURE_STATUSES)
    return Actions(active > 0, "" if active else NOTHING_TO_CANCEL, failed, "" if failed else NOTHING_TO_RERUN)
