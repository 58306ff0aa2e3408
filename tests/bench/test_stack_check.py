"""bench/stack_check.py: the stacked decode's flash path (flash_attn_with_kvcache with per-row lengths) against
the masked-sdpa stack on the same weights. Needs a GPU with flash-attn; bench/gpu.sh runs the script directly."""

from __future__ import annotations

import pytest
import torch

from tests.bench.conftest import load_script


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["dense", "snapkv", "nexus"])
def test_flash_stack_matches_sdpa_stack(method):
    pytest.importorskip("flash_attn")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    row = load_script("stack_check").compare(method)
    assert row["flash_steps"] > 0, row  # the flash path really ran
    assert row["events_flash"] == row["events_sdpa"], row
    assert row["ok"], row


def test_stack_check_refuses_without_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert load_script("stack_check").main(["--out", str(tmp_path / "x.json")]) == 2
