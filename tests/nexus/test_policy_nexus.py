"""Nexus Sampling against a direct NumPy transcription of the paper's equations, plus the selection contract.

The NumPy reference below is written from the equations (loops over rows, slots and blocks), not from
`nexus.policies.nexus`; the only thing shared is the uniform stream (one `torch.rand` of shape
[B, N, n] float64 from the view's generator), which the policy documents. Both ways of filling the budget
are checked: `leftover="partial_block"` (the default: the next-ranked block gives its newest free mod b slots,
so a row keeps exactly its budget) and `leftover="unused"` (whole blocks only, the behaviour before issue 31).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nexus.policies import make_policy
from nexus.policies.base import LayerView
from nexus.policies.nexus import (
    Nexus,
    block_attention,
    direct_score,
    forced_blocks,
    nexus_weights,
    select_blocks,
    share_blocks,
    walk_row_indices,
    walk_score,
)

B, HQ, HKV, D, W, BS = 2, 8, 2, 16, 16, 32

# ----------------------------------------------------------------------------------------------------------
# NumPy reference, straight from the equations


def np_blocks_of(kpos: np.ndarray, b: int) -> np.ndarray:
    """Block of each slot: rank among the valid slots // b; -1 for an empty slot."""
    out, rank = np.full(len(kpos), -1), 0
    for p, pos in enumerate(kpos):
        if pos >= 0:
            out[p], rank = rank // b, rank + 1
    return out


def np_block_rows(q: np.ndarray, k: np.ndarray, qpos, kpos, scaling: float, b: int) -> np.ndarray:
    """S [w, N]: per query row, softmax over visible slots, summed per block, row-normalised."""
    blocks = np_blocks_of(kpos, b)
    n = math.ceil(len(kpos) / b)
    rows = np.zeros((len(qpos), n))
    for i, qp in enumerate(qpos):
        seen = [p for p in range(len(kpos)) if 0 <= kpos[p] <= qp]
        if not seen:
            continue
        logits = np.array([q[i] @ k[p] * scaling for p in seen])
        e = np.exp(logits - logits.max())
        for p, prob in zip(seen, e / e.sum(), strict=True):
            rows[i, blocks[p]] += prob
        rows[i] /= rows[i].sum()
    return rows


def np_walk(rows: np.ndarray, order) -> np.ndarray:
    c = np.zeros(rows.shape[1])
    for q in order:
        gamma = 1.0 + float(rows[q] @ c)
        c = c + gamma * rows[q]
    return c / np.abs(c).sum() if np.abs(c).sum() > 0 else c


def np_weights(rows: np.ndarray, order, lam: float, eps: float) -> np.ndarray:
    a = rows.mean(axis=0)
    n = rows.shape[1]
    r = np.arange(n) / (n - 1) if n > 1 else np.zeros(n)
    return a + lam * np_walk(rows, order) + eps * r


def np_forced(kpos: np.ndarray, window: int, b: int) -> set[int]:
    blocks = np_blocks_of(kpos, b)
    valid = [p for p in range(len(kpos)) if kpos[p] >= 0]
    recent = sorted(valid, key=lambda p: kpos[p])[-window:]
    return {0} | {int(blocks[p]) for p in recent} | {int(blocks[valid[-1]])}


def np_fill(kpos: np.ndarray, weights: np.ndarray, u: np.ndarray, budget: int, window: int, b: int, leftover: str):
    """Kept slots of one row (one KV head's slots `kpos`): its forced blocks, then the budget's free slots by
    reservoir priority pi_j = mean_i u_j^(i) ** (1 / w_j): whole blocks in priority order, then (partial_block)
    the newest free mod b slots of the next block in that order."""
    blocks = np_blocks_of(kpos, b)
    sizes = np.bincount(blocks[blocks >= 0], minlength=len(weights))
    forced = np_forced(kpos, window, b)
    free = max(budget - sum(int(sizes[j]) for j in forced), 0)
    cands = [j for j in range(len(weights)) if j not in forced and sizes[j] > 0]
    pi = {j: np.mean(u[j] ** (1.0 / weights[j])) for j in cands}  # direct formula, float64
    ranked = sorted(cands, key=lambda j: -pi[j])  # stable: ties to the lower block, as the policy breaks them
    keep = {p for p in range(len(kpos)) if blocks[p] in forced | set(ranked[: free // b])}
    if leftover == "partial_block" and free // b < len(ranked):
        slots = [p for p in range(len(kpos)) if blocks[p] == ranked[free // b]]
        keep |= set(slots[len(slots) - free % b :])  # its newest slots (slot order is time order)
    return sorted(keep)


def np_uniforms(view: LayerView, pol: Nexus, seed: int, per_head: bool) -> np.ndarray:
    """The policy's one draw: [B, (Hkv,) N, n] float64 uniforms from a generator seeded with `seed`."""
    n = math.ceil(view.physical_length / view.block_size)
    shape = (view.keys.shape[0], *((view.num_kv_heads,) if per_head else ()), n, pol.reservoir_n)
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).numpy()


def np_select(view: LayerView, pol: Nexus, seed: int) -> list[list[int]]:
    """Per batch row, the kept slots of uniform Nexus (head-averaged Q and K), from the equations."""
    q = view.queries.double().numpy().mean(axis=1)
    k = view.keys.double().numpy().mean(axis=1)
    qpos = view.query_positions.numpy()
    u = np_uniforms(view, pol, seed, per_head=False)
    out = []
    for bi in range(q.shape[0]):
        kpos = view.positions[bi, 0].numpy()
        rows = np_block_rows(q[bi], k[bi], qpos, kpos, view.scaling, view.block_size)
        w = np_weights(rows, walk_row_indices(len(qpos), pol.walk_steps, pol.walk_rows), pol.lam, pol.eps_tie)
        out.append(np_fill(kpos, w, u[bi], view.budget, view.window, view.block_size, pol.leftover))
    return out


# ----------------------------------------------------------------------------------------------------------
# views


def make_view(
    seed: int,
    length: int,
    budget: int,
    *,
    dtype=torch.float64,
    rows: int = W,
    gen_seed: int = 7,
    positions: torch.Tensor | None = None,
    query_positions: torch.Tensor | None = None,
) -> LayerView:
    g = torch.Generator().manual_seed(seed)
    if positions is None:
        positions = torch.arange(length).expand(B, HKV, length).clone()
    if query_positions is None:
        last = int(positions.max())
        query_positions = torch.arange(last - rows + 1, last + 1)
    return LayerView(
        layer_idx=0,
        num_layers=2,
        keys=(torch.randn(B, HKV, positions.shape[-1], D, generator=g) * 1.5).to(dtype),
        positions=positions,
        queries=(torch.randn(B, HQ, len(query_positions), D, generator=g) * 1.5).to(dtype),
        query_positions=query_positions,
        scaling=D**-0.5,
        budget=budget,
        window=W,
        block_size=BS,
        phase="prefill",
        generator=torch.Generator().manual_seed(gen_seed),
    )


def kept(idx: torch.Tensor, bi: int, hi: int) -> list[int]:
    return [i for i in idx[bi, hi].tolist() if i >= 0]


# ----------------------------------------------------------------------------------------------------------
# each step against the equations


@pytest.mark.parametrize("seed", range(4))
def test_block_attention_matches_equations_with_causal_mask_and_gaps(seed):
    g = torch.Generator().manual_seed(seed)
    p, w = 150, 12
    pos = torch.arange(p)
    pos[torch.randperm(p, generator=g)[:20]] = -1  # empty slots in the middle: blocks count valid slots
    q, k = torch.randn(w, D, generator=g, dtype=torch.float64), torch.randn(p, D, generator=g, dtype=torch.float64)
    qpos = torch.arange(120, 120 + w)  # window queries older than the newest keys: the mask must hide those
    got = block_attention(q, k, qpos, pos, D**-0.5, BS)
    want = np_block_rows(q.numpy(), k.numpy(), qpos.numpy(), pos.numpy(), D**-0.5, BS)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-14)
    assert np.allclose(got.sum(-1).numpy(), 1.0)
    late = [int(b) for b, kp in zip(np_blocks_of(pos.numpy(), BS), pos.tolist(), strict=True) if kp > 131]
    assert late and float(got[0, max(late)]) == 0.0  # no query sees the newest block


def test_block_attention_row_that_sees_nothing_is_zero():
    q, k = torch.randn(2, D, dtype=torch.float64), torch.randn(40, D, dtype=torch.float64)
    pos = torch.arange(10, 50)
    rows = block_attention(q, k, torch.tensor([5, 30]), pos, 1.0, BS)
    assert rows[0].abs().sum() == 0 and math.isclose(float(rows[1].sum()), 1.0)
    assert math.isclose(float(direct_score(rows).sum()), 1.0)  # the empty row is left out of the mean


@pytest.mark.parametrize("mode", ["recent", "spread"])
@pytest.mark.parametrize("steps", [0, 1, 3, 5])
@pytest.mark.parametrize("w", [2, 16])
def test_direct_walk_and_weights_match_equations(mode, steps, w):
    rows = torch.softmax(
        torch.randn(3, w, 11, generator=torch.Generator().manual_seed(steps + w), dtype=torch.float64) * 2, -1
    )
    order = walk_row_indices(w, steps, mode)
    assert len(order) == min(steps, w) and order == sorted(order)
    a, c = direct_score(rows), walk_score(rows, order)
    got = nexus_weights(a, c, 0.5, 1e-6)
    for bi in range(3):
        np.testing.assert_allclose(a[bi].numpy(), rows[bi].numpy().mean(0), rtol=1e-13)
        np.testing.assert_allclose(c[bi].numpy(), np_walk(rows[bi].numpy(), order), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(got[bi].numpy(), np_weights(rows[bi].numpy(), order, 0.5, 1e-6), rtol=1e-12)
    assert torch.allclose(a.sum(-1), torch.ones(3, dtype=torch.float64))
    if steps:
        assert torch.allclose(c.sum(-1), torch.ones(3, dtype=torch.float64))
    else:
        assert c.abs().sum() == 0  # H = 0: no bridge term


def test_walk_row_choices():
    assert walk_row_indices(16, 3, "recent") == [13, 14, 15]
    assert walk_row_indices(16, 3, "spread") == [0, 8, 15]
    assert walk_row_indices(2, 3, "recent") == [0, 1]
    assert walk_row_indices(16, 0, "spread") == []
    with pytest.raises(ValueError, match="walk_rows"):
        walk_row_indices(16, 3, "random")


def test_tie_break_ramp_goes_oldest_to_newest():
    z = torch.zeros(5, dtype=torch.float64)
    assert nexus_weights(z, z, 0.5, 1e-6).tolist() == pytest.approx([0, 0.25e-6, 0.5e-6, 0.75e-6, 1e-6])
    assert nexus_weights(torch.ones(1), torch.ones(1), 0.5, 1e-6).tolist() == [1.5]


def test_forced_blocks_sink_recency_and_partial_last_block():
    pos = torch.arange(300).view(1, 300)  # blocks 0..9, block 9 holds 12 tokens; last 16 slots span 8 and 9
    assert torch.nonzero(forced_blocks(pos, 16, 32)[0]).flatten().tolist() == [0, 8, 9]
    pos = torch.arange(320).view(1, 320)  # the last 16 slots lie inside block 9
    assert torch.nonzero(forced_blocks(pos, 16, 32)[0]).flatten().tolist() == [0, 9]


def test_select_blocks_is_top_k_by_direct_priority():
    w = torch.rand(2, 30, generator=torch.Generator().manual_seed(4), dtype=torch.float64) + 0.1
    cand = torch.ones(2, 30, dtype=torch.bool)
    cand[:, :3] = False
    keep = select_blocks(w, cand, torch.tensor([5, 9]), 5, torch.Generator().manual_seed(8))
    u = torch.rand((2, 30, 5), generator=torch.Generator().manual_seed(8), dtype=torch.float64).numpy()
    for bi, k in enumerate([5, 9]):
        pi = (u[bi] ** (1.0 / w[bi].numpy()[:, None])).mean(1)
        want = [j for j in np.argsort(-pi) if j >= 3][:k]
        assert set(torch.nonzero(keep[bi]).flatten().tolist()) == {int(j) for j in want}


# ----------------------------------------------------------------------------------------------------------
# the whole selection


@pytest.mark.parametrize("leftover", ["partial_block", "unused"])
@pytest.mark.parametrize(
    ("length", "budget", "mode"),  # free slots after the forced blocks: 74, 74, 135 and 64 (a multiple of b)
    [(150, 128, "recent"), (300, 150, "recent"), (257, 200, "spread"), (640, 128, "recent")],
)
@pytest.mark.parametrize("seed", range(3))
def test_select_matches_numpy_reference(length, budget, mode, seed, leftover):
    """With partial_block this also pins WHICH block gives the leftover slots (the next one by reservoir
    priority, from the same draws) and which of its slots (the newest free mod b)."""
    view = make_view(seed, length, budget, gen_seed=100 + seed)
    pol = Nexus(walk_rows=mode, leftover=leftover)
    idx = pol.select(view)
    want = np_select(view, pol, 100 + seed)
    for bi in range(B):
        for hi in range(HKV):
            assert kept(idx, bi, hi) == want[bi], (bi, hi)


def budget_for(length: int) -> int:
    """Budgets from min_budget up in steps of 13: rarely forced tokens + a multiple of b."""
    return Nexus().min_budget(W, BS) + (length % 5) * 13


@pytest.mark.parametrize("length", range(129, 420, 11))
def test_kept_set_is_exactly_the_budget(length):
    """partial_block: every row keeps exactly min(budget, valid) slots, the same in every head: its forced blocks
    whole, whole reservoir blocks, and one run of the newest free mod b slots of one more block."""
    budget = budget_for(length)
    view = make_view(length, length, budget, dtype=torch.float32)
    idx = Nexus().select(view)
    pos = view.positions[0, 0].numpy()  # slot p holds position p: block p // b
    forced = np_forced(pos, W, BS)
    sizes = np.bincount(np_blocks_of(pos, BS))
    free = budget - sum(sizes[j] for j in forced)
    assert idx.shape == (B, HKV, min(budget, length))
    for bi in range(B):
        row = kept(idx, bi, 0)
        assert len(row) == min(budget, length) and row == sorted(set(row))
        assert all(kept(idx, bi, hi) == row for hi in range(HKV)), "heads must share the selection"
        per_block = {j: [p for p in row if p // BS == j] for j in {p // BS for p in row}}
        assert all(len(per_block.get(j, [])) == sizes[j] for j in forced)
        partial = {j: slots for j, slots in per_block.items() if len(slots) < sizes[j]}
        if length > budget and free % BS:
            ((j, slots),) = partial.items()
            assert slots == list(range(j * BS + BS - free % BS, j * BS + BS)), "the partial block's newest slots"
        else:
            assert not partial


@pytest.mark.parametrize("length", range(129, 420, 11))
def test_unused_keeps_forced_plus_whole_blocks_within_budget(length):
    """leftover="unused" is the rounding before issue 31: forced blocks + floor(free / b) whole blocks."""
    pol = Nexus(leftover="unused")
    budget = budget_for(length)
    view = make_view(length, length, budget, dtype=torch.float32)
    idx = pol.select(view)
    pos = view.positions[0, 0]
    forced = np_forced(pos.numpy(), W, BS)
    sizes = np.bincount(np_blocks_of(pos.numpy(), BS))
    forced_tokens = sum(sizes[j] for j in forced)
    expect = forced_tokens + min((budget - forced_tokens) // BS, len(sizes) - len(forced)) * BS
    assert idx.shape == (B, HKV, min(expect, length))
    for bi in range(B):
        row = kept(idx, bi, 0)
        assert len(row) <= budget and row == sorted(set(row))
        assert all(kept(idx, bi, hi) == row for hi in range(HKV)), "heads must share the selection"
        blocks = {p // BS for p in row}
        assert forced <= blocks and all(sum(1 for p in row if p // BS == j) == sizes[j] for j in blocks)


@pytest.mark.parametrize("seed", range(4))
def test_partial_block_is_the_next_ranked_block_after_the_unused_selection(seed):
    """Same seed, same draws: partial_block keeps exactly what unused keeps, plus the newest free mod b slots of
    the candidate block with the highest priority pi_j = mean_i u_j^(i) ** (1 / w_j) among those left out."""
    length, budget = 500, 203  # forced: block 0 + block 15 (480..499, 20 tokens); free 151 = 4 blocks + 23
    view = make_view(seed, length, budget, gen_seed=seed)
    unused = Nexus(leftover="unused").select(view)
    view.generator = torch.Generator().manual_seed(seed)
    partial = Nexus().select(view)
    u = np_uniforms(view, Nexus(), seed, per_head=False)
    q, k = view.queries.double().numpy().mean(axis=1), view.keys.double().numpy().mean(axis=1)
    for bi in range(B):
        rows = np_block_rows(q[bi], k[bi], view.query_positions.numpy(), np.arange(length), view.scaling, BS)
        w = np_weights(rows, walk_row_indices(W, 3, "recent"), 0.5, 1e-6)
        before, after = kept(unused, bi, 0), kept(partial, bi, 0)
        assert len(before) == 52 + 4 * BS and len(after) == budget and set(before) < set(after)
        left_out = [j for j in range(1, 15) if j * BS not in before]
        nxt = max(left_out, key=lambda j: np.mean(u[bi, j] ** (1.0 / w[j])))
        assert sorted(set(after) - set(before)) == list(range(nxt * BS + BS - 23, nxt * BS + BS))


def test_blocks_stay_aligned_over_a_stream_of_events_with_unused_leftover():
    """Keeping whole blocks + the newest partial one means that after compaction and appending, every block
    is still one logical run {32m, ..., 32m + 31} (so scores at the next event see the same blocks)."""
    pol, pos, length = Nexus(leftover="unused"), torch.arange(300), 300
    for event in range(5):
        view = make_view(event, 0, 150, positions=pos.expand(B, HKV, -1).clone(), gen_seed=event)
        idx = pol.select(view)
        pos = pos[idx[0, 0][idx[0, 0] >= 0]]
        assert len(pos) <= 150 and pos[:32].tolist() == list(range(32))  # the sink block survives
        pos = torch.cat([pos, torch.arange(length, length + 45)])  # the next forward's tokens
        length += 45
        for j in range(math.ceil(len(pos) / BS)):
            run = pos[j * BS : (j + 1) * BS].tolist()
            assert run == list(range(run[0], run[0] + len(run))) and len({p // BS for p in run}) == 1, (event, j)


def test_a_stream_of_events_keeps_exactly_the_budget():
    """partial_block fills the budget at every event and the sink block survives; the price (nexus.py, step 7):
    after a partial run the next event's blocks straddle two logical blocks."""
    pol, pos, length, straddling = Nexus(), torch.arange(300), 300, 0
    for event in range(5):
        view = make_view(event, 0, 150, positions=pos.expand(B, HKV, -1).clone(), gen_seed=event)
        idx = pol.select(view)
        pos = pos[idx[0, 0][idx[0, 0] >= 0]]
        assert len(pos) == 150 and pos[:32].tolist() == list(range(32)), event
        pos = torch.cat([pos, torch.arange(length, length + 45)])
        length += 45
        runs = [pos[j * BS : (j + 1) * BS].tolist() for j in range(math.ceil(len(pos) / BS))]
        straddling += sum(len({p // BS for p in run}) > 1 for run in runs)
    assert straddling > 0


def test_min_budget_covers_the_largest_forced_set():
    pol = Nexus()
    assert pol.min_budget(16, 32) == 111 and pol.min_budget(1, 32) == 96 and pol.min_budget(64, 32) == 159
    for window, b in [(16, 32), (33, 32), (5, 4), (64, 16)]:
        worst = 0
        for length in range(1, 6 * b + window):
            pos = torch.arange(length).view(1, length)
            blocks = forced_blocks(pos, window, b)[0]
            sizes = np.bincount(np_blocks_of(pos[0].numpy(), b))
            worst = max(worst, int(sum(sizes[j] for j in torch.nonzero(blocks).flatten().tolist())))
        assert worst + b == pol.min_budget(window, b), (window, b)


def test_short_cache_keeps_everything():
    view = make_view(0, 140, 200)
    assert [kept(Nexus().select(view), 0, 0)] == [list(range(140))]


def test_same_seed_same_selection_different_seed_usually_different():
    pol = Nexus()
    first = pol.select(make_view(3, 500, 200, gen_seed=11))
    assert torch.equal(first, pol.select(make_view(3, 500, 200, gen_seed=11)))
    others = [pol.select(make_view(3, 500, 200, gen_seed=s)) for s in range(12, 18)]
    assert any(not torch.equal(first, o) for o in others)


def test_low_precision_inputs_work():
    view = make_view(1, 400, 160, dtype=torch.bfloat16)
    idx = Nexus().select(view)  # forced: blocks 0 and 12 (32 + 16 tokens) + 3 whole blocks + 16 slots of a 4th
    assert idx.shape == (B, HKV, 160) and bool((idx >= 0).all())


def test_budget_below_min_and_ragged_heads_are_refused():
    with pytest.raises(ValueError, match="min_budget 111"):
        Nexus().select(make_view(0, 300, 110))
    pos = torch.arange(300).expand(B, HKV, 300).clone()
    pos[:, 1, 5] = -1
    with pytest.raises(ValueError, match="ada_nexus"):
        Nexus().select(make_view(0, 300, 200, positions=pos))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("walk_steps", -1),
        ("walk_steps", 1.5),
        ("walk_steps", True),
        ("lam", -0.1),
        ("lam", float("nan")),
        ("eps_tie", -1e-6),
        ("eps_tie", "x"),
        ("reservoir_n", 0),
        ("reservoir_n", 2.0),
        ("walk_rows", "last"),
        ("head_scores", "per_query"),
        ("leftover", "pad"),
        ("leftover", None),
    ],
)
def test_bad_hyperparameters_raise(field, value):
    with pytest.raises(ValueError, match=field):
        Nexus(**{field: value})


def test_registered_by_name():
    pol = make_policy("nexus", walk_steps=2, lam=0.25, walk_rows="spread", reservoir_n=3, eps_tie=0.0)
    assert isinstance(pol, Nexus) and pol.walk_steps == 2 and pol.name == "nexus"
    with pytest.raises(ValueError, match="walk_steps"):
        make_policy("nexus", walk_step=2)


# ----------------------------------------------------------------------------------------------------------
# the per-KV-head ScorePolicy side (Ada-Nexus)


def np_head_weights(view: LayerView, bi: int, hi: int, pol: Nexus) -> np.ndarray:
    g = HQ // HKV
    q = view.queries[bi, hi * g : (hi + 1) * g].double().numpy().mean(axis=0)
    k = view.keys[bi, hi].double().numpy()
    rows = np_block_rows(q, k, view.query_positions.numpy(), view.positions[bi, hi].numpy(), view.scaling, BS)
    return np_weights(rows, walk_row_indices(len(rows), pol.walk_steps, pol.walk_rows), pol.lam, pol.eps_tie)


def ragged_view(seed: int, budget: int = 200) -> LayerView:
    """Heads holding different slots (after an Ada event): each head a random prefix, then new tokens."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.full((B, HKV, 330), -1)
    for bi in range(B):
        for hi in range(HKV):
            n_old = int(torch.randint(150, 280, (1,), generator=g))
            old = torch.randperm(500, generator=g)[:n_old].sort().values
            pos[bi, hi, :n_old] = old
            pos[bi, hi, 280:] = torch.arange(500, 550)
    return make_view(seed, 0, budget, positions=pos)


@pytest.mark.parametrize("seed", range(3))
def test_head_scores_spread_block_weights_over_tokens(seed):
    view, pol = ragged_view(seed), Nexus()
    scores = pol.score(view)
    assert scores.shape == (B, HKV, 330) and scores.dtype == torch.float32
    for bi in range(B):
        for hi in range(HKV):
            w = np_head_weights(view, bi, hi, pol)
            kpos = view.positions[bi, hi].numpy()
            blocks = np_blocks_of(kpos, BS)
            sizes = np.bincount(blocks[blocks >= 0], minlength=len(w))
            want = np.array([w[blocks[p]] / sizes[blocks[p]] if blocks[p] >= 0 else 0.0 for p in range(len(kpos))])
            np.testing.assert_allclose(scores[bi, hi].numpy(), want, rtol=1e-5, atol=1e-9)
            assert math.isclose(float(scores[bi, hi].sum()), float(w[sizes > 0].sum()), rel_tol=1e-5)
            forced = pol.forced(view)[bi, hi]
            want_forced = {p for p in range(len(kpos)) if blocks[p] in np_forced(kpos, W, BS)}
            assert set(torch.nonzero(forced).flatten().tolist()) == want_forced


@pytest.mark.parametrize("seed", range(3))
def test_select_counts_keeps_exactly_the_counts(seed):
    """partial_block: each head keeps exactly its count, chosen by its own reservoir (one draw [B, Hkv, N, n]):
    its forced blocks, whole blocks by priority, then the newest leftover slots of its next-ranked block.
    The same seed gives the same selection."""
    view, pol = ragged_view(seed), Nexus()
    counts = torch.tensor([[190, 230], [150, 260]]).minimum(view.valid.sum(-1))
    idx = pol.select_counts(view, counts)
    u = np_uniforms(view, pol, 7, per_head=True)  # make_view's generator seed
    for bi in range(B):
        for hi in range(HKV):
            kpos, count = view.positions[bi, hi].numpy(), int(counts[bi, hi])
            want = np_fill(kpos, np_head_weights(view, bi, hi, pol), u[bi, hi], count, W, BS, "partial_block")
            assert kept(idx, bi, hi) == want and len(want) == count, (bi, hi)
    assert idx.shape[-1] == int(counts.max())
    view.generator = torch.Generator().manual_seed(7)
    assert torch.equal(pol.select_counts(view, counts), idx)


def test_ada_nexus_keeps_exactly_its_ada_counts():
    """End to end: each head holds exactly the count Ada-KV allocated it; "unused" still pools whole blocks per
    row (never over sum(counts), less than one block under it)."""
    view = make_view(4, 400, 130)
    pol = make_policy("ada_nexus")
    counts = pol.counts(view)
    assert bool((counts != counts[:, :1]).any()), "the allocation must be ragged for this to mean anything"
    assert torch.equal((pol.select(view) >= 0).sum(-1), counts)
    view.generator = torch.Generator().manual_seed(7)
    held = (make_policy("ada_nexus", leftover="unused").select(view) >= 0).sum(-1).sum(-1)
    assert bool((held <= counts.sum(-1)).all()) and bool((held > counts.sum(-1) - BS).all())


def test_select_counts_unused_keeps_forced_plus_shared_whole_blocks():
    view, pol = ragged_view(5), Nexus(leftover="unused")
    counts = torch.tensor([[190, 230], [150, 260]])
    idx = pol.select_counts(view, counts)
    forced = pol.forced(view)
    forced_h = forced.sum(-1)
    free = (counts - forced_h).clamp_min(0)
    blocks = share_blocks(free, BS)
    assert torch.equal(blocks.sum(-1), free.sum(-1) // BS)  # the row's leftovers are pooled, none wasted
    for bi in range(B):
        for hi in range(HKV):
            row = kept(idx, bi, hi)
            assert row == sorted(set(row)) and all(int(view.positions[bi, hi, p]) >= 0 for p in row)
            assert set(torch.nonzero(forced[bi, hi]).flatten().tolist()) <= set(row)
            assert len(row) == int(forced_h[bi, hi] + BS * blocks[bi, hi])
        assert sum(len(kept(idx, bi, hi)) for hi in range(HKV)) <= int(counts[bi].sum())
    assert idx.shape[-1] == max(len(kept(idx, bi, hi)) for bi in range(B) for hi in range(HKV))


def test_share_blocks_largest_remainder():
    free = torch.tensor([[40, 50, 70], [31, 31, 2]])
    # row 0: floors 1,1,2 (=4 blocks of 160 slots) -> pooled floor 5: one more to the head with remainder 18
    assert share_blocks(free, 32).tolist() == [[1, 2, 2], [1, 1, 0]]


# ----------------------------------------------------------------------------------------------------------
# head_scores="per_head": one block set per layer, scored per KV head and averaged (a named setting, not the
# paper's default; see docs/methods.md "The Nexus retrieval gap")


@pytest.mark.parametrize("seed", range(3))
def test_per_head_scores_average_each_heads_weights(seed):
    view, pol = make_view(seed, 300, 200), Nexus(head_scores="per_head", reservoir_n=1)
    weights = pol.head_weights(view).mean(dim=1)
    for bi in range(B):
        want = np.mean([np_head_weights(view, bi, hi, pol) for hi in range(HKV)], axis=0)
        np.testing.assert_allclose(weights[bi].numpy(), want, rtol=1e-9, atol=1e-12)
    idx = pol.select(view)
    assert all(kept(idx, bi, 0) == kept(idx, bi, hi) for bi in range(B) for hi in range(HKV))  # one set per layer


def test_averaging_keys_across_heads_can_erase_what_each_head_attends_to():
    """Two KV heads store the same 'needle' block with opposite keys (heads use different subspaces). Each head's
    queries match its own key strongly, so per-head scoring finds the block; the head-averaged key is zero
    there, so the paper's literal head-averaged scoring cannot see it."""
    length, needle = 256, range(96, 128)  # block 3
    view = make_view(0, length, 32 + 48 + 32)  # sink + recency + exactly one chosen block
    direction = torch.zeros(D, dtype=torch.float64)
    direction[0] = 1.0
    keys, queries = view.keys * 0.05, view.queries * 0.0
    for h, sign in ((0, 1.0), (1, -1.0)):
        keys[:, h, needle] = sign * 8 * direction
        queries[:, h * (HQ // HKV) : (h + 1) * (HQ // HKV)] = sign * 8 * direction
    view.keys, view.queries = keys, queries
    needle_kept = {
        mode: all(
            set(needle) <= set(kept(Nexus(head_scores=mode, reservoir_n=1000).select(view), bi, 0)) for bi in range(B)
        )
        for mode in ("averaged", "per_head")
    }
    assert needle_kept == {"averaged": False, "per_head": True}
