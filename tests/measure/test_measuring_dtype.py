"""The measuring dtype: ``auto`` takes bfloat16 on a GPU, or on a CPU whose bfloat16 units measure faster."""

from __future__ import annotations

import pytest

from measure import measuring_dtype as md

CPUINFO = """processor\t: 0
flags\t\t: fpu sse2 avx512f avx512_bf16 avx512_vnni
processor\t: 1
flags\t\t: fpu sse2 avx512f avx512_bf16 avx512_vnni amx_bf16 amx_tile
"""


def test_the_cpu_flags_are_read_from_cpuinfo():
    assert md.cpu_bf16_flags(CPUINFO) == ["amx_bf16", "avx512_bf16"]
    assert md.cpu_bf16_flags("flags\t: fpu sse2 avx2\n") == []


def test_an_asked_dtype_is_taken_as_asked_and_a_bad_one_is_named():
    assert md.choose_dtype("float32", cuda=True) == md.DtypeChoice("float32", "asked for")
    assert md.choose_dtype("bfloat16", cuda=False, flags=[]).dtype == "bfloat16"
    with pytest.raises(ValueError, match="unknown dtype 'fp16'; use auto, float32, bfloat16"):
        md.choose_dtype("fp16")


def test_auto_is_bfloat16_on_a_gpu_and_float32_on_a_cpu_without_units():
    assert md.choose_dtype("auto", cuda=True).dtype == "bfloat16"
    choice = md.choose_dtype("auto", cuda=False, flags=[])
    assert choice.dtype == "float32" and "no bfloat16 units" in choice.why


@pytest.mark.parametrize(("rates", "expected"), [((80.0, 190.0), "bfloat16"), ((80.0, 100.0), "float32")])
def test_auto_on_a_cpu_with_units_takes_bfloat16_only_when_it_measures_faster(monkeypatch, rates, expected):
    # a CPU flag is not a rate: the measured matmul decides (a fixed rate stands in for this machine's here)
    monkeypatch.setattr(md, "matmul_rates", lambda: rates)
    choice = md.choose_dtype("auto", cuda=False, flags=["avx512_bf16"])
    assert choice.dtype == expected
    assert "avx512_bf16" in choice.why and f"{rates[1]:.0f} GFLOPS in bfloat16" in choice.why


def test_the_matmul_rates_are_measured_here():
    fp32, bf16 = md.matmul_rates()
    assert fp32 > 1 and bf16 > 1  # GFLOPS: a real product ran in both dtypes
