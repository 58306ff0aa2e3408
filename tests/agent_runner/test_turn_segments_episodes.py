"""Turn segments in real agent turns (issue 47): the hf backend tells its cache what every position holds, under
both protocols, alone and under the batched engine, so ``observation_masking`` and ``candidates: newest_turn`` act
on the agent's own turns; under full context the paper's rule masks the rendered history itself.

Positions are located here from what each turn fed (``TurnTokens``) and the chat template, not from the
segments the backend computed, so a wrong segment shows as a wrong kept set."""

from __future__ import annotations

import json
import re

import pytest
import torch

import nexus
from agent_runner import engine as engine_module
from agent_runner.backends.hf import HFBackend
from agent_runner.engine import DecodeEngine
from agent_runner.model_host import render_chat
from agent_runner.records import Message
from agent_runner.sampling import SamplingConfig
from nexus.candidates import shares
from tests.support.threads import run_together
from tests.tiny_models import tiny_host, tiny_host64

SYSTEM = "You fix bugs in small Python projects. Call one tool per turn. " * 6
TASK = "The parser drops the last field of every row when the line ends with a comma. " * 3
PLACEHOLDER = re.compile(r"Old environment output: \((\d+) lines omitted\)")


def _observation(turn: int) -> str:
    return "Execution output of [view]:\n" + "".join(f"{turn}.{i}: field_{i} = row[{i}]\n" for i in range(4))


def _backend(host, protocol, *, max_new=10, engine=None, temperature=None, **eviction):
    cfg = nexus.EvictionConfig(**{"scope": "prefill_decode", **eviction})
    sampling = SamplingConfig(max_new_tokens=max_new, **({} if temperature is None else {"temperature": temperature}))
    return HFBackend(host, eviction=cfg, protocol=protocol, sampling=sampling, max_context_tokens=65536, engine=engine)


def _episode(backend, turns, seed=0, after=None):
    """``turns`` completions of a scripted conversation (observation ``t`` answers turn ``t``); ``after(t, c)``
    runs after each one. Returns the completions and the messages of the last turn's context."""
    backend.reset(seed=seed)
    msgs = [Message(role="system", content=SYSTEM), Message(role="user", content=TASK)]
    out = []
    for t in range(turns):
        c = backend.complete(msgs)
        out.append(c)
        if after is not None:
            after(t, c)
        if t + 1 < turns:
            msgs = [*msgs, Message(role="assistant", content=c.text), Message(role="user", content=_observation(t))]
    return out, msgs


def _held(cache, layer):
    """Per KV head: the sorted logical positions ``layer`` holds (batch 1)."""
    return [sorted(p for p in head if p >= 0) for head in cache.retained_positions(layer)[0].tolist()]


def _starts(ids, tokenizer, text):
    """Every position where ``text``'s ids begin in ``ids``."""
    needle = tokenizer.encode(text, add_special_tokens=False)
    return [i for i in range(len(ids) - len(needle) + 1) if ids[i : i + len(needle)] == needle]


# --- true eviction: whole old observations leave the one cache ------------------------------------------------


def test_true_eviction_drops_whole_old_observations_and_keeps_everything_else():
    host = tiny_host()
    spans = []  # each observation's message, <|im_start|>user ... <|im_end|>\n: where turn t + 1's feed puts it
    im_start = host.tokenizer.convert_tokens_to_ids("<|im_start|>")

    def check(t, c):
        if t:
            append, keep = c.tokens.append, c.tokens.keep
            opens = [i for i, tok in enumerate(append) if tok == im_start]  # the observation, then the reply header
            spans.append((keep + opens[0], keep + opens[-1]))
        dropped = {p for a, b in spans[:-1] for p in range(a, b)}  # keep_latest=1: all but the newest
        expected = [p for p in range(b.cache.logical_length) if p not in dropped]
        for layer in range(b.cache.num_layers):
            assert _held(b.cache, layer) == [expected] * len(_held(b.cache, layer)), (t, layer)
        assert c.eviction_events == (1 if t >= 2 else 0), t  # one event per turn that has an old observation

    b = _backend(host, "true_eviction", method="observation_masking", keep_latest=1)
    _episode(b, 4, after=check)
    assert len(spans) == 3 and {e.phase for e in b.cache.events} == {"prefill"}  # never while decoding


# --- full context: the paper's rule masks the rendered history ------------------------------------------------


def test_full_context_masks_old_observations_in_the_text_and_the_stored_stream_replays_it(monkeypatch):
    host = tiny_host()
    tok = host.tokenizer
    seen: dict[int, list[torch.Tensor]] = {}

    class Recording(engine_module.TurnDecoder):
        def next_token(self, logits):
            seen.setdefault(turn[0], []).append(logits.detach().clone())
            return super().next_token(logits)

    monkeypatch.setattr("agent_runner.backends.hf.TurnDecoder", Recording)
    turn = [0]
    b = _backend(host, "full_context", method="observation_masking", keep_latest=1)
    stream: list[int] = []  # the stream as a replay rebuilds it from the stored turns alone
    contexts = []

    def rebuild(t, c):
        nonlocal stream
        keep = c.tokens.keep
        context = stream[:keep] + c.tokens.append
        shared = next((i for i, (x, y) in enumerate(zip(stream, context, strict=False)) if x != y), None)
        assert keep == (min(len(stream), len(context)) if shared is None else shared), t  # keep: where they part
        assert c.eviction_events == 0 and not b.cache.events  # the text holds the rule: no KV entry is evicted
        assert c.tokens_appended == len(context) == c.logical_length - c.tokens_generated + 1
        contexts.append(context)
        stream = context + c.tokens.generated[:-1]
        turn[0] += 1

    comps, msgs = _episode(b, 3, after=rebuild)
    last = tok.decode(contexts[-1])
    lines = PLACEHOLDER.findall(last)
    assert len(lines) == 1 and _observation(0) not in last and _observation(1) in last  # only the oldest masked
    masked = [m.model_dump() for m in msgs]
    masked[3]["content"] = f"Old environment output: ({lines[0]} lines omitted)"
    assert contexts[-1] == render_chat(tok, masked)  # what the chat template gives the masked conversation
    assert contexts[1] == render_chat(tok, [m.model_dump() for m in msgs[:4]])  # one observation: none masked
    assert comps[2].tokens.keep < len(contexts[1])  # the newly masked observation is re-fed
    assert [s.kind for s in b.cache.segments].count("masked") == 1
    # the stored stream reproduces each turn: one forward over it gives the logits the turn sampled from
    for t, (c, context) in enumerate(zip(comps, contexts, strict=True)):
        ids = torch.tensor([context + c.tokens.generated[:-1]])
        with torch.no_grad():
            logits = host.model(ids).logits[0, len(context) - 1 :]
        torch.testing.assert_close(logits, torch.cat(seen[t]), atol=1e-4, rtol=0)


def test_the_budgeted_rule_under_full_context_is_kv_level():
    host = tiny_host()
    b = _backend(host, "full_context", method="observation_masking", rule="budget", density=0.5, window=8)
    comps, _ = _episode(b, 3)
    assert PLACEHOLDER.search(host.tokenizer.decode(b.stream)) is None  # no text masking
    assert comps[-1].eviction_events >= 1
    kinds = [s.kind for s in b.cache.segments]
    assert kinds.count("observation") == 2 and "masked" not in kinds  # both observations as they are, in the KV


# --- candidates: newest_turn under full context: each turn of the history compressed on its own -----------


def test_full_context_newest_turn_compresses_each_turn_of_the_history_on_its_own():
    host = tiny_host()
    tok = host.tokenizer
    b = _backend(host, "full_context", method="snapkv", scope="prefill_only", density=0.3, candidates="newest_turn")
    comps, _ = _episode(b, 3)
    c = comps[-1]
    n = c.prompt_tokens
    context = b.stream[:n]
    # turns start at every complete assistant message: the newest turn is the last reply, the last observation
    # and the open header
    bounds = [0, *_starts(context, tok, "<|im_start|>assistant")[:-1], n]
    sizes = [hi - lo for lo, hi in zip(bounds, bounds[1:], strict=False)]
    want = [min(s, share) for s, share in zip(sizes, shares(nexus.prefill_budget(b.eviction, n), sizes), strict=True)]
    for layer in range(b.cache.num_layers):
        for head in _held(b.cache, layer):
            got = [sum(lo <= p < hi for p in head) for lo, hi in zip(bounds, bounds[1:], strict=False)]
            assert got == want, (layer, got, want)


# --- the batched engine: every row carries its own segments ---------------------------------------------------

SETTINGS = [
    pytest.param(dict(method="observation_masking", rule="budget"), id="observation_masking-budget"),
    pytest.param(dict(method="observation_masking", keep_latest=1), id="observation_masking-latest"),
    pytest.param(dict(method="snapkv", candidates="newest_turn"), id="snapkv-newest_turn"),
]


@pytest.mark.parametrize("protocol", ["true_eviction", "full_context"])
@pytest.mark.parametrize("settings", SETTINGS)
def test_batched_rows_equal_each_alone_and_hold_their_budget(settings, protocol):
    host = tiny_host64()
    small = dict(density=0.4, window=8, block_size=8, **settings)
    kinds = ["prompt", "task", "assistant", "observation", "assistant", "observation", "assistant"]
    if protocol == "full_context" and settings.get("keep_latest") == 1:
        kinds[3] = "masked"

    def run(engine=None, seed=0):
        b = _backend(host, protocol, max_new=12 + 4 * seed, engine=engine, temperature=1.0, **small)
        comps, _ = _episode(b, 3, seed=seed)
        assert [s.kind for s in b.cache.segments] == kinds  # set on this row's own cache
        events = [(e.phase, e.logical_length, dict(e.per_layer)) for e in b.cache.events]
        return comps, events, b

    alone = [run(seed=s) for s in range(2)]
    engine = DecodeEngine(host.model, host.device, max_rows=2)
    batched: dict[int, tuple] = {}

    def thread(seed):
        batched[seed] = run(engine, seed)

    errors = run_together(thread, [(s,) for s in range(2)])
    engine.close()
    assert not errors, errors
    for seed, (comps, events, backend) in enumerate(alone):
        b_comps, b_events, _ = batched[seed]
        assert [c.tokens for c in b_comps] == [c.tokens for c in comps], seed
        assert b_events == events, seed
        slack = backend.eviction.slack
        for c in comps:
            assert c.physical_after.max <= c.info.budget + slack, (seed, c.physical_after, c.info.budget)
    assert engine.rows_decoded > engine.steps  # rows really were decoded together


# --- real agent episodes: `nexus-eval episode`, a real container, the tiny model ------------------------------

EPISODE_SETTINGS = {  # a job file's method_params for each new setting
    "observation_masking": {"observation_masking": {"rule": "latest", "keep_latest": 1}},
    "observation_masking-budget": {"observation_masking": {"rule": "budget"}},
    "snapkv-newest_turn": {"snapkv": {"candidates": "newest_turn"}},
}


@pytest.mark.docker
@pytest.mark.parametrize("protocol", ["true_eviction", "full_context"])
@pytest.mark.parametrize("setting", list(EPISODE_SETTINGS))
def test_a_real_episode_runs_under_each_new_setting(docker_ready, tmp_path, setting, protocol):
    from tests.agent_runner.test_episode_cli import _check_invariants, _episode

    ((method, params),) = EPISODE_SETTINGS[setting].items()
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({"methods": [method], "method_params": {method: params}}))  # JSON is YAML
    result = _episode(
        *("--file", str(job), "--model", "tiny", "--protocol", protocol, "--scope", "prefill_decode"),
        *("--max-steps", "3", "--max-new-tokens", "24", "--no-grade", "--seed", "3"),
    )
    assert result["exit_status"] in ("step_limit", "format_error_limit", "submitted")
    ran = result["config"]["episode"]["eviction"]
    assert {**ran, **ran["method_params"]}.items() >= params.items()  # the setting reached the episode
    _check_invariants(result, method, "prefill_decode", protocol)
    turns = [t["completion"] for t in result["turns"]]
    if setting != "observation_masking":  # at the density budget: the later turns evict
        assert all(c["eviction_events"] >= 1 for c in turns[1:])
    elif protocol == "true_eviction":  # the third turn sees two observations: the older one leaves the cache
        assert [c["eviction_events"] for c in turns] == [0, 0, 1]
        assert turns[2]["physical_after"]["max"] < turns[2]["logical_length"]
    else:  # the older one is masked in the text (what the third turn fed, as stored), and nothing is evicted
        assert all(c["eviction_events"] == 0 for c in turns)
        tokens = turns[2]["tokens"]
        fed = tiny_host().tokenizer.decode(tokens["append"])
        assert tokens["keep"] < turns[1]["tokens_appended"] and len(PLACEHOLDER.findall(fed)) == 1


# --- real weights: the agent's own prompt, segmented as the backend segments it ------------------------------


@pytest.mark.slow
def test_observation_masking_on_real_weights_keeps_what_each_rule_says(smollm2_host):
    """smollm2-135m over the agent's second turn (system prompt, task, a call, its observation, a call, its
    observation): the paper rule (keep_latest=1) drops exactly the older observation, every layer and head, and its
    budget is what that leaves; the budgeted rule holds the density budget and, the system prompt and task alone
    being more than that, keeps only the task's newest tokens and the recency window."""
    from agent_runner.chat_segments import ChatMarkers, chat_segments
    from tests.agent_runner.test_real_model import agent_messages

    tok = smollm2_host.tokenizer
    second = [{"role": "assistant", "content": "Now the tests."}, {"role": "user", "content": "Exit code: 1\nFAILED"}]
    ids = render_chat(tok, agent_messages() + second)
    segments = chat_segments(ids, ChatMarkers.of(tok))
    kinds = ["prompt", "task", "assistant", "observation", "assistant", "observation", "assistant"]
    assert [s.kind for s in segments] == kinds
    n, older, task_end = len(ids), segments[3], segments[2].start
    for settings in (dict(keep_latest=1), dict(rule="budget", density=0.2)):
        cfg = nexus.EvictionConfig(method="observation_masking", scope="prefill_decode", **settings)
        cache = nexus.EvictableCache(smollm2_host.model.config, cfg)
        cache.segments = segments
        with torch.no_grad():
            smollm2_host.model(torch.tensor([ids]), **{nexus.cache_kwarg(smollm2_host.model): cache}, use_cache=True)
        if cfg.policy.rule == "latest":
            expected = [p for p in range(n) if not older.start <= p < older.end]
            assert cache.budget(0) == len(expected)
        else:
            base = nexus.prefill_budget(cfg, n)
            window = list(range(n - cfg.window, n))  # forced, as by every method
            expected = list(range(task_end - (base - cfg.window), task_end)) + window  # the rest: the task's newest
            assert expected[0] > segments[1].start
        for layer in range(cache.num_layers):
            assert all(head == expected for head in _held(cache, layer)), (settings, layer)
