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

What is shared between the caches built from one recording. A policy that ``observes`` (H2O: the attention
every query row pays each key, summed) keeps state on the layer that, after a prefill from an empty cache has
been observed, is a function of the recording (keys, queries, positions, scaling) and of the policy object and
the ``window`` / ``block_size`` its view carries, but not of density, budget or scope: the layer's budget is
set only after the observation, and eviction reads the state without having shaped it. So the first cache of
an equal policy observes and the recording keeps a copy of each layer's state taken right after the
observation (``observed``, keyed by (policy, window, block_size, layer)); every later one starts from a copy of
it instead of observing again (``EvictableCache.after_attention(observed=...)``). The state is the same
tensors, so this is exact; eviction then runs as before on each cache's own copy.

What is shared between turns. ``record_prefill(reuse=earlier)`` whose new ids start with all of ``earlier``'s
inherits ``earlier.observed``. For a policy whose observation adds up over query rows (``observe_additive``:
H2O), the new recording's state starts from the earlier one and observes only the new rows against every key:
under causal attention the prefix rows never see a later key and their attention over the prefix keys is the
one already summed, so this is the same sum in another order (equal up to float rounding; tested against whole
prefills). Any other observing policy observes every row again. An inherited state is dropped once used and
the new recording's own states are what the next turn inherits, so memory holds at most two turns' states.

Quality probes (``measure.probes``) use it to pay one model forward per sample instead of one per
method x scope x density cell; the full-context replay (``measure.counterfactual``) records each turn's
prefill once for every method, extending the previous turn's recording (``reuse``) instead of recomputing the
history it starts with.

    recorded = record_prefill(model, input_ids)        # one forward; recorded.logits: [B, T, V]
    cache = recorded.cache_for(EvictionConfig(method="snapkv", density=0.2))
    model(next_ids, **{cache_kwarg(model): cache})     # carries on as if the prefill had run with snapkv
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from nexus.attention import cache_kwarg
from nexus.cache import EvictableCache
from nexus.config import EvictionConfig
from nexus.segments import Segment


class _RecordingCache(EvictableCache):
    """A dense EvictableCache that also keeps each layer's queries and scaling of the one forward it sees."""

    def __init__(self, model_config):
        super().__init__(model_config, EvictionConfig(method="dense"))
        self.queries: dict[int, tuple[torch.Tensor, float]] = {}

    def after_attention(self, layer_idx, query, scaling, queries_recorded=False, **kwargs) -> None:
        self.queries[layer_idx] = (query, float(scaling))
        super().after_attention(layer_idx, query, scaling, queries_recorded, **kwargs)


#: (policy, window, block_size, layer index): what an observing policy's state after a prefill depends on
ObservedKey = tuple[Any, int, int, int]


@dataclass
class RecordedPrefill:
    """A dense prefill from an empty cache: per layer (queries [B, Hq, T, D], keys / values [B, Hkv, T, D],
    scaling), the model config and the prefill's logits [B, T, V].

    observed:  observing policies' layer states right after observing this whole prefill, filled by `cache_for`
               (see the module docstring); each cache gets a copy.
    inherited: the `observed` of the earlier recording this one extends, covering its first `inherited_rows`
               positions; an entry is dropped once this recording has built its own."""

    model_config: object
    layers: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]]
    logits: torch.Tensor
    ids: torch.Tensor | None = None  # [B, T] the ids recorded (what a later ``record_prefill(reuse=...)`` extends)
    observed: dict[ObservedKey, dict[str, Any]] = field(default_factory=dict, repr=False, compare=False)
    inherited: dict[ObservedKey, dict[str, Any]] = field(default_factory=dict, repr=False, compare=False)
    inherited_rows: int = 0

    @property
    def length(self) -> int:
        return self.layers[0][1].shape[2]

    def cache_for(self, config: EvictionConfig, segments: Sequence[Segment] = ()) -> EvictableCache:
        """The cache a prefill of the same ids with `config` leaves (see the module docstring), told the stream's
        `segments` (``nexus.segments``) before it, as a host sets them before a real prefill."""
        cache = EvictableCache(self.model_config, config)
        cache.segments = segments  # before the replayed `after_attention` calls: their events read them
        policy = config.policy
        shared = policy.evicts and policy.observes and _hashable(policy)
        for layer_idx, (queries, keys, values, scaling) in enumerate(self.layers):
            cache.update(keys, values, layer_idx)
            if not shared:
                cache.after_attention(layer_idx, queries, scaling)
                continue
            key = (policy, config.window, config.block_size, layer_idx)
            if key in self.observed:  # an equal policy observed this layer already
                cache.after_attention(layer_idx, queries, scaling, observed=copy.deepcopy(self.observed[key]))
                continue
            kw: dict[str, Any] = {"on_observed": self._keeper(key)}
            earlier = self.inherited.pop(key, None)
            if earlier is not None and policy.observe_additive:  # observe the rows after the earlier recording's
                kw.update(observed=copy.deepcopy(earlier), observed_rows=self.inherited_rows)
            cache.after_attention(layer_idx, queries, scaling, **kw)
        return cache

    def _keeper(self, key: ObservedKey):
        def keep(state: dict[str, Any]) -> None:
            self.observed[key] = copy.deepcopy(state)  # eviction goes on to gather the cache's own state

        return keep


def _hashable(policy) -> bool:
    try:
        hash(policy)
    except TypeError:
        return False
    return True


def shared_prefix(recorded: RecordedPrefill | None, input_ids: torch.Tensor) -> int:
    """How many leading ids of `input_ids` [B, T] `recorded` holds (0 without a recording of its ids)."""
    if recorded is None or recorded.ids is None or recorded.ids.shape[0] != input_ids.shape[0]:
        return 0
    n = min(recorded.ids.shape[1], input_ids.shape[1])
    same = (recorded.ids[:, :n] == input_ids[:, :n]).all(dim=0)
    return n if bool(same.all()) else int(same.long().argmin())


@torch.no_grad()
def record_prefill(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    *,
    logits_to_keep: int = 0,
    reuse: RecordedPrefill | None = None,
) -> RecordedPrefill:
    """Run one dense prefill of `input_ids` [B, T] (the model `nexus.prepare`d) and record it. `logits_to_keep`: as
    transformers reads it (0: the logits of every position; 1: the last position's only, [B, 1, V]).

    `reuse`: an earlier recording whose ids start `input_ids` (a conversation re-prefilled one turn later). Under
    causal attention a position's query, key and value depend on the positions before it only, so the shared
    prefix's are taken from `reuse` and only the rest is computed, on top of a dense cache holding the prefix:
    the same tensors as a whole prefill, up to float rounding (a prefix's matmuls run in other shapes). Its
    `logits` then cover the new positions only, so `logits_to_keep` must be 1 (at least one id must be new). When
    every id of `reuse` is shared, the new recording inherits the policy states `reuse` observed (its `observed`)
    and extends the additive ones by the new query rows only (see the module docstring)."""
    keep = shared_prefix(reuse, input_ids)
    if keep and (logits_to_keep != 1 or keep == input_ids.shape[1]):
        keep = 0  # all logits asked for, or nothing new to run: a whole prefill
    recorder = _RecordingCache(model.config)
    for layer_idx, (_, keys, values, _) in enumerate(reuse.layers if keep else ()):
        recorder.update(keys[:, :, :keep], values[:, :, :keep], layer_idx)  # dense: holds every prefix position
    kw = {cache_kwarg(model): recorder}
    out = model(input_ids=input_ids[:, keep:], use_cache=True, logits_to_keep=logits_to_keep, **kw)
    if len(recorder.queries) != recorder.num_layers:
        raise ValueError(
            f"recorded {len(recorder.queries)} of {recorder.num_layers} layers: is the model nexus.prepare()d?"
        )
    layers = []
    for layer_idx, layer in enumerate(recorder.layers):
        queries, scaling = recorder.queries[layer_idx]
        if keep:
            queries = torch.cat([reuse.layers[layer_idx][0][:, :, :keep], queries], dim=2)
        layers.append((queries, layer.keys.clone(), layer.values.clone(), scaling))
    # the earlier states cover its whole length: usable only when every earlier position is shared
    inherited = dict(reuse.observed) if keep and keep == reuse.length else {}
    return RecordedPrefill(
        model_config=model.config,
        layers=layers,
        logits=out.logits,
        ids=input_ids.clone(),
        inherited=inherited,
        inherited_rows=keep if inherited else 0,
    )
