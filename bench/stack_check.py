"""GPU check of the stacked decode's flash path: `flash_attn_with_kvcache(cache_seqlens=...)` vs the masked-sdpa stack.

On a flash model, `nexus.CacheStack` decodes non-ragged rows with flash-attn's per-row cache lengths instead
of a mask (`StackedLayer.flash_decode`). This script builds the same random tiny Qwen3 twice (sdpa, flash),
stacks 4 ragged rows per method, feeds both the same 40 token ids per row, and compares the logits and the
eviction events. It also counts the steps that really took the flash path. Needs only torch, transformers,
flash-attn and this checkout, so `bench/gpu.sh` runs it before the timed benches (no pytest on that machine).

    python bench/stack_check.py --out bench/out/stack_check.json       # exit 1 if any method disagrees
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nexus  # noqa: E402
from nexus.batch import StackedLayer  # noqa: E402

SMALL = dict(density=0.25, window=8, block_size=8, scope="prefill_decode")


def tiny(attn: str, device: str, seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=1000,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        initializer_range=0.2,
        attn_implementation=attn,
    )
    return nexus.prepare(Qwen3ForCausalLM(cfg).eval().to(device=device, dtype=torch.bfloat16))


@torch.no_grad()
def stacked_run(model, method: str, device: str, steps: int = 40):
    kw = nexus.cache_kwarg(model)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 1000, (1, n), generator=gen).to(device) for n in (211, 97, 160, 64)]
    caches = [nexus.EvictableCache(model.config, nexus.EvictionConfig(method=method, **SMALL)) for _ in prompts]
    for cache, prompt in zip(caches, prompts, strict=True):
        model(input_ids=prompt, use_cache=True, logits_to_keep=1, **{kw: cache})
    stack = nexus.CacheStack(caches)
    logits = []
    for _ in range(steps):
        ids = torch.randint(0, 1000, (len(prompts), 1), generator=gen).to(device)
        out = model(input_ids=ids, position_ids=stack.position_ids(device), logits_to_keep=1, **{kw: stack})
        logits.append(out.logits[:, -1].float())
    return torch.stack(logits), [len(c.events) for c in caches]


def compare(method: str, device: str = "cuda") -> dict:
    """Logit gap and events of the flash stack vs the sdpa stack; `flash_steps` = layer-steps that used flash."""
    used = {"flash": 0}
    real = StackedLayer.flash_decode

    def counting(self, query, scaling):
        out = real(self, query, scaling)
        used["flash"] += out is not None
        return out

    StackedLayer.flash_decode = counting
    try:
        ref, ref_events = stacked_run(tiny("sdpa", device), method, device)
        got, got_events = stacked_run(tiny("flash_attention_2", device), method, device)
    finally:
        StackedLayer.flash_decode = real
    gap = float((got - ref).abs().max())
    scale = float(ref.abs().max())
    return {
        "method": method,
        "max_abs_gap": gap,
        "max_abs_logit": scale,
        "events_sdpa": ref_events,
        "events_flash": got_events,
        "flash_steps": used["flash"],
        "ok": used["flash"] > 0 and gap <= 0.05 * max(scale, 1.0) and ref_events == got_events,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="dense,snapkv,nexus")
    ap.add_argument("--out", type=Path, default=Path("bench/out/stack_check.json"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("stack_check: needs CUDA and flash-attn")
        return 2
    rows = [compare(m) for m in args.methods.split(",")]
    for r in rows:
        print(json.dumps(r))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"bench": "stack_check", "rows": rows}, indent=2))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
