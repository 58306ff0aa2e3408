"""`nexus-eval doctor`'s ``workers`` row: the workers that reported to the results database (``db.liveness``'s
``workers`` table) in the last 3 sweeps, read from a fresh SQLite file the way the sweepers write it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from db import sqlite_url
from db.worker_rows import report_worker
from nexus_eval import readiness, service_readiness
from nexus_eval.readiness_check import Check
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixture)

NOW = datetime(2026, 12, 4, 12, 5, 0, tzinfo=UTC)
PAUSED_AT = datetime(2026, 12, 4, 12, 1, 3, tzinfo=UTC)
DOWN = "the Docker engine at unix:///var/run/docker.sock does not answer: connection refused"


def report(db, name: str, *, state: str = "ok", queues: str = "gpu", detail: str | None = None, at=NOW) -> None:
    with db.session() as s:
        report_worker(s, name, queues=queues, state=state, detail=detail, now=at)


def check(db) -> Check:
    return service_readiness.workers_check(db.url, within_s=90, now=NOW)


def test_no_worker_is_an_optional_failure(sqlite_db):
    row = check(sqlite_db)
    assert (row.name, row.ok, row.required, row.status) == ("workers", False, False, "optional-missing")
    assert row.detail == "no worker has reported in the last 90 s"
    assert row.fix == "start one: `nexus-eval worker` (or `nexus-eval run` runs its own)"


def test_ok_workers_make_the_row_ok(sqlite_db):
    report(sqlite_db, "hostb/2", queues="grade", at=NOW - timedelta(seconds=40))
    report(sqlite_db, "hosta/1", queues="default,gpu")
    row = check(sqlite_db)
    assert row.ok and row.status == "ok" and not row.required
    assert row.detail == "2 workers seen in the last 90 s: hosta/1 ok (default,gpu); hostb/2 ok (grade)"


def test_a_paused_worker_fails_the_row_and_says_why(sqlite_db):
    report(sqlite_db, "gpu-host/123", queues="gpu")
    report(sqlite_db, "grade-host/456", queues="grade", at=PAUSED_AT - timedelta(seconds=60))  # ok first
    report(sqlite_db, "grade-host/456", queues="grade", state="paused", detail=DOWN, at=PAUSED_AT)
    report(sqlite_db, "grade-host/456", queues="grade", state="paused", detail=DOWN, at=NOW - timedelta(seconds=5))
    row = check(sqlite_db)
    assert (row.ok, row.required, row.status) == (False, False, "optional-missing")
    assert row.detail == (
        "2 workers seen in the last 90 s: gpu-host/123 ok (gpu); "
        f"grade-host/456 paused since 12:01:03 UTC (grade): {DOWN}"
    )
    assert row.fix == "start the Docker engine on that host (`nexus-eval setup`); the worker resumes by itself"


def test_a_stale_row_is_not_listed(sqlite_db):
    report(sqlite_db, "gone/9", state="paused", detail=DOWN, at=NOW - timedelta(seconds=91))
    row = check(sqlite_db)
    assert row.detail == "no worker has reported in the last 90 s" and "gone/9" not in row.detail
    report(sqlite_db, "alive/1")
    row = check(sqlite_db)
    assert row.ok and row.detail == "1 worker seen in the last 90 s: alive/1 ok (gpu)"


def test_paused_on_another_day_shows_the_date(sqlite_db):
    report(sqlite_db, "h/1", state="paused", detail=DOWN, at=NOW - timedelta(days=2))
    report(sqlite_db, "h/1", state="paused", detail=DOWN)
    assert "h/1 paused since 2026-12-02 12:05:00 UTC (gpu)" in check(sqlite_db).detail


def test_a_database_that_cannot_be_read_is_not_a_worker_count(tmp_path):
    (tmp_path / "a-file").write_text("")
    row = service_readiness.workers_check(sqlite_url(tmp_path / "a-file" / "x.db"), within_s=90)
    assert (row.ok, row.required) == (False, False) and row.detail == "unknown: the database is not reachable"
    fresh = tmp_path / "new.db"
    row = service_readiness.workers_check(sqlite_url(fresh), within_s=90)
    assert not row.ok and row.detail == "none: no worker of this version has used this database"
    assert not fresh.exists()  # looking creates nothing


@pytest.mark.parametrize(("sweep", "window"), [(None, 90.0), ("10", 30.0), ("not-a-number", 90.0)])
def test_the_window_is_three_sweeps(monkeypatch, sweep, window):
    if sweep is None:
        monkeypatch.delenv("NEXUS_EVAL_SWEEP", raising=False)
    else:
        monkeypatch.setenv("NEXUS_EVAL_SWEEP", sweep)
    assert service_readiness.sweep_window_s() == window


def test_doctor_shows_the_row_and_it_does_not_decide_the_exit_code(sqlite_db, monkeypatch, tmp_path):
    """Everything else is stubbed ready: a paused worker alone leaves doctor's verdict at ready (exit 0)."""
    from typer.testing import CliRunner

    from nexus_eval.cli import app

    monkeypatch.delenv("NEXUS_EVAL_SWEEP", raising=False)
    ready = Check("docker daemon", True, True, "stubbed")
    monkeypatch.setattr(readiness, "package_checks", lambda: [])
    monkeypatch.setattr(readiness, "container_checks", lambda _tasks: readiness.Preflight([ready]))
    for name in ("model_check", "gpu_check", "flash_attn_check"):
        monkeypatch.setattr(readiness, name, lambda: Check("x", True, False, "stubbed"))
    report(sqlite_db, "h/1", state="paused", detail=DOWN, at=datetime.now(UTC))
    result = CliRunner().invoke(app, ["doctor", "--db", sqlite_db.url])
    assert result.exit_code == 0, result.output
    assert "workers" in result.output and "optional-missing" in result.output
    assert "h/1 paused since" in result.output and "connection refused" in result.output
    assert "ready:" in result.output


def _gone(db, name: str, *, at) -> None:
    from db.worker_rows import mark_gone_workers

    with db.session() as s:
        mark_gone_workers(s, silent_s=150, now=at)


def test_a_gone_worker_is_named_by_doctor_and_listed_by_status(sqlite_db, monkeypatch):
    from typer.testing import CliRunner

    from db.models import utcnow
    from nexus_eval.cli import app

    report(sqlite_db, "lost-host/7/k", at=NOW - timedelta(seconds=400))
    _gone(sqlite_db, "lost-host/7/k", at=PAUSED_AT)
    row = check(sqlite_db)
    assert not row.ok and row.detail == (
        "no worker has reported in the last 90 s; lost-host/7/k gone since 12:01:03 UTC (gpu)"
    )
    report(sqlite_db, "alive/1")
    row = check(sqlite_db)
    assert row.ok
    assert row.detail == "1 worker seen in the last 90 s: alive/1 ok (gpu); lost-host/7/k gone since 12:01:03 UTC (gpu)"

    monkeypatch.delenv("NEXUS_EVAL_SWEEP", raising=False)
    monkeypatch.setenv("COLUMNS", "200")  # rich draws the table that wide: one line per worker
    now = utcnow()
    report(sqlite_db, "live-host/2/k", at=now)
    report(sqlite_db, "dead-host/3/k", at=now - timedelta(seconds=300))
    _gone(sqlite_db, "dead-host/3/k", at=now - timedelta(seconds=100))
    listed = CliRunner().invoke(app, ["status", "--db", sqlite_db.url])
    assert listed.exit_code == 0, listed.output
    lines = {line.split()[1]: line for line in listed.stdout.splitlines() if "-host/" in line}
    assert set(lines) == {"live-host/2/k", "dead-host/3/k"}  # lost-host went long ago
    assert " ok " in lines["live-host/2/k"] and " gone " in lines["dead-host/3/k"]
    assert "no report for over 150 s" in lines["dead-host/3/k"]
