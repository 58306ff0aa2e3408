"""nexus vs NVIDIA kvpress, side by side: kept positions, next-token logits and compression time.

One tiny random Qwen3 (real architecture, real Qwen3 tokenizer) is saved once with `save_pretrained` and
loaded by both libraries; one prompt (the first `--tokens` tokens of this repository's `nexus/` sources).
For SnapKV, PyramidKV, StreamingLLM and Ada-SnapKV at the same budget (kvpress's compression ratio r, and
nexus `budget_tokens = int(T * (1 - r))`, kvpress's own n_kept) and the same window / kernel, it reports:
  jaccard / recall   per layer and KV head: |A n B| / |A u B| and |A n B| / |B| (A = nexus, B = kvpress kept)
  logits             next-token logits after compression: max |nexus - kvpress|, and each vs the dense cache
  time ratio         nexus compression seconds / kvpress compression seconds (min over repeats, all layers)
kvpress pins transformers < 5.3, so it runs in its own virtual environment (built on first use, outside the
project's dependencies) through `bench/_kvpress_side.py`; nexus runs here on the project's transformers.
Deliberate differences between the two are listed in docs/benchmarks.md.

    python bench/kvpress_parity.py                       # builds bench/out/venv-kvpress on first use
    python bench/kvpress_parity.py --setup-only          # only build / check the venv (CI)
    python bench/kvpress_parity.py --tokens 4096 --layers 8 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import common  # noqa: E402

import nexus  # noqa: E402

SCHEMA = "nexus-bench-kvpress-parity/1"
KVPRESS = "kvpress==0.5.5"
TORCH = "torch==2.13.0"
DEFAULT_VENV = Path(os.environ.get("NEXUS_KVPRESS_VENV", ROOT / "bench" / "out" / "venv-kvpress"))
METHODS = ["snapkv", "pyramidkv", "streaming_llm", "ada_snapkv"]


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def venv_ready(venv: Path) -> bool:
    """Whether `venv` has kvpress 0.5.5 importable (with whatever transformers it resolved)."""
    py = venv_python(venv)
    if not py.exists():
        return False
    check = "from importlib.metadata import version; assert version('kvpress') == '0.5.5'; version('transformers')"
    return subprocess.run([str(py), "-c", check], capture_output=True).returncode == 0


def ensure_venv(venv: Path) -> Path:
    """Build kvpress's own virtual environment if it is missing; returns its python. Raises with pip's log."""
    if venv_ready(venv):
        return venv_python(venv)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # torch first and pinned (a local wheel here; unpinned it would download GBs), then kvpress and its pins
    proc = subprocess.run(
        [str(venv_python(venv)), "-m", "pip", "install", "-q", TORCH, KVPRESS], capture_output=True, text=True
    )
    if proc.returncode != 0 or not venv_ready(venv):
        raise RuntimeError(f"could not build the kvpress venv at {venv}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return venv_python(venv)


def save_tiny_model(path: Path, args) -> None:
    """A random Qwen3ForCausalLM + the real Qwen3 tokenizer, saved with save_pretrained (fp32 safetensors)."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from agent_runner.model_host import qwen_tokenizer_dir

    torch.manual_seed(args.seed)
    cfg = Qwen3Config(
        vocab_size=151936,
        hidden_size=args.heads * args.head_dim,
        intermediate_size=256,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    )
    Qwen3ForCausalLM(cfg).eval().save_pretrained(path)
    AutoTokenizer.from_pretrained(qwen_tokenizer_dir()).save_pretrained(path)


def prompt_ids(model_dir: Path, tokens: int) -> torch.Tensor:
    """[1, tokens] ids of this repository's nexus sources (repeated if short): real text, stable per commit."""
    from transformers import AutoTokenizer

    text = "\n".join(p.read_text() for p in sorted((ROOT / "nexus").rglob("*.py")))
    ids = AutoTokenizer.from_pretrained(model_dir)(text, return_tensors="pt").input_ids
    while ids.shape[1] < tokens:
        ids = torch.cat([ids, ids], dim=1)
    return ids[:, :tokens].contiguous()


def n_kept(t: int, ratio: float) -> int:
    """kvpress's `compute_n_kept`: the per-head token count both libraries keep (window included)."""
    return max(1, int(t * (1 - ratio)))


#: the `add_press_args` options, under the names the kvpress sides' requests use
PRESS_OPTIONS = ("window", "kernel_size", "beta", "n_sink", "alpha_safeguard")


def add_press_args(ap: argparse.ArgumentParser, window: int, window_help: str, kernel_help: str) -> None:
    """The press options of both comparisons (this one and bench/kvpress_probes.py), each with its own window."""
    ap.add_argument("--window", type=int, default=window, help=window_help)
    ap.add_argument("--kernel-size", type=int, default=5, help=kernel_help)
    ap.add_argument("--beta", type=int, default=20)
    ap.add_argument("--n-sink", type=int, default=4)
    ap.add_argument("--alpha-safeguard", type=float, default=0.2)


def press_settings(args) -> dict[str, Any]:
    """The press settings both sides run with, as the kvpress side's request names them (stored in the JSON too)."""
    return dict(compression_ratio=args.ratio, **{name: getattr(args, name) for name in PRESS_OPTIONS})


def matched_params(method: str, args) -> dict[str, Any]:
    """The nexus `method_params` matching kvpress's press of the same name (see docs/benchmarks.md)."""
    params: dict[str, Any] = {}
    if method in ("snapkv", "pyramidkv", "ada_snapkv"):
        params = dict(kernel_size=args.kernel_size, pooling="avg", pool_per_query_head=True)
    if method == "pyramidkv":
        params["beta"] = args.beta
    if method == "streaming_llm":
        params = dict(n_sink=args.n_sink)
    if method == "ada_snapkv":
        params["floor_alpha"] = args.alpha_safeguard
    return params


def nexus_config(method: str, args, budget: int) -> nexus.EvictionConfig:
    """The nexus configuration matching kvpress's press of the same name."""
    params = matched_params(method, args)
    return nexus.EvictionConfig(method=method, scope="prefill_only", budget_tokens=budget, window=args.window, **params)


def kept_masks(cache: nexus.EvictableCache, layers: int, t: int) -> torch.Tensor:
    """bool [L, Hkv, T] from `retained_positions` (batch row 0)."""
    out = []
    for layer in range(layers):
        pos = cache.retained_positions(layer)[0]  # [Hkv, slots], -1 = empty
        mask = torch.zeros(pos.shape[0], t, dtype=torch.bool)
        mask.scatter_(1, pos.clamp(min=0), pos >= 0)
        out.append(mask)
    return torch.stack(out)


def run_nexus(model_dir: Path, ids: torch.Tensor, args, budget: int) -> dict[str, Any]:
    """The nexus half, on the project's transformers. The next token (fed to both libraries after the
    compressed prefill) is the dense prefill's greedy choice; it is returned as `next_token`."""
    import time

    from transformers import DynamicCache, Qwen3ForCausalLM

    model = nexus.prepare(
        Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    )
    kw, t = nexus.cache_kwarg(model), ids.shape[1]
    res: dict[str, Any] = dict(methods={})
    with torch.no_grad():
        dense = DynamicCache(config=model.config)
        res["dense_prefill"] = (
            model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: dense}).logits[0, -1].float()
        )
        res["next_token"] = int(res["dense_prefill"].argmax())
        nxt = torch.tensor([[res["next_token"]]])
        res["dense_next"] = model(input_ids=nxt, use_cache=True, **{kw: dense}).logits[0, -1].float()
        for method in args.methods:
            entry: dict[str, Any] = dict(compress_s=[], prefill_s=[])
            for rep in range(args.repeats):
                cache = nexus.EvictableCache(model.config, nexus_config(method, args, budget))
                t0 = time.perf_counter()
                model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: cache})
                entry["prefill_s"].append(time.perf_counter() - t0)
                entry["compress_s"].append(sum(e.seconds for e in cache.events if e.phase == "prefill"))
                if rep == 0:
                    entry["kept"] = kept_masks(cache, model.config.num_hidden_layers, t)
                    entry["kept_counts"] = entry["kept"].sum(-1)
                    entry["physical_slots"] = [cache.physical_length(i) for i in range(model.config.num_hidden_layers)]
                    entry["next_logits"] = model(input_ids=nxt, use_cache=True, **{kw: cache}).logits[0, -1].float()
            res["methods"][method] = entry
    return res


def run_kvpress(python: Path, model_dir: Path, ids: torch.Tensor, next_token: int, args, work: Path) -> dict:
    ids_path, out_path, req_path = work / "ids.pt", work / "kvpress.pt", work / "request.json"
    torch.save(ids, ids_path)
    req = dict(
        model_dir=str(model_dir),
        ids_path=str(ids_path),
        out_path=str(out_path),
        next_token=next_token,
        methods=args.methods,
        **press_settings(args),
        repeats=args.repeats,
        threads=torch.get_num_threads(),
    )
    req_path.write_text(json.dumps(req))
    proc = subprocess.run(
        [str(python), str(ROOT / "bench" / "_kvpress_side.py"), str(req_path)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"kvpress side failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return torch.load(out_path)


def _logit_stats(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    return dict(
        max_abs=float((a - b).abs().max()),
        rel_l2=float((a - b).norm() / b.norm()),
        top1_equal=bool(a.argmax() == b.argmax()),
    )


def compare(nx: dict, kp: dict, methods: list[str]) -> list[dict[str, Any]]:
    """Per-method figures (overlap, logits, time) from the two halves' raw results."""
    rows = []
    for m in methods:
        a, b = nx["methods"][m], kp["methods"][m]
        inter = (a["kept"] & b["kept"]).sum(-1).double()  # [L, Hkv]
        union = (a["kept"] | b["kept"]).sum(-1).double()
        jac = inter / union.clamp(min=1)
        recall = inter / b["kept"].sum(-1).double().clamp(min=1)
        t_nx, t_kp = min(a["compress_s"]), min(b["compress_s"])
        rows.append(
            dict(
                method=m,
                jaccard_mean=float(jac.mean()),
                jaccard_min=float(jac.min()),
                recall_mean=float(recall.mean()),
                jaccard_per_layer=[float(x) for x in jac.mean(-1)],
                jaccard_per_layer_head=jac.tolist(),
                kept_nexus_per_layer=a["kept_counts"].tolist(),
                kept_kvpress_per_layer=b["kept_counts"].tolist(),
                physical_slots_nexus=a["physical_slots"],
                physical_slots_kvpress=b["physical_slots"],
                logits_nexus_vs_kvpress=_logit_stats(a["next_logits"], b["next_logits"]),
                logits_nexus_vs_dense=_logit_stats(a["next_logits"], nx["dense_next"]),
                logits_kvpress_vs_dense=_logit_stats(b["next_logits"], kp["dense_next"]),
                compress_s_nexus=t_nx,
                compress_s_kvpress=t_kp,
                time_ratio=t_nx / t_kp if t_kp > 0 else None,
                prefill_s_nexus=min(a["prefill_s"]),
                prefill_s_kvpress=min(b["prefill_s"]),
            )
        )
    return rows


def _table(rows, title):
    from rich.table import Table

    table = Table(title=title)
    for col in (
        "method",
        "jaccard mean",
        "min",
        "recall",
        "kept/head nexus",
        "kvpress",
        "max|dlogit| nx-kp",
        "nx-dense",
        "kp-dense",
        "top1 same",
        "compress ms nx",
        "kp",
        "time nx/kp",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        lk, ln, lkd = r["logits_nexus_vs_kvpress"], r["logits_nexus_vs_dense"], r["logits_kvpress_vs_dense"]
        per_layer = lambda counts: "/".join(f"{sum(c) / len(c):.0f}" for c in counts)  # noqa: E731
        table.add_row(
            r["method"],
            f"{r['jaccard_mean']:.3f}",
            f"{r['jaccard_min']:.3f}",
            f"{r['recall_mean']:.3f}",
            per_layer(r["kept_nexus_per_layer"]),
            per_layer(r["kept_kvpress_per_layer"]),
            f"{lk['max_abs']:.2e}",
            f"{ln['max_abs']:.2e}",
            f"{lkd['max_abs']:.2e}",
            "yes" if lk["top1_equal"] else "no",
            f"{1e3 * r['compress_s_nexus']:.2f}",
            f"{1e3 * r['compress_s_kvpress']:.2f}",
            "" if r["time_ratio"] is None else f"{r['time_ratio']:.2f}",
        )
    return table


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048, help="prompt length T")
    ap.add_argument("--ratio", type=float, default=0.8, help="kvpress compression ratio (0.8 = density 0.2)")
    add_press_args(
        ap,
        16,
        window_help="observation window W (both libraries)",
        kernel_help="avg-pool kernel (kvpress's SnapKV default)",
    )
    ap.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats per method (min is reported)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads, both sides")
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    ap.add_argument("--setup-only", action="store_true", help="build / check the kvpress venv and exit")
    ap.add_argument("--out", type=Path, default=Path("bench/out/kvpress_parity.json"))
    args = ap.parse_args(argv)
    if not 0.0 < args.ratio < 1.0:
        ap.error(f"--ratio must be in (0, 1), got {args.ratio}")
    if args.tokens <= args.window + args.n_sink:
        ap.error(f"--tokens {args.tokens} must exceed the window ({args.window}) and the sinks")
    if args.heads % args.kv_heads:
        ap.error(f"--heads {args.heads} must be a multiple of --kv-heads {args.kv_heads}")
    return args


def main(argv=None) -> dict[str, Any]:
    from rich.console import Console

    args = parse_args(argv)
    console = Console(width=200)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    python = ensure_venv(args.venv)
    if args.setup_only:
        console.print(f"kvpress venv ready: {python}")
        return {}
    with tempfile.TemporaryDirectory(prefix="kvpress-parity-") as tmp:
        work = Path(tmp)
        model_dir = work / "model"
        save_tiny_model(model_dir, args)
        ids = prompt_ids(model_dir, args.tokens)
        budget = n_kept(args.tokens, args.ratio)
        with console.status("nexus side"):
            nx = run_nexus(model_dir, ids, args, budget)
        next_token = nx["next_token"]
        with console.status(f"kvpress side ({python})"):
            kp = run_kvpress(python, model_dir, ids, next_token, args, work)
    rows = compare(nx, kp, args.methods)

    meta = dict(
        schema=SCHEMA,
        tokens=args.tokens,
        **press_settings(args),
        budget_tokens=budget,
        model=dict(
            layers=args.layers, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim, seed=args.seed
        ),
        threads=torch.get_num_threads(),
        next_token=next_token,
        nexus_side=dict(torch=torch.__version__, transformers=transformers.__version__),
        kvpress_side=kp["versions"],
        dense_prefill_logits_nexus_vs_kvpress=_logit_stats(nx["dense_prefill"], kp["dense_prefill"]),
        dense_next_logits_nexus_vs_kvpress=_logit_stats(nx["dense_next"], kp["dense_next"]),
    )
    title = (
        f"nexus (transformers {meta['nexus_side']['transformers']}) vs kvpress {kp['versions']['kvpress']} "
        f"(transformers {kp['versions']['transformers']}): T={args.tokens}, budget {budget}/head, W={args.window}, "
        f"{args.layers} layers x {args.kv_heads} KV heads, {meta['threads']} threads"
    )
    console.print(_table(rows, title))
    d = meta["dense_next_logits_nexus_vs_kvpress"]
    console.print(f"dense next-token logits, nexus side vs kvpress side: max |d| {d['max_abs']:.2e}")
    payload = dict(meta=meta, rows=rows)
    common.save(console, args.out, payload)
    return payload


if __name__ == "__main__":
    main()
