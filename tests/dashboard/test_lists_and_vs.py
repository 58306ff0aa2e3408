"""The dashboard's lists, actions, retention turn marks and side-by-side streams, without a browser.

FastAPI's TestClient over a SQLite file filled through the real store API (claim, record_turn, finish_episode,
record_grade), as a worker leaves it. Jobs:

- ``sweep``: done; t1/t2 x dense/nexus (true_eviction) + nexus full_context on t1; t1 resolved, t2 unresolved.
  Its t1 episodes store token streams (the nexus one a retention map); its t2 episodes store none.
- ``clean``: done, every result resolved: neither write action applies.
- ``waiting``: one queued episode (no cost yet): cancel applies, rerun does not.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from html import unescape
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from fastapi.testclient import TestClient

from dashboard import list_queries, streams
from dashboard.app import create_app
from db import connect, job_rows, sqlite_url
from db import store as db_store
from db.models import Episode
from jobs.spec import EpisodeKey
from tests.dashboard.test_app_unit import FakeCelery
from tests.support.db_fixtures import pg_db_fixture  # noqa: F401  (fixture)

TOKEN = "lists-test-token"

# the t1 streams: (prompt_tokens, tokens_appended, generated ids, keep) per turn, true_eviction
# turn 0 feeds 10 and samples 5 (4 of them fed back: logical 14), turn 1 feeds 6 at 14, turn 2 feeds 6 at 24
GEN = {
    "dense": [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11], [20, 21, 22]],
    "nexus": [[1, 2, 3, 4, 5], [7, 8, 9, 99, 11], [20, 21, 22]],  # differs at turn 1, token 3
}
TEXT = {"dense": ["look around", "abc def", "done"], "nexus": ["look around", "abc dXf", "done"]}
PROMPTS = [(10, 10, 0), (20, 6, 14), (30, 6, 24)]  # (prompt_tokens, tokens_appended, keep)
# 2 layers x 2 KV heads over 32 positions: layer 0 keeps t0 whole, none of t1, one head of t2; layer 1 all
RETENTION = {"logical_length": 32, "kv_heads": 2, "layers": [[[2, 14], [0, 10], [1, 8]], [[2, 32]]]}
# full_context re-renders: the whole prompt is fed every turn; the stored keep says where each turn's new part is
FULL_CONTEXT = [(10, 10, 0), (19, 19, 12), (27, 27, 20)]
FULL_RETENTION = {"logical_length": 29, "kv_heads": 1, "layers": [[[1, 29]]]}
# the t2 episodes (no token ids): their completions differ at turn 0, character 6
T2_TEXT = {"dense": "hello world", "nexus": "hello there"}
COSTS = {  # (task, method, protocol) -> (wall_s, kv_peak_held_bytes, kv_peak_allocated_bytes)
    ("t1", "dense", "true_eviction"): (12.5, 3 * 2**20, 4 * 2**20),
    ("t1", "nexus", "true_eviction"): (4.25, 1258291, 2 * 2**20),  # 1.2 MiB, 2.0 MiB
    ("t1", "nexus", "full_context"): (30.0, 2048, 4096),
    ("t2", "dense", "true_eviction"): (7.0, 500, 900),
    ("t2", "nexus", "true_eviction"): (None, None, None),  # not reported
}


@dataclass
class Filled:
    url: str
    sweep: str
    clean: str
    waiting: str
    episodes: dict[tuple[str, str, str], str]  # (task, method, protocol) -> id, of the sweep job
    names: dict[str, str | None]  # job id -> name


def _turns(task: str, method: str, protocol: str) -> list[dict]:
    out = []
    for i in range(3):
        if task == "t1" and protocol == "full_context":
            prompt, appended, keep = FULL_CONTEXT[i]
        else:
            prompt, appended, keep = PROMPTS[i]
        generated = GEN[method][i]
        turn = {
            "prompt_tokens": prompt,
            "tokens_appended": appended,
            "tokens_generated": len(generated),
            "logical_length": prompt + len(generated) - 1,
            "physical_after": {"min": 5.0, "mean": 10.0 + i + (0.5 if method == "nexus" else 0.0), "max": 15.0},
            "eviction_events": i if method == "nexus" else 0,
            "kv_held_bytes": 1000 * (i + 1),
            "kv_allocated_bytes": 1500 * (i + 1),
            "kv_peak_held_bytes": 2000 * (i + 1),
            "kv_peak_allocated_bytes": 2500 * (i + 1),
            "prefill_s": 0.25,
            "decode_s": 0.5 + i,
            "completion": TEXT[method][i] if task == "t1" else (T2_TEXT[method] if i == 0 else "same"),
            "action": {"name": "execute_bash", "arguments": {"command": "ls"}},
            "observation": "x.py",
        }
        if task == "t1":
            turn["tokens"] = {"keep": keep, "append": list(range(appended)), "generated": generated}
        out.append(turn)
    return out


def _run(db, episode_id: str, key: tuple[str, str, str], verdict: str) -> None:
    task, method, protocol = key
    with db.session() as s:
        claim = db_store.claim_episode(s, episode_id)
    for i, turn in enumerate(_turns(task, method, protocol)):
        with db.session() as s:
            db_store.record_turn(s, claim, i, **turn)
    wall, peak_held, peak_allocated = COSTS.get(key, (1.0, 100, 200))
    retention = {("t1", "nexus", "true_eviction"): RETENTION, ("t1", "nexus", "full_context"): FULL_RETENTION}
    fields = {"wall_s": wall, "retention": retention.get(key)}
    if peak_held is not None:
        fields.update(kv_peak_held_bytes=peak_held, kv_peak_allocated_bytes=peak_allocated)
    with db.session() as s:
        db_store.finish_episode(s, claim, "submitted", exit_status="submitted", patch="", agent_s=1.0, **fields)
        if peak_held is None:  # as a backend without a cache leaves it
            s.get(Episode, episode_id).kv_peak_held_bytes = s.get(Episode, episode_id).kv_peak_allocated_bytes = None
    with db.session() as s:
        db_store.record_grade(s, episode_id, verdict, test_log="log", grader="unit", grader_version="v1")


def _job(db, name: str | None, keys: list[EpisodeKey]) -> tuple[str, list[str]]:
    with db.session() as s:
        job = job_rows.create_job(s, config={}, config_hash=name or "none", name=name, package_versions={},
                                  git_revision="")  # fmt: skip
        rows = job_rows.add_episodes(s, job.id, keys)
        return job.id, [r.id for r in rows]


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> Filled:
    path = tmp_path_factory.mktemp("dashboard-lists") / "results.db"
    db = connect(sqlite_url(path))
    keys = [EpisodeKey(t, m, "prefill_only", "true_eviction", 0) for t in ("t1", "t2") for m in ("dense", "nexus")]
    keys.append(EpisodeKey("t1", "nexus", "prefill_only", "full_context", 0))
    sweep, ids = _job(db, "alpha sweep", keys)
    episodes = {(k.task_id, k.method, k.protocol): i for k, i in zip(keys, ids, strict=True)}
    for key, episode_id in episodes.items():
        _run(db, episode_id, key, "resolved" if key[0] == "t1" else "unresolved")
    clean, (clean_episode,) = _job(db, "beta", [EpisodeKey("t1", "dense", "prefill_only", "true_eviction", 0)])
    _run(db, clean_episode, ("t1", "dense", "true_eviction"), "resolved")
    waiting, _ = _job(db, None, [EpisodeKey("t9", "nexus", "prefill_only", "true_eviction", 0)])
    db.dispose()
    names = {sweep: "alpha sweep", clean: "beta", waiting: None}
    return Filled(sqlite_url(path), sweep, clean, waiting, episodes, names)


def client(url: str, celery: FakeCelery | None = None) -> TestClient:
    fake = celery or FakeCelery()
    return TestClient(create_app(url, token=TOKEN, public=False, allowed_hosts=["testserver"], celery_app=lambda: fake))


def _rows(page: str, table: str, attr: str) -> list[str]:
    body = page[page.index(f'<table id="{table}"') :]
    body = body[: body.index("</table>")]
    return re.findall(rf'<tr {attr}="([^"]+)"', body)


def _attrs(page: str, tag: str, **match: str) -> list[dict[str, str]]:
    """The data-* attributes of every ``tag`` element whose data-* attributes include ``match``."""
    out = []
    for attrs in re.findall(rf"<{tag}\b([^>]*)>", page):
        data = {k: unescape(v) for k, v in re.findall(r'data-([a-z-]+)="([^"]*)"', attrs)}
        if all(data.get(k.replace("_", "-")) == v for k, v in match.items()):
            out.append(data)
    return out


def _query(href: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlparse(unescape(href)).query).items()}


# -- the jobs list -----------------------------------------------------------------------------------------


def test_jobs_sort_by_name_and_progress(filled):
    c = client(filled.url)
    default = _rows(c.get("/jobs").text, "jobs", "data-job")
    assert default == [filled.waiting, filled.clean, filled.sweep]  # newest first, as before
    by_name = _rows(c.get("/jobs?sort=name&order=asc").text, "jobs", "data-job")
    assert by_name == [filled.sweep, filled.clean, filled.waiting]  # alpha, beta, then the unnamed one
    by_name_desc = _rows(c.get("/jobs?sort=name&order=desc").text, "jobs", "data-job")
    assert by_name_desc == [filled.clean, filled.sweep, filled.waiting]  # a missing name stays last
    by_progress = _rows(c.get("/jobs?sort=progress&order=asc").text, "jobs", "data-job")
    assert by_progress[0] == filled.waiting  # 0/1 finished before the done jobs
    assert _rows(c.get("/jobs?sort=created&order=asc").text, "jobs", "data-job") == default[::-1]


def test_jobs_filter_by_status_and_text_and_say_how_many(filled):
    c = client(filled.url)
    page = c.get("/jobs?status=done").text
    assert sorted(_rows(page, "jobs", "data-job")) == sorted([filled.sweep, filled.clean])
    count = _attrs(page, "p", shown="2")
    assert count and count[0]["total"] == "3" and "showing 2 of 3 jobs" in page
    assert _rows(c.get("/jobs?q=ALPHA").text, "jobs", "data-job") == [filled.sweep]  # case-insensitive name
    assert _rows(c.get(f"/jobs?q={filled.clean[:5]}").text, "jobs", "data-job") == [filled.clean]  # id
    assert _rows(c.get("/jobs?q=%25").text, "jobs", "data-job") == []  # a LIKE wildcard is a plain character
    limited = c.get("/jobs?limit=1").text
    assert len(_rows(limited, "jobs", "data-job")) == 1 and "showing 1 of 3 jobs" in limited


def test_jobs_sort_links_keep_the_other_parameters(filled):
    page = client(filled.url).get("/jobs?status=done&q=a&limit=50&sort=name").text
    hrefs = dict(re.findall(r'<th data-sort="(\w+)"[^>]*><a class="sort" href="([^"]+)"', page))
    assert set(hrefs) == {"name", "status", "created", "progress"}
    assert _query(hrefs["progress"]) == {"status": "done", "q": "a", "limit": "50", "sort": "progress", "order": "asc"}
    assert _query(hrefs["name"])["order"] == "desc"  # the current key flips its order
    assert re.search(r'<th data-sort="name" aria-sort="ascending">', page)
    form = page[page.index('<form id="jobs-filter"') :]
    form = form[: form.index("</form>")]
    hidden = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', form))
    assert hidden == {"limit": "50", "sort": "name", "order": "asc"}  # the filter form keeps sort and limit


@pytest.mark.parametrize(
    ("path", "words"),
    [("/jobs?sort=bogus", ["bogus", "created, status, name, progress"]), ("/jobs?order=sideways", ["sideways"]),
     ("/jobs?status=exploded", ["exploded", "pending"]), ("/jobs/{job}?sort=nope", ["nope", "kv_peak_allocated_bytes"]),
     ("/jobs/{job}?status=weird", ["weird"]), ("/jobs/{job}?sort=task&order=up", ["up", "asc, desc"])],
)  # fmt: skip
def test_bad_sort_or_filter_is_a_400_page(filled, path, words):
    done = client(filled.url).get(path.format(job=filled.sweep))
    assert done.status_code == 400 and "<h1>Bad request</h1>" in done.text and "Traceback" not in done.text
    for word in words:
        assert word in unescape(done.text), word


# -- a job's episodes --------------------------------------------------------------------------------------


def test_episode_rows_carry_their_cost(filled):
    page = client(filled.url).get(f"/jobs/{filled.sweep}").text
    rows = {r["episode"]: r for r in _attrs(page, "tr") if "episode" in r and "turns" in r}
    assert set(rows) == set(filled.episodes.values())
    nexus = rows[filled.episodes[("t1", "nexus", "true_eviction")]]
    # the stored columns exactly: finish_episode summed the turns' prompts (10+20+30) and generated (5+5+3)
    assert (nexus["turns"], nexus["prompt-tokens"], nexus["generated-tokens"]) == ("3", "60", "13")
    assert (nexus["wall-s"], nexus["kv-peak-held-bytes"], nexus["kv-peak-allocated-bytes"]) == (
        repr(4.25),
        "1258291",
        str(2 * 2**20),
    )
    row = page[page.index(f'<tr data-episode="{filled.episodes[("t1", "nexus", "true_eviction")]}"') :]
    row = row[: row.index("</tr>")]
    assert re.findall(r'<td class="num">([^<]*)</td>', row) == ["3", "60", "13", "4.2", "1.2 MiB", "2.0 MiB"]
    assert "KV held peak" in page and "KV alloc peak" in page
    missing = filled.episodes[("t2", "nexus", "true_eviction")]
    assert rows[missing]["wall-s"] == "" and rows[missing]["kv-peak-held-bytes"] == ""
    assert rows[missing]["kv-peak-allocated-bytes"] == ""
    row = page[page.index(f'<tr data-episode="{missing}"') :]
    assert re.findall(r'<td class="num">([^<]*)</td>', row[: row.index("</tr>")])[-3:] == ["-", "-", "-"]


def test_human_bytes():
    assert [list_queries.human_bytes(n) for n in (None, 0, 1023, 1024, 1258291, 3 * 2**30)] == [
        "-", "0 B", "1023 B", "1.0 KiB", "1.2 MiB", "3.0 GiB",
    ]  # fmt: skip


def test_episodes_sort_and_filter(filled):
    c = client(filled.url)
    ep = filled.episodes
    by_wall = _rows(c.get(f"/jobs/{filled.sweep}?sort=wall_s&order=desc").text, "episodes", "data-episode")
    # 30.0, 12.5, 7.0, 4.25, then the one that reported none
    order = [("t1", "nexus", "full_context"), ("t1", "dense", "true_eviction"), ("t2", "dense", "true_eviction"),
             ("t1", "nexus", "true_eviction"), ("t2", "nexus", "true_eviction")]  # fmt: skip
    assert by_wall == [ep[k] for k in order]
    by_peak = _rows(c.get(f"/jobs/{filled.sweep}?sort=kv_peak_held_bytes").text, "episodes", "data-episode")
    assert by_peak[:2] == [ep[("t2", "dense", "true_eviction")], ep[("t1", "nexus", "full_context")]]
    by_alloc = _rows(c.get(f"/jobs/{filled.sweep}?sort=kv_peak_allocated_bytes").text, "episodes", "data-episode")
    order = [("t2", "dense", "true_eviction"), ("t1", "nexus", "full_context"), ("t1", "nexus", "true_eviction"),
             ("t1", "dense", "true_eviction"), ("t2", "nexus", "true_eviction")]  # fmt: skip
    assert by_alloc == [ep[k] for k in order]  # the one that reported none last
    page = c.get(f"/jobs/{filled.sweep}?method=nexus&status=unresolved").text
    assert _rows(page, "episodes", "data-episode") == [ep[("t2", "nexus", "true_eviction")]]
    assert "showing 1 of 5 episodes" in page
    page = c.get(f"/jobs/{filled.sweep}?protocol=full_context&task=T1").text
    assert _rows(page, "episodes", "data-episode") == [ep[("t1", "nexus", "full_context")]]
    hrefs = dict(re.findall(r'<th data-sort="(\w+)"[^>]*><a class="sort" href="([^"]+)"', page))
    assert len(hrefs) == 14 and _query(hrefs["turns"]) == {
        "protocol": "full_context", "task": "T1", "sort": "turns", "order": "asc",
    }  # fmt: skip
    assert re.search(r'<select name="method">.*<option value="nexus">nexus</option>', page, re.S)


# -- the actions -------------------------------------------------------------------------------------------


def _form(page: str, form: str) -> str:
    body = page[page.index(f'<form id="{form}"') :]
    return body[: body.index("</form>")]


def test_actions_only_where_they_apply(filled):
    c = client(filled.url)
    sweep = c.get(f"/jobs/{filled.sweep}").text  # done, two unresolved results: verdicts are never rerun
    assert "disabled" in _form(sweep, "cancel-form") and "nothing to cancel" in _form(sweep, "cancel-form")
    assert "disabled" in _form(sweep, "rerun-form") and "a verdict is never rerun" in _form(sweep, "rerun-form")
    clean = c.get(f"/jobs/{filled.clean}").text  # done, every result resolved
    for form, why in (("cancel-form", "nothing to cancel"), ("rerun-form", "nothing to rerun")):
        assert 'data-applies="0"' in _form(clean, form) and "disabled" in _form(clean, form), form
        assert why in _form(clean, form), form
    waiting = c.get(f"/jobs/{filled.waiting}").text  # one queued episode
    assert 'data-applies="1"' in _form(waiting, "cancel-form") and "disabled" not in _form(waiting, "cancel-form")
    assert "disabled" in _form(waiting, "rerun-form")


def test_cancel_on_a_finished_job_changes_nothing(filled, tmp_path):
    shutil.copy(Path(filled.url.removeprefix("sqlite:///")), tmp_path / "copy.db")
    url = sqlite_url(tmp_path / "copy.db")
    celery = FakeCelery()
    c = client(url, celery)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    done = c.post(f"/jobs/{filled.clean}/cancel", headers=auth, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == f"/jobs/{filled.clean}?notice=nothing-to-cancel"
    assert "Nothing cancelled" in c.get(done.headers["location"]).text
    progress = c.get(f"/api/jobs/{filled.clean}/progress").json()
    assert progress["status"] == "done" and progress["counts"] == {"resolved": 1}
    db = connect(url)
    with db.session() as s:
        assert job_rows.get_job(s, filled.clean).error is None  # no "cancelled by user" note either
    db.dispose()
    live = c.post(f"/jobs/{filled.waiting}/cancel", headers=auth, follow_redirects=False)  # still cancels
    assert live.headers["location"] == f"/jobs/{filled.waiting}?notice=cancelled&n=0"
    assert c.get(f"/api/jobs/{filled.waiting}/progress").json()["status"] == "cancelled"


# -- the retention map's turns -----------------------------------------------------------------------------


def test_turn_starts_follow_the_stream():
    @dataclass
    class T:
        index: int
        prompt_tokens: int
        tokens_appended: int
        logical_length: int
        keep: int | None = None

    true_eviction = [T(0, 10, 10, 14), T(1, 20, 6, 24), T(2, 30, 6, 32)]
    assert streams.turn_starts(true_eviction) == [0, 14, 24]  # prompt - appended = the previous logical length
    # full_context feeds the whole re-rendered prompt each turn: the stored keep, else the previous stream's end
    full = [T(0, 10, 10, 14, 0), T(1, 19, 19, 23, 12), T(2, 27, 27, 29, 20)]
    assert streams.turn_starts(full) == [0, 12, 20]
    assert streams.turn_starts([T(0, 10, 10, 14), T(1, 19, 19, 23), T(2, 27, 27, 29)]) == [0, 14, 23]


def test_retention_map_marks_each_turn_and_counts_what_it_kept(filled):
    page = client(filled.url).get(f"/episodes/{filled.episodes[('t1', 'nexus', 'true_eviction')]}").text
    retention = page[page.index('<div id="retention">') :]
    svg = retention[: retention.index("</svg>")]
    marks = re.findall(r'<g class="turn-mark" data-turn="(\d+)">', svg)
    labels = re.findall(r'<g class="turn-label" data-turn="(\d+)">', svg)
    assert marks == ["0", "1", "2"] and labels == ["0", "1", "2"]
    assert [re.search(r">t(\d)<", svg[svg.index(f'class="turn-label" data-turn="{i}"') :]).group(1) for i in "012"] == [
        "0", "1", "2",
    ]  # fmt: skip
    kept = {r["turn"]: r for r in _attrs(retention, "tr") if "kept" in r}
    assert {t: (r["start"], r["end"], r["tokens"]) for t, r in kept.items()} == {
        "0": ("0", "14", "14"), "1": ("14", "24", "10"), "2": ("24", "32", "8"),
    }  # fmt: skip
    # mean over 2 layers x 2 heads: t0 all 14; t1 only layer 1 (20/4); t2 one head of layer 0 + layer 1 (24/4)
    assert {t: float(r["kept"]) for t, r in kept.items()} == {"0": 14.0, "1": 5.0, "2": 6.0}


def test_full_context_marks_sit_where_the_stored_stream_says(filled):
    page = client(filled.url).get(f"/episodes/{filled.episodes[('t1', 'nexus', 'full_context')]}").text
    kept = {r["turn"]: (r["start"], r["end"]) for r in _attrs(page, "tr") if "kept" in r}
    assert kept == {"0": ("0", "12"), "1": ("12", "20"), "2": ("20", "29")}
    positions = [float(x) for x in re.findall(r'class="turn-mark" data-turn="\d+">\s*<path d="M ([\d.]+) ', page)]
    assert len(positions) == 3 and positions[0] < positions[1] < positions[2]
    assert (positions[1] - positions[0]) / (positions[2] - positions[0]) == pytest.approx(12 / 20, abs=0.01)


# -- side by side ------------------------------------------------------------------------------------------


def test_side_by_side_names_the_first_differing_token(filled):
    a, b = filled.episodes[("t1", "nexus", "true_eviction")], filled.episodes[("t1", "dense", "true_eviction")]
    page = client(filled.url).get(f"/episodes/{a}/vs/{b}").text
    (found,) = [a for a in _attrs(page, "p") if "basis" in a]
    assert (found["basis"], found["turn"], found["index"]) == ("tokens", "1", "3")
    assert "turn 1</a>, token 3" in page
    snippets = dict(re.findall(r'<pre class="snippet" data-side="(\w)">([^<]*)</pre>', page))
    assert snippets == {"a": "7 8 9 ▸99 11", "b": "7 8 9 ▸10 11"}
    texts = dict(re.findall(r'<pre class="snippet-text" data-side="(\w)">([^<]*)</pre>', page))
    assert texts == {"a": "abc d▸Xf", "b": "abc d▸ef"}
    assert 'class="vs-turn stream-diverged" data-index="1"' in page  # the calls are the same: only the stream
    assert '<div id="divergence" data-turn="">' in page


def test_side_by_side_falls_back_to_text_and_says_so(filled):
    a, b = filled.episodes[("t2", "nexus", "true_eviction")], filled.episodes[("t2", "dense", "true_eviction")]
    page = client(filled.url).get(f"/episodes/{a}/vs/{b}").text
    (found,) = [a for a in _attrs(page, "p") if "basis" in a]
    assert (found["basis"], found["turn"], found["index"]) == ("text", "0", "6")
    assert "character by character" in page
    snippets = dict(re.findall(r'<pre class="snippet" data-side="(\w)">([^<]*)</pre>', page))
    assert snippets == {"a": "hello ▸there", "b": "hello ▸world"}


def test_stream_divergence_cases():
    def s(*turns):
        return [streams.TurnStream(i, ids, text) for i, (ids, text) in enumerate(turns)]

    same = s(([1, 2], "a"), ([3], "b"))
    assert streams.stream_divergence(same, same).turn is None
    longer = streams.stream_divergence(s(([1, 2], "a")), s(([1, 2, 3], "ab")))  # a prefix: differs where it stops
    assert (longer.turn, longer.index, longer.a, longer.a_text) == (0, 2, "1 2 ▸(end)", "a▸(end)")
    ended = streams.stream_divergence(same, same[:1])
    assert (ended.turn, ended.index, ended.ended, ended.b) == (1, 0, "b", "(ended after 1 turns)")
    retokenised = streams.stream_divergence(s(([1, 2], "ab")), s(([3], "ab")))
    assert retokenised.basis == "tokens" and retokenised.same_text
    mixed = streams.stream_divergence(s(([1], "ab")), s((None, "ax")))  # one turn without ids: text for all
    assert (mixed.basis, mixed.turn, mixed.index) == ("text", 0, 1)


def test_side_by_side_shows_both_caches_per_turn(filled):
    ep = filled.episodes
    a, b = ep[("t1", "nexus", "true_eviction")], ep[("t1", "dense", "true_eviction")]
    page = client(filled.url).get(f"/episodes/{a}/vs/{b}").text
    table = page[page.index('<table id="vs-cache"') :]
    table = table[: table.index("</table>")]
    assert [r["index"] for r in _attrs(table, "tr") if "index" in r] == ["0", "1", "2"]
    got = {(c["metric"], c["side"]): [] for c in _attrs(table, "td")}
    for c in _attrs(table, "td"):
        got[(c["metric"], c["side"])].append(c["value"])
    turns = _turns("t1", "nexus", "true_eviction"), _turns("t1", "dense", "true_eviction")
    for side, stored in zip("ab", turns, strict=True):
        assert got[("logical", side)] == [str(t["logical_length"]) for t in stored]
        assert got[("kept", side)] == [repr(t["physical_after"]["mean"]) for t in stored]
        assert got[("events", side)] == [str(t["eviction_events"]) for t in stored]
        for name in ("kv_held_bytes", "kv_allocated_bytes", "kv_peak_held_bytes", "kv_peak_allocated_bytes"):
            assert got[(name, side)] == [str(t[name]) for t in stored]
        assert got[("prefill", side)] == [repr(t["prefill_s"]) for t in stored]
        assert got[("decode", side)] == [repr(t["decode_s"]) for t in stored]


@pytest.mark.services
def test_postgresql_lists_and_streams(pg_db):
    keys = [EpisodeKey("t1", m, "prefill_only", "true_eviction", 0) for m in ("nexus", "dense")]
    job, (nexus, dense) = _job(pg_db, "pg Sweep_1", keys)
    _run(pg_db, nexus, ("t1", "nexus", "true_eviction"), "resolved")
    _run(pg_db, dense, ("t1", "dense", "true_eviction"), "unresolved")
    app = create_app(pg_db.url, token=None, public=False, allowed_hosts=["testserver"])
    c = TestClient(app)
    assert _rows(c.get("/jobs?q=sweep_").text, "jobs", "data-job") == [job]  # ILIKE, "_" a plain character
    assert _rows(c.get("/jobs?q=sweep%25").text, "jobs", "data-job") == []
    page = c.get(f"/jobs/{job}?sort=wall_s&order=desc").text
    assert _rows(page, "episodes", "data-episode") == [dense, nexus]
    page = c.get(f"/episodes/{nexus}").text
    assert re.findall(r'<g class="turn-mark" data-turn="(\d+)">', page) == ["0", "1", "2"]
    page = c.get(f"/episodes/{nexus}/vs/{dense}").text
    (found,) = [a for a in _attrs(page, "p") if "basis" in a]
    assert (found["basis"], found["turn"], found["index"]) == ("tokens", "1", "3")
    app.state.ctx.dispose()
