"""Revision 0009 keeps every stored value: token streams and retention maps read back bit-identical through the
packed columns, the user message whole through its stored tail, and the downgrade restores the JSON exactly; the
summaries and counts it fills equal a recount from the rows."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest
from alembic import command
from sqlalchemy import MetaData, select

from db import Episode, Job, Turn, connect, sqlite_url
from db.connection import _alembic_config, make_engine, migrate
from db.finishing import turn_means
from db.job_status import recount
from results.turn_data import TurnExtra
from tests.support.db_fixtures import make_pg_database

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _streams() -> list[dict | None]:
    rng = random.Random(9)
    return [
        {"keep": 0, "append": [151643, 0, 2**32 - 1], "generated": []},  # the extremes of a uint32
        {"keep": 5, "append": [], "generated": [7]},
        {"keep": 1234, "append": [rng.randrange(151936) for _ in range(3000)], "generated": [1, 2, 3]},
        None,  # a backend without a stream (stored as JSON null before)
    ]


PATCH = "diff --git a/x b/x\n+ok\n"
RETENTION = {"logical_length": 7, "kv_heads": 2, "layers": [[[2, 3], [1, 2], [0, 2]], [[1, 7]]]}
OBSERVATION = "line one\nline two ✓"
EXTRAS = [
    {"user_message": OBSERVATION + "\n[3 steps left]", "model_s": 0.5},  # observation + budget line: a tail
    {"user_message": "a reply that does not start with it", "intervened": True},  # kept whole
    {"user_message": None},  # the last turn
]


def _store_rows_at_0008(url: str) -> None:
    """Rows as revision 0008 stored them: JSON text streams, retention and user messages, no counts."""
    command.upgrade(_alembic_config(url), "0008")
    engine = make_engine(url)
    t = MetaData()
    t.reflect(engine)
    episode = dict(job_id="j1", method="snapkv", scope="prefill_only", protocol="true_eviction", seed=0)
    episode |= dict(created_at=NOW, n_claims=1, config={}, driver="agent")
    none = dict(patch=None, test_log=None, result=None)
    turn = dict(tokens_appended=1, tokens_generated=1, prompt_tokens=1, eviction_events=0, prefill_s=0.0)
    turn |= dict(decode_s=0.0, env_s=0.0, completion="x", created_at=NOW, observation=OBSERVATION)
    streams = _streams()
    with engine.begin() as conn:
        conn.execute(t.tables["jobs"].insert(), [dict(id="j1", created_at=NOW, updated_at=NOW, status="running",
                     config={}, config_hash="0" * 64, package_versions={})])  # fmt: skip
        conn.execute(t.tables["episodes"].insert(), [
            dict(id="e0", task_id="t0", episode_key="k0", attempt=1, status="infra_failure", retention=RETENTION,
                 patch=PATCH, test_log="a log ✓", result={"grade": {"needs_network": True}}, **episode),
            dict(id="e1", task_id="t0", episode_key="k0", attempt=2, status="resolved", retention=None, **none,
                 **episode),
            dict(id="e2", task_id="t1", episode_key="k1", attempt=1, status="running", retention=None, **none,
                 **episode),
        ])  # fmt: skip
        conn.execute(t.tables["turns"].insert(), [
            dict(episode_id="e0", index=i, tokens=s, extra=EXTRAS[i % 3], kv_held_bytes=100 * (i + 1) if i else None,
                 physical_after={"min": 1, "mean": 2.5 + i, "max": 4}, logical_length=10 * i, **turn)
            for i, s in enumerate(streams)
        ])  # fmt: skip
    engine.dispose()


def _check(url: str) -> None:
    _store_rows_at_0008(url)
    migrate(url)
    db = connect(url, upgrade=False)
    with db.session() as s:
        turns = s.execute(select(Turn).where(Turn.episode_id == "e0").order_by(Turn.index)).scalars().all()
        assert [t.tokens for t in turns] == _streams()  # bit-identical, through the packed column
        assert [TurnExtra.of_row(t).user_message for t in turns] == [EXTRAS[i % 3]["user_message"] for i in range(4)]
        assert turns[0].extra["user_message"] is None  # the observation is no longer repeated
        e0 = s.get(Episode, "e0")
        assert e0.retention == RETENTION and s.get(Episode, "e1").retention is None
        assert (e0.patch, e0.test_log, e0.result, e0.needs_network) == (
            PATCH,
            "a log ✓",
            {"grade": {"needs_network": True}},
            True,
        )
        expected = turn_means((t.kv_held_bytes, t.physical_after, t.logical_length) for t in turns)
        assert (e0.mean_kv_held_bytes, e0.kept_fraction) == (expected["mean_kv_held_bytes"], expected["kept_fraction"])
        assert e0.mean_kv_held_bytes == 300.0  # turns 1..3 report 200, 300, 400 bytes; turn 0 none
        assert e0.kept_fraction == pytest.approx((3.5 / 10 + 4.5 / 20 + 5.5 / 30) / 3)  # turn 0 has no length
        assert s.get(Job, "j1").counts == recount(s, "j1") == {"result": {"resolved": 1, "running": 1}}  # 0010's form
    db.dispose()
    command.downgrade(_alembic_config(url), "0008")  # and back: the JSON exactly as it was
    engine = make_engine(url)
    t = MetaData()
    t.reflect(engine)
    with engine.connect() as conn:
        rows = conn.execute(select(t.tables["turns"].c.tokens, t.tables["turns"].c.extra).order_by("index")).all()
        assert [r.tokens for r in rows] == _streams()
        assert [r.extra for r in rows] == [EXTRAS[i % 3] for i in range(4)]
        retention = conn.execute(select(t.tables["episodes"].c.retention).order_by("id")).scalars().all()
        assert retention == [RETENTION, None, None]
    engine.dispose()


def test_0009_keeps_every_stream_and_map_sqlite(tmp_path):
    _check(sqlite_url(tmp_path / "old.db"))


@pytest.mark.services
def test_0009_keeps_every_stream_and_map_postgresql():
    url, drop = make_pg_database()
    try:
        _check(url)
    finally:
        drop()
