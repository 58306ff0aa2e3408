"""The retention map of a cache: for every layer and logical position, how many KV heads still hold it.

Stored with each episode (``episodes.retention``) and drawn by the dashboard as a layer x position image, so
the shape of what a method forgot can be seen at a glance. The stored form is a run-length encoding, because
a dense or windowed cache is a handful of runs while the raw map is layers x logical length::

    {"logical_length": L, "kv_heads": H, "layers": [[[count, run], ...], ...]}

``layers[l]`` covers positions 0..L-1 of layer ``l`` in order: ``run`` consecutive positions each held by
``count`` of the layer's H KV heads (0 <= count <= H). The runs of every layer add up to exactly L.

Counts are per KV head because that is the granularity at which the cache evicts (`nexus.cache`): an Ada
method keeps a different number of positions per head (the rest of its slots are -1), a stacked row of a
`nexus.CacheStack` is a view of its row with -1 past its length, and neither -1 slot counts.

``import nexus.retention`` needs no torch: ``expand`` and ``check`` work on the stored JSON alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nexus.cache import EvictableCache

Runs = dict[str, Any]


def retention_runs(cache: EvictableCache, *, row: int = 0) -> Runs:
    """The retention map of `cache` (batch row `row`) as run-length encoded counts; see the module docstring.

    Per layer, `cache.retained_positions(layer)` is [B, Hkv, P] (P physical slots, -1 = empty); the held
    positions of batch row `row` are counted with one `bincount` over [Hkv * P] values (a KV head holds a
    position at most once, so the count of a position is the number of heads holding it), giving [L] counts
    that `unique_consecutive` turns into runs. One host transfer of [Hkv, P] per layer: cheap next to a turn.
    A layer never fed (an empty cache) has L = 0 and no runs.
    """
    import torch

    length = cache.logical_length
    heads = 0
    layers: list[list[list[int]]] = []
    for layer in range(cache.num_layers):
        positions = cache.retained_positions(layer)  # [B, Hkv, P]
        if positions.shape[0] == 0:  # a layer never fed holds nothing
            counts = torch.zeros(length, dtype=torch.long)
        else:
            if not 0 <= row < positions.shape[0]:
                raise ValueError(f"row {row} is out of range for a cache of batch {positions.shape[0]}")
            per_head = positions[row].cpu()  # [Hkv, P]
            heads = max(heads, per_head.shape[0])
            held = per_head[per_head >= 0]
            if held.numel() and int(held.max()) >= length:
                raise ValueError(f"layer {layer} holds position {int(held.max())} >= logical length {length}")
            counts = torch.bincount(held, minlength=length)  # [L]
        values, runs = torch.unique_consecutive(counts, return_counts=True)
        layers.append([[int(v), int(n)] for v, n in zip(values.tolist(), runs.tolist(), strict=True)])
    return {"logical_length": length, "kv_heads": heads, "layers": layers}


def check(runs: Runs) -> None:
    """ValueError unless `runs` is a well-formed retention map (every layer's runs cover exactly L positions
    with counts in [0, H] and positive run lengths)."""
    length, heads = runs["logical_length"], runs["kv_heads"]
    for index, layer in enumerate(runs["layers"]):
        covered = 0
        for count, run in layer:
            if not 0 <= count <= heads or run < 1:
                raise ValueError(f"layer {index}: bad run [{count}, {run}] (kv_heads={heads})")
            covered += run
        if covered != length:
            raise ValueError(f"layer {index}: runs cover {covered} positions, logical length is {length}")


def expand(runs: Runs) -> list[list[int]]:
    """The map itself: per layer, the [L] list of head counts of positions 0..L-1 (checked first)."""
    check(runs)
    return [[count for count, run in layer for _ in range(run)] for layer in runs["layers"]]


__all__ = ["Runs", "check", "expand", "retention_runs"]
