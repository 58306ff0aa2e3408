"""``rerun --from-turn K`` rebuilds the stored cache: ``ForcedPrefix`` feeds the stored turns' generated token ids
(``TurnTokens.generated``) through the hf backend (``forced_ids``), not their re-tokenised texts.

An episode is run live on the tiny Qwen3 (real tokenizer, random weights, temperature 1: its sampled sequences are
often not the tokenizer's own encoding of their text) under an evicting method, its turns kept as the database
keeps them (``(completion, tokens)``, ``workers.stored_records.turn_row``); then it is rebuilt from those records. After
K forced turns the cache holds the same positions per layer and KV head and gives the same logits at the next
position; every turn's keep/append/generated are the stored ones; and the turn sampled after the prefix is the
stored run's own (the generator drew as it did)."""

from __future__ import annotations

import copy

import pytest
import torch

import nexus
from agent_runner.backends.forced_prefix import ForcedPrefix
from agent_runner.backends.hf import HFBackend
from agent_runner.config import AgentConfig, EpisodeSpec
from agent_runner.engine import forward_last
from agent_runner.episode import EpisodeHooks, run_episode
from agent_runner.sampling import SamplingConfig
from tests.agent_runner.conftest import RecordingEnvironment, TinyTask
from tests.tiny_models import tiny_host

K = 3  # turns forced from the stored run; the run goes one turn further


@pytest.fixture(scope="module")
def host():
    return tiny_host()


def _backend(host, method, protocol):
    cfg = nexus.EvictionConfig(method=method, scope="prefill_decode", density=0.2)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=40)
    return HFBackend(host, eviction=cfg, protocol=protocol, sampling=sampling, max_context_tokens=65536)


def _run(host, method, protocol, model=None, *, steps=K + 1):
    """One episode (RecordingEnvironment answers) and, after turn K-1, the cache's retained positions and the
    logits at the next position (the pending sampled token fed to a copy of the cache)."""
    backend = _backend(host, method, protocol)
    seen = {}

    def after_turn(turn):
        if turn.index == K - 1:
            cache = backend.cache
            seen["positions"] = [cache.retained_positions(i) for i in range(cache.num_layers)]
            seen["keys"] = [layer.keys.clone() for layer in cache.layers]
            probe = copy.deepcopy(cache)
            ids = torch.tensor([[backend._pending]])
            seen["logits"] = forward_last(host.model, nexus.cache_kwarg(host.model), probe, ids)
            seen["logical_length"] = cache.logical_length

    task = TinyTask()
    spec = EpisodeSpec(
        suite="mini",
        task_id=task.instance_id,
        backend="hf",
        protocol="true_eviction",
        agent=AgentConfig(max_steps=steps, max_format_errors=None),
        grade=False,
        eviction={},
        seed=7,
    )
    wrapped = model(backend) if model is not None else backend
    hooks = EpisodeHooks(on_turn=after_turn, open_environment=lambda task, **kw: RecordingEnvironment())
    result = run_episode(spec, task=task, model=wrapped, hooks=hooks)
    assert result.exit_status == "step_limit", result.error
    return result, seen, backend


def _stored(result, turns=K):
    """The stored turns as ``_interactive`` reads them from ``db.models.Turn`` rows: (completion, tokens)."""
    return [(t.completion.text, t.completion.tokens.model_dump(mode="json")) for t in result.turns[:turns]]


@pytest.mark.parametrize(
    ("method", "protocol"), [("snapkv", "true_eviction"), ("nexus", "true_eviction"), ("snapkv", "full_context")]
)
def test_forced_ids_rebuild_the_stored_cache_after_k_turns(host, method, protocol):
    live, live_seen, _ = _run(host, method, protocol)
    stored = _stored(live)
    # the case re-tokenising cannot rebuild: sampled ids that are not the tokenizer's encoding of their text
    retokenized = [host.tokenizer.encode(text, add_special_tokens=False) for text, _ in stored]
    assert any(ids != tokens["generated"][: len(ids)] for ids, (_, tokens) in zip(retokenized, stored, strict=True))
    assert sum(t.completion.eviction_events for t in live.turns[:K]) > 0  # the method evicted: a non-trivial cache

    prefixes = []

    def wrap(backend):
        prefixes.append(ForcedPrefix(stored, backend))
        return prefixes[0]

    rebuilt, seen, _ = _run(host, method, protocol, wrap)
    prefix = prefixes[0]
    assert prefix.how == ["ids"] * K and prefix.notes == []
    assert seen["logical_length"] == live_seen["logical_length"]
    for layer, (a, b) in enumerate(zip(seen["positions"], live_seen["positions"], strict=True)):
        assert torch.equal(a, b), f"layer {layer}: other retained positions"
    for a, b in zip(seen["keys"], live_seen["keys"], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(seen["logits"], live_seen["logits"])
    for old, new in zip(live.turns, rebuilt.turns, strict=True):
        assert new.completion.tokens == old.completion.tokens, f"turn {old.index}: another keep/append/generated"
        assert new.completion.text == old.completion.text
        assert new.user_message == old.user_message
    for turn in rebuilt.turns[:K]:
        assert turn.completion.forced and turn.completion.info.forced_from == "ids"
        # the generator drew each forced id itself: the rebuilt logits are the stored run's
        assert turn.completion.info.forced_agreed == len(turn.completion.tokens.generated)
    assert not rebuilt.turns[K].completion.forced  # sampled live, and the same as the stored run's turn K


def test_turns_without_ids_are_re_tokenised_and_say_so(host):
    live, _, _ = _run(host, "snapkv", "true_eviction", steps=K)
    stored = _stored(live)
    stored[1] = (stored[1][0], None)  # a row written before the ids were kept
    prefix = ForcedPrefix(stored, _backend(host, "snapkv", "true_eviction"))
    assert prefix.how == ["ids", "text", "ids"]
    assert prefix.notes[0] == "turn 1: no stored token ids; re-tokenized the text, the cache may differ"


def test_a_rebuilt_context_that_differs_from_the_stored_one_is_noted(host):
    live, _, _ = _run(host, "snapkv", "true_eviction", steps=K)
    stored = _stored(live)
    text, tokens = stored[1]
    stored[1] = (text, {**tokens, "append": [*tokens["append"][:-3], 0, 0, 0]})  # the stored observation differs

    def wrap(backend):
        wrap.prefix = ForcedPrefix(stored, backend)
        return wrap.prefix

    _run(host, "snapkv", "true_eviction", wrap, steps=K)
    assert len(wrap.prefix.notes) == 1 and wrap.prefix.notes[0].startswith("turn 1: the rebuilt context differs")


def test_forced_ids_end_at_a_stop_token_or_after_the_last_id():
    from agent_runner.engine import TurnDecoder

    kw = {"limit": 1, "sampling": SamplingConfig(temperature=0.0), "generator": torch.Generator(), "draw_forced": True}
    logits = torch.tensor([[0.0, 5.0, 0.0, 0.0]])  # the greedy draw is token 1
    ran_out = TurnDecoder(forced=[1, 2, 3], stop={9}, **kw)  # a stored turn that ran out of tokens: no stop token
    assert [ran_out.next_token(logits) for _ in range(3)] == [1, 2, None]
    assert (ran_out.tokens, ran_out.finish, ran_out.agreed) == ([1, 2, 3], "length", 1)
    stopped = TurnDecoder(forced=[1, 3], stop={3}, **kw)
    assert [stopped.next_token(logits) for _ in range(2)] == [1, None]
    assert (stopped.tokens, stopped.finish) == ([1, 3], "stop")
