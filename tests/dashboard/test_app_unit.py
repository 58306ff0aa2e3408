"""The dashboard without a browser: FastAPI's TestClient over a SQLite file filled through the real db.store API.

Rows are written the way a worker writes them (claim, record_turn, finish_episode, record_grade), so the pages
read what a real run leaves behind; the page tests with a real embedded job and chromium are test_pages.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from dashboard import charts, episode_queries, queries
from dashboard.app import create_app
from dashboard.auth import COOKIE, is_loopback
from dashboard.readonly import DatabaseUnavailable, readonly_engine
from dashboard.report import write_report
from db import connect, job_rows, sqlite_url
from db import store as db_store
from db.models import Episode
from jobs.spec import EpisodeKey
from results.compare import compare_jobs
from tests.support.db_fixtures import pg_db_fixture  # noqa: F401  (fixture)

TOKEN = "unit-test-token-5d1b"  # 16+ characters, as create_app requires
PATCH = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"
RETENTION = {"logical_length": 40, "kv_heads": 2, "layers": [[[2, 10], [1, 20], [0, 10]], [[2, 40]]]}


@dataclass
class Fixture:
    url: str
    job_id: str  # finished: dense + nexus x two protocols over two tasks
    live_job_id: str  # still queued
    episodes: dict[tuple[str, str, str], str]  # (task, method, protocol) -> episode id


def _turn(i: int, method: str, *, format_error: bool = False) -> dict:
    """One stored turn as record_turn takes it; nexus's calls differ from dense's from turn 1 on."""
    command = "ls" if i == 0 or method == "dense" else f"cat file{i}.py"
    action = None if format_error else {"name": "execute_bash", "arguments": {"command": command}}
    return {
        "tokens_appended": 100 + i,
        "tokens_generated": 20,
        "prompt_tokens": 100 * (i + 1),
        "logical_length": 120 * (i + 1),
        "physical_before": {"min": 50.0, "mean": 60.0 + i, "max": 70.0},
        "physical_after": {"min": 40.0, "mean": 45.0, "max": 50.0},
        "eviction_events": i,
        "kv_held_bytes": 4096 * (i + 1),
        "kv_allocated_bytes": 5120 * (i + 1),
        "kv_peak_held_bytes": 8192 * (3 - i),  # the first turn's prefill is the episode's peak
        "kv_peak_allocated_bytes": 10240 * (3 - i),
        "prefill_s": 0.1,
        "decode_s": 0.2,
        "tokens_per_s": 100.0,
        "completion": "<think>hm</think> <script>alert(1)</script>",
        "thought": "look around <b>here</b>",
        "action": action,
        "observation": "x.py\n" * (1000 if i == 2 else 1),
        "extra": {"format_error": format_error},
    }


def _run(db, episode_id: str, method: str, verdict: str, *, retention: dict | None = None) -> None:
    with db.session() as s:
        claim = db_store.claim_episode(s, episode_id)
    for i in range(3):
        with db.session() as s:
            db_store.record_turn(s, claim, i, **_turn(i, method, format_error=(i == 2 and method == "nexus")))
    with db.session() as s:
        fields = {"retention": retention} if hasattr(Episode, "retention") else {}
        db_store.finish_episode(s, claim, "submitted", exit_status="submitted", patch=PATCH, agent_s=1.5, **fields)
    with db.session() as s:
        db_store.record_grade(
            s, episode_id, verdict, test_log="PASSED test_x\n<tag>", grader="unit", grader_version="v1"
        )


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> Fixture:
    path = tmp_path_factory.mktemp("dashboard-unit") / "results.db"
    db = connect(sqlite_url(path))
    keys = [EpisodeKey(t, "dense", "prefill_only", "true_eviction", 0) for t in ("t1", "t2")]
    keys += [
        EpisodeKey(t, "nexus", "prefill_only", p, 0) for t in ("t1", "t2") for p in ("true_eviction", "full_context")
    ]
    with db.session() as s:
        job = job_rows.create_job(s, config={"methods": ["dense", "nexus"]}, config_hash="h", name="unit <job>",
                                  package_versions={}, git_revision="abc")  # fmt: skip
        rows = job_rows.add_episodes(s, job.id, keys)
        job_id, ids = job.id, {(k.task_id, k.method, k.protocol): r.id for k, r in zip(keys, rows, strict=True)}
    verdicts = {("t1", "dense"): "resolved", ("t2", "dense"): "unresolved", ("t1", "nexus"): "resolved"}
    for (task, method, protocol), episode_id in ids.items():
        retention = RETENTION if (task, method, protocol) == ("t1", "nexus", "true_eviction") else None
        _run(db, episode_id, method, verdicts.get((task, method), "unresolved"), retention=retention)
    with db.session() as s:
        live = job_rows.create_job(s, config={}, config_hash="h2", name="live", package_versions={}, git_revision="")
        job_rows.add_episodes(s, live.id, [EpisodeKey("t1", "nexus", "prefill_only", "true_eviction", 0)])
        live_id = live.id
    db.dispose()
    return Fixture(sqlite_url(path), job_id, live_id, ids)


class FakeCelery:
    """Stands in for the Celery app the write actions send through: records what was sent or revoked."""

    def __init__(self) -> None:
        self.sent: list[tuple] = []
        self.revoked: list[str] = []
        self.control = self

    def send_task(self, name, args, **_kw):
        self.sent.append((name, args))
        return type("Sent", (), {"id": f"task-{len(self.sent)}"})()

    def revoke(self, ids):
        self.revoked += ids


def client(filled: Fixture, *, public: bool = False, token: str | None = TOKEN, **kw) -> TestClient:
    # TestClient sends `Host: testserver`: allow it as an operator would allow a proxy's name
    app = create_app(filled.url, token=token, public=public, allowed_hosts=["testserver"],
                     celery_app=kw.pop("celery", FakeCelery))  # fmt: skip
    return TestClient(app, **kw)


def test_jobs_list_and_redirect(filled):
    c = client(filled)
    done = c.get("/", follow_redirects=False)
    assert done.status_code in (302, 307) and done.headers["location"] == "/jobs"
    page = c.get("/jobs").text
    assert page.index(f'data-job="{filled.live_job_id}"') < page.index(f'data-job="{filled.job_id}"')  # newest first
    assert "unit &lt;job&gt;" in page and "<job>" not in page  # DB text is escaped
    assert f'href="/jobs/{filled.job_id}"' in page


@pytest.mark.parametrize(
    "path",
    ["/jobs/nope", "/jobs/nope/compare", "/jobs/nope/compare.json", "/jobs/nope/compare.csv", "/episodes/nope",
     "/episodes/nope/vs/nope2", "/no/such/page"],
)  # fmt: skip
def test_bad_ids_are_404_pages(filled, path):
    done = client(filled).get(path)
    assert done.status_code == 404
    assert "<h1>Not found</h1>" in done.text and "Traceback" not in done.text
    if "nope" in path:
        assert "nope" in done.text


def test_api_404_is_json(filled):
    done = client(filled).get("/api/jobs/nope/progress")
    assert done.status_code == 404 and "nope" in done.json()["error"]


def test_internal_errors_show_no_traceback(filled, monkeypatch):
    def boom(*_a, **_k):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(queries, "list_jobs", boom)
    done = client(filled, raise_server_exceptions=False).get("/jobs")
    assert done.status_code == 500 and "secret internals" not in done.text and "Traceback" not in done.text


def test_job_page_and_progress(filled):
    c = client(filled)
    page = c.get(f"/jobs/{filled.job_id[:5]}").text  # a prefix works like the CLI's
    assert f'<div id="progress" data-job="{filled.job_id}"' in page
    assert f'action="/jobs/{filled.job_id}/cancel"' in page and f'action="/jobs/{filled.job_id}/rerun-failed"' in page
    assert 'data-live="0"' in page
    progress = c.get(f"/api/jobs/{filled.live_job_id}/progress").json()
    assert progress == {"job_id": filled.live_job_id, "status": "pending", "total": 1, "finished": 0,
                        "counts": {"queued": 1}, "apart": {}}  # fmt: skip
    assert 'data-live="1"' in c.get(f"/jobs/{filled.live_job_id}").text


def test_public_dashboard_needs_the_token_for_everything(filled):
    c = client(filled, public=True)
    for path in ("/jobs", "/static/style.css", f"/jobs/{filled.job_id}/compare.json"):
        assert c.get(path).status_code == 401
    assert c.get("/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    signed = c.get(f"/jobs?token={TOKEN}", follow_redirects=False)
    assert signed.status_code == 303 and signed.headers["location"] == "/jobs"  # the token leaves the address
    cookie = signed.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=") and "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    assert c.get("/static/style.css").status_code == 200  # the cookie now signs later requests
    with pytest.raises(ValueError):
        create_app(filled.url, token=None, public=True)


def test_write_actions_need_the_token(filled):
    no_token = client(filled, token=None)
    refused = no_token.post(f"/jobs/{filled.job_id}/rerun-failed")
    assert refused.status_code == 403 and "--token" in refused.text
    c = client(filled)
    assert c.get("/jobs").status_code == 200  # loopback: reading needs nothing
    assert c.post(f"/jobs/{filled.job_id}/rerun-failed").status_code == 401
    wrong = c.post(f"/jobs/{filled.job_id}/cancel", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    other_site = {"Authorization": f"Bearer {TOKEN}", "Origin": "http://evil.example"}
    assert c.post(f"/jobs/{filled.job_id}/cancel", headers=other_site).status_code == 403


def test_rerun_and_cancel_do_what_the_cli_does(tmp_path, filled):
    # a private copy: these write
    import shutil

    src = Path(filled.url.removeprefix("sqlite:///"))
    shutil.copy(src, tmp_path / "copy.db")
    copy = Fixture(sqlite_url(tmp_path / "copy.db"), filled.job_id, filled.live_job_id, filled.episodes)
    celery = FakeCelery()
    c = client(copy, celery=lambda: celery)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    nothing = c.post(f"/jobs/{copy.job_id}/rerun-failed", headers=auth, follow_redirects=False)
    # verdicts only (t2 unresolved under dense and nexus): rerunning one would make Pass@1 a best of n
    assert nothing.headers["location"] == f"/jobs/{copy.job_id}?notice=rerun&n=0" and not celery.sent
    import sqlite3

    with sqlite3.connect(tmp_path / "copy.db") as conn:  # the runs broke instead: t2 dense, t2 nexus x 2 protocols
        conn.execute("UPDATE episodes SET status = 'infra_failure' WHERE status = 'unresolved'")
    done = c.post(f"/jobs/{copy.job_id}/rerun-failed", headers=auth, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == f"/jobs/{copy.job_id}?notice=rerun&n=3"
    assert len(celery.sent) == 3 and {name for name, _ in celery.sent} == {"nexus.episode"}
    assert "3 new attempt(s) enqueued" in c.get(done.headers["location"]).text
    c.get(f"/jobs?token={TOKEN}")  # the cookie signs the form posts
    done = c.post(f"/jobs/{copy.job_id}/cancel", follow_redirects=False)
    assert done.status_code == 303
    assert sorted(celery.revoked) == [f"task-{i}" for i in range(1, 4)]
    progress = c.get(f"/api/jobs/{copy.job_id}/progress").json()
    assert progress["status"] == "cancelled" and progress["counts"]["cancelled"] == 3


def test_pages_cannot_write(filled):
    from sqlalchemy import text

    engine = readonly_engine(filled.url)
    with engine.connect() as conn, pytest.raises(Exception, match="readonly|read-only|query_only|attempt to write"):
        conn.execute(text("DELETE FROM jobs"))
    engine.dispose()
    with pytest.raises(DatabaseUnavailable, match="no results database"):
        create_app(sqlite_url("/nonexistent/dir/x.db"), token=None, public=False)


@pytest.mark.services
def test_postgresql_pages_read_in_read_only_transactions(pg_db):
    from sqlalchemy import text

    with pg_db.session() as s:
        job = job_rows.create_job(s, config={}, config_hash="h", name="pg", package_versions={}, git_revision="")
        job_id = job.id
    app = create_app(pg_db.url, token=None, public=False, allowed_hosts=["testserver"])
    assert f'data-job="{job_id}"' in TestClient(app).get("/jobs").text
    app.state.ctx.dispose()
    engine = readonly_engine(pg_db.url)
    with engine.connect() as conn, pytest.raises(Exception, match="read-only transaction"):
        conn.execute(text("DELETE FROM jobs"))
    engine.dispose()


def _floats(attr: str) -> float | None:
    return None if attr == "" else float(attr)


def test_compare_page_matches_compare_jobs(filled):
    c = client(filled)
    db = connect(filled.url)
    with db.session() as s:
        expected = compare_jobs(s, [filled.job_id]).to_dict()
    db.dispose()
    assert c.get(f"/jobs/{filled.job_id}/compare.json").json() == expected
    csv = c.get(f"/jobs/{filled.job_id}/compare.csv")
    assert csv.headers["content-type"].startswith("text/csv") and csv.text.startswith(
        "scope,protocol,row_density,method,density,n,"
    )
    page = c.get(f"/jobs/{filled.job_id}/compare").text
    cells = re.findall(r'<td class="cell"([^>]*)>', page)
    assert len(cells) == sum(len(r["cells"]) for r in expected["rows"])
    for attrs in cells:
        a = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', attrs))
        row = next(r for r in expected["rows"] if (r["scope"], r["protocol"]) == (a["scope"], a["protocol"]))
        cell = row["cells"][a["method"]]
        assert (int(a["n"]), int(a["resolved"])) == (cell["n"], cell["resolved"])
        for key, field in (("rate", "rate"), ("ci-low", "ci_low"), ("ci-high", "ci_high"), ("p-value", "p_value")):
            assert _floats(a[key]) == cell[field], (key, a, cell)
    assert re.search(r'<div id="compare-chart"[^>]*><svg', page)
    # every status of the grid links to its own episode (dense's row reuses dense's episodes)
    links = re.findall(r'class="episode-link" href="/episodes/(\w+)"', page)
    assert len(links) == sum(len(c["statuses"]) for t in expected["grid"] for c in t["cells"])
    assert set(links) == set(filled.episodes.values())
    assert 'id="download-json"' in page and 'id="download-csv"' in page and '<ul id="notes">' in page
    caption = re.search(r'<p class="caption" id="compare-caption">([^<]*)</p>', page)[1]
    assert caption == expected["caption"].replace("'", "&#39;") and "docs/numbers.md" in caption


def test_episode_page(filled):
    c = client(filled)
    episode_id = filled.episodes[("t1", "nexus", "true_eviction")]
    page = c.get(f"/episodes/{episode_id}").text
    assert len(re.findall(r'<details class="turn" data-index="\d+"', page)) == 3
    assert re.search(r'<details class="turn" data-index="0" open>', page)
    assert re.search(r'<details class="turn" data-index="2">', page)  # a long observation starts closed
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page  # the raw completion, escaped
    assert '<span class="add">+a = 2</span>' in page and '<span class="del">-a = 1</span>' in page
    assert '<span class="hunk">@@ -1 +1 @@</span>' in page
    assert '<pre id="grading-log">PASSED test_x\n&lt;tag&gt;</pre>' in page and "unit (v1)" in page
    charts_div = page[page.index('<div id="cache-charts">') : page.index('<div id="retention">')]
    assert charts_div.count("<svg") >= 4 and "KV held and allocated" in charts_div
    # the episode's KV peaks: the largest of its turns' peaks (the first turn's prefill here), labelled as such
    # in the job page's byte format (results.cost.human_bytes), the exact count in the title
    assert '<dd id="kv-peak-held-bytes" title="24576 bytes">24.0 KiB</dd>' in page
    assert '<dd id="kv-peak-allocated-bytes" title="30720 bytes">30.0 KiB</dd>' in page
    assert ">KV held peak</dt>" in page and ">KV alloc peak</dt>" in page
    retention = page[page.index('<div id="retention">') :]
    assert "<svg" in retention.split("</div>")[0]
    vs = re.findall(r'<a class="vs-link" href="/episodes/(\w+)/vs/(\w+)"', page)
    assert (episode_id, filled.episodes[("t1", "dense", "true_eviction")]) in vs and len(vs) == 2
    other = c.get(f"/episodes/{filled.episodes[('t2', 'dense', 'true_eviction')]}").text
    assert "not stored for this episode" in other


def test_side_by_side_finds_the_divergence(filled):
    c = client(filled)
    nexus, dense = filled.episodes[("t1", "nexus", "true_eviction")], filled.episodes[("t1", "dense", "true_eviction")]
    page = c.get(f"/episodes/{nexus}/vs/{dense}").text
    assert '<div id="divergence" data-turn="1">' in page and 'class="vs-turn diverged" data-index="1"' in page
    assert 'id="mismatch"' not in page
    same = c.get(f"/episodes/{dense}/vs/{dense}").text
    assert '<div id="divergence" data-turn="">' in same
    other_task = c.get(f"/episodes/{dense}/vs/{filled.episodes[('t2', 'dense', 'true_eviction')]}").text
    assert 'id="mismatch"' in other_task


def test_divergence_counts_format_errors_and_ended_runs():
    def turn(i, action, fmt=False):
        return episode_queries.TurnView(i, action, "x", json.dumps(action), fmt, "", "", "", False, 0, 0, 0, None, None,
                                0, None, None, None, None, 0.0, 0.0, None)  # fmt: skip

    call = {"name": "a", "arguments": {"x": 1}}
    assert episode_queries.divergence([turn(0, call)], [turn(0, dict(call))]) is None
    assert episode_queries.divergence([turn(0, call)], [turn(0, {"name": "a", "arguments": {"x": 2}})]) == 0
    assert episode_queries.divergence([turn(0, None, True)], [turn(0, None, False)]) == 0
    assert episode_queries.divergence([turn(0, call)], [turn(0, call), turn(1, call)]) == 1


def test_charts_are_inline_svg_without_urls():
    svg = charts.retention_chart({"logical_length": 5000, "kv_heads": 4, "layers": [[[4, 1000], [1, 4000]]] * 3})
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>") and "http" not in svg
    matrix = charts.retention_matrix({"logical_length": 5000, "kv_heads": 4, "layers": [[[4, 1000], [1, 4000]]]})
    assert matrix.shape == (1, 1024) and matrix.max() == 1.0 and matrix.min() == 0.25
    with pytest.raises(ValueError, match="cover"):
        charts.retention_matrix({"logical_length": 10, "kv_heads": 1, "layers": [[[1, 9]]]})
    no_cache = episode_queries.TurnView(
        0, None, "x", "", True, "", "", "", False, 5, 5, 0, None, None, 0, None, None, None, None, 0.1, 0.2, None
    )
    assert [title for title, _ in charts.cache_charts([no_cache])] == ["prefill / decode seconds and tokens/s"]


def test_report_is_one_self_contained_file(filled, tmp_path):
    out = write_report(filled.url, filled.job_id[:6], tmp_path / "report.html")
    html = out.read_text(encoding="utf-8")
    assert html.count("<svg") >= 3 and '<table id="compare"' in html and "<style>" in html
    assert not re.search(r"https?://", html)  # no URL at all, not even SVG namespaces
    assert not re.search(r'(src|href)\s*=\s*"(?!#|data:)', html)  # nothing loaded or linked from elsewhere
    assert "<script" not in html
    with pytest.raises(LookupError):
        write_report(filled.url, "nope", tmp_path / "x.html")


def test_loopback_addresses():
    assert all(map(is_loopback, ["127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.168.1.4", "example.org"]))


def test_cli_verbs(filled, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from nexus_eval.cli import app

    monkeypatch.delenv("NEXUS_EVAL_TOKEN", raising=False)
    done = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--db", filled.url])
    assert done.exit_code == 2 and "--token" in done.output
    done = CliRunner().invoke(app, ["serve", "--db", str(tmp_path / "missing.db")])
    assert done.exit_code == 2 and "no results database" in done.output
    out = tmp_path / "r.html"
    done = CliRunner().invoke(app, ["report", filled.job_id, "-o", str(out), "--db", filled.url])
    assert done.exit_code == 0 and '<table id="compare"' in out.read_text(encoding="utf-8")
    done = CliRunner().invoke(app, ["report", "nope", "-o", str(out), "--db", filled.url])
    assert done.exit_code == 2 and "no job with id 'nope'" in done.output
    missing = tmp_path / "no-such-folder" / "r.html"
    done = CliRunner().invoke(app, ["report", filled.job_id, "-o", str(missing), "--db", filled.url])
    assert done.exit_code == 2 and "does not exist" in done.output and not missing.parent.exists()


def test_a_cell_whose_every_episode_broke_shows_not_run_on_the_compare_page_and_the_report(tmp_path):
    """Issue 44, item 4: nothing measured, so no rate, interval or p-value: "not run: <the first cause>"."""
    url = sqlite_url(tmp_path / "broken.db")
    db = connect(url)
    keys = [EpisodeKey(t, m, "prefill_only", "true_eviction", 0) for m in ("dense", "nexus") for t in ("t1", "t2")]
    with db.session() as s:
        job = job_rows.create_job(s, config={"methods": ["dense", "nexus"]}, config_hash="h", name="broken",
                                  package_versions={}, git_revision="abc")  # fmt: skip
        rows = job_rows.add_episodes(s, job.id, keys)
        job_id, ids = job.id, {(k.task_id, k.method): r.id for k, r in zip(keys, rows, strict=True)}
    for task in ("t1", "t2"):
        _run(db, ids[(task, "dense")], "dense", "resolved")
        with db.session() as s:
            claim = db_store.claim_episode(s, ids[(task, "nexus")])
        with db.session() as s:
            error = f"ValueError: cannot load model 'typo' ({task})\nTraceback (most recent call last):"
            db_store.finish_episode(s, claim, "infra_failure", error=error)
    db.dispose()
    c = client(Fixture(url, job_id, job_id, {}))
    data = c.get(f"/jobs/{job_id}/compare.json").json()["rows"][0]["cells"]["nexus"]
    assert (data["rate"], data["p_value"], data["not_run"]) == (None, None, "ValueError: cannot load model 'typo' (t1)")
    assert ",not_run," in c.get(f"/jobs/{job_id}/compare.csv").text.splitlines()[0]
    page = c.get(f"/jobs/{job_id}/compare").text
    report = write_report(url, job_id, tmp_path / "report.html").read_text(encoding="utf-8")
    for html in (page, report):
        cell = re.search(r'<td class="cell"[^>]*data-method="nexus"[^>]*>(.*?)</td>', html, re.S)
        assert cell, html
        assert 'data-rate=""' in cell[0] and 'data-p-value=""' in cell[0]
        assert 'data-not-run="ValueError: cannot load model &#39;typo&#39; (t1)"' in cell[0]
        assert "not run: ValueError: cannot load model &#39;typo&#39; (t1)" in cell[1] and "p=" not in cell[1]
        assert "1 cell(s) not run" in html
