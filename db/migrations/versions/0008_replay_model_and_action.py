"""replays of text trajectories: the scoring model and the action scores

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 02:30:00.000000

A trajectory stored as text (the ``expert`` demonstrations, ``oracle``, ``openai``) is replayed on a model named at
replay time (``nexus-eval replay JOB --model NAME``), so a replay row says which model scored it:

- ``replays.model``: the model a text trajectory was rendered into and scored on; NULL for a replay of a stored
  token stream (scored on the source episode's own model). It is part of the row's ``config_key``, so replays of
  one trajectory on two models keep a row each.
- ``replays.action``: the action scores pooled by span kind (``measure.action_scores.ActionSummary``);
  NULL for a token-stream replay, whose completions carry no spans.

Plain ADD COLUMNs (no batch rebuild, see 0005). Existing rows get NULL in both.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# Written out here (not imported from db.models) so this revision never changes when the models do.
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("replays", sa.Column("model", sa.String(length=200), nullable=True))
    op.add_column("replays", sa.Column("action", JSON, nullable=True))


def downgrade() -> None:
    for column in ("action", "model"):
        if op.get_bind().dialect.name == "sqlite":  # in place (SQLite >= 3.35), never a rebuild
            op.execute(f"ALTER TABLE replays DROP COLUMN {column}")
        else:
            op.drop_column("replays", column)
