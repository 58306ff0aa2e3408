"""An episode's replays for its page, read-only: every replay row of the episode (``db.measure_models.Replay``,
without its per-turn scores) in a stable order, and the one shown with its spans, as plain objects (see
:mod:`dashboard.queries` for the session rules). Which replay is shown unless the page asks for another:
:func:`default_replay`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.measure_models import Replay
from nexus.methods import DENSE, METHODS


@dataclass
class ReplayOption:
    """One replay row of an episode (``db.measure_models.Replay``), without its per-turn scores."""

    id: int
    method: str
    scope: str
    protocol: str
    density: float | None  # the eviction's kept fraction; None for dense
    model: str | None  # a text trajectory's replay: the model it was scored on
    dtype: str | None  # the dtype the measuring model ran in (None: not recorded)
    status: str
    error: str | None
    chunked: bool
    tokens: int | None
    nll_mean: float | None
    top1: float | None
    action: dict[str, Any] | None  # its ActionSummary dump (measure.action_scores); None before spans
    created_at: datetime

    @property
    def label(self) -> str:
        density = "" if self.density is None else f" · density {self.density:g}"
        model = "" if self.model is None else f" · {self.model}"
        return f"{self.method} · {self.scope} / {self.protocol}{density}{model} · {self.dtype or 'dtype not recorded'}"

    @property
    def spans(self) -> int | None:
        """How many spans it scored (its action summary's counts), None without an action summary."""
        counts = (self.action or {}).get("spans")
        if not isinstance(counts, dict):
            return None
        return sum(n for n in counts.values() if isinstance(n, int))


@dataclass
class ReplaySection:
    """An episode's replays (``options``, in :func:`replay_order`) and the one shown: ``chosen`` (None when the
    episode has no replay) with ``spans``: turn index -> the stored SpanScore dumps of the turns that have a list
    of them (empty for a token-stream replay or a row from before spans were kept)."""

    options: list[ReplayOption]
    chosen: ReplayOption | None = None
    spans: dict[int, list[Any]] = field(default_factory=dict)


def replay_order(o: ReplayOption) -> tuple:
    """Replays listed by model, dtype, scope, protocol, density (dense first), then the methods' canonical order."""
    rank = METHODS.index(o.method) if o.method in METHODS else len(METHODS)
    density = -1.0 if o.density is None else o.density
    return (o.model or "", o.dtype or "", o.scope, o.protocol, density, rank, o.method, o.id)


def default_replay(options: Sequence[ReplayOption]) -> ReplayOption | None:
    """The replay the page shows unless ``?replay=`` says otherwise: the first ok one of an evicting method (the
    first ok one when only dense's are, else the first)."""
    ok = [o for o in options if o.status == "ok"]
    return next((o for o in ok if o.method != DENSE), ok[0] if ok else (options[0] if options else None))


def episode_replays(session: Session, episode_id: str, replay_id: int | None = None) -> ReplaySection:
    """The replays of one episode (full id) and the chosen one's spans: ``replay_id`` (``LookupError`` when it is
    not a replay of this episode), else :func:`default_replay`. Only the chosen row's ``turns`` are read."""
    from dashboard.copy_marks import turn_spans

    columns = (
        Replay.id, Replay.method, Replay.scope, Replay.protocol, Replay.config, Replay.model, Replay.dtype,
        Replay.status, Replay.error, Replay.chunked, Replay.tokens, Replay.nll_mean, Replay.top1, Replay.action,
        Replay.created_at,
    )  # fmt: skip
    options = []
    for r in session.execute(select(*columns).where(Replay.episode_id == episode_id)):
        density = None if r.method == DENSE else (r.config if isinstance(r.config, dict) else {}).get("density")
        options.append(
            ReplayOption(
                id=r.id,
                method=r.method,
                scope=r.scope,
                protocol=r.protocol,
                density=float(density) if isinstance(density, int | float) else None,
                model=r.model,
                dtype=r.dtype,
                status=r.status,
                error=r.error,
                chunked=bool(r.chunked),
                tokens=r.tokens,
                nll_mean=r.nll_mean,
                top1=r.top1,
                action=r.action if isinstance(r.action, dict) else None,
                created_at=r.created_at,
            )
        )
    options.sort(key=replay_order)
    if replay_id is not None:
        chosen = next((o for o in options if o.id == replay_id), None)
        if chosen is None:
            raise LookupError(f"no replay {replay_id} of episode {episode_id!r}")
    else:
        chosen = default_replay(options)
    if chosen is None:
        return ReplaySection(options)
    turns = session.execute(select(Replay.turns).where(Replay.id == chosen.id)).scalar_one_or_none()
    return ReplaySection(options, chosen, turn_spans(turns))
