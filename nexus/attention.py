"""`prepare(model)`: route attention through a capture function that drives the `EvictableCache`.

The registered function wraps the model's own kernel (sdpa, eager, flash_attention_2). For an ordinary cache it
is a pass-through. When the keys come from an `EvictableCache` it
  1. builds the mask from the layer's own state (transformers builds one mask for all layers, but layers
     may hold different physical lengths after eviction, and heads may keep different slots),
  2. runs the kernel, so the layer attends to everything it still holds,
  3. then hands the post-RoPE queries to the cache, which records the observation window, lets the policy
     observe, and evicts the layer if its budget says so: eviction always follows the attention.
No `output_attentions` and no `repeat_kv(K)`: policies score from the queries at KV-head granularity.
"""

from __future__ import annotations

import copy
import inspect
import sys
from functools import partial

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

from nexus.cache import ACTIVE_CACHE, EvictableCache

PREFIX = "nexus_"


def _base_kernel(base: str, module: torch.nn.Module):
    if base == "eager":  # eager lives in each modeling file
        return sys.modules[type(module).__module__].eager_attention_forward
    return AttentionInterface._global_mapping[base]


class _KernelView:
    """The module as the wrapped kernel should see it: its config names the base kernel (flash looks it up)."""

    def __init__(self, module: torch.nn.Module, base: str):
        self._module = module
        self.config = copy.copy(module.config)
        self.config._attn_implementation = base

    def __getattr__(self, name):
        return getattr(self._module, name)


def _module_for_kernel(module: torch.nn.Module, base: str):
    if not base.startswith("flash"):
        return module
    view = module.__dict__.get("_nexus_kernel_view")
    if view is None:
        view = _KernelView(module, base)
        module.__dict__["_nexus_kernel_view"] = view
    return view


def _layer_mask(cache: EvictableCache, layer_idx: int, q_len: int, query: torch.Tensor, additive: bool):
    """Mask for `q_len` new queries over the layer's slots: None, [1, 1, q, P] or [B, Hq, q, P] (ragged)."""
    layer = cache.layers[layer_idx]
    total = layer.length
    if not layer.ragged:
        if q_len == 1:
            return None  # a single new token sees every slot the layer holds
        # old slots are all earlier than every new token; the new ones are causal among themselves
        allowed = torch.ones(q_len, total, dtype=torch.bool, device=query.device).tril(total - q_len)
        allowed = allowed.view(1, 1, q_len, total)
    else:
        qpos = torch.arange(layer.n_seen - q_len, layer.n_seen, device=query.device).view(1, 1, -1, 1)
        kpos = layer.positions.unsqueeze(2)  # [B, Hkv, 1, P]
        allowed = (kpos <= qpos) & (kpos >= 0)  # [B, Hkv, q, P]
        allowed = allowed.repeat_interleave(query.shape[1] // allowed.shape[1], dim=1)  # query head -> KV head
    if additive:
        return torch.zeros(allowed.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~allowed, torch.finfo(query.dtype).min
        )
    return allowed


def make_attention(base: str):
    """The attention function registered as `nexus_<base>`."""

    def nexus_attention(module, query, key, value, attention_mask, **kwargs):
        cache = ACTIVE_CACHE.get()
        layer_idx = getattr(module, "layer_idx", None)
        if cache is None or layer_idx is None or not cache.owns(layer_idx, key):
            return _base_kernel(base, module)(
                _module_for_kernel(module, base), query, key, value, attention_mask, **kwargs
            )
        q_len = query.shape[2]
        stacked = not isinstance(cache, EvictableCache)  # a nexus.batch.CacheStack: rows of different lengths
        scaling = kwargs.get("scaling") or module.scaling
        if stacked and base.startswith("flash"):
            out = cache.flash_decode(layer_idx, query, scaling)  # per-row lengths, no mask; None: not here
            if out is not None:
                cache.after_attention(layer_idx, query, scaling)
                return out, None
        needs_mask = q_len > 1 or cache.layers[layer_idx].ragged or stacked
        if base.startswith("flash") and (cache.layers[layer_idx].ragged or stacked):
            # flash kernels take no arbitrary mask: ragged heads and stacked rows go through sdpa with a mask
            kernel, kbase = sdpa_attention_forward, "sdpa"
        else:
            kernel, kbase = _base_kernel(base, module), base
        mask = None
        layer = cache.layers[layer_idx]
        if kbase == "sdpa" and not stacked and not layer.ragged and layer.length == q_len:
            # a prefill from an empty layer: plain causal attention, which sdpa runs without a mask (its fused
            # kernels; an explicit [q, q] mask would send it to the math path and materialise every score)
            needs_mask = False
        if needs_mask and not kbase.startswith("flash"):
            build = cache.layer_mask if stacked else partial(_layer_mask, cache)
            mask = build(layer_idx, q_len, query, additive=(kbase == "eager"))
        out = kernel(_module_for_kernel(module, kbase), query, key, value, mask, **kwargs)
        cache.after_attention(layer_idx, query, scaling)
        return out

    nexus_attention.__name__ = f"{PREFIX}{base}"
    return nexus_attention


def _refuse_padding(module, args, kwargs):
    """Forward pre-hook: an EvictableCache cannot map padded rows onto evicted slots; say so clearly."""
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    mask = kwargs.get("attention_mask")
    if not isinstance(cache, EvictableCache) or mask is None or mask.ndim != 2:
        return None
    feed = kwargs.get("input_ids", args[0] if args else None)
    if feed is None:
        feed = kwargs.get("inputs_embeds")
    # checked on multi-token feeds only: a decode step must not pay a host sync for it
    if feed is not None and feed.shape[1] > 1 and not bool(mask.all()):
        raise ValueError(
            "EvictableCache does not support padded batches (attention_mask has zeros): run sequences of equal "
            "length, or one conversation per cache"
        )
    return None


def prepare(model: torch.nn.Module) -> torch.nn.Module:
    """Install the capture attention on `model` (idempotent; keeps the kernel the model was using)."""
    impl = model.config._attn_implementation or "sdpa"
    if impl.startswith(PREFIX):
        return model
    if impl not in ("sdpa", "eager") and not impl.startswith("flash_attention"):
        raise ValueError(f"nexus.prepare: unsupported attention implementation {impl!r} (use sdpa, eager or flash)")
    name = PREFIX + impl
    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, make_attention(impl))
        mask_fn = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(impl)
        if mask_fn is not None:
            AttentionMaskInterface.register(name, mask_fn)
    model.set_attn_implementation(name)
    if not getattr(model, "_nexus_prepared", False):
        model.register_forward_pre_hook(_refuse_padding, with_kwargs=True)
        model._nexus_prepared = True
    return model


def cache_kwarg(model: torch.nn.Module) -> str:
    """The forward keyword that takes a cache on this transformers release: `cache` or `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
