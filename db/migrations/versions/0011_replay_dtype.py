"""replays: the dtype the measuring model ran in

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06 13:00:00.000000

The measuring model of a replay (the source's own, or the one a text trajectory is rendered into) runs in a named
dtype, ``float32`` or ``bfloat16`` (``agent_runner.measuring_dtypes.MEASURING_DTYPES``), and a number measured in
one is never paired with one measured in the other:

- ``replays.dtype``: the dtype the row was measured in. It is part of the row's ``config_key`` (beside ``model``), so
  a float32 and a bfloat16 replay of one configuration keep a row each. Rows stored before it was recorded get NULL
  ("not recorded", never guessed); their ``config_key`` stays as it was.

A plain ADD COLUMN (no batch rebuild, see 0005).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("replays", sa.Column("dtype", sa.String(length=16), nullable=True))


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":  # in place (SQLite >= 3.35), never a rebuild
        op.execute("ALTER TABLE replays DROP COLUMN dtype")
    else:
        op.drop_column("replays", "dtype")
