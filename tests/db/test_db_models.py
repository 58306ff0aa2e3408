"""Schema and migrations: alembic head creates exactly the models' schema on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select
from sqlalchemy.exc import IntegrityError

import db.measure_models  # noqa: F401  (its tables are on Base.metadata too: the migrations make them)
from db import Episode, Job, Turn, connect, default_url, sqlite_url
from db.connection import current_revision, head_revision, make_engine, migrate
from db.models import Base
from tests.support.db_fixtures import any_db_fixture, make_pg_database, sqlite_db_fixture  # noqa: F401  (fixtures)


def _job(**kw) -> Job:
    return Job(config={"name": "x"}, config_hash="0" * 64, package_versions={}, **kw)


def test_migrate_to_head_matches_models(any_db):
    assert current_revision(any_db.url) == head_revision()
    with any_db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    assert diff == []
    assert {"jobs", "episodes", "turns", "alembic_version"} <= set(inspect(any_db.engine).get_table_names())


def test_migrate_is_idempotent(tmp_path):
    url = sqlite_url(tmp_path / "sub" / "dir" / "x.db")  # parent folders are created
    migrate(url)
    migrate(url)
    assert current_revision(url) == head_revision()


def test_default_url_from_env(monkeypatch, tmp_path):
    monkeypatch.delenv("NEXUS_EVAL_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_url() == f"sqlite:///{tmp_path.resolve()}/runs/nexus-eval.db"
    monkeypatch.setenv("NEXUS_EVAL_DB", str(tmp_path / "other.db"))
    assert default_url() == f"sqlite:///{tmp_path.resolve()}/other.db"
    monkeypatch.setenv("NEXUS_EVAL_DB", "postgresql+psycopg://u:p@127.0.0.1/x")
    assert default_url() == "postgresql+psycopg://u:p@127.0.0.1/x"


def test_postgres_urls_use_psycopg3():
    with pytest.raises(ValueError, match="psycopg"):
        make_engine("postgresql+psycopg2://u:p@127.0.0.1/x")
    engine = make_engine("postgresql://u:p@127.0.0.1/x")  # no driver named: psycopg 3, never psycopg2
    assert engine.dialect.driver == "psycopg"
    engine.dispose()


def test_round_trip_json_and_aware_datetimes(any_db):
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    with any_db.session() as s:
        job = _job(name="rt", created_at=when)
        s.add(job)
        s.flush()
        ep = Episode(
            job_id=job.id,
            task_id="t1",
            method="nexus",
            scope="prefill_only",
            protocol="true_eviction",
            seed=0,
            episode_key="k",
            config={"density": 0.2, "nested": {"a": [1, 2]}},
        )
        s.add(ep)
        s.flush()
        s.add(Turn(episode_id=ep.id, index=0, physical_before={"min": 1.0, "mean": 2.5, "max": 4.0}))
        job_id, ep_id = job.id, ep.id
    with any_db.session() as s:
        job = s.get(Job, job_id)
        assert job.created_at == when and job.created_at.tzinfo is not None
        assert job.status == "pending" and len(job.id) == 8
        ep = s.get(Episode, ep_id)
        assert ep.config == {"density": 0.2, "nested": {"a": [1, 2]}}
        assert ep.status == "queued" and ep.attempt == 1 and ep.n_claims == 0
        assert [t.physical_before for t in ep.turns] == [{"min": 1.0, "mean": 2.5, "max": 4.0}]


def test_naive_datetime_is_refused(sqlite_db):
    with pytest.raises(Exception, match="naive datetime"), sqlite_db.session() as s:
        s.add(_job(created_at=datetime(2026, 1, 1)))
        s.flush()


def test_constraints(any_db):
    with any_db.session() as s:
        job = _job()
        s.add(job)
        s.flush()
        job_id = job.id
    key = dict(task_id="t", method="dense", scope="prefill_only", protocol="full_context", seed=1, episode_key="k")
    with any_db.session() as s:
        s.add(Episode(job_id=job_id, attempt=1, **key))
    with pytest.raises(IntegrityError), any_db.session() as s:  # same key, same attempt
        s.add(Episode(job_id=job_id, attempt=1, **key))
    with pytest.raises(IntegrityError), any_db.session() as s:  # unknown status word
        s.add(Episode(job_id=job_id, attempt=2, status="finished", **key))
    with pytest.raises(IntegrityError), any_db.session() as s:  # episode of a job that does not exist
        s.add(Episode(job_id="nosuchjob", attempt=1, **key))
    with any_db.session() as s:
        s.add(Episode(job_id=job_id, attempt=2, **key))
    with any_db.session() as s:
        assert sorted(s.execute(select(Episode.attempt)).scalars()) == [1, 2]


def test_in_memory_sqlite_is_refused():
    with pytest.raises(ValueError, match="in-memory SQLite"):
        connect("sqlite://")


def test_connect_without_upgrade_on_empty_db(tmp_path):
    db = connect(sqlite_url(tmp_path / "empty.db"), upgrade=False)
    assert current_revision(db.url) is None
    db.dispose()


def _migrate_concurrently(url: str, n: int = 4) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def run() -> None:
        try:
            barrier.wait(timeout=30)
            migrate(url)
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert current_revision(url) == head_revision()


def test_concurrent_migrations_sqlite(tmp_path):
    _migrate_concurrently(sqlite_url(tmp_path / "fresh.db"))


@pytest.mark.services
def test_concurrent_migrations_postgresql():
    url, drop = make_pg_database()
    try:
        _migrate_concurrently(url)
    finally:
        drop()


def test_downgrade_to_base_and_back(tmp_path):
    from alembic import command

    from db.connection import _alembic_config

    url = sqlite_url(tmp_path / "down.db")
    migrate(url)
    command.downgrade(_alembic_config(url), "base")
    engine = make_engine(url)
    assert set(inspect(engine).get_table_names()) == {"alembic_version"}
    engine.dispose()
    migrate(url)
    assert current_revision(url) == head_revision()


def test_every_package_speaks_the_stored_status_words():
    """The agent's exit statuses and the graders' verdicts are the words db.models stores and groups."""
    from typing import get_args

    from agent_runner.agent import AgentExit
    from agent_runner.records import ExitStatus
    from db.models import AGENT_EXIT_STATUSES, GRADE_STATUSES, RUN_FAILURE_STATUSES, EpisodeStatus
    from env.grading import Status

    exits = {cls.exit_status for cls in AgentExit.__subclasses__()}
    assert exits == set(get_args(ExitStatus)) == AGENT_EXIT_STATUSES | {"infra_failure"}
    assert set(get_args(Status)) == GRADE_STATUSES | RUN_FAILURE_STATUSES
    assert exits | set(get_args(Status)) <= {s.value for s in EpisodeStatus}


def test_downgrading_below_a_column_migration_keeps_every_turn_on_sqlite(tmp_path):
    """A batch rebuild of ``episodes`` on SQLite drops the table, and ON DELETE CASCADE deletes every turn."""
    from alembic import command

    from db import connect, job_rows
    from db import store as st
    from db.connection import _alembic_config
    from tests.db.test_db_store import Key

    url = sqlite_url(tmp_path / "turns.db")
    db = connect(url)
    with db.session() as s:
        job = job_rows.create_job(s, config={}, config_hash="c" * 64, name="t")
        (ep,) = job_rows.add_episodes(s, job.id, [Key("a", "dense")])
        claim = st.claim_episode(s, ep.id)
    for index in range(2):
        with db.session() as s:
            st.record_turn(s, claim, index, completion="x")
    db.dispose()
    command.downgrade(_alembic_config(url), "0002")
    engine = make_engine(url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM turns").scalar_one() == 2
    engine.dispose()


def _store_rows_before_0007(url: str) -> None:
    """A database at revision 0006 holding what it stored then: turns.cache_bytes, episodes.peak_cache_bytes,
    probe_results.kv_bytes (one episode whose backend reported no cache: NULL)."""
    from alembic import command
    from sqlalchemy import MetaData

    from db.connection import _alembic_config

    command.upgrade(_alembic_config(url), "0006")
    engine = make_engine(url)
    t = MetaData()
    t.reflect(engine)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    episode = dict(job_id="j1", method="snapkv", scope="prefill_only", protocol="true_eviction", seed=0, attempt=1)
    episode |= dict(status="resolved", created_at=now, n_claims=1, config={}, driver="agent")
    turn = dict(tokens_appended=1, tokens_generated=1, prompt_tokens=1, logical_length=2, eviction_events=0)
    turn |= dict(prefill_s=0.0, decode_s=0.0, env_s=0.0, completion="x", extra={}, created_at=now)
    result = dict(run_id="p1", probe="needle", scope="prefill_only", protocol="single_prefill", density=0.2)
    result |= dict(sample=0, source="s", length=300, scored_tokens=0, answer="a", expected="a", kept_fraction=0.2)
    with engine.begin() as conn:
        conn.execute(t.tables["jobs"].insert(), [dict(id="j1", created_at=now, updated_at=now, status="done",
                     config={}, config_hash="0" * 64, package_versions={})])  # fmt: skip
        conn.execute(t.tables["episodes"].insert(), [
            dict(id="e0", task_id="t0", episode_key="k0", peak_cache_bytes=300, **episode),
            dict(id="e1", task_id="t1", episode_key="k1", peak_cache_bytes=None, **episode),
        ])  # fmt: skip
        conn.execute(t.tables["turns"].insert(), [
            dict(episode_id="e0", index=0, cache_bytes=100, **turn),
            dict(episode_id="e0", index=1, cache_bytes=300, **turn),
            dict(episode_id="e1", index=0, cache_bytes=None, **turn),
        ])  # fmt: skip
        conn.execute(t.tables["probe_runs"].insert(), [dict(id="p1", created_at=now, status="done", model="m",
                     settings={}, provenance={}, n_planned=2, n_results=2)])  # fmt: skip
        conn.execute(t.tables["probe_results"].insert(), [
            dict(variant="snapkv", kv_bytes=4096, seconds=1.0, **result),
            dict(variant="dense", kv_bytes=2**40, seconds=1.0, **result),
        ])  # fmt: skip
    engine.dispose()


def _check_0007_keeps_every_value(url: str) -> None:
    from alembic import command

    from db.connection import _alembic_config

    _store_rows_before_0007(url)
    migrate(url)
    engine = make_engine(url)
    with engine.connect() as conn:
        turns = conn.exec_driver_sql(
            "SELECT kv_allocated_bytes, kv_held_bytes, kv_peak_held_bytes, kv_peak_allocated_bytes FROM turns "
            'ORDER BY episode_id, "index"'
        ).all()
        episodes = conn.exec_driver_sql(
            "SELECT id, kv_peak_held_bytes, kv_peak_allocated_bytes FROM episodes ORDER BY id"
        ).all()
        results = conn.exec_driver_sql(
            "SELECT variant, kv_allocated_bytes, kv_held_bytes, kv_peak_held_bytes, kv_peak_allocated_bytes "
            "FROM probe_results ORDER BY variant"
        ).all()
    # the renamed columns keep their values; the new ones are NULL (never 0); the old post-turn "peak" is gone
    assert [tuple(r) for r in turns] == [(100, None, None, None), (300, None, None, None), (None, None, None, None)]
    assert [tuple(r) for r in episodes] == [("e0", None, None), ("e1", None, None)]
    assert [tuple(r) for r in results] == [("dense", 2**40, None, None, None), ("snapkv", 4096, None, None, None)]
    assert "peak_cache_bytes" not in {c["name"] for c in inspect(engine).get_columns("episodes")}
    engine.dispose()
    command.downgrade(_alembic_config(url), "0006")  # and back: every value where it was
    engine = make_engine(url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql('SELECT cache_bytes FROM turns ORDER BY episode_id, "index"').scalars().all() == [
            100,
            300,
            None,
        ]
        peaks = conn.exec_driver_sql("SELECT peak_cache_bytes FROM episodes ORDER BY id").scalars().all()
        assert peaks == [300, None]
        kv = conn.exec_driver_sql("SELECT kv_bytes FROM probe_results ORDER BY variant").scalars().all()
        assert kv == [2**40, 4096]
    engine.dispose()


def test_0007_renames_kv_columns_without_losing_a_value_sqlite(tmp_path):
    _check_0007_keeps_every_value(sqlite_url(tmp_path / "old.db"))


@pytest.mark.services
def test_0007_renames_kv_columns_without_losing_a_value_postgresql():
    url, drop = make_pg_database()
    try:
        _check_0007_keeps_every_value(url)
    finally:
        drop()


def test_the_shipped_head_read_from_file_names_is_alembics_head():
    from db.connection import shipped_head

    assert shipped_head() == head_revision()


def test_opening_an_up_to_date_database_imports_no_alembic(tmp_path):
    """A read verb (``status``, ``compare``) opens the database on every call: an up-to-date one costs one SELECT,
    not an Alembic environment (~0.3 s of imports and script parsing)."""
    import subprocess
    import sys

    url = sqlite_url(tmp_path / "x.db")
    migrate(url)
    code = f"import sys; from db import connect; connect({url!r}); print('alembic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    fresh = sqlite_url(tmp_path / "new.db")
    code = f"import sys; from db import connect; connect({fresh!r}); print('alembic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"  # a fresh one is migrated
