"""Turn segments read from ChatML ids, and the paper's observation masking on ids, with the real Qwen3 tokenizer."""

from __future__ import annotations

import pytest

from agent_runner.chat_segments import ChatMarkers, chat_segments, mask_observations
from agent_runner.tokenizers import render_chat
from nexus.segments import Segment
from tests.tiny_models import tiny_host

CONVERSATION = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Fix the bug in parse()."},
    {"role": "assistant", "content": "Let me look.\n<function=view>x.py</function>"},
    {"role": "user", "content": "line 1\nline 2\nline 3"},
    {"role": "assistant", "content": "Now run the tests."},
    {"role": "user", "content": "FAILED test_parse\n1 failed"},
]


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_host().tokenizer


def test_segments_follow_the_messages(tokenizer):
    ids = render_chat(tokenizer, CONVERSATION)
    segments = chat_segments(ids, ChatMarkers.of(tokenizer))
    kinds = [s.kind for s in segments]
    assert kinds == ["prompt", "task", "assistant", "observation", "assistant", "observation", "assistant"]
    assert segments[0].start == 0 and segments[-1].end is None  # the open header: what is decoded joins it
    for a, b in zip(segments, segments[1:], strict=False):
        assert a.end == b.start
    text = tokenizer.decode(ids[segments[3].start : segments[3].end])
    assert "line 1\nline 2\nline 3" in text and "Now run" not in text


def test_masking_replaces_old_observations_as_the_template_would(tokenizer):
    markers = ChatMarkers.of(tokenizer)
    ids = render_chat(tokenizer, CONVERSATION)
    masked = mask_observations(
        ids, tokenizer, markers, keep_latest=1, placeholder="Old environment output: ({lines} lines omitted)"
    )
    expected = [dict(m) for m in CONVERSATION]
    expected[3]["content"] = "Old environment output: (3 lines omitted)"
    assert masked.ids == render_chat(tokenizer, expected)  # the ids the template gives the masked conversation
    assert masked.masked == {1}
    kinds = [s.kind for s in chat_segments(masked.ids, markers, masked.masked)]
    assert kinds[3] == "masked" and kinds[5] == "observation"
    obs = chat_segments(ids, markers)[3]
    assert masked.moved(obs.start + 2, obs.end - 1) is None  # inside the masked observation: gone
    later = chat_segments(ids, markers)[5]
    shift = len(masked.ids) - len(ids)
    assert masked.moved(later.start, later.end) == (later.start + shift, later.end + shift)
    assert masked.moved(0, 5) == (0, 5)
    twice = mask_observations(
        masked.ids, tokenizer, markers, keep_latest=1, placeholder="Old environment output: ({lines} lines omitted)"
    )
    assert twice.ids == masked.ids and twice.masked == {1}  # masking a masked stream again changes nothing
    same = mask_observations(ids, tokenizer, markers, keep_latest=2, placeholder="x")
    assert same.ids == ids and not same.masked  # nothing older than the newest two


def test_a_stream_without_chatml_is_one_unknown_segment(tokenizer):
    assert chat_segments([5, 6, 7], ChatMarkers.of(tokenizer)) == (Segment(0, None, "other"),)
    assert chat_segments([], ChatMarkers.of(tokenizer)) == ()
