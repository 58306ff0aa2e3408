"""Weighted reservoir selection (Efraimidis-Spirakis priorities, n-averaged), in log space.

Nexus Sampling (paper section 2.3) keeps K of the candidate blocks by the n-averaged priority

    pi_j = (1/n) * sum_i (u_j^(i)) ** (1 / w_j),      u_j^(i) ~ U(0, 1) i.i.d.,

taking the top K by pi_j. n = 1 is the classic weighted-without-replacement sampler; as n grows pi_j
concentrates on E[u^(1/w)] = w / (1 + w), which is increasing in w, so the selection converges to the
deterministic top-K by weight. With weights near 1e-3, u^(1/w) underflows to 0 in float32 and the top-K
among zeros becomes arbitrary, so everything here works with

    log pi_j = logsumexp_i(log u_j^(i) / w_j) - log n

in float64, which is exact (it is the same number) and never underflows for w >= 1e-300.

Shapes: any leading dims `...` (batch, KV head), N candidates on the last axis, n draws after it.

Where the randomness comes from (the rule the cache follows at every eviction event):

- Each (layer, event) gets its own CPU generator seeded with `event_seed(seed, layer, logical_length)`,
  a SplitMix64 mix of the run's seed, the layer index and the logical length of the stream at the event.
  The logical length, not an event counter, is what makes the draws differ between the turns of the
  full-context protocol: each turn builds a fresh cache, so a counter would restart at 0 every turn and
  freeze every history block's noise for the whole episode, while the history (and so the length at each
  turn's prefill event) only grows. Within one cache a layer evicts at most once per logical length.
- The mix is plain integer arithmetic, so it is the same on every machine and Python version (Python's
  `hash` of a tuple is not promised to be).
- The uniforms are drawn on the CPU (`draw_uniforms` refuses any other generator) and then moved to the
  cache's device: CPU and CUDA generators give different streams for the same seed, so drawing on the
  CPU is what lets a CPU replay reproduce a GPU run's selections. They are N x n numbers per row (a few
  thousand at 64K tokens), so the copy is negligible next to the event's attention.
"""

from __future__ import annotations

import math

import torch

NEG_INF = float("-inf")
_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """One SplitMix64 step (Steele, Lea and Flood 2014): a bijective, well-mixed 64-bit scramble."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def event_seed(seed: int, layer: int, logical_length: int) -> int:
    """The generator seed of one eviction event: a stable mix of (seed, layer, logical length), < 2**63."""
    x = 0
    for part in (seed, layer, logical_length):
        x = _splitmix64(x ^ (int(part) & _MASK64))
    return x >> 1  # torch.Generator.manual_seed takes a signed 64-bit value


def event_generator(seed: int, layer: int, logical_length: int) -> torch.Generator:
    """A CPU generator seeded with `event_seed(seed, layer, logical_length)`."""
    return torch.Generator(device="cpu").manual_seed(event_seed(seed, layer, logical_length))


def draw_uniforms(shape: tuple[int, ...], n: int, generator: torch.Generator | None, device) -> torch.Tensor:
    """[*shape, n] float64 uniforms in (0, 1), drawn in one call from the CPU `generator`, then moved to `device`.

    One call per selection keeps the stream reproducible: the same generator state gives the same draws,
    whatever `device` is. `None` means a fresh CPU generator seeded with 0 (still deterministic). A CUDA
    generator is refused (see the module docstring). Exact zeros (possible from `torch.rand`) are lifted
    to the smallest positive double so log u stays finite.
    """
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    if generator.device.type != "cpu":
        raise ValueError(
            f"draw_uniforms needs a CPU generator (got one on {generator.device}): the draws must not depend "
            "on the device the cache lives on"
        )
    u = torch.rand((*shape, n), generator=generator, dtype=torch.float64)
    return u.clamp_min(torch.finfo(torch.float64).tiny).to(device)


def reservoir_log_priorities(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """log pi [...] = logsumexp_i(log u[..., i] / w) - log n, float64.

    weights: [...] >= 0 (a weight of 0 gives -inf: such a candidate is ranked last).
    uniforms: [..., n] in (0, 1), e.g. from `draw_uniforms`.
    """
    w = weights.to(torch.float64).unsqueeze(-1)
    z = uniforms.to(torch.float64).log() / w  # log u < 0, so w = 0 gives -inf, never nan
    return torch.logsumexp(z, dim=-1) - math.log(uniforms.shape[-1])


def direct_priorities(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """pi [...] = mean_i u[..., i] ** (1 / w) in the dtype of `uniforms` (the naive formula; it underflows).

    Kept only to show (and test) what the log-space form protects against; selection never uses it.
    """
    return (uniforms ** (1.0 / weights.to(uniforms.dtype).unsqueeze(-1))).mean(dim=-1)


def descending_ranks(key: torch.Tensor) -> torch.Tensor:
    """[..., N] long: 0 for the largest entry of each row, 1 for the next, ...; ties go to the lower index."""
    order = key.argsort(dim=-1, descending=True, stable=True)
    ranks = torch.arange(key.shape[-1], device=key.device).expand_as(order)
    return torch.empty_like(order).scatter_(-1, order, ranks)


def select_top(log_priorities: torch.Tensor, candidates: torch.Tensor, k: int | torch.Tensor) -> torch.Tensor:
    """[..., N] bool: the k candidates with the highest priority (fewer if there are fewer candidates).

    k: an int or a LongTensor of the leading shape `...` (a different k per row, e.g. per KV head).
    A candidate whose priority is -inf (weight 0) still ranks above every non-candidate; exact ties go to
    the lower index (stable sort).
    """
    lowest = torch.finfo(log_priorities.dtype).min
    key = torch.where(candidates, log_priorities.clamp_min(lowest), NEG_INF)
    ranks = descending_ranks(key)
    k = torch.as_tensor(k, device=key.device)
    limit = k.unsqueeze(-1) if k.dim() else k
    return candidates & (ranks < limit)
