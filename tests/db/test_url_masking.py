"""No password of the database or the broker is printed (issue 33, item 4): ``db.urls.masked`` over every URL
shape the service handles, and the places that show a URL (doctor, the preflight rows, the dashboard's errors)
on real states: a Redis URL on a closed 127.0.0.1 port, a PostgreSQL URL on a closed port."""

from __future__ import annotations

import socket

import pytest

from db.urls import masked
from nexus_eval import service_readiness

SECRET = "s3cretpw"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+psycopg://u:pw@h/db", "postgresql+psycopg://u:***@h/db"),
        (
            "postgresql://nexus:pw@pg-host:5432/nexus?connect_timeout=3",
            "postgresql://nexus:***@pg-host:5432/nexus?connect_timeout=3",
        ),
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://user:pw@h", "redis://user:***@h"),
        ("rediss://default:pw@h:6380/0?ssl_cert_reqs=none", "rediss://default:***@h:6380/0?ssl_cert_reqs=none"),
        ("amqp://guest:pw@localhost:5672//", "amqp://guest:***@localhost:5672//"),
        ("http://u:pw@127.0.0.1:8000/v1", "http://u:***@127.0.0.1:8000/v1"),
        ("https://u:pw@[::1]:443/v1", "https://u:***@[::1]:443/v1"),
        ("redis://:p@ss@h/0", "redis://:***@h/0"),  # '@' in the password: urllib reads to the last one
        ("postgresql://u:pa/ss@h/db", "postgresql://u:***@h/db"),  # '/' in it: SQLAlchemy reads to the '@'
        ("postgresql://h/db?sslmode=require&password=pw", "postgresql://h/db?sslmode=require&password=***"),
    ],
)
def test_masked_hides_the_password_of_every_url_shape(url, shown):
    assert masked(url) == shown
    assert masked(shown) == shown  # masking twice changes nothing more


@pytest.mark.parametrize(
    "text",
    [
        "sqla+sqlite:////abs/runs/celery-broker.db",
        "db+sqlite:///runs/celery-results.db",
        "sqlite:///runs/nexus-eval.db",
        "postgresql://u@h/db",  # a user name alone is not secret
        "redis://127.0.0.1:6379/0",
        "https://example.com:443/users/@me",
        "runs/nexus-eval.db",
        "not a url: a:b@c",
        "",
    ],
)
def test_masked_leaves_what_has_no_password_unchanged(text):
    assert masked(text) == text


def test_doctor_and_the_preflight_rows_never_show_a_password(tmp_path, monkeypatch):
    broker = f"redis://:{SECRET}@127.0.0.1:{closed_port()}/0"
    monkeypatch.setenv("NEXUS_EVAL_BROKER", broker)
    for required in (True, False):  # the preflight of submit / worker, and doctor's row
        row = service_readiness.broker_check(broker, required=required)
        assert not row.ok and SECRET not in row.detail and "redis://:***@127.0.0.1" in row.detail
    other = service_readiness.broker_check(f"amqp://guest:{SECRET}@127.0.0.1:{closed_port()}//")
    assert SECRET not in other.detail
    database = service_readiness.database_check(f"postgresql+psycopg://nexus:{SECRET}@127.0.0.1:{closed_port()}/nexus")
    assert not database.ok and SECRET not in database.detail
    unparsable = service_readiness.database_check(f"postgresql+psycopg://nexus:{SECRET}@127.0.0.1:notaport/nexus")
    assert not unparsable.ok and SECRET not in unparsable.detail


def test_the_doctor_command_prints_no_broker_password(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from nexus_eval.cli import app

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")  # no engine: quick, and beside the point
    monkeypatch.setenv("NEXUS_EVAL_BROKER", f"redis://:{SECRET}@127.0.0.1:1/0")
    result = CliRunner().invoke(app, ["doctor", "--db", str(tmp_path / "d.db")])
    assert "broker" in result.output and "127.0.0.1:1/0" in result.output, result.output
    assert SECRET not in result.output


def test_the_dashboards_database_errors_never_show_a_password():
    from dashboard.readonly import DatabaseUnavailable, check_schema, readonly_engine

    with pytest.raises(DatabaseUnavailable) as unsupported:
        readonly_engine(f"mysql://u:{SECRET}@127.0.0.1/nexus")
    assert SECRET not in str(unsupported.value) and "mysql://u:***@127.0.0.1/nexus" in str(unsupported.value)
    engine = readonly_engine(f"postgresql+psycopg://nexus:{SECRET}@127.0.0.1:{closed_port()}/nexus?connect_timeout=2")
    try:
        with pytest.raises(DatabaseUnavailable) as unreachable:
            check_schema(engine)
    finally:
        engine.dispose()
    assert SECRET not in str(unreachable.value)
