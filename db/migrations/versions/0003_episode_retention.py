"""episode retention map

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03 10:50:00.000000

``episodes.retention`` keeps the final cache's retention map of an episode (``nexus.retention``: per layer, a
run-length encoding of how many KV heads still hold each logical position), which the dashboard draws.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# Written out here (not imported from db.models) so this revision never changes when the models do.
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # add_column needs no table rebuild on SQLite (a nullable column without a default)
    with op.batch_alter_table("episodes") as batch_op:
        batch_op.add_column(sa.Column("retention", JSON, nullable=True))


def downgrade() -> None:
    # Never a batch rebuild: on SQLite it drops the old episodes table, and with foreign keys on that DROP
    # deletes every turn (ON DELETE CASCADE). SQLite >= 3.35 drops a column in place.
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE episodes DROP COLUMN retention")
    else:
        op.drop_column("episodes", "retention")
