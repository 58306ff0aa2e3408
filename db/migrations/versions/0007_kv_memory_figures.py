"""KV memory: bytes held, bytes allocated, and their peaks

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05 10:00:00.000000

Four figures, one name each (``nexus.memory``): ``kv_held_bytes`` (valid (layer, row, KV head, position)
entries x (D_k + D_v) x element size), ``kv_allocated_bytes`` (the K/V buffers, spare capacity and ragged
padding included) and their peaks ``kv_peak_held_bytes`` / ``kv_peak_allocated_bytes`` (the largest totals
at any moment, a prefill's pre-eviction state included).

- ``turns.cache_bytes`` becomes ``turns.kv_allocated_bytes``: its values are the K/V buffers' bytes after the
  turn, which is what the new name says; ``kv_held_bytes``, ``kv_peak_held_bytes`` and
  ``kv_peak_allocated_bytes`` are added.
- ``episodes.peak_cache_bytes`` is dropped: it was the largest post-turn snapshot (derivable from the turns),
  never a peak, so it is not relabelled as one; ``kv_peak_held_bytes`` and ``kv_peak_allocated_bytes`` are
  added (the largest of the turns' peaks, written at finish).
- ``probe_results.kv_bytes`` (the K/V buffers at answer start) becomes ``kv_allocated_bytes``;
  ``kv_held_bytes``, ``kv_peak_held_bytes`` and ``kv_peak_allocated_bytes`` are added.

Existing rows keep every value under its new name and get NULL in the new columns (readers show "-", never 0).
Renames and drops are done in place (SQLite >= 3.35), never by a batch table rebuild: on SQLite a rebuild drops
the old ``episodes`` table, and with foreign keys on that DROP deletes every turn (ON DELETE CASCADE). The
downgrade restores ``episodes.peak_cache_bytes`` from the turns (the largest ``cache_bytes``), as it was written.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

#: table -> (old name, new name) of the renamed column
RENAMED = {"turns": ("cache_bytes", "kv_allocated_bytes"), "probe_results": ("kv_bytes", "kv_allocated_bytes")}
#: table -> the nullable BigInteger columns added
ADDED = {
    "turns": ("kv_held_bytes", "kv_peak_held_bytes", "kv_peak_allocated_bytes"),
    "episodes": ("kv_peak_held_bytes", "kv_peak_allocated_bytes"),
    "probe_results": ("kv_held_bytes", "kv_peak_held_bytes", "kv_peak_allocated_bytes"),
}


def _drop_column(table: str, column: str) -> None:
    if op.get_bind().dialect.name == "sqlite":  # in place (SQLite >= 3.35), never a rebuild (see above)
        op.execute(f'ALTER TABLE {table} DROP COLUMN "{column}"')
    else:
        op.drop_column(table, column)


def upgrade() -> None:
    for table, (old, new) in RENAMED.items():
        op.alter_column(table, old, new_column_name=new)
    for table, columns in ADDED.items():
        for column in columns:
            op.add_column(table, sa.Column(column, sa.BigInteger(), nullable=True))
    _drop_column("episodes", "peak_cache_bytes")


def downgrade() -> None:
    for table, columns in ADDED.items():
        for column in columns:
            _drop_column(table, column)
    for table, (old, new) in RENAMED.items():
        op.alter_column(table, new, new_column_name=old)
    op.add_column("episodes", sa.Column("peak_cache_bytes", sa.BigInteger(), nullable=True))
    turns = sa.table("turns", sa.column("episode_id", sa.String), sa.column("cache_bytes", sa.BigInteger))
    episodes = sa.table("episodes", sa.column("id", sa.String), sa.column("peak_cache_bytes", sa.BigInteger))
    peak = sa.select(sa.func.max(turns.c.cache_bytes)).where(turns.c.episode_id == episodes.c.id).scalar_subquery()
    op.execute(sa.update(episodes).values(peak_cache_bytes=peak))
