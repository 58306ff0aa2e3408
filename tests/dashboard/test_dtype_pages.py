"""The measuring dtype on the dashboard: the compare page and the report say what the replay and action cells were
measured in (caption and ``data-dtype``), an episode's replay list names each row's dtype, and a probe run's page its
run's. FastAPI's TestClient over SQLite rows written through ``db.replays`` / ``db.probes``."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from dashboard.app import create_app
from dashboard.report import report_html
from db.probes import create_probe_run, finish_probe_run, start_probe_run
from tests.results.test_action_table import MODEL, expert_job, span
from tests.results.test_replay_dtype import replay
from tests.support.db_fixtures import sqlite_db_fixture  # noqa: F401  (fixtures)


def _client(db) -> TestClient:
    return TestClient(create_app(db.url, token="t" * 16, public=False, allowed_hosts=["testserver"]))


def test_the_compare_page_and_the_report_name_the_dtype_of_every_replay_cell(sqlite_db):
    job, ids = expert_job(sqlite_db, ["t1", "t2"])
    for e in ids.values():
        for dtype in ("float32", "bfloat16"):
            replay(sqlite_db, e, "dense", 1.0, dtype)
            replay(sqlite_db, e, "snapkv", 1.5, dtype)
        replay(sqlite_db, e, "dense", None, "bfloat16", model=MODEL, spans=[span(1.0)])
        replay(sqlite_db, e, "snapkv", None, "bfloat16", model=MODEL, spans=[span(0.5)])
    with sqlite_db.session() as s:
        report = report_html(s, [job])
    page = _client(sqlite_db).get(f"/jobs/{job}/compare").text
    for html in (page, report):
        caption = re.search(r'<p class="caption" id="replay-caption">([^<]*)</p>', html).group(1)
        assert f"measured on own model, bfloat16; own model, float32; {MODEL}, bfloat16" in caption
        table = html[html.index('<table id="replay"') :]
        table = table[: table.index("</table>")]
        rows = re.findall(r'<tr data-method="snapkv" [^>]*data-model="([^"]*)" data-dtype="([^"]*)">', table)
        assert sorted(rows) == [("", "bfloat16"), ("", "float32"), (MODEL, "bfloat16")]
        assert "snapkv (bfloat16)" in html and "snapkv (float32)" in html
        action = re.search(r'<p class="caption" id="action-caption">([^<]*)</p>', html).group(1)
        assert action.endswith(f"Measured on {MODEL}, bfloat16")
        assert f"replayed on {MODEL}, bfloat16" in html
        cells = re.findall(r'<td class="cell action-cell"([^>]*)>', html)
        assert cells and all('data-dtype="bfloat16"' in c for c in cells)


def test_an_episode_page_lists_each_replay_with_its_dtype(sqlite_db):
    _, ids = expert_job(sqlite_db, ["t1"])
    (e,) = ids.values()
    replay(sqlite_db, e, "snapkv", 1.5, "float32")
    replay(sqlite_db, e, "snapkv", 1.5, "bfloat16")
    replay(sqlite_db, e, "dense", 1.0, None)
    page = _client(sqlite_db).get(f"/episodes/{e}").text
    table = page[page.index('<table id="replay-options"') :]
    table = table[: table.index("</table>")]
    assert "<th>dtype</th>" in table
    rows = re.findall(r'<tr data-replay="\d+" data-method="(\w+)"[^>]* data-dtype="([^"]*)"', table)
    assert sorted(rows) == [("dense", ""), ("snapkv", "bfloat16"), ("snapkv", "float32")]
    assert "not recorded" in table
    assert re.search(r'id="replay-summary"[^>]*>replay \d+ \(snapkv · [^)]*· (bfloat16|float32),', page)


def test_a_probe_run_page_names_its_dtype(sqlite_db):
    settings = {"model": "smollm2-135m", "probes": ["nll"], "variants": ["dense"]}
    with sqlite_db.session() as s:
        run_id = create_probe_run(s, settings=settings, provenance={}, n_planned=0).id
        start_probe_run(s, run_id, device="cuda:0", dtype="bfloat16")
        finish_probe_run(s, run_id, "done")
        old_id = create_probe_run(s, settings=settings, provenance={}, n_planned=0).id
    c = _client(sqlite_db)
    page = c.get(f"/probes/{run_id}").text
    assert '<dd id="probe-dtype" data-dtype="bfloat16">bfloat16</dd>' in page
    assert re.search(r'id="probe-caption">[^<]*measured on smollm2-135m, bfloat16</p>', page)
    assert c.get(f"/probes/{run_id}/cells.json").json()["run"]["dtype"] == "bfloat16"
    old = c.get(f"/probes/{old_id}").text
    assert '<dd id="probe-dtype" data-dtype="">not recorded</dd>' in old
    assert "measured on smollm2-135m, dtype not recorded" in old
