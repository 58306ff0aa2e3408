"""Text trajectories rendered into a model's stream (agent_runner.chat_stream) and scored span by span
(measure.action_scores): the rendering is the hf backend's own, and the scores mean what they say."""

from __future__ import annotations

import pytest
import torch

import nexus
from agent_runner.backends.hf import HFBackend
from agent_runner.chat_stream import RenderError, render_trajectory
from agent_runner.records import Message
from measure.action_scores import plan_spans, summarize
from measure.counterfactual import contexts, model_forward, replay_episode
from measure.replay_cells import replay_cells
from tests import tiny_models

FILE = [
    "def add(a, b):",
    '    """Add two numbers."""',
    "    return a + b + 1",
    "",
    "",
    "def sub(a, b):",
    "    return a - b",
]
VIEW = "Here's the result of running `cat -n` on the file: /testbed/calc.py:\n" + "\n".join(
    f"{i + 1:6d} {line}" for i, line in enumerate(FILE)
)
FILLER = "Execution output of [execute_bash]:\n" + "\n".join(f"line {i}: nothing to see here" for i in range(40))


def call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in params.items())
    return f"<think>\nNext step.\n</think>\n\n<function={name}>\n{body}</function>"


def conversation(*, filler: int = 1) -> list[Message]:
    """View a file, run something (``filler`` times), then a str_replace copying 2 lines of the view."""
    msgs = [
        Message(role="system", content="You are a careful programmer. Use the tools."),
        Message(role="user", content="add() is off by one. Fix it in /testbed/calc.py."),
        Message(role="assistant", content=call("file_editor", command="view", path="/testbed/calc.py")),
        Message(role="user", content=VIEW),
    ]
    for _ in range(filler):
        msgs += [
            Message(role="assistant", content=call("execute_bash", cmd="python -m pytest -q")),
            Message(role="user", content=FILLER),
        ]
    edit = call(
        "file_editor",
        command="str_replace",
        path="/testbed/calc.py",
        old_str='"""Add two numbers."""\n    return a + b + 1',
        new_str='"""Add two numbers."""\n    return a + b',
    )
    return [*msgs, Message(role="assistant", content=edit)]


@pytest.fixture(scope="module")
def tiny_host():
    return tiny_models.tiny_host()


def _backend_turns(host, messages: list[Message], protocol: str):
    backend = HFBackend(host, eviction=nexus.EvictionConfig(method="dense"), protocol=protocol, max_context_tokens=8192)
    backend.reset(seed=0)
    turns = []
    for t, m in enumerate(messages):
        if m.role == "assistant":
            turns.append(backend.complete(messages[:t], forced_text=m.content).tokens)
    return turns


@pytest.mark.parametrize("protocol", ["true_eviction", "full_context"])
def test_a_rendered_trajectory_is_the_hf_backends_own_stream_qwen3_template(tiny_host, protocol):
    """Qwen3's template drops earlier <think> blocks on re-rendering: full_context keeps differ from the stream."""
    messages = conversation()
    rendered = render_trajectory(tiny_host.tokenizer, messages, protocol)
    assert rendered.turns == _backend_turns(tiny_host, messages, protocol)
    ctxs = contexts(rendered.turns)
    streams = [len(c) + len(t.generated) - 1 for c, t in zip(ctxs, rendered.turns, strict=True)]
    rerendered = [t.keep < n for t, n in zip(rendered.turns[1:], streams, strict=False)]
    assert any(rerendered) == (protocol == "full_context")


@pytest.mark.parametrize("protocol", ["true_eviction", "full_context"])
def test_rendered_layout_points_at_each_message_and_each_generated_token(tiny_host, protocol):
    tok = tiny_host.tokenizer
    messages = conversation()
    rendered = render_trajectory(tok, messages, protocol)
    ctxs = contexts(rendered.turns)
    users = [m.content for m in messages if m.role == "user"]
    for t, layout in enumerate(rendered.layouts):
        assert layout.context == len(ctxs[t]) and sorted(layout.messages) == list(range(t + 1))
        for i, (start, end) in layout.messages.items():
            assert tok.decode(ctxs[t][start:end]) == users[i]
        text = rendered.assistant[t]
        assert "".join(text[a:b] for a, b in layout.offsets) == text
        assert len(layout.offsets) == len(rendered.turns[t].generated) - 1  # the closing <|im_end|> has none
    # a character range of a message maps to the tokens covering it
    line = "    return a + b + 1"
    start = VIEW.index(line)
    first, last = rendered.layouts[-1].positions(1, start, start + len(line))
    assert line in tok.decode(ctxs[-1][first:last])


def test_render_refuses_what_it_cannot_render(tiny_host):
    with pytest.raises(RenderError, match="system and a user"):
        render_trajectory(tiny_host.tokenizer, conversation()[1:], "true_eviction")
    messages = conversation()
    with pytest.raises(RenderError, match="alternate"):
        render_trajectory(tiny_host.tokenizer, [*messages[:3], messages[2]], "true_eviction")
    cut = render_trajectory(tiny_host.tokenizer, messages, "true_eviction", max_positions=200)
    assert cut.cut >= 1 and len(cut.turns) == 3 - cut.cut


@pytest.mark.slow
def test_real_model_stream_is_the_hf_backends_and_scores_mean_what_they_say(smollm2_host):
    """On SmolLM2: the rendering equals the backend's; dense replays score identically under both protocols and
    against themselves; a cache that keeps everything (a budget past the stream) scores as dense; a cache that
    kept none of the copied source (StreamingLLM, a few tokens) holds 0% of it and predicts the copy worse."""
    torch.manual_seed(0)
    host = smollm2_host
    messages = conversation(filler=1)
    forward = model_forward(host.model, host.device)
    scores = {}
    for protocol in ("true_eviction", "full_context"):
        rendered = render_trajectory(host.tokenizer, messages, protocol)
        assert rendered.turns == _backend_turns(host, messages, protocol)
        plans = plan_spans(rendered)
        copies = [p for p in plans[-1] if p.span.kind == "copy"]
        assert [p.span.param for p in copies][:2] == ["path", "old_str"] and all(p.source for p in copies)
        dense = nexus.EvictionConfig(method="dense")
        everything = nexus.EvictionConfig(method="snapkv", budget_tokens=1_000_000)  # a budget past the stream
        nothing = nexus.EvictionConfig(method="streaming_llm", budget_tokens=24)
        for name, eviction in (("dense", dense), ("all", everything), ("none", nothing)):
            scores[protocol, name] = replay_episode(
                forward, host.model.config, rendered.turns, eviction, protocol, actions=plans
            )
        again = replay_episode(forward, host.model.config, rendered.turns, dense, protocol, actions=plans)
        assert again.action == scores[protocol, "dense"].action

    def same(a, b) -> bool:  # equal up to the float rounding of a chunked vs a whole prefill
        return [(s.kind, s.top1, s.exact, s.held_mean) for s in a] == [
            (s.kind, s.top1, s.exact, s.held_mean) for s in b
        ] and all(abs(x.nll - y.nll) < 1e-3 for x, y in zip(a, b, strict=True) if x.nll is not None)

    base = scores["true_eviction", "dense"].turns[-1].spans
    assert same(scores["full_context", "dense"].turns[-1].spans, base)  # SmolLM2 re-renders the history unchanged
    old_str = next(s for s in base if s.kind == "copy" and s.param == "old_str")
    assert old_str.held_mean == 1.0 and old_str.back > 0 and old_str.source == 1
    for protocol in ("true_eviction", "full_context"):
        assert same(scores[protocol, "all"].turns[-1].spans, base)
        lost = next(s for s in scores[protocol, "none"].turns[-1].spans if s.kind == "copy" and s.param == "old_str")
        assert lost.held_mean == 0.0
        assert lost.nll > old_str.nll and lost.top1 <= old_str.top1
        summary = summarize(scores[protocol, "none"].turns[-1].spans)
        assert summary.copy_held == 0.0 and summary.spans["copy"] == len(copies)


def test_full_context_with_a_shared_prefill_scores_exactly_as_one_replay_per_method(tiny_host):
    rendered = render_trajectory(tiny_host.tokenizer, conversation(filler=2), "full_context")
    plans = plan_spans(rendered)
    forward = model_forward(tiny_host.model, tiny_host.device)
    evictions = [
        nexus.EvictionConfig(method="dense"),
        nexus.EvictionConfig(method="snapkv", density=0.2),
        nexus.EvictionConfig(method="nexus", density=0.2, scope="prefill_decode"),
        nexus.EvictionConfig(method="streaming_llm", density=0.2),
    ]
    shared = replay_cells(tiny_host.model, rendered.turns, evictions, "full_context", actions=plans)
    for eviction, got in zip(evictions, shared, strict=True):
        alone = replay_episode(forward, tiny_host.model.config, rendered.turns, eviction, "full_context", actions=plans)
        assert got.nll_mean == pytest.approx(alone.nll_mean, abs=1e-5) and got.top1 == alone.top1
        for a, b in zip(got.turns, alone.turns, strict=True):  # equal up to float rounding (the prefix is reused)
            assert [(x.kind, x.top1, x.exact, x.held) for x in a.spans] == [
                (x.kind, x.top1, x.exact, x.held) for x in b.spans
            ]
            assert all(abs(x.nll - y.nll) < 1e-4 for x, y in zip(a.spans, b.spans, strict=True) if x.nll is not None)
