"""What every eviction policy sees and returns, and the tensor helpers they share.

An eviction *event* hands a policy one layer at a time as a `LayerView` and asks for the slots to keep.
Shapes use B = batch, Hq = query heads, Hkv = KV heads, G = Hq // Hkv (GQA group), P = physical slots,
w = query-window rows (w <= W), D = head dim.

Conventions every policy follows (the cache relies on them):
- Keys are post-RoPE, as the model attended to them, so slots can be kept in any subset without re-rotation.
- `positions[b, h, p]` is the logical position of slot p; -1 marks an empty slot (ragged per-head budgets).
- `select` returns slot indices `[B, Hkv, K]`, ascending, with -1 padding at the end of a row when heads keep
  different counts. Ascending order keeps "slot order == time order", which the cache's masks rely on.
- Scores are computed at KV-head granularity: query heads are grouped, never `repeat_kv(K)`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from nexus.segments import Segment

NEG_INF = float("-inf")


class ParamError(ValueError):
    """A bad method hyperparameter. ``method`` and ``field`` say which (a job spec reports
    ``method_params.<method>.<field>``); the message reads "<method>: <field> must be ...".
    """

    def __init__(self, method: str, field: str, requirement: str, value: Any) -> None:
        self.method, self.field = method, field
        super().__init__(f"{method}: {field} must be {requirement}, got {value!r}")


def check_int(method: str, field: str, value: Any, lo: int) -> None:
    """An integer (not a bool) >= lo."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ParamError(method, field, f"an integer >= {lo}", value)


def check_number(method: str, field: str, value: Any, lo: float, hi: float = math.inf, *, hi_open=False) -> None:
    """A finite int or float (not a bool) in [lo, hi] (or [lo, hi) with ``hi_open``)."""
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if not ok or value < lo or (value >= hi if hi_open else value > hi):
        span = f">= {lo}" if hi == math.inf else f"in [{lo}, {hi}{')' if hi_open else ']'}"
        raise ParamError(method, field, f"a finite number {span}", value)


def check_bool(method: str, field: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ParamError(method, field, "true or false", value)


def check_choice(method: str, field: str, value: Any, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ParamError(method, field, f"one of {', '.join(choices)}", value)


@dataclass
class LayerView:
    """One layer's cache as a policy sees it at an eviction event.

    keys:            [B, Hkv, P, D] post-RoPE keys of every physical slot (including tokens just appended).
    positions:       [B, Hkv, P] int64 logical position per slot, -1 = empty slot.
    queries:         [B, Hq, w, D] the most recent w <= W post-RoPE queries (the observation window).
    query_positions: [w] int64 logical positions of those queries (shared by the batch: no padding).
    budget:          slots to keep per KV head in this layer (after `Policy.layer_budget`).
    """

    layer_idx: int
    num_layers: int
    keys: torch.Tensor
    positions: torch.Tensor
    queries: torch.Tensor
    query_positions: torch.Tensor
    scaling: float
    budget: int
    window: int
    block_size: int
    phase: str  # "prefill" | "decode"
    generator: torch.Generator | None = None
    state: dict[str, Any] = field(default_factory=dict)
    #: what each stretch of logical positions is (`nexus.segments`), as the host last set it; () when unknown
    segments: tuple[Segment, ...] = ()

    @property
    def valid(self) -> torch.Tensor:
        """[B, Hkv, P] bool: slot holds a token."""
        return self.positions >= 0

    @property
    def num_kv_heads(self) -> int:
        return self.keys.shape[1]

    @property
    def group_size(self) -> int:
        return self.queries.shape[1] // self.keys.shape[1]

    @property
    def physical_length(self) -> int:
        return self.keys.shape[2]


class Policy:
    """Base class: a policy is a small frozen dataclass of hyperparameters plus these hooks.

    Subclasses set `name` and override `select` (or `score` via `ScorePolicy`).
    """

    name: ClassVar[str] = ""
    #: the cache keeps the last W post-RoPE queries per layer for this policy
    needs_queries: ClassVar[bool] = True
    #: `observe` is called after every forward's attention (H2O's accumulated attention)
    observes: ClassVar[bool] = False
    #: `observe`'s state is a sum over query rows: observing rows A, then rows B of the same forward (the view
    #: holding every slot either sees, causal by position) leaves the state observing A and B at once does, up to
    #: float summation order (H2O). `nexus.shared_prefill` then extends an earlier turn's state by the new rows
    observe_additive: ClassVar[bool] = False
    #: False only for dense: the cache never calls `select`
    evicts: ClassVar[bool] = True

    def min_budget(self, window: int, block_size: int) -> int:
        """Smallest per-head budget this policy can honour (forced slots + one free slot)."""
        return window + 1

    def layer_budget(self, budget: int, layer_idx: int, num_layers: int, length: int, window: int) -> int:
        """Per-layer budget from the base budget (PyramidKV overrides). `length` = physical slots now."""
        return budget

    def content_budget(self, segments: tuple[Segment, ...], logical_length: int) -> int | None:
        """A budget set by what the stream holds rather than by its length (the paper rule of
        `observation_masking`: everything but the observations older than the newest M), or None (the density
        rule). When set, the cache applies it at every forward, so nothing decoded ever triggers an event."""
        return None

    def observe(self, view: LayerView, new_queries: torch.Tensor, new_positions: torch.Tensor) -> None:
        """Update per-conversation state in `view.state` with this forward's queries [B, Hq, q, D]."""

    def select(self, view: LayerView) -> torch.Tensor:
        """Return kept slot indices [B, Hkv, K] (ascending, -1 padded)."""
        raise NotImplementedError


class ScorePolicy(Policy):
    """A policy that is a per-slot score fed to top-K, with a forced set (recency window by default)."""

    def score(self, view: LayerView) -> torch.Tensor:
        """[B, Hkv, P] float32, higher = keep. Values at invalid slots are ignored."""
        raise NotImplementedError

    def forced(self, view: LayerView) -> torch.Tensor:
        """[B, Hkv, P] bool: slots kept unconditionally (default: the last `window` tokens)."""
        return recent_slots(view.positions, min(view.window, view.budget))

    def select(self, view: LayerView) -> torch.Tensor:
        return keep_top(self.score(view), self.forced(view), view.valid, view.budget)

    def select_counts(self, view: LayerView, counts: torch.Tensor) -> torch.Tensor:
        """Ragged selection: keep `counts[b, h]` slots per head (Ada-KV). Returns [B, Hkv, max count]."""
        return keep_top_ragged(self.score(view), self.forced(view), view.valid, counts)


# ----------------------------------------------------------------------------------------------------------
# Shared tensor helpers


def group_queries(queries: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """[B, Hq, w, D] -> [B, Hkv, G, w, D]: query head h belongs to KV head h // G (transformers' repeat_kv)."""
    b, hq, w, d = queries.shape
    return queries.view(b, num_kv_heads, hq // num_kv_heads, w, d)


def visibility(query_positions: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[B, Hkv, w, P] bool: query i may attend slot p (causal by logical position, slot not empty)."""
    qp = query_positions.view(1, 1, -1, 1)
    kp = positions.unsqueeze(2)
    return (kp <= qp) & (kp >= 0)


def window_logits(view: LayerView) -> torch.Tensor:
    """[B, Hkv, G, w, P] float32 scaled logits q.k of the window queries, -inf where not visible.

    Computed per KV head with grouped queries, so K is never repeated to query heads.
    """
    q = group_queries(view.queries, view.num_kv_heads).float()
    logits = torch.einsum("bhgwd,bhpd->bhgwp", q, view.keys.float()) * view.scaling
    seen = visibility(view.query_positions, view.positions).unsqueeze(2)
    return logits.masked_fill(~seen, NEG_INF)


def window_attention(view: LayerView) -> torch.Tensor:
    """[B, Hkv, G, w, P] softmax of `window_logits` over slots (rows with nothing visible become 0)."""
    return torch.softmax(window_logits(view), dim=-1).nan_to_num(0.0)


def recent_slots(positions: torch.Tensor, n: int) -> torch.Tensor:
    """[B, Hkv, P] bool marking the n valid slots with the highest logical positions in each head."""
    if n <= 0:
        return torch.zeros_like(positions, dtype=torch.bool)
    n = min(n, positions.shape[-1])
    top = positions.topk(n, dim=-1).indices
    mask = torch.zeros_like(positions, dtype=torch.bool).scatter_(-1, top, True)
    return mask & (positions >= 0)


def oldest_slots(positions: torch.Tensor, n: int) -> torch.Tensor:
    """[B, Hkv, P] bool marking the n valid slots with the lowest logical positions in each head (sinks)."""
    if n <= 0:
        return torch.zeros_like(positions, dtype=torch.bool)
    n = min(n, positions.shape[-1])
    big = torch.iinfo(positions.dtype).max
    low = positions.masked_fill(positions < 0, big).topk(n, dim=-1, largest=False).indices
    mask = torch.zeros_like(positions, dtype=torch.bool).scatter_(-1, low, True)
    return mask & (positions >= 0)


def _ranked(scores: torch.Tensor, forced: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Scores with forced slots first (+inf) and empty slots last (-inf); float32 [B, Hkv, P]."""
    s = scores.float().masked_fill(forced, float("inf"))
    return s.masked_fill(~valid, NEG_INF)


def keep_top(scores: torch.Tensor, forced: torch.Tensor, valid: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k slots per head by score, forced slots first. Returns ascending indices [B, Hkv, k'].

    k' = min(k, P). Rows with fewer than k' valid slots are padded with -1.
    """
    k = min(k, scores.shape[-1])
    idx = _ranked(scores, forced, valid).topk(k, dim=-1).indices
    idx = idx.masked_fill(~valid.gather(-1, idx), -1)
    return sort_with_padding(idx)


def keep_top_ragged(
    scores: torch.Tensor, forced: torch.Tensor, valid: torch.Tensor, counts: torch.Tensor
) -> torch.Tensor:
    """Per-head top-`counts[b, h]` selection. Returns [B, Hkv, max(counts)] ascending, -1 padded."""
    kmax = int(counts.max().clamp(min=1, max=scores.shape[-1]))
    idx = _ranked(scores, forced, valid).topk(kmax, dim=-1).indices  # best first
    rank = torch.arange(kmax, device=idx.device).view(1, 1, -1)
    keep = (rank < counts.unsqueeze(-1)) & valid.gather(-1, idx)
    return sort_with_padding(idx.masked_fill(~keep, -1))


def sort_with_padding(idx: torch.Tensor) -> torch.Tensor:
    """Sort slot indices ascending per row, keeping -1 padding at the end."""
    big = torch.iinfo(idx.dtype).max
    s = idx.masked_fill(idx < 0, big).sort(dim=-1).values
    return s.masked_fill(s == big, -1)


def mask_to_indices(mask: torch.Tensor) -> torch.Tensor:
    """[..., P] bool -> ascending slot indices [..., max kept], -1 padded (one host sync for the width)."""
    idx = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask).masked_fill(~mask, -1)
    width = max(int(mask.sum(-1).max()), 1) if mask.numel() else 1
    return sort_with_padding(idx)[..., :width]
