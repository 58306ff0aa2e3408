"""A probe run from its stored row to its last stored result: what ``nexus-eval probe run`` does after the
settings are checked, without the terminal.

:func:`provenance` is what the run row records about where it ran; :func:`measure_and_store` loads the model (in
each of ``processes`` processes), runs the probes and stores each result as it arrives, so a crash keeps what
finished; the run ends ``done``, or ``failed`` with its first cause and :class:`ProbeRunFailed` is raised. The
caller shows progress through ``advance``.
"""

from __future__ import annotations

import platform
import traceback
from collections.abc import Callable
from typing import Any

from agent_runner.config import ModelSpec
from db.probes import add_result, finish_probe_run, start_probe_run
from db.process_identity import worker_identity
from db.provenance import git_revision, package_versions


class ProbeRunFailed(RuntimeError):
    """The run stopped on an exception; it is stored ``failed`` with ``cause`` (its first line) and the traceback."""

    def __init__(self, run_id: str, stored: int, n_planned: int, cause: str) -> None:
        super().__init__(f"probe run {run_id} failed after {stored} of {n_planned} results: {cause.splitlines()[0]}")
        self.run_id, self.stored, self.n_planned, self.cause = run_id, stored, n_planned, cause


def provenance(threads: int, processes: int) -> dict[str, Any]:
    """Where and with what the run measures. ValueError when the filler corpus is missing here."""
    from measure.probes import fingerprint

    return {
        "process": worker_identity(),  # a later start of this boot and pid namespace marks the run failed if gone
        "corpus": fingerprint(),
        "packages": package_versions(("nexus-eval", "torch", "transformers")),
        "git_revision": git_revision(),
        "python": platform.python_version(),
        "threads": threads,
        "workers": processes,  # the stored key keeps its first name: old and new runs read alike
    }


def measure_and_store(
    database: Any,
    run_id: str,
    settings: Any,
    n_planned: int,
    *,
    processes: int,
    threads: int,
    advance: Callable[[Any], None],
) -> int:
    """Measure every planned result and store it as it arrives; returns how many were stored. Any exception
    (Ctrl-C too) is recorded on the run first; an ``Exception`` is then raised as :class:`ProbeRunFailed`,
    anything else (KeyboardInterrupt, SystemExit) as itself."""
    from measure.probes.parallel import measure

    stored = 0
    try:
        for result in measure(
            settings, ModelSpec(name=settings.model, dtype=settings.dtype), processes=processes, threads=threads
        ):
            if isinstance(result, tuple):  # ("loaded", device, dtype): the model is up
                with database.session() as s:
                    start_probe_run(s, run_id, device=result[1], dtype=result[2])
                continue
            with database.session() as s:
                add_result(s, run_id, result.to_dict())
            stored += 1
            advance(result)
    except BaseException as exc:  # record why, whatever stopped it, then stop as it would have
        cause = "".join(traceback.format_exception_only(type(exc), exc)).strip() or type(exc).__name__
        cause = getattr(exc, "cause", None) or cause  # a measuring process's error: its own first line
        with database.session() as s:
            finish_probe_run(s, run_id, "failed", error=f"{cause}\n\n{traceback.format_exc()}")
        if not isinstance(exc, Exception):
            raise
        raise ProbeRunFailed(run_id, stored, n_planned, cause) from exc
    with database.session() as s:
        finish_probe_run(s, run_id, "done")
    return stored
