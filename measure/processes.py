"""Measurement on every core: shares of one run in spawned processes, one torch thread each.

On a small shared CPU one torch thread per process is the fastest setting (``checked-here``: two threads in one
process are 3-6x slower than one), and the replay's and probes' forwards are compute-bound, so the way to use a
second core is a second process: each loads the model once, measures its share (samples of a probe run, source
episodes of a replay plan) and sends back what it measured, which the parent stores and shows as it arrives.
Measured, not assumed: ``bench/throughput.py`` times 1 and 2 processes side by side.

``run_pool(setup, work, items, processes=N)`` starts N processes; each runs ``setup()`` once (loads the model)
and then ``work(state, item, emit)`` for the next item it takes from a shared queue, so a process that finishes
early takes more. Every ``emit``-ed value is yielded here as it arrives. A process's exception stops the run: the
others are terminated and the error is raised here with that process's traceback. With one process the callers
run in their own (no spawn).

These are "measuring processes", never "workers": a worker is a Celery worker (``workers/``), which a measurement
never uses. The CLI's ``--processes`` (also spelled ``--workers``, its older name) sets how many.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

Emit = Callable[[Any], None]


class MeasuringProcessError(RuntimeError):
    """A measuring process failed. ``cause``: the process's exception line (``ValueError: ...``), the first cause a
    run records; the message adds the process's whole traceback."""

    def __init__(self, cause: str, details: str = ""):
        super().__init__(f"{cause}\n\nin a measuring process:\n{details}" if details else cause)
        self.cause = cause


#: most processes a measurement starts when not told (each holds its own copy of the model)
MAX_AUTO_PROCESSES = 4


def default_processes(device: str | None = None) -> int:
    """Processes a measurement uses when not told (``processes=0``): one per usable CPU core on a CPU (at most
    ``MAX_AUTO_PROCESSES``), one where the model runs on a GPU ("auto" or None: a GPU if torch sees one)."""
    import torch

    if (device or "auto").startswith("cuda") or ((device or "auto") == "auto" and torch.cuda.is_available()):
        return 1
    return max(1, min(len(os.sched_getaffinity(0)), MAX_AUTO_PROCESSES))


def resolve_processes(processes: int, device: str | None = None) -> int:
    """`processes` as asked (>= 1), or 0: ``default_processes(device)``."""
    if processes < 0:
        raise ValueError(f"processes must be >= 0 (0: one per CPU core), got {processes}")
    return processes or default_processes(device)


def _serve(
    setup: Callable[[], Any], work: Callable[[Any, Any, Emit], None], threads: int, tasks: Any, out: Any
) -> None:
    import torch

    torch.set_num_threads(threads)
    emit = lambda value: out.put(("value", value))  # noqa: E731
    try:
        state = setup()
        while (item := tasks.get()) is not None:
            work(state, item, emit)
        out.put(("done", None))
    except BaseException:  # noqa: BLE001 - sent to the parent, which raises it
        out.put(("error", traceback.format_exc()))


def run_pool(
    setup: Callable[[], Any],
    work: Callable[[Any, Any, Emit], None],
    items: Sequence[Any],
    *,
    processes: int,
    threads: int = 1,
    poll_s: float = 1.0,
) -> Iterator[Any]:
    """Run ``work(state, item, emit)`` for every item in `processes` spawned processes, each with ``threads`` torch
    threads and its own ``state = setup()`` (say, a loaded model); a process takes the next item when it is done
    with one, so the shares balance themselves. Yields each emitted value as it arrives. ``setup`` and ``work``
    must be module-level functions (or partials of them), items and values picklable. Needs ``processes`` >= 2: with
    one, the caller runs in its own process."""
    if processes < 2:
        raise ValueError("run_pool spreads items over two or more processes; with one, run in this process")
    ctx = mp.get_context("spawn")  # never fork a process that has loaded torch
    tasks, out = ctx.Queue(), ctx.Queue()
    for item in items:
        tasks.put(item)
    processes = min(processes, len(items))
    for _ in range(processes):
        tasks.put(None)  # one stop per process, after every item
    procs = [ctx.Process(target=_serve, args=(setup, work, threads, tasks, out), daemon=True) for _ in range(processes)]
    for p in procs:
        p.start()
    running = len(procs)
    try:
        while running:
            try:
                kind, value = out.get(timeout=poll_s)
            except queue.Empty:
                dead = [p for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
                if dead:
                    raise MeasuringProcessError(f"a measuring process died (exit code {dead[0].exitcode})") from None
                continue
            if kind == "value":
                yield value
            elif kind == "done":
                running -= 1
            else:
                lines = [line for line in value.strip().splitlines() if line.strip()]
                raise MeasuringProcessError(lines[-1] if lines else "a measuring process failed", value)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(timeout=10)
