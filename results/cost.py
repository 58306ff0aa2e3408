"""What an episode cost, and a compare cell's summary of it: the other half of the eviction trade-off.

The KV figures are those of ``nexus.memory``: ``kv_held_bytes`` = valid (layer, row, KV head, position)
entries x (D_k + D_v) x element size; ``kv_allocated_bytes`` = the K/V buffers, spare capacity and ragged
padding included (what a GPU budget needs); ``kv_peak_*`` = the largest of each at any moment, a prefill's
pre-eviction state included.

Per episode (:class:`EpisodeCost`), from what the episode stored:

- ``n_turns``, ``generated_tokens``, ``wall_s``, ``kv_peak_held_bytes``, ``kv_peak_allocated_bytes``: the
  ``episodes`` columns as written at finish (``db.claims.finish_episode``: sums / maxima over the stored turns,
  the peaks the largest of the turns' peaks, ``wall_s`` as the worker measured);
- ``mean_kv_held_bytes``: the mean over its turns of ``turns.kv_held_bytes`` (KV held after the turn);
- ``kept_fraction``: the mean over its turns of ``physical_after["mean"] / logical_length``: the cache slots a
  layer holds after the turn's eviction, on average over layers, as a share of the tokens the model has seen.
  Dense keeps 1.0; a method at density 0.2 keeps about 0.2 once the stream is longer than its window.

A value a backend does not report (the oracle and openai backends have no visible cache), or a row stored
before the column existed, stays ``None`` and is left out of the means, never read as 0.

Per cell (:class:`CellCost`): the mean of each value over the cell's counted episodes (the same episodes as its
resolved rate) that have it (``mean_kv_held_bytes``: KV held after a turn; ``mean_kv_peak_held_bytes``,
``mean_kv_peak_allocated_bytes``: the episodes' peaks), ``max_kv_peak_allocated_bytes`` the largest allocated
peak of any of them (the memory the cell's worst episode needed), and ``episodes`` how many had any cost
stored. Pure functions, except :func:`episode_costs`, the database entry point.
"""

from __future__ import annotations

from collections import defaultdict
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


def turn_means(turns: Iterable[tuple[str, int | None, dict[str, Any] | None, int | None]]) -> dict[str, tuple]:
    """``(episode_id, kv_held_bytes, physical_after, logical_length)`` per turn -> per episode
    ``(mean KV held bytes, mean kept fraction)`` over the turns that report each."""
    held: dict[str, list[float]] = defaultdict(list)
    kept: dict[str, list[float]] = defaultdict(list)
    for episode_id, kv_held_bytes, physical_after, logical_length in turns:
        if kv_held_bytes is not None:
            held[episode_id].append(kv_held_bytes)
        slots = (physical_after or {}).get("mean")
        if slots is not None and logical_length:
            kept[episode_id].append(float(slots) / logical_length)
    return {e: (_mean(held.get(e, [])), _mean(kept.get(e, []))) for e in set(held) | set(kept)}


def episode_costs(session: Any, episodes: Sequence[Any]) -> dict[str, EpisodeCost]:
    """The cost of each ``db.models.Episode`` row, by episode id (one query over their turns)."""
    from sqlalchemy import select

    from db.models import Turn

    ids = [e.id for e in episodes]
    means: dict[str, tuple] = {}
    for start in range(0, len(ids), 500):  # bounded IN lists
        rows = session.execute(
            select(Turn.episode_id, Turn.kv_held_bytes, Turn.physical_after, Turn.logical_length).where(
                Turn.episode_id.in_(ids[start : start + 500])
            )
        )
        means.update(turn_means(rows))
    return {
        e.id: EpisodeCost(
            n_turns=e.n_turns,
            generated_tokens=e.generated_tokens,
            wall_s=e.wall_s,
            kv_peak_held_bytes=e.kv_peak_held_bytes,
            kv_peak_allocated_bytes=e.kv_peak_allocated_bytes,
            mean_kv_held_bytes=means.get(e.id, (None, None))[0],
            kept_fraction=means.get(e.id, (None, None))[1],
        )
        for e in episodes
    }


def human_bytes(n: float | None) -> str:
    """``1.5 MiB``; ``-`` for ``None``."""
    if n is None:
        return "-"
    units, i = ("B", "KiB", "MiB", "GiB", "TiB"), 0
    while abs(n) >= 1024 and i < len(units) - 1:
        n, i = n / 1024, i + 1
    return f"{n:.0f} B" if i == 0 else f"{n:.1f} {units[i]}"
