"""Turn segments on the cache, ``observation_masking`` and ``candidates: newest_turn``, through a real (tiny, random)
Qwen3: after every event the logits equal full attention with the evicted entries masked, held entries equal the
budget, and each rule keeps what it says."""

from __future__ import annotations

import pytest
import torch

import nexus
from nexus.config import keyed
from nexus.segments import Segment
from nexus.testing import StreamRecorder, masked_reference_logits

SMALL = dict(window=4, block_size=4)

# three agent turns: (prefill end, decode end, segments set before the prefill)
TURNS = [
    (60, 80, [Segment(0, 20, "prompt"), Segment(20, 56, "task"), Segment(56, None, "assistant")]),
    (130, 145, [Segment(82, 126, "observation"), Segment(126, None, "assistant")]),
    (200, 210, [Segment(147, 196, "observation"), Segment(196, None, "assistant")]),
]


def _segments_up_to(turn: int) -> list[Segment]:
    out: list[Segment] = []
    for _, _, segs in TURNS[: turn + 1]:
        if out and out[-1].end is None:  # the previous assistant turn closed where this turn's feed begins
            out[-1] = Segment(out[-1].start, segs[0].start, out[-1].kind)
        out += segs
    return out


def _episode(model, method, scope="prefill_only", **settings):
    """Feed the three turns through one cache (true eviction); returns the recorder and the retained positions of
    layer 0 after each turn's prefill."""
    cfg = nexus.EvictionConfig(method=method, scope=scope, **{**SMALL, **settings})
    cache = nexus.EvictableCache(model.config, cfg)
    rec = StreamRecorder(model, cache)
    ids = torch.randint(0, 1000, (1, 210), generator=torch.Generator().manual_seed(3))
    after_prefill = []
    start = 0
    for t, (prefill_end, decode_end, _) in enumerate(TURNS):
        cache.segments = _segments_up_to(t)
        rec.feed(ids[:, start:prefill_end])
        after_prefill.append(cache.retained_positions(0)[0, 0].tolist())
        for i in range(prefill_end, decode_end):
            rec.feed(ids[:, i : i + 1])
        start = decode_end
    return rec, cfg, after_prefill


def test_segments_are_checked():
    with pytest.raises(ValueError, match="kind"):
        Segment(0, 4, "tool")
    cache = nexus.EvictableCache(type("C", (), {"num_hidden_layers": 1})(), nexus.EvictionConfig(method="dense"))
    with pytest.raises(ValueError, match="in order"):
        cache.segments = [Segment(0, 10, "prompt"), Segment(5, None, "task")]


def test_candidates_setting_is_checked_and_left_out_of_keys_at_its_default():
    with pytest.raises(ValueError, match="candidates must be one of all, newest_turn"):
        nexus.EvictionConfig(method="snapkv", candidates="oldest")
    assert "candidates" not in keyed(nexus.EvictionConfig(method="snapkv").to_dict())
    assert (
        keyed(nexus.EvictionConfig(method="snapkv", candidates="newest_turn").to_dict())["candidates"] == "newest_turn"
    )


@pytest.mark.parametrize("scope", nexus.SCOPES)
def test_observation_masking_latest_evicts_only_old_observations(model64, scope):
    rec, cfg, after = _episode(model64, "observation_masking", scope, keep_latest=1)
    torch.testing.assert_close(torch.cat(rec.logits, 1), masked_reference_logits(model64, rec), atol=1e-9, rtol=0)
    assert after[0] == list(range(60)) and after[1] == list(range(130))  # one observation: nothing to drop yet
    assert after[2] == [p for p in range(200) if not 82 <= p < 126]  # the older observation left whole
    assert {e.phase for e in rec.cache.events} == {"prefill"}  # decoding never evicts under the paper's rule
    assert rec.cache.budget(0) == 210 - 44 and rec.cache.occupancy(0) == 210 - 44


def test_observation_masking_budget_drops_observations_oldest_first(model64):
    rec, cfg, after = _episode(model64, "observation_masking", rule="budget", density=0.6)
    torch.testing.assert_close(torch.cat(rec.logits, 1), masked_reference_logits(model64, rec), atol=1e-9, rtol=0)
    kept = after[2]
    assert len(kept) == nexus.prefill_budget(cfg, 200)  # equal memory: the density budget
    observation = [p for p in range(200) if 82 <= p < 126 or 147 <= p < 196]
    held_before = [p for p in after[1] if p not in observation] + list(range(130, 200))  # turn 3's feed joined
    dropped = [p for p in observation if p not in kept]
    assert dropped and all(p in kept for p in held_before if p not in observation)  # only observations went
    assert dropped == observation[: len(dropped)]  # oldest first, token by token


@pytest.mark.parametrize("method", ["snapkv", "nexus", "ada_snapkv", "h2o", "streaming_llm"])
def test_newest_turn_keeps_earlier_turns_as_they_were(model64, method):
    rec, cfg, after = _episode(model64, method, density=0.5, candidates="newest_turn")
    torch.testing.assert_close(torch.cat(rec.logits, 1), masked_reference_logits(model64, rec), atol=1e-9, rtol=0)
    cache = rec.cache
    for layer in range(cache.num_layers):
        before = rec.seen_before[-11][layer]  # what the layer held before turn 3's prefill: the turn-2 event's
        now = rec.seen_before[-10][layer]  # after turn 3's prefill event
        held = float((now >= 0).sum(-1).float().mean())
        assert abs(held - nexus.prefill_budget(cfg, 200)) <= 0.5, (layer, held)  # held entries: the budget
        for h in range(now.shape[1]):
            earlier = sorted(p for p in before[0, h].tolist() if 0 <= p < 130)
            assert sorted(p for p in now[0, h].tolist() if 0 <= p < 130) == earlier, (layer, h)


def test_newest_turn_compresses_a_whole_history_turn_by_turn(model64):
    """A fresh cache (full context): one prefill of the history, each turn compressed on its own share."""
    cfg = nexus.EvictionConfig(method="snapkv", scope="prefill_only", density=0.5, candidates="newest_turn", **SMALL)
    cache = nexus.EvictableCache(model64.config, cfg)
    cache.segments = [
        Segment(0, 20, "prompt"),
        Segment(20, 56, "task"),
        Segment(56, 82, "assistant"),
        Segment(82, 126, "observation"),
        Segment(126, None, "assistant"),
    ]
    rec = StreamRecorder(model64, cache)
    rec.feed(torch.randint(0, 1000, (1, 140), generator=torch.Generator().manual_seed(4)))
    rec.feed(torch.tensor([[7]]))
    torch.testing.assert_close(torch.cat(rec.logits, 1), masked_reference_logits(model64, rec), atol=1e-9, rtol=0)
    kept = cache.retained_positions(0)[0, 0].tolist()[:-1]  # the decoded token aside
    assert len(kept) == nexus.prefill_budget(cfg, 140) == 70
    # two turns: [0, 56) (system, task) and [56, 140) (the reply, the observation, the open header), by length
    assert sum(p < 56 for p in kept) == 28 and sum(p >= 56 for p in kept) == 42
