"""``candidates: newest_turn``: an eviction event chooses only among the newest turn's entries.

FlowKV (arXiv 2505.15347) compresses each turn on its own and never re-compresses earlier turns; re-compressing
the whole history every turn compounds forgetting. With ``EvictionConfig.candidates = "newest_turn"`` an event of
any selective method works like that (``"all"``, the default, is every method's published behaviour):

1. The newest turn. A cache that already compressed once (true eviction, one cache across turns): everything
   that arrived since its previous prefill-time event (the previous assistant reply and the new observation);
   decode-time events of the same turn keep that start. A cache compressing for the first time (every turn under
   full context, where the whole history is one prefill): the history is split into turns at the start of every
   complete assistant segment (``nexus.segments``), and each turn is compressed on its own, as true eviction would
   have, the last one (the latest reply, the new observation, the open assistant header) being the newest turn.
2. Earlier entries (positions before the first turn compressed now) are kept as they are: neither evicted nor
   scored.
3. The budget is the same rule as for every method (``nexus.budget``): the layer keeps ``budget`` entries per
   head. What the earlier entries hold is taken off it, and the rest is shared among the turns compressed now in
   proportion to their held entries (largest remainder; one turn: all of it). Held entries equal the budget, as
   under ``"all"`` (a ragged, Ada, layer: up to half an entry per head off, from the rounding of the mean).
4. Each turn is handed to the policy as a view in which every other slot is empty (position -1): its scores see
   only the turn's own entries, with the event's observation window of queries. A share below what the method
   must force-keep (``Policy.min_budget``: Nexus's sink, recency and newest blocks) keeps the turn's newest
   entries instead (counted in ``EvictionEvent.recency_fallbacks``).
"""

from __future__ import annotations

import dataclasses

import torch

from nexus.layer_buffers import EvictableLayer
from nexus.policies.base import LayerView, Policy, mask_to_indices, recent_slots


def turn_bounds(layer: EvictableLayer, view: LayerView) -> list[tuple[int, int]]:
    """The logical position ranges [lo, hi) compressed now, each on its own, oldest first (step 1); sets
    ``layer.turn_start`` to the newest one's start."""
    n = layer.n_seen
    if layer.last_event_length == 0:
        starts = [s.start for s in view.segments if s.kind == "assistant" and s.end is not None and 0 < s.start < n]
        bounds = [0, *sorted(set(starts)), n]
        groups = [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    else:
        if view.phase == "prefill":
            layer.turn_start = layer.last_event_length
        groups = [(layer.turn_start, n)]
    layer.turn_start = groups[-1][0]
    return groups


def shares(free: int, sizes: list[int]) -> list[int]:
    """``free`` slots split in proportion to ``sizes`` by largest remainder (sum exactly ``free``)."""
    total = sum(sizes)
    if total <= 0:
        return [0] * len(sizes)
    exact = [free * s / total for s in sizes]
    out = [int(e) for e in exact]
    order = sorted(range(len(sizes)), key=lambda i: out[i] - exact[i])
    for i in order[: free - sum(out)]:
        out[i] += 1
    return out


def select_newest_turn(policy: Policy, view: LayerView, layer: EvictableLayer) -> tuple[torch.Tensor, int]:
    """Kept slot indices [B, Hkv, K] (ascending, -1 padded) under ``candidates: newest_turn``, and how many turns
    fell back to recency (step 4)."""
    positions = view.positions
    valid = positions >= 0
    groups = turn_bounds(layer, view)
    kept = valid & (positions < groups[0][0])  # step 2
    earlier = float(kept.sum(-1).float().mean())
    members = [valid & (positions >= lo) & (positions < hi) for lo, hi in groups]
    sizes = [round(float(m.sum(-1).float().mean())) for m in members]
    floor = policy.min_budget(view.window, view.block_size)
    fallbacks = 0
    for member, share in zip(members, shares(max(view.budget - round(earlier), 0), sizes), strict=True):
        if share <= 0:
            continue
        sub = positions.masked_fill(~member, -1)
        if share >= int(member.sum(-1).max()):  # the turn fits whole
            kept |= member
        elif share < floor:
            kept |= recent_slots(sub, share)
            fallbacks += 1
        else:
            idx = policy.select(dataclasses.replace(view, positions=sub, budget=share))
            width = positions.shape[-1]  # padding (-1) lands in one extra column, dropped after
            chosen = kept.new_zeros(*kept.shape[:-1], width + 1).scatter_(-1, idx.masked_fill(idx < 0, width), True)
            kept |= chosen[..., :width] & member
    return mask_to_indices(kept), fallbacks
