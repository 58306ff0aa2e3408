"""A replay's action spans on the episode page (``dashboard.copy_marks``, the episode page's replay section).

Unit tests of the marking (escaping, out-of-range, overlapping and malformed spans, the copy rows, the summary
line); the episode page over a SQLite file whose replay rows are written by ``db.replays.record_replay`` with
hand-made score dicts, without a browser (TestClient) and in Debian's chromium (slow).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html import unescape
from html.parser import HTMLParser

import pytest
from fastapi.testclient import TestClient

from dashboard.app import create_app
from dashboard.copy_marks import action_line, copy_rows, mark_text, placed_spans, span_title, turn_spans
from db import connect, job_rows, sqlite_url
from db import store as db_store
from db.models import Episode
from db.replays import record_replay
from jobs.spec import EpisodeKey
from tests.dashboard.test_app_unit import FakeCelery

# -- the marking ----------------------------------------------------------------------------------------------


def _span(kind: str, start: int, end: int, **kw) -> dict:
    base = {"kind": kind, "function": "file_editor", "param": None, "start": start, "end": end, "tokens": 3,
            "nll": 0.25, "top1": 0.5, "first_top1": True, "exact": False}  # fmt: skip
    return base | kw


class _Marks(HTMLParser):
    """The marks of a marked text: (attributes, inner text) per <span>, and the whole text without tags."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.marks: list[tuple[dict[str, str], str]] = []
        self.text = ""
        self._open: dict[str, str] | None = None
        self._inner = ""

    def handle_starttag(self, tag, attrs):
        assert tag == "span" and self._open is None, f"unexpected <{tag}> (nested: {self._open is not None})"
        self._open, self._inner = {k: v or "" for k, v in attrs}, ""

    def handle_endtag(self, tag):
        assert tag == "span" and self._open is not None
        self.marks.append((self._open, self._inner))
        self._open = None

    def handle_data(self, data):
        self.text += data
        if self._open is not None:
            self._inner += data


def _parse(html: str) -> _Marks:
    parser = _Marks()
    parser.feed(str(html))
    parser.close()
    return parser


def test_marks_wrap_exactly_the_spans_and_keep_every_character():
    text = "<function=execute_bash>\n<parameter=command>ls -la</parameter>\n</function>"
    fn = text.index("execute_bash")
    cmd = text.index("ls -la")
    spans = [
        _span("new", cmd, cmd + 6, param="command", exact=True),
        _span("function", fn, fn + len("execute_bash"), function="execute_bash"),
    ]
    marked = mark_text(text, spans, id_prefix="span-0-")
    parsed = _parse(marked.html)
    assert parsed.text == text  # every character, in order, unescaped back exactly
    assert [(a["data-kind"], inner) for a, inner in parsed.marks] == [("function", "execute_bash"), ("new", "ls -la")]
    assert [a["id"] for a, _ in parsed.marks] == ["span-0-1", "span-0-0"]  # the index in the stored list
    assert parsed.marks[0][0]["class"] == "mark mark-function" and parsed.marks[1][0]["class"] == "mark mark-new"
    assert marked.shown == {0, 1} and marked.dropped == 0


def test_copies_are_styled_by_greedy_exactness_and_carry_their_source_numbers():
    text = "old line one\nold line two"
    spans = [
        _span("copy", 0, 12, param="old_str", exact=True, back=1234, source=2, held_mean=0.5712, source_tokens=9),
        _span("copy", 13, 25, param="old_str", exact=False, top1=0.8, nll=1.5, back=40, held_mean=None),
    ]
    (a, _), (b, _) = _parse(mark_text(text, spans).html).marks
    assert a["class"] == "mark mark-copy mark-exact" and b["class"] == "mark mark-copy mark-inexact"
    assert "id" not in a  # no prefix, no id
    assert a["data-back"] == "1234" and a["data-held-mean"] == "0.5712" and a["data-source"] == "2"
    assert a["data-exact"] == "1" and b["data-exact"] == "0" and b["data-held-mean"] == ""
    assert "source 1234 tokens back" in a["title"] and "source held 57.1%" in a["title"]
    assert "copy · old_str" in a["title"] and "greedy-exact" in a["title"] and "top-1 50.0%" in a["title"]
    assert "not greedy-exact" in b["title"] and "NLL 1.500" in b["title"] and "source held -" in b["title"]


def test_every_text_is_escaped_the_text_the_param_and_the_title():
    text = "<script>alert(\"x\")</script> & 'q'"
    spans = [_span("copy", 0, 8, param='a"><img src=x onerror=alert(1)>'), _span("new", 8, 19)]
    html = str(mark_text(text, spans).html)
    assert "<script>" not in html and "<img" not in html and "&lt;script&gt;" in html
    assert html.count("<span ") == 2 and html.count("</span>") == 2  # only our own tags
    parsed = _parse(html)
    assert parsed.text == text
    assert parsed.marks[0][0]["data-param"] == 'a"><img src=x onerror=alert(1)>'
    assert parsed.marks[0][1] == "<script>" and unescape(html).startswith('<span class="mark')


def test_out_of_range_and_malformed_spans_are_cut_or_dropped():
    text = "abcdefghij"  # 10 characters
    spans = [
        _span("new", -5, 2),  # cut to [0, 2)
        _span("copy", 8, 50),  # cut to [8, 10)
        _span("new", 10, 12),  # wholly past the end: dropped
        _span("new", 5, 5),  # empty: dropped
        _span("new", 6, 4),  # reversed: dropped
        _span("new", True, 4),  # a bool is not an offset
        _span("new", "3", 4),  # nor a string
        {"kind": "new", "start": 3},  # no end
        "not a span",
        None,
    ]
    marked = mark_text(text, spans)
    parsed = _parse(marked.html)
    assert parsed.text == text
    assert [(a["data-span"], inner) for a, inner in parsed.marks] == [("0", "ab"), ("1", "ij")]
    assert marked.shown == {0, 1} and marked.dropped == len(spans) - 2
    assert mark_text("", spans).html == "" and mark_text("", spans).dropped == len(spans)
    assert mark_text(text, []).html == text and mark_text(text, []).dropped == 0


def test_overlapping_spans_never_nest_the_earlier_start_keeps_the_shared_characters():
    text = "0123456789"
    spans = [_span("new", 4, 8), _span("copy", 2, 6), _span("param", 3, 5), _span("new", 7, 10)]
    assert [(n, s, e) for n, s, e, _ in placed_spans(len(text), spans)] == [(1, 2, 6), (0, 6, 8), (3, 8, 10)]
    marked = mark_text(text, spans)
    parsed = _parse(marked.html)
    assert parsed.text == text and [inner for _, inner in parsed.marks] == ["2345", "67", "89"]
    assert marked.shown == {0, 1, 3} and marked.dropped == 1  # the param span lies inside the copy


def test_a_one_token_span_says_it_has_no_tail_scores():
    title = span_title(_span("param", 0, 3, param="path", tokens=1, top1=None, nll=None, exact=True))
    assert title.startswith("param · path · 1 token ·") and "no top-1 / NLL after the first" in title


def test_turn_spans_reads_only_turns_with_a_list_of_spans():
    turns = [
        {"index": 0, "tokens": 5, "spans": [_span("new", 0, 1)]},
        {"index": 1, "tokens": 5},  # a token-stream replay's turn: no spans
        {"index": 2, "spans": None},
        {"index": True, "spans": []},
        "junk",
        {"index": 3, "spans": []},
    ]
    assert turn_spans(turns) == {0: [_span("new", 0, 1)], 3: []}
    assert turn_spans(None) == {} and turn_spans({"index": 0}) == {}


def test_copy_rows_in_turn_and_text_order_with_their_anchors():
    spans = {
        2: [_span("copy", 30, 40, param="old_str", source=2, back=7), _span("copy", 5, 9, param="path", source=0)],
        0: [_span("new", 0, 3), _span("copy", 4, 8, param="old_str", source=1, held=[1.0, 0.5], held_mean=0.75)],
        1: [],
    }
    rows = copy_rows(spans, {(2, 1): "span-2-1", (0, 1): "span-0-1"})
    assert [(r.turn, r.number, r.anchor) for r in rows] == [(0, 1, "span-0-1"), (2, 1, "span-2-1"), (2, 0, "")]
    assert [r.source_label for r in rows] == ["t0 observation", "task", "t1 observation"]
    assert rows[0].held == (1.0, 0.5) and rows[0].held_title == "per layer: 100% 50%" and rows[0].held_mean == 0.75
    assert rows[1].held_title == "no per-layer shares stored" and rows[2].back == 7


ACTION = {
    "spans": {"function": 3, "param": 9, "copy": 4, "new": 2},
    "tokens": {"function": 3, "param": 12, "copy": 40, "new": 10},
    "nll": {"function": 0.1, "param": 0.2, "copy": 0.4321, "new": 2.0},
    "top1": {"function": 1.0, "param": 0.9, "copy": 0.875, "new": 0.5},
    "exact": {"function": 1.0, "param": 1.0, "copy": 0.75, "new": 0.0},
    "copy_held": 0.625,
}


def test_action_line_summarizes_the_copies_and_counts_the_spans():
    line = action_line(ACTION)
    assert line == (
        "copies: top-1 87.5% · NLL 0.432 · greedy-exact 3/4 (75%) · source held 62.5% · "
        "spans: 3 function, 9 param, 4 copy, 2 new"
    )
    assert action_line(None) == "" and action_line("junk") == ""
    partial = action_line({"spans": {"copy": 0}, "nll": {"copy": None}, "top1": {}, "exact": {"copy": None}})
    assert partial == "copies: top-1 - · NLL - · greedy-exact - · spans: 0 function, 0 param, 0 copy, 0 new"


# -- the episode page -----------------------------------------------------------------------------------------

THINK = '<think>Fix it: a <b>"bold"</b> & brave edit.</think>\n'
CALL = (
    "<function=file_editor>\n<parameter=command>str_replace</parameter>\n<parameter=path>/testbed/x.py</parameter>\n"
    "<parameter=old_str>if a < b and c > d:\n    return 1</parameter>\n<parameter=new_str>return 2</parameter>\n"
    "</function>"
)
COMPLETION = THINK + CALL
OLD_STR = "if a < b and c > d:\n    return 1"


def _at(text: str, part: str) -> tuple[int, int]:
    start = text.index(part)
    return start, start + len(part)


def _spans() -> list[dict]:
    """Turn 1's spans: the function, two params, a path copied from the task, the old_str copied from turn 0's
    observation (not greedy-exact), the new_str."""
    c = COMPLETION
    return [
        _span("function", *_at(c, "file_editor"), tokens=2),
        _span("param", *_at(c, "str_replace"), param="command", exact=True),
        _span(
            "copy",
            *_at(c, "/testbed/x.py"),
            param="path",
            exact=True,
            top1=1.0,
            nll=0.01,
            source=0,
            back=900,
            source_tokens=5,
            held=[1.0, 1.0],
            held_mean=1.0,
        ),  # fmt: skip
        _span(
            "copy",
            *_at(c, OLD_STR),
            param="old_str",
            exact=False,
            top1=0.6,
            nll=1.25,
            source=1,
            back=321,
            source_tokens=14,
            held=[0.5, 0.25],
            held_mean=0.375,
        ),  # fmt: skip
        _span("new", *_at(c, "return 2"), param="new_str", tokens=2),
        _span("new", len(c) - 2, len(c) + 40, param="junk"),  # runs past the text: cut to its last 2 characters
    ]


def _score(spans_turn1: list[dict] | None, *, action: dict | None = ACTION, top1: float = 0.8) -> dict:
    turns = [{"index": 0, "tokens": 10, "spans": []}, {"index": 1, "tokens": 30, "spans": spans_turn1}]
    if spans_turn1 is None:  # an older row: no spans anywhere
        turns = [{"index": 0, "tokens": 10}, {"index": 1, "tokens": 30}]
    return {"tokens": 40, "nll_mean": 0.5, "top1": top1, "turns": turns, "seconds": 1.0, "action": action}


@dataclass
class Stored:
    url: str
    expert: str  # with replays: dense ok, snapkv ok (spans), streamingllm failed
    old: str  # a replay row from before spans were kept
    plain: str  # no replay at all
    replays: dict[str, int]  # method -> replay id, of ``expert``


def _turn(i: int, completion: str) -> dict:
    return {"tokens_appended": 10, "tokens_generated": 5, "prompt_tokens": 10, "logical_length": 10,
            "completion": completion, "thought": "t", "action": {"name": "file_editor", "arguments": {}},
            "observation": f"obs {i} <i>x</i>", "extra": {"user_message": f"obs {i}"}}  # fmt: skip


def _store(path) -> Stored:
    db = connect(sqlite_url(path))
    keys = [EpisodeKey(t, "expert", "prefill_only", "true_eviction", 0) for t in ("t1", "t2", "t3")]
    with db.session() as s:
        job = job_rows.create_job(s, config={}, config_hash="h", name="spans", package_versions={}, git_revision="")
        ids = [r.id for r in job_rows.add_episodes(s, job.id, keys)]
    for episode_id in ids:
        with db.session() as s:
            claim = db_store.claim_episode(s, episode_id)
        for i, completion in enumerate(["<think>look</think>\n<function=search>x</function>", COMPLETION]):
            with db.session() as s:
                db_store.record_turn(s, claim, i, **_turn(i, completion))
        with db.session() as s:
            db_store.finish_episode(s, claim, "submitted", exit_status="submitted", patch="", agent_s=1.0)
    replays = {}
    common = {"scope": "prefill_only", "protocol": "true_eviction", "model": "smollm2-135m"}
    with db.session() as s:
        expert, old = s.get(Episode, ids[0]), s.get(Episode, ids[1])
        replays["dense"] = record_replay(s, expert, method="dense", config={"method": "dense"}, status="ok",
                                         score=_score(_spans(), top1=0.95), **common).id  # fmt: skip
        replays["snapkv"] = record_replay(s, expert, method="snapkv", config={"method": "snapkv", "density": 0.25},
                                          status="ok", score=_score(_spans()), **common).id  # fmt: skip
        replays["streamingllm"] = record_replay(
            s, expert, method="streamingllm", config={"method": "streamingllm", "density": 0.25}, status="failed",
            error="out of <memory>", **common,
        ).id  # fmt: skip
        record_replay(s, old, method="snapkv", config={"density": 0.5}, status="ok", score=_score(None, action=None),
                      scope="prefill_only", protocol="true_eviction")  # fmt: skip
    db.dispose()
    return Stored(sqlite_url(path), ids[0], ids[1], ids[2], replays)


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Stored:
    return _store(tmp_path_factory.mktemp("copy-marks") / "results.db")


def _client(stored: Stored) -> TestClient:
    app = create_app(stored.url, token="t" * 16, public=False, allowed_hosts=["testserver"], celery_app=FakeCelery)
    return TestClient(app)


def _marks_of_turn(page: str, index: int) -> _Marks:
    body = re.search(rf'<pre class="completion marked" data-turn="{index}">(.*?)</pre>', page, re.S)
    assert body, f"turn {index} has no marked text"
    return _parse(body[1])


def test_the_default_replay_is_the_first_ok_evicting_one_and_its_spans_are_marked(stored):
    page = _client(stored).get(f"/episodes/{stored.expert}").text
    rows = re.findall(r'<tr data-replay="(\d+)" data-method="(\w+)"([^>]*)>', page)
    assert [(int(i), m, 'class="chosen"' in rest) for i, m, rest in rows] == [
        (stored.replays["dense"], "dense", False),  # dense first, then the methods' order
        (stored.replays["snapkv"], "snapkv", True),
        (stored.replays["streamingllm"], "streamingllm", False),
    ]
    snapkv = stored.replays["snapkv"]
    assert f'<p id="replay-summary" data-replay="{snapkv}">' in page
    assert "greedy-exact 3/4 (75%)" in page and "snapkv · prefill_only / true_eviction · density 0.25" in page
    links = re.findall(r'<a class="replay-link" href="([^"]+)">', page)
    assert links == [f"/episodes/{stored.expert}?replay={stored.replays[m]}" for m in ("dense", "streamingllm")]
    assert 'title="out of &lt;memory&gt;"' in page  # the failed one's error, escaped
    marks = _marks_of_turn(page, 1)
    assert marks.text == COMPLETION  # the whole assistant text, unescaped back exactly
    kinds = [(a["data-kind"], a["class"], inner) for a, inner in marks.marks]
    assert kinds == [
        ("function", "mark mark-function", "file_editor"),
        ("param", "mark mark-param", "str_replace"),
        ("copy", "mark mark-copy mark-exact", "/testbed/x.py"),
        ("copy", "mark mark-copy mark-inexact", OLD_STR),
        ("new", "mark mark-new", "return 2"),
        ("new", "mark mark-new", "n>"),
    ]
    assert "<b>" not in page.split('id="turns"')[1].split("</section>")[0]  # the thought's tags stay text
    assert not _marks_of_turn(page, 0).marks  # a turn without spans: its text, unmarked
    # the copies and their sources, each linked to its mark
    table = page[page.index('<table id="copy-sources"') :]
    table = table[: table.index("</table>")]
    rows = re.findall(r'<tr class="(\w+)" data-turn="1" data-span="(\d)" data-param="(\w+)" data-source="(\d)" '
                      r'data-back="(\d+)" data-source-tokens="(\d+)" data-held-mean="([\d.]+)"', table)  # fmt: skip
    assert rows == [
        ("exact", "2", "path", "0", "900", "5", "1.0"),
        ("inexact", "3", "old_str", "1", "321", "14", "0.375"),
    ]
    assert '<a href="#span-1-3">t1</a>' in table and 'id="span-1-3"' in page
    assert "37.5%" in table and 'title="per layer: 50% 25%"' in table and "t0 observation" in table


def test_another_replay_is_chosen_by_the_query_parameter(stored):
    c = _client(stored)
    dense = c.get(f"/episodes/{stored.expert}?replay={stored.replays['dense']}").text
    assert f'<p id="replay-summary" data-replay="{stored.replays["dense"]}">' in dense and "copy-sources" in dense
    failed = c.get(f"/episodes/{stored.expert}?replay={stored.replays['streamingllm']}").text
    assert "out of &lt;memory&gt;" in failed and 'class="completion marked"' not in failed
    assert 'id="copy-sources"' not in failed and "<h4>action" in failed  # shown as stored
    assert c.get(f"/episodes/{stored.expert}?replay=999999").status_code == 404
    assert c.get(f"/episodes/{stored.expert}?replay=x").status_code == 400


def test_episodes_without_replays_or_spans_show_the_turns_as_stored(stored):
    c = _client(stored)
    plain = c.get(f"/episodes/{stored.plain}").text
    assert "No replay of this episode is stored." in plain and 'class="completion marked"' not in plain
    assert 'id="copy-sources"' not in plain and plain.count("<h4>action") == 2
    old = c.get(f"/episodes/{stored.old}").text
    assert "no action scores" in old and 'class="completion marked"' not in old and 'id="copy-sources"' not in old


@pytest.mark.slow
def test_the_marks_and_the_sources_table_in_the_browser(page, stored, shot):
    from tests.dashboard.conftest import start_server

    server = start_server(stored.url, public=False)
    try:
        response = page.goto(f"{server.base}/episodes/{stored.expert}", wait_until="load")
        assert response is not None and response.status == 200
        turn = page.locator('section#turns details.turn[data-index="1"]')
        if turn.get_attribute("open") is None:
            turn.locator("summary").click()
        exact = turn.locator("span.mark-copy.mark-exact")
        inexact = turn.locator("span.mark-copy.mark-inexact")
        assert exact.count() == 1 and inexact.count() == 1 and turn.locator("span.mark-new").count() == 2
        assert inexact.inner_text() == OLD_STR
        assert "source 321 tokens back" in inexact.get_attribute("title")
        styles = [el.evaluate("e => getComputedStyle(e).backgroundColor") for el in (exact, inexact)]
        assert styles[0] != styles[1] and "rgba(0, 0, 0, 0)" not in styles, styles  # two distinct highlights
        rows = page.locator("table#copy-sources tbody tr")
        assert rows.count() == 2 and rows.nth(1).get_attribute("data-param") == "old_str"
        rows.nth(1).locator("a").click()
        assert page.url.endswith("#span-1-3") and inexact.is_visible()
        shot(page, "episode-copy-marks")
        # another replay, by its link
        page.locator('#replay-options tr[data-method="dense"] a.replay-link').click()
        page.wait_for_url(f"**?replay={stored.replays['dense']}")
        assert page.locator("#replay-options tr.chosen").get_attribute("data-method") == "dense"
    finally:
        server.stop()
