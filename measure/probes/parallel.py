"""A probe run over several processes: samples dealt to processes, results yielded in the run's fixed order.

``measure(settings, spec, processes=...)`` is what ``nexus-eval probe run`` iterates: with one process the probes
run in this process (``run_probes``); with more, each measuring process loads the model and measures (probe, sample)
items as it takes them (``measure.processes.run_pool``), and the results come back in exactly the order
``run_probes`` yields them (probe by probe, sample by sample), so the stored run is the same whichever way it was
measured. A sample's cells never depend on another sample's: splitting by sample is exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from agent_runner.config import ModelSpec
from measure.probes.runner import ANSWER_ROWS, run_probes
from measure.probes.settings import ProbeResult, ProbeSettings
from measure.processes import Emit, run_pool


def _load(spec: ModelSpec):
    from agent_runner.model_host import load_host

    return load_host(spec)


def _loaded(host) -> tuple[str, str, str]:
    return "loaded", str(host.device), str(next(host.model.parameters()).dtype).removeprefix("torch.")


def _measure_item(settings: ProbeSettings, host, item: tuple[str, list[int]], emit: Emit) -> None:
    """One probe's samples `indices` of `settings` on this process's model; says where the model runs first."""
    if not getattr(host, "_announced", False):
        host._announced = True
        emit(_loaded(host))
    probe, indices = item
    for result in run_probes(host, settings.model_copy(update={"probes": (probe,)}), samples=indices):
        emit(result)


def _items(settings: ProbeSettings, processes: int) -> list[tuple[str, list[int]]]:
    """(probe, sample indices) shares: each probe's samples in `processes` runs of consecutive indices (their
    answers batch together, ``ANSWER_ROWS``), in the run's order."""
    items = []
    for probe in settings.probes:
        size = min(-(-settings.samples // processes), max(1, ANSWER_ROWS // len(settings.cells(probe))))
        items += [(probe, list(range(i, min(i + size, settings.samples)))) for i in range(0, settings.samples, size)]
    return items


def measure(
    settings: ProbeSettings, spec: ModelSpec, *, processes: int = 1, threads: int = 1, host=None
) -> Iterator[object]:
    """Yield ``("loaded", device, dtype)`` once the model is up, then every ``ProbeResult`` of `settings` in
    ``run_probes``'s order. `host`: a loaded model to use in this process (one process only)."""
    order = [(probe, index) for probe in settings.probes for index in range(settings.samples)]
    items = _items(settings, processes)
    if processes < 2 or len(items) < 2:
        host = host if host is not None else _load(spec)
        yield _loaded(host)
        yield from run_probes(host, settings)
        return
    per_sample = {probe: len(settings.cells(probe)) for probe in settings.probes}
    waiting: dict[tuple[str, int], list[ProbeResult]] = {}
    loaded = False
    pool = run_pool(partial(_load, spec), partial(_measure_item, settings), items, processes=processes, threads=threads)
    for value in pool:
        if not isinstance(value, ProbeResult):
            if not loaded:  # the first process up says where the model runs (they all load the same)
                loaded = True
                yield value
            continue
        waiting.setdefault((value.probe, value.sample), []).append(value)
        while order and len(waiting.get(order[0], ())) == per_sample[order[0][0]]:
            yield from waiting.pop(order.pop(0))
