"""Tiny random Qwen3 models: the real architecture, random weights, CPU."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

import nexus


def tiny_qwen3(dtype=torch.float32, layers=3, seed=0, attn="sdpa", vocab=1000) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        initializer_range=0.2,
        attn_implementation=attn,
    )
    model = Qwen3ForCausalLM(cfg).eval().to(dtype)
    return nexus.prepare(model)


@pytest.fixture(scope="module")
def model32():
    return tiny_qwen3(torch.float32)


@pytest.fixture(scope="module")
def model64():
    return tiny_qwen3(torch.float64)
