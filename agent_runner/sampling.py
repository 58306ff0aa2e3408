"""Seeded next-token sampling: temperature, top-k, top-p (nucleus). Greedy when temperature == 0."""

from __future__ import annotations

import torch

from agent_runner.config import SamplingConfig


def sample_next(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator) -> torch.Tensor:
    """logits [B, V] -> token ids [B] (int64). Filtering in fp32; the draw uses `generator` only."""
    if cfg.temperature == 0.0:
        return logits.argmax(dim=-1)
    scores = logits.float() / cfg.temperature
    if cfg.top_k:
        kth = scores.topk(min(cfg.top_k, scores.shape[-1]), dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        probs = sorted_scores.softmax(dim=-1)
        # drop a token when the mass strictly before it already reaches top_p (the first token always stays)
        drop = probs.cumsum(dim=-1) - probs >= cfg.top_p
        scores = scores.scatter(-1, order, sorted_scores.masked_fill(drop, float("-inf")))
    probs = scores.softmax(dim=-1)
    # draw on the CPU generator's device: torch.multinomial needs the generator where the tensor lives
    return torch.multinomial(probs.to(generator.device), 1, generator=generator).view(-1).to(logits.device)
