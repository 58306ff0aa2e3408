"""`nexus-eval demo`: every eviction method on the tiny Qwen3, one multi-turn stream, in a table (CPU, seconds).

Progress goes to stderr by the rule of ``_progress.live``: a bar on a terminal, elsewhere one line per method
as it finishes (``[3/10] snapkv: 41 slots/layer, 3 eviction events, max |dlogit| vs dense 0.052 (1.20 s)``).

The KV columns are ``nexus.memory``'s figures for the whole stream: held and allocated at its end, and the
largest of each at any moment (a prefill before its eviction included).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import typer

from nexus.config import EVICTION_DEFAULTS

TITLE = "tiny Qwen3 (random weights, real tokenizer)"
TURNS = (
    "Here is a stack trace from our CSV parser; the last field of each row is lost. " * 12,
    "Exit code: 0\nExecution output of [execute_bash]:\n" + "tests/test_csv.py::test_row PASSED\n" * 20,
    "Exit code: 1\n" + "AssertionError: expected 3 fields, got 2\n" * 15,
)
COLUMNS = (
    *("method", "logical", "slots/layer", "events", "evict s"),
    *("KV held", "KV alloc", "KV held peak", "KV alloc peak", "max |dlogit| vs dense", "total s"),
)


def demo(
    density: float = typer.Option(EVICTION_DEFAULTS["density"], help="kept fraction of the logical length"),
    scope: str = typer.Option(EVICTION_DEFAULTS["scope"], help="prefill_only | prefill_decode"),
    decode: int = typer.Option(64, help="tokens decoded per turn"),
    seed: int = typer.Option(EVICTION_DEFAULTS["seed"]),
) -> None:
    """Feed a 3-turn chat through one EvictableCache per method; compare with dense.

    KV held = K/V entries held x bytes per entry; KV alloc = the K/V buffers (spare capacity and ragged padding
    included); the peaks = the largest of each at any moment of the stream, a prefill before its eviction included.
    """
    from rich.console import Console
    from rich.table import Table

    import nexus
    from agent_runner.model_host import ModelSpec, load_host
    from nexus_eval.commands._progress import progress, say

    console = Console(stderr=True)
    say(console, f"demo: {len(nexus.METHODS)} methods on the {TITLE}, density {density}, {scope}")
    host = load_host(ModelSpec(name="tiny", weights_seed=seed))
    rows, ref = [], None
    with progress(console, len(nexus.METHODS), "methods", _describe) as advance:
        for method in nexus.METHODS:
            config = nexus.EvictionConfig(method=method, scope=scope, density=density, seed=seed)
            cache, final, seconds = _stream(host, nexus.EvictableCache(host.model.config, config), decode, seed)
            ref = final if method == "dense" else ref
            rows.append(
                (
                    method,
                    cache.logical_length,
                    sum(cache.occupancy(i) for i in range(cache.num_layers)) / cache.num_layers,
                    len(cache.events),
                    sum(e.seconds for e in cache.events),
                    cache.memory(),
                    float((final - ref).abs().max()),
                    seconds,
                )
            )
            advance(rows[-1])
    table = Table(title=f"{TITLE}, density {density}, {scope}")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col == "method" else "right")
    for m, logical, slots, ev, ev_s, memory, diff, secs in rows:
        table.add_row(
            *(m, str(logical), f"{slots:.0f}", str(ev), f"{ev_s:.3f}"),
            *(f"{n:,}" for n in dataclasses.astuple(memory)),
            *(f"{diff:.3f}", f"{secs:.2f}"),
        )
    Console().print(table)


def _stream(host: Any, cache: Any, decode: int, seed: int) -> tuple[Any, Any, float]:
    """:data:`TURNS` through ``cache``, each followed by ``decode`` teacher-forced random tokens (identical for
    every method); returns the cache, the last logits of every turn and the seconds it took."""
    import time

    import torch

    import nexus
    from agent_runner.model_host import render_chat

    kw = nexus.cache_kwarg(host.model)
    gen = torch.Generator().manual_seed(seed)
    last = []
    t0 = time.perf_counter()
    with torch.no_grad():
        for text in TURNS:
            ids = render_chat(host.tokenizer, [{"role": "user", "content": text}])
            logits = host.model(input_ids=torch.tensor([ids]), logits_to_keep=1, **{kw: cache}).logits[:, -1]
            for _ in range(decode):
                x = torch.randint(0, 1000, (1, 1), generator=gen)
                logits = host.model(input_ids=x, **{kw: cache}).logits[:, -1]
            last.append(logits)
    return cache, torch.cat(last), time.perf_counter() - t0


def _describe(row: tuple) -> str:
    """``snapkv: 41 slots/layer, 3 eviction events, max |dlogit| vs dense 0.052 (1.20 s)``."""
    method, _, slots, events, _, _, diff, seconds = row
    return (
        f"{method}: {slots:.0f} slots/layer, {events} eviction events, max |dlogit| vs dense {diff:.3f} "
        f"({seconds:.2f} s)"
    )


def register(app: typer.Typer) -> None:
    """Attach this area's verbs to the root app."""
    app.command("demo")(demo)
