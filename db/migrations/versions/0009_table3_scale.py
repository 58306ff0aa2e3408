"""Table-3 scale: packed token streams and retention maps, episode summaries, job counts, covering indexes

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05 11:00:00.000000

At 12,800 episodes (~400K turns) the JSON-text token streams and retention maps were most of an 11 GB file, every
job-level read loaded them, and every finish recounted the whole job. This revision:

- ``turns.tokens``: JSON text -> packed bytes (``db.packing.pack_tokens``: uint32 ids, zlib); every stream reads
  back bit-identical (``tests/db/test_migration_0009.py``);
- ``turns.extra``: a ``user_message`` that starts with the row's observation keeps only the rest, under
  ``user_message_after_observation`` (``results.turn_data``), instead of repeating the observation;
- ``episodes.retention``: JSON -> packed bytes (``db.packing.pack_json``);
- ``episodes.mean_kv_held_bytes`` / ``kept_fraction``: the turns' summaries that compare's cost columns read,
  computed here from the stored turns as ``db.claims.turn_means`` computes them at finish;
- ``jobs.counts``: episode keys per status of their newest attempt (``db.job_status``), counted here once;
- indexes: ``(job_id, episode_key, attempt, driver, status)`` covers the newest / result attempt subqueries (it
  replaces ``(job_id, episode_key)``), ``(job_id, method)`` and ``(job_id, task_id)`` serve the lists' filters;
- SQLite: ``episodes``' payloads (result, patch, test_log, retention) become the row's last columns, after the
  small ones a job-level read selects (SQLite walks a row's overflow pages to reach a later column).

Column type changes are add-convert-drop-rename, in place on SQLite (>= 3.35), never a batch table rebuild (see
0007: on SQLite a rebuild of ``episodes`` would cascade-delete its turns). Rows are converted in keyset-paged
batches, so memory stays flat whatever the database's size. The downgrade restores the JSON exactly.
"""

from __future__ import annotations

import json
import zlib
from array import array
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# Written out here (not imported from db) so this revision never changes when the code does.
JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
#: rows per batch: a turn's stream parses to ~10^3 ints; an episode's retention map to ~10^4 small lists (2,000 of
#: those at once was 3.7 GB), so both go in small batches
BATCH = {"turns": 500, "episodes": 50}
TAIL = "user_message_after_observation"


def _pack_tokens(stream: dict[str, Any]) -> bytes:
    if set(stream) != {"keep", "append", "generated"}:
        raise ValueError(f"a stored token stream has the keys {sorted(stream)}")
    ids = array("I", [stream["keep"], len(stream["append"]), len(stream["generated"])])
    ids.extend(stream["append"])
    ids.extend(stream["generated"])
    if ids.itemsize != 4:
        raise AssertionError("array('I') is not 4 bytes here")
    import sys

    if sys.byteorder != "little":
        ids.byteswap()
    return b"T1" + zlib.compress(ids.tobytes(), 6)


def _unpack_tokens(stored: bytes) -> dict[str, Any]:
    ids = array("I")
    ids.frombytes(zlib.decompress(bytes(stored[2:])))
    import sys

    if sys.byteorder != "little":
        ids.byteswap()
    n_append = ids[1]
    return {"keep": ids[0], "append": ids[3 : 3 + n_append].tolist(), "generated": ids[3 + n_append :].tolist()}


def _pack_json(value: Any) -> bytes:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return b"J1" + zlib.compress(text.encode("utf-8"), 6)


def _unpack_json(stored: bytes) -> Any:
    return json.loads(zlib.decompress(bytes(stored[2:])).decode("utf-8"))


def _as_json(value: Any) -> Any:
    """A JSON column's value as the driver hands it back (SQLite: text; PostgreSQL: already parsed)."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def _drop_column(table: str, column: str) -> None:
    if op.get_bind().dialect.name == "sqlite":  # in place (SQLite >= 3.35), never a rebuild (module docstring)
        op.execute(f'ALTER TABLE {table} DROP COLUMN "{column}"')
    else:
        op.drop_column(table, column)


def _pages(table: sa.TableClause, key: sa.ColumnClause, columns: list[sa.ColumnClause]) -> Iterator[list[Any]]:
    """The rows of ``table`` in keyset-paged batches (:data:`BATCH`), by ``key``."""
    bind, last = op.get_bind(), None
    while True:
        query = sa.select(key, *columns).order_by(key).limit(BATCH[table.name])
        if last is not None:
            query = query.where(key > last)
        rows = bind.execute(query).all()
        if not rows:
            return
        yield rows
        last = rows[-1][0]


def _convert(table: str, key: str, column: str, new_type: Any, old_type: Any, change: Callable[[Any], Any]) -> None:
    """Replace ``table.column`` (``old_type``) by a ``new_type`` column holding ``change(value)`` of each non-NULL
    value: add ``column__new``, fill it batch by batch, drop the old column, rename the new one."""
    bind, new = op.get_bind(), f"{column}__new"
    op.add_column(table, sa.Column(new, new_type, nullable=True))
    t = sa.table(table, sa.column(key), sa.column(column, old_type), sa.column(new, new_type))
    for rows in _pages(t, t.c[key], [t.c[column]]):
        values = [{"k": k, "v": change(v)} for k, v in rows if v is not None]
        if values:
            bind.execute(sa.update(t).where(t.c[key] == sa.bindparam("k")).values({new: sa.bindparam("v")}), values)
    _drop_column(table, column)
    op.alter_column(table, new, new_column_name=column)


def _strip_user_messages(keep_tail: bool) -> None:
    """``turns.extra``: the user message stored as its tail after the observation (``keep_tail``), or whole."""
    bind = op.get_bind()
    t = sa.table("turns", sa.column("id"), sa.column("observation"), sa.column("extra", JSON))
    for rows in _pages(t, t.c.id, [t.c.observation, t.c.extra]):
        changed = []
        for turn_id, observation, raw in rows:
            extra = _as_json(raw)
            if not isinstance(extra, dict):
                continue
            if keep_tail and observation and isinstance(extra.get("user_message"), str):
                if extra["user_message"].startswith(observation):
                    tail = extra["user_message"][len(observation) :]
                    changed.append({"k": turn_id, "v": {**extra, "user_message": None, TAIL: tail}})
            elif not keep_tail and TAIL in extra:
                whole = (observation or "") + extra[TAIL]
                changed.append(
                    {"k": turn_id, "v": {k: v for k, v in extra.items() if k != TAIL} | {"user_message": whole}}
                )
        if changed:
            bind.execute(sa.update(t).where(t.c.id == sa.bindparam("k")).values(extra=sa.bindparam("v")), changed)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _episode_summaries() -> None:
    """``episodes.mean_kv_held_bytes`` / ``kept_fraction`` from the stored turns (``db.claims.turn_means``), for
    every episode that has turns; streamed in turn order so memory holds one batch."""
    bind = op.get_bind()
    turns = sa.table(
        "turns",
        sa.column("id"),
        sa.column("episode_id"),
        sa.column("index"),
        sa.column("kv_held_bytes"),
        sa.column("physical_after", JSON),
        sa.column("logical_length"),
    )
    episodes = sa.table("episodes", sa.column("id"), sa.column("mean_kv_held_bytes"), sa.column("kept_fraction"))
    held: dict[str, list[float]] = defaultdict(list)
    kept: dict[str, list[float]] = defaultdict(list)
    seen: set[str] = set()
    for rows in _pages(
        turns, turns.c.id, [turns.c.episode_id, turns.c.kv_held_bytes, turns.c.physical_after, turns.c.logical_length]
    ):
        for _, episode_id, kv_held, physical_after, logical_length in rows:
            seen.add(episode_id)
            if kv_held is not None:
                held[episode_id].append(float(kv_held))
            slots = (_as_json(physical_after) or {}).get("mean")
            if slots is not None and logical_length:
                kept[episode_id].append(float(slots) / logical_length)
    values = [{"k": e, "h": _mean(held.get(e, [])), "f": _mean(kept.get(e, []))} for e in sorted(seen)]
    for start in range(0, len(values), BATCH["turns"]):
        bind.execute(
            sa.update(episodes)
            .where(episodes.c.id == sa.bindparam("k"))
            .values(mean_kv_held_bytes=sa.bindparam("h"), kept_fraction=sa.bindparam("f")),
            values[start : start + BATCH["turns"]],
        )


def _job_counts() -> None:
    """``jobs.counts``: episode keys per status of their newest attempt, counted once from the rows."""
    bind = op.get_bind()
    e = sa.table("episodes", sa.column("job_id"), sa.column("episode_key"), sa.column("attempt"), sa.column("status"))
    jobs = sa.table("jobs", sa.column("id"), sa.column("counts", JSON))
    newest = (
        sa.select(e.c.job_id, e.c.episode_key, sa.func.max(e.c.attempt).label("attempt"))
        .group_by(e.c.job_id, e.c.episode_key)
        .subquery()
    )
    joined = sa.and_(
        e.c.job_id == newest.c.job_id, e.c.episode_key == newest.c.episode_key, e.c.attempt == newest.c.attempt
    )
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    query = sa.select(e.c.job_id, e.c.status, sa.func.count()).select_from(e.join(newest, joined))
    for job_id, status, n in bind.execute(query.group_by(e.c.job_id, e.c.status)):
        counts[job_id][status] += n
    job_ids = [row[0] for row in bind.execute(sa.select(jobs.c.id))]
    values = [{"k": j, "v": dict(sorted(counts[j].items()))} for j in job_ids]
    if values:
        bind.execute(sa.update(jobs).where(jobs.c.id == sa.bindparam("k")).values(counts=sa.bindparam("v")), values)


def _move_to_end(table: str, column: str, column_type: Any) -> None:
    """SQLite: put ``column`` last in the row (add a copy, drop the original, rename the copy). SQLite reads a
    column by walking the row from its start, through the overflow pages of every large value before it, so the
    payloads go after the small columns a job-level read selects."""
    new = f"{column}__new"
    op.add_column(table, sa.Column(new, column_type, nullable=True))
    op.execute(f'UPDATE {table} SET "{new}" = "{column}"')
    _drop_column(table, column)
    op.alter_column(table, new, new_column_name=column)


def upgrade() -> None:
    _convert("turns", "id", "tokens", sa.LargeBinary(), JSON, lambda v: _pack_tokens(_as_json(v)))
    _strip_user_messages(keep_tail=True)
    op.add_column("episodes", sa.Column("mean_kv_held_bytes", sa.Float(), nullable=True))
    op.add_column("episodes", sa.Column("kept_fraction", sa.Float(), nullable=True))
    _episode_summaries()
    if op.get_bind().dialect.name == "sqlite":  # PostgreSQL keeps large values out of the row (TOAST) already
        for column, column_type in (("result", JSON), ("patch", sa.Text()), ("test_log", sa.Text())):
            _move_to_end("episodes", column, column_type)
    # converted last, so the largest payload is also the row's last column on SQLite
    _convert("episodes", "id", "retention", sa.LargeBinary(), JSON, lambda v: _pack_json(_as_json(v)))
    op.add_column("jobs", sa.Column("counts", JSON, nullable=True))
    _job_counts()
    op.drop_index("ix_episodes_job_key", table_name="episodes")
    op.create_index("ix_episodes_job_key_attempt", "episodes", ["job_id", "episode_key", "attempt", "driver", "status"])
    op.create_index("ix_episodes_job_method", "episodes", ["job_id", "method"])
    op.create_index("ix_episodes_job_task", "episodes", ["job_id", "task_id"])


def downgrade() -> None:
    for name in ("ix_episodes_job_task", "ix_episodes_job_method", "ix_episodes_job_key_attempt"):
        op.drop_index(name, table_name="episodes")
    op.create_index("ix_episodes_job_key", "episodes", ["job_id", "episode_key"])
    _drop_column("jobs", "counts")
    _drop_column("episodes", "kept_fraction")
    _drop_column("episodes", "mean_kv_held_bytes")
    _convert("episodes", "id", "retention", JSON, sa.LargeBinary(), _unpack_json)
    _strip_user_messages(keep_tail=False)
    _convert("turns", "id", "tokens", JSON, sa.LargeBinary(), _unpack_tokens)
