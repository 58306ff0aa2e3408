"""Dense under each protocol: the planning check of ``agent_runner.dense_reuse`` on real templates, and the plan.

Qwen3's template (the ``tiny`` preset's, DeepSWE's) drops an earlier turn's ``<think>`` block when it re-renders a
history, so dense under full context is not dense under true eviction: planning runs dense under each protocol. A
template that renders a history as true eviction holds it (a minimal ChatML one) lets one dense episode stand for
both.
"""

from __future__ import annotations

import pytest

from agent_runner.chat_stream import ChatStream
from agent_runner.config import ModelSpec
from agent_runner.dense_reuse import (
    CHECK_CONVERSATION,
    dense_rendering,
    full_context_stream,
    history_renders_alike,
    true_eviction_stream,
)
from agent_runner.records import Message
from agent_runner.tokenizers import load_tokenizer
from jobs.spec import JobSpec
from jobs.submit import plan_job

# ChatML with nothing dropped: every message's content verbatim
MINIMAL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PROTOCOLS = ["true_eviction", "full_context"]


@pytest.fixture(scope="module")
def qwen3():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def minimal_model(tmp_path_factory):
    """A local tokenizer folder: the Qwen3 tokenizer with the minimal template (a model name planning can load)."""
    tokenizer = load_tokenizer("tiny")
    tokenizer.chat_template = MINIMAL_TEMPLATE
    folder = tmp_path_factory.mktemp("minimal-template")
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_true_eviction_stream_is_what_the_hf_backend_holds(qwen3):
    """The check's true-eviction stream is ChatStream's, fed as the hf backend feeds it."""
    messages = list(CHECK_CONVERSATION)
    chat = ChatStream(qwen3)
    chat.feed(messages[:2], fresh=True)
    text = messages[2].content
    chat.generated(qwen3.encode(text, add_special_tokens=False) + [chat.im_end], text, 2)
    feed, _, keep = chat.feed(messages, fresh=False)
    assert true_eviction_stream(qwen3, messages) == chat.stream and chat.stream[keep:] == feed
    assert "<think>" in qwen3.decode(chat.stream)


def test_qwen3_template_drops_the_think_block_so_the_protocols_differ(qwen3):
    messages = list(CHECK_CONVERSATION)
    full = qwen3.decode(full_context_stream(qwen3, messages))
    assert "<think>" not in full and "Let me read the file." in full  # the re-rendered history lost its reasoning
    assert not history_renders_alike(qwen3)
    assert dense_rendering("hf", ModelSpec()) == "differs"


def test_a_template_that_renders_alike_is_identical(qwen3, minimal_model):
    tokenizer = load_tokenizer(minimal_model)
    assert history_renders_alike(tokenizer)
    assert dense_rendering("hf", ModelSpec(name=minimal_model)) == "identical"
    # the check is only as good as its conversation: without a reasoning block Qwen3's template renders alike too
    plain = [*CHECK_CONVERSATION[:2], Message(role="assistant", content="Let me read it."), CHECK_CONVERSATION[3]]
    assert history_renders_alike(qwen3, plain)


def test_backends_without_a_template():
    assert dense_rendering("oracle") == dense_rendering("expert") == "no_model"  # no model: reuse is exact
    assert dense_rendering("openai") == "unknown"  # the server renders the history, unseen: dense per protocol
    assert dense_rendering("hf", ModelSpec(name="/no/such/model/folder")) == "unknown"


def _dense_protocols(model: dict, backend: str = "hf", **extra) -> tuple[JobSpec, list[tuple[str, str]]]:
    spec = JobSpec.from_dict(
        {
            "backend": backend,
            "model": model,
            "methods": ["dense", "snapkv"],
            "scopes": ["prefill_only", "prefill_decode"],
            "protocols": PROTOCOLS,
            "tasks": {"suite": "mini"},
            **extra,
        }
    )
    plan = plan_job(spec, [type("T", (), {"instance_id": "humanfmt__humanfmt-1"})()])
    return plan.spec, [(k.scope, k.protocol) for k in plan.keys if k.method == "dense"]


def test_planning_with_the_qwen3_template_runs_dense_under_both_protocols():
    spec, dense = _dense_protocols({"name": "tiny", "device": "cpu"})
    assert dense == [("prefill_only", "true_eviction"), ("prefill_only", "full_context")]
    assert spec.dense_rendering == "differs"  # stored with the job: compare says why
    assert JobSpec.model_validate(spec.model_dump(mode="json")) == spec  # a stored job reloads as planned


def test_planning_with_a_template_that_renders_alike_reuses_one_dense(minimal_model):
    spec, dense = _dense_protocols({"name": minimal_model})
    assert dense == [("prefill_only", "true_eviction")] and spec.dense_rendering == "identical"
    oracle, dense = _dense_protocols({"name": "tiny"}, backend="oracle")
    assert dense == [("prefill_only", "true_eviction")] and oracle.dense_rendering == "no_model"
    openai, dense = _dense_protocols({"name": "tiny"}, backend="openai", openai={"model": "m"}, methods=["dense"])
    assert dense == [("prefill_only", "true_eviction"), ("prefill_only", "full_context")]
    # dense_per_cell keeps its meaning: every scope x protocol cell, nothing to check
    per_cell, dense = _dense_protocols({"name": minimal_model}, dense_per_cell=True)
    assert len(dense) == 4 and per_cell.dense_rendering is None


def test_a_value_in_the_file_is_replaced_by_planning():
    spec, dense = _dense_protocols({"name": "tiny", "device": "cpu"}, dense_rendering="identical")
    assert spec.dense_rendering == "differs" and len(dense) == 2


def test_smollm2s_template_renders_alike():
    """SmolLM2's ChatML template keeps every message verbatim: its jobs reuse one dense (when it is set up)."""
    from agent_runner.config import SMOLLM2
    from agent_runner.real_models import is_ready

    if not is_ready(SMOLLM2):
        pytest.skip("smollm2-135m is not set up here (`nexus-eval setup`)")
    assert dense_rendering("hf", ModelSpec(name=SMOLLM2)) == "identical"
