"""Batched decode: N conversations' `EvictableCache`s decoded together through one `nexus.CacheStack`.

For each method, every distinct prompt is prefilled alone (batch 1, its own `EvictableCache`, so each row
evicts on its own prompt) and decoded `--pre-decode` greedy steps alone; then for each N in `--rows` the
first N rows are copied, stacked (`nexus.CacheStack`) and decoded greedily one token per row per forward:

    model(input_ids=tok [N, 1], position_ids=stack.position_ids(device), use_cache=True, logits_to_keep=1,
          **{nexus.cache_kwarg(model): stack})

Rows are ragged: prompt j has `--prompt-tokens - j * --row-offset` tokens, and row r decodes a copy of prompt
r % K (K = `--distinct-prompts`, 0 = one prompt per row; the CPU default K = 2 keeps N = 16 at 2 prefills per
method instead of 16). Only the decode steps are timed: after the prefills, after building the stack and
after `--warmup` untimed steps. The pre-decode puts the timed steps where decode-time eviction happens:
under prefill_decode a row evicts when it holds budget + one block, so the first event comes 32 steps after the
prefill at b = 32 (up to 63 with Nexus's `leftover="unused"`, which keeps whole blocks only). Every N of every
method is measured in the same run (N outer, methods inner, so slow drift of a shared machine hits the methods
alike), plus `solo`: row 0 decoded through its own `EvictableCache` without a stack (the plain batch-1 path).
Reported per (method, N):
  tokens_per_s        N * steps / wall seconds of the timed steps (synchronised), median over --repeats
  step_ms median/p95  per-step latency = what each row waits per token (CUDA events on GPU, host clock on CPU)
  ratio_vs_n1         tokens_per_s / the same method's stacked N = 1 (same run); N means perfect scaling
  ratio_vs_solo       tokens_per_s / the same method's solo batch-1 decode (same run)
  stack_bytes_per_row stack.allocated_bytes() / N after the timed steps (the stacked K/V buffers, padding to
                      the longest row included: the engine's cost)
  own_bytes_per_row   sum(cache.allocated_bytes()) / N after stack.release() (each row's own buffers: what it
                      would hold alone, kv_allocated_bytes of nexus.memory)
  decode_events_per_row  eviction events per row during the timed steps
  row_hooks_ms_per_step  host time in the per-row observe/evict calls (CacheStack.after_attention) per step

    python bench/batch.py                       # CPU: llama-3.1-8b shape, 1 layer, 4K prompts, N = 1,2,4,8,16
    python bench/batch.py --model tiny --layers 0 --prompt-tokens 512 --rows 1,2,4 --steps 16
    python bench/batch.py --model qwen3-32b --layers 0 --prompt-tokens 8192 --rows 1,8 --steps 64 --warmup 4 \
        --distinct-prompts 0 --device cuda --dtype bfloat16     # the GPU setting (bench/gpu.sh); --layers 0 = all
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402
from decode import StepClock, _percentile, add_eviction_args, eviction_config, parse_spec, results_title  # noqa: E402

import nexus  # noqa: E402

SCHEMA = "nexus-bench-batch/1"
DEFAULT_ROWS = [1, 2, 4, 8, 16]
DEFAULT_METHODS = ["dense", "nexus"]


def _split(values: list[str]) -> list[str]:
    """['1,2', '4'] -> ['1', '2', '4'] (comma- or space-separated lists both work)."""
    return [v for text in values for v in text.split(",") if v.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.1-8b", choices=list(common.SHAPES))
    ap.add_argument("--layers", type=int, default=1, help="keep only the first N decoder layers (0 = all)")
    ap.add_argument("--vocab", type=int, default=None, help="override the vocabulary size")
    ap.add_argument("--prompt-tokens", type=int, default=4096, help="row 0's prompt length")
    ap.add_argument("--row-offset", type=int, default=37, help="row r's prompt is r * this shorter (ragged rows)")
    ap.add_argument(
        "--distinct-prompts",
        type=int,
        default=2,
        help="prompts prefilled per method (row r decodes a copy of prompt r %% K); 0 = one per row",
    )
    ap.add_argument("--rows", nargs="+", default=[",".join(map(str, DEFAULT_ROWS))], help="N values, e.g. 1,2,4,8")
    ap.add_argument("--steps", type=int, default=32, help="timed decode steps per (method, N)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed decode steps before the timed ones")
    ap.add_argument(
        "--pre-decode",
        type=int,
        default=32,
        help="untimed steps each prefilled prompt decodes alone before it is copied into the runs (so the timed "
        "steps reach the rows' first decode-time eviction)",
    )
    ap.add_argument("--repeats", type=int, default=1, help="rounds over every (N, method); medians are reported")
    ap.add_argument(
        "--methods",
        nargs="+",
        default=[",".join(DEFAULT_METHODS)],
        help=f"METHOD or METHOD@SCOPE, comma-separated (scope defaults to --scope); known: {', '.join(nexus.METHODS)}",
    )
    ap.add_argument("--no-solo", action="store_true", help="skip the unstacked batch-1 baseline")
    add_eviction_args(ap, block_help="b; the decode slack is one block")
    common.add_device_args(ap)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("bench/out/batch.json"))
    args = ap.parse_args(argv)
    try:
        args.rows = sorted({int(v) for v in _split(args.rows)})
    except ValueError:
        ap.error(f"--rows must be comma-separated integers, got {' '.join(args.rows)!r}")
    if not args.rows or args.rows[0] < 1:
        ap.error("--rows values must be >= 1")
    args.methods = list(dict.fromkeys(_split(args.methods)))
    for spec in args.methods:
        try:
            method, _ = parse_spec(spec, args.scope)
        except ValueError as exc:
            ap.error(str(exc))
        if method == "dynamic":
            ap.error("--methods dynamic: a CacheStack stacks EvictableCaches only")
    for name in ("prompt_tokens", "steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("warmup", "pre_decode", "row_offset", "distinct_prompts", "layers"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    distinct = min(args.distinct_prompts or args.rows[-1], args.rows[-1])
    shortest = args.prompt_tokens - (distinct - 1) * args.row_offset
    if shortest < 2 * args.window:
        ap.error(
            f"the shortest prompt would have {shortest} tokens (--prompt-tokens {args.prompt_tokens} - "
            f"{distinct - 1} x --row-offset {args.row_offset}); it must be >= 2 x --window"
        )
    return args


def prompt_lengths(args) -> list[int]:
    """The prompt length of each distinct prompt (row r uses prompt r % K)."""
    k = min(args.distinct_prompts or args.rows[-1], args.rows[-1])
    return [args.prompt_tokens - j * args.row_offset for j in range(k)]


def prefill(model, spec: str, prompts: list[torch.Tensor], args, device) -> tuple[list[Any], dict[str, list[float]]]:
    """Each prompt through its own EvictableCache, then `--pre-decode` greedy steps alone (batch 1): the rows
    every run copies, as [(cache, next token [1, 1])], and the seconds each prompt took in each phase."""
    kw = nexus.cache_kwarg(model)
    rows, seconds = [], {"prefill": [], "pre_decode": []}
    for ids in prompts:
        cache = nexus.EvictableCache(model.config, eviction_config(spec, args))
        common.sync(device)
        t0 = time.perf_counter()
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: cache})
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        common.sync(device)
        t1 = time.perf_counter()
        for _ in range(args.pre_decode):
            out = model(input_ids=tok, use_cache=True, logits_to_keep=1, **{kw: cache})
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
        common.sync(device)
        seconds["prefill"].append(t1 - t0)
        seconds["pre_decode"].append(time.perf_counter() - t1)
        rows.append((cache, tok))
        del out
    return rows, seconds


def _decode_events(cache) -> int:
    return sum(1 for e in cache.events if e.phase == "decode")


def _timed_hooks(cache) -> list[float]:
    """Accumulate host seconds spent in `cache.after_attention` (per-row observe + evict, launch time on CUDA)."""
    spent = [0.0]
    inner = cache.after_attention

    def timed(layer_idx, query, scaling):
        t0 = time.perf_counter()
        inner(layer_idx, query, scaling)
        spent[0] += time.perf_counter() - t0

    cache.after_attention = timed
    return spent


def decode_run(model, snapshot: list[Any], n: int, stacked: bool, args, device) -> dict[str, Any]:
    """Copy rows 0..n-1 of `snapshot`, decode `warmup` + `steps` steps (stacked, or row 0 alone); one round."""
    kw = nexus.cache_kwarg(model)
    picked = [snapshot[r % len(snapshot)] for r in range(n)]
    caches = [copy.deepcopy(cache) for cache, _ in picked]
    tok = torch.cat([t for _, t in picked])
    if stacked:
        stack = nexus.CacheStack(caches)
        feed, hooks = stack, _timed_hooks(stack)

        def step(tok):
            out = model(
                input_ids=tok, position_ids=stack.position_ids(device), use_cache=True, logits_to_keep=1, **{kw: stack}
            )
            return out.logits[:, -1].argmax(-1, keepdim=True)
    else:
        if n != 1:
            raise ValueError("the solo path decodes one row")
        feed, hooks = caches[0], _timed_hooks(caches[0])

        def step(tok):
            out = model(input_ids=tok, use_cache=True, logits_to_keep=1, **{kw: feed})
            return out.logits[:, -1].argmax(-1, keepdim=True)

    for _ in range(args.warmup):
        tok = step(tok)
    common.sync(device)
    events0 = [_decode_events(c) for c in caches]
    hooks[0] = 0.0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    clock = StepClock(device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        clock.start()
        tok = step(tok)
        clock.stop()
    common.sync(device)
    wall = time.perf_counter() - t0
    per_step = clock.seconds()
    peak = torch.cuda.max_memory_allocated(device) - before if device.type == "cuda" else None
    events = [_decode_events(c) - e0 for c, e0 in zip(caches, events0, strict=True)]
    if stacked:
        stack_bytes = stack.allocated_bytes()
        capacity, longest = stack.layers[0].k.shape[2], stack.layers[0].longest
        stack.release()
        del stack, feed
    else:
        stack_bytes, capacity, longest = None, caches[0].layers[0]._k.shape[2], caches[0].physical_length(0)
    own_bytes = sum(c.allocated_bytes() for c in caches)
    result = dict(
        wall_s=wall,
        tokens_per_s=n * args.steps / wall,
        step_s=per_step,
        hooks_s=hooks[0],
        events=events,
        stack_bytes=stack_bytes,
        own_bytes=own_bytes,
        capacity_layer0=capacity,
        longest_layer0=longest,
        logical_lengths=[c.logical_length for c in caches],
        peak_bytes=peak,
    )
    del caches, tok
    common.free_memory(device)
    return result


def summarise(spec: str, path: str, n: int, rounds: list[dict[str, Any]], args) -> dict[str, Any]:
    method, scope = parse_spec(spec, args.scope)
    steps = [s for r in rounds for s in r["step_s"]]
    last = rounds[-1]
    return dict(
        label=spec,
        method=method,
        scope=scope if method != "dense" else None,
        path=path,
        rows=n,
        steps=args.steps,
        warmup=args.warmup,
        tokens_per_s=statistics.median(r["tokens_per_s"] for r in rounds),
        tokens_per_s_rounds=[r["tokens_per_s"] for r in rounds],
        wall_s_rounds=[r["wall_s"] for r in rounds],
        step_ms_median=1e3 * statistics.median(steps),
        step_ms_p95=1e3 * _percentile(steps, 0.95),
        step_ms_mean=1e3 * statistics.fmean(steps),
        ratio_vs_n1=None,
        ratio_vs_solo=None,
        row_hooks_ms_per_step=1e3 * statistics.median(r["hooks_s"] for r in rounds) / args.steps,
        decode_events_per_row=statistics.fmean(last["events"]),
        decode_events_rows=last["events"],
        stack_bytes_per_row=last["stack_bytes"] / n if last["stack_bytes"] is not None else None,
        own_bytes_per_row=last["own_bytes"] / n,
        capacity_layer0=last["capacity_layer0"],
        longest_layer0=last["longest_layer0"],
        logical_lengths=last["logical_lengths"],
        peak_bytes_decode=last["peak_bytes"],
    )


def add_ratios(records: list[dict[str, Any]]) -> None:
    """ratio_vs_n1 / ratio_vs_solo against the same method's N = 1 records of this run."""
    base = {(r["label"], r["path"]): r["tokens_per_s"] for r in records if r["rows"] == 1}
    for r in records:
        n1, solo = base.get((r["label"], "stack")), base.get((r["label"], "solo"))
        r["ratio_vs_n1"] = r["tokens_per_s"] / n1 if n1 and r["path"] == "stack" else None
        r["ratio_vs_solo"] = r["tokens_per_s"] / solo if solo else None


def _table(records: list[dict[str, Any]], title: str):
    order = {spec: i for i, spec in enumerate(dict.fromkeys(r["label"] for r in records))}
    rows = []
    for r in sorted(records, key=lambda r: (order[r["label"]], r["path"] == "stack", r["rows"])):
        stack_bytes = r["stack_bytes_per_row"]
        rows.append(
            [
                ("method", r["label"]),
                ("path", r["path"]),
                ("N", str(r["rows"])),
                ("tok/s", f"{r['tokens_per_s']:.2f}"),
                ("vs N=1", f"{r['ratio_vs_n1']:.2f}" if r["ratio_vs_n1"] is not None else ""),
                ("vs solo", f"{r['ratio_vs_solo']:.2f}" if r["ratio_vs_solo"] is not None else ""),
                ("step ms med", f"{r['step_ms_median']:.1f}"),
                ("p95", f"{r['step_ms_p95']:.1f}"),
                ("row hooks ms", f"{r['row_hooks_ms_per_step']:.2f}"),
                ("events/row", f"{r['decode_events_per_row']:.2f}"),
                ("stack MiB/row", f"{stack_bytes / 2**20:.2f}" if stack_bytes is not None else ""),
                ("own MiB/row", f"{r['own_bytes_per_row'] / 2**20:.2f}"),
                ("slots L0 (cap)", f"{r['longest_layer0']} ({r['capacity_layer0']})"),
            ]
        )
    return common.results_table(title, rows)


def main(argv=None) -> dict[str, Any]:
    from rich.console import Console

    args = parse_args(argv)
    console = Console(width=200)
    run = common.setup(args, args.layers or None)
    device, config = run.device, run.config
    t0 = time.perf_counter()
    model = nexus.prepare(common.random_model(config, run.dtype, device, args.seed))
    common.sync(device)
    build_s = time.perf_counter() - t0
    lengths = prompt_lengths(args)
    gen = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(0, config.vocab_size, (1, n), generator=gen).to(device) for n in lengths]
    records: list[dict[str, Any]] = []
    meta = run.run_meta(
        SCHEMA,
        args,
        model,
        build_s=build_s,
        prompt_lengths=lengths,
        row_prompt_lengths=[lengths[r % len(lengths)] for r in range(args.rows[-1])],
        prefill_s={},
        pre_decode_s={},
        budget={},
    )
    payload = dict(meta=meta, runs=records)
    rounds: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    with torch.inference_mode(), console.status("prefilling") as status:
        snapshots = {}
        for spec in args.methods:
            status.update(f"{spec}: prefilling {len(prompts)} prompts of {lengths[-1]}-{lengths[0]} tokens")
            snapshots[spec], seconds = prefill(model, spec, prompts, args, device)
            meta["prefill_s"][spec], meta["pre_decode_s"][spec] = seconds["prefill"], seconds["pre_decode"]
            meta["budget"][spec] = snapshots[spec][0][0].budget(0)
            console.print(
                f"{spec}: prefilled {len(prompts)} prompts in {sum(seconds['prefill']):.1f}s, "
                f"pre-decoded {args.pre_decode} steps each in {sum(seconds['pre_decode']):.1f}s"
            )
        plan = [(n, spec, "stack") for n in args.rows for spec in args.methods]
        if not args.no_solo:
            plan = [(1, spec, "solo") for spec in args.methods] + plan
        for rnd in range(args.repeats):
            for n, spec, path in plan:
                status.update(f"round {rnd + 1}/{args.repeats}: {spec} {path} N={n}")
                result = decode_run(model, snapshots[spec], n, path == "stack", args, device)
                rounds.setdefault((spec, path, n), []).append(result)
                console.print(
                    f"round {rnd + 1}: {spec:>12} {path:>5} N={n:<3} {result['tokens_per_s']:8.2f} tok/s, "
                    f"{1e3 * statistics.median(result['step_s']):8.1f} ms/step"
                )
                records[:] = [summarise(s, p, k, rs, args) for (s, p, k), rs in rounds.items()]
                add_ratios(records)
                common.write_json(args.out, payload)  # after every run: a killed run still leaves its numbers
    title = results_title(run, args, f"prompts {lengths[-1]}-{lengths[0]}, {args.steps} steps")
    return common.report(console, _table(records, title), args.out, payload)


if __name__ == "__main__":
    main()
