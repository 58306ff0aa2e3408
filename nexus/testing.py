"""The invariant the project stands on, as a reusable check.

After any eviction, the logits a model produces through an `EvictableCache` must equal one full forward
over the whole stream in which each query sees exactly what the cache held when that query was fed:
the (layer, KV head, position) entries retained after the previous forward, plus its own chunk, causally.

`StreamRecorder` feeds chunks through the cache and snapshots `retained_positions` after every forward;
`masked_reference_logits` recomputes everything with plain math attention and per-layer, per-head masks.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv

from nexus.attention import cache_kwarg
from nexus.cache import EvictableCache

_REFERENCE_MASKS: contextvars.ContextVar[list[torch.Tensor] | None] = contextvars.ContextVar(
    "nexus_reference_masks", default=None
)


def _reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Math attention with the boolean mask [B, Hq, T, T] of this layer; no kernel, no cache."""
    allowed = _REFERENCE_MASKS.get()[module.layer_idx]
    g = query.shape[1] // key.shape[1]
    k, v = repeat_kv(key, g), repeat_kv(value, g)
    scores = torch.matmul(query, k.transpose(2, 3)) * (scaling or module.scaling)
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v).transpose(1, 2).contiguous(), probs


AttentionInterface.register("nexus_reference", _reference_attention)


@dataclass
class StreamRecorder:
    """Feeds a stream through `cache` in chunks and remembers what each chunk could see."""

    model: torch.nn.Module
    cache: EvictableCache
    chunks: list[torch.Tensor] = field(default_factory=list)  # [B, q] token ids per forward
    seen_before: list[list[torch.Tensor]] = field(default_factory=list)  # per forward: per layer [B, Hkv, P]
    logits: list[torch.Tensor] = field(default_factory=list)

    def feed(self, ids: torch.Tensor) -> torch.Tensor:
        self.seen_before.append([self.cache.retained_positions(i) for i in range(self.cache.num_layers)])
        with torch.no_grad():
            out = self.model(input_ids=ids, **{cache_kwarg(self.model): self.cache}, use_cache=True).logits
        self.chunks.append(ids)
        self.logits.append(out)
        return out


def masked_reference_logits(model: torch.nn.Module, rec: StreamRecorder) -> torch.Tensor:
    """[B, T, V] logits of one full forward over the recorded stream with the cache's visibility."""
    ids = torch.cat(rec.chunks, dim=1)
    b, t = ids.shape
    cfg = model.config.get_text_config()
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    masks = []
    for layer in range(cfg.num_hidden_layers):
        allowed = torch.zeros(b, hkv, t, t, dtype=torch.bool)
        start = 0
        for chunk, seen in zip(rec.chunks, rec.seen_before, strict=True):
            q = chunk.shape[1]
            rows = slice(start, start + q)
            # the chunk itself, causally
            allowed[:, :, rows, start : start + q] = torch.ones(q, q, dtype=torch.bool).tril()
            # what the cache retained before this forward (per head; -1 = empty slot)
            pos = seen[layer].cpu()
            if pos.numel():
                held = torch.zeros(b, hkv, t + 1, dtype=torch.bool)  # column t collects the -1 empties
                held.scatter_(-1, pos.masked_fill(pos < 0, t), True)
                allowed[:, :, rows, :t] |= held[:, :, None, :t]
            start += q
        masks.append(allowed.repeat_interleave(hq // hkv, dim=1).to(ids.device))
    old = model.config._attn_implementation
    token = _REFERENCE_MASKS.set(masks)
    try:
        model.set_attn_implementation("nexus_reference")
        with torch.no_grad():
            return model(input_ids=ids, use_cache=False).logits
    finally:
        _REFERENCE_MASKS.reset(token)
        model.set_attn_implementation(old)
