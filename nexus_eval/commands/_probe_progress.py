"""Progress of ``nexus-eval probe run`` on stderr (the shared rule of :mod:`nexus_eval.commands._progress`): a
rich bar on a terminal, one plain line per stored result elsewhere, e.g.
``[12/80] needle snapkv prefill_only/single_prefill density 0.2 sample 3: wrong (0.41 s)``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from nexus_eval.commands._progress import progress as shared_progress


def describe(result: Any) -> str:
    """``needle snapkv prefill_only/single_prefill density 0.2 sample 3: wrong (0.41 s)``."""
    measured = []
    if result.correct is not None:
        measured.append("correct" if result.correct else "wrong")
    if result.nll is not None:
        measured.append(f"nll {result.nll:.3f}")
    where = f"{result.probe} {result.variant} {result.scope}/{result.protocol} density {result.density}"
    return f"{where} sample {result.sample}: {', '.join(measured) or 'done'} ({result.seconds:.2f} s)"


def progress(console: Any, total: int) -> AbstractContextManager[Callable[[Any], None]]:
    """Yields ``advance(result)``, to call once per stored result."""
    return shared_progress(console, total, "probes", describe)
