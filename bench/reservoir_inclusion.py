"""What the reservoir's n does to Nexus's selection, at the raw weight scale and rescaled to mean 1 (CPU).

Nexus keeps K of N candidate blocks by the n-averaged priority pi_j = (1/n) sum_i u_j^(i)^(1/w_j), u ~ U(0, 1).
Its weights sum to about 1 + lam = 1.5, so each is ~1.5 / N; at that scale the mean is dominated by its largest
term and the ranking is a single Efraimidis-Spirakis draw whatever n is. `weight_scale="mean"` divides the
weights by the row's mean candidate weight first. For weight_scale in (raw, mean) and each n it measures:
  pair   two candidates with weights 2:1 scaled like Nexus's ([2/3, 1/3] * 1.5 / 256), K = 1:
         P(the heavier block is kept) over `--pair-trials` draws (2/3 for a pure ES sample, 1 for top-K)
  row    one Nexus-like row: N = 256 blocks, lognormal(0, sigma) weights normalised to sum 1.5 (fixed seed),
         K = 20% of N: the mean overlap with the deterministic top-K by weight (kept & top-K) / K, and the
         inclusion frequency of the blocks ranked 1 (heaviest), K / 4, K (the lightest of the top-K),
         K + 1 (the heaviest outside it) and N / 2 (the median)
Both scales of one setting use the same uniforms (one draw per (experiment, n), fixed seeds), so n = 1 must
give identical selections (rescaling by a per-row constant is monotone); the script checks that. Everything
goes through the library (`draw_uniforms`, `reservoir_log_priorities`, `select_top`, `rescale_weights`).

    python bench/reservoir_inclusion.py               # 20000 pair trials, 2000 row trials, ~10 s on 2 cores
    python bench/reservoir_inclusion.py --quick       # 4000 / 400 trials, ~5 s
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402

from nexus.policies.nexus import WEIGHT_SCALES, rescale_weights  # noqa: E402
from nexus.policies.reservoir import draw_uniforms, reservoir_log_priorities, select_top  # noqa: E402

SCHEMA = "nexus-bench-reservoir-inclusion/1"
DEFAULT_NS = [1, 2, 5, 10, 50, 200]
TOTAL_WEIGHT = 1.5  # 1 + lam with the paper's lam = 0.5: what a Nexus row's weights sum to
MAX_CHUNK = 2**25  # uniforms per draw (256 MiB of float64); larger settings are drawn in consecutive chunks


def select(weights: torch.Tensor, uniforms: torch.Tensor, k: int, scale: str) -> torch.Tensor:
    """[trials, N] bool kept candidates (every block is a candidate) for one weight scale."""
    candidates = torch.ones(weights.shape, dtype=torch.bool)
    w = rescale_weights(weights.to(torch.float64), candidates, scale)
    return select_top(reservoir_log_priorities(w, uniforms), candidates, k)


def draws(trials: int, blocks: int, n: int, seed: int):
    """Yield uniforms [chunk, blocks, n] from one CPU generator: consecutive chunks of one seeded stream."""
    gen = torch.Generator().manual_seed(seed)
    chunk = max(1, MAX_CHUNK // (blocks * n))
    for start in range(0, trials, chunk):
        yield draw_uniforms((min(chunk, trials - start), blocks), n, gen, "cpu")


def pair_experiment(trials: int, n: int, seed: int, blocks_like: int) -> list[dict[str, Any]]:
    """P(heavier of two 2:1 blocks kept), K = 1, at Nexus's raw scale and rescaled; same uniforms for both."""
    raw = torch.tensor([2 / 3, 1 / 3], dtype=torch.float64) * TOTAL_WEIGHT / blocks_like
    wins = dict.fromkeys(WEIGHT_SCALES, 0)
    same = True
    for u in draws(trials, 2, n, seed):
        kept = {scale: select(raw.expand(u.shape[0], 2), u, 1, scale) for scale in WEIGHT_SCALES}
        for scale in WEIGHT_SCALES:
            wins[scale] += int(kept[scale][:, 0].sum())
        same &= bool((kept["raw"] == kept["mean"]).all())
    mean_w = raw.mean().item()
    rows = []
    for scale in WEIGHT_SCALES:
        p = wins[scale] / trials
        w = raw if scale == "raw" else raw / mean_w
        rows.append(
            dict(
                experiment="pair",
                scale=scale,
                n=n,
                trials=trials,
                weights=[float(x) for x in w],
                p_heavier=p,
                stderr=math.sqrt(p * (1 - p) / trials),
                same_as_raw=same,
            )
        )
    return rows


def row_weights(blocks: int, sigma: float, seed: int) -> torch.Tensor:
    """[blocks] float64 lognormal(0, sigma) weights normalised to sum TOTAL_WEIGHT (a skewed Nexus-like row)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.exp(sigma * torch.randn(blocks, generator=gen, dtype=torch.float64))
    return w * (TOTAL_WEIGHT / w.sum())


def row_experiment(weights: torch.Tensor, k: int, trials: int, n: int, seed: int) -> list[dict[str, Any]]:
    """Overlap with the top-K by weight and inclusion of ranked blocks, raw vs mean, same uniforms for both."""
    blocks = weights.shape[-1]
    order = weights.argsort(descending=True)
    top = torch.zeros(blocks, dtype=torch.bool)
    top[order[:k]] = True
    ranks = sorted({1, max(1, k // 4), k, min(k + 1, blocks), max(1, blocks // 2)})
    probes = {f"rank_{r}": r - 1 for r in ranks}
    overlap = dict.fromkeys(WEIGHT_SCALES, 0.0)
    kept_count = {scale: torch.zeros(blocks, dtype=torch.long) for scale in WEIGHT_SCALES}
    same = True
    for u in draws(trials, blocks, n, seed):
        kept = {scale: select(weights.expand(u.shape[0], blocks), u, k, scale) for scale in WEIGHT_SCALES}
        for scale in WEIGHT_SCALES:
            overlap[scale] += float((kept[scale] & top).sum()) / k
            kept_count[scale] += kept[scale].sum(0)
        same &= bool((kept["raw"] == kept["mean"]).all())
    rows = []
    for scale in WEIGHT_SCALES:
        freq = kept_count[scale].double() / trials
        rows.append(
            dict(
                experiment="row",
                scale=scale,
                n=n,
                trials=trials,
                blocks=blocks,
                k=k,
                overlap_topk=overlap[scale] / trials,
                inclusion={name: float(freq[order[i]]) for name, i in probes.items()},
                probe_weights={name: float(weights[order[i]]) for name, i in probes.items()},
                same_as_raw=same,
            )
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", type=int, nargs="+", default=DEFAULT_NS, help="reservoir n values")
    ap.add_argument("--pair-trials", type=int, default=20000)
    ap.add_argument("--row-trials", type=int, default=2000)
    ap.add_argument("--blocks", type=int, default=256, help="N: blocks of the row (and the pair's weight scale)")
    ap.add_argument("--keep", type=float, default=0.2, help="K = round(keep * N) for the row")
    ap.add_argument("--sigma", type=float, default=1.5, help="lognormal sigma of the row's weights")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="4000 pair / 400 row trials")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument("--out", type=Path, default=Path("bench/out/reservoir_inclusion.json"))
    args = ap.parse_args()
    if args.quick:
        args.pair_trials, args.row_trials = min(args.pair_trials, 4000), min(args.row_trials, 400)
    threads = common.set_threads(args.threads)
    k = max(1, round(args.keep * args.blocks))
    weights = row_weights(args.blocks, args.sigma, args.seed)
    console = Console(width=160)
    t0 = time.perf_counter()
    pair, row = [], []
    with console.status("measuring") as status:
        for n in args.ns:
            status.update(f"pair, n={n}")
            pair += pair_experiment(args.pair_trials, n, args.seed * 1_000_003 + 2 * n, args.blocks)
            status.update(f"row, n={n}")
            row += row_experiment(weights, k, args.row_trials, n, args.seed * 1_000_003 + 2 * n + 1)
    seconds = time.perf_counter() - t0

    table = Table(title=f"pair: weights 2:1 = [2/3, 1/3] x 1.5/{args.blocks} (raw), K = 1, {args.pair_trials} trials")
    for col in ("n", "P(heavier kept) raw", "P(heavier kept) mean", "± stderr"):
        table.add_column(col, justify="right")
    for n in args.ns:
        by = {r["scale"]: r for r in pair if r["n"] == n}
        table.add_row(
            str(n), f"{by['raw']['p_heavier']:.3f}", f"{by['mean']['p_heavier']:.3f}", f"{by['raw']['stderr']:.3f}"
        )
    console.print(table)

    names = list(row[0]["inclusion"])
    table = Table(
        title=f"row: N = {args.blocks} lognormal(sigma={args.sigma}) weights summing to 1.5, K = {k}, "
        f"{args.row_trials} trials; inclusion frequency of the block of each weight rank"
    )
    table.add_column("n", justify="right")
    table.add_column("scale")
    table.add_column("overlap with top-K", justify="right")
    for name in names:
        table.add_column(f"{name.replace('_', ' ')} (w={row[0]['probe_weights'][name]:.2g})", justify="right")
    for r in row:
        table.add_row(str(r["n"]), r["scale"], f"{r['overlap_topk']:.3f}", *(f"{r['inclusion'][m]:.3f}" for m in names))
    console.print(table)

    same = all(r["same_as_raw"] for r in pair + row if r["n"] == 1)
    console.print(f"n = 1: raw and mean selections identical on the same uniforms: {'yes' if same else 'NO'}")
    console.print(f"{seconds:.1f} s, {threads} threads")
    meta = dict(
        torch=torch.__version__,
        threads=threads,
        seconds=seconds,
        seed=args.seed,
        ns=args.ns,
        blocks=args.blocks,
        k=k,
        sigma=args.sigma,
        total_weight=TOTAL_WEIGHT,
        pair_trials=args.pair_trials,
        row_trials=args.row_trials,
        n1_identical=same,
    )
    common.write_json(args.out, dict(schema=SCHEMA, meta=meta, rows=pair + row))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
