"""Observation masking: drop old tool observations, keep everything else (Lindenbauer et al., "The Complexity
Trap: Simple Observation Masking Is as Efficient as LLM Summarization for Agent Context Management", arXiv
2508.21433).

What SWE-agent-style scaffolds do instead of KV eviction: the latest M observations stay verbatim, older ones are
replaced by a placeholder; the system prompt, the task and every assistant turn stay. It needs to know where each
observation lies: the host's turn segments (``nexus.segments``, ``LayerView.segments``). Without segments nothing
is an observation: the paper's rule keeps everything, the budgeted one keeps the newest tokens.

Two rules (``rule``):
  latest  the paper's: keep everything but the observations older than the newest ``keep_latest`` (M = 10, the
          paper's). The budget is what that leaves (``content_budget``), not the density: held memory is whatever
          the rule keeps, so its rows are compared with held KV beside them. Nothing decoded is an observation, so
          decoding never triggers an event under either scope.
  budget  the same ranking held to the density budget every KV method gets (``nexus.budget``), so it has a row at
          every density at equal memory: observations are dropped oldest first, token by token (the oldest one
          still held keeps its newest tokens), and only when no observation is left do assistant turns (oldest
          first), then the system prompt and task go. The last W tokens are always kept, as by every method.
          Without segments (a host that says nothing) every position ranks alike: recency.

Protocols: under true eviction this policy is the method (whole old observations leave the one cache). Under full
context the paper's rule is applied to the text, as the paper does: the host renders the history with old
observations replaced by ``placeholder`` (``agent_runner.chat_segments.mask_observations``) and marks them
``masked``, so this policy finds nothing to evict; the budgeted rule evicts from the re-prefilled history like
every KV method under full context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from nexus.methods import register
from nexus.policies.base import LayerView, Policy, check_choice, check_int, keep_top, recent_slots
from nexus.segments import Segment, masked_observations

RULES = ("latest", "budget")

# rank of each kind (higher = kept longer); within a rank newer positions are kept first
_RANK = {"prompt": 3, "task": 3, "assistant": 2, "masked": 2, "other": 2, "observation": 1}
_RANK_DROPPED = 0  # an observation older than the newest keep_latest (rule latest)
_RANK_SCALE = float(2**22)  # above any logical position here; rank * scale + position stays exact in float32


@register("observation_masking", order=10)
@dataclass(frozen=True)
class ObservationMasking(Policy):
    """Keep the newest ``keep_latest`` observations and everything that is not an observation (rule ``latest``),
    or drop observations oldest first down to the density budget (rule ``budget``).

    rule:        "latest" (the paper's) or "budget" (equal memory with the KV methods).
    keep_latest: M, the observations kept verbatim under rule latest (the paper's 10).
    placeholder: the text an old observation becomes under full context (``{lines}``: its line count); the
                 wording of SWE-agent's ``LastNObservations``, which the paper uses.
    """

    name: ClassVar[str] = "observation_masking"
    needs_queries: ClassVar[bool] = False

    rule: str = "latest"
    keep_latest: int = 10
    placeholder: str = "Old environment output: ({lines} lines omitted)"

    def __post_init__(self) -> None:
        check_choice(self.name, "rule", self.rule, RULES)
        check_int(self.name, "keep_latest", self.keep_latest, 0)
        if not isinstance(self.placeholder, str) or not self.placeholder.strip():
            raise ValueError(f"{self.name}: placeholder must be a non-empty text, got {self.placeholder!r}")

    def content_budget(self, segments: tuple[Segment, ...], logical_length: int) -> int | None:
        if self.rule != "latest":
            return None
        dropped = sum(s.stop(logical_length) - s.start for s in masked_observations(segments, self.keep_latest))
        return max(logical_length - max(dropped, 0), 1)

    def ranks(self, segments: tuple[Segment, ...], length: int, device: torch.device) -> torch.Tensor:
        """[length] float32: each logical position's rank (kind, and for rule latest whether it is dropped)."""
        rank = torch.full((length,), float(_RANK["other"]), device=device)
        for seg in segments:
            rank[seg.start : seg.stop(length)] = _RANK[seg.kind]
        if self.rule == "latest":
            for seg in masked_observations(segments, self.keep_latest):
                rank[seg.start : seg.stop(length)] = _RANK_DROPPED
        return rank

    def select(self, view: LayerView) -> torch.Tensor:
        """[B, Hkv, K] ascending slot indices: the top ``budget`` slots by (rank, position); rule budget forces the
        last W."""
        positions = view.positions
        length = int(positions.max()) + 1 if positions.numel() else 0
        rank = self.ranks(view.segments, max(length, 1), positions.device)
        score = rank[positions.clamp_min(0)] * _RANK_SCALE + positions.float()
        # rule latest keeps by kind alone (its budget is everything but the dropped observations): a forced window
        # over a dropped observation's tail would push out as many older kept tokens instead
        window = view.window if self.rule == "budget" else 0
        forced = recent_slots(positions, min(window, view.budget))
        return keep_top(score, forced, view.valid, view.budget)
