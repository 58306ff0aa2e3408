"""Decode throughput and cache memory, dense vs eviction methods, in one run (the paper's Table 4/5 setting).

For a model shape built from its published config with random weights (`bench/common.py` SHAPES), it
prefills `--prefill` random tokens, then decodes greedily one token at a time (argmax: no sampling cost)
through an `nexus.EvictableCache` (or transformers' DynamicCache for `--methods dynamic`), and reports at
each decode length in `--report-at`:
  tokens_per_s       batch * steps / wall seconds of the decode loop so far (synchronised)
  step_ms median/p95 per-step latency (CUDA events on GPU, so the host is never forced to wait per step)
  eviction_s         time inside eviction events while decoding (each event synchronised on CUDA)
  kv_held_bytes_per_seq       cache.held_bytes() / batch at that point (K/V entries held x bytes per entry)
  kv_allocated_bytes_per_seq  cache.allocated_bytes() / batch (the K/V buffers, spare capacity included)
                     (nexus.memory; for transformers' DynamicCache both are its K/V tensors' bytes)
  floor_step_ms      (weight bytes + KV bytes read per step) / measured device copy bandwidth, and the run's
                     fraction of it (floor / measured mean step; 1.0 = at the memory-bandwidth floor)
Dense is the same EvictableCache with method "dense" (same attention path, no eviction), so ratios isolate
the policy. A per-method `--max-seconds` guard stops a decode early and marks it `truncated`.

    python bench/decode.py --model tiny --prefill 1024 --decode 256 --methods dense nexus snapkv
    python bench/decode.py --model llama-3.1-8b --layers 2 --vocab 32000 --prefill 2048 --decode 256
    python bench/decode.py --model llama-3.1-8b --prefill 8192 --decode 8192 --report-at 4096 8192 \
        --methods dense snapkv morphkv nexus --dtype bfloat16 --device cuda      # the GPU setting
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402

import nexus  # noqa: E402

SCHEMA = "nexus-bench-decode/2"  # /2: cache_bytes_per_seq became kv_allocated_bytes_per_seq, + kv_held_bytes_per_seq
DEFAULT_METHODS = ["dense", "snapkv", "morphkv", "nexus"]


def weight_bytes_read(model: torch.nn.Module, batch: int) -> int:
    """Parameter bytes one decode step reads: everything, except that an untied input embedding is only
    gathered (batch rows), not streamed."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    if out is None or out.weight.data_ptr() != emb.data_ptr():
        total -= emb.numel() * emb.element_size() - batch * emb.shape[1] * emb.element_size()
    return total


def kv_bytes_read(cache, num_layers: int, per_slot: int) -> int:
    """K+V bytes one decode step reads: every physical slot of every layer ([B, Hkv, P, D] x 2)."""
    if isinstance(cache, nexus.EvictableCache):
        return per_slot * sum(cache.physical_length(i) for i in range(num_layers))
    return per_slot * cache.get_seq_length() * num_layers


def _timed_evictions(cache: nexus.EvictableCache, device: torch.device) -> dict[str, float]:
    """Wrap the cache's eviction with device synchronisation so its time is the device's, per phase.

    (The cache's own `events[i].seconds` are host-side; on CUDA they would miss work still queued.)
    """
    spent = {"prefill": 0.0, "decode": 0.0}
    inner = cache._evict

    def timed(layer, scaling, phase):
        common.sync(device)
        t0 = time.perf_counter()
        inner(layer, scaling, phase)
        common.sync(device)
        spent[phase] += time.perf_counter() - t0

    cache._evict = timed
    return spent


def parse_spec(spec: str, default_scope: str) -> tuple[str, str]:
    """'nexus' or 'snapkv@prefill_only' -> (method, scope); 'dynamic' is transformers' DynamicCache."""
    method, _, scope = spec.partition("@")
    scope = scope or default_scope
    if method != "dynamic" and method not in nexus.METHODS:
        raise ValueError(f"unknown method {method!r} in {spec!r}; known: dynamic, {', '.join(nexus.METHODS)}")
    if scope not in nexus.SCOPES:
        raise ValueError(f"unknown scope {scope!r} in {spec!r}; use one of {', '.join(nexus.SCOPES)}")
    return method, scope


def add_eviction_args(ap: argparse.ArgumentParser, block_help: str | None = None) -> None:
    """The eviction options `eviction_config` reads (this script's and bench/batch.py's)."""
    ap.add_argument("--scope", default="prefill_decode", choices=list(nexus.SCOPES))
    ap.add_argument("--density", type=float, default=0.2)
    ap.add_argument("--budget", type=int, default=None, help="absolute per-head budget instead of --density")
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=32, help=block_help)


def eviction_config(spec: str, args) -> nexus.EvictionConfig:
    """The cache configuration of one --methods entry under the `add_eviction_args` options."""
    method, scope = parse_spec(spec, args.scope)
    return nexus.EvictionConfig(
        method=method,
        scope=scope,
        density=args.density,
        budget_tokens=args.budget,
        window=args.window,
        block_size=args.block_size,
        seed=args.seed,
    )


def _make_cache(model, spec: str, args):
    if parse_spec(spec, args.scope)[0] == "dynamic":
        from transformers import DynamicCache

        return DynamicCache(config=model.config)
    return nexus.EvictableCache(model.config, eviction_config(spec, args))


def _percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


class StepClock:
    """Per-step latency: CUDA events recorded around each step (read once at the end), or host time on CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []
        self.host: list[float] = []

    def start(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append([ev, None])
        else:
            self.host.append(-time.perf_counter())

    def stop(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks[-1][1] = ev
        else:
            self.host[-1] += time.perf_counter()

    def seconds(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in self.marks]
        return list(self.host)


def run_method(model, method: str, ids: torch.Tensor, args, device, ctx: dict[str, Any]) -> dict[str, Any]:
    """Prefill + greedy decode under one method; one record with a checkpoint per report-at length."""
    kw = nexus.cache_kwarg(model)
    cache = _make_cache(model, method, args)
    spent = _timed_evictions(cache, device) if isinstance(cache, nexus.EvictableCache) else None
    batch = ids.shape[0]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    common.sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: cache})
    common.sync(device)
    prefill_s = time.perf_counter() - t0
    nxt = out.logits[:, -1:].argmax(-1)
    del out
    clock = StepClock(device)
    kv_read: list[int] = []
    checkpoints, targets = [], sorted(set(args.report_at or [args.decode]))
    truncated, steps = False, 0
    common.sync(device)
    t_loop = time.perf_counter()
    with torch.no_grad():
        while steps < args.decode:
            kv_read.append(kv_bytes_read(cache, ctx["layers"], ctx["kv_bytes_per_slot"]) + ctx["kv_bytes_step"])
            clock.start()
            out = model(input_ids=nxt, use_cache=True, **{kw: cache})
            nxt = out.logits[:, -1:].argmax(-1)
            clock.stop()
            steps += 1
            if steps in targets:
                common.sync(device)
                wall = time.perf_counter() - t_loop
                checkpoints.append(_checkpoint(cache, method, steps, wall, clock, kv_read, spent, batch, device, ctx))
            if steps % 32 == 0 and time.perf_counter() - t_loop > args.max_seconds:
                truncated = True
                break
    if truncated:
        common.sync(device)
        checkpoints.append(
            _checkpoint(cache, method, steps, time.perf_counter() - t_loop, clock, kv_read, spent, batch, device, ctx)
        )
    evicts = isinstance(cache, nexus.EvictableCache)
    name, scope = parse_spec(method, args.scope)
    record = dict(
        label=method,
        method=name,
        scope=scope if evicts and name != "dense" else None,
        prefill_tokens=ids.shape[1],
        batch=batch,
        prefill_s=prefill_s,
        prefill_eviction_s=spent["prefill"] if spent else 0.0,
        budget=cache.budget(0) if evicts else None,
        decode_steps=steps,
        truncated=truncated,
        max_seconds=args.max_seconds,
        checkpoints=checkpoints,
    )
    del cache, out
    common.free_memory(device)
    return record


def _checkpoint(cache, method, steps, wall, clock, kv_read, spent, batch, device, ctx) -> dict[str, Any]:
    per_step = clock.seconds()
    mean_step = wall / steps
    kv_mean = statistics.fmean(kv_read)
    floor = (ctx["weight_bytes"] + kv_mean) / ctx["bandwidth"]
    evicts = isinstance(cache, nexus.EvictableCache)
    decode_events = [e for e in cache.events if e.phase == "decode"] if evicts else []
    cp = dict(
        decode_len=steps,
        wall_s=wall,
        tokens_per_s=batch * steps / wall,
        step_ms_median=1e3 * statistics.median(per_step),
        step_ms_p95=1e3 * _percentile(per_step, 0.95),
        step_ms_mean=1e3 * mean_step,
        eviction_s=spent["decode"] if spent else 0.0,
        eviction_s_host=sum(e.seconds for e in decode_events),
        decode_events=len(decode_events),
        kv_held_bytes_per_seq=(cache.held_bytes() if evicts else _dynamic_nbytes(cache)) / batch,
        kv_allocated_bytes_per_seq=(cache.allocated_bytes() if evicts else _dynamic_nbytes(cache)) / batch,
        kv_slots_layer0=cache.physical_length(0) if evicts else cache.get_seq_length(),
        logical_length=cache.logical_length if evicts else cache.get_seq_length(),
        kv_read_bytes_mean=kv_mean,
        floor_step_ms=1e3 * floor,
        floor_fraction=floor / mean_step,
        peak_bytes_excl_weights=None,
    )
    if device.type == "cuda":
        cp["peak_bytes_excl_weights"] = torch.cuda.max_memory_allocated(device) - ctx["weights_resident"]
    return cp


def _dynamic_nbytes(cache) -> int:
    return sum(
        t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values) if t is not None
    )


def _table(records: list[dict[str, Any]], title: str):
    dense = {cp["decode_len"]: cp for r in records if r["method"] == "dense" for cp in r["checkpoints"]}
    rows = []
    for r in records:
        for cp in r["checkpoints"]:
            d = dense.get(cp["decode_len"])
            speed = f"{cp['tokens_per_s'] / d['tokens_per_s']:.2f}" if d else ""
            mem = f"{cp['kv_allocated_bytes_per_seq'] / d['kv_allocated_bytes_per_seq']:.2f}" if d else ""
            rows.append(
                [
                    ("method", r["label"]),
                    ("decode", str(cp["decode_len"])),
                    ("tok/s", f"{cp['tokens_per_s']:.2f}"),
                    ("vs dense", speed),
                    ("step ms med", f"{cp['step_ms_median']:.2f}"),
                    ("p95", f"{cp['step_ms_p95']:.2f}"),
                    ("evict s", f"{cp['eviction_s']:.3f}"),
                    ("events", str(cp["decode_events"])),
                    ("KV held MiB/seq", f"{cp['kv_held_bytes_per_seq'] / 2**20:.1f}"),
                    ("KV alloc MiB/seq", f"{cp['kv_allocated_bytes_per_seq'] / 2**20:.1f}"),
                    ("vs dense", mem),
                    ("slots L0", str(cp["kv_slots_layer0"])),
                    ("floor ms", f"{cp['floor_step_ms']:.2f}"),
                    ("of floor", f"{cp['floor_fraction']:.2f}"),
                    ("note", "truncated" if r["truncated"] and cp is r["checkpoints"][-1] else ""),
                ]
            )
    return common.results_table(title, rows)


def results_title(run: common.Setup, args, what: str) -> str:
    """The results table's title of this script and bench/batch.py: the model, `what` ran, and the settings."""
    return f"{run.title(args.model)}, {what}, {args.scope}, density {args.density}, {run.threads} threads"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", choices=list(common.SHAPES))
    ap.add_argument("--layers", type=int, default=None, help="keep only the first N decoder layers")
    ap.add_argument("--vocab", type=int, default=None, help="override the vocabulary size (CPU slices)")
    ap.add_argument("--prefill", type=int, default=1024)
    ap.add_argument("--decode", type=int, default=256, help="decode steps (the longest decode length)")
    ap.add_argument("--report-at", type=int, nargs="+", default=None, help="decode lengths to report (<= --decode)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument(
        "--methods",
        nargs="+",
        default=DEFAULT_METHODS,
        help="METHOD or METHOD@SCOPE (scope defaults to --scope); 'dynamic' = transformers "
        f"DynamicCache; known: {', '.join(nexus.METHODS)}",
    )
    add_eviction_args(ap)
    common.add_device_args(ap)
    ap.add_argument("--max-seconds", type=float, default=1e9, help="per-method decode time guard")
    ap.add_argument(
        "--time-box",
        type=float,
        default=None,
        help="seconds for the whole run: each method's decode guard is an equal share of what is left",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--copy-mib", type=int, default=1024, help="buffer size of the bandwidth measurement")
    ap.add_argument("--out", type=Path, default=Path("bench/out/decode.json"))
    args = ap.parse_args(argv)
    for m in args.methods:
        try:
            parse_spec(m, args.scope)
        except ValueError as exc:
            ap.error(str(exc))
    if args.report_at and max(args.report_at) > args.decode:
        ap.error(f"--report-at {max(args.report_at)} exceeds --decode {args.decode}")
    for name in ("prefill", "decode", "batch"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    return args


def main(argv=None) -> dict[str, Any]:
    from rich.console import Console

    started = time.perf_counter()
    args = parse_args(argv)
    console = Console(width=200)
    run = common.setup(args, args.layers)
    device, dtype, config = run.device, run.dtype, run.config
    bandwidth = common.copy_bandwidth(device, args.copy_mib)
    model = nexus.prepare(common.random_model(config, dtype, device, args.seed))
    common.sync(device)
    elem = torch.empty((), dtype=dtype).element_size()
    hkv, hd = config.num_key_value_heads, config.head_dim
    ctx = dict(
        layers=config.num_hidden_layers,
        bandwidth=bandwidth,
        weight_bytes=weight_bytes_read(model, args.batch),
        kv_bytes_per_slot=2 * args.batch * hkv * hd * elem,
        kv_bytes_step=2 * args.batch * hkv * hd * elem * config.num_hidden_layers,  # the new token's K/V write
        weights_resident=torch.cuda.memory_allocated(device) if device.type == "cuda" else 0,
    )
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, config.vocab_size, (args.batch, args.prefill), generator=gen).to(device)
    # warm-up: kernels, allocator, the capture path, before anything is timed
    warm = argparse.Namespace(**{**vars(args), "decode": 4, "report_at": [4], "max_seconds": 1e9})
    for method in dict.fromkeys(args.methods):
        run_method(model, method, ids[:, : min(256, args.prefill)], warm, device, ctx)
    records: list[dict[str, Any]] = []
    meta = run.run_meta(SCHEMA, args, model, weight_bytes_read=ctx["weight_bytes"], copy_bandwidth_gbs=bandwidth / 1e9)
    payload = dict(meta=meta, runs=records)
    with console.status("decoding") as status:
        for i, method in enumerate(args.methods):
            status.update(f"{method}: prefill {args.prefill}, decode {args.decode}")
            run_args = args
            if args.time_box is not None:
                # an equal share of what is left, less a margin for this method's prefill and bookkeeping
                left = args.time_box - (time.perf_counter() - started)
                share = left / (len(args.methods) - i) - 5.0
                run_args = argparse.Namespace(**{**vars(args), "max_seconds": max(1.0, min(args.max_seconds, share))})
            records.append(run_method(model, method, ids, run_args, device, ctx))
            console.print(
                f"{method}: {records[-1]['decode_steps']} steps"
                + (" (truncated by the time guard)" if records[-1]["truncated"] else "")
            )
            common.write_json(args.out, payload)  # after every method: a killed run still leaves its numbers
    copy = f", copy {bandwidth / 1e9:.1f} GB/s"
    title = results_title(run, args, f"prefill {args.prefill}, batch {args.batch}") + copy
    return common.report(console, _table(records, title), args.out, payload)


if __name__ == "__main__":
    main()
