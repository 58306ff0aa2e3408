"""Run a test's callables in threads at once (episodes sharing one decode engine) and hand back what they raised."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any


def run_together(target: Callable[..., Any], args: Sequence[tuple], *, timeout: float = 300) -> list[BaseException]:
    """``target(*a)`` for each ``a`` of ``args``, each in a thread, all started before any is joined (each join
    bounded by ``timeout``); the exceptions they raised, to assert on in the test's own thread."""
    errors: list[BaseException] = []

    def run(*a: Any) -> None:
        try:
            target(*a)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=a) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    return errors
