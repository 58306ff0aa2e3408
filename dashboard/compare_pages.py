"""The compare pages and their downloads, for one job or a sweep of several (route contract: docs/dashboard.md).

- ``/jobs/{id}/compare`` (and ``.json``, ``.csv``): one job's table.
- ``/compare?jobs=A,B,C`` (and ``.json``, ``.csv``): several jobs' cells aligned by method, scope, protocol and
  density (``results.compare.compare_jobs``), what ``nexus-eval compare A B C`` prints; the jobs page's
  "compare selected" form sends here.

Every page shows the table, quality beside cost, the trade-off charts (:mod:`dashboard.tradeoff_charts`), the
per-task grid and the notes; with span-scored replays the action table and its split by distance
(``_compare.html``'s ``action_table``), and a line per stand-in job's demonstrations; a download is byte for byte
the CLI's ``--format json`` / ``csv``.
"""

from __future__ import annotations

from fastapi import FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, Response

from dashboard import charts, queries, tradeoff_charts
from dashboard.context import Context, job_id_of
from dashboard.render import render, svg
from results.compare import compare_jobs
from results.compare_csv import to_csv
from results.compare_render import render as render_table
from results.compare_table import CompareTable

#: ``?include_interactive=1`` on the compare page and its downloads counts interactive attempts (marked)
INCLUDE_INTERACTIVE = Query(False, description="count interactive attempts (steered or not) as results, marked *")
JOBS = Query(..., description="job ids (or unique prefixes), comma-separated or repeated; a later job wins a key")
MAX_JOBS = 50


def job_ids_of(ctx: Context, jobs: list[str]) -> list[str]:
    """The full ids of ``jobs=A,B,C`` (or ``jobs=A&jobs=B``, what the jobs page's checkboxes send): a 400 page for
    none or too many, a 404 page naming the first id that names no job (``NotFound``)."""
    idents = [j.strip() for value in jobs for j in value.split(",") if j.strip()]
    if not idents:
        raise HTTPException(400, "no job to compare: give ?jobs=ID1,ID2,... (ids or unique prefixes)")
    if len(idents) > MAX_JOBS:
        raise HTTPException(400, f"{len(idents)} jobs: at most {MAX_JOBS} in one comparison")
    return list(dict.fromkeys(job_id_of(ctx, j) for j in idents))


def _view(ctx: Context, job_ids: list[str], include_interactive: bool) -> queries.CompareView:
    with ctx.read() as s:
        return queries.compare_view(s, job_ids, include_interactive=include_interactive)


def _table(ctx: Context, job_ids: list[str], include_interactive: bool) -> CompareTable:
    """The table alone (the downloads need no per-episode links)."""
    with ctx.read() as s:
        return compare_jobs(s, job_ids, include_interactive=include_interactive)


def page_charts(table: CompareTable) -> dict[str, object]:
    """The compare page's and the report's charts, as inline SVG ('' for one that does not apply)."""
    return {
        "chart": svg(charts.compare_chart(table)),
        "cost_chart": svg(tradeoff_charts.quality_vs_cost_chart(table)),
        "density_chart": svg(tradeoff_charts.quality_vs_density_chart(table)),
        "nll_chart": svg(tradeoff_charts.delta_nll_vs_density_chart(table)),
    }


def _page(job_ids: list[str], view: queries.CompareView, include_interactive: bool, base: str, query: str) -> str:
    return render(
        "compare.html",
        job_ids=job_ids,
        view=view,
        include_interactive=include_interactive,
        base=base,
        query=query,
        **page_charts(view.table),
    )


def register(app: FastAPI, ctx: Context) -> None:
    @app.get("/jobs/{job_id}/compare", response_class=HTMLResponse)
    def compare(job_id: str, include_interactive: bool = INCLUDE_INTERACTIVE) -> str:
        ids = [job_id_of(ctx, job_id)]
        return _page(ids, _view(ctx, ids, include_interactive), include_interactive, f"/jobs/{ids[0]}/compare", "")

    @app.get("/jobs/{job_id}/compare.json")
    def compare_json(job_id: str, include_interactive: bool = INCLUDE_INTERACTIVE) -> Response:
        table = _table(ctx, [job_id_of(ctx, job_id)], include_interactive)
        return Response(render_table(table, "json"), media_type="application/json")

    @app.get("/jobs/{job_id}/compare.csv")
    def compare_csv(job_id: str, include_interactive: bool = INCLUDE_INTERACTIVE) -> Response:
        ids = [job_id_of(ctx, job_id)]
        return _csv(_table(ctx, ids, include_interactive), ids)

    @app.get("/compare", response_class=HTMLResponse)
    def compare_many(jobs: list[str] = JOBS, include_interactive: bool = INCLUDE_INTERACTIVE) -> str:
        ids = job_ids_of(ctx, jobs)
        query = "jobs=" + ",".join(ids)
        return _page(ids, _view(ctx, ids, include_interactive), include_interactive, "/compare", query)

    @app.get("/compare.json")
    def compare_many_json(jobs: list[str] = JOBS, include_interactive: bool = INCLUDE_INTERACTIVE) -> Response:
        table = _table(ctx, job_ids_of(ctx, jobs), include_interactive)
        return Response(render_table(table, "json"), media_type="application/json")

    @app.get("/compare.csv")
    def compare_many_csv(jobs: list[str] = JOBS, include_interactive: bool = INCLUDE_INTERACTIVE) -> Response:
        ids = job_ids_of(ctx, jobs)
        return _csv(_table(ctx, ids, include_interactive), ids)


def _csv(table: CompareTable, job_ids: list[str]) -> Response:
    disposition = {"Content-Disposition": f'attachment; filename="compare-{"-".join(job_ids)}.csv"'}
    return Response(to_csv(table), media_type="text/csv; charset=utf-8", headers=disposition)
