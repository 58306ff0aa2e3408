"""The dashboard's pages in a real browser (Debian's chromium via Playwright) over a real job's database.

Every page loads without console errors and is screenshotted (bench/out/dashboard/); the compare page shows
exactly the numbers of ``nexus-eval compare --format json``; the charts and the retention map are drawn (svg
elements with a size and children); the token guards what it must; bad ids get the 404 page. The job is run
once per session (tests/dashboard/conftest.py: ``job_run``)."""

from __future__ import annotations

import json
import re
from urllib.parse import urlparse

import pytest

from tests.dashboard.conftest import METHODS, PROTOCOLS, SCOPE, TOKEN, cli

pytestmark = [pytest.mark.docker, pytest.mark.slow]

NOT_FOUND = r"status of 404"
UNAUTHORIZED = r"status of 40[13]"


def _attr(value) -> str:
    """A compare JSON value as the contract writes it into a data-* attribute: repr(float), '' for None."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _drawn(locator, what: str, *, min_count: int = 1) -> None:
    """Each svg matched has a non-zero bounding box and child elements (a chart was drawn, not an empty tag)."""
    n = locator.count()
    assert n >= min_count, f"{what}: {n} svg element(s), expected at least {min_count}"
    for i in range(n):
        svg = locator.nth(i)
        box = svg.bounding_box()
        assert box is not None and box["width"] > 0 and box["height"] > 0, f"{what} #{i}: bounding box {box}"
        children = svg.evaluate("el => el.querySelectorAll('*').length")
        assert children > 0, f"{what} #{i}: an empty svg"


def _goto(page, url: str, status: int = 200):
    response = page.goto(url, wait_until="load")
    assert response is not None and response.status == status, f"{url}: {response.status if response else None}"
    return response


def test_jobs_page_lists_the_job(page, server, job_run, shot):
    _goto(page, f"{server.base}/jobs")
    assert page.locator("table#jobs").count() == 1
    assert page.locator(f'table#jobs tr[data-job="{job_run.job_id}"]').count() == 1
    shot(page, "jobs")


def test_job_page_and_its_live_progress(page, server, job_run, shot):
    job = job_run.job_id
    _goto(page, f"{server.base}/jobs/{job}")
    assert page.locator(f'div#progress[data-job="{job}"]').count() == 1
    for form, action in (("cancel-form", "cancel"), ("rerun-form", "rerun-failed")):
        loc = page.locator(f"form#{form}")
        assert loc.count() == 1, form
        assert urlparse(loc.get_attribute("action") or "").path == f"/jobs/{job}/{action}", form
        assert (loc.get_attribute("method") or "").lower() == "post", form
    shot(page, "job")
    progress = page.request.get(f"{server.base}/api/jobs/{job}/progress")
    assert progress.status == 200 and progress.headers["content-type"].startswith("application/json")
    body = progress.json()
    assert set(body) >= {"job_id", "status", "total", "finished", "counts"}, body
    assert body["job_id"] == job and body["status"] == "done", body
    assert body["total"] == body["finished"] == len(job_run.episodes), body
    statuses = [e["status"] for e in job_run.episodes]
    assert {s: n for s, n in body["counts"].items() if n} == {s: statuses.count(s) for s in set(statuses)}, body


def test_compare_page_shows_exactly_the_compare_json(page, server, job_run, shot):
    job, table = job_run.job_id, job_run.compare
    _goto(page, f"{server.base}/jobs/{job}/compare")
    cells = page.locator("table#compare td.cell")
    expected = [(row, method, cell) for row in table["rows"] for method, cell in row["cells"].items()]
    assert len(expected) == len(METHODS) * len(PROTOCOLS) and {row["scope"] for row in table["rows"]} == {SCOPE}
    assert cells.count() == len(expected)
    fields = {"n": "n", "resolved": "resolved", "rate": "rate", "ci-low": "ci_low", "ci-high": "ci_high"}
    fields["p-value"] = "p_value"
    mismatches = []
    for row, method, cell in expected:
        sel = f'td.cell[data-scope="{row["scope"]}"][data-protocol="{row["protocol"]}"][data-method="{method}"]'
        td = page.locator(f"table#compare {sel}")
        assert td.count() == 1, sel
        for attr, key in fields.items():
            shown, want = td.get_attribute(f"data-{attr}"), _attr(cell[key])
            if shown != want:
                mismatches.append(f"{row['scope']}/{row['protocol']}/{method} data-{attr}={shown!r}, json {want!r}")
    assert not mismatches, "\n".join(mismatches)
    _drawn(page.locator("div#compare-chart svg"), "compare chart")
    # every episode of the job is linked from the task grid
    links = page.locator("table#task-grid a.episode-link")
    hrefs = {urlparse(links.nth(i).get_attribute("href")).path for i in range(links.count())}
    assert hrefs == {f"/episodes/{e['id']}" for e in job_run.episodes}
    shot(page, "compare")
    # the downloads: the same table as JSON, and CSV
    for link, kind in (("download-json", "json"), ("download-csv", "csv")):
        href = page.locator(f"a#{link}").get_attribute("href")
        assert urlparse(href).path == f"/jobs/{job}/compare.{kind}", href
        got = page.request.get(f"{server.base}/jobs/{job}/compare.{kind}")
        assert got.status == 200, (kind, got.status)
        if kind == "json":
            assert json.loads(got.text())["rows"] == table["rows"]
        else:
            header = got.text().splitlines()[0]
            assert "method" in header and "scope" in header, header


def test_episode_page_of_a_nexus_episode(page, server, job_run, shot):
    episode = job_run.episode("nexus", "true_eviction")
    assert episode["retention"] is not None, "the hf episode stored no retention map"
    _goto(page, f"{server.base}/episodes/{episode['id']}")
    turns = page.locator("section#turns details.turn")
    assert turns.count() == episode["n_turns"] >= 1
    assert [turns.nth(i).get_attribute("data-index") for i in range(turns.count())] == [
        str(i) for i in range(episode["n_turns"])
    ]
    assert page.locator("pre#patch").count() == 1 and page.locator("pre#grading-log").count() == 1
    _drawn(page.locator("div#cache-charts svg"), "cache charts", min_count=2)
    _drawn(page.locator("div#retention svg"), "retention map")
    siblings = {e["id"] for e in job_run.episodes} - {episode["id"]}
    vs = page.locator("a.vs-link")
    targets = set()
    for i in range(vs.count()):
        match = re.fullmatch(rf"/episodes/{episode['id']}/vs/(\w+)", urlparse(vs.nth(i).get_attribute("href")).path)
        assert match, vs.nth(i).get_attribute("href")
        targets.add(match.group(1))
    assert targets and targets <= siblings, (targets, siblings)
    page.locator("section#turns details.turn").first.locator("summary").click()  # expanding a turn works
    shot(page, "episode-nexus")


def test_every_hf_episode_page_draws_its_retention_map(page, server, job_run):
    for episode in job_run.episodes:
        what = f"retention map of {episode['method']}/{episode['protocol']}"
        assert episode["retention"] is not None, what
        _goto(page, f"{server.base}/episodes/{episode['id']}")
        _drawn(page.locator("div#retention svg"), what)


def test_vs_page_from_an_episode_page(page, server, job_run, shot):
    episode = job_run.episode("nexus", "true_eviction")
    dense = job_run.episode("dense", "true_eviction")
    _goto(page, f"{server.base}/episodes/{episode['id']}")
    link = page.locator(f'a.vs-link[href$="/vs/{dense["id"]}"]')
    assert link.count() == 1, "no side-by-side link to the dense episode"
    with page.expect_navigation():
        link.click()
    assert urlparse(page.url).path == f"/episodes/{episode['id']}/vs/{dense['id']}"
    divergence = page.locator("div#divergence")
    assert divergence.count() == 1
    turn = divergence.get_attribute("data-turn")
    assert turn is not None and (turn == "" or turn.isdigit()), turn
    shot(page, "vs")


def test_report_file_opens_from_disk(page, job_run, tmp_path, shot):
    out = tmp_path / "report.html"
    done = cli("report", job_run.job_id, "--db", str(job_run.db_path), "-o", str(out), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    assert page.goto(out.as_uri(), wait_until="load") is not None
    assert job_run.job_id in page.content()
    # a standalone file: nothing is fetched from a server
    assert all(u.startswith(("file:", "data:")) for u in requests), requests
    shot(page, "report")


def test_public_app_needs_the_token_and_keeps_it_in_a_cookie(page, page_errors, public_server, job_run, shot):
    base, job = public_server.base, job_run.job_id
    page_errors.allow(UNAUTHORIZED)
    response = page.goto(f"{base}/jobs")
    assert response.status == 401
    assert job not in page.content() and page.locator("table#jobs").count() == 0
    shot(page, "public-no-token")
    assert page.request.get(f"{base}/api/jobs/{job}/progress").status in (401, 403)
    assert page.request.get(f"{base}/jobs?token=wrong-{TOKEN}").status in (401, 403)
    bearer = page.request.get(f"{base}/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.status == 200
    _goto(page, f"{base}/jobs?token={TOKEN}")
    cookies = {c["name"]: c for c in page.context.cookies()}
    assert cookies.get("nexus_eval_token", {}).get("value") == TOKEN, cookies
    assert page.locator(f'table#jobs tr[data-job="{job}"]').count() == 1
    # later navigation rides on the cookie: no token in the URL
    _goto(page, f"{base}/jobs/{job}")
    assert page.locator(f'div#progress[data-job="{job}"]').count() == 1
    assert page.request.get(f"{base}/api/jobs/{job}/progress").status == 200


def test_posts_need_the_token_even_when_pages_are_open(page, server, job_run):
    job = job_run.job_id
    _goto(page, f"{server.base}/jobs/{job}")  # the page itself is open
    for action in ("cancel", "rerun-failed"):
        refused = page.request.post(f"{server.base}/jobs/{job}/{action}", max_redirects=0)
        assert refused.status in (401, 403), (action, refused.status)
    progress = page.request.get(f"{server.base}/api/jobs/{job}/progress").json()
    assert progress["status"] == "done" and progress["total"] == len(job_run.episodes), progress


@pytest.mark.parametrize("path", ["/episodes/nosuchepisode", "/jobs/nosuchjob", "/episodes/nosuch/vs/other"])
def test_bad_ids_get_the_not_found_page(page, page_errors, server, path, shot):
    page_errors.allow(NOT_FOUND)
    _goto(page, f"{server.base}{path}", status=404)
    assert page.locator("h1").first.inner_text().strip() == "Not found"
    if path == "/episodes/nosuchepisode":
        shot(page, "not-found")


def _wall(page) -> list[float | None]:
    rows = page.locator("table#episodes tbody tr")
    return [float(v) if (v := rows.nth(i).get_attribute("data-wall-s")) else None for i in range(rows.count())]


def test_job_page_sorts_filters_and_offers_only_what_applies(page, server, job_run, shot):
    job = job_run.job_id
    _goto(page, f"{server.base}/jobs/{job}")
    # a done job: nothing to cancel; its buttons say why instead of acting
    assert page.locator("form#cancel-form button").is_disabled()
    assert page.locator("#cancel-why").inner_text().startswith("nothing to cancel")
    with page.expect_navigation():
        page.locator('th[data-sort="wall_s"] a.sort').click()
    assert "sort=wall_s" in page.url
    assert page.locator('th[data-sort="wall_s"]').get_attribute("aria-sort") == "ascending"
    walls = _wall(page)
    assert len(walls) == len(job_run.episodes) and all(w is not None for w in walls) and walls == sorted(walls)
    with page.expect_navigation():
        page.locator('th[data-sort="wall_s"] a.sort').click()
    assert _wall(page) == sorted(walls, reverse=True)
    page.locator('form#episodes-filter select[name="method"]').select_option("nexus")
    with page.expect_navigation():
        page.locator("form#episodes-filter button[type=submit]").click()
    assert "method=nexus" in page.url and "sort=wall_s" in page.url  # the form keeps the sort
    nexus = [e for e in job_run.episodes if e["method"] == "nexus"]
    rows = page.locator("table#episodes tbody tr")
    assert {rows.nth(i).get_attribute("data-episode") for i in range(rows.count())} == {e["id"] for e in nexus}
    assert page.locator("#episodes-count").inner_text().startswith(f"showing {len(nexus)} of {len(job_run.episodes)}")
    shot(page, "job-sorted-filtered")


def test_retention_turn_marks_and_token_divergence_of_a_real_run(page, server, job_run, shot):
    episode = job_run.episode("nexus", "true_eviction")
    dense = job_run.episode("dense", "true_eviction")
    _goto(page, f"{server.base}/episodes/{episode['id']}")
    marks = page.locator("div#retention svg g.turn-mark")
    turns = [int(marks.nth(i).get_attribute("data-turn")) for i in range(marks.count())]
    assert turns and turns == sorted(set(turns)) and turns[0] == 0 and turns[-1] < episode["n_turns"], turns
    kept = page.locator("table#retention-turns tbody tr")
    assert kept.count() == episode["n_turns"]
    # the turns tile the final cache's stream: from 0 to its logical length, each starting where the last ended
    spans = [(int(kept.nth(i).get_attribute("data-start")), int(kept.nth(i).get_attribute("data-end"))) for i in
             range(kept.count())]  # fmt: skip
    assert spans[0][0] == 0 and spans[-1][1] == episode["retention"]["logical_length"], spans
    assert all(end == start for (_, end), (start, _) in zip(spans, spans[1:], strict=False)), spans
    shot(page, "episode-retention-turns")
    _goto(page, f"{server.base}/episodes/{episode['id']}/vs/{dense['id']}")
    found = page.locator("p#stream-divergence")
    assert found.get_attribute("data-basis") == "tokens"  # the hf backend stores the ids it sampled
    turn, index = found.get_attribute("data-turn"), found.get_attribute("data-index")
    assert (turn == index == "") or (turn.isdigit() and index.isdigit()), (turn, index)
    rows = page.locator("table#vs-cache tbody tr")
    assert rows.count() == max(episode["n_turns"], dense["n_turns"])
    logical = page.locator('table#vs-cache td[data-metric="logical"][data-side="a"]').first.get_attribute("data-value")
    assert logical and int(logical) > 0
    shot(page, "vs-streams")
