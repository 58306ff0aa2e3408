"""KV memory per turn (nexus.memory) where the agent runner reports it: the hf backend's completions (held and
allocated after the turn, both peaks over the turn, a new peak window per turn), counterfactual replay's turn
scores (the same figures as the run it replays, token by token) and the probes' results (at answer start, and the
peaks over the sample). Tiny Qwen3; the engine's equality with the solo path is tests/agent_runner/test_engine.py."""

from __future__ import annotations

import pytest

import nexus
from agent_runner.backends.hf import HFBackend
from agent_runner.records import Message
from agent_runner.sampling import SamplingConfig
from measure.counterfactual import model_forward, replay_episode
from measure.probes import ProbeSettings, run_probes
from tests.tiny_models import tiny_host

SMALL = dict(density=0.25, window=8, block_size=8)
FIELDS = ("kv_held_bytes", "kv_allocated_bytes", "kv_peak_held_bytes", "kv_peak_allocated_bytes")


@pytest.fixture(scope="module")
def host():
    return tiny_host()


def _memory(x) -> tuple[int, ...]:
    return tuple(getattr(x, name) for name in FIELDS)


def _episode(host, cfg, protocol: str, turns: int = 3):
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=24)
    backend = HFBackend(host, eviction=cfg, protocol=protocol, sampling=sampling, max_context_tokens=65536)
    backend.reset(seed=3)
    # a long first prompt, short observations: the first turn's prefill is the episode's high-water mark
    msgs = [Message(role="system", content="Fix the bug. " * 40), Message(role="user", content="It fails. " * 30)]
    out = []
    for t in range(turns):
        c = backend.complete(msgs)
        out.append(c)
        msgs += [Message(role="assistant", content=c.text), Message(role="user", content=f"ran {t} " * 4)]
    return backend, out


@pytest.mark.parametrize("protocol", ["true_eviction", "full_context"])
def test_each_turn_reports_its_own_peaks_from_before_its_prefill(host, protocol):
    cfg = nexus.EvictionConfig(method="snapkv", scope="prefill_decode", **SMALL)
    backend, turns = _episode(host, cfg, protocol)
    for c in turns:
        held, allocated, peak_held, peak_allocated = _memory(c)
        assert 0 < held <= allocated and peak_held >= held and peak_allocated >= allocated
        assert peak_held > held  # the prefill held every new token before its eviction
    assert _memory(turns[-1])[:2] == (backend.cache.held_bytes(), backend.cache.allocated_bytes())
    if protocol == "true_eviction":
        # a new window per turn: a short turn's peak is its own, below the long first prefill's (one window for
        # the whole episode would repeat the first turn's peak in every later turn)
        assert turns[1].kv_peak_held_bytes < turns[0].kv_peak_held_bytes
        assert turns[2].kv_peak_held_bytes < turns[0].kv_peak_held_bytes
    else:
        # a fresh cache per turn: the peak is this turn's prefill of the whole history, the last layer full while
        # the first had already evicted
        text = host.model.config.get_text_config()
        entry = 2 * text.head_dim * text.num_key_value_heads * host.model.dtype.itemsize
        for c in turns:
            assert c.prompt_tokens * entry <= c.kv_peak_held_bytes < text.num_hidden_layers * c.prompt_tokens * entry


def test_dense_allocates_spare_capacity_and_holds_what_it_was_fed(host):
    backend, turns = _episode(host, nexus.EvictionConfig(method="dense"), "true_eviction", turns=2)
    text = host.model.config.get_text_config()
    entry = 2 * text.head_dim * text.num_key_value_heads * host.model.dtype.itemsize  # K+V per position, all heads
    for c in turns:
        # dense holds every token fed (the last sampled one is fed at the start of the next turn)
        assert c.kv_held_bytes == text.num_hidden_layers * c.logical_length * entry
        assert c.kv_allocated_bytes > c.kv_held_bytes  # grown in chunks
        assert c.kv_peak_held_bytes == c.kv_held_bytes  # nothing is evicted: the end is the peak


def test_token_by_token_replay_reports_the_runs_figures(host):
    """Teacher forcing an episode's own stream under its own settings feeds the cache exactly what the run fed it,
    so every turn's KV figures, peaks included, are the run's."""
    cfg = nexus.EvictionConfig(method="nexus", scope="prefill_decode", **SMALL)
    _, turns = _episode(host, cfg, "true_eviction")
    forward = model_forward(host.model, host.device)
    score = replay_episode(forward, host.model.config, [c.tokens for c in turns], cfg, "true_eviction", chunked=False)
    assert [_memory(s) for s in score.turns] == [_memory(c) for c in turns]


def test_probe_results_report_the_answer_start_and_the_samples_peaks(host):
    settings = ProbeSettings(
        model="tiny",
        probes=("needle", "nll"),
        samples=1,
        lengths=(256,),
        densities=(0.25,),
        variants=("dense", "snapkv", "ada_snapkv"),
    )
    results = list(run_probes(host, settings))
    assert results
    for r in results:
        assert 0 < r.kv_held_bytes <= r.kv_allocated_bytes, r
        assert r.kv_peak_held_bytes >= r.kv_held_bytes and r.kv_peak_allocated_bytes >= r.kv_allocated_bytes, r
        if r.variant != "dense":
            assert r.kv_peak_held_bytes > r.kv_held_bytes  # the prefill before its eviction
    by = {(r.probe, r.variant): r for r in results}
    for probe in ("needle", "nll"):
        # ragged Ada heads hold what SnapKV holds; only their allocated bytes carry the padding to the longest head
        snap, ada = by[(probe, "snapkv")], by[(probe, "ada_snapkv")]
        assert ada.kv_held_bytes <= 1.02 * snap.kv_held_bytes
        assert ada.kv_allocated_bytes - ada.kv_held_bytes > snap.kv_allocated_bytes - snap.kv_held_bytes
