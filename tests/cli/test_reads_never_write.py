"""Reads never write (issue 44): a verb that reads refuses a database that is not there, creating nothing; a database
that is down or refuses the connection is one short line from every verb; `submit` says whether a worker listens.

Only `setup`, `submit`, `run`, `episode`, `agent-case`, `probe run`, `worker` and `python -m db upgrade` create or
migrate a database (db.connection.connect); every other verb opens it with db.availability.open_existing."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from db import connect, sqlite_url
from db.connection import current_revision, migrate, shipped_head
from tests.support.db_fixtures import PG_URL, pg_available
from tests.support.own_services import free_port
from tests.support.worker_fixtures import ROOT, oracle_job, write_job

SECRET = "s3cr3t-pw"

#: every verb that reads a database that must already exist (job / episode / probe run ids do not matter: the
#: database is refused before any is looked up)
READ_VERBS = [
    ["status"],
    ["status", "abc123"],
    ["compare", "abc123"],
    ["episodes", "abc123"],
    ["inspect", "abc123"],
    ["export", "abc123"],
    ["regrade", "abc123"],
    ["cancel", "abc123"],
    ["resume", "abc123"],
    ["rerun", "abc123", "--failed"],
    ["replay", "abc123"],
    ["probe", "show", "abc123"],
    ["probe", "list"],
    ["serve"],
    ["report", "abc123", "-o", "{tmp}/r.html"],
]


def invoke(args: list[str], tmp_path):
    from typer.testing import CliRunner

    from nexus_eval.cli import app

    return CliRunner().invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args])


@pytest.mark.parametrize("verb", READ_VERBS, ids=lambda v: " ".join(v[:2]))
def test_a_read_verb_refuses_a_missing_sqlite_database_and_creates_nothing(verb, tmp_path, monkeypatch):
    monkeypatch.delenv("NEXUS_EVAL_BROKER", raising=False)
    missing = tmp_path / "x" / "nope.db"
    done = invoke([*verb, "--db", str(missing)], tmp_path)
    assert done.exit_code == 2, done.output
    said = " ".join(done.output.split())  # rich wraps long lines
    assert f"no results database at {missing}" in said and "nexus-eval run" in said, said
    assert "nothing was created" in said
    assert not (tmp_path / "x").exists()  # no folder, no file, no broker file beside it


def test_the_default_database_is_not_created_by_a_read_either(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("NEXUS_EVAL_DB", raising=False)
    done = invoke(["status"], tmp_path)
    assert done.exit_code == 2 and "runs/nexus-eval.db" in done.output
    assert not (tmp_path / "runs").exists()


def test_a_read_refuses_an_empty_file_and_an_older_schema_and_leaves_both_as_they_are(tmp_path):
    empty = tmp_path / "empty.db"
    empty.touch()  # what `status` used to leave behind
    done = invoke(["status", "--db", str(empty)], tmp_path)
    assert done.exit_code == 2 and "has no results tables yet" in done.output, done.output
    assert empty.stat().st_size == 0

    older = sqlite_url(tmp_path / "older.db")
    migrate(older, "0005")
    for verb in (["status"], ["compare", "abc123"], ["probe", "list"], ["serve"]):
        done = invoke([*verb, "--db", older], tmp_path)
        said = " ".join(done.output.split())
        assert done.exit_code == 2, said
        assert f"at schema revision 0005, this nexus-eval reads {shipped_head()}" in said
        assert "python -m db upgrade URL" in said
    assert current_revision(older) == "0005"  # reading never migrates

    connect(older)  # a writer (submit, run, worker) migrates it; then reads work
    assert invoke(["status", "--db", older], tmp_path).exit_code == 0


def test_python_m_db_current_creates_nothing(tmp_path):
    missing = tmp_path / "x" / "nope.db"
    done = subprocess.run(
        [sys.executable, "-m", "db", "current", sqlite_url(missing)], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 2 and f"no results database at {missing}" in done.stderr, done.stderr
    assert not (tmp_path / "x").exists()


DOWN_VERBS = [["status"], ["compare", "abc123"], ["episodes", "abc123"], ["probe", "list"], ["serve"], ["worker"]]


def test_a_database_that_does_not_answer_is_one_short_line_from_every_verb(tmp_path):
    """Nothing listens on the port: the connection is refused, as it is when PostgreSQL is down."""
    url = f"postgresql+psycopg://nexus:{SECRET}@127.0.0.1:{free_port()}/nexus"
    shown = url.replace(SECRET, "***")
    lines = set()
    for verb in DOWN_VERBS:
        done = subprocess.run(
            [sys.executable, "-m", "nexus_eval.cli", *verb, "--db", url], capture_output=True, text=True, cwd=ROOT
        )
        out = done.stdout + done.stderr
        assert done.returncode == 2, out
        assert "Traceback" not in out and SECRET not in out and len(out.strip().splitlines()) == 1, out
        assert out.startswith(f"error: cannot connect to the database {shown}: ") and "refused" in out, out
        lines.add(out)
    assert len(lines) == 1  # the same words from every verb


@pytest.mark.services
def test_a_postgresql_database_that_does_not_exist_is_refused_by_name(tmp_path):
    from sqlalchemy.engine import make_url

    if not pg_available():
        pytest.skip("PostgreSQL not reachable")
    url = make_url(PG_URL).set(database="nexus_no_such_db_44").render_as_string(hide_password=False)
    for verb in (["status"], ["compare", "abc123"], ["serve"]):
        done = invoke([*verb, "--db", url], tmp_path)
        said = " ".join(done.output.split())
        assert done.exit_code == 2, said
        assert 'the database "nexus_no_such_db_44" does not exist' in said and "createdb" in said, said


def _submit(tmp_path, db_url: str, monkeypatch):
    """`submit` of a one-episode oracle job to the embedded broker, its preflight (Docker, images) passed."""
    import nexus_eval.readiness as readiness

    monkeypatch.delenv("NEXUS_EVAL_BROKER", raising=False)
    monkeypatch.setattr(readiness, "preflight", lambda *a, **k: readiness.Preflight(checks=[]))
    job = write_job(tmp_path / "job.yaml", **oracle_job(["humanfmt__humanfmt-1"], ["dense"], ["true_eviction"]))
    done = invoke(["submit", "--file", str(job), "--db", db_url], tmp_path)
    assert done.exit_code == 0, done.output
    return " ".join(done.output.split())


def test_submit_says_whether_a_worker_listens_and_how_to_start_one(tmp_path, monkeypatch):
    from db.worker_rows import report_worker
    from nexus_eval.commands.service import who_runs_it

    url = sqlite_url(tmp_path / "nexus-eval.db")
    db = connect(url)
    said = _submit(tmp_path, url, monkeypatch)
    assert "1 episodes on the gpu queue; no worker listens on it" in said, said
    assert f"`nexus-eval worker --db {url}`" in said and "`nexus-eval run --db" in said

    with db.session() as s:
        report_worker(s, "w1@box", queues="grade,default", state="ok")
    assert "no worker listens on it" in _submit(tmp_path, url, monkeypatch)  # not on the gpu queue
    with db.session() as s:
        report_worker(s, "w2@box", queues="gpu,grade,default", state="ok")
    said = _submit(tmp_path, url, monkeypatch)
    assert "on the gpu queue; 1 worker listens on it (w2@box)" in said, said

    started = time.monotonic()
    who_runs_it(url)
    assert time.monotonic() - started < 2  # bounded: one or two SELECTs
