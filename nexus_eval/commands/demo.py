"""`nexus-eval demo`: every eviction method on the tiny Qwen3, one multi-turn stream, in a table (CPU, seconds)."""

from __future__ import annotations

import typer


def demo(
    density: float = typer.Option(0.2, help="kept fraction of the logical length"),
    scope: str = typer.Option("prefill_decode", help="prefill_only | prefill_decode"),
    decode: int = typer.Option(64, help="tokens decoded per turn"),
    seed: int = typer.Option(0),
) -> None:
    """Feed a 3-turn chat through one EvictableCache per method; compare with dense."""
    import time

    import torch
    from rich.console import Console
    from rich.table import Table

    import nexus
    from agent_runner.model_host import ModelSpec, load_host, render_chat

    host = load_host(ModelSpec(name="tiny", weights_seed=seed))
    tok, model = host.tokenizer, host.model
    turns = [
        "Here is a stack trace from our CSV parser; the last field of each row is lost. " * 12,
        "Exit code: 0\nExecution output of [execute_bash]:\n" + "tests/test_csv.py::test_row PASSED\n" * 20,
        "Exit code: 1\n" + "AssertionError: expected 3 fields, got 2\n" * 15,
    ]
    kw = nexus.cache_kwarg(model)
    rows, ref = [], None
    for method in nexus.METHODS:
        cache = nexus.EvictableCache(
            model.config, nexus.EvictionConfig(method=method, scope=scope, density=density, seed=seed)
        )
        gen = torch.Generator().manual_seed(seed)
        last = []
        t0 = time.perf_counter()
        with torch.no_grad():
            for text in turns:
                ids = render_chat(tok, [{"role": "user", "content": text}])
                logits = model(input_ids=torch.tensor([ids]), logits_to_keep=1, **{kw: cache}).logits[:, -1]
                for _ in range(decode):  # teacher-forced random continuation: identical for every method
                    x = torch.randint(0, 1000, (1, 1), generator=gen)
                    logits = model(input_ids=x, **{kw: cache}).logits[:, -1]
                last.append(logits)
        seconds = time.perf_counter() - t0
        final = torch.cat(last)
        ref = final if method == "dense" else ref
        rows.append(
            (
                method,
                cache.logical_length,
                sum(cache.occupancy(i) for i in range(cache.num_layers)) / cache.num_layers,
                len(cache.events),
                sum(e.seconds for e in cache.events),
                cache.nbytes(),
                float((final - ref).abs().max()),
                seconds,
            )
        )
    table = Table(title=f"tiny Qwen3 (random weights, real tokenizer), density {density}, {scope}")
    for col in (
        "method",
        "logical",
        "held/layer",
        "events",
        "evict s",
        "cache bytes",
        "max |dlogit| vs dense",
        "total s",
    ):
        table.add_column(col, justify="left" if col == "method" else "right")
    for m, logical, held, ev, ev_s, nbytes, diff, secs in rows:
        table.add_row(
            m, str(logical), f"{held:.0f}", str(ev), f"{ev_s:.3f}", f"{nbytes:,}", f"{diff:.3f}", f"{secs:.2f}"
        )
    Console().print(table)


def register(app: typer.Typer) -> None:
    """Attach this area's verbs to the root app."""
    app.command("demo")(demo)
