"""The readiness checks and the preflight of run / submit / episode, on real states that cost nothing to make:
``DOCKER_HOST`` at a socket path where nothing listens (no daemon, without stopping the real one), a Redis URL
on a closed 127.0.0.1 port, SQLite files in tmp folders, a PostgreSQL URL on a closed port.

The fast tests need no Docker; the ones that look at images are marked ``docker``."""

from __future__ import annotations

import socket
import time

import pytest

from db import connect, sqlite_url
from db.models import Job
from env.sandbox.docker_daemon import NeedsManualSetup, daemon_state, ensure_daemon
from jobs.spec import JobSpec
from jobs.submit import create_job_rows, load_job_tasks, plan_job
from nexus_eval import host_readiness, service_readiness
from nexus_eval.readiness_check import Check
from tests.conftest import docker_status, require
from tests.support.worker_fixtures import oracle_job


def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_daemon(monkeypatch, tmp_path):
    """The process's docker clients point at a socket path where no daemon runs; the real one is untouched."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")


@pytest.fixture
def fresh_db(tmp_path, monkeypatch):
    """A migrated, empty SQLite results database; the environment's broker is the embedded one."""
    monkeypatch.delenv("NEXUS_EVAL_BROKER", raising=False)
    return connect(sqlite_url(tmp_path / "nexus-eval.db"))


def jobs_in(db) -> int:
    with db.session() as s:
        return s.query(Job).count()


def invoke(*args: str):
    from typer.testing import CliRunner

    from nexus_eval.cli import app

    return CliRunner().invoke(app, list(args))


def test_check_status_words():
    assert Check("a", True, True, "").status == "ok"
    assert Check("a", True, True, "", build=True).status == "buildable"
    assert Check("a", False, True, "").status == "missing"
    assert Check("a", False, False, "").status == "optional-missing"


def test_daemon_check_without_a_daemon(no_daemon):
    state = daemon_state()
    assert not state.answering and "no socket" in state.reason
    check = host_readiness.daemon_check()
    assert (check.ok, check.required, check.status, check.fix) == (False, True, "missing", "nexus-eval setup")
    assert "no-daemon.sock" in check.detail


def test_ensure_daemon_does_not_start_one_for_another_host(no_daemon):
    """A daemon named by DOCKER_HOST cannot be started from here: the paragraph says what to do instead."""
    with pytest.raises(NeedsManualSetup, match="DOCKER_HOST=unix://.*no-daemon.sock does not answer"):
        ensure_daemon(install=False)


def test_debootstrap_missing_without_apt_says_what_to_install(monkeypatch, tmp_path):
    from env.sandbox.docker_daemon import ensure_debootstrap

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NeedsManualSetup, match="apt-get install -y debootstrap"):
        ensure_debootstrap(install=False)


def test_setup_exits_2_with_the_paragraph(no_daemon):
    result = invoke("setup", "--no-install", "--no-model")
    assert result.exit_code == 2, result.output
    assert "unset DOCKER_HOST" in result.output


def test_broker_checks():
    assert service_readiness.broker_check(None).ok
    started = time.monotonic()
    check = service_readiness.broker_check(f"redis://127.0.0.1:{closed_port()}/0")
    assert time.monotonic() - started < 5
    assert not check.ok and check.required and "does not answer" in check.detail
    assert "NEXUS_EVAL_BROKER" in check.fix
    # doctor's row: `run` never uses this broker, so it does not decide doctor's exit code
    assert (
        service_readiness.broker_check(f"redis://127.0.0.1:{closed_port()}/0", required=False).status
        == "optional-missing"
    )


def test_database_checks(tmp_path):
    path = tmp_path / "sub" / "new.db"
    check = service_readiness.database_check(sqlite_url(path))
    assert check.ok and "created on first use" in check.detail
    assert not path.exists() and not path.parent.exists()  # looking creates nothing

    url = sqlite_url(tmp_path / "migrated.db")
    connect(url).dispose()
    assert "schema at" in service_readiness.database_check(url).detail

    (tmp_path / "a-file").write_text("")
    assert not service_readiness.database_check(sqlite_url(tmp_path / "a-file" / "x.db")).ok


def test_database_check_unknown_revision(tmp_path):
    from sqlalchemy import text

    url = sqlite_url(tmp_path / "future.db")
    db = connect(url)
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'ffffffffffff'"))
    db.dispose()
    check = service_readiness.database_check(url)
    assert not check.ok and "unknown to this version" in check.detail


def test_database_check_unreachable_postgres():
    check = service_readiness.database_check(f"postgresql+psycopg://nexus:s3cret@127.0.0.1:{closed_port()}/nexus")
    assert not check.ok and check.required
    assert "s3cret" not in check.detail and "***" in check.detail


def test_doctor_without_docker_exits_1(no_daemon, tmp_path):
    result = invoke("doctor", "--db", str(tmp_path / "d.db"))
    assert result.exit_code == 1, result.output
    for row in ("python: torch", "docker daemon", "base image", "task images (16)", "broker", "database", "gpu"):
        assert row in result.output
    assert "not ready" in result.output


def test_run_without_docker_stores_nothing(no_daemon, fresh_db):
    result = invoke("run", "--backend", "oracle", "--db", fresh_db.url)
    assert result.exit_code == 2, result.output
    assert "docker daemon: no daemon answers" in result.output
    assert "fix: nexus-eval setup" in result.output and "nothing was stored" in result.output
    assert jobs_in(fresh_db) == 0


def test_submit_without_docker_stores_nothing(no_daemon, fresh_db):
    """With the embedded broker the worker is this machine, so submit checks its daemon too."""
    result = invoke("submit", "--backend", "oracle", "--db", fresh_db.url)
    assert result.exit_code == 2, result.output
    assert "nothing was submitted" in result.output
    assert jobs_in(fresh_db) == 0


def test_submit_with_an_unreachable_broker_stores_nothing(fresh_db, monkeypatch):
    monkeypatch.setenv("NEXUS_EVAL_BROKER", f"redis://127.0.0.1:{closed_port()}/0")
    result = invoke("submit", "--backend", "oracle", "--db", fresh_db.url)
    assert result.exit_code == 2, result.output
    assert "broker: Redis at" in result.output and "does not answer" in result.output
    assert jobs_in(fresh_db) == 0


def test_episode_without_a_daemon(no_daemon):
    result = invoke("episode", "--task", "argkit__argkit-1", "--backend", "oracle")
    assert result.exit_code == 2, result.output
    assert "nothing was run" in result.output


def test_failure_reasons_count_first_lines(fresh_db):
    from rich.console import Console

    from db import store as db_store
    from nexus_eval.commands._preflight import failure_reasons, print_failure_reasons

    spec = JobSpec.from_dict(
        oracle_job(["humanfmt__humanfmt-1", "dslib__dslib-1"], ["dense", "nexus"], ["true_eviction"])
    )
    job_id, ids = create_job_rows(fresh_db, plan_job(spec, load_job_tasks(spec)))
    errors = [
        ("infra_failure", "ImageError: cannot reach the Docker daemon (boom)\nTraceback ...\n  line 3"),
        ("infra_failure", "ImageError: cannot reach the Docker daemon (boom)\nTraceback, another one"),
        ("timeout", "soft time limit reached; partial trajectory kept\nmore"),
    ]
    for episode_id, (status, error) in zip(ids, errors, strict=False):
        with fresh_db.session() as s:
            db_store.claim_episode(s, episode_id)
        with fresh_db.session() as s:
            assert db_store.fail_running_episode(s, episode_id, status, error)
    assert failure_reasons(fresh_db, job_id) == [
        (2, "infra_failure: ImageError: cannot reach the Docker daemon (boom)"),
        (1, "timeout: soft time limit reached; partial trajectory kept"),
    ]
    console = Console(record=True, width=200)
    print_failure_reasons(fresh_db, job_id, console)
    assert "2 x infra_failure: ImageError: cannot reach the Docker daemon (boom)" in console.export_text()


# ------------------------------------------------------------------------------------------------ images


def _daemon():
    ready, reason = docker_status()
    require(ready, reason)
    return host_readiness.lookup_client()


@pytest.mark.docker
def test_base_image_check_states(monkeypatch, tmp_path):
    client = _daemon()
    assert host_readiness.base_image_check(client).status == "ok"
    absent = "nexus-eval/base:does-not-exist-0"
    monkeypatch.setenv("PATH", str(tmp_path))  # no debootstrap: cannot be built
    missing = host_readiness.base_image_check(client, absent)
    assert (missing.status, missing.fix) == ("missing", "nexus-eval setup")
    assert "debootstrap" in missing.detail
    (tmp_path / "debootstrap").write_text("#!/bin/sh\nexit 1\n")  # only looked up on PATH, never run here
    (tmp_path / "debootstrap").chmod(0o755)
    assert host_readiness.base_image_check(client, absent).status == "buildable"


@pytest.mark.docker
def test_task_images_check(monkeypatch, tmp_path):
    from env.tasks.loading import load_suite

    client = _daemon()
    tasks = load_suite("mini")[:2]
    base = host_readiness.base_image_check(client)
    check, build = host_readiness.task_images_check(tasks, client, base)
    assert check.ok and check.name == "task images (2)"
    registry = tasks[0].model_copy(update={"kind": "swebench", "docker_image": "nexus-eval/absent:nope"})
    check, build = host_readiness.task_images_check([registry, tasks[1]], client, base)
    assert not check.ok and "nexus-eval/absent:nope" in check.detail and "docker load" in check.fix
    # a local task whose image is missing while the base image cannot be built either
    unbuildable = Check("base image", False, True, "missing", "nexus-eval setup")
    edited = tmp_path / "task"
    import shutil

    shutil.copytree(tasks[0].local_dir, edited)
    (edited / "repo" / "NEW_FILE").write_text("changes the content hash\n")
    changed = tasks[0].model_copy(update={"local_dir": edited})
    check, build = host_readiness.task_images_check([changed], client, unbuildable)
    assert not check.ok and build == [changed] and "cannot be built" in check.detail
    check, build = host_readiness.task_images_check([changed], client, base)
    assert check.status == "buildable" and build == [changed]
