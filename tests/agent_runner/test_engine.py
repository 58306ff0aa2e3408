"""DecodeEngine: episodes decoded together equal each episode alone (tiny Qwen3 in fp64, both protocols).

Four episodes with different prompt lengths, join times (each starts after the engine has decoded a few
batched steps) and turn lengths run in four threads through one engine; each must produce the same sampled
tokens, the same logits (atol 1e-9), the same eviction events and the same KV memory figures per turn (held,
allocated and both peaks, nexus.memory) as when it runs alone on the solo path.
"""

from __future__ import annotations

import time

import pytest
import torch

import nexus
from agent_runner import engine as engine_module
from agent_runner.backends.hf import HFBackend
from agent_runner.engine import DecodeEngine, TurnDecoder
from agent_runner.records import Message
from agent_runner.sampling import SamplingConfig
from tests.support.threads import run_together
from tests.tiny_models import tiny_host64

SMALL = dict(density=0.25, window=8, block_size=8)
EPISODES = [  # (system repeats, max new tokens per turn, start after this many batched steps)
    (6, 14, 0),
    (14, 22, 3),
    (3, 9, 6),
    (10, 18, 9),
]
FAST = {("nexus", "prefill_decode", "true_eviction")}
#: how many of the matrix's other 25 cells a run measures: every cell over runs, a printed seed a run
CELLS_PER_RUN = 6
LOGITS: dict[int, list[torch.Tensor]] = {}  # id(generator) -> every logits row the decoder saw


class RecordingDecoder(TurnDecoder):
    def next_token(self, logits):
        LOGITS.setdefault(id(self.generator), []).append(logits.detach().clone())
        return super().next_token(logits)


def _matrix():
    """Every method under both protocols with decode-time eviction (the harder scope), and prefill_only for a
    few: tests/nexus/test_batch.py covers every method x scope at the stack level. FAST always, of the rest a seeded
    sample of :data:`CELLS_PER_RUN` per run under the `slow` marker (``--matrix-seed``, ``--matrix-full``)."""
    cells = [(m, "prefill_decode", p) for m in nexus.METHODS for p in ("true_eviction", "full_context")]
    cells += [(m, "prefill_only", p) for m in ("snapkv", "h2o", "nexus") for p in ("true_eviction", "full_context")]
    sampled = (pytest.mark.slow, pytest.mark.matrix(keep=CELLS_PER_RUN))
    return [pytest.param(*cell, marks=pytest.mark.matrix(always=True) if cell in FAST else sampled) for cell in cells]


@pytest.fixture(scope="module")
def host():
    return tiny_host64()


def _episode(backend: HFBackend, index: int, turns: int = 3):
    repeats, _, _ = EPISODES[index]
    backend.reset(seed=100 + index)
    msgs = [
        Message(role="system", content="You fix bugs in small Python projects. " * repeats),
        Message(role="user", content=f"Issue {index}: the parser drops the last field. " * (2 + index)),
    ]
    out = []
    for t in range(turns):
        c = backend.complete(msgs)
        out.append(c)
        msgs += [Message(role="assistant", content=c.text), Message(role="user", content=f"obs {t} " * (5 + 3 * t))]
    events = [(e.phase, e.logical_length, dict(e.per_layer)) for e in backend.cache.events]
    # pop, not read: once this backend is gone a later generator may reuse its id(), and must start a fresh list
    return out, LOGITS.pop(id(backend.generator)), events


def _memory(c):
    return c.kv_held_bytes, c.kv_allocated_bytes, c.kv_peak_held_bytes, c.kv_peak_allocated_bytes


def _backend(host, cfg, protocol, index, engine=None):
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=EPISODES[index][1])
    return HFBackend(host, eviction=cfg, protocol=protocol, sampling=sampling, max_context_tokens=65536, engine=engine)


@pytest.mark.parametrize(("method", "scope", "protocol"), _matrix())
def test_batched_episodes_equal_each_alone(host, monkeypatch, method, scope, protocol):
    monkeypatch.setattr("agent_runner.backends.hf.TurnDecoder", RecordingDecoder)
    cfg = nexus.EvictionConfig(method=method, scope=scope, **SMALL)
    LOGITS.clear()
    alone = [_episode(_backend(host, cfg, protocol, i), i) for i in range(len(EPISODES))]
    LOGITS.clear()
    engine = DecodeEngine(host.model, host.device, max_rows=4)
    results: dict[int, tuple] = {}

    def run(i: int) -> None:
        while engine.steps < EPISODES[i][2]:  # join once the others have decoded a few steps together
            time.sleep(0.001)
        results[i] = _episode(_backend(host, cfg, protocol, i, engine), i)

    errors = run_together(run, [(i,) for i in range(len(EPISODES))])
    engine.close()
    assert not errors, errors
    for i, (comps, logits, events) in enumerate(alone):
        b_comps, b_logits, b_events = results[i]
        assert [c.tokens for c in b_comps] == [c.tokens for c in comps], f"episode {i}"
        assert len(b_logits) == len(logits)
        torch.testing.assert_close(torch.cat(b_logits), torch.cat(logits), atol=1e-9, rtol=0)
        assert b_events == events
        # the same KV memory per turn (held, allocated, both peaks): a stacked row keeps the capacity it would
        # have alone and leaves the stack into buffers of that size; the stack's padding is the engine's own cost
        assert [_memory(c) for c in b_comps] == [_memory(c) for c in comps], f"episode {i}"
    assert engine.rows_decoded > engine.steps  # rows really were decoded together
    # a budget set by content (observation_masking's paper rule) is applied at every forward: no decode-time event
    if cfg.evicts and scope == "prefill_decode" and cfg.policy.content_budget((), 1) is None:
        assert any(e[0] == "decode" for *_, events in alone for e in events)


def test_engine_reports_rows_and_refuses_after_close(host):
    cfg = nexus.EvictionConfig(method="snapkv", **SMALL)
    engine = DecodeEngine(host.model, host.device, max_rows=2)
    backend = _backend(host, cfg, "true_eviction", 0, engine)
    backend.reset(seed=1)
    c = backend.complete([Message(role="system", content="hi " * 30), Message(role="user", content="fix it " * 9)])
    assert c.batch_rows == 1.0 and c.tokens_generated > 0
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        backend.complete(
            [
                Message(role="system", content="hi " * 30),
                Message(role="user", content="fix it " * 9),
                Message(role="assistant", content=c.text),
                Message(role="user", content="next"),
            ]
        )
    with pytest.raises(ValueError, match="max_rows"):
        DecodeEngine(host.model, host.device, max_rows=0)


def test_a_failing_forward_fails_every_decoding_row_and_the_engine_goes_on(host, monkeypatch):
    cfg = nexus.EvictionConfig(method="dense")
    engine = DecodeEngine(host.model, host.device, max_rows=2)
    real = engine_module.forward_last
    calls = {"n": 0}

    def flaky(model, kw, cache, ids, **extra):
        calls["n"] += 1
        if calls["n"] == 2:  # the first batched decode step (call 1 is the prefill)
            raise torch.OutOfMemoryError("simulated")
        return real(model, kw, cache, ids, **extra)

    monkeypatch.setattr(engine_module, "forward_last", flaky)
    backend = _backend(host, cfg, "true_eviction", 0, engine)
    backend.reset(seed=0)
    msgs = [Message(role="system", content="s " * 20), Message(role="user", content="u " * 20)]
    with pytest.raises(Exception, match="out of memory"):
        backend.complete(msgs)
    backend.reset(seed=0)
    assert backend.complete(msgs).tokens_generated > 0  # the engine thread survived
    engine.close()
