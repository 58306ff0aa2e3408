"""Revision 0011 adds ``replays.dtype``: a replay row stored at 0010 upgrades with its dtype NULL ("not recorded",
never guessed) and every other value kept, its key among them; the downgrade drops the column and keeps the row."""

from __future__ import annotations

from datetime import UTC, datetime

from alembic import command
from sqlalchemy import MetaData, select

from db import connect, sqlite_url
from db.connection import _alembic_config, make_engine, migrate
from db.measure_models import Replay
from db.replays import config_key

NOW = datetime(2026, 1, 1, tzinfo=UTC)
CONFIG = {"method": "snapkv", "density": 0.2}
ACTION = {"tokens": {"copy": 9}, "spans": {"copy": 2}, "top1": {"copy": 0.5}}
TURNS = [{"index": 0, "tokens": 12, "nll_mean": 1.25, "top1": 0.5, "spans": []}]
REPLAY = dict(
    id=7, job_id="j1", episode_id="e1", task_id="t1", method="snapkv", scope="prefill_only",
    protocol="true_eviction", config_key=config_key(CONFIG, "smollm2-135m"), config=CONFIG, chunked=False,
    status="ok", error=None, tokens=12, nll_mean=1.25, top1=0.5, turns=TURNS, seconds=0.75, model="smollm2-135m",
    action=ACTION, created_at=NOW,
)  # fmt: skip


def _replays(url: str) -> list[dict]:
    engine = make_engine(url)
    t = MetaData()
    t.reflect(engine)
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(select(t.tables["replays"]))]
    engine.dispose()
    return rows


def test_0011_adds_a_null_dtype_and_keeps_every_replay_value(tmp_path):
    url = sqlite_url(tmp_path / "old.db")
    command.upgrade(_alembic_config(url), "0010")
    engine = make_engine(url)
    t = MetaData()
    t.reflect(engine)
    assert "dtype" not in t.tables["replays"].c
    episode = dict(id="e1", job_id="j1", task_id="t1", episode_key="k1", attempt=1, driver="agent", method="dense")
    episode |= dict(scope="prefill_only", protocol="true_eviction", seed=0, status="resolved", created_at=NOW)
    episode |= dict(n_claims=1, config={})
    with engine.begin() as conn:
        conn.execute(t.tables["jobs"].insert(), [dict(id="j1", created_at=NOW, updated_at=NOW, status="done",
                     config={}, config_hash="0" * 64, package_versions={}, counts={})])  # fmt: skip
        conn.execute(t.tables["episodes"].insert(), [episode])
        conn.execute(t.tables["replays"].insert(), [REPLAY])
    engine.dispose()
    (before,) = _replays(url)

    migrate(url)
    (after,) = _replays(url)
    assert after.pop("dtype") is None
    assert after == before
    db = connect(url, upgrade=False)
    with db.session() as s:
        row = s.get(Replay, 7)
        assert row.dtype is None and row.config == CONFIG and row.turns == TURNS and row.action == ACTION
        assert (row.model, row.nll_mean, row.chunked) == ("smollm2-135m", 1.25, False)
        assert row.config_key == config_key(CONFIG, "smollm2-135m", None)  # its stored key stays valid
    db.dispose()

    command.downgrade(_alembic_config(url), "0010")
    (down,) = _replays(url)
    assert down == before
