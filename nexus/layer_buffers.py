"""`EvictableLayer`: one layer's K/V buffers for `nexus.cache.EvictableCache`, which forgets tokens and keeps
true positions.

Each layer holds, at KV-head granularity (never expanded to query heads):
  keys, values  [B, Hkv, P, D]   post-RoPE, P = physical slots (a view of a buffer with spare capacity)
  positions     [B, Hkv, P]      logical position of each slot; -1 = empty slot (heads keeping fewer slots)
and the logical length of the stream (`get_seq_length()`), so RoPE positions and masks stay true after
any eviction and the same cache can be carried through many `model(...)` / `generate()` calls.

Slot order is time order: new tokens are appended last and compaction (`keep`) keeps ascending slot order.
The buffers live here, apart from the cache, because `nexus.batch` stacks the layers of many caches into shared
buffers: a layer is then a row view of its stack's buffers and must keep growing and sizing by the same rules
(`grown_capacity`, `stepped_capacity`), so every row reports the memory it would have alone.
Which slots to keep, and when, is the cache's business (`nexus.cache`); a layer only carries out `keep`.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import CacheLayerMixin

from nexus.budget import appends_before_decode_event
from nexus.memory import KVMeter


def grown_capacity(need: int) -> int:
    """The slots a buffer grows to when an append needs `need` (chunked growth: amortised O(1) appends)."""
    return need + max(256, need // 8)


def stepped_capacity(capacity: int, need: int) -> int:
    """The capacity one-token appends reach from `capacity` once `need` slots are held (each growth by
    `grown_capacity`): what decoding token by token allocates, whatever chunks teacher forcing feeds."""
    while need > capacity:
        capacity = grown_capacity(capacity + 1)
    return capacity


class EvictableLayer(CacheLayerMixin):
    """One layer's evictable storage. Buffers grow in chunks while prefilling and are sized at each eviction
    for the decode that follows (see `keep`).

    Memory accounting (`nexus.memory`), reported to `meter` after every append and every eviction:
      entries     valid (batch row, KV head, position) slots held (position >= 0)
      capacity    slots per (row, head) of the buffers this layer holds alone: `update`'s growth rule and
                  `keep`'s sizing rule, applied the same way when the layer is a row of a `nexus.batch` stack
                  (whose shared buffers may be longer); `detach` gives the row buffers of exactly this size
      held_bytes()       entries x (D_k + D_v) x element size
      allocated_bytes()  B x Hkv x capacity x (D_k + D_v) x element size (spare capacity, ragged padding included)
    """

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self, layer_idx: int, window: int, meter: KVMeter | None = None):
        super().__init__()
        self.layer_idx = layer_idx
        self.window = window
        self.meter = meter if meter is not None else KVMeter()
        self.entries = self.capacity = self.entry_bytes = self._slot_entries = 0
        self.reset()

    # -- storage -----------------------------------------------------------------------------------------
    def reset(self) -> None:
        self.meter.change(-self.held_bytes(), -self.allocated_bytes())
        self.entries = 0  # valid (row, KV head, position) entries held
        self.capacity = 0  # slots per (row, KV head) of the buffers this layer holds alone
        self.entry_bytes = 0  # (D_k + D_v) x element size, set by the first append
        self._slot_entries = 0  # B x Hkv: the entries one slot index spans
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._pos: torch.Tensor | None = None
        self.is_initialized = False
        self.length = 0  # physical slots P (padded length when heads keep different counts)
        self.n_seen = 0  # logical length
        self.occupancy = 0.0  # mean valid slots per KV head
        self.ragged = False  # some KV heads hold fewer tokens than the padded length
        self.budget: int | None = None
        self.events = 0
        self.last_event_length = 0  # logical length at this layer's last eviction event (0: none yet)
        self.turn_start = 0  # first logical position of the turn being compressed (`nexus.candidates`)
        self.state: dict[str, Any] = {}
        self._q: torch.Tensor | None = None  # ring of the last W queries [B, Hq, W, D]
        self._q_pos: torch.Tensor | None = None  # [W] logical positions, -1 = empty
        self._q_count = 0
        self._owner = None  # a nexus.batch stack whose [N, Hkv, C, D] buffers this layer is a row view of
        self._precharged = 0  # decoded tokens of the running chunk already accounted (`precharge`)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True
        self.entry_bytes = (
            key_states.shape[-1] * key_states.element_size() + value_states.shape[-1] * value_states.element_size()
        )
        self._slot_entries = key_states.shape[0] * key_states.shape[1]

    # -- memory (nexus.memory) ----------------------------------------------------------------------------
    def held_bytes(self) -> int:
        """Valid entries held x (D_k + D_v) x element size."""
        return self.entries * self.entry_bytes

    def allocated_bytes(self) -> int:
        """Bytes of the K/V buffers this layer holds alone: B x Hkv x capacity x (D_k + D_v) x element size."""
        return self._slot_entries * self.capacity * self.entry_bytes

    def _appended(self, q: int) -> None:
        """Account for q tokens per row and head just appended (`length` already advanced): the capacity the
        buffers would have alone grows by `update`'s rule, and the meter samples the new totals. Tokens of a
        decode chunk that `precharge` accounted ahead are not counted again."""
        grown = 0
        precharged, self._precharged = self._precharged, 0
        q -= precharged
        if self.length > self.capacity:
            capacity = stepped_capacity(self.capacity, self.length) if precharged else grown_capacity(self.length)
            grown, self.capacity = capacity - self.capacity, capacity
        self.entries += self._slot_entries * q
        self.meter.change(self._slot_entries * q * self.entry_bytes, self._slot_entries * grown * self.entry_bytes)

    def precharge(self, q: int) -> None:
        """Account q decoded tokens ahead of their append: a chunk of q + 1 teacher-forced tokens then leaves the
        memory figures (peaks included) of decoding them one at a time, when every layer appends q tokens before
        the last token's step runs layer by layer (see `EvictableCache.update`)."""
        if not self.is_initialized or q <= 0:
            return
        capacity = stepped_capacity(self.capacity, self.length + q)
        grown, self.capacity = capacity - self.capacity, capacity
        self.entries += self._slot_entries * q
        self._precharged = q
        self.meter.change(self._slot_entries * q * self.entry_bytes, self._slot_entries * grown * self.entry_bytes)

    def _reallocate(self, capacity: int) -> None:
        """Move the live slots into fresh buffers of `capacity` slots (frees the old ones)."""
        b, h, _, dk = self._k.shape
        dv = self._v.shape[-1]
        k = self._k.new_empty(b, h, capacity, dk)
        v = self._v.new_empty(b, h, capacity, dv)
        pos = self._pos.new_full((b, h, capacity), -1)
        k[:, :, : self.length] = self._k[:, :, : self.length]
        v[:, :, : self.length] = self._v[:, :, : self.length]
        pos[:, :, : self.length] = self._pos[:, :, : self.length]
        self._k, self._v, self._pos = k, v, pos

    def _grow(self, capacity: int) -> None:
        if self._owner is not None:
            self._owner.ensure_capacity(capacity)  # a stacked row grows with its whole stack
        else:
            self._reallocate(capacity)

    def detach(self) -> None:
        """Leave a stack: move the live slots into buffers of this layer's own, of the capacity it would have had
        alone (`capacity`), so a row reports the same bytes and grows at the same steps as if never stacked."""
        if self._owner is None:
            return
        self._owner = None
        self._reallocate(self.capacity)
        if self._q is not None:  # the query ring may be a view of the stack's ring too
            self._q, self._q_pos = self._q.clone(), self._q_pos.clone()

    # the held slots, as views of the buffers: read where they are used (a policy's scores, an eviction), never
    # refreshed per step (a stack of N rows would slice 2 N views a layer a step that nothing reads)
    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._k is None else self._k[:, :, : self.length]

    @keys.setter
    def keys(self, value: None) -> None:  # transformers' CacheLayerMixin.__init__ sets None; nothing else may
        if value is not None:
            raise AttributeError("an EvictableLayer's keys are a view of its buffers; append with update()")

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._v is None else self._v[:, :, : self.length]

    @values.setter
    def values(self, value: None) -> None:
        if value is not None:
            raise AttributeError("an EvictableLayer's values are a view of its buffers; append with update()")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append q new tokens ([B, Hkv, q, D]); returns all physical keys/values [B, Hkv, P + q, D]."""
        b, h, q, _ = key_states.shape
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._k = key_states.new_empty(b, h, 0, key_states.shape[-1])
            self._v = value_states.new_empty(b, h, 0, value_states.shape[-1])
            self._pos = torch.empty(b, h, 0, dtype=torch.long, device=key_states.device)
        elif self._k.shape[0] != b or self._k.shape[1] != h:
            raise ValueError(
                f"layer {self.layer_idx}: cache holds batch={self._k.shape[0]}, kv_heads={self._k.shape[1]} "
                f"but got keys of shape {tuple(key_states.shape)}; use a fresh EvictableCache per conversation"
            )
        need = self.length + q
        if need > self._k.shape[2]:  # a decode chunk grows as one-token steps would
            self._grow(stepped_capacity(self.capacity, need) if self._precharged else grown_capacity(need))
        self._k[:, :, self.length : need] = key_states
        self._v[:, :, self.length : need] = value_states
        self._pos[:, :, self.length : need] = torch.arange(self.n_seen, self.n_seen + q, device=self._pos.device)
        self.length, self.n_seen, self.occupancy = need, self.n_seen + q, self.occupancy + q
        self._appended(q)
        return self.keys, self.values

    def keep(self, idx: torch.Tensor, slack: int | None = None) -> None:
        """Keep slots `idx` [B, Hkv, K] (ascending, -1 padded) and size the buffers for what comes next.

        slack: under prefill_decode the next decode event fires when the mean occupancy reaches
        `self.budget + slack`; None when no decode event will come (prefill_only). The buffers then hold
        exactly enough slots to append up to that event without reallocating: K + max(budget + slack - kept
        per head, 1), which is budget + slack whenever every head keeps the same count. A buffer that already
        has that capacity (or at most `slack` more) is reused in place, so a decoding layer keeps one
        storage from event to event; a larger one (after a prefill) is replaced by a right-sized one.
        A row of a stack applies the same rule to `capacity` (the buffers it would hold alone) and keeps its
        place in the stack's buffers. The meter then samples the held entries (the valid ones of `idx`) and the
        allocated capacity; the gathered copies made here are temporary and not counted.
        """
        safe = idx.clamp(min=0)
        empty = idx < 0
        k = self.keys.gather(2, safe.unsqueeze(-1).expand(-1, -1, -1, self._k.shape[-1]))
        v = self.values.gather(2, safe.unsqueeze(-1).expand(-1, -1, -1, self._v.shape[-1]))
        pos = self.positions.gather(2, safe).masked_fill(empty, -1)
        for name, t in self.state.get("slots", {}).items():
            self.state["slots"][name] = t.gather(-1, safe).masked_fill(empty, 0)
        kept = idx.shape[-1]
        entries = int((~empty).sum())  # one host sync per event, never per decode step
        ragged = entries < idx.shape[0] * idx.shape[1] * kept
        occupancy = entries / (idx.shape[0] * idx.shape[1]) if ragged else float(kept)
        if slack is None:
            needed = kept
        else:
            needed = kept + appends_before_decode_event(budget=self.budget, slack=slack, occupancy=occupancy)
        reuse = needed <= self.capacity <= needed + (slack or 0)
        capacity = self.capacity if reuse else needed
        if self._owner is not None:
            # a stacked row keeps its place in the stack; the slots it gave up become empty (-1) so the
            # stack's masks ignore them. A ragged (Ada) row that needs more room than the stack has leaves a
            # slack's headroom, not one reallocation per event
            if needed > self._k.shape[2]:
                self._owner.ensure_capacity(needed + (slack or 0))
            self._k[:, :, :kept], self._v[:, :, :kept], self._pos[:, :, :kept] = k, v, pos
            self._pos[:, :, kept : self.length] = -1
        elif reuse:
            self._k[:, :, :kept], self._v[:, :, :kept], self._pos[:, :, :kept] = k, v, pos
        else:
            self._k, self._v, self._pos = k, v, pos
            self.length = kept
            self._reallocate(needed)
        self.length, self.occupancy, self.ragged = kept, occupancy, ragged
        held, allocated = self.held_bytes(), self.allocated_bytes()
        self.entries, self.capacity = entries, capacity
        self.meter.change(self.held_bytes() - held, self.allocated_bytes() - allocated)

    @property
    def positions(self) -> torch.Tensor:
        return self._pos[:, :, : self.length]

    # -- the observation window of recent queries ---------------------------------------------------------
    def push_queries(self, query: torch.Tensor) -> None:
        """Remember the last W post-RoPE queries ([B, Hq, q, D]) in a ring buffer (one copy per forward)."""
        q = query.shape[2]
        if self._q is None:
            b, hq, _, d = query.shape
            self._q = query.new_zeros(b, hq, self.window, d)
            self._q_pos = torch.full((self.window,), -1, dtype=torch.long, device=query.device)
        if q == 1:  # a decode step: two small copies, no index tensors (this runs per layer per row per token)
            slot = self._q_count % self.window
            self._q[:, :, slot] = query[:, :, 0]
            self._q_pos[slot] = self.n_seen - 1
            self._q_count += 1
            return
        take = min(q, self.window)
        slots = (self._q_count + torch.arange(take, device=query.device)) % self.window
        self._q.index_copy_(2, slots, query[:, :, q - take :])
        self._q_pos.index_copy_(0, slots, torch.arange(self.n_seen - take, self.n_seen, device=query.device))
        self._q_count += take

    def query_window(self) -> tuple[torch.Tensor, torch.Tensor]:
        """([B, Hq, w, D], [w]) the recent queries oldest first, w = min(W, queries seen)."""
        w = min(self._q_count, self.window)
        order = self._q_pos.argsort()[self.window - w :]  # empty slots (-1) sort first
        return self._q.index_select(2, order), self._q_pos.index_select(0, order)

    # -- what transformers asks ---------------------------------------------------------------------------
    def get_seq_length(self) -> int:
        return self.n_seen

    def get_mask_sizes(self, query_length) -> tuple[int, int]:
        # int on transformers >= 5.3, a cache_position tensor on older releases
        q = query_length if isinstance(query_length, int) else query_length.shape[0]
        return self.length + q, self.n_seen - self.length

    def get_max_length(self) -> int:
        return -1
