"""``nexus-eval report``: one job's (or one probe run's) results as a single self-contained HTML file.

The same templates, partials and charts as the server's compare page (``render(..., standalone=True)``),
with the stylesheet inlined and nothing that points anywhere: no link to the server, no script, no external
URL, charts as inline SVG. It opens from a mail attachment or a file share years later as it did today.
Per-method plots come on top of the compare table: the mean KV slots after eviction and the eviction events
per turn, averaged over the job's episodes, one panel per scope x protocol row. A probe run's report is its
run page (``dashboard.probe_pages``) made standalone: settings, provenance, the cell tables and a chart per probe.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session

from dashboard import charts, queries
from dashboard.readonly import check_schema, readonly_engine
from dashboard.render import render, svg
from db.models import utcnow
from db.probes import job_or_probe_run
from db.store import get_job
from workers.compare import compare_jobs
from workers.probe_stats import load_probe_table


def report_html(session: Session, job_id: str, *, include_interactive: bool = False) -> str:
    """The report of job ``job_id`` (id or unique prefix); ``LookupError`` when there is no such job.
    ``include_interactive``: count interactive attempts as results, marked (default: the agent's own only)."""
    full_id = get_job(session, job_id).id
    job = queries.job(session, full_id)
    table = compare_jobs(session, [full_id], include_interactive=include_interactive)
    curves = queries.method_curves(session, full_id, include_interactive=include_interactive)
    rows = [(r.scope, r.protocol) for r in table.rows]
    method_charts = [(title, svg(chart)) for title, chart in charts.method_charts(curves, rows, table.methods)]
    return render(
        "report.html",
        standalone=True,
        job=job,
        table=table,
        chart=svg(charts.compare_chart(table)),
        method_charts=method_charts,
        written=utcnow(),
    )


def probe_report_html(session: Session, run_id: str) -> str:
    """The report of probe run ``run_id`` (id or unique prefix); ``LookupError`` when there is no such run."""
    table = load_probe_table(session, run_id)
    charts_svg = {probe: svg(chart) for probe, chart in charts.probe_charts(table).items()}
    return render("probe_report.html", standalone=True, table=table, charts=charts_svg, written=utcnow())


def write_report(db_url: str, ident: str, output: Path, *, include_interactive: bool = False) -> Path:
    """Write the report of job or probe run ``ident`` (id or unique prefix) from the database at ``db_url``
    (read-only) to ``output``; ``LookupError`` when it names neither."""
    engine = readonly_engine(db_url)
    try:
        check_schema(engine)
        with Session(engine) as session:
            kind, full_id = job_or_probe_run(session, ident)
            if kind == "job":
                html = report_html(session, full_id, include_interactive=include_interactive)
            else:
                html = probe_report_html(session, full_id)
    finally:
        engine.dispose()
    output.write_text(html, encoding="utf-8")
    return output
