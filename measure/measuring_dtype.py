"""The dtype a measuring model runs in: ``float32`` or ``bfloat16``, one named setting per replay or probe run.

Teacher forcing a history through a model is arithmetic, and on a CPU with bfloat16 units (AMX, or AVX-512 BF16)
bfloat16 matrix products run several times faster than float32 ones. A GPU runs this model family in bfloat16
anyway (the paper's numbers are bfloat16). So ``auto`` picks:

1. on a GPU, bfloat16 (the dtype Qwen3 and SmolLM2 ship their weights in);
2. on a CPU that reports ``amx_bf16`` or ``avx512_bf16`` in /proc/cpuinfo, bfloat16 only if a matrix product of the
   measuring model's shape is measured at least ``MIN_BF16_SPEEDUP`` times faster in bfloat16 than in float32 here
   (a CPU flag is not a rate: an emulated or throttled unit gains nothing);
3. float32 everywhere else.

The choice is made once, where a run is planned, and stored with every result it produces (``Replay.dtype``, the
probe run's ``dtype``); the tables print it and never pair cells measured in different dtypes. Exactness tests keep
float32 / float64: a comparison against a reference is not a measurement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from agent_runner.measuring_dtypes import MEASURING_DTYPES

#: what ``--dtype`` accepts: a measuring dtype, or ``auto`` (the choice above)
DTYPE_CHOICES: tuple[str, ...] = ("auto", *MEASURING_DTYPES)
#: CPU flags that say bfloat16 matrix products have units of their own
BF16_CPU_FLAGS: tuple[str, ...] = ("amx_bf16", "avx512_bf16")
#: how much faster a bfloat16 matmul must measure before ``auto`` takes it on a CPU
MIN_BF16_SPEEDUP = 1.5
#: the measured product: [tokens, hidden] @ [hidden, mlp] of SmolLM2-135M's MLP, a prefill chunk's shape
_SHAPE = (512, 576, 1536)


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype chosen, and why (printed where a run starts, so a reader knows what its numbers were measured in)."""

    dtype: str
    why: str


def cpu_bf16_flags(cpuinfo: str | None = None) -> list[str]:
    """The bfloat16 flags the CPU reports (``BF16_CPU_FLAGS`` found in /proc/cpuinfo), in that order."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text(errors="replace") if path.exists() else ""
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return [f for f in BF16_CPU_FLAGS if f in flags]


@lru_cache(maxsize=1)
def matmul_rates() -> tuple[float, float]:
    """(float32, bfloat16) GFLOPS of one ``_SHAPE`` product on this process's torch threads, best of 5 after a
    warm-up (about 0.2 s; measured once per process)."""
    import torch

    m, k, n = _SHAPE
    rates = []
    for dtype in (torch.float32, torch.bfloat16):
        gen = torch.Generator().manual_seed(0)
        a, b = torch.randn(m, k, generator=gen).to(dtype), torch.randn(k, n, generator=gen).to(dtype)
        a @ b  # warm-up: the first call picks the kernel
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
        rates.append(2 * m * k * n / best / 1e9)
    return rates[0], rates[1]


def check_dtype(requested: str) -> str:
    """``requested`` if it is one of ``DTYPE_CHOICES``; ValueError naming them otherwise."""
    if requested not in DTYPE_CHOICES:
        raise ValueError(f"unknown dtype {requested!r}; use {', '.join(DTYPE_CHOICES)}")
    return requested


def choose_dtype(requested: str, *, cuda: bool | None = None, flags: list[str] | None = None) -> DtypeChoice:
    """The measuring dtype for ``requested`` (``auto`` resolved as the module says). ``cuda``: whether the model runs
    on a GPU (default: whether torch sees one); ``flags``: the CPU's bfloat16 flags (default: /proc/cpuinfo)."""
    check_dtype(requested)
    if requested != "auto":
        return DtypeChoice(requested, "asked for")
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if cuda:
        return DtypeChoice("bfloat16", "auto: a GPU (the model family's own dtype)")
    flags = cpu_bf16_flags() if flags is None else flags
    if not flags:
        return DtypeChoice("float32", "auto: this CPU reports no bfloat16 units")
    fp32, bf16 = matmul_rates()
    rates = f"{', '.join(flags)}; a matmul measured {bf16:.0f} GFLOPS in bfloat16, {fp32:.0f} in float32"
    if bf16 >= MIN_BF16_SPEEDUP * fp32:
        return DtypeChoice("bfloat16", f"auto: {rates}")
    return DtypeChoice("float32", f"auto: {rates}, under {MIN_BF16_SPEEDUP}x")
