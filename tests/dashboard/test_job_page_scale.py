"""The job page and the report's curves at scale (issue 35): the episode grid is paged, sorted, filtered and counted in
SQL (``db.episode_lists``), its page reads no turn and no payload, and ``method_curves`` is one GROUP BY that gives
the numbers the Python loop over every turn gave.

Jobs are written as plain rows (ORM inserts), so a job larger than a page costs no worker run.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from html import unescape
from urllib.parse import parse_qs, urlparse

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, select

from dashboard import pages, queries
from dashboard.app import create_app
from dashboard.list_queries import EPISODES
from db import job_rows
from db import store as db_store
from db.models import Episode, Turn
from tests.support.db_fixtures import any_db_fixture  # noqa: F401  (fixture)

N_KEYS = pages.EPISODES_PAGE + 23  # one full page and a bit
METHODS = ("dense", "nexus", "snapkv")


def _episode(job_id: str, i: int, *, attempt: int = 1, status: str = "resolved", driver: str = "agent") -> Episode:
    task, method, seed = f"task-{i // 9:03d}", METHODS[i % 3], (i // 3) % 3
    return Episode(
        job_id=job_id, task_id=task, method=method, scope="prefill_only", protocol="true_eviction", seed=seed,
        attempt=attempt, driver=driver, status=status, episode_key=job_rows.episode_key(task, method, "prefill_only",
        "true_eviction", seed), n_turns=i % 7 or None, wall_s=float(i % 11), config={},
    )  # fmt: skip


@pytest.fixture
def big_job(any_db):
    """(db, job id): N_KEYS result attempts, every 10th a timeout (what `rerun failed` would rerun)."""
    with any_db.session() as s:
        job = job_rows.create_job(s, config={}, config_hash="h", name="big", package_versions={}, git_revision="")
        s.add_all(_episode(job.id, i, status="timeout" if i % 10 == 0 else "resolved") for i in range(N_KEYS))
        job_id = job.id
    return any_db, job_id


def _client(db) -> TestClient:
    return TestClient(create_app(db.url, token=None, public=False, allowed_hosts=["testserver"]))


def _rows(page: str) -> list[str]:
    body = page[page.index('<table id="episodes"') :]
    return re.findall(r'<tr data-episode="([^"]+)"', body[: body.index("</table>")])


def _href(page: str, anchor: str) -> str:
    return unescape(re.search(rf'<a id="{anchor}" rel="\w+" href="([^"]+)"', page)[1])


def test_a_job_larger_than_a_page_shows_one_page_with_links(big_job):
    db, job_id = big_job
    c = _client(db)
    first = c.get(f"/jobs/{job_id}?sort=wall_s&order=desc&method=nexus").text
    with db.session() as s:
        expected = [r.id for r in EPISODES.parse("wall_s", "desc", {"method": "nexus"}).apply(
            db_store.result_attempts(s, [job_id]))]  # fmt: skip
    assert _rows(first) == expected  # fewer than a page: one page, no links
    assert 'id="episodes-pages"' not in first and "rows " not in first
    page1 = c.get(f"/jobs/{job_id}?sort=wall_s&order=desc").text
    assert len(_rows(page1)) == pages.EPISODES_PAGE
    assert f"showing {pages.EPISODES_PAGE} of {N_KEYS} episodes: rows 1-{pages.EPISODES_PAGE} of {N_KEYS}" in page1
    assert 'id="episodes-pages-prev"' not in page1
    nxt = _href(page1, "episodes-pages-next")
    assert {k: v[0] for k, v in parse_qs(urlparse(nxt).query).items()} == {
        "sort": "wall_s",
        "order": "desc",
        "page": "2",
    }
    page2 = c.get(f"/jobs/{job_id}{nxt}").text
    assert len(_rows(page2)) == N_KEYS - pages.EPISODES_PAGE and 'id="episodes-pages-next"' not in page2
    assert f"rows {pages.EPISODES_PAGE + 1}-{N_KEYS} of {N_KEYS}, page 2 of 2" in page2
    assert _href(page2, "episodes-pages-prev") == "?sort=wall_s&order=desc"  # page 1 needs no parameter
    with db.session() as s:
        everything = EPISODES.parse("wall_s", "desc", {}).apply(db_store.result_attempts(s, [job_id]))
    assert _rows(page1) + _rows(page2) == [r.id for r in everything]
    # a new sort or filter starts at page 1: neither the sort links nor the filter form carry the page
    assert "page=" not in "".join(re.findall(r'<a class="sort" href="([^"]+)"', page2))
    form = page2[page2.index('<form id="episodes-filter"') :]
    assert 'name="page"' not in form[: form.index("</form>")]


@pytest.mark.parametrize(("page", "words"), [("3", ["page 3", "1 to 2"]), ("0", ["page"]), ("x", ["page"])])
def test_a_bad_page_is_a_400_page(big_job, page, words):
    db, job_id = big_job
    done = _client(db).get(f"/jobs/{job_id}?page={page}")
    assert done.status_code == 400 and "<h1>Bad request</h1>" in done.text and "Traceback" not in done.text
    for word in words:
        assert word in unescape(done.text)


def test_the_page_reads_no_turn_no_payload_and_a_fixed_number_of_queries(big_job):
    db, job_id = big_job
    client = _client(db)
    engine = client.app.state.ctx.sessions.kw["bind"]
    seen: list[str] = []
    listen = lambda *args: seen.append(args[2])  # noqa: E731  (statement)
    event.listen(engine, "before_cursor_execute", listen)
    try:
        page = client.get(f"/jobs/{job_id}?status=resolved&task=task-00").text
    finally:
        event.remove(engine, "before_cursor_execute", listen)
    selects = [q for q in seen if q.lstrip().upper().startswith("SELECT")]
    assert not [q for q in selects if re.search(r"\bturns\b", q)]
    payloads = r"(?<!\()episodes\.(patch|test_log|result|retention)\b"  # selected (not read inside a JSON path)
    assert not [q for q in selects if re.search(payloads, q)]
    assert len(selects) <= 8, selects  # job, facets, count, page, interactive: not one per row
    timeouts = math.ceil(N_KEYS / 10)
    assert f'data-n="{timeouts}"' in page and f"rerun failed ({timeouts})" in page  # from the facets' counts
    options = re.search(r'<select name="method">(.*?)</select>', page, re.S)[1]
    assert re.findall(r'<option value="(\w+)"', options) == sorted(METHODS)


# -- method_curves -----------------------------------------------------------------------------------------------


def _python_curves(session, job_id, include_interactive=False):
    """The Python computation ``method_curves`` did before it was SQL: every turn of every result attempt."""
    episodes = {e.id: e for e in db_store.result_attempts(session, [job_id], include_interactive=include_interactive)}
    query = select(Turn.episode_id, Turn.index, Turn.physical_after, Turn.eviction_events).where(
        Turn.episode_id.in_(list(episodes))
    )
    sums = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for episode_id, index, physical, events in session.execute(query):
        e = episodes[episode_id]
        acc = sums[(e.scope, e.protocol, e.method, index)]
        if physical and physical.get("mean") is not None:
            acc[0] += float(physical["mean"])
            acc[1] += 1
        acc[2] += events or 0
        acc[3] += 1
    out = defaultdict(lambda: defaultdict(list))
    for (scope, protocol, method, index), (slots, n_slots, events, n) in sorted(sums.items()):
        out[(scope, protocol)][method].append((index, slots / n_slots if n_slots else float("nan"), events / n))
    return {k: dict(v) for k, v in out.items()}


PHYSICAL = [None, {}, {"min": 1.0, "mean": None, "max": 2.0}, {"mean": 10.5}, {"mean": 45.25}, {"mean": 3}]


@pytest.fixture
def turned_job(any_db):
    """(db, job id): 12 keys over two protocols and three methods with 0-5 turns each of mixed telemetry; some keys
    rerun after a timeout, resampled, or run interactively."""
    with any_db.session() as s:
        job = job_rows.create_job(s, config={}, config_hash="h", package_versions={}, git_revision="")
        rows = []
        for i in range(12):
            shape = [("resolved", "agent")]
            if i % 4 == 1:
                shape = [("timeout", "agent"), ("unresolved", "agent")]
            elif i % 4 == 2:
                shape = [("unresolved", "agent"), ("resolved", "agent"), ("resolved", "interactive")]
            for attempt, (status, driver) in enumerate(shape, start=1):
                e = _episode(job.id, i, attempt=attempt, status=status, driver=driver)
                e.protocol = ("true_eviction", "full_context")[i % 2]
                e.episode_key = job_rows.episode_key(e.task_id, e.method, e.scope, e.protocol, e.seed)
                rows.append(e)
        s.add_all(rows)
        s.flush()
        for n, e in enumerate(rows):
            for t in range((n * 7) % 6):
                s.add(Turn(episode_id=e.id, index=t, physical_after=PHYSICAL[(n + t) % len(PHYSICAL)],
                           eviction_events=(n * t) % 4))  # fmt: skip
        job_id = job.id
    return any_db, job_id


def _same(a, b) -> bool:
    """Equal dicts of curves, NaN equal to NaN."""
    flat = lambda d: sorted((k, m, p) for k, v in d.items() for m, pts in v.items() for p in pts)  # noqa: E731
    return len(flat(a)) == len(flat(b)) and all(
        x[:2] == y[:2] and x[2][0] == y[2][0] and x[2][2] == y[2][2]
        and (x[2][1] == y[2][1] or (math.isnan(x[2][1]) and math.isnan(y[2][1])))
        for x, y in zip(flat(a), flat(b), strict=True)
    )  # fmt: skip


@pytest.mark.parametrize("include_interactive", [False, True])
def test_method_curves_equal_the_python_loop(turned_job, include_interactive):
    db, job_id = turned_job
    with db.session() as s:
        expected = _python_curves(s, job_id, include_interactive)
        got = queries.method_curves(s, job_id[:5], include_interactive=include_interactive)
    assert expected and any(math.isnan(p[1]) for v in expected.values() for pts in v.values() for p in pts)
    assert _same(got, expected), (got, expected)
    assert list(got) == list(expected) and all(list(got[k]) == list(expected[k]) for k in got)  # same order
    with db.session() as s, pytest.raises(LookupError):
        queries.method_curves(s, "nosuchjob")
