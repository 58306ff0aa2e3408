"""workers that are gone; when a grade was last sent again

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06 18:00:00.000000

- ``workers.state`` may read ``gone``: a sweeper marks a worker whose row has not been written for longer than the
  liveness bound (``jobs.settings.Liveness.worker_gone_after_s``), so a dead worker no longer reads ``ok``. Its next
  report (a restarted process of the same name) sets it back. The CHECK is widened; no row changes.
- ``episodes.grade_sent_at``: when a sweeper last sent the grade of an agent exit that nobody had started grading
  (``db.liveness.take_due_grade``), so it is sent again once per bound, not every sweep. NULL until then.

``episodes`` gets a plain ADD COLUMN (never a batch rebuild, see 0005). ``workers`` has no foreign keys in or out,
so on SQLite, which cannot alter a CHECK, it is rebuilt: a new table, its rows copied, the old one dropped.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# Written out here (not imported from db.models) so this revision never changes when the models do.
OLD_STATES = ("ok", "paused")
NEW_STATES = ("ok", "paused", "gone")


def _check(states: tuple[str, ...]) -> str:
    return "state IN (" + ", ".join(repr(s) for s in states) + ")"


def _rebuild_workers_sqlite(states: tuple[str, ...]) -> None:
    columns = "name, queues, state, detail, started_at, seen_at, state_since"
    op.create_table(
        "workers_rebuilt",
        sa.Column("name", sa.String(length=200), primary_key=True),
        sa.Column("queues", sa.String(length=200), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state_since", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(_check(states), name="ck_workers_state"),
    )
    op.execute(f"INSERT INTO workers_rebuilt ({columns}) SELECT {columns} FROM workers")
    op.drop_table("workers")
    op.rename_table("workers_rebuilt", "workers")


def _set_states(states: tuple[str, ...]) -> None:
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_workers_sqlite(states)
    else:
        op.drop_constraint("ck_workers_state", "workers", type_="check")
        op.create_check_constraint("ck_workers_state", "workers", _check(states))


def upgrade() -> None:
    op.add_column("episodes", sa.Column("grade_sent_at", sa.DateTime(timezone=True), nullable=True))
    _set_states(NEW_STATES)


def downgrade() -> None:
    # before this revision a dead worker's row read ok (its seen_at tells its age): gone rows go back to that
    op.execute("UPDATE workers SET state = 'ok' WHERE state = 'gone'")
    _set_states(OLD_STATES)
    if op.get_bind().dialect.name == "sqlite":  # in place (SQLite >= 3.35), never a rebuild (see 0005)
        op.execute("ALTER TABLE episodes DROP COLUMN grade_sent_at")
    else:
        op.drop_column("episodes", "grade_sent_at")
