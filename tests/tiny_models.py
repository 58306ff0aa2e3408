"""The tiny random Qwen3 the tests run on, built in one place.

`tiny_qwen3` is the bare model the nexus tests drive directly (a 1000-token vocabulary, no tokenizer);
`tiny_host` and `tiny_host64` are the ``tiny`` preset as a worker hosts it (``agent_runner.model_host.load_host``),
loaded once per distinct spec and shared by every test module that asks for it: building the 152K-token
embedding and its tokenizer costs seconds, which a dozen modules used to pay each. A shared host is read-only
by contract: a test that changes its model, config or tokenizer loads its own with ``load_host``.
"""

from __future__ import annotations

import functools

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

import nexus
from agent_runner.config import ModelSpec
from agent_runner.model_host import TINY_SHAPE, ModelHost, load_host


def tiny_qwen3(dtype=torch.float32, layers=3, seed=0, attn="sdpa", vocab=1000) -> Qwen3ForCausalLM:
    """A prepared random Qwen3 (the real architecture, 64-wide). Seeds torch's global RNG with ``seed`` (the
    nexus tests' numbers were drawn after it, so it stays a plain ``manual_seed``, not a forked one)."""
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        **TINY_SHAPE, vocab_size=vocab, num_hidden_layers=layers, initializer_range=0.2, attn_implementation=attn
    )
    model = Qwen3ForCausalLM(cfg).eval().to(dtype)
    return nexus.prepare(model)


def _spec_key(spec_fields: dict) -> str:
    """Equal specs share a host however they were spelled (``weights_seed=0`` is the default, for one)."""
    return ModelSpec(name="tiny", **spec_fields).model_dump_json()


@functools.cache
def _load(spec_json: str, float64: bool) -> ModelHost:
    host = load_host(ModelSpec.model_validate_json(spec_json))
    if float64:
        host.model.to(torch.float64)
    return host


def tiny_host(**spec_fields) -> ModelHost:
    """``load_host(ModelSpec(name="tiny", **spec_fields))``, loaded once per distinct spec for the whole session."""
    return _load(_spec_key(spec_fields), False)


def tiny_host64(**spec_fields) -> ModelHost:
    """The same tiny host with its model in float64 (the exactness tests compare to 1e-9): its own cached copy,
    never the float32 one converted under another module's feet."""
    return _load(_spec_key(spec_fields), True)
