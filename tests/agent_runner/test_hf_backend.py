"""The hf backend on the tiny Qwen3 (real architecture + real tokenizer, random weights), both protocols."""

from __future__ import annotations

import pytest

import nexus
from agent_runner.backends.hf import HFBackend
from agent_runner.model_host import ModelSpec, load_host, render_chat
from agent_runner.records import Message
from agent_runner.sampling import SamplingConfig
from tests.tiny_models import tiny_host

SYSTEM = "You are a careful software engineer. " * 20
ISSUE = "The parser drops the last field of every row when the line ends with a comma. " * 8


@pytest.fixture(scope="module")
def host():
    return tiny_host()


def _backend(host, method="nexus", scope="prefill_decode", protocol="true_eviction", max_new=24, **kw):
    cfg = nexus.EvictionConfig(method=method, scope=scope, **kw)
    sampling = SamplingConfig(max_new_tokens=max_new)
    return HFBackend(host, eviction=cfg, protocol=protocol, sampling=sampling, max_context_tokens=65536)


def _conversation(backend, turns=3, seed=0, forced=None):
    backend.reset(seed=seed)
    msgs = [Message(role="system", content=SYSTEM), Message(role="user", content=ISSUE)]
    out = []
    for t in range(turns):
        c = backend.complete(msgs, forced_text=None if forced is None else forced[t])
        out.append(c)
        msgs = [
            *msgs,
            Message(role="assistant", content=c.text),
            Message(role="user", content=f"Exit code: 0\nobservation {t} " * 12),
        ]
    return msgs, out


def test_true_eviction_stream_equals_chat_template(host):
    forced = ["I will look at the parser first.", "Now I run the tests.", "Done."]
    b = _backend(host, method="dense")
    msgs, comps = _conversation(b, forced=forced)
    assert [c.text for c in comps] == forced
    # the stream the cache holds is exactly the template's rendering of the conversation so far
    rendered = render_chat(host.tokenizer, [m.model_dump() for m in msgs[:-2]])
    # the cache is one token behind the text: the final "Done." + <|im_end|> sampled, not yet fed
    assert b.stream == rendered + host.tokenizer.encode("Done.", add_special_tokens=False)
    assert b.cache.logical_length == len(b.stream)


def test_true_eviction_keeps_think_content_the_template_drops(host):
    think = "<think>\nThe bug is in split_row.\n</think>\n\nLet me open the file."
    b = _backend(host, method="dense")
    msgs, _ = _conversation(b, turns=2, forced=[think, "ok"])
    held = host.tokenizer.decode(b.stream)
    rerendered = host.tokenizer.apply_chat_template(
        [m.model_dump() for m in msgs[:-2]], tokenize=False, add_generation_prompt=True
    )
    assert "The bug is in split_row." in held
    assert "The bug is in split_row." not in rerendered  # Qwen3's template drops earlier <think> content


@pytest.mark.parametrize("scope", nexus.SCOPES)
def test_true_eviction_logical_length_and_budget(host, scope):
    b = _backend(host, scope=scope, max_new=40)
    _, comps = _conversation(b, turns=3)
    cfg = b.eviction
    for c in comps:
        assert c.logical_length == b.cache.logical_length or c is not comps[-1]
    assert b.cache.logical_length == len(b.stream)
    budget = b.cache.budget(0)
    assert budget == nexus.prefill_budget(cfg, comps[-1].prompt_tokens)
    for layer in range(b.cache.num_layers):
        held = b.cache.occupancy(layer)
        assert held <= (budget + cfg.slack if scope == "prefill_decode" else budget + 40)
    assert sum(c.eviction_events for c in comps) >= 3


def test_full_context_rebuilds_the_cache_each_turn(host):
    b = _backend(host, protocol="full_context", method="snapkv", scope="prefill_only")
    b.reset(seed=0)
    msgs = [Message(role="system", content=SYSTEM), Message(role="user", content=ISSUE)]
    caches = []
    for t in range(3):
        c = b.complete(msgs)
        caches.append(b.cache)
        n = len(render_chat(host.tokenizer, [m.model_dump() for m in msgs]))
        assert c.tokens_appended == n  # the whole history is re-prefilled
        assert b.cache.logical_length == n + c.tokens_generated - 1
        msgs = [*msgs, Message(role="assistant", content=c.text), Message(role="user", content=f"obs {t} " * 30)]
    assert len({id(x) for x in caches}) == 3


def test_dense_keeps_everything(host):
    b = _backend(host, method="dense")
    _, comps = _conversation(b)
    assert not b.cache.events
    assert all(b.cache.physical_length(i) == b.cache.logical_length for i in range(b.cache.num_layers))
    assert comps[-1].physical_after.min == b.cache.logical_length


def test_same_seed_same_completions_and_evictions(host):
    runs = []
    for _ in range(2):
        b = _backend(host, method="nexus", max_new=30)
        _, comps = _conversation(b, seed=7)
        runs.append(([c.text for c in comps], [b.cache.retained_positions(i).tolist() for i in range(2)]))
    assert runs[0] == runs[1]
    b = _backend(host, method="nexus", max_new=30)
    _, other = _conversation(b, seed=8)
    assert [c.text for c in other] != runs[0][0]


def test_context_window_full_returns_empty(host):
    b = HFBackend(host, eviction=nexus.EvictionConfig(method="dense"), protocol="true_eviction", max_context_tokens=50)
    b.reset(seed=0)
    c = b.complete([Message(role="system", content=SYSTEM), Message(role="user", content=ISSUE)])
    assert c.text == "" and c.tokens_generated == 0 and c.prompt_tokens > 50


def test_no_per_turn_cap_by_default_the_context_window_governs(host):
    msgs = [Message(role="system", content=SYSTEM), Message(role="user", content=ISSUE)]
    prompt = len(render_chat(host.tokenizer, [m.model_dump() for m in msgs]))
    dense = nexus.EvictionConfig(method="dense")
    # default SamplingConfig: no cap
    b = HFBackend(host, eviction=dense, protocol="true_eviction", max_context_tokens=prompt + 30)
    assert b.sampling.max_new_tokens is None
    b.reset(seed=0)
    c = b.complete(msgs)  # random weights: <|im_end|> is (almost) never sampled, so the window stops it
    assert (c.tokens_generated, c.finish_reason) == (30, "length")
    b.reset(seed=0)
    assert b.complete(msgs, max_new_tokens=7).tokens_generated == 7  # a cap the agent passes still applies
    capped = HFBackend(
        host,
        eviction=dense,
        protocol="true_eviction",
        sampling=SamplingConfig(max_new_tokens=5),
        max_context_tokens=10**6,
    )
    capped.reset(seed=0)
    assert capped.complete(msgs).tokens_generated == 5  # a cap set in the sampling config applies
    capped.reset(seed=0)
    assert capped.complete(msgs, max_new_tokens=9).tokens_generated == 5  # the smaller of the two caps


def test_bad_inputs_are_clear_errors(host, tmp_path):
    with pytest.raises(ValueError, match="protocol"):
        HFBackend(host, eviction=nexus.EvictionConfig(method="dense"), protocol="sometimes", max_context_tokens=100)
    with pytest.raises(ValueError, match="does not exist"):
        load_host(ModelSpec(name=str(tmp_path / "no-such-model")))
    with pytest.raises(ValueError, match="unknown eviction method"):
        nexus.EvictionConfig(method="topk_magic")
    (tmp_path / "m").mkdir()
    with pytest.raises(ValueError, match="cannot load a tokenizer"):
        load_host(ModelSpec(name=str(tmp_path / "m")))


def test_model_without_chat_template_is_refused(host, tmp_path):
    tok = host.tokenizer.__class__.from_pretrained(str(host.tokenizer.name_or_path))
    tok.chat_template = None
    tok.save_pretrained(tmp_path)
    for extra in ("chat_template.jinja", "chat_template.json"):
        (tmp_path / extra).unlink(missing_ok=True)
    with pytest.raises(ValueError, match="no chat template"):
        load_host(ModelSpec(name=str(tmp_path)))


def test_the_window_is_capped_at_the_models_positions():
    """max_context_tokens beyond the model's max_position_embeddings would run RoPE on positions it never saw."""
    small = load_host(ModelSpec(name="tiny", weights_seed=0))
    small.model.config.max_position_embeddings = 200
    backend = HFBackend(
        small,
        eviction=nexus.EvictionConfig(method="dense"),
        protocol="true_eviction",
        max_context_tokens=65536,
        sampling=SamplingConfig(max_new_tokens=4),
    )
    assert backend.max_context_tokens == 200
    backend.reset(seed=0)
    completion = backend.complete([Message(role="system", content=SYSTEM), Message(role="user", content=ISSUE)])
    assert completion.context_full and completion.finish_reason == "length" and completion.prompt_tokens > 200


def test_the_backend_takes_no_seed_and_samples_nothing_before_the_episode_seeds_it(host):
    """The episode's one seed is applied once, by ``Agent.run`` resetting the backend (issue 45); the backend
    has no seed of its own to apply a second time, and a completion before ``reset(seed=)`` is refused."""
    import inspect

    assert "seed" not in inspect.signature(HFBackend).parameters
    backend = _backend(host)
    with pytest.raises(RuntimeError, match="reset"):
        backend.complete([Message(role="system", content=SYSTEM), Message(role="user", content=ISSUE)])
    backend.reset(seed=0)
    assert backend.complete([Message(role="user", content=ISSUE)], max_new_tokens=2).tokens_generated == 2
