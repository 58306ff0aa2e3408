"""Revision 0010 stores ``jobs.counts`` by the one result rule (``db.attempt_roles``): what a recount gives, with
a resample, an interactive attempt and a replaced broken run among the rows; the downgrade counts newest attempts
as 0009 did."""

from __future__ import annotations

from datetime import UTC, datetime

from alembic import command
from sqlalchemy import MetaData, select

from db import Job, connect, sqlite_url
from db.connection import _alembic_config, make_engine, migrate
from db.job_status import recount

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ATTEMPTS = [  # (key, attempt, driver, status)
    ("k0", 1, "agent", "unresolved"),  # the result
    ("k0", 2, "agent", "resolved"),  # a resample: 0009 counted it (the newest), compare did not
    ("k1", 1, "agent", "infra_failure"),  # replaced by its retry
    ("k1", 2, "agent", "resolved"),
    ("k1", 3, "interactive", "running"),
]


def test_0010_counts_each_keys_result_and_keeps_the_rest_apart(tmp_path):
    url = sqlite_url(tmp_path / "old.db")
    command.upgrade(_alembic_config(url), "0009")
    engine = make_engine(url)
    t = MetaData()
    t.reflect(engine)
    episode = dict(job_id="j1", method="dense", scope="prefill_only", protocol="true_eviction", seed=0)
    episode |= dict(created_at=NOW, n_claims=1, config={})
    with engine.begin() as conn:
        conn.execute(
            t.tables["jobs"].insert(),
            [
                dict(
                    id="j1",
                    created_at=NOW,
                    updated_at=NOW,
                    status="running",
                    config={},
                    config_hash="0" * 64,
                    package_versions={},
                    counts={"resolved": 2, "running": 1},
                )
            ],
        )
        conn.execute(t.tables["episodes"].insert(), [
            dict(id=f"e{i}", task_id=k, episode_key=k, attempt=a, driver=d, status=s, **episode)
            for i, (k, a, d, s) in enumerate(ATTEMPTS)
        ])  # fmt: skip
    engine.dispose()

    migrate(url)
    db = connect(url, upgrade=False)
    with db.session() as s:
        counts = s.get(Job, "j1").counts
        assert counts == recount(s, "j1")
    db.dispose()
    assert counts == {"result": {"resolved": 1, "unresolved": 1}, "resample": {"resolved": 1},
                      "interactive": {"running": 1}}  # fmt: skip

    command.downgrade(_alembic_config(url), "0009")
    engine = make_engine(url)
    t = MetaData()
    t.reflect(engine)
    with engine.connect() as conn:
        assert conn.execute(select(t.tables["jobs"].c.counts)).scalar_one() == {"resolved": 1, "running": 1}
    engine.dispose()
