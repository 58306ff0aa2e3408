"""jobs.counts by the one result rule: each key's result attempt, and the attempts kept apart, per role

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06 07:00:00.000000

0009 counted each key's *newest* attempt, while compare counted each key's *result* attempt (the first the agent
drove alone that did not break): a resample that resolved made ``status`` say resolved where compare said
unresolved. From this revision ``jobs.counts`` is ``{role: {status: n}}`` (``db.attempt_roles``): ``result`` (one
attempt per key), ``resample``, ``interactive``, ``steered``; a broken run a retry replaced is counted nowhere.
Counted here once from the rows; the downgrade counts the newest attempts again, as 0009 did.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# Written out here (not imported from db) so this revision never changes when the code does.
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
BROKEN = frozenset({"timeout", "infra_failure", "cancelled"})


def _roles(attempts: list[tuple[int, str, str]]) -> dict[int, str]:
    """{attempt: role} of one key's (attempt, driver, status): the rule of db.attempt_roles as of this revision."""
    agent = sorted(a for a in attempts if a[1] == "agent")
    sampled = [a for a in agent if a[2] not in BROKEN]
    result = sampled[0][0] if sampled else (agent[-1][0] if agent else None)
    roles = {}
    for attempt, driver, _status in attempts:
        if driver != "agent":
            roles[attempt] = driver
        elif attempt == result:
            roles[attempt] = "result"
        else:
            roles[attempt] = "resample" if result is not None and attempt > result else "replaced"
    return roles


def _store(counts: dict[str, Any]) -> None:
    bind = op.get_bind()
    jobs = sa.table("jobs", sa.column("id"), sa.column("counts", JSON))
    values = [{"k": j, "v": c} for j, c in counts.items()]
    if values:
        bind.execute(sa.update(jobs).where(jobs.c.id == sa.bindparam("k")).values(counts=sa.bindparam("v")), values)


def _attempts() -> dict[str, dict[str, list[tuple[int, str, str]]]]:
    e = sa.table("episodes", *(sa.column(c) for c in ("job_id", "episode_key", "attempt", "driver", "status")))
    by_job: dict[str, dict[str, list[tuple[int, str, str]]]] = defaultdict(lambda: defaultdict(list))
    query = sa.select(e.c.job_id, e.c.episode_key, e.c.attempt, e.c.driver, e.c.status)
    for job_id, key, attempt, driver, status in op.get_bind().execute(query):
        by_job[job_id][key].append((attempt, driver, status))
    return by_job


def _job_ids() -> list[str]:
    return [row[0] for row in op.get_bind().execute(sa.select(sa.table("jobs", sa.column("id")).c.id))]


def upgrade() -> None:
    by_job = _attempts()
    counts = {}
    for job_id in _job_ids():
        flat: Counter[tuple[str, str]] = Counter()
        for attempts in by_job.get(job_id, {}).values():
            roles = _roles(attempts)
            flat.update((roles[a], status) for a, _driver, status in attempts if roles[a] != "replaced")
        nested: dict[str, dict[str, int]] = {}
        for (role, status), n in sorted(flat.items()):
            nested.setdefault(role, {})[status] = n
        counts[job_id] = nested
    _store(counts)


def downgrade() -> None:
    by_job = _attempts()
    counts = {}
    for job_id in _job_ids():
        newest = Counter(max(attempts)[2] for attempts in by_job.get(job_id, {}).values())
        counts[job_id] = dict(sorted(newest.items()))
    _store(counts)
