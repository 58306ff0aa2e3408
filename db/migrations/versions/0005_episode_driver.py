"""who drove an attempt

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04 04:00:00.000000

``episodes.driver`` says who chose an attempt's actions: ``agent`` (the service ran it), ``interactive``
(``rerun --interactive``, every live action the model's) or ``steered`` (an operator replaced an action).
Results count ``agent`` attempts only by default (``db.models.AttemptDriver``).

Existing rows: an attempt with a turn marked ``intervened`` was steered; every other row becomes ``agent``.
An interactive rerun stored before this revision in which the operator changed nothing cannot be told apart
from a service rerun, so it stays ``agent``.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# Written out here (not imported from db.models) so this revision never changes when the models do.
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
DRIVERS = ("agent", "interactive", "steered")

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN with its CHECK on the column, never a batch table rebuild: on SQLite a rebuild drops
    # the old episodes table, and with foreign keys on that DROP deletes every turn (ON DELETE CASCADE).
    check = sa.CheckConstraint("driver IN (" + ", ".join(repr(d) for d in DRIVERS) + ")", name="ck_episodes_driver")
    op.add_column("episodes", sa.Column("driver", sa.String(length=16), check, server_default="agent", nullable=False))
    turns = sa.table("turns", sa.column("episode_id", sa.String), sa.column("extra", JSON))
    episodes = sa.table("episodes", sa.column("id", sa.String), sa.column("driver", sa.String))
    bind = op.get_bind()
    rows = bind.execute(sa.select(turns.c.episode_id, turns.c.extra))
    steered = sorted({episode for episode, extra in rows if (extra or {}).get("intervened")})
    for start in range(0, len(steered), 500):
        chunk = steered[start : start + 500]
        bind.execute(sa.update(episodes).where(episodes.c.id.in_(chunk)).values(driver="steered"))


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":  # SQLite >= 3.35 drops a column in place (no rebuild, see above)
        op.execute("ALTER TABLE episodes DROP COLUMN driver")
    else:
        op.drop_column("episodes", "driver")
