"""Counterfactual replay: chunked vs token-by-token teacher forcing of one stored trajectory, and its delta-NLL table.

A dense episode of the tiny model (real Qwen3 architecture and tokenizer, random weights) is generated with the
hf backend; its stored token stream (`Completion.tokens`) is then replayed under each method, once in
chunks (`EvictableCache.decoding()` split at `decode_room()`) and once token by token, both timed in the same run.
The two give the same logits (tests/measure/test_counterfactual.py); the table shows the speed-up and the
largest logit difference measured here. NLL numbers on random weights are a smoke test of the pipeline, not a
finding about any method.

    python bench/replay.py                                    # tiny model, 3 turns of 160 tokens
    python bench/replay.py --methods snapkv,nexus,h2o --new-tokens 384 --out bench/out/replay.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

from common import environment, set_threads, write_json  # noqa: E402

import nexus  # noqa: E402
from agent_runner.backends.hf import HFBackend  # noqa: E402
from agent_runner.config import AgentConfig  # noqa: E402
from agent_runner.model_host import ModelSpec, load_host  # noqa: E402
from agent_runner.records import (
    Message,  # noqa: E402
    TurnTokens,  # noqa: E402
)
from agent_runner.sampling import SamplingConfig  # noqa: E402
from measure.counterfactual import model_forward, replay_episode, teacher_force  # noqa: E402


def dense_trajectory(host, turns: int, new_tokens: int, seed: int, temperature: float) -> list[TurnTokens]:
    """A dense true-eviction episode of `turns` turns, each exactly `new_tokens` long (no stop token sampled)."""
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=new_tokens)
    backend = HFBackend(
        host,
        eviction=nexus.EvictionConfig(method="dense"),
        protocol="true_eviction",
        sampling=sampling,
        max_context_tokens=AgentConfig().max_context_tokens,
    )
    backend._stop = set()  # the random model would stop at random; fixed-length turns make runs comparable
    backend.reset(seed=seed)
    msgs = [
        Message(role="system", content="You are a careful software engineer fixing a bug. " * 40),
        Message(role="user", content="The parser drops the last field of every row. " * 30),
    ]
    out = []
    for t in range(turns):
        c = backend.complete(msgs)
        out.append(c.tokens)
        msgs += [Message(role="assistant", content=c.text), Message(role="user", content=f"Exit code: 0 ({t}) " * 40)]
    return out


def max_logit_gap(forward, config, turns, cfg, protocol) -> float:
    chunked = [r[2] for r in teacher_force(forward, config, turns, cfg, protocol, chunked=True)]
    single = [r[2] for r in teacher_force(forward, config, turns, cfg, protocol, chunked=False)]
    return max(float((a - b).abs().max()) for a, b in zip(chunked, single, strict=True))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="dense,snapkv,h2o,nexus,ada_nexus")
    ap.add_argument("--scope", default="prefill_decode", choices=nexus.SCOPES)
    ap.add_argument("--protocols", default="true_eviction,full_context")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=160)
    ap.add_argument("--density", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.0, help="of the dense run (0: greedy, so dense top-1 = 1)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--out", type=Path, default=Path("bench/out/replay.json"))
    args = ap.parse_args(argv)
    if args.threads:
        set_threads(args.threads)
    console = Console()
    host = load_host(ModelSpec(name="tiny", seed=args.seed, dtype="float32"))
    turns = dense_trajectory(host, args.turns, args.new_tokens, args.seed, args.temperature)
    forward = model_forward(host.model, host.device)
    config = host.model.config
    rows, dense_nll = [], {}
    for method in ("dense", "snapkv"):  # warm-up: first calls pay one-off costs (kernels, allocator, imports)
        for chunked in (True, False):
            warm = nexus.EvictionConfig(method=method, scope=args.scope, density=args.density)
            replay_episode(forward, config, turns[:1], warm, "true_eviction", chunked=chunked)
    for protocol in args.protocols.split(","):
        for method in args.methods.split(","):
            cfg = nexus.EvictionConfig(method=method, scope=args.scope, density=args.density)
            timed = {}
            for chunked in (True, False):
                t0 = time.perf_counter()
                score = replay_episode(forward, config, turns, cfg, protocol, chunked=chunked)
                timed[chunked] = (time.perf_counter() - t0, score)
            (t_chunk, score), (t_token, _) = timed[True], timed[False]
            if method == "dense":
                dense_nll[protocol] = score.nll_mean
            base = dense_nll.get(protocol)
            rows.append(
                {
                    "method": method,
                    "scope": args.scope,
                    "protocol": protocol,
                    "tokens": score.tokens,
                    "chunked_s": t_chunk,
                    "token_by_token_s": t_token,
                    "speedup": t_token / t_chunk,
                    "forwards_chunked": sum(t.chunks for t in score.turns),
                    "max_logit_gap": max_logit_gap(forward, config, turns, cfg, protocol),
                    "nll_mean": score.nll_mean,
                    "delta_nll": None if base is None else score.nll_mean - base,
                    "top1": score.top1,
                    "eviction_events": sum(t.eviction_events for t in score.turns),
                }
            )
            r = rows[-1]
            console.log(f"{protocol} {method}: {r['chunked_s']:.2f}s chunked vs {r['token_by_token_s']:.2f}s")
    table = Table(title=f"replay of one {args.turns}-turn dense trajectory (tiny model, random weights: smoke test)")
    for col in ("protocol", "method", "tokens", "chunked s", "token s", "speed-up", "fwd", "max |dlogit|", "NLL"):
        table.add_column(col, justify="right")
    table.add_column("dNLL vs dense", justify="right")
    table.add_column("top-1", justify="right")
    table.add_column("events", justify="right")
    for r in rows:
        delta = "-" if r["delta_nll"] is None else f"{r['delta_nll']:+.4f}"
        table.add_row(
            r["protocol"],
            r["method"],
            str(r["tokens"]),
            f"{r['chunked_s']:.2f}",
            f"{r['token_by_token_s']:.2f}",
            f"{r['speedup']:.1f}x",
            str(r["forwards_chunked"]),
            f"{r['max_logit_gap']:.1e}",
            f"{r['nll_mean']:.4f}",
            delta,
            f"{r['top1']:.3f}",
            str(r["eviction_events"]),
        )
    console.print(table)
    payload = {
        "bench": "replay",
        "args": {k: str(v) for k, v in vars(args).items()},
        "environment": environment(host.device),
        "stream_tokens": sum(len(t.append) + len(t.generated) for t in turns),
        "rows": rows,
    }
    write_json(args.out, payload)
    console.print(f"wrote {args.out}")
    return payload


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
