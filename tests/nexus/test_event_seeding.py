"""Where the reservoir's randomness comes from (nexus/policies/reservoir.py, "Where the randomness comes from").

- Each event is seeded from (seed, layer, logical length): full-context turns, which rebuild the cache every
  turn, draw fresh uniforms each turn instead of repeating the first turn's (the old event-counter seed
  froze every history block's noise for the whole episode).
- The mix is integer arithmetic: pinned values, the same on every machine.
- The uniforms come from a CPU generator and are then moved to the cache's device, so a CPU replay makes
  the selections a GPU run made.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import nexus
import nexus.policies.nexus as nexus_policy
from nexus.attention import cache_kwarg
from nexus.policies.nexus import Nexus
from nexus.policies.reservoir import draw_uniforms, event_generator, event_seed
from tests.tiny_models import tiny_qwen3


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3(torch.float32, layers=2)


@pytest.fixture
def drawn(monkeypatch):
    """Every uniform tensor Nexus draws, in order (a recording wrapper around the real draw_uniforms)."""
    seen: list[torch.Tensor] = []

    def recording(shape, n, generator, device):
        assert generator is not None and generator.device.type == "cpu"
        u = draw_uniforms(shape, n, generator, device)
        seen.append(u.clone())
        return u

    monkeypatch.setattr(nexus_policy, "draw_uniforms", recording)
    return seen


def _prefill(model, ids: torch.Tensor, seed: int = 0) -> nexus.EvictableCache:
    cfg = nexus.EvictionConfig(method="nexus", scope="prefill_only", density=0.3, window=4, block_size=4, seed=seed)
    cache = nexus.EvictableCache(model.config, cfg)
    with torch.no_grad():
        model(ids, **{cache_kwarg(model): cache})
    return cache


def test_event_seed_is_a_pinned_integer_mix():
    # SplitMix64 over (seed, layer, logical length): these values hold on every machine and Python
    assert event_seed(0, 0, 0) == 1279368494785126216
    assert event_seed(0, 0, 100) == 7437073742120658841
    assert event_seed(7, 31, 65536) == 3034422104837671954
    seeds = {event_seed(s, layer, n) for s in range(3) for layer in range(4) for n in (100, 101, 4096)}
    assert len(seeds) == 36 and all(0 <= x < 2**63 for x in seeds)
    a, b = event_generator(1, 2, 300), event_generator(1, 2, 300)
    assert torch.equal(torch.rand(8, generator=a), torch.rand(8, generator=b))


def test_two_full_context_turns_draw_different_uniforms(model, drawn):
    """Turn 2 re-prefills turn 1's history plus an observation into a fresh cache: its draws must not
    repeat turn 1's for the blocks the two turns share."""
    ids = torch.randint(0, 1000, (1, 260), generator=torch.Generator().manual_seed(1))
    _prefill(model, ids[:, :200])
    turn1 = list(drawn)
    drawn.clear()
    _prefill(model, ids)
    turn2 = list(drawn)
    assert len(turn1) == len(turn2) == model.config.num_hidden_layers  # one draw per layer per turn
    for u1, u2 in zip(turn1, turn2, strict=True):
        shared = u1.shape[1]  # blocks of turn 1's history (turn 2 has more)
        assert u2.shape[1] > shared
        assert not torch.equal(u1, u2[:, :shared]), "turn 2 repeated turn 1's noise on the shared blocks"


def test_a_cpu_rerun_draws_and_keeps_the_same(model, drawn):
    ids = torch.randint(0, 1000, (1, 220), generator=torch.Generator().manual_seed(2))
    first = _prefill(model, ids)
    draws_first = [u.clone() for u in drawn]
    drawn.clear()
    again = _prefill(model, ids)
    assert all(torch.equal(a, b) for a, b in zip(draws_first, drawn, strict=True))
    for layer in range(model.config.num_hidden_layers):
        assert torch.equal(first.retained_positions(layer), again.retained_positions(layer))
    drawn.clear()
    _prefill(model, ids, seed=1)
    assert not any(torch.equal(a, b) for a, b in zip(draws_first, drawn, strict=True))  # the seed matters


def test_uniforms_come_from_the_cpu_generator_whatever_the_device():
    """The draw happens on the CPU and only the result moves: a 'meta' target consumes the CPU stream
    exactly like a CPU target, and a non-CPU generator is refused."""
    g_cpu, g_meta = event_generator(0, 3, 500), event_generator(0, 3, 500)
    on_cpu = draw_uniforms((2, 9), 5, g_cpu, "cpu")
    on_meta = draw_uniforms((2, 9), 5, g_meta, torch.device("meta"))
    assert on_meta.device.type == "meta" and on_meta.shape == on_cpu.shape == (2, 9, 5)
    assert torch.equal(torch.rand(4, generator=g_cpu), torch.rand(4, generator=g_meta))  # same state after
    accelerator_generator = SimpleNamespace(device=torch.device("cuda"))  # test double: no GPU here
    with pytest.raises(ValueError, match="needs a CPU generator"):
        draw_uniforms((3,), 5, accelerator_generator, "cpu")


@pytest.mark.gpu
def test_cpu_and_cuda_caches_make_the_same_selection():
    """The same weights on either device give the same kept blocks (float64, so the scores agree)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    g = torch.Generator().manual_seed(0)
    b, hq, hkv, p, w, d = 1, 4, 2, 300, 8, 16
    positions = torch.arange(p).expand(b, hkv, p).contiguous()
    keys = torch.randn(b, hkv, p, d, generator=g, dtype=torch.float64)
    queries = torch.randn(b, hq, w, d, generator=g, dtype=torch.float64)
    kept = []
    for device in ("cpu", "cuda"):
        view = nexus_policy.LayerView(
            layer_idx=0,
            num_layers=1,
            keys=keys.to(device),
            positions=positions.to(device),
            queries=queries.to(device),
            query_positions=torch.arange(p - w, p, device=device),
            scaling=d**-0.5,
            budget=120,
            window=8,
            block_size=8,
            phase="prefill",
            generator=event_generator(0, 0, p),
        )
        kept.append(Nexus().select(view).cpu())
    assert torch.equal(kept[0], kept[1])
