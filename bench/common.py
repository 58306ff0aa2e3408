"""Shared plumbing for the bench scripts: model shapes by name, random-weight models, device ceilings, output.

Model shapes (`SHAPES`) are written from the published architecture numbers (config.json of each release),
so throughput and memory can be measured with random weights and no download:
  tiny          the test suite's tiny Qwen3 (agent_runner.model_host.tiny_model, 2 layers, hidden 64)
  llama-3.1-8b  meta-llama/Llama-3.1-8B(-Instruct): 32 layers, hidden 4096, 32 q / 8 kv heads, head_dim 128
  qwen3-8b      Qwen/Qwen3-8B: 36 layers, hidden 4096, 32 q / 8 kv heads, head_dim 128
  qwen3-32b     Qwen/Qwen3-32B (DeepSWE-Preview): 64 layers, hidden 5120, 64 q / 8 kv heads, head_dim 128
This module imports only torch, transformers and rich (what the H200 machine has), never pydantic or the
service packages, so `bench/decode.py` runs there from a bare checkout.

    python bench/common.py --out bench/out/env.json     # environment + copy bandwidth + matmul rate
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

_LLAMA31_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def _large(vocab: int, hidden: int, intermediate: int, layers: int, heads: int, positions: int, eps: float, rope):
    """The config kwargs of the released models below: all three have 8 KV heads of 128 dims, untied embeddings."""
    return dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=positions,
        rms_norm_eps=eps,
        tie_word_embeddings=False,
        rope_parameters=rope,
    )


_QWEN3_ROPE = {"rope_type": "default", "rope_theta": 1000000.0}

#: name -> (transformers architecture, config kwargs). Numbers from each model's published config.json.
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny": (
        "qwen3",
        dict(
            vocab_size=151936,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=65536,
            tie_word_embeddings=True,
        ),
    ),
    # the released models: (vocab, hidden, intermediate, layers, q heads, max positions, rms eps, rope)
    "llama-3.1-8b": ("llama", _large(128256, 4096, 14336, 32, 32, 131072, 1e-5, _LLAMA31_ROPE)),
    "qwen3-8b": ("qwen3", _large(151936, 4096, 12288, 36, 32, 40960, 1e-6, _QWEN3_ROPE)),
    "qwen3-32b": ("qwen3", _large(151936, 5120, 25600, 64, 64, 40960, 1e-6, _QWEN3_ROPE)),
}


def model_config(shape: str, layers: int | None = None, vocab: int | None = None, attn: str = "sdpa"):
    """The transformers config of `shape`, optionally sliced to `layers` decoder layers / a smaller vocab."""
    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r}; known: {', '.join(SHAPES)}")
    arch, kwargs = SHAPES[shape]
    kwargs = dict(kwargs)
    if layers is not None:
        if layers < 1 or layers > kwargs["num_hidden_layers"]:
            raise ValueError(f"--layers must be in 1..{kwargs['num_hidden_layers']} for {shape}, got {layers}")
        kwargs["num_hidden_layers"] = layers
    if vocab is not None:
        if vocab < 16:
            raise ValueError(f"--vocab must be >= 16, got {vocab}")
        kwargs["vocab_size"] = vocab
    if arch == "llama":
        from transformers import LlamaConfig as cls
    else:
        from transformers import Qwen3Config as cls
    return cls(attn_implementation=attn, **kwargs)


def random_model(config, dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.nn.Module:
    """A causal LM with random weights, built directly on `device` in `dtype` (no fp32 copy on the host)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(old)
    return model.to(dtype).eval()


def attn_implementation(device: torch.device, requested: str = "auto") -> str:
    """flash_attention_2 on CUDA when flash_attn is importable, else sdpa (or what was requested)."""
    if requested != "auto":
        return requested
    if device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def free_memory(device: torch.device) -> None:
    """Collect what the last run dropped and hand the device's cached blocks back, so the next run's memory
    figures start from the same floor."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return dev


def copy_bandwidth(device: torch.device, mib: int = 1024, repeats: int = 10) -> float:
    """Median device-memory copy bandwidth in bytes/s, counting bytes read + bytes written."""
    n = mib * 2**20 // 4
    src = torch.rand(n, device=device)  # random data, never zeros (they can run faster than real data)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * src.numel() * src.element_size() / statistics.median(times)


def matmul_rate(device: torch.device, dtype: torch.dtype, n: int = 8192, repeats: int = 10) -> float:
    """Median FLOP/s of an n x n x n matrix product on random data."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)


def environment(device: torch.device) -> dict[str, Any]:
    """Versions, threads and the device (name, memory) the numbers were taken on."""
    import transformers

    env: dict[str, Any] = dict(
        python=platform.python_version(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        threads=torch.get_num_threads(),
        cpu_count=os.cpu_count(),
        device=str(device),
        flash_attn=None,
        cuda=None,
    )
    if importlib.util.find_spec("flash_attn") is not None:
        try:
            import flash_attn

            env["flash_attn"] = flash_attn.__version__
        except Exception as exc:  # a broken build is worth recording, not fatal
            env["flash_attn"] = f"import failed: {exc}"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        env["cuda"] = dict(
            name=props.name,
            capability=f"{props.major}.{props.minor}",
            runtime=torch.version.cuda,
            total_gib=total / 2**30,
            free_gib=free / 2**30,
        )
    return env


def add_device_args(ap: argparse.ArgumentParser) -> None:
    """The options every random-model script reads through `setup`: dtype, device, attention, threads."""
    ap.add_argument("--dtype", default="auto", choices=["auto", *DTYPES])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--attn", default="auto", help="auto (flash_attention_2 on CUDA if installed, else sdpa)")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch default)")


@dataclass(frozen=True)
class Setup:
    """Where and how a script's random-weight model runs, as `setup` resolved the `add_device_args` options."""

    threads: int
    device: torch.device
    dtype: torch.dtype
    attn: str
    config: Any  # the transformers config of the model shape

    def run_meta(self, schema: str, args, model: torch.nn.Module, **extra: Any) -> dict[str, Any]:
        """The `meta` of the script's JSON: what ran where, then `extra`, the arguments, and `complete=False`
        (set true by `report` once every run is written)."""
        return dict(
            schema=schema,
            env=environment(self.device),
            dtype=str(self.dtype).removeprefix("torch."),
            attn=self.attn,
            model=args.model,
            layers=self.config.num_hidden_layers,
            vocab=self.config.vocab_size,
            params=sum(p.numel() for p in model.parameters()),
            threads=self.threads,
            **extra,
            args={k: v for k, v in vars(args).items() if k != "out"},
            complete=False,
        )

    def title(self, shape: str) -> str:
        """The opening of the results table's title: the model and where it ran."""
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{shape} ({self.config.num_hidden_layers} layers, {dtype}, {self.attn}) on {self.device}"


def setup(args, layers: int | None) -> Setup:
    """Threads, device, dtype ("auto": bfloat16 on CUDA, float32 on the CPU), attention and the config of
    `args.model` sliced to `layers` (None = all), from the `add_device_args` options."""
    threads = set_threads(args.threads)
    device = resolve_device(args.device)
    auto = torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = auto if args.dtype == "auto" else DTYPES[args.dtype]
    attn = attn_implementation(device, args.attn)
    return Setup(threads, device, dtype, attn, model_config(args.model, layers, args.vocab, attn))


def results_table(title: str, rows: list[list[tuple[str, str]]]):
    """A rich table of right-justified columns from rows of (header, text) cells, each header beside what fills
    it; the columns are the first row's headers."""
    from rich.table import Table

    table = Table(title=title)
    for header, _ in rows[0] if rows else ():
        table.add_column(header, justify="right")
    for row in rows:
        table.add_row(*(text for _, text in row))
    return table


def report(console, table, out: Path, payload: dict[str, Any]) -> dict[str, Any]:
    """Mark the run complete, show its table and write its JSON a last time; returns the payload."""
    payload["meta"]["complete"] = True
    console.print(table)
    save(console, out, payload)
    return payload


def save(console, out: Path, payload: dict[str, Any]) -> None:
    """Write a script's JSON and say where."""
    write_json(out, payload)
    console.print(f"wrote {out}")


def set_threads(n: int) -> int:
    """Set torch's intra-op threads (0 = leave torch's default); returns the count in effect."""
    if n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str))


def main() -> None:
    ap = argparse.ArgumentParser(description="environment, copy bandwidth and matmul rate of a device")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--copy-mib", type=int, default=1024)
    ap.add_argument("--matmul-n", type=int, default=8192)
    ap.add_argument("--out", type=Path, default=Path("bench/out/env.json"))
    args = ap.parse_args()
    from rich.console import Console

    set_threads(args.threads)
    device = resolve_device(args.device)
    env = environment(device)
    env["copy_bandwidth_gbs"] = copy_bandwidth(device, args.copy_mib) / 1e9
    dtype = torch.bfloat16
    env["matmul_dtype"] = str(dtype).removeprefix("torch.")
    env["matmul_n"] = args.matmul_n
    env["matmul_tflops"] = matmul_rate(device, dtype, args.matmul_n) / 1e12
    Console().print_json(json.dumps(env, default=str))
    write_json(args.out, env)


if __name__ == "__main__":
    main()
