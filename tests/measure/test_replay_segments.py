"""Replays and probes tell every cache its turn segments, and feed the paper's observation masking as text under
full context (fp64 tiny model, a rendered conversation with two or three observations).

``observation_masking`` and ``candidates: newest_turn`` decide by the segments (``nexus.segments``) the host gives
the cache before each forward; a replay gives them from the stream's ChatML messages
(``measure.counterfactual.turn_segments``), the shared prefills included (``RecordedPrefill.cache_for``). Under
full context the paper's rule is text-level: the rows are fed the history with old observations replaced by the
placeholder (``measure.replay_cells.mask_turns``), as the hf backend renders it.
"""

from __future__ import annotations

import pytest
import torch

import nexus
from agent_runner.chat_segments import ChatMarkers, text_masking
from agent_runner.chat_stream import render_trajectory
from measure.action_scores import plan_spans
from measure.counterfactual import contexts, model_forward, replay_episode, teacher_force, turn_segments
from measure.replay_cells import mask_turns, replay_cells
from tests.measure.test_stacked_cells import _turn_facts
from tests.measure.test_text_replay import conversation
from tests.tiny_models import tiny_host64

SMALL = dict(window=8, block_size=8)
#: the paper's rule with one observation kept: the conversation's view is old by the last turn
LATEST = dict(method="observation_masking", keep_latest=1)
PLACEHOLDER = nexus.EvictionConfig(**LATEST).policy.placeholder


@pytest.fixture(scope="module")
def host64():
    return tiny_host64(tiny_layers=3)


@pytest.fixture(scope="module")
def stream(host64):
    """Per protocol: the turns, spans and segments of a view, a test run, then an edit copying the view."""
    out = {}
    for protocol in ("true_eviction", "full_context"):
        rendered = render_trajectory(host64.tokenizer, conversation(filler=1), protocol)
        out[protocol] = rendered.turns, plan_spans(rendered), turn_segments(rendered.turns, markers(host64))
    return out


def markers(host) -> ChatMarkers:
    return ChatMarkers.of(host.tokenizer)


def _observations(segments) -> list[tuple[int, int]]:
    return [(s.start, s.end) for s in segments if s.kind == "observation"]


def _assert_alone_equal(host, turns, plans, segments, evictions, protocol, together) -> None:
    forward = model_forward(host.model, host.device)
    for eviction, got in zip(evictions, together, strict=True):
        alone = replay_episode(forward, host.model.config, turns, eviction, protocol, actions=plans, segments=segments)
        assert got.nll_mean == pytest.approx(alone.nll_mean, abs=1e-9) and got.top1 == alone.top1
        for a, b in zip(got.turns, alone.turns, strict=True):
            assert _turn_facts(a) == _turn_facts(b), (eviction.method, eviction.candidates, a.index)


@pytest.mark.slow  # 6-10 s a protocol
@pytest.mark.parametrize("protocol", ["true_eviction", "full_context"])
@torch.no_grad()
def test_rows_told_segments_equal_each_row_alone(host64, stream, protocol):
    """Both rules of observation_masking and snapkv / nexus with candidates newest_turn: stacked rows equal each
    row alone, told the same segments; the paper rule under full context on its masked stream, a call of its own."""
    turns, plans, segments = stream[protocol]
    evictions = [
        nexus.EvictionConfig(**LATEST, **SMALL),
        nexus.EvictionConfig(method="observation_masking", rule="budget", density=0.3, **SMALL),
        nexus.EvictionConfig(method="snapkv", density=0.3, candidates="newest_turn", **SMALL),
        nexus.EvictionConfig(method="nexus", density=0.3, scope="prefill_decode", candidates="newest_turn", **SMALL),
    ]
    masked = [e for e in evictions if text_masking(e, protocol)]
    source = [e for e in evictions if not text_masking(e, protocol)]
    assert len(masked) == (protocol == "full_context")
    together = replay_cells(host64.model, turns, source, protocol, actions=plans, segments=segments)
    _assert_alone_equal(host64, turns, plans, segments, source, protocol, together)
    assert all(sum(t.eviction_events for t in score.turns) for score in together)
    if masked:
        m = mask_turns(turns, plans, host64.tokenizer, markers(host64), keep_latest=1, placeholder=PLACEHOLDER)
        scores = replay_cells(host64.model, m.turns, masked, protocol, actions=m.actions, segments=m.segments)
        _assert_alone_equal(host64, m.turns, m.actions, m.segments, masked, protocol, scores)
        # newest_turn under full context compresses turn by turn: the segments say where the turns are
        untold = replay_episode(model_forward(host64.model, host64.device), host64.model.config, turns,
                                source[1], protocol, actions=plans)  # fmt: skip
        assert untold.nll_mean != pytest.approx(together[1].nll_mean, abs=1e-9)


@pytest.mark.parametrize("scope", nexus.SCOPES)
@torch.no_grad()
def test_true_eviction_drops_the_oldest_observation_whole(host64, stream, scope):
    """The paper rule, one observation kept: once the test run is fed, every layer and head holds every position
    but the view's, which left whole at that turn's prefill; decoding never evicts."""
    turns, plans, segments = stream["true_eviction"]
    view, run = _observations(segments[-1])
    eviction = nexus.EvictionConfig(**LATEST, scope=scope, **SMALL)
    forward = model_forward(host64.model, host64.device)
    held, length = {}, {}
    replay = teacher_force(forward, host64.model.config, turns, eviction, "true_eviction", segments=segments)
    for t, cache, *_ in replay:
        held[t] = [sorted(p for p in head.tolist() if p >= 0) for i in range(cache.num_layers)
                   for head in cache.retained_positions(i)[0]]  # fmt: skip
        length[t] = cache.logical_length
    last = len(turns) - 1
    assert [(e.phase, e.logical_length) for e in cache.events] == [("prefill", len(contexts(turns)[last]))]
    assert all(h == list(range(length[last - 1])) for h in held[last - 1])  # one observation then: all held
    kept = [p for p in range(length[last]) if not view[0] <= p < view[1]]
    assert all(h == kept for h in held[last])
    score = replay_cells(host64.model, turns, [eviction], "true_eviction", actions=plans, segments=segments)[0]
    dense = replay_cells(host64.model, turns, [nexus.EvictionConfig(method="dense")], "true_eviction")[0]
    per_token = dense.turns[-1].kv_held_bytes // length[last]
    assert score.turns[-1].kv_held_bytes == per_token * len(kept) and run[0] > view[1]
    old_str = next(s for s in score.turns[-1].spans if s.kind == "copy" and s.param == "old_str")
    assert old_str.held_mean == 0.0  # its source, the view, is gone


@torch.no_grad()
def test_full_context_latest_rule_is_fed_the_masked_history(host64, stream):
    """Through the replay run's own path (``_score_cells``): the paper rule's row is fed the masked history (KV
    held = the masked context and what was decoded, less than dense's), evicts nothing, and its copies of the
    masked view still count, their source held 0%; the rows beside it are fed the source stream, in order."""
    from measure.replay_run import ReplayItem, _score_cells, _segmented, _Source

    turns, plans, _ = stream["full_context"]
    source = _segmented(_Source(turns=turns, actions=plans), host64.tokenizer)
    configs = [nexus.EvictionConfig(method="dense"), nexus.EvictionConfig(**LATEST, **SMALL)]
    configs.append(nexus.EvictionConfig(method="snapkv", density=0.3, **SMALL))
    items = [ReplayItem("e", "t", c.method, c.scope, "full_context", c.to_dict()) for c in configs]
    outcomes = _score_cells(items, source, host64, True)
    assert [status for status, _, _ in outcomes] == ["ok"] * 3
    dense, masked, snapkv = (score for _, _, score in outcomes)
    assert [masked["method"], snapkv["method"]] == ["observation_masking", "snapkv"]
    ids = mask_turns(turns, plans, host64.tokenizer, markers(host64), keep_latest=1, placeholder=PLACEHOLDER)
    masked_ctx, ctx = contexts(ids.turns), contexts(turns)
    assert host64.tokenizer.decode(masked_ctx[-1]).count("Old environment output: (") == 1
    for t, turn in enumerate(turns):
        fed = len(turn.generated) - 1
        per_token = dense["turns"][t]["kv_held_bytes"] // (len(ctx[t]) + fed)
        assert masked["turns"][t]["kv_held_bytes"] == per_token * (len(masked_ctx[t]) + fed)
        assert masked["turns"][t]["eviction_events"] == 0
    assert masked["turns"][-1]["kv_held_bytes"] < dense["turns"][-1]["kv_held_bytes"]
    copies = [s for s in masked["turns"][-1]["spans"] if s["kind"] == "copy"]
    assert len(copies) == len([s for s in dense["turns"][-1]["spans"] if s["kind"] == "copy"])
    old_str = next(s for s in copies if s["param"] == "old_str")
    assert old_str["held_mean"] == 0.0 and old_str["source_tokens"] == 0 and old_str["back"] > 0
    alone = replay_cells(host64.model, turns, [configs[2]], "full_context", actions=plans, segments=source.segments)
    assert snapkv["nll_mean"] == pytest.approx(alone[0].nll_mean, abs=1e-9)


def test_a_source_without_segments_skips_the_rows_that_read_them(host64, stream):
    """A host without a tokenizer tells no segments: a setting that decides by them is skipped, saying why; the
    others replay as before."""
    from measure.replay_run import ReplayItem, _score_cells, _segmented, _Source

    turns, _, _ = stream["true_eviction"]
    source = _segmented(_Source(turns=turns[:1]), None)
    configs = [nexus.EvictionConfig(**LATEST), nexus.EvictionConfig(method="snapkv", candidates="newest_turn")]
    configs.append(nexus.EvictionConfig(method="snapkv", density=0.5))
    items = [ReplayItem("e", "t", c.method, c.scope, "true_eviction", c.to_dict()) for c in configs]
    outcomes = _score_cells(items, source, host64, True)
    assert [o[0] for o in outcomes] == ["skipped", "skipped", "ok"]
    assert "decides by the turns' segments" in outcomes[0][1] and "no tokenizer" in outcomes[0][1]


#: later_turn has two observations (the file view, then the listing with the question); nll has none
PROBES = dict(
    model="tiny", probes=("later_turn", "nll"), samples=1, lengths=(256,), densities=(0.3,),
    protocols=("true_eviction", "full_context"),
    variants=("dense", "observation_masking(keep_latest=1)", "snapkv(candidates=newest_turn)"),
)  # fmt: skip


@torch.no_grad()
def test_probes_tell_segments_and_mask_observations_under_full_context(host64):
    """With one observation kept, true eviction drops later_turn's view at the question's prefill, and full
    context is prefilled with it masked (less KV held, nothing evicted); nll has no observation, so the rule keeps
    what dense keeps."""
    from measure.probes import ProbeSettings, run_probes

    results = list(run_probes(host64, ProbeSettings(**PROBES)))
    cell = {(r.probe, r.variant.split("(")[0], r.protocol): r for r in results}
    dense = cell["later_turn", "dense", "full_context"]
    masked = cell["later_turn", "observation_masking", "full_context"]
    assert masked.kept_fraction == 1.0 and masked.kv_held_bytes < 0.6 * dense.kv_held_bytes
    dropped = cell["later_turn", "observation_masking", "true_eviction"]
    assert dropped.kept_fraction < 0.6 and dropped.kv_held_bytes == pytest.approx(masked.kv_held_bytes, rel=0.2)
    nll = [cell["nll", variant, "single_prefill"] for variant in ("dense", "observation_masking")]
    assert nll[0].kv_held_bytes == nll[1].kv_held_bytes


@pytest.mark.slow  # 8-12 s
@torch.no_grad()
def test_probe_cells_told_segments_batched_equal_each_alone(host64):
    """The cells above as rows of one stack equal each cell alone (the masked stream a recording of its own)."""
    from measure.probes import ProbeSettings, run_probes

    settings = ProbeSettings(**PROBES)
    for a, b in zip(run_probes(host64, settings), run_probes(host64, settings, batched=False), strict=True):
        assert (a.answer, a.kept_fraction, a.kv_held_bytes) == (b.answer, b.kept_fraction, b.kv_held_bytes)
        assert a.nll == pytest.approx(b.nll, abs=1e-9) if b.nll is not None else a.nll is None
