"""turn tokens and counterfactual replays

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03 07:35:50.754515

``turns.tokens`` keeps each turn's token stream (what a replay feeds); ``replays`` holds one row per replay
of a dense episode under one method, scope, protocol and eviction configuration (see ``db.models.Replay``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# Written out here (not imported from db.models) so this revision never changes when the models do.
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # add_column needs no table rebuild on SQLite (a nullable column without a default)
    with op.batch_alter_table("turns") as batch_op:
        batch_op.add_column(sa.Column("tokens", JSON, nullable=True))

    op.create_table(
        "replays",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("episode_id", sa.String(length=32), nullable=False),
        sa.Column("task_id", sa.String(length=200), nullable=False),
        sa.Column("method", sa.String(length=64), nullable=False),
        sa.Column("scope", sa.String(length=32), nullable=False),
        sa.Column("protocol", sa.String(length=32), nullable=False),
        sa.Column("config_key", sa.String(length=64), nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.Column("chunked", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("tokens", sa.Integer(), nullable=True),
        sa.Column("nll_mean", sa.Float(), nullable=True),
        sa.Column("top1", sa.Float(), nullable=True),
        sa.Column("turns", JSON, nullable=True),
        sa.Column("seconds", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("status IN ('ok', 'failed', 'skipped')", name="ck_replays_status"),
        sa.ForeignKeyConstraint(["episode_id"], ["episodes.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("episode_id", "method", "scope", "protocol", "config_key", name="uq_replay_config"),
    )
    op.create_index(op.f("ix_replays_episode_id"), "replays", ["episode_id"], unique=False)
    op.create_index(op.f("ix_replays_job_id"), "replays", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_replays_job_id"), table_name="replays")
    op.drop_index(op.f("ix_replays_episode_id"), table_name="replays")
    op.drop_table("replays")

    with op.batch_alter_table("turns") as batch_op:
        batch_op.drop_column("tokens")
