"""Helpers for the baseline-policy tests: seeded `LayerView`s and NumPy building blocks.

The NumPy side is written independently of `nexus.policies.base` (plain loops and arrays), so a test
compares the policy against a second transcription of the method, not against the same helpers.
"""

from __future__ import annotations

import numpy as np
import torch

from nexus.policies.base import LayerView


def ascending_positions(batch: int, heads: int, length: int) -> torch.Tensor:
    """[B, Hkv, P] positions 0..P-1 in every head (a cache that never evicted)."""
    return torch.arange(length).expand(batch, heads, length).clone()


def gapped_positions(gen: torch.Generator, batch: int, heads: int, slots: int, logical: int, keep_last: int):
    """[B, Hkv, slots] ascending logical positions per head, a random subset of range(logical) that always
    holds the last `keep_last` positions (as after an earlier eviction with a recency window)."""
    rows = []
    for _ in range(batch * heads):
        tail = torch.arange(logical - keep_last, logical)
        head = torch.randperm(logical - keep_last, generator=gen)[: slots - keep_last]
        rows.append(torch.cat([head.sort().values, tail]))
    return torch.stack(rows).view(batch, heads, slots)


def make_view(
    seed: int,
    *,
    batch: int = 2,
    kv_heads: int = 2,
    group: int = 2,
    head_dim: int = 8,
    positions: torch.Tensor | None = None,
    length: int = 40,
    window: int = 6,
    rows: int | None = None,
    budget: int = 12,
    layer_idx: int = 0,
    num_layers: int = 4,
) -> LayerView:
    """A LayerView from seeded normal K/Q. Window queries sit at the last `rows` logical positions."""
    gen = torch.Generator().manual_seed(seed)
    if positions is None:
        positions = ascending_positions(batch, kv_heads, length)
    p = positions.shape[-1]
    rows = window if rows is None else rows
    last = int(positions.max())
    return LayerView(
        layer_idx=layer_idx,
        num_layers=num_layers,
        keys=torch.randn(batch, kv_heads, p, head_dim, generator=gen),
        positions=positions,
        queries=torch.randn(batch, kv_heads * group, rows, head_dim, generator=gen),
        query_positions=torch.arange(last - rows + 1, last + 1),
        scaling=head_dim**-0.5,
        budget=budget,
        window=window,
        block_size=32,
        phase="prefill",
    )


def np_softmax(x: np.ndarray) -> np.ndarray:
    """Softmax of a 1-D float64 array that may hold -inf; all -inf gives zeros."""
    if not np.isfinite(x).any():
        return np.zeros_like(x)
    e = np.exp(x - x[np.isfinite(x)].max())
    return e / e.sum()


def kept_sets(idx: torch.Tensor) -> list[list[set[int]]]:
    """[B, Hkv, K] slot indices -> per (b, h) set of kept slots (-1 padding dropped)."""
    return [[{int(i) for i in row if i >= 0} for row in head] for head in idx.tolist()]


def np_top(scores: dict[int, float], k: int) -> set[int]:
    """The k keys of `scores` with the highest values (ties: lowest key first; tests avoid exact ties)."""
    order = sorted(scores, key=lambda s: (-scores[s], s))
    return set(order[: max(k, 0)])


def assert_selection_contract(idx: torch.Tensor, view: LayerView, forced: torch.Tensor | None) -> None:
    """Shape, ascending order, -1 only as end padding of rows with too few valid slots, forced kept."""
    b, h, p = view.positions.shape
    k = min(view.budget, p)
    assert idx.shape == (b, h, k), idx.shape
    assert idx.dtype == torch.int64
    valid = view.valid
    for bi in range(b):
        for hi in range(h):
            row = idx[bi, hi].tolist()
            n_valid = int(valid[bi, hi].sum())
            real = [i for i in row if i >= 0]
            assert len(real) == min(k, n_valid), (bi, hi, row, n_valid)
            assert row[len(real) :] == [-1] * (k - len(real)), f"-1 must only pad the end: {row}"
            assert real == sorted(set(real)), f"not strictly ascending: {row}"
            assert all(bool(valid[bi, hi, i]) for i in real), "kept an empty slot"
            if forced is not None:
                must = set(torch.nonzero(forced[bi, hi]).flatten().tolist())
                assert must <= set(real), f"forced slots {sorted(must - set(real))} were dropped"
