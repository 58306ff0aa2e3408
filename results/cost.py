"""What an episode cost, and a compare cell's summary of it: the other half of the eviction trade-off.

The KV figures are those of ``nexus.memory``: ``kv_held_bytes`` = valid (layer, row, KV head, position)
entries x (D_k + D_v) x element size; ``kv_allocated_bytes`` = the K/V buffers, spare capacity and ragged
padding included (what a GPU budget needs); ``kv_peak_*`` = the largest of each at any moment, a prefill's
pre-eviction state included.

Per episode (:class:`EpisodeCost`), from what the episode stored:

every value is an ``episodes`` column written at finish (``db.finishing.finish_episode``, from the stored turns by
``db.finishing.turn_totals``), so no read of a job loads its turns:

- ``n_turns``, ``generated_tokens``, ``wall_s``, ``kv_peak_held_bytes``, ``kv_peak_allocated_bytes``: sums /
  maxima over the stored turns, the peaks the largest of the turns' peaks, ``wall_s`` as the worker measured;
- ``mean_kv_held_bytes``: the mean over its turns of ``turns.kv_held_bytes`` (KV held after the turn);
- ``kept_fraction``: the mean over its turns of ``physical_after["mean"] / logical_length``: the cache slots a
  layer holds after the turn's eviction, on average over layers, as a share of the tokens the model has seen.
  Dense keeps 1.0; a method at density 0.2 keeps about 0.2 once the stream is longer than its window.
  (``db.finishing.turn_means``; ``tests/db/test_episode_summaries.py`` holds the stored values to a recount.)

A value a backend does not report (the oracle and openai backends have no visible cache), or a row stored
before the column existed, stays ``None`` and is left out of the means, never read as 0.

Per cell (:class:`CellCost`): the mean of each value over the cell's counted episodes (the same episodes as its
resolved rate) that have it (``mean_kv_held_bytes``: KV held after a turn; ``mean_kv_peak_held_bytes``,
``mean_kv_peak_allocated_bytes``: the episodes' peaks), ``max_kv_peak_allocated_bytes`` the largest allocated
peak of any of them (the memory the cell's worst episode needed), and ``episodes`` how many had any cost
stored. Pure functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class EpisodeCost:
    n_turns: int | None = None
    generated_tokens: int | None = None
    wall_s: float | None = None
    kv_peak_held_bytes: int | None = None
    kv_peak_allocated_bytes: int | None = None
    mean_kv_held_bytes: float | None = None
    kept_fraction: float | None = None


@dataclass
class CellCost:
    """Means over a cell's counted episodes (``None`` when none reported the value)."""

    episodes: int = 0  # counted episodes with a stored cost (at least a turn count)
    kept_fraction: float | None = None
    mean_kv_held_bytes: float | None = None
    mean_kv_peak_held_bytes: float | None = None
    mean_kv_peak_allocated_bytes: float | None = None
    max_kv_peak_allocated_bytes: int | None = None
    turns: float | None = None
    generated_tokens: float | None = None
    wall_s: float | None = None


#: CellCost's fields in the order the CSV and the tables show them
COST_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(CellCost))


def _mean(values: Iterable[float | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return sum(present) / len(present) if present else None


def summarize_cost(costs: Sequence[EpisodeCost | None]) -> CellCost:
    """The cell's cost from its counted episodes' costs (``None`` for an episode with nothing stored)."""
    known = [c for c in costs if c is not None and c.n_turns is not None]
    allocated = [c.kv_peak_allocated_bytes for c in known if c.kv_peak_allocated_bytes is not None]
    return CellCost(
        episodes=len(known),
        kept_fraction=_mean(c.kept_fraction for c in known),
        mean_kv_held_bytes=_mean(c.mean_kv_held_bytes for c in known),
        mean_kv_peak_held_bytes=_mean(c.kv_peak_held_bytes for c in known),
        mean_kv_peak_allocated_bytes=_mean(allocated),
        max_kv_peak_allocated_bytes=max(allocated) if allocated else None,
        turns=_mean(c.n_turns for c in known),
        generated_tokens=_mean(c.generated_tokens for c in known),
        wall_s=_mean(c.wall_s for c in known),
    )


def episode_cost(e: Any) -> EpisodeCost:
    """The cost of one ``db.models.Episode`` row (or any object with its summary columns): each field of
    :class:`EpisodeCost` is the episode column of the same name."""
    return EpisodeCost(**{f.name: getattr(e, f.name) for f in fields(EpisodeCost)})


def human_bytes(n: float | None) -> str:
    """``1.5 MiB``; ``-`` for ``None``."""
    if n is None:
        return "-"
    units, i = ("B", "KiB", "MiB", "GiB", "TiB"), 0
    while abs(n) >= 1024 and i < len(units) - 1:
        n, i = n / 1024, i + 1
    return f"{n:.0f} B" if i == 0 else f"{n:.1f} {units[i]}"
