"""initial schema: jobs, episodes, turns

Revision ID: 0001
Revises: (none)
Create Date: 2026-12-02 15:59:20.725957
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# Written out here (not imported from db.models) so this revision never changes when the models do.
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("config", JSON, nullable=False),
        sa.Column("config_hash", sa.String(length=64), nullable=False),
        sa.Column("package_versions", JSON, nullable=False),
        sa.Column("git_revision", sa.String(length=64), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint("status IN ('pending', 'running', 'done', 'cancelled', 'failed')", name="ck_jobs_status"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_jobs_config_hash"), "jobs", ["config_hash"], unique=False)

    op.create_table(
        "episodes",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("task_id", sa.String(length=200), nullable=False),
        sa.Column("method", sa.String(length=64), nullable=False),
        sa.Column("scope", sa.String(length=32), nullable=False),
        sa.Column("protocol", sa.String(length=32), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("episode_key", sa.String(length=400), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("exit_status", sa.String(length=64), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("patch", sa.Text(), nullable=True),
        sa.Column("test_log", sa.Text(), nullable=True),
        sa.Column("grader", sa.String(length=100), nullable=True),
        sa.Column("grader_version", sa.String(length=100), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("graded_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("agent_s", sa.Float(), nullable=True),
        sa.Column("grade_s", sa.Float(), nullable=True),
        sa.Column("wall_s", sa.Float(), nullable=True),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=True),
        sa.Column("appended_tokens", sa.BigInteger(), nullable=True),
        sa.Column("generated_tokens", sa.BigInteger(), nullable=True),
        sa.Column("n_turns", sa.Integer(), nullable=True),
        sa.Column("peak_cache_bytes", sa.BigInteger(), nullable=True),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("claim_token", sa.String(length=32), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("n_claims", sa.Integer(), nullable=False),
        sa.Column("celery_task_id", sa.String(length=64), nullable=True),
        sa.Column("config", JSON, nullable=False),
        sa.Column("result", JSON, nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'resolved', 'unresolved', 'empty_patch', 'patch_failed', "
            "'submitted', 'step_limit', 'context_limit', 'time_limit', 'format_error_limit', 'timeout', "
            "'infra_failure', 'cancelled')",
            name="ck_episodes_status",
        ),
        sa.CheckConstraint("attempt >= 1", name="ck_episodes_attempt"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "job_id", "task_id", "method", "scope", "protocol", "seed", "attempt", name="uq_episode_attempt"
        ),
    )
    op.create_index("ix_episodes_job_key", "episodes", ["job_id", "episode_key"], unique=False)
    op.create_index("ix_episodes_job_status", "episodes", ["job_id", "status"], unique=False)

    op.create_table(
        "turns",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("episode_id", sa.String(length=32), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("tokens_appended", sa.Integer(), nullable=False),
        sa.Column("tokens_generated", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("logical_length", sa.Integer(), nullable=False),
        sa.Column("physical_before", JSON, nullable=True),
        sa.Column("physical_after", JSON, nullable=True),
        sa.Column("eviction_events", sa.Integer(), nullable=False),
        sa.Column("cache_bytes", sa.BigInteger(), nullable=True),
        sa.Column("prefill_s", sa.Float(), nullable=False),
        sa.Column("decode_s", sa.Float(), nullable=False),
        sa.Column("tokens_per_s", sa.Float(), nullable=True),
        sa.Column("env_s", sa.Float(), nullable=False),
        sa.Column("completion", sa.Text(), nullable=False),
        sa.Column("thought", sa.Text(), nullable=True),
        sa.Column("action", JSON, nullable=True),
        sa.Column("observation", sa.Text(), nullable=True),
        sa.Column("extra", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["episode_id"], ["episodes.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("episode_id", "index", name="uq_turn_index"),
    )
    op.create_index(op.f("ix_turns_episode_id"), "turns", ["episode_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_turns_episode_id"), table_name="turns")

    op.drop_table("turns")
    op.drop_index("ix_episodes_job_status", table_name="episodes")
    op.drop_index("ix_episodes_job_key", table_name="episodes")

    op.drop_table("episodes")
    op.drop_index(op.f("ix_jobs_config_hash"), table_name="jobs")

    op.drop_table("jobs")
