"""Cost of eviction vs dense decode attention, one layer of Qwen3-32B's attention shape, through the real cache.

For each stream length T and method it measures, in one run (so ratios share the machine's state):
  event_ms        one eviction event at the end of a T-token prefill (score + select + compaction)
  dense_step_ms   one dense decode-attention step over T cached tokens (sdpa, GQA)
  per_token_ms    under prefill_decode at density 0.2: the mean cost per decoded token of decode attention
                  over the pinned cache plus the amortised eviction events (and per-step observe for H2O)
The cache is driven exactly as the model drives it (update -> attention -> after_attention), minus the
projections and MLP, with random post-RoPE queries/keys. CPU fp32 by default.

    python bench/eviction.py                       # T in 4K, 16K, 64K; every prefill_decode method
    python bench/eviction.py --lengths 4096 --methods nexus snapkv --decode-steps 64
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from transformers import Qwen3Config

import nexus
import nexus.methods

HQ, HKV, D = 64, 8, 128  # Qwen3-32B attention: 64 query heads, 8 KV heads, head_dim 128
SCALING = D**-0.5
EVICTING = [m for m in nexus.METHODS if m != nexus.methods.DENSE]  # every method that evicts, in table order


def _config() -> Qwen3Config:
    return Qwen3Config(
        num_hidden_layers=1, num_attention_heads=HQ, num_key_value_heads=HKV, head_dim=D, hidden_size=HQ * D
    )


def _attend(cache: nexus.EvictableCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    keys, values = cache.update(k, v, 0)
    F.scaled_dot_product_attention(q, keys, values, enable_gqa=True, scale=SCALING)
    cache.after_attention(0, q, SCALING)


def _prefill(method: str, t: int, scope: str, gen: torch.Generator, dtype) -> nexus.EvictableCache:
    """A cache holding a T-token prefill; the end-of-prefill eviction runs inside (timed by the cache)."""
    cache = nexus.EvictableCache(_config(), nexus.EvictionConfig(method=method, scope=scope, density=0.2))
    k = torch.randn(1, HKV, t, D, generator=gen, dtype=dtype)
    v = torch.randn(1, HKV, t, D, generator=gen, dtype=dtype)
    # only the last W queries matter to the scorers; attention over the prefill itself is not what we time
    q = torch.randn(1, HQ, cache.config.window, D, generator=gen, dtype=dtype)
    cache.update(k, v, 0)
    cache.after_attention(0, q, SCALING)
    return cache


def _decode(cache: nexus.EvictableCache, steps: int, gen: torch.Generator, dtype) -> float:
    """Mean seconds per decoded token (attention + whatever the cache does after it)."""
    toks = [torch.randn(3, 1, HQ, 1, D, generator=gen, dtype=dtype) for _ in range(steps)]
    t0 = time.perf_counter()
    for x in toks:
        _attend(cache, x[0], x[1][:, :HKV], x[2][:, :HKV])
    return (time.perf_counter() - t0) / steps


def measure(t: int, methods: list[str], repeats: int, decode_steps: int, dtype) -> list[dict]:
    gen = torch.Generator().manual_seed(t)
    rows = []
    dense = _prefill("dense", t, "prefill_decode", gen, dtype)
    _decode(dense, 4, gen, dtype)  # warm-up
    dense_step = min(
        _decode(_prefill("dense", t, "prefill_decode", gen, dtype), decode_steps, gen, dtype) for _ in range(repeats)
    )
    rows.append(
        dict(
            T=t,
            method="dense",
            event_ms=0.0,
            dense_step_ms=dense_step * 1e3,
            per_token_ms=dense_step * 1e3,
            per_token_vs_dense=1.0,
            kept=t,
            events=0,
        )
    )
    for method in methods:
        events, per_token, kept, n_events = [], [], 0, 0
        for _ in range(repeats):
            cache = _prefill(method, t, "prefill_decode", gen, dtype)
            events.append(cache.events[0].seconds)
            per_token.append(_decode(cache, decode_steps, gen, dtype))
            kept, n_events = cache.budget(0), len(cache.events) - 1
        rows.append(
            dict(
                T=t,
                method=method,
                event_ms=min(events) * 1e3,
                dense_step_ms=dense_step * 1e3,
                per_token_ms=min(per_token) * 1e3,
                per_token_vs_dense=min(per_token) / dense_step,
                kept=kept,
                events=n_events,
            )
        )
    snap = next((r for r in rows if r["method"] == "snapkv"), None)
    for r in rows:
        r["event_vs_snapkv"] = (r["event_ms"] / snap["event_ms"]) if snap and r["method"] != "dense" else None
    return rows


#: what Nexus is held to at each length: (target, the nexus row's figure, its limit, the methods it needs)
TARGETS = (
    ("nexus event <= 1.5x snapkv event", "event_vs_snapkv", 1.5, ("nexus", "snapkv")),
    ("nexus per-token <= 0.5x dense decode attention", "per_token_vs_dense", 0.5, ("nexus",)),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536])
    ap.add_argument("--methods", nargs="+", default=EVICTING, choices=EVICTING)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-steps", type=int, default=96, help="decode steps timed per repeat (3 slack periods)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument("--out", type=Path, default=Path("bench/out/eviction.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console(width=160)
    rows = []
    with console.status("measuring") as status:
        for t in args.lengths:
            status.update(f"T={t}")
            rows += measure(t, args.methods, args.repeats, args.decode_steps, torch.float32)
    table = Table(title=f"one layer, Hq={HQ} Hkv={HKV} D={D}, CPU fp32, density 0.2, min of {args.repeats}")
    for col in (
        "T",
        "method",
        "event ms",
        "event / snapkv",
        "dense step ms",
        "per-token ms",
        "per-token / dense",
        "kept",
        "decode events",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        ratio = "" if r["event_vs_snapkv"] is None else f"{r['event_vs_snapkv']:.2f}"
        table.add_row(
            str(r["T"]),
            r["method"],
            f"{r['event_ms']:.2f}",
            ratio,
            f"{r['dense_step_ms']:.2f}",
            f"{r['per_token_ms']:.3f}",
            f"{r['per_token_vs_dense']:.2f}",
            str(r["kept"]),
            str(r["events"]),
        )
    console.print(table)
    targets = []
    for t in args.lengths:
        by = {r["method"]: r for r in rows if r["T"] == t}
        for target, figure, limit, needs in TARGETS:
            if all(method in by for method in needs):
                value = by["nexus"][figure]
                targets.append(dict(T=t, target=target, value=value, ok=value <= limit))
    for tg in targets:
        console.print(f"T={tg['T']:>6}  {tg['target']:<48} {tg['value']:.2f}  {'PASS' if tg['ok'] else 'MISS'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        shape=dict(hq=HQ, hkv=HKV, d=D),
        decode_steps=args.decode_steps,
        repeats=args.repeats,
    )
    args.out.write_text(json.dumps(dict(meta=meta, rows=rows, targets=targets), indent=2))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
