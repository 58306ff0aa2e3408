"""`EvictableCache`: a transformers `Cache` whose layers can forget tokens and keep true positions.

The per-layer buffers (keys, values, logical positions, the query window) are `nexus.layer_buffers.EvictableLayer`;
this module holds the cache over them and its eviction: when a layer's budget says so, the policy picks the slots
to keep and the layer keeps them, and every eviction is recorded as an `EvictionEvent`.

Memory (`nexus.memory`): every layer reports its held entries and the capacity of its buffers to the cache's
`KVMeter` after each append and each eviction, so `EvictableCache.memory()` gives the bytes held, the bytes
allocated and both peaks without touching a tensor.

Eviction itself is triggered from the attention function (`nexus.attention`), after the layer attended,
so what the cache reports after a forward is exactly what the next forward sees.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import Cache

from nexus.budget import appends_before_decode_event, prefill_budget, should_evict
from nexus.candidates import select_newest_turn
from nexus.config import EvictionConfig
from nexus.layer_buffers import EvictableLayer
from nexus.memory import KVMemory, KVMeter
from nexus.policies.base import LayerView
from nexus.policies.reservoir import event_generator
from nexus.segments import Segment, check_segments

#: the EvictableCache whose `update` ran last in this context; the attention function reads it
ACTIVE_CACHE: contextvars.ContextVar[EvictableCache | None] = contextvars.ContextVar("nexus_cache", default=None)


@dataclass
class EvictionEvent:
    """One eviction event: every layer that evicted during one forward."""

    index: int
    phase: str  # "prefill" | "decode"
    logical_length: int
    layers: int = 0
    tokens_before: int = 0  # physical slots summed over the evicting layers, before
    tokens_after: int = 0
    seconds: float = 0.0
    per_layer: dict[int, tuple[int, int]] = field(default_factory=dict)  # layer -> (before, after)
    #: under candidates: newest_turn, turns whose share was below the method's floor and kept their newest entries
    recency_fallbacks: int = 0


class EvictableCache(Cache):
    """A persistent KV cache that applies an `EvictionConfig` during ordinary forwards and `generate()`.

    Use: `nexus.prepare(model)` once, then `cache = EvictableCache(model.config, EvictionConfig(...))` and pass
    it as `cache=` (transformers >= 5.20) or `past_key_values=` to every forward of one conversation.
    """

    def __init__(self, model_config, config: EvictionConfig | None = None):
        self.config = config or EvictionConfig()
        text_config = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
        self.num_layers = text_config.num_hidden_layers
        #: the running held / allocated totals of every layer and their peaks (nexus.memory)
        self.meter = KVMeter()
        layers = [EvictableLayer(i, self.config.window, self.meter) for i in range(self.num_layers)]
        super().__init__(layers=layers)
        self.events: list[EvictionEvent] = []
        self._returned: dict[int, torch.Tensor] = {}
        #: "decode" while a multi-token feed stands for tokens the model decoded (teacher forcing, replay)
        self.phase_override: str | None = None
        self._segments: tuple[Segment, ...] = ()

    # -- what the host says the stream holds (nexus.segments) --------------------------------------------------
    @property
    def segments(self) -> tuple[Segment, ...]:
        """What each stretch of the logical positions is, as the host last set it (every policy's view carries
        it); () when nobody did. Set it before the forward that feeds the positions it describes."""
        return self._segments

    @segments.setter
    def segments(self, value) -> None:
        self._segments = check_segments(value)

    # -- the transformers Cache API -------------------------------------------------------------------------
    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        if layer_idx == 0 and self.phase_override == "decode" and key_states.shape[2] > 1:
            self.precharge(key_states.shape[2] - 1)
        keys, values = self.layers[layer_idx].update(key_states, value_states)
        self._returned[layer_idx] = keys
        ACTIVE_CACHE.set(self)
        return keys, values

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("EvictableCache cannot be cropped: evicted tokens are gone")

    def precharge(self, q: int) -> None:
        """Before a chunk of q + 1 teacher-forced tokens (inside `decoding()`, split at `decode_chunk`): account
        every layer's first q tokens now. Decoding one token at a time, every layer holds those q before the last
        token's step, which then appends (and may evict) layer by layer; a chunk forward appends all q + 1 per
        layer in turn instead, which would understate the peak by the later layers' q tokens, and would grow the
        buffers in one step rather than as the steps would. With the precharge the memory figures (held,
        allocated and their peaks) are those of token-by-token decoding, however the chunks fall."""
        for layer in self.layers:
            layer.precharge(q)

    def reset(self) -> None:
        super().reset()
        self._segments = ()
        self.events.clear()
        self._returned.clear()
        self.meter.reset_peaks()  # empty: a new window at zero

    # -- what users read ------------------------------------------------------------------------------------
    @property
    def logical_length(self) -> int:
        return self.layers[0].n_seen

    def physical_length(self, layer: int) -> int:
        """Physical slots of `layer` (the padded length where KV heads keep different counts)."""
        return self.layers[layer].length

    def occupancy(self, layer: int) -> float:
        """Mean number of tokens held per KV head in `layer` (equals physical_length unless ragged)."""
        return self.layers[layer].occupancy

    def retained_positions(self, layer: int) -> torch.Tensor:
        """LongTensor [B, Hkv, slots] of the logical positions kept in `layer`; -1 marks an empty slot."""
        lay = self.layers[layer]
        if lay._pos is None:
            return torch.empty(0, 0, 0, dtype=torch.long)
        return lay.positions.clone()

    # -- memory (nexus.memory: the definitions) ---------------------------------------------------------------
    def memory(self) -> KVMemory:
        """Held and allocated bytes now, and their peaks since the cache was made or `reset_peaks` last ran."""
        return self.meter.memory()

    def reset_peaks(self) -> None:
        """Start a new peak window at the current totals (say, before a turn's prefill)."""
        self.meter.reset_peaks()

    def held_bytes(self) -> int:
        """kv_held_bytes: valid (layer, row, KV head, position) entries held x (D_k + D_v) x element size."""
        return self.meter.held

    def allocated_bytes(self) -> int:
        """kv_allocated_bytes: bytes of every layer's K/V buffers, spare capacity and ragged padding included
        (for a row of a `nexus.CacheStack`: the buffers it would hold alone, which `release` gives it back)."""
        return self.meter.allocated

    def budget(self, layer: int = 0) -> int | None:
        """The per-head budget `layer` is held to (set at the end of the last prefill)."""
        return self.layers[layer].budget

    @contextlib.contextmanager
    def decoding(self):
        """Feed several tokens at once as if they were decoded one by one (teacher forcing).

        Inside, a multi-token forward is treated as decode steps: the budget stays, and only decode-time
        eviction applies. The result equals feeding the tokens one at a time as long as no layer's decode
        event falls strictly inside the chunk: split feeds at `decode_chunk()`.
        """
        self.phase_override = "decode"
        try:
            yield self
        finally:
            self.phase_override = None

    def decode_room(self) -> int | None:
        """Tokens that can be decoded before some layer's next decode-time eviction (that event fires after the
        last of them, exactly as it would one token at a time); None when no decode eviction will come."""
        cfg = self.config
        if not cfg.evicts or cfg.scope != "prefill_decode" or self._content_budget(0) is not None:
            return None
        room = [
            appends_before_decode_event(budget=layer.budget, slack=cfg.slack, occupancy=layer.occupancy)
            for layer in self.layers
            if layer.budget is not None
        ]
        return min(room) if room else None

    def decode_chunk(self, remaining: int) -> int:
        """How many of `remaining` tokens to feed in the next forward inside :meth:`decoding` so the result
        equals feeding them one at a time: all of them, or up to and including the next decode-time event."""
        room = self.decode_room()
        return remaining if room is None else min(room, remaining)

    # -- called by the attention function, after layer `layer_idx` attended ---------------------------------
    def owns(self, layer_idx: int, key: torch.Tensor) -> bool:
        return self._returned.get(layer_idx) is key

    def after_attention(
        self,
        layer_idx: int,
        query: torch.Tensor,
        scaling: float,
        queries_recorded: bool = False,
        *,
        observed: dict[str, Any] | None = None,
        observed_rows: int | None = None,
        on_observed: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """Record the queries, let the policy observe, and evict this layer if its budget says so.
        queries_recorded: a `nexus.batch.CacheStack` already wrote this step's query into the layer's ring.

        For `nexus.shared_prefill`, which replays one recorded prefill into many caches (they matter only to a
        policy that `observes`; the eviction that follows is the same as after observing every row here):
        observed:      the policy's state after observing the first `observed_rows` rows of `query` (all of them
                       when None), known from an identical earlier observation. It becomes the layer's state (the
                       cache owns it from then on: pass a copy) and only the remaining rows are observed on top.
        on_observed:   called with the layer's state right after the observation, before any eviction changes it
                       (the cache goes on updating that state: copy what you keep)."""
        cfg, policy, layer = self.config, self.config.policy, self.layers[layer_idx]
        self._returned.pop(layer_idx, None)
        if not policy.evicts:
            return
        q = query.shape[2]
        phase = self.phase_override or ("prefill" if q > 1 else "decode")
        if policy.needs_queries and not queries_recorded:
            layer.push_queries(query)
        if policy.observes:
            start = 0
            if observed is not None:
                layer.state, start = observed, q if observed_rows is None else observed_rows
            if start < q:
                new_pos = torch.arange(layer.n_seen - q + start, layer.n_seen, device=query.device)
                policy.observe(self._view(layer, scaling, phase), query[:, :, start:] if start else query, new_pos)
            if on_observed is not None:
                on_observed(layer.state)
        content = self._content_budget(layer.n_seen)
        if content is not None:  # set by what the stream holds, at every forward (Policy.content_budget)
            layer.budget = content
        elif phase == "prefill" or layer.budget is None:
            base = prefill_budget(cfg, layer.n_seen)
            layer.budget = policy.layer_budget(base, layer_idx, self.num_layers, layer.length, cfg.window)
        if should_evict(cfg, phase=phase, occupancy=layer.occupancy, budget=layer.budget):
            self._evict(layer, scaling, phase)

    def _content_budget(self, logical_length: int) -> int | None:
        return self.config.policy.content_budget(self._segments, logical_length)

    def _view(
        self, layer: EvictableLayer, scaling: float, phase: str, generator: torch.Generator | None = None
    ) -> LayerView:
        if layer._q is not None:
            queries, qpos = layer.query_window()
        else:
            queries = qpos = None
        return LayerView(
            layer_idx=layer.layer_idx,
            num_layers=self.num_layers,
            keys=layer.keys,
            positions=layer.positions,
            queries=queries,
            query_positions=qpos,
            scaling=scaling,
            budget=layer.budget or 0,
            window=self.config.window,
            block_size=self.config.block_size,
            phase=phase,
            generator=generator,
            state=layer.state,
            segments=self._segments,
        )

    def _evict(self, layer: EvictableLayer, scaling: float, phase: str) -> None:
        # events are rare (amortised over the slack), so a device sync on each side buys honest timings
        cuda = layer.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(layer.device)
        t0 = time.perf_counter()
        before = layer.length
        # a CPU generator per (seed, layer, logical length): see nexus/policies/reservoir.py for the rule
        generator = event_generator(self.config.seed, layer.layer_idx, layer.n_seen)
        view = self._view(layer, scaling, phase, generator)
        fallbacks = 0
        if self.config.candidates == "newest_turn":
            idx, fallbacks = select_newest_turn(self.config.policy, view, layer)
        else:
            idx = self.config.policy.select(view)
        layer.keep(idx, slack=self.config.slack if self.config.scope == "prefill_decode" else None)
        layer.events += 1
        layer.last_event_length = layer.n_seen
        ev = self.events[-1] if self.events else None
        if ev is None or ev.logical_length != layer.n_seen or ev.phase != phase or layer.layer_idx in ev.per_layer:
            ev = EvictionEvent(index=len(self.events), phase=phase, logical_length=layer.n_seen)
            self.events.append(ev)
        ev.layers += 1
        ev.tokens_before += before
        ev.tokens_after += layer.length
        ev.per_layer[layer.layer_idx] = (before, layer.length)
        ev.recency_fallbacks += fallbacks
        if cuda:
            torch.cuda.synchronize(layer.device)
        ev.seconds += time.perf_counter() - t0
