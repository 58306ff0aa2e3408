"""Nexus Sampling: block-level Nexus scores (direct attention + a short walk) fed to a weighted reservoir.

One eviction event, per layer (the Nexus Sampling paper, section 2 and appendix A):

1. Observation window: the last w <= W post-RoPE queries, HEAD-AVERAGED: Q [B, w, D] = mean over all Hq
   query heads, K [B, P, D] = mean over the Hkv KV heads (GQA: queries and keys averaged separately).
2. Block attention: softmax(Q K^T * scaling) over slots with the causal mask by LOGICAL position (a window
   query never sees a later key, even when the window holds queries from an earlier call), block-summed
   into N = ceil(P / b) key blocks and row-normalised: S [B, w, N], each row a distribution over blocks.
   Blocks are runs of b consecutive valid slots in slot order (= time order); the last may be partial.
3. Direct score a = mean of the rows of S (sums to 1).
4. Walk: C = 0; for each of H = `walk_steps` rows a^(q): gamma = 1 + <a^(q), C>, C += gamma * a^(q);
   c~ = C / ||C||_1. Which rows is not in the paper: `walk_rows="recent"` (default) feeds the H most recent
   rows, oldest first; "spread" feeds H rows evenly spaced over the window, oldest first. With w < H only
   the w available rows are used; H = 0 gives c~ = 0 (Nexus score = direct score).
5. s_j = a_j + lam * c~_j; w_j = s_j + eps_tie * j / (N - 1) (a recency tie-break; 0 for N = 1).
6. Forced blocks: block 0 (attention sink), every block holding one of the last W slots (the recency window;
   the still-filling last block is always among them). They take B_forced of the budget B; the other
   free = B - B_forced SLOTS go to the reservoir, as the paper's section 2.3 counts them ("K = B - B_forced
   slots"). `min_budget` = the largest forced set + one block (111 for W=16, b=32); `select` refuses a
   smaller budget with a ValueError.
7. Reservoir: n = `reservoir_n` uniforms per non-forced block from `view.generator` (one draw of shape
   [B, N, n] float64 on the CPU, see reservoir.py for the seeding rule), log pi_j = logsumexp_i(log u_j^(i)
   / w_j) - log n, and the candidate blocks ranked by pi. How the free slots are filled (`leftover`):
   - "partial_block" (default): the top floor(free / b) blocks whole, then the NEXT block in that ranking
     contributes its newest free mod b slots (`newest_slots`), so a row keeps exactly min(B, valid) slots,
     as SnapKV, H2O, MorphKV and StreamingLLM do at the same density. Why its newest slots: the block's
     score says nothing about which of its tokens matter, and the only preference the method has between
     otherwise equal entries is the paper's recency tie-break (eps_tie favours newer blocks); it needs no
     further score or draw, so the forced set, the ranking and the random stream are those of "unused"; and
     the kept run ends where the next logical block starts, so it joins that block into one contiguous run
     when it is kept too. The price: after compaction the blocks of the next event (runs of b slots of the
     compacted cache, the paper's N_k = ceil(T_k / b)) are shifted by the partial run's length after it, so
     they no longer coincide with the previous event's blocks.
   - "unused": whole blocks only (K = floor(free / b)); the leftover (< b) slots of the budget stay unused,
     so the kept set is whole blocks + the partial newest block and compacting it keeps every block aligned
     to b. Our rounding before issue 31 (Nexus held 91-98% of its budget at density 0.1 on SmolLM2-135M,
     docs/methods.md), kept so earlier runs can be reproduced.
   With `weight_scale="mean"` the weights are first divided by the mean candidate weight (`rescale_weights`):
   at the raw scale (w ~ 1.5 / N) n has no effect on the ranking.

The selection is shared by all KV heads of the layer (uniform per-head budget), so `select` requires every
head to hold the same slots (true whenever the cache only ever ran this policy) and returns [B, Hkv, K]
with the same ascending slots in every head.

Ada-Nexus (the paper only says Ada-KV's allocation is applied on top; this construction is ours): as a
`ScorePolicy` Nexus works per KV head. Each head's queries are the mean over its G query heads (the group
average, our GQA convention), its keys are its own; steps 2-5 run per head, and `score` spreads each
block's weight w_j evenly over the block's tokens (w_j / tokens in block), so a head's token scores sum to
about 1 + lam and are comparable across heads. `forced` marks each head's forced blocks, and
`select_counts(view, counts)` keeps per head its forced blocks plus (counts - forced) slots by a per-head
reservoir (one draw of shape [B, Hkv, N, n]). With `leftover="partial_block"` each head keeps exactly its
count (whole blocks, then the newest slots of its next-ranked block), so no pooling is needed. With
"unused": floor((counts - forced) / b) blocks per head, and the row's pooled leftover slots (< Hkv blocks)
go one block each to the heads with the largest remainders (`share_blocks`), so a head may keep up to b - 1
slots more than its count but a row never exceeds sum(counts) and wastes < one block.
Blocks are counted over each head's own valid slots; the tie-break ramp runs over N = ceil(P / b), so in a
head with empty slots it is not exactly j / (N_k - 1) of that head's blocks (it only orders near-ties).

Compute dtype: float32, or float64 when the inputs are float64 (so tests can compare exactly).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from nexus.methods import register
from nexus.policies.base import (
    NEG_INF,
    LayerView,
    ScorePolicy,
    check_choice,
    check_int,
    check_number,
    group_queries,
    mask_to_indices,
    recent_slots,
)
from nexus.policies.reservoir import descending_ranks, draw_uniforms, reservoir_log_priorities, select_top

WALK_ROWS = ("recent", "spread")
WEIGHT_SCALES = ("raw", "mean")
HEAD_SCORES = ("averaged", "per_head")
LEFTOVERS = ("partial_block", "unused")


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.promote_types(t.dtype, torch.float32)


def block_index(valid: torch.Tensor, block_size: int) -> torch.Tensor:
    """[..., P] long block id of each slot (its rank among the valid slots // b), -1 for an empty slot."""
    rank = valid.long().cumsum(-1) - 1
    return torch.where(valid, rank // block_size, -1)


def block_sum(values: torch.Tensor, ids: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """Sum `values` [..., P] (or [..., r, P] with ids [..., P]) into blocks: [..., (r,) N]. Empty slots drop."""
    ids = ids.masked_fill(ids < 0, num_blocks)  # a spare bucket for empty slots, cut off below
    if values.dim() == ids.dim() + 1:
        ids = ids.unsqueeze(-2).expand_as(values)
    out = values.new_zeros((*values.shape[:-1], num_blocks + 1))
    return out.scatter_add_(-1, ids, values)[..., :num_blocks]


def block_sizes(valid: torch.Tensor, block_size: int) -> torch.Tensor:
    """[..., N] long: valid tokens in each block (N = ceil(P / b); blocks past the valid slots hold 0)."""
    n = math.ceil(valid.shape[-1] / block_size)
    return block_sum(valid.long(), block_index(valid, block_size), n)


def block_attention(
    queries: torch.Tensor,
    keys: torch.Tensor,
    query_positions: torch.Tensor,
    positions: torch.Tensor,
    scaling: float,
    block_size: int,
) -> torch.Tensor:
    """S = rownorm(BlockSum_b(softmax(Q K^T * scaling))) with the causal mask by logical position.

    queries [..., w, D], keys [..., P, D], query_positions [w], positions [..., P] (-1 = empty slot).
    Returns [..., w, N], N = ceil(P / b); a row that sees no key at all is all zeros.
    """
    dtype = compute_dtype(keys)
    logits = queries.to(dtype) @ keys.to(dtype).transpose(-1, -2) * scaling  # [..., w, P]
    kp = positions.unsqueeze(-2)
    seen = (kp <= query_positions.view(-1, 1)) & (kp >= 0)
    probs = torch.softmax(logits.masked_fill(~seen, NEG_INF), dim=-1).nan_to_num(0.0)
    n = math.ceil(keys.shape[-2] / block_size)
    blocks = block_sum(probs, block_index(positions >= 0, block_size), n)
    mass = blocks.sum(-1, keepdim=True)
    return torch.where(mass > 0, blocks / mass.clamp_min(torch.finfo(dtype).tiny), 0.0)


def direct_score(rows: torch.Tensor) -> torch.Tensor:
    """a [..., N] = mean of the rows of S [..., w, N] (rows that saw nothing are left out of the mean)."""
    active = (rows.sum(-1) > 0).sum(-1, keepdim=True).clamp_min(1)
    return rows.sum(-2) / active


def walk_row_indices(num_rows: int, steps: int, mode: str) -> list[int]:
    """Which window rows feed the walk, oldest first: min(steps, num_rows) of them."""
    h = min(steps, num_rows)
    if h <= 0:
        return []
    if mode == "recent":
        return list(range(num_rows - h, num_rows))
    if mode == "spread":
        return torch.linspace(0, num_rows - 1, h).round().long().tolist()
    raise ValueError(f"walk_rows must be one of {', '.join(WALK_ROWS)}, got {mode!r}")


def walk_score(rows: torch.Tensor, order: Sequence[int]) -> torch.Tensor:
    """c~ [..., N]: C = 0; for q in order: C += (1 + <S[q], C>) * S[q]; then C / ||C||_1 (0 when C = 0)."""
    c = rows.new_zeros((*rows.shape[:-2], rows.shape[-1]))
    for q in order:
        a_q = rows[..., q, :]
        gamma = 1.0 + (a_q * c).sum(-1, keepdim=True)
        c = c + gamma * a_q
    norm = c.abs().sum(-1, keepdim=True)
    return torch.where(norm > 0, c / norm.clamp_min(torch.finfo(c.dtype).tiny), 0.0)


def nexus_weights(direct: torch.Tensor, bridge: torch.Tensor, lam: float, eps_tie: float) -> torch.Tensor:
    """w [..., N] = a + lam * c~ + eps_tie * r, r_j = j / (N - 1) (0 oldest block, 1 newest; 0 if N = 1)."""
    n = direct.shape[-1]
    ramp = torch.arange(n, device=direct.device, dtype=direct.dtype) / max(n - 1, 1)
    return direct + lam * bridge + eps_tie * ramp


def forced_blocks(positions: torch.Tensor, window: int, block_size: int) -> torch.Tensor:
    """[..., N] bool: block 0 (sink), the blocks holding the last `window` valid slots, the newest block."""
    valid = positions >= 0
    ids = block_index(valid, block_size)
    n = math.ceil(positions.shape[-1] / block_size)
    recent = recent_slots(positions, window) & valid
    forced = block_sum(recent.long(), ids, n) > 0
    count = valid.sum(-1, keepdim=True)
    newest = ((count - 1).clamp_min(0) // block_size).clamp_max(n - 1)
    has_any = count > 0
    forced = forced | (torch.zeros_like(forced).scatter_(-1, newest, True) & has_any)
    forced[..., 0] |= has_any.squeeze(-1)
    return forced


def reservoir_priorities(weights: torch.Tensor, n: int, generator: torch.Generator | None) -> torch.Tensor:
    """Step 7's ranking key: [..., N] float64 n-averaged log priorities of `weights` [..., N] >= 0, from one
    draw of [..., N, n] uniforms (so a selection consumes the generator the same way whatever it keeps)."""
    uniforms = draw_uniforms(tuple(weights.shape), n, generator, weights.device)
    return reservoir_log_priorities(weights, uniforms)


def select_blocks(
    weights: torch.Tensor, candidates: torch.Tensor, k, n: int, generator: torch.Generator | None
) -> torch.Tensor:
    """Step 7: [..., N] bool, the top-k candidates by n-averaged reservoir priority (log space).

    weights [..., N] >= 0; k an int or LongTensor [...]; one draw of [..., N, n] float64 uniforms.
    """
    return select_top(reservoir_priorities(weights, n, generator), candidates, k)


def newest_slots(blocks: torch.Tensor, count: torch.Tensor, valid: torch.Tensor, block_size: int) -> torch.Tensor:
    """[..., P] bool: the newest `count` valid slots of each row's marked block.

    blocks [..., N] bool (at most one marked block per row), count [...] long (< b), valid [..., P] bool.
    Slot order is time order, so a block's newest slots are its last ones.
    """
    ids = block_index(valid, block_size).clamp_min(0)  # [..., P]
    in_block = blocks.gather(-1, ids) & valid
    size = block_sizes(valid, block_size).gather(-1, ids)  # tokens in each slot's block
    from_end = size - 1 - (valid.long().cumsum(-1) - 1) % block_size  # 0 = the newest slot of its block
    return in_block & (from_end < count.unsqueeze(-1))


def rescale_weights(weights: torch.Tensor, candidates: torch.Tensor, mode: str) -> torch.Tensor:
    """The reservoir's weights [..., N]: `weights` as they are ("raw") or divided by the mean weight of each
    row's candidate blocks ("mean").

    Why: Nexus weights sum to about 1 + lam, so each is about (1 + lam) / N (0.006 at 256 blocks). At that
    scale u^(1/w) is dominated by the largest of the n draws, and the n-averaged priority ranks like a single
    Efraimidis-Spirakis draw whatever n is: n does nothing. Rescaled to a mean of 1, n interpolates between
    sampling (n = 1) and top-K (large n) as the paper's Lemma A.2 intends. Rescaling is a per-row constant
    factor, so n = 1 gives the same selection either way (u^(1/(c w)) is monotone in u^(1/w)).
    See docs/methods.md for the measured inclusion frequencies.
    """
    if mode == "raw":
        return weights
    cand = candidates.to(weights.dtype)
    mean = (weights * cand).sum(-1, keepdim=True) / cand.sum(-1, keepdim=True).clamp_min(1)
    return weights / mean.clamp_min(torch.finfo(weights.dtype).tiny)


def share_blocks(free: torch.Tensor, block_size: int) -> torch.Tensor:
    """[B, H] whole blocks per head from `free` [B, H] selectable slots, pooling the leftovers of a row.

    Each head gets floor(free / b) blocks; the row's pooled leftover, floor(sum(free) / b) - sum of those,
    (< H blocks) goes one block each to the heads with the largest remainders (ties: lower head index).
    So a row never takes more than sum(free) slots, and never wastes a whole block to rounding.
    """
    base = free // block_size
    extra = free.sum(-1, keepdim=True) // block_size - base.sum(-1, keepdim=True)
    return base + (descending_ranks(free % block_size) < extra).long()


@register("nexus", order=8)
@dataclass(frozen=True)
class Nexus(ScorePolicy):
    """Nexus Sampling (uniform per-head budget); see the module docstring for every step and choice.

    walk_steps (H=3), lam (0.5), eps_tie (1e-6), reservoir_n (n=5): the paper's defaults.
    walk_rows: "recent" (default) or "spread", which window rows feed the walk.
    weight_scale: "raw" (default, the paper's formula on w_j as computed) or "mean" (w_j divided by the mean
                  weight of the row's candidate blocks before the reservoir); see `rescale_weights`.
    head_scores:  "averaged" (default, the paper's literal step 1: Q averaged over query heads, K over KV heads,
                  one attention map per layer) or "per_head" (steps 2-5 per KV head with its group's mean
                  query, as Ada-Nexus scores, then the block weights averaged over the KV heads: still one
                  block set per layer). Averaging keys across KV heads mixes subspaces the heads use
                  differently; on SmolLM2-135M it erases the needle (docs/methods.md, "The Nexus retrieval
                  gap"). A named setting, never the default: `nexus` stays the paper's method.
    leftover:     "partial_block" (default: the budget's free slots are all used, the last free mod b of them
                  as the newest slots of the next-ranked block) or "unused" (whole blocks only, the leftover
                  slots stay empty: the behaviour before issue 31). See steps 6-7 of the module docstring.
    """

    name: ClassVar[str] = "nexus"
    walk_steps: int = 3
    lam: float = 0.5
    eps_tie: float = 1e-6
    reservoir_n: int = 5
    walk_rows: str = "recent"

    weight_scale: str = "raw"
    head_scores: str = "averaged"
    leftover: str = "partial_block"

    def __post_init__(self) -> None:
        check_int(self.name, "walk_steps", self.walk_steps, 0)
        check_int(self.name, "reservoir_n", self.reservoir_n, 1)
        check_number(self.name, "lam", self.lam, 0)
        check_number(self.name, "eps_tie", self.eps_tie, 0)
        check_choice(self.name, "walk_rows", self.walk_rows, WALK_ROWS)
        check_choice(self.name, "weight_scale", self.weight_scale, WEIGHT_SCALES)
        check_choice(self.name, "head_scores", self.head_scores, HEAD_SCORES)
        check_choice(self.name, "leftover", self.leftover, LEFTOVERS)

    def min_budget(self, window: int, block_size: int) -> int:
        """Most the forced set can take, plus one block (so the reservoir always gets at least one).

        The forced set is the sink block (b) plus the recency blocks; with r tokens in the newest block
        (1 <= r <= b) the last W slots reach back over ceil((W - r) / b) whole blocks, so the recency part
        takes at most max_r r + b * ceil((W - r) / b) slots (47 for W=16, b=32: min_budget 111).
        """
        b = block_size
        recency = max(r + b * math.ceil(max(window - r, 0) / b) for r in range(1, b + 1))
        return b + recency + b

    # -- the math, shared by the uniform and the per-head paths --------------------------------------------

    def block_weights(self, queries, keys, query_positions, positions, scaling: float, block_size: int):
        """w [..., N] from queries [..., w, D], keys [..., P, D], positions [..., P] (steps 2-5)."""
        rows = block_attention(queries, keys, query_positions, positions, scaling, block_size)
        order = walk_row_indices(rows.shape[-2], self.walk_steps, self.walk_rows)
        return nexus_weights(direct_score(rows), walk_score(rows, order), self.lam, self.eps_tie)

    def keep_slots(
        self, weights, positions, window: int, block_size: int, budgets, generator, pool_heads: bool = False
    ) -> torch.Tensor:
        """[..., P] bool kept slots: the forced blocks + the budget's free slots by reservoir priority (steps 6-7).

        weights [..., N], positions [..., P], budgets: int or LongTensor [...] (tokens allowed per row).
        pool_heads: with leftover="unused", share the leftover slots of the heads of a batch row
        (`share_blocks`), for ragged counts; "partial_block" fills each row's budget exactly, nothing to pool.
        """
        b = block_size
        valid = positions >= 0
        sizes = block_sizes(valid, b)
        exists = sizes > 0
        forced = forced_blocks(positions, window, b) & exists
        forced_tokens = (sizes * forced).sum(-1)
        free = (torch.as_tensor(budgets, device=weights.device) - forced_tokens).clamp_min(0)  # [...] slots
        candidates = exists & ~forced
        weights = rescale_weights(weights, candidates, self.weight_scale)
        priorities = reservoir_priorities(weights, self.reservoir_n, generator)  # the one draw of this event
        if self.leftover == "unused":
            whole = select_top(priorities, candidates, share_blocks(free, b) if pool_heads else free // b)
            partial = torch.zeros_like(valid)
        else:
            whole = select_top(priorities, candidates, free // b)
            # the next block in priority order gives its newest free mod b slots (none when free mod b = 0, or
            # when every candidate is already whole: then the row keeps all its valid slots)
            nxt = select_top(priorities, candidates, free // b + 1) & ~whole
            partial = newest_slots(nxt, free % b, valid, b)
        keep = whole | forced
        return (keep.gather(-1, block_index(valid, b).clamp_min(0)) & valid) | partial

    def _check_budget(self, view: LayerView) -> None:
        floor = self.min_budget(view.window, view.block_size)
        if view.budget < floor:
            raise ValueError(
                f"nexus: budget {view.budget} is below min_budget {floor} (sink + recency blocks + one block "
                f"for window={view.window}, block_size={view.block_size})"
            )

    # -- uniform selection (the paper's Nexus) --------------------------------------------------------------

    def select(self, view: LayerView) -> torch.Tensor:
        self._check_budget(view)
        positions = view.positions[:, 0]  # [B, P]
        if bool((view.positions != positions.unsqueeze(1)).any()):
            raise ValueError(
                "nexus: KV heads hold different slots, but uniform Nexus selects one set per layer; "
                "use ada_nexus for head-adaptive budgets"
            )
        if self.head_scores == "per_head":
            # each KV head's block weights (its group's queries against its own keys), then averaged over the
            # heads: still one block set per layer, but scored where each head's attention lives
            weights = self.head_weights(view).mean(dim=1)  # [B, N]
        else:
            queries = view.queries.mean(dim=1)  # [B, w, D] mean over all query heads
            keys = view.keys.mean(dim=1)  # [B, P, D] mean over KV heads
            weights = self.block_weights(queries, keys, view.query_positions, positions, view.scaling, view.block_size)
        keep = self.keep_slots(weights, positions, view.window, view.block_size, view.budget, view.generator)
        return mask_to_indices(keep.unsqueeze(1).expand(-1, view.num_kv_heads, -1))

    # -- per-KV-head ScorePolicy interface (Ada-Nexus) ------------------------------------------------------

    def head_weights(self, view: LayerView) -> torch.Tensor:
        """[B, Hkv, N] per-head block weights with group-averaged queries."""
        queries = group_queries(view.queries, view.num_kv_heads).mean(dim=2)  # [B, Hkv, w, D]
        return self.block_weights(
            queries, view.keys, view.query_positions, view.positions, view.scaling, view.block_size
        )

    def score(self, view: LayerView) -> torch.Tensor:
        """[B, Hkv, P] float32: each head's block weight spread evenly over the block's tokens (0 if empty)."""
        weights = self.head_weights(view)
        valid = view.valid
        per_token = weights / block_sizes(valid, view.block_size).clamp_min(1)
        ids = block_index(valid, view.block_size)
        return per_token.gather(-1, ids.clamp_min(0)).masked_fill(~valid, 0.0).float()

    def forced(self, view: LayerView) -> torch.Tensor:
        """[B, Hkv, P] bool: the slots of each head's forced blocks (sink, recency window, newest block)."""
        valid = view.valid
        blocks = forced_blocks(view.positions, view.window, view.block_size)
        return blocks.gather(-1, block_index(valid, view.block_size).clamp_min(0)) & valid

    def select_counts(self, view: LayerView, counts: torch.Tensor) -> torch.Tensor:
        """[B, Hkv, max count]: per head its forced blocks + counts - forced reservoir slots (steps 6-7), exactly
        `counts` [B, Hkv] with "partial_block"; whole blocks pooled per row (`share_blocks`) with "unused"."""
        weights = self.head_weights(view)
        keep = self.keep_slots(
            weights, view.positions, view.window, view.block_size, counts, view.generator, pool_heads=True
        )
        return mask_to_indices(keep)
