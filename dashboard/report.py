"""``nexus-eval report``: one job's, a sweep of jobs', or one probe run's results as a single self-contained HTML
file.

The same templates, partials and charts as the server's compare page (``render(..., standalone=True)``),
with the stylesheet inlined and nothing that points anywhere: no link to the server, no script, no external
URL, charts as inline SVG. It opens from a mail attachment or a file share years later as it did today, and
describes itself: every job's full settings (its stored ``JobSpec``), the package versions and git revision it
ran with. Beside the compare table (with the action table and the demonstrations lines when the jobs have
them, as on the compare page): quality against cost and, for a sweep, against density
(:mod:`dashboard.tradeoff_charts`); the mean KV slots after eviction and the eviction events per turn,
averaged over the episodes, one panel per scope x protocol row. A probe run's report is its
run page (``dashboard.probe_pages``) made standalone: settings, provenance, the cell tables and a chart per probe.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from dashboard import charts, queries
from dashboard.compare_pages import page_charts
from dashboard.readonly import check_schema, readonly_engine
from dashboard.render import render, svg
from db.job_rows import get_job
from db.models import utcnow
from db.probes import job_or_probe_run
from results.compare import compare_jobs
from results.probe_stats import load_probe_table


def report_html(session: Session, job_ids: str | Sequence[str], *, include_interactive: bool = False) -> str:
    """The report of one job or a sweep of several (ids or unique prefixes); ``LookupError`` when one names no
    job. ``include_interactive``: count interactive attempts as results, marked (default: the agent's own only)."""
    job_ids = [job_ids] if isinstance(job_ids, str) else job_ids
    stored = list({j.id: j for j in (get_job(session, ident) for ident in job_ids)}.values())
    ids = [j.id for j in stored]
    table = compare_jobs(session, ids, include_interactive=include_interactive)
    method_charts = []
    if len(ids) == 1:  # per-turn curves of one job (a sweep's would mix densities in one line)
        curves = queries.method_curves(session, ids[0], include_interactive=include_interactive)
        charted = charts.method_charts(curves, table.panels, table.methods)
        method_charts = [(title, svg(chart)) for title, chart in charted]
    return render(
        "report.html",
        standalone=True,
        jobs=[(queries.job(session, j.id), settings_of(j)) for j in stored],
        table=table,
        method_charts=method_charts,
        written=utcnow(),
        **page_charts(table),
    )


def settings_of(job: Any) -> dict[str, Any]:
    """What a report says a job ran with: its stored settings (the whole ``JobSpec``, as submitted and resolved),
    the package versions of the process that created it, and its git revision."""
    return {
        "config": job.config or {},
        "versions": job.package_versions or {},
        "git_revision": job.git_revision,
        "config_hash": job.config_hash,
    }


def probe_report_html(session: Session, run_id: str) -> str:
    """The report of probe run ``run_id`` (id or unique prefix); ``LookupError`` when there is no such run."""
    table = load_probe_table(session, run_id)
    charts_svg = {probe: svg(chart) for probe, chart in charts.probe_charts(table).items()}
    return render("probe_report.html", standalone=True, table=table, charts=charts_svg, written=utcnow())


def write_report(db_url: str, idents: str | Sequence[str], output: Path, *, include_interactive: bool = False) -> Path:
    """Write the report of the jobs ``idents``, or of the one probe run ``idents[0]`` (ids or unique prefixes),
    from the database at ``db_url`` (read-only) to ``output``; ``LookupError`` when one names nothing."""
    idents = [idents] if isinstance(idents, str) else list(idents)
    engine = readonly_engine(db_url)
    try:
        check_schema(engine, db_url)
        with Session(engine) as session:
            kind, full_id = job_or_probe_run(session, idents[0])
            if kind == "job":
                html = report_html(session, idents, include_interactive=include_interactive)
            elif len(idents) > 1:
                raise LookupError(f"{idents[0]} is a probe run: a report covers one probe run, or one or more jobs")
            else:
                html = probe_report_html(session, full_id)
    finally:
        engine.dispose()
    output.write_text(html, encoding="utf-8")
    return output
