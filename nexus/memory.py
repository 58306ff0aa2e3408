"""What a KV cache costs in memory: four figures, one name each, used the same way in every layer of the code.

An *entry* is one (layer, batch row, KV head, position) K+V pair; it takes (D_k + D_v) x element size bytes.

- ``kv_held_bytes``: entries held x bytes per entry. Only valid slots (position >= 0) count: the -1 slots of
  ragged heads (Ada methods, padded to the layer's longest head) and the spare capacity are not held.
- ``kv_allocated_bytes``: the bytes of the K/V buffers the cache holds, spare capacity and ragged padding
  included: what a GPU budget needs. For a row of a ``nexus.CacheStack`` it is the buffers the row would hold
  alone (which ``detach`` gives it back), so one episode reports the same figure solo and in the decode
  engine; the stack's padding to its longest row is the stack's own cost (``CacheStack.allocated_bytes``).
- ``kv_peak_held_bytes``, ``kv_peak_allocated_bytes``: the largest totals at any moment since the peak window
  began (``KVMeter.reset_peaks``), sampled after every layer's append and after every eviction. A prefill's
  peak therefore includes each layer's pre-eviction state in the order the layers run: layer i full while
  layers < i have already evicted. Temporary copies inside one operation (the gather of an eviction, the
  old and new buffer during a reallocation) are not counted.

Plain Python, no torch: the cache reports integer changes, a few integer operations per layer per step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVMemory:
    """A cache's memory figures at one moment (bytes; see the module docstring for each definition)."""

    kv_held_bytes: int
    kv_allocated_bytes: int
    kv_peak_held_bytes: int
    kv_peak_allocated_bytes: int


class KVMeter:
    """Running held / allocated totals of one cache and their high-water marks since the last `reset_peaks`.

    The cache's layers call `change` after every append and every eviction or reallocation, with the change of
    their own held and allocated bytes; the totals are then sampled for the peaks."""

    __slots__ = ("held", "allocated", "peak_held", "peak_allocated")

    def __init__(self) -> None:
        self.held = 0
        self.allocated = 0
        self.peak_held = 0
        self.peak_allocated = 0

    def change(self, held: int, allocated: int) -> None:
        """Add `held` and `allocated` bytes (negative: freed) to the totals, then sample the peaks."""
        self.held += held
        self.allocated += allocated
        if self.held > self.peak_held:
            self.peak_held = self.held
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated

    def reset_peaks(self) -> None:
        """Start a new peak window at the current totals."""
        self.peak_held, self.peak_allocated = self.held, self.allocated

    def memory(self) -> KVMemory:
        return KVMemory(
            kv_held_bytes=self.held,
            kv_allocated_bytes=self.allocated,
            kv_peak_held_bytes=self.peak_held,
            kv_peak_allocated_bytes=self.peak_allocated,
        )


__all__ = ["KVMemory", "KVMeter"]
