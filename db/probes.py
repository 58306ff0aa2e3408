"""Quality-probe runs and their results: the rows ``nexus-eval probe run`` writes and every reader reads.

A run is stored before its model loads and each result as it arrives, one short transaction each, so a crash
keeps everything that finished and the run says why it stopped::

    with db.session() as s:
        run_id = create_probe_run(s, settings=settings.model_dump(mode="json"), provenance=..., n_planned=n).id
    with db.session() as s:
        start_probe_run(s, run_id, device="cpu")          # the model is loaded
    for result in run_probes(host, settings):
        with db.session() as s:
            add_result(s, run_id, result.to_dict())
    with db.session() as s:
        finish_probe_run(s, run_id, "done")               # or "failed", error="ValueError: ..."

This package imports no model code: a result is the mapping ``ProbeResult.to_dict()`` gives, with exactly the
keys of :data:`RESULT_FIELDS` (the columns of ``probe_results``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from db.connection import begin_write
from db.job_rows import by_id_or_prefix
from db.measure_models import ProbeResultRow, ProbeRun, ProbeRunStatus
from db.models import utcnow
from db.process_identity import local_worker_is_dead

#: the fields of ``measure.probes.ProbeResult``, one column each (a test holds the two equal)
RESULT_FIELDS = (
    "probe", "variant", "scope", "protocol", "density", "sample", "source", "length", "depth", "correct", "nll",
    "scored_tokens", "answer", "expected", "kept_fraction",
    "kv_held_bytes", "kv_allocated_bytes", "kv_peak_held_bytes", "kv_peak_allocated_bytes", "seconds",
)  # fmt: skip
FINAL_STATUSES = frozenset({ProbeRunStatus.done.value, ProbeRunStatus.failed.value})


def create_probe_run(
    session: Session, *, settings: dict[str, Any], provenance: dict[str, Any], n_planned: int
) -> ProbeRun:
    """A new ``pending`` run of ``settings`` (a ``ProbeSettings.model_dump(mode="json")``)."""
    begin_write(session)
    run = ProbeRun(
        model=settings["model"], settings=settings, provenance=provenance, n_planned=n_planned, created_at=utcnow()
    )
    session.add(run)
    session.flush()
    return run


def start_probe_run(session: Session, run_id: str, **provenance: Any) -> None:
    """The model is loaded: the run is ``running``; ``provenance`` (what only the loaded model knows, such as
    its device) is added to the stored provenance."""
    begin_write(session)
    run = session.get(ProbeRun, run_id, with_for_update=True)
    if run is None:
        raise LookupError(f"no probe run with id {run_id!r}")
    run.status = ProbeRunStatus.running.value
    run.provenance = {**(run.provenance or {}), **provenance}  # a new dict: JSON columns do not see in-place edits


def add_result(session: Session, run_id: str, result: Mapping[str, Any]) -> ProbeResultRow:
    """Store one ``ProbeResult.to_dict()`` of run ``run_id`` and count it. A mapping with missing or unknown keys
    is refused (``ValueError``): the columns and the dataclass must never drift apart silently."""
    if set(result) != set(RESULT_FIELDS):
        missing, extra = sorted(set(RESULT_FIELDS) - set(result)), sorted(set(result) - set(RESULT_FIELDS))
        raise ValueError(f"a probe result needs exactly the fields of probe_results: missing {missing}, extra {extra}")
    begin_write(session)
    row = ProbeResultRow(run_id=run_id, **{name: result[name] for name in RESULT_FIELDS})
    session.add(row)
    # counted in SQL, so a reader sees the count of the rows committed with it, whoever else writes
    session.execute(update(ProbeRun).where(ProbeRun.id == run_id).values(n_results=ProbeRun.n_results + 1))
    session.flush()
    return row


def add_results(session: Session, run_id: str, results: Iterable[Mapping[str, Any]]) -> int:
    """:func:`add_result` for each of ``results`` in one transaction; returns how many were stored."""
    n = 0
    for result in results:
        add_result(session, run_id, result)
        n += 1
    return n


def finish_probe_run(session: Session, run_id: str, status: str, *, error: str | None = None) -> None:
    """End the run as ``done`` or ``failed``. The first error is the one kept: a later failure (say, while
    cleaning up after the first) never overwrites the cause."""
    if status not in FINAL_STATUSES:
        raise ValueError(f"a probe run finishes as {' or '.join(sorted(FINAL_STATUSES))}, not {status!r}")
    begin_write(session)
    run = session.get(ProbeRun, run_id, with_for_update=True)
    if run is None:
        raise LookupError(f"no probe run with id {run_id!r}")
    run.status = status
    run.finished_at = run.finished_at or utcnow()
    if error and not run.error:
        run.error = error


def orphaned_probe_runs(session: Session, *, is_dead: Callable[[str], bool] = local_worker_is_dead) -> list[ProbeRun]:
    """The pending or running runs whose process (``provenance["process"]``, ``db.process_identity``) ran in this pid
    namespace and is gone: killed before it could record why. Reads only (``probe show`` / ``list`` say
    so; ``probe run`` marks them, :func:`fail_orphaned_probe_runs`). Runs of other hosts, and runs stored before the
    process was recorded, are left out (nothing here can tell whether they still run)."""
    open_runs = session.execute(
        select(ProbeRun).where(ProbeRun.status.in_([ProbeRunStatus.pending.value, ProbeRunStatus.running.value]))
    ).scalars()
    return [r for r in open_runs if (r.provenance or {}).get("process") and is_dead(r.provenance["process"])]


def fail_orphaned_probe_runs(session: Session, *, is_dead: Callable[[str], bool] = local_worker_is_dead) -> list[str]:
    """Mark ``failed`` every run :func:`orphaned_probe_runs` finds; the error says so and how far it got. Returns
    their ids."""
    begin_write(session)
    orphans = orphaned_probe_runs(session, is_dead=is_dead)
    for run in orphans:
        finish_probe_run(
            session,
            run.id,
            ProbeRunStatus.failed.value,
            error=f"the process {run.provenance['process']} that ran it is gone (killed, or its machine restarted) "
            f"after {run.n_results} of {run.n_planned} results; found at a later start",
        )
    return [r.id for r in orphans]


def get_probe_run(session: Session, ident: str) -> ProbeRun:
    """The run with this id or unique id prefix; ``LookupError`` (saying which) otherwise."""
    return by_id_or_prefix(session, ProbeRun, ident)


def list_probe_runs(session: Session, *, limit: int = 20) -> list[ProbeRun]:
    """The newest ``limit`` runs, newest first."""
    return list(session.execute(select(ProbeRun).order_by(ProbeRun.created_at.desc()).limit(limit)).scalars())


def probe_results(session: Session, run_id: str) -> list[ProbeResultRow]:
    """Every stored result of run ``run_id`` in the order they were stored (the run's order)."""
    query = select(ProbeResultRow).where(ProbeResultRow.run_id == run_id).order_by(ProbeResultRow.id)
    return list(session.execute(query).scalars())


def load_probe_run(session: Session, ident: str) -> tuple[ProbeRun, list[ProbeResultRow]]:
    """The run (id or unique prefix) and its results."""
    run = get_probe_run(session, ident)
    return run, probe_results(session, run.id)


def job_or_probe_run(session: Session, ident: str) -> tuple[str, str]:
    """``("job", id)`` or ``("probe_run", id)`` for an id or unique prefix of either (an exact id first);
    ``LookupError`` when it names neither, or several rows of the two tables (more of the id tells them apart)."""
    from db.models import Job

    kinds = (("job", Job), ("probe_run", ProbeRun))
    for kind, model in kinds:
        if session.get(model, ident) is not None:
            return kind, ident
    found = [
        (kind, row_id)
        for kind, model in kinds
        for row_id in session.execute(
            select(model.id).where(model.id.startswith(ident, autoescape=True)).limit(2)
        ).scalars()
    ]
    if len(found) == 1:
        return found[0]
    if found:
        named = ", ".join(f"{kind.replace('_', ' ')} {row_id}" for kind, row_id in found)
        raise LookupError(f"id prefix {ident!r} is ambiguous ({named}, ...): give more of the id")
    # "no job with id 'x'" first: what the job verbs have always said
    raise LookupError(f"no job with id {ident!r}; no probe run with id {ident!r} either")
