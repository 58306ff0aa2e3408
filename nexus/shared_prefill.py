"""One prefill, many eviction policies: record a dense prefill once, then build each method's cache from it.

Why this is exact. Eviction runs after a layer has attended (``nexus.attention`` calls
``EvictableCache.after_attention`` once the layer's output exists), so during a prefill from an empty cache
no layer's output depends on what any layer evicts: every method's prefill computes the same hidden
states, logits, keys, values and queries as dense. Only what each layer *keeps* differs, and that is a
function of the layer's keys/values, its queries and the method's settings. So recording one dense
prefill (per layer: the post-RoPE queries, keys, values and the softmax scaling) and replaying the cache's
``update`` + ``after_attention`` calls into a fresh ``EvictableCache`` gives the cache a real prefill with
that method would leave, without running the model again (``tests/nexus/test_shared_prefill.py`` checks
retained positions, buffers and the following decode logits against real prefills for every method).

Quality probes (``agent_runner.probes``) use it to pay one model forward per sample instead of one per
method x scope x density cell.

    recorded = record_prefill(model, input_ids)        # one forward; recorded.logits: [B, T, V]
    cache = recorded.cache_for(EvictionConfig(method="snapkv", density=0.2))
    model(next_ids, **{cache_kwarg(model): cache})     # carries on as if the prefill had run with snapkv
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nexus.attention import cache_kwarg
from nexus.cache import EvictableCache
from nexus.config import EvictionConfig


class _RecordingCache(EvictableCache):
    """A dense EvictableCache that also keeps each layer's queries and scaling of the one forward it sees."""

    def __init__(self, model_config):
        super().__init__(model_config, EvictionConfig(method="dense"))
        self.queries: dict[int, tuple[torch.Tensor, float]] = {}

    def after_attention(self, layer_idx, query, scaling, queries_recorded=False) -> None:
        self.queries[layer_idx] = (query, float(scaling))
        super().after_attention(layer_idx, query, scaling, queries_recorded)


@dataclass
class RecordedPrefill:
    """A dense prefill from an empty cache: per layer (queries [B, Hq, T, D], keys / values [B, Hkv, T, D],
    scaling), the model config and the prefill's logits [B, T, V]."""

    model_config: object
    layers: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]]
    logits: torch.Tensor

    @property
    def length(self) -> int:
        return self.layers[0][1].shape[2]

    def cache_for(self, config: EvictionConfig) -> EvictableCache:
        """The cache a prefill of the same ids with `config` leaves (see the module docstring)."""
        cache = EvictableCache(self.model_config, config)
        for layer_idx, (queries, keys, values, scaling) in enumerate(self.layers):
            cache.update(keys, values, layer_idx)
            cache.after_attention(layer_idx, queries, scaling)
        return cache


@torch.no_grad()
def record_prefill(model: torch.nn.Module, input_ids: torch.Tensor) -> RecordedPrefill:
    """Run one dense prefill of `input_ids` [B, T] (the model `nexus.prepare`d) and record it."""
    recorder = _RecordingCache(model.config)
    out = model(input_ids=input_ids, use_cache=True, **{cache_kwarg(model): recorder})
    if len(recorder.queries) != recorder.num_layers:
        raise ValueError(
            f"recorded {len(recorder.queries)} of {recorder.num_layers} layers: is the model nexus.prepare()d?"
        )
    layers = []
    for layer_idx, layer in enumerate(recorder.layers):
        queries, scaling = recorder.queries[layer_idx]
        layers.append((queries, layer.keys.clone(), layer.values.clone(), scaling))
    return RecordedPrefill(model_config=model.config, layers=layers, logits=out.logits)
