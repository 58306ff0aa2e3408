"""Settings under which every method evicts on a stream no host labelled (random ids, no turn segments).

``observation_masking``'s paper rule evicts old observations only, and a random stream has none, so the matrices
over every method run its budgeted rule (on an unlabelled stream: recency); tests/nexus/test_turn_candidates.py
covers both rules on a labelled stream.
"""

from __future__ import annotations

from typing import Any

#: method -> the settings it evicts with on an unlabelled stream (the others: their defaults)
UNLABELLED: dict[str, dict[str, Any]] = {"observation_masking": {"rule": "budget"}}


def evicting(method: str) -> dict[str, Any]:
    return UNLABELLED.get(method, {})
