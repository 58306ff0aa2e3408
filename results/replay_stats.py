"""The numbers a counterfactual replay adds to ``compare`` and to ``nexus-eval replay``'s closing table.

A replay row scores one dense trajectory under one (method, scope, protocol): the mean NLL of the stored
completion tokens and the share that were still the model's argmax (top-1 agreement). Raw NLL says as much
about the task as about the method, so the headline is the **delta-NLL vs dense**, paired by source episode:
the method's replay NLL minus the dense replay NLL of the *same* episode under the *same* protocol, scored on the
*same* model (``Replay.model``, a text trajectory's) in the *same* dtype (``Replay.dtype``: float32 or bfloat16;
NULL: not recorded). A (model, dtype) pair is a **unit**: each unit gets cells of its own, and a number measured in
one dtype is never paired with one measured in another. Dense
replayed under true_eviction reproduces the episode's own logits, so it is the baseline each method's damage
is measured from (and dense vs itself is exactly 0).

Aggregation follows ``compare``'s Pass@1: episodes are averaged per task first (several seeds of a task are
not independent samples of the task population), then the mean over tasks gets a seeded bootstrap interval
over tasks (``results.stats.bootstrap_mean_ci``), only from ``MIN_BOOTSTRAP_UNITS`` tasks (fewer: no interval).
NLL, top-1 and delta-NLL are all over the same episodes: those paired with a dense replay (``n_pairs``); a
replay without its dense baseline is counted in ``unpaired`` and in no mean. Only replays of current sources count
(``db.replays.replay_sources``): a replay of an attempt that is no longer its key's result is left out, and a note
says how many. Pure functions over :class:`ReplayOutcome`, except :func:`current_replays`, the database read.

A row run under settings other than its job's own for the method (``replay --method-params``) is a **variant**: its
cells are apart from the method's default ones and named by its label, ``nexus[head_scores=per_head]``
(``jobs.variants``, the one place that label is computed). Only plain ``dense`` rows are the baseline.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent_runner.config import PROTOCOLS
from jobs.variants import order_labels, row_labels
from nexus.methods import DENSE, SCOPES
from results.stats import MIN_BOOTSTRAP_UNITS, bootstrap_mean_ci


@dataclass(frozen=True)
class ReplayRowKey:
    """Which stored replay row: its episode and task, and the configuration it replayed. The first fields of
    :class:`ReplayOutcome` and of ``results.action_outcomes.ActionOutcome``."""

    episode_id: str
    task_id: str
    method: str  # the method, or a variant's label (jobs.variants): nexus[head_scores=per_head]
    scope: str
    protocol: str


@dataclass(frozen=True)
class ReplayOutcome(ReplayRowKey):
    """One stored replay row, as far as the statistics are concerned."""

    status: str  # ok | failed | skipped
    nll_mean: float | None = None
    top1: float | None = None
    tokens: int | None = None
    density: float | None = None  # the replay's eviction density; None for dense
    model: str | None = None  # a text trajectory's replay: the model it was scored on (None: the source's own)
    dtype: str | None = None  # the dtype the measuring model ran in (None: not recorded)


@dataclass
class ReplayCell:
    """One (method, scope, protocol, density): ``episodes`` ok replays over ``tasks`` tasks; means over tasks."""

    method: str  # the method, or a variant's label (jobs.variants): a variant's rows are never a default's cell
    scope: str
    protocol: str
    density: float | None = None  # None for dense (it keeps every token)
    episodes: int = 0
    tasks: int = 0
    skipped: int = 0
    failed: int = 0
    nll_mean: float | None = None  # over the paired episodes (n_pairs), per task first
    top1: float | None = None  # over the paired episodes, per task first
    delta_nll: float | None = None  # mean over tasks of (method NLL - dense NLL), paired by source episode
    delta_ci_low: float | None = None  # None with too few tasks for an interval
    delta_ci_high: float | None = None
    n_pairs: int = 0  # episodes with both this replay and a dense replay under the same protocol
    pair_tasks: int = 0  # tasks among those pairs: the units of the interval
    unpaired: int = 0  # ok replays without a dense baseline: in no mean
    model: str | None = None  # the model a text trajectory was scored on (None: the source's own token stream)
    dtype: str | None = None  # the dtype its replays were measured in (None: not recorded)


def outcomes_from_rows(rows: Iterable[Any], *, job_configs: Mapping[str, Any] | None = None) -> list[ReplayOutcome]:
    """``db.measure_models.Replay`` rows (oldest first) -> one outcome per (episode, label, scope, protocol, density,
    model, dtype); the label is the method, or for a row run under settings other than its job's own a variant's label
    (``jobs.variants.row_labels``; ``job_configs``: ``{job id: Job.config}``, default read through the rows'
    session), so a variant is never counted in the default's cell.

    Rows of the same key that differ only in eviction settings the label does not name (the seed) are collapsed to
    the newest, so one episode is never counted twice in a cell."""
    rows = list(rows)
    labels = row_labels(rows, job_configs)
    newest: dict[tuple[str, str, str, str, float | None, str | None, str | None], ReplayOutcome] = {}
    for r, label in zip(rows, labels, strict=True):
        density = None if r.method == DENSE else (r.config or {}).get("density")
        model, dtype = getattr(r, "model", None), getattr(r, "dtype", None)
        newest[(r.episode_id, label, r.scope, r.protocol, density, model, dtype)] = ReplayOutcome(
            r.episode_id,
            r.task_id,
            label,
            r.scope,
            r.protocol,
            r.status,
            r.nll_mean,
            r.top1,
            r.tokens,
            density,
            model,
            dtype,
        )
    return list(newest.values())


#: what a replay was measured on: (model, dtype). model None: the source's own (a token-stream replay); dtype None:
#: not recorded (a row stored before it was). Every pairing key that holds the model holds the dtype beside it.
Unit = tuple[str | None, str | None]


def unit_order(units: Iterable[Unit]) -> list[Unit]:
    """The (model, dtype) pairs present, each once: the source's own model first, then the models by name; within
    a model, dtype not recorded first, then the dtypes by name."""
    return sorted(set(units), key=lambda u: (u[0] is not None, u[0] or "", u[1] is not None, u[1] or ""))


def dtype_text(dtype: str | None) -> str:
    return dtype or "dtype not recorded"


def unit_text(model: str | None, dtype: str | None) -> str:
    """``smollm2-135m, bfloat16``; ``own model, float32``; ``own model, dtype not recorded``."""
    return f"{model or 'own model'}, {dtype_text(dtype)}"


def units_text(units: Iterable[Unit]) -> str:
    """The (model, dtype) pairs a table's cells were measured on, for its caption: ``smollm2-135m, bfloat16``
    (several joined by ``; ``, in :func:`unit_order`)."""
    return "; ".join(unit_text(m, d) for m, d in unit_order(units))


def measured_on(units: Iterable[Unit]) -> str:
    """``measured on smollm2-135m, bfloat16``: :func:`units_text` as a caption's clause."""
    return "measured on " + units_text(units)


def _order(values: Iterable[str], canonical: Sequence[str]) -> list[str]:
    present = set(values)
    return [v for v in canonical if v in present] + sorted(present - set(canonical))


def _task_mean(pairs: Iterable[tuple[str, float]]) -> list[float]:
    """Per-task means of ``(task_id, value)`` pairs, in task order."""
    by_task: dict[str, list[float]] = defaultdict(list)
    for task, value in pairs:
        by_task[task].append(value)
    return [sum(v) / len(v) for _, v in sorted(by_task.items())]


#: a dense baseline's key: (episode, protocol, model, dtype, scope)
BaselineKey = tuple[str, str, str | None, str | None, str]


def _dense_baseline(outcomes: Sequence[ReplayOutcome]) -> dict[BaselineKey, float]:
    """Dense replay NLL by (episode, protocol, model, dtype, scope); scope ``""`` holds the first scope's value, the
    fallback for a method replayed under a scope dense was not (dense evicts nothing: its scope is moot). A replay
    scored on one model, or in one dtype, is never paired with a dense replay scored on another."""
    baseline: dict[BaselineKey, float] = {}
    rank = {s: i for i, s in enumerate(SCOPES)}
    dense = [o for o in outcomes if o.method == DENSE and o.status == "ok" and o.nll_mean is not None]
    for o in sorted(dense, key=lambda o: rank.get(o.scope, len(rank))):
        baseline[(o.episode_id, o.protocol, o.model, o.dtype, o.scope)] = o.nll_mean  # type: ignore[assignment]
        baseline.setdefault((o.episode_id, o.protocol, o.model, o.dtype, ""), o.nll_mean)  # type: ignore[arg-type]
    return baseline


def summarize_replays(
    outcomes: Iterable[ReplayOutcome], *, confidence: float = 0.95, seed: int = 0
) -> list[ReplayCell]:
    """One cell per ((model, dtype), scope, protocol, density, method) present, ordered like ``compare``'s rows and
    columns (dense, whose density is ``None``, first in its scope x protocol); the source's own token stream (model
    ``None``) first, then each model a text trajectory was scored on, each in its dtypes (:func:`unit_order`)."""
    every = list(outcomes)
    baseline = _dense_baseline(every)
    cells = []
    for model, dtype in unit_order((o.model, o.dtype) for o in every):
        rows = [o for o in every if (o.model, o.dtype) == (model, dtype)]
        for scope in _order((o.scope for o in rows), SCOPES):
            for protocol in _order((o.protocol for o in rows if o.scope == scope), PROTOCOLS):
                here = [o for o in rows if (o.scope, o.protocol) == (scope, protocol)]
                densities = sorted({o.density for o in here}, key=lambda d: -1.0 if d is None else d)
                for density in densities:
                    at = [o for o in here if o.density == density]
                    for method in order_labels(o.method for o in at):  # each method's variants after it
                        mine = [o for o in at if o.method == method]
                        cell = summarize_cell(
                            method,
                            scope,
                            protocol,
                            mine,
                            baseline,
                            confidence=confidence,
                            seed=seed,
                            model=model,
                            dtype=dtype,
                        )
                        cell.density = density
                        cells.append(cell)
    return cells


def summarize_cell(
    method: str,
    scope: str,
    protocol: str,
    outcomes: Sequence[ReplayOutcome],
    baseline: dict[BaselineKey, float],
    *,
    confidence: float = 0.95,
    seed: int = 0,
    model: str | None = None,
    dtype: str | None = None,
) -> ReplayCell:
    """Statistics of one method's replays in one scope x protocol, scored on ``model`` in ``dtype``; ``baseline``
    from :func:`_dense_baseline` (only a dense replay of the same episode, protocol, model and dtype pairs)."""
    cell = ReplayCell(method, scope, protocol, model=model, dtype=dtype)
    ok = [o for o in outcomes if o.status == "ok" and o.nll_mean is not None]
    cell.skipped = sum(o.status == "skipped" for o in outcomes)
    cell.failed = sum(o.status == "failed" for o in outcomes)
    cell.episodes, cell.tasks = len(ok), len({o.task_id for o in ok})
    paired = []  # (outcome, dense NLL of the same episode and protocol)
    for o in ok:
        dense = baseline.get(
            (o.episode_id, protocol, model, dtype, scope), baseline.get((o.episode_id, protocol, model, dtype, ""))
        )
        if dense is not None:
            paired.append((o, dense))
    cell.n_pairs, cell.unpaired = len(paired), len(ok) - len(paired)
    if not paired:
        return cell
    cell.pair_tasks = len({o.task_id for o, _ in paired})
    nll = _task_mean((o.task_id, o.nll_mean) for o, _ in paired)  # type: ignore[misc]
    cell.nll_mean = sum(nll) / len(nll)
    top1 = _task_mean((o.task_id, o.top1) for o, _ in paired if o.top1 is not None)
    cell.top1 = sum(top1) / len(top1) if top1 else None
    per_task = _task_mean((o.task_id, o.nll_mean - dense) for o, dense in paired)  # type: ignore[operator]
    cell.delta_nll = sum(per_task) / len(per_task)
    ci = bootstrap_mean_ci(per_task, confidence=confidence, seed=seed)
    cell.delta_ci_low, cell.delta_ci_high = ci if ci is not None else (None, None)
    return cell


def current_replays(session: Any, job_ids: Sequence[str], results: Iterable[Any]) -> tuple[list[Any], int]:
    """(the jobs' replay rows of current sources, how many rows were left out as replays of superseded attempts).
    ``results``: the jobs' result attempts (``db.store.result_attempts``, the agent's own), which the caller has
    loaded already; the sources are those of them ``db.replays.is_replay_source`` admits."""
    from db.replays import is_replay_source, replays_for_jobs

    sources = {e.id for e in results if is_replay_source(e, DENSE)}
    rows = replays_for_jobs(session, job_ids)
    current = [r for r in rows if r.episode_id in sources]
    return current, len(rows) - len(current)


#: what the replay columns mean (printed under every replay table; :func:`replay_caption` adds what they were
#: measured on)
REPLAY_CAPTION = (
    "dense trajectories teacher-forced through each method's cache; NLL (nats per completion token), top-1 and "
    "ΔNLL = method minus dense on the same episode, protocol, model and dtype, all over the same pairs, averaged per "
    f"task; 95% bootstrap interval over tasks from {MIN_BOOTSTRAP_UNITS} tasks (fewer: none)"
)


def replay_caption(cells: Sequence[ReplayCell]) -> str:
    """:data:`REPLAY_CAPTION` with the model(s) and dtype(s) the ``cells`` were measured on (:func:`measured_on`)."""
    units = [(c.model, c.dtype) for c in cells]
    return f"{REPLAY_CAPTION}; {measured_on(units)}" if units else REPLAY_CAPTION


def replay_notes(cells: Sequence[ReplayCell], *, superseded: int = 0) -> list[str]:
    """How many stored replays could not be scored, and how many were left out as replays of superseded attempts
    (``superseded``, from :func:`current_replays`); none: no note."""
    notes = []
    skipped, failed = sum(c.skipped for c in cells), sum(c.failed for c in cells)
    if skipped or failed:
        notes.append(
            f"replay: {skipped} skipped (a stream not replayable that way), {failed} failed; their rows say why"
        )
    if superseded:
        notes.append(
            f"replay: {superseded} row(s) replay an attempt that is no longer its key's result (or not a sample) and "
            "are left out"
        )
    return notes
