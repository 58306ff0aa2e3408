"""How a decoding layer's K/V buffers behave between eviction events (issue 13's regrowth finding).

One layer of Qwen3-32B's attention shape (8 KV heads x 128, 64 query heads) is driven through the real
`nexus.EvictableCache` exactly as the model drives it (update -> attention -> after_attention) with random
post-RoPE tensors: a T-token prefill, then `--decode` single-token steps under prefill_decode at density 0.2.
Per method it reports
  budget            the per-head budget set at the end of the prefill
  kept              mean slots per head right after the decode events (min-max over the events)
  slots after/peak  the buffer's capacity right after an event, and the largest it reached while decoding
                    (spare capacity is allocated memory: this is what the paper's Table 5 figure measures)
  moves between     storage reallocations at decode steps with no event (a regrowth: should be 0)
  moves at events   reallocations at events (0 when the buffer is reused in place)

    python bench/buffer_growth.py                          # T = 4096 (budget 820), 512 steps, every method
    python bench/buffer_growth.py --prefill 8192 --decode 1024 --methods nexus ada_nexus
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from transformers import Qwen3Config

import nexus
import nexus.methods

HQ, HKV, D = 64, 8, 128
SCALING = D**-0.5
SCHEMA = "nexus-bench-buffer-growth/1"


def _step(cache: nexus.EvictableCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    keys, values = cache.update(k, v, 0)
    F.scaled_dot_product_attention(q, keys, values, enable_gqa=True, scale=SCALING)
    cache.after_attention(0, q, SCALING)


def measure(method: str, prefill: int, decode: int, slack_blocks: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    config = Qwen3Config(num_hidden_layers=1, num_attention_heads=HQ, num_key_value_heads=HKV, head_dim=D)
    cfg = nexus.EvictionConfig(method=method, scope="prefill_decode", density=0.2, slack_blocks=slack_blocks)
    cache = nexus.EvictableCache(config, cfg)
    layer = cache.layers[0]
    k = torch.randn(1, HKV, prefill, D, generator=gen)
    q = torch.randn(1, HQ, prefill, D, generator=gen)[:, :, -cfg.window :]
    cache.update(k, torch.randn_like(k), 0)
    cache.after_attention(0, q, SCALING)  # the end-of-prefill event (only the last W queries matter)
    after, kept, peak, between, at_events = set(), set(), 0, 0, 0
    for _ in range(decode):
        ptr, events = layer._k.data_ptr(), layer.events
        x = torch.randn(3, 1, HQ, 1, D, generator=gen)
        _step(cache, x[0], x[1][:, :HKV], x[2][:, :HKV])
        peak = max(peak, layer._k.shape[2])
        if layer.events > events:
            after.add(layer._k.shape[2])
            kept.add(round(layer.occupancy, 1))
            at_events += layer._k.data_ptr() != ptr
        else:
            between += layer._k.data_ptr() != ptr
    return {
        "method": method,
        "prefill": prefill,
        "decode": decode,
        "slack": cfg.slack,
        "budget": cache.budget(0),
        "kept_after_event": sorted(kept),
        "decode_events": sum(e.phase == "decode" for e in cache.events),
        "slots_after_event": sorted(after),
        "peak_slots": peak,
        "moves_between_events": between,
        "moves_at_events": at_events,
    }


def _span(values: list) -> str:
    if not values:
        return "-"
    return f"{min(values)}-{max(values)}" if len(values) > 1 else str(values[0])


def main() -> None:
    evicting = [m for m in nexus.METHODS if m != nexus.methods.DENSE]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefill", type=int, default=4096)
    ap.add_argument("--decode", type=int, default=512)
    ap.add_argument("--slack-blocks", type=int, default=1)
    ap.add_argument("--methods", nargs="+", default=evicting, choices=evicting)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("bench/out/buffer_growth.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    table = Table(title=f"K/V buffer while decoding (T={args.prefill}, {args.decode} steps, density 0.2)")
    for col in ("method", "budget", "kept", "events", "slots after", "peak", "moves between", "moves at events"):
        table.add_column(col, justify="right")
    with Console().status("measuring") as status:
        for method in args.methods:
            status.update(f"measuring {method}")
            row = measure(method, args.prefill, args.decode, args.slack_blocks, args.seed)
            rows.append(row)
            after, kept = row["slots_after_event"], row["kept_after_event"]
            table.add_row(
                method,
                str(row["budget"]),
                _span(kept),
                str(row["decode_events"]),
                _span(after),
                str(row["peak_slots"]),
                str(row["moves_between_events"]),
                str(row["moves_at_events"]),
            )
    Console(width=120).print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"schema": SCHEMA, "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows})
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
