"""probe runs and their results

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 22:04:52.887376

``probe_runs`` holds one quality-probe run (``nexus-eval probe run``): its settings, provenance, status and
counts; ``probe_results`` one row per sample of one (probe, variant, scope, protocol, density) cell (see
``db.models.ProbeRun`` / ``ProbeResultRow``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# Written out here (not imported from db.models) so this revision never changes when the models do.
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "probe_runs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("settings", JSON, nullable=False),
        sa.Column("provenance", JSON, nullable=False),
        sa.Column("n_planned", sa.Integer(), nullable=False),
        sa.Column("n_results", sa.Integer(), nullable=False),
        sa.CheckConstraint("status IN ('pending', 'running', 'done', 'failed')", name="ck_probe_runs_status"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "probe_results",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("probe", sa.String(length=32), nullable=False),
        sa.Column("variant", sa.String(length=200), nullable=False),
        sa.Column("scope", sa.String(length=32), nullable=False),
        sa.Column("protocol", sa.String(length=32), nullable=False),
        sa.Column("density", sa.Float(), nullable=False),
        sa.Column("sample", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("length", sa.Integer(), nullable=False),
        sa.Column("depth", sa.Float(), nullable=True),
        sa.Column("correct", sa.Boolean(), nullable=True),
        sa.Column("nll", sa.Float(), nullable=True),
        sa.Column("scored_tokens", sa.Integer(), nullable=False),
        sa.Column("answer", sa.Text(), nullable=False),
        sa.Column("expected", sa.Text(), nullable=False),
        sa.Column("kept_fraction", sa.Float(), nullable=False),
        sa.Column("kv_bytes", sa.BigInteger(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["probe_runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "run_id", "probe", "variant", "scope", "protocol", "density", "sample", name="uq_probe_result"
        ),
    )
    op.create_index("ix_probe_results_run_probe", "probe_results", ["run_id", "probe"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_probe_results_run_probe", table_name="probe_results")
    op.drop_table("probe_results")
    op.drop_table("probe_runs")
