"""The jobs page's Workers section (FastAPI's TestClient, no browser): the workers that reported in the last 3
sweeps, as the sweepers write them (``db.worker_rows.report_worker``), paused ones marked with their reason."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from dashboard.app import create_app
from db import connect, sqlite_url
from db.models import utcnow
from db.worker_rows import report_worker

DOWN = "the Docker engine at unix:///var/run/docker.sock does not answer: <connection refused>"


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.delenv("NEXUS_EVAL_SWEEP", raising=False)
    database = connect(sqlite_url(tmp_path / "results.db"))
    yield database
    database.dispose()


def jobs_page(db) -> str:
    client = TestClient(create_app(db.url, token=None, public=False, allowed_hosts=["testserver"]))
    done = client.get("/jobs")
    assert done.status_code == 200
    return done.text


def test_no_worker_is_one_line(db):
    page = jobs_page(db)
    assert 'id="workers"' in page and 'id="workers-list"' not in page
    assert "no worker has reported in the last 90 s" in page


def test_the_window_follows_the_sweep_setting(db, monkeypatch):
    monkeypatch.setenv("NEXUS_EVAL_SWEEP", "10")
    assert "no worker has reported in the last 30 s" in jobs_page(db)


def test_paused_worker_is_marked_with_its_reason(db):
    now = utcnow()
    with db.session() as s:
        report_worker(s, "gpu-host/123", queues="gpu", state="ok", now=now)
        report_worker(s, "grade-host/456", queues="grade", state="paused", detail=DOWN, now=now - timedelta(seconds=4))
        report_worker(s, "gone/9", queues="gpu", state="paused", detail="old news", now=now - timedelta(seconds=300))
    page = jobs_page(db)
    assert 'id="workers-list"' in page and "no worker has reported" not in page
    assert '<tr data-worker="gpu-host/123" data-state="ok">' in page
    assert '<tr data-worker="grade-host/456" data-state="paused" class="paused">' in page
    assert '<span class="status st-paused">paused</span>' in page
    assert "does not answer: &lt;connection refused&gt;" in page and "<connection refused>" not in page  # escaped
    assert "gone/9" not in page and "old news" not in page  # seen 300 s ago: outside the 90 s window
    row = page[page.index('data-worker="grade-host/456"') :].split("</tr>")[0]
    assert "<td>grade</td>" in row and " s ago</td>" in row


def test_a_gone_worker_is_listed_as_gone_for_an_hour(db):
    from db.worker_rows import mark_gone_workers

    now = utcnow()
    with db.session() as s:
        report_worker(s, "live-host/1/k", queues="gpu", state="ok", now=now)
        report_worker(s, "lost-host/2/k", queues="gpu", state="ok", now=now - timedelta(seconds=400))
        report_worker(s, "long-gone/3/k", queues="gpu", state="ok", now=now - timedelta(hours=3))
        mark_gone_workers(s, silent_s=150, now=now - timedelta(hours=2))  # long-gone went two hours ago
        mark_gone_workers(s, silent_s=150, now=now - timedelta(seconds=200))  # lost-host a moment ago
    page = jobs_page(db)
    assert '<tr data-worker="lost-host/2/k" data-state="gone" class="gone">' in page
    assert '<span class="status st-gone">gone</span>' in page and "no report for over 150 s" in page
    assert '<tr data-worker="live-host/1/k" data-state="ok">' in page
    assert "long-gone/3/k" not in page  # gone for over an hour: the row stays in the table, off the list
