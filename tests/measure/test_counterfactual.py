"""Counterfactual replay: chunked teacher forcing equals token-by-token teacher forcing (fp64), and the stored
stream of an hf episode is exactly what its cache was fed."""

from __future__ import annotations

import pytest
import torch

import nexus
from agent_runner.backends.hf import HFBackend
from agent_runner.records import Message
from agent_runner.sampling import SamplingConfig
from measure.counterfactual import (
    ReplayError,
    contexts,
    model_forward,
    replay_episode,
    teacher_force,
)
from tests.nexus.unlabelled import evicting
from tests.tiny_models import tiny_host64

SMALL = dict(density=0.25, window=8, block_size=8)
FAST = {("nexus", "prefill_decode", "true_eviction"), ("h2o", "prefill_decode", "full_context")}


@pytest.fixture(scope="module")
def host():
    return tiny_host64()


def _dense_run(host, protocol: str, turns: int = 3, greedy: bool = False):
    sampling = SamplingConfig(temperature=0.0 if greedy else 1.0, max_new_tokens=40)
    dense = nexus.EvictionConfig(method="dense")
    backend = HFBackend(host, eviction=dense, protocol=protocol, sampling=sampling, max_context_tokens=65536)
    backend.reset(seed=7)
    msgs = [Message(role="system", content="Fix the bug. " * 20), Message(role="user", content="It fails. " * 15)]
    out = []
    for t in range(turns):
        c = backend.complete(msgs)
        out.append(c.tokens)
        msgs += [Message(role="assistant", content=c.text), Message(role="user", content=f"ran {t} " * 9)]
    return backend, out


@pytest.fixture(scope="module")
def runs(host):
    return {p: _dense_run(host, p) for p in ("true_eviction", "full_context")}


@pytest.fixture(scope="module")
def streams(runs):
    return {p: turns for p, (_, turns) in runs.items()}


def test_stored_stream_is_what_the_cache_was_fed(runs):
    backend, turns = runs["true_eviction"]
    ctx = contexts(turns)
    last = ctx[-1] + turns[-1].generated[:-1]
    assert last == backend.stream and backend.cache.logical_length == len(last)
    assert all(t.keep == len(prev) + len(p.generated) - 1 for t, prev, p in zip(turns[1:], ctx, turns, strict=False))


def test_full_context_stream_rerenders_history(host, runs):
    backend, turns = runs["full_context"]
    ctx = contexts(turns)
    assert turns[0].keep == 0 and ctx[-1] == backend.stream[: len(ctx[-1])]
    with pytest.raises(ReplayError, match="not a continuation"):
        # a re-rendered history cannot be carried in one cache, unless it happens to be a pure continuation
        bad = [turns[0], turns[1].model_copy(update={"keep": turns[1].keep - 1})]
        list(
            teacher_force(
                model_forward(host.model, host.device), host.model.config, bad, nexus.EvictionConfig(), "true_eviction"
            )
        )


#: how many of the matrix's other 38 cells a run measures: every cell over runs, a printed seed a run
CELLS_PER_RUN = 9


def _matrix():
    """Every method x scope x protocol: the FAST cells always, of the rest a seeded sample of :data:`CELLS_PER_RUN`
    per run under the `slow` marker (``--matrix-seed``, ``--matrix-full``)."""
    cells = [(m, s, p) for m in nexus.METHODS for s in nexus.SCOPES for p in ("true_eviction", "full_context")]
    sampled = (pytest.mark.slow, pytest.mark.matrix(keep=CELLS_PER_RUN))
    return [pytest.param(*cell, marks=pytest.mark.matrix(always=True) if cell in FAST else sampled) for cell in cells]


@pytest.mark.parametrize(("method", "scope", "protocol"), _matrix())
def test_chunked_replay_equals_token_by_token(host, streams, method, scope, protocol):
    cfg = nexus.EvictionConfig(method=method, scope=scope, **SMALL, **evicting(method))  # no segments told here
    forward = model_forward(host.model, host.device)
    runs = {}
    for chunked in (True, False):
        rows = list(teacher_force(forward, host.model.config, streams[protocol], cfg, protocol, chunked=chunked))
        events = [[(e.phase, e.logical_length, dict(e.per_layer)) for e in cache.events] for _, cache, *_ in rows]
        runs[chunked] = ([r[2] for r in rows], events, sum(r[4] for r in rows))
    (chunk_logits, chunk_events, chunk_forwards), (tok_logits, tok_events, tok_forwards) = runs[True], runs[False]
    for a, b in zip(chunk_logits, tok_logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)
    assert chunk_events == tok_events
    assert chunk_forwards < tok_forwards  # it really ran in chunks
    if cfg.evicts and scope == "prefill_decode":
        assert any(e[0] == "decode" for turn in chunk_events for e in turn)


def test_replay_scores(host):
    _, turns = _dense_run(host, "true_eviction", turns=2, greedy=True)
    forward = model_forward(host.model, host.device)
    dense = replay_episode(forward, host.model.config, turns, nexus.EvictionConfig(method="dense"), "true_eviction")
    assert dense.top1 == 1.0  # greedy tokens are the model's own argmax under the same cache
    assert dense.tokens == sum(len(t.generated) for t in turns) and len(dense.turns) == 2
    cfg = nexus.EvictionConfig(method="snapkv", scope="prefill_decode", density=0.1, window=8, block_size=8)
    evicted = replay_episode(forward, host.model.config, turns, cfg, "true_eviction")
    assert evicted.nll_mean != pytest.approx(dense.nll_mean, abs=1e-12)
    assert sum(t.eviction_events for t in evicted.turns) > 0
    assert all(t.physical_after.max < dense.turns[i].physical_after.max for i, t in enumerate(evicted.turns))
    with pytest.raises(ReplayError, match="unknown protocol"):
        replay_episode(forward, host.model.config, turns, cfg, "sometimes")
