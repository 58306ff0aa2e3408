"""A message taken but not yet claimed (``db.taken_messages``): an episode task marks its ``queued`` row as taken by its
worker before it waits for Docker; a sweep sends the row again when that worker is gone before claiming it (its row in
``workers`` gone or silent, its pid dead on this host, or no row and an old mark), never while it is alive (reporting,
or ``paused`` waiting for Docker). The claim and every re-send clear the mark. On SQLite with recording senders; the
last test kills a real worker that waits for Docker on Redis + PostgreSQL."""

from __future__ import annotations

import subprocess
from datetime import timedelta
from types import SimpleNamespace

import pytest
from alembic import command
from sqlalchemy import MetaData, select
from sqlalchemy.exc import OperationalError

from db import job_rows, sqlite_url
from db import store as db_store
from db.claims import claim_episode
from db.connection import _alembic_config, make_engine, migrate
from db.models import GRADE_STATUSES, utcnow
from db.process_identity import local_pid, worker_identity
from db.taken_messages import note_taken
from db.worker_rows import mark_gone_workers, report_worker
from jobs.settings import LIVENESS, ServiceSettings
from tests.conftest import docker_status, require
from tests.db.test_liveness import _claim, _job, _row, _submitted
from tests.support.db_fixtures import any_db_fixture, pg_db_fixture, sqlite_db_fixture  # noqa: F401  (fixtures)
from tests.support.worker_fixtures import (
    Worker,
    fresh_redis_url,
    job_done,
    oracle_job,
    service_env,
    submit_file,
    wait_until,
    write_job,
)
from tests.workers.test_fault_recovery import FAST, _evidence, _kill_group, assert_finished_exactly_once
from tests.workers.test_recovery import Senders
from workers import celery_tasks
from workers.faults.recovery import resume_job, sweep

GONE_S = LIVENESS.worker_gone_after_s
LONG_AGO = timedelta(seconds=GONE_S + 30)  # older than the workers' bound


def _report(db, name: str, state: str = "ok", ago: timedelta = timedelta(0)) -> None:
    with db.session() as s:
        report_worker(s, name, queues="gpu", state=state, now=utcnow() - ago)


def _take(db, episode_id: str, worker: str, ago: timedelta = timedelta(seconds=5)) -> bool:
    with db.session() as s:
        return note_taken(s, episode_id, worker, utcnow() - ago)


def _mark(db, episode_id: str) -> tuple[str | None, object]:
    row = _row(db, episode_id)
    return row.taken_by, row.taken_at


def _dead_local_worker() -> str:
    """The identity of a process of this host and pid namespace that has exited."""
    child = subprocess.Popen(["true"])
    child.wait()
    host, _pid, kernel = worker_identity().split("/")
    return f"{host}/{child.pid}/{kernel}"


def test_a_queued_row_taken_by_a_gone_worker_is_sent_again_once_and_its_mark_cleared(sqlite_db):
    db, senders = sqlite_db, Senders()
    _, (by_gone, by_silent) = _job(db, 2)
    _report(db, "host-a/41/k", ago=LONG_AGO)
    with db.session() as s:
        assert mark_gone_workers(s, silent_s=GONE_S) == ["host-a/41/k"]
    _report(db, "host-b/42/k", ago=LONG_AGO)  # silent past the bound, not marked gone yet
    assert _take(db, by_gone, "host-a/41/k") and _take(db, by_silent, "host-b/42/k")

    first = sweep(db, LIVENESS, **senders.kw(), docker_up=False)
    assert sorted(first.taken) == sorted(senders.runs) == sorted([by_gone, by_silent])
    assert "2 queued run(s) whose message a gone worker took sent again" in first.describe()
    for episode_id in (by_gone, by_silent):
        assert _mark(db, episode_id) == (None, None) and _row(db, episode_id).status == "queued"
    assert not sweep(db, LIVENESS, **senders.kw(), docker_up=False)  # sent once: another sweeper finds no mark
    assert len(senders.runs) == 2


def test_a_row_taken_by_a_live_or_paused_worker_is_left_alone_and_a_workerless_mark_waits_for_the_bound(sqlite_db):
    db, senders = sqlite_db, Senders()
    _, (by_live, by_paused, by_new, by_old) = _job(db, 4)
    _report(db, "host-c/43/k", ago=timedelta(seconds=GONE_S - 30))
    _report(db, "host-d/44/k", state="paused")  # waiting for Docker: its sweeper writes its row each sweep
    assert _take(db, by_live, "host-c/43/k", ago=LONG_AGO) and _take(db, by_paused, "host-d/44/k", ago=LONG_AGO)
    assert _take(db, by_new, "host-e/45/k")  # no workers row yet (it took a message before its first sweep)
    assert _take(db, by_old, "host-f/46/k", ago=LONG_AGO)  # no row, and the mark is older than the bound
    _, (cancelled,) = _job(db, 1)
    assert _take(db, cancelled, "host-a/41/k", ago=LONG_AGO)
    with db.session() as s:
        job_rows.cancel_job(s, _row(db, cancelled).job_id, "stop")

    done = sweep(db, LIVENESS, **senders.kw(), docker_up=False)
    assert done.taken == senders.runs == [by_old]
    assert [_mark(db, i)[0] for i in (by_live, by_paused, by_new)] == ["host-c/43/k", "host-d/44/k", "host-e/45/k"]
    assert _mark(db, by_old) == (None, None)


def test_a_row_taken_by_a_dead_process_of_this_host_is_sent_again_at_once(sqlite_db):
    db, senders = sqlite_db, Senders()
    _, (episode_id,) = _job(db, 1)
    dead = _dead_local_worker()
    _report(db, dead, state="paused")  # its row is fresh: the dead pid alone tells
    assert _take(db, episode_id, dead, ago=timedelta(0))
    assert sweep(db, LIVENESS, **senders.kw(), docker_up=False).taken == senders.runs == [episode_id]
    assert _mark(db, episode_id) == (None, None)


def test_claiming_or_sending_again_clears_the_mark(sqlite_db):
    db, senders = sqlite_db, Senders()
    job_id, (claimed, resent) = _job(db, 2)
    assert _take(db, claimed, "host-g/47/k") and _take(db, resent, "host-g/47/k")
    with db.session() as s:
        assert claim_episode(s, claimed, worker="host-g/48/k") is not None
    assert _mark(db, claimed) == (None, None) and _row(db, claimed).status == "running"
    resume_job(db, job_id, LIVENESS, **senders.kw())  # `resume` sends every queued row again
    assert senders.runs == [resent] and _mark(db, resent) == (None, None)


def test_note_taken_marks_only_a_queued_row(sqlite_db):
    db = sqlite_db
    _, (queued, running, finished) = _job(db, 3)
    _claim(db, running)
    _submitted(db, finished)
    assert [_take(db, i, "host-h/49/k") for i in (queued, running, finished)] == [True, False, False]
    assert [_mark(db, i)[0] for i in (queued, running, finished)] == ["host-h/49/k", None, None]


def test_a_failed_send_puts_the_mark_back_for_the_next_sweep(sqlite_db):
    db, senders = sqlite_db, Senders()
    _, (episode_id,) = _job(db, 1)
    assert _take(db, episode_id, "host-i/50/k", ago=LONG_AGO)  # no row, older than the bound: gone

    def broker_down(_episode_id: str) -> None:
        raise OperationalError("publish", {}, ConnectionError("the broker does not answer"))

    with pytest.raises(OperationalError):
        sweep(db, LIVENESS, send_run=broker_down, send_grade=senders.grades.append, docker_up=False)
    assert _mark(db, episode_id)[0] == "host-i/50/k"
    assert sweep(db, LIVENESS, **senders.kw(), docker_up=False).taken == [episode_id]


def test_the_task_marks_the_row_as_taken_by_the_workers_main_process_and_never_fails_for_it(sqlite_db, monkeypatch):
    db = sqlite_db
    _, (episode_id,) = _job(db, 1)
    monkeypatch.setitem(celery_tasks._DB, db.url, db)  # the process's database is the test's
    app = SimpleNamespace(conf=SimpleNamespace(nexus_settings=ServiceSettings(db_url=db.url)))
    monkeypatch.setattr(celery_tasks, "_MAIN_PROCESS", [])
    celery_tasks._note_main_process()  # what worker_init does in the main process, before the pool forks
    assert celery_tasks._taker() == worker_identity()  # the name the sweeper's workers row has
    monkeypatch.setattr(celery_tasks, "_MAIN_PROCESS", ["node/7/kernel"])  # as a pool process sees it
    celery_tasks._mark_taken(app, episode_id, taken=True)
    assert _mark(db, episode_id)[0] == "node/7/kernel"
    celery_tasks._mark_taken(app, episode_id, taken=False)  # Docker stayed down: the message goes back
    assert _mark(db, episode_id) == (None, None)

    def database_down(_app):
        raise OperationalError("connect", {}, ConnectionError("refused"))

    monkeypatch.setattr(celery_tasks, "database", database_down)
    celery_tasks._mark_taken(app, episode_id, taken=True)  # logged, not raised: the claim has its own retries


def test_migration_0013_adds_the_mark_keeping_every_row_and_drops_it_on_downgrade(tmp_path):
    url = sqlite_url(tmp_path / "old.db")
    command.upgrade(_alembic_config(url), "0012")
    engine = make_engine(url)
    tables = MetaData()
    tables.reflect(engine)
    with engine.begin() as conn:
        conn.execute(tables.tables["jobs"].insert(), [dict(id="j1", created_at=utcnow(), updated_at=utcnow(),
                     status="running", config={}, config_hash="0" * 64, package_versions={}, counts={})])  # fmt: skip
    engine.dispose()

    def columns() -> set[str]:
        engine = make_engine(url)
        found = MetaData()
        found.reflect(engine)
        with engine.connect() as conn:
            assert [r.id for r in conn.execute(select(found.tables["jobs"]))] == ["j1"]
        engine.dispose()
        return {c.name for c in found.tables["episodes"].columns}

    migrate(url)
    assert {"taken_by", "taken_at"} <= columns()
    command.downgrade(_alembic_config(url), "0012")
    assert not {"taken_by", "taken_at"} & columns()


@pytest.mark.services
@pytest.mark.docker
@pytest.mark.slow
def test_a_worker_killed_while_it_waits_for_docker_has_its_taken_message_sent_again(pg_db, tmp_path):
    """Without the mark the row stays queued and its message unacked in Redis for the visibility timeout (5 h)."""
    require(*docker_status())
    env = service_env(fresh_redis_url(), pg_db.url, **FAST)
    no_docker = {**env, "DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"}  # wait_for_docker waits (FAST: 120 s)
    job = write_job(tmp_path / "job.yaml", **oracle_job(["humanfmt__humanfmt-1"], ["dense"], ["true_eviction"]))
    victim = Worker(no_docker, "gpu", tmp_path / "victim.log")
    others: list[Worker] = []
    try:
        job_id = submit_file(job, env)
        with pg_db.session() as s:
            (episode_id,) = [r.id for r in db_store.episodes_for_job(s, job_id, full=True)]
        wait_until(lambda: _mark(pg_db, episode_id)[0] is not None, 30, "the message taken", victim.tail)
        taker = _mark(pg_db, episode_id)[0]
        assert local_pid(taker) == victim.process.pid and _row(pg_db, episode_id).status == "queued"
        _kill_group(victim)
        others += [Worker(env, "gpu", tmp_path / "gpu.log"), Worker(env, "grade,default", tmp_path / "grade.log")]
        wait_until(lambda: job_done(pg_db, job_id), 60, f"job {job_id}", _evidence(pg_db, job_id, *others))
    finally:
        for w in [victim, *others]:
            w.stop()
    (row,) = assert_finished_exactly_once(pg_db, job_id, n_keys=1, verdicts=GRADE_STATUSES)
    assert row.n_claims == 1 and row.taken_by is None


def test_the_sweepers_look_for_marked_rows_reads_only_the_partial_index(any_db):
    """Every sweeper runs ``marked_rows`` each sweep: it must go through ``ix_episodes_taken`` (the marked rows only),
    never the whole episodes table, whatever the table's size (PostgreSQL: told not to scan when it can help it)."""
    from sqlalchemy import text
    from sqlalchemy.dialects import postgresql, sqlite

    from db.taken_messages import marked_rows

    postgres = any_db.engine.dialect.name == "postgresql"
    dialect = postgresql.dialect() if postgres else sqlite.dialect()
    sql = str(marked_rows().compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
    with any_db.session() as s:
        if postgres:
            s.execute(text("SET LOCAL enable_seqscan = off"))
            plan = "\n".join(row[0] for row in s.execute(text(f"EXPLAIN {sql}")))
        else:
            plan = "\n".join(str(row[-1]) for row in s.execute(text(f"EXPLAIN QUERY PLAN {sql}")))
    assert "ix_episodes_taken" in plan, plan
