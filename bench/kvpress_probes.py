"""nexus vs NVIDIA kvpress 0.5.5 on the same real weights: the quality probes through both libraries.

The samples are the project's own probes (`measure.probes.samples.build_sample`), built once here and
sent as token ids to both sides, so both see exactly the same tokens:
  needle   prefill = a chat-rendered document with a fact sentence + the question (+ the answer's opening
           words, as the probe builds it); greedy answer (at most `max_new_tokens`, stopping before <|im_end|> /
           eos, or once the expected number is in it: run_cell's rule); correct = the expected number in it
  nll      prefill = a document's first `length` tokens; target = its next `--continuation` tokens; mean NLL
           per target token by teacher forcing
Each method compresses the prefill at compression ratio r = 1 - density. The kvpress side
(`bench/_kvpress_probe_side.py`, kvpress's own venv, transformers 5.2) runs each press over the prefill
(`with press(model)`, the pipeline-free path), then decodes / teacher-forces on the resulting DynamicCache;
the `@prefill_decode` methods use kvpress's decode-time press (`PrefillDecodingPress` with a
`DecodingPress`, which compresses back to the prefill's budget every `--decode-interval` decoded tokens).
The nexus side runs the same samples through `measure.probes.runner.run_cell` (one recorded dense
prefill per sample, replayed into each method's `EvictableCache`) with settings matched to kvpress's:
the per-head budget is kvpress's `int(T * (1 - r))` (`budget_tokens`), the window W, avg pooling with
kvpress's kernel, per-query-head pooling, sinks, beta, the Ada safeguard, and the decode slack = the
decode interval. Both sides run on the CPU in fp32 with sdpa, concurrently (one torch thread each).

    python bench/kvpress_probes.py                                  # smollm2-135m, 10 samples/probe, 1024, 0.2
    python bench/kvpress_probes.py --samples 4 --methods snapkv streaming_llm
    python bench/kvpress_probes.py --dry-run                        # tiny random model, 2 samples: plumbing

Output: a table per method (needle accuracy both sides and per-sample agreement, mean NLL both sides and
mean |delta| per sample, kept fraction both sides) and `bench/out/kvpress_probes.json` with every sample
and a note per method on where the two libraries' rules differ (docs/benchmarks.md explains them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import common  # noqa: E402
from kvpress_parity import (  # noqa: E402,F401  (venv_ready: for the test)
    DEFAULT_VENV,
    add_press_args,
    ensure_venv,
    matched_params,
    n_kept,
    venv_ready,
)
from kvpress_parity import press_settings as prefill_press_settings  # noqa: E402

import nexus  # noqa: E402

SCHEMA = "nexus-bench-kvpress-probes/1"
PROBES = ("needle", "nll")
PREFILL_ONLY = ["snapkv", "pyramidkv", "streaming_llm", "ada_snapkv"]
DECODE = ["snapkv@prefill_decode", "streaming_llm@prefill_decode"]
METHODS = PREFILL_ONLY + DECODE
FALLBACK_MODEL = "/tmp/smol/fp32"


def default_model() -> str:
    """The smollm2-135m preset when `nexus-eval setup` has converted it here, else the fp32 copy in /tmp."""
    from agent_runner.config import SMOLLM2
    from agent_runner.real_models import is_ready

    return SMOLLM2 if is_ready(SMOLLM2) else FALLBACK_MODEL


def model_folder(name: str, work: Path) -> Path:
    """The folder both sides load: a preset's converted folder, a local path, or the tiny random model saved
    here (a randomly initialised Qwen3 + the real Qwen3 tokenizer, `save_pretrained`)."""
    from agent_runner.config import TINY
    from agent_runner.real_models import PRESETS, preset_path

    if name == TINY:
        from transformers import AutoTokenizer

        from agent_runner.model_host import qwen_tokenizer_dir, tiny_model

        folder = work / "tiny"
        model = tiny_model()
        model.save_pretrained(folder)
        AutoTokenizer.from_pretrained(qwen_tokenizer_dir()).save_pretrained(folder)
        return folder
    if name in PRESETS:
        return preset_path(name)
    folder = Path(name)
    if not (folder / "config.json").is_file():
        raise SystemExit(f"model {name!r}: no config.json there; give a preset name, 'tiny' or a model folder")
    return folder


def our_config(method: str, args, budget: int) -> nexus.EvictionConfig:
    """The nexus configuration matched to kvpress's press of the same name (see the module docstring)."""
    base, _, scope = method.partition("@")
    if base == "dense":
        return nexus.EvictionConfig(method="dense", scope="prefill_only")
    params = matched_params(base, args)
    # the decode slack is one "block": block_size only sets the slack for these methods (Nexus alone scores
    # by blocks), so block_size = the decode interval gives kvpress's compression_interval exactly
    return nexus.EvictionConfig(
        method=base,
        scope=scope or "prefill_only",
        budget_tokens=budget,
        window=args.window,
        block_size=args.decode_interval,
        slack_blocks=1,
        **params,
    )


def build_samples(tokenizer, args) -> list:
    from measure.probes.samples import build_sample
    from measure.probes.settings import ProbeSettings

    settings = ProbeSettings(
        model=args.model,
        probes=tuple(args.probes),
        samples=args.samples,
        lengths=tuple(args.lengths),
        continuation=args.continuation,
        seed=args.seed,
    )
    return [build_sample(p, tokenizer, i, settings) for p in args.probes for i in range(args.samples)]


def _per_head_counts(cache, layer: int) -> torch.Tensor:
    """[Hkv] long: slots each KV head of `layer` holds (batch row 0)."""
    return (cache.retained_positions(layer)[0] >= 0).sum(-1)


def _sinks_kept(cache, n_sink: int) -> float:
    """Fraction of the (layer, KV head, position < n_sink) entries still in `cache`."""
    kept = total = 0
    for layer in range(cache.num_layers):
        pos = cache.retained_positions(layer)[0]  # [Hkv, slots], -1 = empty
        kept += int(((pos >= 0) & (pos < n_sink)).sum())
        total += pos.shape[0] * n_sink
    return kept / total


@torch.no_grad()
def _continued_cache(host, recorded, config, target: list[int]):
    """The cache after teacher-forcing `target[:-1]` (what run_cell's nll scoring leaves), fed as run_cell feeds
    it (split at decode-time events, so it equals one token at a time)."""
    from measure.stacked_cells import Rows

    cache = recorded.cache_for(config)
    Rows(host.model, [cache]).feed_decoded(target[:-1])
    return cache


def run_ours(host, samples, methods: list[str], args) -> list[dict]:
    """Every (sample, method) through `run_cell`, plus the cache figures the comparison needs."""
    from measure.probes.runner import run_cell
    from measure.probes.settings import SINGLE_PREFILL
    from nexus.shared_prefill import record_prefill

    out = []
    for sample in samples:
        t = len(sample.prefill)
        budget = n_kept(t, args.ratio)
        recorded = record_prefill(host.model, torch.tensor([sample.prefill], device=host.device))
        for method in methods:
            started = time.perf_counter()
            config = our_config(method, args, budget)
            measured = run_cell(host, sample, recorded, config, SINGLE_PREFILL)
            cache = recorded.cache_for(config)
            counts = [_per_head_counts(cache, i) for i in range(cache.num_layers)]
            sinks = None
            if sample.target:
                end = _continued_cache(host, recorded, config, sample.target) if "@" in method else cache
                sinks = _sinks_kept(end, args.n_sink)
            out.append(
                dict(
                    method=method,
                    probe=sample.probe,
                    index=sample.index,
                    answer=measured["answer"] if sample.max_new_tokens else None,
                    correct=measured["correct"],
                    nll=measured["nll"],
                    kept_fraction=measured["kept_fraction"],
                    kept_per_layer=[float(c.float().mean()) for c in counts],
                    kept_min_per_layer=[int(c.min()) for c in counts],
                    sinks_kept_at_end=sinks,
                    seconds=time.perf_counter() - started,
                )
            )
        del recorded
    return out


def press_settings(args) -> dict[str, Any]:
    """The press settings both sides run with, as the kvpress side's request names them (stored in the JSON too)."""
    return dict(**prefill_press_settings(args), decode_interval=args.decode_interval)


def start_kvpress(python: Path, model_dir: Path, samples, stop_ids: list[int], methods, args, work: Path):
    """Write the request and start the kvpress side; returns (process, output path, log path)."""
    out_path, req_path, log_path = work / "kvpress.json", work / "request.json", work / "kvpress.log"
    req = dict(
        model_dir=str(model_dir),
        out_path=str(out_path),
        methods=methods,
        **press_settings(args),
        stop_token_ids=stop_ids,
        threads=args.threads,
        samples=[
            dict(
                probe=s.probe,
                index=s.index,
                prefill=s.prefill,
                target=s.target,
                max_new_tokens=s.max_new_tokens,
                expected=s.expected,
            )
            for s in samples
        ],
    )
    req_path.write_text(json.dumps(req))
    log = log_path.open("w")
    proc = subprocess.Popen(
        [str(python), str(ROOT / "bench" / "_kvpress_probe_side.py"), str(req_path)], stdout=log, stderr=log
    )
    return proc, out_path, log_path


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def compare(samples, ours: list[dict], kp: list[dict], tokenizer, methods: list[str]) -> tuple[list, list]:
    """Per-method rows and the per-sample pairs (kvpress answers decoded and graded here, like ours)."""
    by_key = {(r["method"], r["probe"], r["index"]): r for r in kp}
    lengths = {(s.probe, s.index): len(s.prefill) for s in samples}
    expected = {(s.probe, s.index): s.expected for s in samples}
    pairs, rows = [], []
    for o in ours:
        k = by_key[(o["method"], o["probe"], o["index"])]
        t = lengths[(o["probe"], o["index"])]
        pair = dict(method=o["method"], probe=o["probe"], index=o["index"], length=t)
        if k["answer_ids"] is not None:
            answer = tokenizer.decode(k["answer_ids"], skip_special_tokens=True)
            pair.update(
                expected=expected[(o["probe"], o["index"])],
                answer_kvpress=answer,
                answer_ours=o["answer"],
                correct_kvpress=expected[(o["probe"], o["index"])] in answer,
                correct_ours=o["correct"],
            )
        if k["nll"] is not None:
            pair.update(nll_kvpress=k["nll"], nll_ours=o["nll"], nll_abs_delta=abs(k["nll"] - o["nll"]))
        pair.update(
            kept_fraction_kvpress=sum(k["kept_per_layer"]) / (len(k["kept_per_layer"]) * t),
            kept_fraction_ours=o["kept_fraction"],
            kept_per_layer_kvpress=k["kept_per_layer"],
            kept_per_layer_ours=o["kept_per_layer"],
            kept_min_head_kvpress=min(k["kept_min_per_layer"]),
            kept_min_head_ours=min(o["kept_min_per_layer"]),
            sinks_kept_kvpress=k["sinks_kept_at_end"] if k["nll"] is not None else None,
            sinks_kept_ours=o["sinks_kept_at_end"],
            seconds_kvpress=k["seconds"],
            seconds_ours=o["seconds"],
        )
        pairs.append(pair)
    for method in methods:
        mine = [p for p in pairs if p["method"] == method]
        needle = [p for p in mine if "answer_ours" in p]
        nll = [p for p in mine if "nll_ours" in p]
        layers = len(mine[0]["kept_per_layer_ours"])
        rows.append(
            dict(
                method=method,
                needle_n=len(needle),
                needle_correct_kvpress=sum(p["correct_kvpress"] for p in needle),
                needle_correct_ours=sum(p["correct_ours"] for p in needle),
                needle_agree=sum(p["correct_kvpress"] == p["correct_ours"] for p in needle),
                needle_same_answer=sum(p["answer_kvpress"] == p["answer_ours"] for p in needle),
                nll_n=len(nll),
                nll_kvpress=_mean(p["nll_kvpress"] for p in nll),
                nll_ours=_mean(p["nll_ours"] for p in nll),
                nll_mean_abs_delta=_mean(p["nll_abs_delta"] for p in nll),
                nll_max_abs_delta=max((p["nll_abs_delta"] for p in nll), default=None),
                kept_fraction_kvpress=_mean(p["kept_fraction_kvpress"] for p in mine),
                kept_fraction_ours=_mean(p["kept_fraction_ours"] for p in mine),
                kept_per_layer_kvpress=[_mean(p["kept_per_layer_kvpress"][i] for p in mine) for i in range(layers)],
                kept_per_layer_ours=[_mean(p["kept_per_layer_ours"][i] for p in mine) for i in range(layers)],
                kept_min_head_kvpress=min(p["kept_min_head_kvpress"] for p in mine),
                kept_min_head_ours=min(p["kept_min_head_ours"] for p in mine),
                sinks_kept_kvpress=_mean(p["sinks_kept_kvpress"] for p in nll),
                sinks_kept_ours=_mean(p["sinks_kept_ours"] for p in nll),
            )
        )
    return rows, pairs


# Where the two libraries' rules differ, per method, as read in kvpress 0.5.5 (presses/*.py) and nexus/policies.
COMMON_NOTE = (
    "Both sides: budget per KV head = kvpress's int(T * (1 - r)), window inside it, the whole prefill "
    "(document and question) compressed in one forward, so the last W tokens (the question) are the observation "
    "window on both sides; kvpress's own pipeline would compress the context without the question instead. "
    "kvpress gathers the kept keys in topk order (descending score, ties in no fixed order); nexus keeps slot "
    "order = time order. Attention does not care; a later decode-time score that looks at neighbours or at slot "
    "indices does."
)
NOTES = {
    "dense": "No press on either side: the same weights, the same tokens; differences are fp32 rounding.",
    "snapkv": (
        "Same rule: the last W queries against all keys, softmax, mean over the W rows, avg_pool1d(kernel, "
        "count_include_pad) per query head, mean over the group, window padded to the top (kvpress: global "
        "max + 1; nexus: forced), top (budget - W). kvpress recomputes the window queries from the layer's input "
        "(q_proj + RoPE), nexus records the post-RoPE queries: equal up to rounding, so only near-ties can split."
    ),
    "pyramidkv": (
        "Different per-layer budgets. kvpress: C' = W + T(1-r), min = T(1-r)/beta, max = 2 T(1-r) - min (float, "
        "window folded into the schedule, round()), and whenever not (T >= max >= min >= W) it falls back to the "
        "uniform round(T(1-r)) per layer, i.e. SnapKV (round, not int: up to one more token). nexus "
        "(KVCache-Factory's integer schedule): the pyramid on C - W with W added to every layer, no such fallback."
    ),
    "streaming_llm": (
        "Same rule: the first n_sink positions + the last (budget - n_sink). Original RoPE positions on both sides."
    ),
    "ada_snapkv": (
        "Different allocation. kvpress: each head's top n_safe = int(n_kept * alpha) scores are protected, then "
        "the H (T - n_kept) globally lowest scores are masked; the window's padded score (global max + 1) is the "
        "highest, so with n_safe <= W the safeguard protects only the window, which is safe anyway, and a head "
        "can fall to W keys. nexus (FFY0/AdaKV's formula): B' = budget - W selectable per head, global top H B' "
        "non-window scores -> n_h, cap_h = round(n_h (1 - alpha) + floor(alpha B')) + W, so every head keeps "
        "at least W + floor(alpha B'). Storage: kvpress keeps every key and, at decode, overwrites masked ones "
        "with a 'fake key' built so exp(<q, k>) underflows (an approximation; the value stays); nexus drops them."
    ),
    "snapkv@prefill_decode": (
        "Prefill as snapkv; then both evict back to the prefill budget after every `decode_interval` decoded "
        "tokens (kvpress DecodingPress(compression_interval, target_size); nexus scope prefill_decode, slack = "
        "the interval). Differences at a decode event: (1) kvpress recomputes the W window queries from the "
        "buffered hidden states but rotates all of them with the current token's cos/sin (the decode step's "
        "position_embeddings, length 1), so query i is scored as if at the newest position (relative distances "
        "off by up to W - 1); nexus uses the stored post-RoPE queries at their own positions. (2) kvpress pools "
        "along slot order, which after its prefill gather is descending-score order, so the kernel averages "
        "unrelated tokens; nexus pools along time order. (3) kvpress asserts more buffered decode states than W, "
        "so the interval must exceed W."
    ),
    "streaming_llm@prefill_decode": (
        "Prefill as streaming_llm; then every `decode_interval` decoded tokens both evict back to the budget. "
        "kvpress's StreamingLLMPress scores by slot index (slots [n_sink, n_sink + n_pruned) get 0), but its "
        "prefill gather left the slots in topk order of a 0/1 score (no fixed order among ties), so at the first "
        "decode event the 'sinks' are whatever 4 tokens sit in slots 0-3 and the pruned slots are an arbitrary "
        "part of the kept prefill: the real sinks (positions 0..n_sink-1) can go, and the evicted tokens are not "
        "the oldest. nexus keeps the n_sink lowest positions and the newest tokens by position at every event."
    ),
}


def facts(row: dict, args) -> str:
    """Measured facts that go with a method's note (budgets, fallback, safeguard, sinks)."""
    kp, us = row["kept_per_layer_kvpress"], row["kept_per_layer_ours"]
    out = []
    if row["method"].startswith("pyramidkv"):
        flat = max(kp) - min(kp) < 1.0
        out.append(
            f"per-layer keys/head: kvpress {kp[0]:.0f} (layer 0) .. {kp[-1]:.0f} (last)"
            f"{' = uniform: the fallback' if flat else ''}; nexus {us[0]:.0f} .. {us[-1]:.0f}"
        )
    if row["method"].startswith("ada"):
        mean_budget = sum(kp) / len(kp)
        out.append(
            f"n_kept ~ {mean_budget:.0f}, n_safe = int(n_kept * {args.alpha_safeguard}) ~ "
            f"{int(mean_budget * args.alpha_safeguard)} vs W = {args.window}; smallest head: kvpress "
            f"{row['kept_min_head_kvpress']} keys, nexus {row['kept_min_head_ours']}"
        )
    if row["sinks_kept_kvpress"] is not None and row["sinks_kept_ours"] is not None and "@" in row["method"]:
        out.append(
            f"positions < {args.n_sink} still cached after the nll continuation: kvpress "
            f"{100 * row['sinks_kept_kvpress']:.0f}%, nexus {100 * row['sinks_kept_ours']:.0f}% of (layer, head, sink)"
        )
    return "; ".join(out)


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _table(rows: list[dict], title: str):
    from rich.table import Table

    table = Table(title=title)
    for col in (
        "method",
        "needle kvpress",
        "ours",
        "agree",
        "same answer",
        "NLL kvpress",
        "ours",
        "mean |dNLL|",
        "max |dNLL|",
        "kept kvpress",
        "ours",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        n = r["needle_n"]
        table.add_row(
            r["method"],
            f"{r['needle_correct_kvpress']}/{n}" if n else "-",
            f"{r['needle_correct_ours']}/{n}" if n else "-",
            f"{r['needle_agree']}/{n}" if n else "-",
            f"{r['needle_same_answer']}/{n}" if n else "-",
            _fmt(r["nll_kvpress"], ".4f"),
            _fmt(r["nll_ours"], ".4f"),
            _fmt(r["nll_mean_abs_delta"], ".2e"),
            _fmt(r["nll_max_abs_delta"], ".2e"),
            _fmt(r["kept_fraction_kvpress"], ".4f"),
            _fmt(r["kept_fraction_ours"], ".4f"),
        )
    return table


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="preset name, model folder or 'tiny' (default: smollm2-135m)")
    ap.add_argument("--samples", type=int, default=10, help="samples per probe")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024], help="filler tokens per sample")
    ap.add_argument("--density", type=float, default=0.2, help="kept fraction; kvpress compression_ratio = 1 - it")
    ap.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS, help="dense always runs too")
    ap.add_argument("--probes", nargs="+", default=list(PROBES), choices=PROBES)
    add_press_args(
        ap,
        64,
        window_help="observation window W (kvpress's SnapKV default)",
        kernel_help="avg-pool kernel (kvpress's default and only pooling)",
    )
    ap.add_argument("--decode-interval", type=int, default=96, help="decoded tokens between decode-time events")
    ap.add_argument("--continuation", type=int, default=256, help="nll: scored tokens after the context")
    ap.add_argument("--seed", type=int, default=0, help="the probes' texts")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads, each side")
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    ap.add_argument("--out", type=Path, default=None, help="default bench/out/kvpress_probes.json")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="tiny random model, 2 samples of 256 tokens, W 16, continuation 32, interval 24: checks the plumbing",
    )
    args = ap.parse_args(argv)
    if args.dry_run:
        args.model = args.model or "tiny"
        args.samples, args.lengths, args.window = min(args.samples, 2), [256], 16
        args.continuation, args.decode_interval = 32, 24
    args.model = args.model or default_model()
    args.out = args.out or Path(
        "bench/out/kvpress_probes_dry.json" if args.dry_run else "bench/out/kvpress_probes.json"
    )
    if not 0.0 < args.density <= 1.0:
        ap.error(f"--density must be in (0, 1], got {args.density}")
    args.ratio = 1.0 - args.density
    if "snapkv@prefill_decode" in args.methods and args.decode_interval <= args.window:
        ap.error(f"kvpress's decode-time SnapKV needs --decode-interval > --window ({args.window})")
    if args.kernel_size < 1 or args.kernel_size % 2 == 0:
        ap.error("--kernel-size must be odd (length-preserving pooling)")
    return args


def main(argv=None) -> dict[str, Any]:
    from rich.console import Console
    from rich.markup import escape

    from agent_runner.config import ModelSpec
    from agent_runner.model_host import load_host

    args = parse_args(argv)
    console = Console(width=200)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    python = ensure_venv(args.venv)
    methods = ["dense", *args.methods]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kvpress-probes-") as tmp:
        work = Path(tmp)
        folder = model_folder(args.model, work)
        host = load_host(ModelSpec(name=str(folder), device="cpu", dtype="float32", attn="sdpa"))
        samples = build_samples(host.tokenizer, args)
        proc, out_path, log_path = start_kvpress(python, folder, samples, host.stop_token_ids, methods, args, work)
        try:
            with console.status(f"nexus side ({len(samples)} samples x {len(methods)} methods; kvpress alongside)"):
                t0 = time.perf_counter()
                ours = run_ours(host, samples, methods, args)
                ours_s = time.perf_counter() - t0
            with console.status("waiting for the kvpress side"):
                rc = proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
        if rc != 0:
            raise RuntimeError(f"kvpress side failed (rc {rc}):\n{log_path.read_text()[-4000:]}")
        kp = json.loads(out_path.read_text())
    rows, pairs = compare(samples, ours, kp["results"], host.tokenizer, methods)
    for row in rows:
        row["note"] = NOTES[row["method"]]
        row["measured"] = facts(row, args)
    lengths = [len(s.prefill) for s in samples]
    from measure.probes import fingerprint

    probe_code = {
        name: hashlib.sha256((ROOT / "measure" / "probes" / name).read_bytes()).hexdigest()[:16]
        for name in ("samples.py", "runner.py")
    }
    meta = dict(
        schema=SCHEMA,
        model=args.model,
        model_folder=str(folder),
        probes=args.probes,
        samples_per_probe=args.samples,
        lengths=args.lengths,
        prefill_tokens=dict(min=min(lengths), max=max(lengths)),
        density=args.density,
        **press_settings(args),
        continuation=args.continuation,
        seed=args.seed,
        probe_code=probe_code,  # the probes change: results are comparable only at the same texts and rules
        filler=fingerprint(),
        threads=args.threads,
        nexus_side=dict(torch=torch.__version__, transformers=transformers.__version__, seconds=ours_s),
        kvpress_side=dict(**kp["versions"], seconds=kp["seconds"]),
        wall_seconds=time.perf_counter() - started,
        common_note=COMMON_NOTE,
        command="python bench/kvpress_probes.py " + " ".join(sys.argv[1:] if argv is None else argv),
    )
    title = (
        f"kvpress {kp['versions']['kvpress']} (transformers {kp['versions']['transformers']}) vs nexus "
        f"(transformers {transformers.__version__}) on {args.model}: density {args.density}, W={args.window}, "
        f"kernel {args.kernel_size}, {args.samples} samples/probe, prefill {min(lengths)}-{max(lengths)} tokens"
    )
    console.print(_table(rows, title))
    for row in rows:
        extra = f" Measured: {row['measured']}." if row["measured"] else ""
        console.print(f"[bold]{row['method']}[/bold]: " + escape(row["note"] + extra))
    console.print("[bold]all methods[/bold]: " + escape(COMMON_NOTE))
    console.print(
        f"time: nexus side {ours_s:.0f} s, kvpress side {kp['seconds']:.0f} s (concurrent), "
        f"wall {meta['wall_seconds']:.0f} s"
    )
    payload = dict(meta=meta, rows=rows, samples=pairs)
    common.save(console, args.out, payload)
    return payload


if __name__ == "__main__":
    main()
