"""What each attempt of an episode key is: the one result rule every count, list and table reads.

A key (task x method x scope x protocol x seed) may have many attempts (rows). Each attempt has one role:

- ``result``: the key's one sample, what Pass@1 counts: the *first* attempt the agent drove alone that did not end
  as a broken run (``SERVICE_FAILURE_STATUSES``: timeout, infra_failure, cancelled); a key whose every agent
  attempt broke has its newest one. A queued or running attempt is not broken: while the first run is under way,
  it is the key's result (still to come).
- ``replaced``: a broken agent attempt before the result (a retry took its place). Counted nowhere.
- ``resample``: an agent attempt after the result (``rerun --status unresolved``): a new sample of a key that
  already had one, kept apart, never in Pass@1 (docs/numbers.md).
- ``interactive`` / ``steered``: ``rerun --interactive`` attempts (``db.models.AttemptDriver``), kept apart.

:func:`roles_of` is the rule written out over one key's attempts; :func:`result_attempt_numbers` and
:func:`role_case` are the same rule in SQL, for the readers that must not load rows (a 12,800-episode job).
``tests/db/test_job_counts.py`` walks every writer at random and checks each reader against
:func:`roles_of` after every step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any, NamedTuple

from sqlalchemy import and_, case, exists, func, literal, select, union_all

from db.models import AGENT_DRIVERS, SERVICE_FAILURE_STATUSES, AttemptDriver, Episode


class Role(StrEnum):
    result = "result"
    replaced = "replaced"
    resample = "resample"
    interactive = AttemptDriver.interactive.value
    steered = AttemptDriver.steered.value


#: the roles a view shows apart from the results (a replaced attempt is shown nowhere)
APART_ROLES = (Role.resample, Role.interactive, Role.steered)


class AttemptFacts(NamedTuple):
    """What the rule reads of one attempt."""

    attempt: int
    driver: str
    status: str


def roles_of(attempts: Iterable[AttemptFacts]) -> dict[int, Role]:
    """{attempt number: role} for every attempt of one key (the module docstring's rule)."""
    attempts = sorted(attempts)
    agent = [a for a in attempts if a.driver in AGENT_DRIVERS]
    sampled = [a for a in agent if a.status not in SERVICE_FAILURE_STATUSES]
    result = sampled[0].attempt if sampled else (agent[-1].attempt if agent else None)
    roles = {}
    for a in attempts:
        if a.driver not in AGENT_DRIVERS:
            roles[a.attempt] = Role(a.driver)
        elif a.attempt == result:
            roles[a.attempt] = Role.result
        else:
            roles[a.attempt] = Role.resample if result is not None and a.attempt > result else Role.replaced
    return roles


#: {role: {status: number of attempts}}, replaced attempts left out: what ``jobs.counts`` stores
RoleCounts = dict[str, dict[str, int]]


def key_counts(attempts: Iterable[AttemptFacts]) -> Counter[tuple[str, str]]:
    """{(role, status): n} of one key's attempts (replaced ones left out)."""
    attempts = list(attempts)
    roles = roles_of(attempts)
    return Counter((roles[a.attempt].value, a.status) for a in attempts if roles[a.attempt] != Role.replaced)


def nested(flat: Counter[tuple[str, str]]) -> RoleCounts:
    """{(role, status): n} -> {role: {status: n}}, zeros dropped, sorted (a stable stored form)."""
    out: dict[str, dict[str, int]] = {}
    for (role, status), n in sorted(flat.items()):
        if n:
            out.setdefault(role, {})[status] = n
    return out


def apart_text(apart: Mapping[str, Mapping[str, int]]) -> str:
    """``1 resample (1 resolved); 2 steered (1 resolved, 1 running)``: the attempts kept apart from the results, in
    :data:`APART_ROLES` order, or "". The one wording of the status table, the job page and live.js."""
    parts = []
    for role in APART_ROLES:
        counts = apart.get(role.value) or {}
        n = sum(counts.values())
        if n:
            statuses = ", ".join(f"{c} {st}" for st, c in sorted(counts.items()) if c)
            parts.append(f"{n} {role.value}{'s' if n > 1 and role == Role.resample else ''} ({statuses})")
    return "; ".join(parts)


def flat(counts: RoleCounts | None) -> Counter[tuple[str, str]]:
    return Counter({(role, status): n for role, by in (counts or {}).items() for status, n in by.items()})


def result_attempt_numbers(
    job_ids: Sequence[str], *, drivers: Collection[str] = AGENT_DRIVERS, include_interactive: bool = False
) -> Any:
    """A subquery (job_id, episode_key, attempt) with each key's result attempt (:func:`roles_of` in SQL).
    ``include_interactive``: a key's newest interactive attempt that did not break replaces it (and a key run only
    interactively gets one): compare's ``--include-interactive`` view, every row of it marked."""
    first_sample = func.min(case((Episode.status.not_in(sorted(SERVICE_FAILURE_STATUSES)), Episode.attempt)))
    agent = (
        select(
            Episode.job_id,
            Episode.episode_key,
            func.coalesce(first_sample, func.max(Episode.attempt)).label("attempt"),
        )
        .where(Episode.job_id.in_(list(job_ids)), Episode.driver.in_(sorted(drivers)))
        .group_by(Episode.job_id, Episode.episode_key)
        .subquery()
    )
    if not include_interactive:
        return agent
    ran = (
        select(Episode.job_id, Episode.episode_key, func.max(Episode.attempt).label("attempt"))
        .where(
            Episode.job_id.in_(list(job_ids)),
            Episode.driver.not_in(sorted(AGENT_DRIVERS)),
            Episode.status.not_in(sorted(SERVICE_FAILURE_STATUSES)),
        )
        .group_by(Episode.job_id, Episode.episode_key)
        .subquery()
    )
    replaced = exists().where(ran.c.job_id == agent.c.job_id, ran.c.episode_key == agent.c.episode_key)
    kept = select(agent.c.job_id, agent.c.episode_key, agent.c.attempt).where(~replaced)
    return union_all(select(ran.c.job_id, ran.c.episode_key, ran.c.attempt), kept).subquery()


def role_case(job_ids: Sequence[str]) -> tuple[Any, Any, Any]:
    """(result numbers, their outer-join condition on ``Episode``, the role of each ``Episode`` row as a SQL
    expression): select from ``Episode`` outer-joined to the numbers to read every attempt with its role."""
    numbers = result_attempt_numbers(job_ids)
    joined = and_(Episode.job_id == numbers.c.job_id, Episode.episode_key == numbers.c.episode_key)
    role = case(
        (Episode.driver.not_in(sorted(AGENT_DRIVERS)), Episode.driver),
        (Episode.attempt == numbers.c.attempt, literal(Role.result.value)),
        (Episode.attempt > numbers.c.attempt, literal(Role.resample.value)),
        else_=literal(Role.replaced.value),
    )
    return numbers, joined, role


def with_roles(job_ids: Sequence[str], *columns: Any) -> tuple[Any, Any]:
    """(a SELECT of ``columns`` and the role of every attempt of ``job_ids`` that has one shown, the role
    expression): replaced attempts left out. Add ``.where`` / ``.group_by`` as needed."""
    numbers, joined, role = role_case(job_ids)
    query = (
        select(*columns, role.label("role"))
        .select_from(Episode)
        .outerjoin(numbers, joined)
        .where(Episode.job_id.in_(list(job_ids)), role != Role.replaced.value)
    )
    return query, role
