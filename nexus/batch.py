"""`CacheStack`: several conversations' `EvictableCache`s fed together, one token each per forward, or q each.

Why: batch-1 decode of a large model reads every weight once per token; N conversations decoded in one forward
read them once for N tokens. No serving stack we know batches caches that evict per sequence, because each
row then holds its own number of slots, at its own logical positions, and evicts at its own moments.

How: per layer, one buffer [N, Hkv, C, D] (and positions [N, Hkv, C]) holds every row; C is the longest row's
capacity. Each row's `EvictableLayer` keeps all of its own state (logical length, budget, policy state, query
window, events, seeded generator per event) and its K/V/positions become *views* of its row of the stack, so
every line of eviction code runs per row, unchanged, on exactly the tensors it would see alone. A row holds
`length` slots at the front of its row; every slot after that has position -1. Row padding is therefore the
same thing as the -1 slots ragged heads already have, and the attention mask is simply `position >= 0` (at a
decode step every held token is earlier than the new one).

A decode step appends all rows' new tokens with one indexed write, attends with one masked kernel call over
the longest row, then lets each row observe and evict on its own (`EvictableCache.after_attention` on the
row's cache, which touches only its own row). A row that evicts keeps its place: the slots it gave up are
marked -1. A row's own forward (a new turn's prefill) can run on its cache while it is stacked: it writes into
its row and grows the whole stack if it needs more room.

Several tokens per row (input_ids [N, q], position_ids `position_ids(q=q)`): every row appends q tokens after its
own slots and attends to its held slots and its new tokens causally (the mask compares logical positions), then
each row observes and evicts on its own, as a q-token forward of its cache alone would: a prefill (evicting at its
end) or, inside `decoding()`, teacher-forced decoded tokens (split at `decode_chunk`, the first row's next
decode-time event). The probes and the replay feed every cell of one sample this way: the cells see the same
tokens, only their caches differ.

Memory: each row's `EvictableLayer` keeps the memory figures it would have alone (`nexus.memory`: held
entries, and the capacity its own buffers would have by the same growth and sizing rules), and `release` gives
it buffers of exactly that capacity, so an episode reports the same held, allocated and peak bytes whether it
decoded alone or in a stack. What stacking costs on top (every row padded to the stack's capacity) is
`CacheStack.allocated_bytes()`.

Rows join and leave by building a new stack (`CacheStack(caches)`, one copy of the live slots) and detaching
the rows that left (`release`), which gives each its own buffers again (of the capacity it would have alone).
Turns are long (hundreds of decode steps), so the copy is paid rarely.
"""

from __future__ import annotations

import contextlib

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from nexus.cache import ACTIVE_CACHE, EvictableCache
from nexus.layer_buffers import EvictableLayer, grown_capacity


class StackedLayer(CacheLayerMixin):
    """Layer `layer_idx` of every row: the shared buffers and the rows' `EvictableLayer`s viewing them."""

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self, layer_idx: int, rows: list[EvictableLayer]):
        super().__init__()
        self.layer_idx = layer_idx
        self.rows = rows
        first = rows[0]
        for row in rows:
            if not row.is_initialized:
                raise ValueError(f"layer {layer_idx}: every stacked cache must have been fed (prefilled) first")
            if row._k.shape[0] != 1 or row._k.shape[1] != first._k.shape[1] or row._k.shape[3] != first._k.shape[3]:
                raise ValueError(f"layer {layer_idx}: stacked caches must hold batch 1 and the same KV heads")
        self.dtype, self.device, self.is_initialized = first.dtype, first.device, True
        # room for what each row will append before its next event (its own capacity was sized for that)
        capacity = max(max(row.capacity, row.length + 1) for row in rows)
        n, h, d, dv = len(rows), first._k.shape[1], first._k.shape[3], first._v.shape[3]
        # zeros, not empty: a masked slot gets weight 0, and 0 * (NaN left in uninitialised memory) is NaN
        self.k = first._k.new_zeros(n, h, capacity, d)
        self.v = first._v.new_zeros(n, h, capacity, dv)
        self.pos = first._pos.new_full((n, h, capacity), -1)
        for r, row in enumerate(rows):
            self.k[r, :, : row.length] = row._k[0, :, : row.length]
            self.v[r, :, : row.length] = row._v[0, :, : row.length]
            self.pos[r, :, : row.length] = row._pos[0, :, : row.length]
        self._point_rows()
        self._index = torch.arange(n, device=self.device)
        self._stack_query_rings()
        self._known: list[tuple[int, int, int]] = []  # (length, n_seen, queries) per row at the last step
        self._lengths_t = self._n_seen_t = self._q_slots = None

    def _stack_query_rings(self) -> None:
        """Rows that keep a window of recent queries share one ring [M, Hq, W, D] (and positions [M, W]), so a
        decode step records every row's query with one indexed write instead of per-row copies."""
        self.ring_rows = [r for r, row in enumerate(self.rows) if row._q is not None]
        shapes = {tuple(self.rows[r]._q.shape[1:]) for r in self.ring_rows}
        if len(shapes) != 1:  # no ring, or rows with different windows: each row records its own
            self.ring_rows, self.q = [], None
            return
        self.q = torch.cat([self.rows[r]._q for r in self.ring_rows])
        self.q_pos = torch.stack([self.rows[r]._q_pos for r in self.ring_rows])
        for i, r in enumerate(self.ring_rows):
            self.rows[r]._q, self.rows[r]._q_pos = self.q[i : i + 1], self.q_pos[i]
        self._ring_index = torch.tensor(self.ring_rows, device=self.device)
        self._ring_arange = torch.arange(len(self.ring_rows), device=self.device)

    def push_queries(self, query: torch.Tensor) -> None:
        """Record this step's query of every ring row ([N, Hq, 1, D]) at its own ring slot (after `update`)."""
        window = self.q.shape[2]
        self.q[self._ring_arange, :, self._q_slots] = query[self._ring_index, :, 0]
        self.q_pos[self._ring_arange, self._q_slots] = self._n_seen_t[self._ring_index] - 1
        self._q_slots = (self._q_slots + 1) % window
        for r in self.ring_rows:
            self.rows[r]._q_count += 1

    def _point_rows(self) -> None:
        for r, row in enumerate(self.rows):
            row._k, row._v, row._pos = self.k[r : r + 1], self.v[r : r + 1], self.pos[r : r + 1]
            row._owner = self

    def ensure_capacity(self, capacity: int) -> None:
        """Grow every row to at least `capacity` slots (new slots empty); the rows' views follow."""
        old = self.k.shape[2]
        if capacity <= old:
            return
        n, h, _, d = self.k.shape
        k, v = self.k.new_zeros(n, h, capacity, d), self.v.new_zeros(n, h, capacity, self.v.shape[3])
        pos = self.pos.new_full((n, h, capacity), -1)
        k[:, :, :old], v[:, :, :old], pos[:, :, :old] = self.k, self.v, self.pos
        self.k, self.v, self.pos = k, v, pos
        self._point_rows()

    @property
    def longest(self) -> int:
        return max(row.length for row in self.rows)

    @property
    def ragged(self) -> bool:
        """Some row holds fewer tokens in some head than its padded length (Ada methods)."""
        return any(row.ragged for row in self.rows)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append q tokens per row ([N, Hkv, q, D]); returns every row's slots [N, Hkv, longest, D].

        q = 1 is a decode step (one indexed write, device copies of the rows' lengths kept between steps). q > 1
        feeds every row the same number of tokens at once (a prompt prefill, or teacher-forced decoded tokens
        under `decoding()`): row r's tokens go to its slots [length_r, length_r + q) at its own logical
        positions, causal among themselves, each row still evicting on its own afterwards."""
        n, _, q, _ = key_states.shape
        if n != len(self.rows):
            raise ValueError(
                f"a CacheStack of {len(self.rows)} rows needs keys of batch {len(self.rows)}, got keys of shape "
                f"{tuple(key_states.shape)}"
            )
        known = [(row.length, row.n_seen, row._q_count) for row in self.rows]
        if known != self._known:  # a row evicted or prefilled since the last step: refresh the device copies
            self._lengths_t = torch.tensor([k[0] for k in known], device=self.device)
            self._n_seen_t = torch.tensor([k[1] for k in known], device=self.device)
            if self.q is not None:
                slots = [known[r][2] % self.q.shape[2] for r in self.ring_rows]
                self._q_slots = torch.tensor(slots, device=self.device)
        need = max(k[0] for k in known) + q
        if need > self.k.shape[2]:
            self.ensure_capacity(grown_capacity(need))  # chunked growth, as a row alone grows
        if q == 1:
            # one indexed write for all rows: row r's token goes to slot lengths[r] at logical position n_seen[r]
            self.k[self._index, :, self._lengths_t] = key_states[:, :, 0]
            self.v[self._index, :, self._lengths_t] = value_states[:, :, 0]
            self.pos[self._index, :, self._lengths_t] = self._n_seen_t.unsqueeze(1)
        else:
            step = torch.arange(q, device=self.device)
            slots = self._lengths_t.unsqueeze(1) + step  # [N, q]
            rows = self._index.unsqueeze(1)
            self.k[rows, :, slots] = key_states.transpose(1, 2)  # advanced indexing puts [N, q] first
            self.v[rows, :, slots] = value_states.transpose(1, 2)
            self.pos[rows, :, slots] = (self._n_seen_t.unsqueeze(1) + step).unsqueeze(-1)
        self._lengths_t += q
        self._n_seen_t += q
        for row in self.rows:
            row.length, row.n_seen, row.occupancy = row.length + q, row.n_seen + q, row.occupancy + q
            row._appended(q)  # the row's own memory figures, as if it had appended alone
        ring = set(self.ring_rows) if q == 1 else set()  # several queries: each row records its own (after)
        self._known = [(k[0] + q, k[1] + q, k[2] + (r in ring)) for r, k in enumerate(known)]
        return self.k[:, :, :need], self.v[:, :, :need]  # `need` is now the longest row

    def attention_mask(self, query: torch.Tensor, additive: bool) -> torch.Tensor:
        """[N, 1 or Hq, q, longest]: each row attends to its held slots only, its q new tokens causally."""
        q = query.shape[2]
        longest = self.longest
        pos = self.pos[:, :, :longest]  # [N, Hkv, P]
        if not self.ragged:
            pos = pos[:, :1]  # every head of a row holds the same slots
        if q == 1:  # at a decode step every held token is earlier than the new one
            allowed = (pos >= 0).unsqueeze(2)
        elif not self.ragged:
            # a row that is not ragged holds its slots as a prefix (eviction compacts it), its q new tokens last:
            # new token i sees the slots before length - q + i + 1. One comparison of [P] against [N, q], where
            # held & (position <= query position) builds three [N, q, P] tensors a layer
            step = torch.arange(1, q + 1, device=pos.device).view(1, 1, q, 1)
            limit = (self._lengths_t - q).view(-1, 1, 1, 1) + step
            allowed = torch.arange(longest, device=pos.device).view(1, 1, 1, -1) < limit  # [N, 1, q, P]
        else:
            qpos = self._n_seen_t.view(-1, 1, 1, 1) - q + torch.arange(q, device=pos.device).view(1, 1, q, 1)
            allowed = (pos >= 0).unsqueeze(2) & (pos.unsqueeze(2) <= qpos)  # [N, H, q, P]
        if self.ragged:
            allowed = allowed.repeat_interleave(query.shape[1] // allowed.shape[1], dim=1)
        if additive:
            return torch.zeros(allowed.shape, dtype=query.dtype, device=query.device).masked_fill(
                ~allowed, torch.finfo(query.dtype).min
            )
        return allowed

    def flash_decode(self, query: torch.Tensor, scaling: float) -> torch.Tensor | None:
        """Attention of one new query per row ([N, Hq, 1, D]) with flash-attn's per-row cache lengths, or None
        where it does not apply (no flash_attn, not CUDA, or ragged rows, whose slots are not a prefix).

        Every held slot of a non-ragged row lies in its first `length` slots (eviction compacts the row), so
        `flash_attn_with_kvcache(cache_seqlens=lengths)` reads exactly the slots the sdpa mask would allow, and
        no mask or padding is computed. Returns [N, 1, Hq, D], the layout transformers' kernels return."""
        if (
            query.shape[2] != 1
            or self.ragged
            or not query.is_cuda
            or query.dtype not in (torch.float16, torch.bfloat16)
        ):
            return None
        try:
            from flash_attn import flash_attn_with_kvcache
        except ImportError:
            return None
        longest = self.longest
        # [N, Hkv, C, D] viewed as flash's [N, C, Hkv, D]: only the last dim must be contiguous
        k = self.k[:, :, :longest].transpose(1, 2)
        v = self.v[:, :, :longest].transpose(1, 2)
        lengths = self._lengths_t.to(torch.int32)
        return flash_attn_with_kvcache(
            query.transpose(1, 2), k, v, cache_seqlens=lengths, softmax_scale=scaling, causal=False
        )

    # -- what transformers asks (the model's own mask is ignored: `nexus.attention` builds ours) ------------
    def lazy_initialization(self, key_states, value_states) -> None:  # built initialised
        return None

    def get_seq_length(self) -> int:
        return max(row.n_seen for row in self.rows)

    def get_mask_sizes(self, query_length) -> tuple[int, int]:
        q = query_length if isinstance(query_length, int) else query_length.shape[0]
        return self.longest + q, 0

    def get_max_length(self) -> int:
        return -1


class CacheStack(Cache):
    """Decode N conversations together: pass as the cache of a forward with input_ids [N, 1] and
    position_ids [N, 1] = `position_ids()` (each row's own logical position)."""

    def __init__(self, caches: list[EvictableCache]):
        if not caches:
            raise ValueError("a CacheStack needs at least one cache")
        if len({id(c) for c in caches}) != len(caches):
            raise ValueError("a cache can be stacked only once")
        num_layers = caches[0].num_layers
        if any(c.num_layers != num_layers for c in caches):
            raise ValueError("stacked caches must belong to the same model")
        self.caches = list(caches)
        # a row still in an older stack is copied from there; that stack's `release` then skips it
        layers = [StackedLayer(i, [c.layers[i] for c in self.caches]) for i in range(num_layers)]
        super().__init__(layers=layers)
        self.num_layers = num_layers
        self._returned: dict[int, torch.Tensor] = {}

    def position_ids(self, device: torch.device | None = None, q: int = 1) -> torch.Tensor:
        """[N, q] the logical positions of each row's next `q` tokens."""
        return torch.tensor([[c.logical_length + i for i in range(q)] for c in self.caches], device=device)

    @contextlib.contextmanager
    def decoding(self):
        """Every row's `EvictableCache.decoding()`: multi-token feeds stand for decoded tokens (teacher forcing)."""
        with contextlib.ExitStack() as rows:
            for cache in self.caches:
                rows.enter_context(cache.decoding())
            yield self

    def decode_chunk(self, remaining: int) -> int:
        """Tokens of `remaining` to feed every row in the next forward inside `decoding()` so each row's result
        equals feeding them one at a time: up to and including the first row's next decode-time event."""
        return min(cache.decode_chunk(remaining) for cache in self.caches)

    def release(self) -> None:
        """Detach every row: each gets its own buffers back and the stack's memory is freed."""
        for cache in self.caches:
            for layer in cache.layers:
                if layer._owner is self.layers[layer.layer_idx]:  # rows already in a newer stack stay there
                    layer.detach()

    def allocated_bytes(self) -> int:
        """Bytes of the stacked K/V buffers [N, Hkv, C, D] (every row padded to the stack's capacity C, spare
        capacity included): the engine's cost. Each row's own `EvictableCache.allocated_bytes()` is what it would
        hold alone; the difference is the padding to the longest row."""
        return sum(t.numel() * t.element_size() for layer in self.layers for t in (layer.k, layer.v))

    # -- the transformers Cache API and what `nexus.attention` asks -------------------------------------------
    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        if layer_idx == 0 and key_states.shape[2] > 1:
            for cache in self.caches:  # decode chunks: each row's figures as if decoded token by token
                if cache.phase_override == "decode":
                    cache.precharge(key_states.shape[2] - 1)
        keys, values = self.layers[layer_idx].update(key_states, value_states)
        self._returned[layer_idx] = keys
        ACTIVE_CACHE.set(self)
        return keys, values

    def owns(self, layer_idx: int, key: torch.Tensor) -> bool:
        return self._returned.get(layer_idx) is key

    def flash_decode(self, layer_idx: int, query: torch.Tensor, scaling: float) -> torch.Tensor | None:
        return self.layers[layer_idx].flash_decode(query, scaling)

    def layer_mask(self, layer_idx: int, q_len: int, query: torch.Tensor, additive: bool) -> torch.Tensor:
        return self.layers[layer_idx].attention_mask(query, additive)

    def after_attention(self, layer_idx: int, query: torch.Tensor, scaling: float) -> None:
        """Each row records its query, observes and evicts on its own, exactly as it would alone."""
        self._returned.pop(layer_idx, None)
        layer = self.layers[layer_idx]
        ring = set()
        if layer.q is not None and query.shape[2] == 1:  # several queries: each row records its own window
            layer.push_queries(query)
            ring = set(layer.ring_rows)
        for r, cache in enumerate(self.caches):
            cache.after_attention(layer_idx, query[r : r + 1], scaling, queries_recorded=r in ring)

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("a CacheStack cannot be cropped: evicted tokens are gone")
