"""who took the message of a queued episode, and when

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-08 12:00:00.000000

- ``episodes.taken_by``: the worker (``hostname/pid/kernel`` of its main process, the name of its row in ``workers``;
  ``db.process_identity``) that took the message of a ``queued`` row and has not claimed it yet (it waits for Docker).
  A sweeper sends the row again when that worker is gone (``db.taken_messages``). NULL: no message is known taken.
- ``episodes.taken_at``: when it took it. NULL with ``taken_by``.

Both are plain ADD COLUMNs (never a batch rebuild, see 0005); every existing row reads NULL, nothing taken.
- ``ix_episodes_taken``: a partial index of the marked rows only (``taken_by IS NOT NULL``), so every sweeper's look
  for them each sweep reads a handful of entries, not the episodes table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

# Written out here (not imported from db.models) so this revision never changes when the models do.
COLUMNS = ("taken_by", "taken_at")


def upgrade() -> None:
    op.add_column("episodes", sa.Column("taken_by", sa.String(length=200), nullable=True))
    op.add_column("episodes", sa.Column("taken_at", sa.DateTime(timezone=True), nullable=True))
    marked = sa.text("taken_by IS NOT NULL")
    op.create_index("ix_episodes_taken", "episodes", ["status"], postgresql_where=marked, sqlite_where=marked)


def downgrade() -> None:
    op.drop_index("ix_episodes_taken", table_name="episodes")  # first: SQLite drops no column an index reads
    for column in reversed(COLUMNS):
        if op.get_bind().dialect.name == "sqlite":  # in place (SQLite >= 3.35), never a rebuild (see 0005)
            op.execute(f"ALTER TABLE episodes DROP COLUMN {column}")
        else:
            op.drop_column("episodes", column)
