"""The numbers of a probe run: one cell per (probe, variant, scope, protocol, density), from its stored samples.

A cell reports

- ``n`` samples; for the probes that ask a question (needle, later_turn) how many answers held the fact, the
  accuracy and its Wilson 95% interval (``results.stats.wilson_interval``: honest at n = 10, where the normal
  approximation is not);
- the exact two-sided McNemar test against each baseline (``dense``: nothing evicted; ``snapkv``: the usual
  eviction baseline) in the same (probe, scope, protocol, density), paired by sample index: sample i is the
  same text in every cell of a run, so the test looks only at the samples where the two disagree (``b``: only
  this variant right, ``c``: only the baseline right). Exact (binomial) at every size: probe cells are small;
- for the probes that score tokens (nll, later_turn) the mean NLL per scored token and the **delta-NLL vs
  dense**, this variant's NLL minus dense's on the same sample, averaged over the paired samples with a seeded
  bootstrap 95% interval over samples (``results.stats.bootstrap_mean_ci``; none below 10 samples). Raw NLL says
  as much about the text as about the method; the paired difference removes the text;
- the means of the kept fraction, the KV memory figures (``nexus.memory``: ``kv_held_bytes`` and
  ``kv_allocated_bytes`` when the answer started, ``kv_peak_held_bytes`` and ``kv_peak_allocated_bytes`` over
  the sample) and the seconds per sample; a figure a sample did not store (a run from before it existed) is
  left out of its mean, and a cell none of whose samples has it gets ``None``, never 0.

A baseline that is not in the run (or has no sample in common with a cell) gives ``None``, never an error.
Pure functions over rows (``db.measure_models.ProbeResultRow``, ``ProbeResult`` or mappings with their fields); the
database entry point is :func:`load_probe_table`. ``results.probe_render`` turns a table into text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from agent_runner.config import SMOLLM2, TINY
from nexus.methods import DENSE
from results.stats import bootstrap_mean_ci, mcnemar_paired, wilson_interval

#: the variants every cell is tested against, when the run has them
BASELINES: tuple[str, ...] = (DENSE, "snapkv")
SMALL_N = 30
_KEY = ("probe", "variant", "scope", "protocol", "density")
#: the KV memory figures of a sample (nexus.memory), each averaged over the cell's samples that have it
KV_FIELDS = ("kv_held_bytes", "kv_allocated_bytes", "kv_peak_held_bytes", "kv_peak_allocated_bytes")
_VALUES = ("sample", "correct", "nll", "kept_fraction", *KV_FIELDS, "seconds")
CAPTION = (
    "accuracy: answers holding the fact, Wilson 95% interval · vs X: p of the exact two-sided McNemar test against "
    "variant X on the same samples (b:c = samples only this variant / only X got right, and the pairs), per cell, "
    "not corrected for the number of cells · ΔNLL: this variant's NLL minus dense's on the same sample (nats per "
    "scored token), bootstrap 95% interval over samples (from 10 samples) · kept: cache tokens / logical tokens · "
    "KV held / KV alloc: K/V entries held x bytes per entry / K/V buffers allocated (spare capacity and padding "
    "included) when the answer started · KV alloc peak: the largest allocated at any moment of the sample (a "
    "prefill before its eviction included) · s: seconds per sample"
)


@dataclass(frozen=True)
class PairedTest:
    """McNemar of one cell against a baseline cell over the samples both have."""

    baseline: str
    pairs: int
    b: int  # samples only this variant got right
    c: int  # samples only the baseline got right
    p_value: float


@dataclass
class ProbeCell:
    """One (probe, variant, scope, protocol, density). Fractions in [0, 1]; ``None`` where nothing was measured."""

    probe: str
    variant: str
    scope: str
    protocol: str
    density: float
    n: int = 0
    n_correct: int | None = None  # None: the probe asks no question (nll)
    accuracy: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    vs: dict[str, PairedTest | None] = field(default_factory=dict)  # baseline -> test (None: no baseline pairs)
    nll: float | None = None  # mean NLL per scored token, over samples
    delta_nll: float | None = None  # mean over paired samples of (this NLL - dense NLL)
    delta_ci_low: float | None = None
    delta_ci_high: float | None = None
    nll_pairs: int = 0
    kept_fraction: float | None = None
    kv_held_bytes: float | None = None  # the KV figures: means over the samples that stored them (KV_FIELDS)
    kv_allocated_bytes: float | None = None
    kv_peak_held_bytes: float | None = None
    kv_peak_allocated_bytes: float | None = None
    seconds: float | None = None

    @property
    def key(self) -> tuple[str, str, str, str, float]:
        return (self.probe, self.variant, self.scope, self.protocol, self.density)


@dataclass
class ProbeTable:
    """A probe run's cells with what they came from: ``run`` (id, status, model, dtype, times, error, counts),
    ``settings`` (the ``ProbeSettings`` dump) and ``provenance``.

    A run is measured in one dtype (its measuring processes all load the same model the same way; the first to load
    records it, ``provenance["dtype"]``), and every test and ΔNLL pairs cells of the same run only: two runs, and so
    two dtypes, are never pooled or paired."""

    run: dict[str, Any]
    settings: dict[str, Any]
    provenance: dict[str, Any]
    cells: list[ProbeCell]
    notes: list[str] = field(default_factory=list)

    @property
    def probes(self) -> list[str]:
        return list(dict.fromkeys(c.probe for c in self.cells))

    def cells_of(self, probe: str) -> list[ProbeCell]:
        return [c for c in self.cells if c.probe == probe]

    @property
    def dtype(self) -> str | None:
        """The dtype the run's model was measured in: what the loaded model reported (``provenance["dtype"]``), else
        what its settings asked for (``settings["dtype"]``, a run whose model never loaded); None: not recorded."""
        value = self.provenance.get("dtype") or self.settings.get("dtype")
        return str(value) if value else None

    @property
    def caption(self) -> str:
        """:data:`CAPTION` and what the cells were measured on (``· measured on smollm2-135m, float32``)."""
        return f"{CAPTION} · measured on {self.run.get('model')}, {self.dtype or 'dtype not recorded'}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "settings": self.settings,
            "provenance": self.provenance,
            "cells": [asdict(c) for c in self.cells],
            "notes": self.notes,
            "caption": self.caption,
        }


def _read(row: Any, name: str) -> Any:
    return row[name] if isinstance(row, Mapping) else getattr(row, name)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _order(values: Iterable[Any], canonical: Sequence[Any]) -> list[Any]:
    """The values present, in ``canonical``'s order, then any others sorted (a run stopped early, or rows that
    came without settings)."""
    present = set(values)
    return [v for v in canonical if v in present] + sorted(present - set(canonical))


def summarize(
    rows: Iterable[Any], settings: Mapping[str, Any] | None = None, *, confidence: float = 0.95, seed: int = 0
) -> list[ProbeCell]:
    """One cell per (probe, variant, scope, protocol, density) present in ``rows``, in the run's order
    (``settings``: probes, then density, protocol, scope, variant as ``ProbeSettings.cells`` orders them)."""
    groups: dict[tuple, dict[int, dict[str, Any]]] = {}
    for row in rows:
        key = tuple(_read(row, name) for name in _KEY)
        groups.setdefault(key, {})[_read(row, "sample")] = {name: _read(row, name) for name in _VALUES}
    order = settings or {}
    probes = _order((k[0] for k in groups), order.get("probes", ()))
    cells = []
    for probe in probes:
        keys = [k for k in groups if k[0] == probe]
        for density in _order((k[4] for k in keys), order.get("densities", ())):
            for protocol in _order((k[3] for k in keys), order.get("protocols", ())):
                for scope in _order((k[2] for k in keys), order.get("scopes", ())):
                    for variant in _order((k[1] for k in keys), order.get("variants", ())):
                        key = (probe, variant, scope, protocol, density)
                        if key in groups:
                            cells.append(summarize_cell(key, groups, confidence=confidence, seed=seed))
    return cells


def _paired(mine: dict[int, dict], baseline: dict[int, dict] | None, name: str) -> PairedTest | None:
    if baseline is None:
        return None
    pairs = [
        (s["correct"], baseline[i]["correct"])
        for i, s in mine.items()
        if i in baseline and s["correct"] is not None and baseline[i]["correct"] is not None
    ]
    if not pairs:
        return None
    test = mcnemar_paired(pairs, exact=True)
    return PairedTest(name, len(pairs), test.b, test.c, test.p_value)


def summarize_cell(
    key: tuple, groups: Mapping[tuple, dict[int, dict[str, Any]]], *, confidence: float = 0.95, seed: int = 0
) -> ProbeCell:
    """The cell ``key`` of ``groups`` (key -> sample -> values), tested against the baselines beside it."""
    probe, variant, scope, protocol, density = key
    mine = groups[key]
    cell = ProbeCell(probe, variant, scope, protocol, density, n=len(mine))
    answered = [s["correct"] for s in mine.values() if s["correct"] is not None]
    if answered:
        cell.n_correct = sum(answered)
        cell.accuracy = cell.n_correct / len(answered)
        cell.ci_low, cell.ci_high = wilson_interval(cell.n_correct, len(answered), confidence)
        for name in BASELINES:
            if name != variant:
                cell.vs[name] = _paired(mine, groups.get((probe, name, scope, protocol, density)), name)
    nll = [s["nll"] for s in mine.values() if s["nll"] is not None]
    cell.nll = _mean(nll)
    dense = groups.get((probe, DENSE, scope, protocol, density))
    if nll and dense is not None and variant != DENSE:
        deltas = [
            s["nll"] - dense[i]["nll"]
            for i, s in sorted(mine.items())
            if s["nll"] is not None and i in dense and dense[i]["nll"] is not None
        ]
        cell.nll_pairs = len(deltas)
        if deltas:
            cell.delta_nll = _mean(deltas)
            ci = bootstrap_mean_ci(deltas, confidence=confidence, seed=seed)  # None below MIN_BOOTSTRAP_UNITS samples
            cell.delta_ci_low, cell.delta_ci_high = ci if ci is not None else (None, None)
    cell.kept_fraction = _mean([s["kept_fraction"] for s in mine.values()])
    for name in KV_FIELDS:
        setattr(cell, name, _mean([s[name] for s in mine.values() if s[name] is not None]))
    cell.seconds = _mean([s["seconds"] for s in mine.values()])
    return cell


def notes_for(run: Mapping[str, Any], settings: Mapping[str, Any], cells: Sequence[ProbeCell]) -> list[str]:
    """What a reader must know before reading the numbers: a random model, small cells, an unfinished run, a
    missing baseline."""
    notes = []
    if settings.get("model") == TINY:
        notes.append("tiny model: random weights, the numbers measure nothing about quality (a pipeline check)")
    elif settings.get("model") == SMOLLM2:
        notes.append(
            f"{SMOLLM2} is a 135M-parameter model: dense itself misses some answers and quotes lines loosely, so "
            "read each method against dense's row (vs dense, ΔNLL), not against 100%"
        )
    probes = {c.probe for c in cells}
    if "needle" in probes:
        notes.append("needle: the question is in the prompt that gets compressed, so query-aware methods see it")
    if "later_turn" in probes:
        notes.append(
            "later_turn true_eviction: the cache was compressed before the question existed (an agent's later "
            "turn); full_context re-prefills the whole history with the question and compresses once"
        )
    if cells and min(c.n for c in cells) < SMALL_N:
        notes.append(f"n < {SMALL_N} per cell (fewest: {min(c.n for c in cells)}): intervals are wide")
    status = run.get("status")
    done_of = f"{run.get('n_results', 0)} of {run.get('n_planned', 0)} results"
    if status == "failed":
        cause = (run.get("error") or "no error recorded").splitlines()[0]
        notes.append(f"the run failed after {done_of} ({cause}): cells may hold fewer samples than asked")
    elif status in ("pending", "running"):
        notes.append(f"the run is still {status}: {done_of} so far")
    notes += unequal_memory_notes(cells)
    variants = {c.variant for c in cells}
    for name in BASELINES:
        if cells and name not in variants:
            what = "no McNemar test or ΔNLL" if name == DENSE else "no McNemar test"
            notes.append(f"no {name} variant in this run: {what} against it")
    return notes


#: how far a cell's kept fraction may sit from its density before a note names it (0.5 points: rounding to a token)
KEPT_TOLERANCE = 0.005


def unequal_memory_notes(cells: Sequence[ProbeCell]) -> list[str]:
    """A note naming the cells that hold more or less than their density: compare those at the kept fraction
    they hold, not at the density (a method's minimum budget above density x length, PyramidKV's floored
    per-layer schedule)."""
    off = [
        f"{c.variant} {c.scope} {c.density:g}: {100 * c.kept_fraction:.1f}%"
        for c in cells
        if c.variant != DENSE and c.kept_fraction is not None and abs(c.kept_fraction - c.density) > KEPT_TOLERANCE
    ]
    if not off:
        return []
    shown = ", ".join(dict.fromkeys(off))
    return [
        f"kept differs from the density in {len(set(off))} cell(s) ({shown}): compare them at the kept fraction they "
        "hold, not at the density (why, per method: docs/numbers.md, Memory)"
    ]


def probe_table(run: Any, rows: Iterable[Any], *, confidence: float = 0.95, seed: int = 0) -> ProbeTable:
    """The table of a stored run (a ``db.measure_models.ProbeRun``) and its result rows."""
    summary = {
        "id": run.id,
        "status": run.status,
        "model": run.model,
        "dtype": (run.provenance or {}).get("dtype") or (run.settings or {}).get("dtype"),  # None: not recorded
        "created_at": run.created_at.isoformat() if run.created_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "error": run.error,
        "n_planned": run.n_planned,
        "n_results": run.n_results,
    }
    settings = dict(run.settings or {})
    cells = summarize(rows, settings, confidence=confidence, seed=seed)
    return ProbeTable(summary, settings, dict(run.provenance or {}), cells, notes_for(summary, settings, cells))


def load_probe_table(session: Any, ident: str, *, confidence: float = 0.95, seed: int = 0) -> ProbeTable:
    """The database entry point: the table of probe run ``ident`` (id or unique prefix); ``LookupError``."""
    from db.probes import load_probe_run

    run, rows = load_probe_run(session, ident)
    return probe_table(run, rows, confidence=confidence, seed=seed)
