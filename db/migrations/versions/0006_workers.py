"""the workers table

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 12:00:00.000000

``workers``: each worker process's last report (its queues, ``ok`` or ``paused`` while the Docker engine does
not answer, and when it was last seen), written by its sweeper (``workers.faults.sweeper``) and read by ``doctor``
and the dashboard. A new table only: no existing row changes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("name", sa.String(length=200), primary_key=True),
        sa.Column("queues", sa.String(length=200), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state_since", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("state IN ('ok', 'paused')", name="ck_workers_state"),
    )


def downgrade() -> None:
    op.drop_table("workers")
