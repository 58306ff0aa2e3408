"""One replay's action summary as the sums the action table averages (:mod:`results.action_stats`).

A replay of a *text* trajectory (``nexus-eval replay JOB --model NAME``: an expert demonstration or any job whose
backend sees only text) scores each call span by span (``measure.action_scores``). The decisive spans are
**copies**: a value the agent repeats verbatim from an earlier observation (a ``str_replace`` ``old_str``, a path,
a test id); an evicting cache that dropped the source can break them outright. Per copy span the replay stores
the NLL and top-1 over its tokens **after its first** (the first token says *what* to copy, a choice the context
may not determine; the rest say whether the model can still read the source), whether it was greedy-exact, and
how far back its source was (``back``: tokens from the source's last token to the copy's first).

Each stored replay row becomes one :class:`ActionOutcome` holding its :class:`SpanSums`: token-weighted sums,
not means, so that a task's replays pool by adding (per task first, then over tasks, is ``results.action_stats``'
rule), and each located copy span falls into one of :data:`DISTANCE_BUCKETS`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jobs.variants import row_labels
from nexus.methods import DENSE
from results.replay_stats import ReplayRowKey

#: how far back a copy's source was, in tokens from the source's last token to the copy's first: (label, from,
#: below); ``None``: no upper bound. K = 1,000 tokens.
DISTANCE_BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("<1K", 0, 1000),
    ("1K-2K", 1000, 2000),
    ("2K-4K", 2000, 4000),
    (">=4K", 4000, None),
)


def distance_bucket(back: int) -> str:
    """The label of :data:`DISTANCE_BUCKETS` that ``back`` tokens fall in."""
    for label, low, high in DISTANCE_BUCKETS:
        if back >= low and (high is None or back < high):
            return label
    return DISTANCE_BUCKETS[0][0]  # a negative distance cannot happen; count it as the nearest


@dataclass
class SpanSums:
    """Sums of one replay's (or one task's pooled) copy and new spans: what a per-task value is made of."""

    copy_tokens: int = 0  # scored copy tokens (after each span's first)
    copy_top1_sum: float = 0.0  # sum over those tokens of top-1 (0/1)
    copy_nll_sum: float = 0.0
    copy_spans: int = 0
    copy_exact: float = 0.0  # greedy-exact copy spans
    held_spans: int = 0  # copy spans whose held share was read
    held_sum: float = 0.0
    new_tokens: int = 0
    new_top1_sum: float = 0.0
    new_nll_sum: float = 0.0
    unlocated: int = 0  # copy spans whose source was not in the context (no distance)
    held_bytes_sum: float = 0.0  # sum over replays of each one's mean KV bytes held after a turn
    held_bytes_replays: int = 0  # replays in that sum
    # bucket -> [scored tokens, top-1 sum, spans]
    by_distance: dict[str, list[float]] = field(default_factory=dict)

    def add(self, other: SpanSums) -> None:
        for name in (
            "copy_tokens",
            "copy_top1_sum",
            "copy_nll_sum",
            "copy_spans",
            "copy_exact",
            "held_spans",
            "held_sum",
            "new_tokens",
            "new_top1_sum",
            "new_nll_sum",
            "unlocated",
            "held_bytes_sum",
            "held_bytes_replays",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for bucket, values in other.by_distance.items():
            mine = self.by_distance.setdefault(bucket, [0.0, 0.0, 0.0])
            for i, v in enumerate(values):
                mine[i] += v

    @property
    def copy_top1(self) -> float | None:
        return self.copy_top1_sum / self.copy_tokens if self.copy_tokens else None

    @property
    def copy_nll(self) -> float | None:
        return self.copy_nll_sum / self.copy_tokens if self.copy_tokens else None


@dataclass(frozen=True)
class ActionOutcome(ReplayRowKey):
    """One stored replay row with an action summary, as far as the action statistics are concerned."""

    density: float | None  # None for dense
    model: str | None  # the model the text trajectory was rendered into and scored on
    dtype: str | None  # the dtype the measuring model ran in (None: not recorded)
    pool: SpanSums


def _get(mapping: Any, kind: str) -> Any:
    return (mapping or {}).get(kind) if isinstance(mapping, Mapping) else None


def pool_of(action: Mapping[str, Any], turns: Sequence[Mapping[str, Any]] | None) -> SpanSums:
    """One replay's sums from its ``action`` (``ActionSummary`` dump) and its ``turns`` (for each copy span's
    distance and held share; without them the held share is ``action.copy_held`` weighted by its copy spans)."""
    pool = SpanSums()
    held = [t["kv_held_bytes"] for t in turns or () if isinstance(t, Mapping) and t.get("kv_held_bytes") is not None]
    if held:  # the memory the copies were scored at: a method that keeps more may copy better for it alone
        pool.held_bytes_sum, pool.held_bytes_replays = sum(held) / len(held), 1
    tokens = int(_get(action.get("tokens"), "copy") or 0)
    top1, nll = _get(action.get("top1"), "copy"), _get(action.get("nll"), "copy")
    if tokens and top1 is not None and nll is not None:
        pool.copy_tokens, pool.copy_top1_sum, pool.copy_nll_sum = tokens, top1 * tokens, nll * tokens
    pool.copy_spans = int(_get(action.get("spans"), "copy") or 0)
    exact = _get(action.get("exact"), "copy")
    pool.copy_exact = (exact or 0.0) * pool.copy_spans
    new = int(_get(action.get("tokens"), "new") or 0)
    new_top1, new_nll = _get(action.get("top1"), "new"), _get(action.get("nll"), "new")
    if new and new_top1 is not None and new_nll is not None:
        pool.new_tokens, pool.new_top1_sum, pool.new_nll_sum = new, new_top1 * new, new_nll * new
    spans = [s for t in turns or () for s in (t.get("spans") or ()) if s.get("kind") == "copy"]
    if spans:
        for s in spans:
            if s.get("held_mean") is not None:
                pool.held_spans += 1
                pool.held_sum += s["held_mean"]
            if s.get("back") is None:
                pool.unlocated += 1
                continue
            slot = pool.by_distance.setdefault(distance_bucket(int(s["back"])), [0.0, 0.0, 0.0])
            slot[2] += 1
            if s.get("top1") is not None and s.get("tokens", 0) > 1:
                slot[0] += s["tokens"] - 1
                slot[1] += s["top1"] * (s["tokens"] - 1)
    elif action.get("copy_held") is not None and pool.copy_spans:
        pool.held_spans, pool.held_sum = pool.copy_spans, action["copy_held"] * pool.copy_spans
    return pool


def outcomes_from_rows(rows: Iterable[Any], *, job_configs: Mapping[str, Any] | None = None) -> list[ActionOutcome]:
    """``db.measure_models.Replay`` rows (oldest first) -> one outcome per (episode, label, scope, protocol, density,
    model, dtype) whose newest row is ``ok`` and carries an action summary. The label is the method, or for a row
    run under settings other than its job's own a variant's label (``jobs.variants.row_labels``; ``job_configs``:
    ``{job id: Job.config}``, default read through the rows' session), so a variant never counts in the default's
    cell. Rows of one key that differ only in settings the label does not name (the seed) are collapsed to the
    newest, so one episode never counts twice in a cell."""
    rows = list(rows)
    labels = row_labels(rows, job_configs)
    newest: dict[tuple[Any, ...], Any] = {}
    for r, label in zip(rows, labels, strict=True):
        density = None if r.method == DENSE else (r.config or {}).get("density")
        newest[(r.episode_id, label, r.scope, r.protocol, density, r.model, getattr(r, "dtype", None))] = r
    out = []
    for (episode, label, scope, protocol, density, model, dtype), r in newest.items():
        if r.status != "ok" or not r.action:
            continue
        pool = pool_of(r.action, r.turns)
        out.append(ActionOutcome(episode, r.task_id, label, scope, protocol, density, model, dtype, pool))
    return out
