"""The probe pages: the list of probe runs and one run's cells, charts and downloads (docs/dashboard.md).

A run's page shows exactly ``nexus-eval probe show RUN``: the same ``results.probe_stats`` table, the same
columns (``results.probe_render.layout``) and, on every row, the JSON form's numbers as data-* attributes.
Like ``dashboard.pages``, each handler reads in one read-only session, keeps plain objects, then renders.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from fastapi import FastAPI, Query
from fastapi.responses import HTMLResponse, Response
from sqlalchemy.orm import Session

from dashboard import charts
from dashboard.context import Context, probe_run_id_of
from dashboard.render import render, svg
from db.probes import list_probe_runs
from results.probe_render import render as render_table
from results.probe_render import to_csv
from results.probe_stats import ProbeTable, load_probe_table


@dataclass
class ProbeRunRow:
    id: str
    created_at: datetime
    status: str
    model: str
    probes: list[str]
    variants: list[str]
    n_results: int
    n_planned: int

    @property
    def live(self) -> bool:
        return self.status in ("pending", "running")


def list_runs(session: Session, *, limit: int = 100) -> list[ProbeRunRow]:
    """The newest ``limit`` probe runs, newest first."""
    return [
        ProbeRunRow(
            r.id,
            r.created_at,
            r.status,
            r.model,
            list((r.settings or {}).get("probes", [])),
            list((r.settings or {}).get("variants", [])),
            r.n_results,
            r.n_planned,
        )  # fmt: skip
        for r in list_probe_runs(session, limit=limit)
    ]


def _table(ctx: Context, run_id: str) -> ProbeTable:
    full_id = probe_run_id_of(ctx, run_id)
    with ctx.read() as s:
        return load_probe_table(s, full_id)


def register(app: FastAPI, ctx: Context) -> None:
    @app.get("/probes", response_class=HTMLResponse)
    def probes(limit: int = Query(100, ge=1, le=10_000)) -> str:
        with ctx.read() as s:
            rows = list_runs(s, limit=limit)
        return render("probes.html", runs=rows)

    @app.get("/probes/{run_id}", response_class=HTMLResponse)
    def probe_run(run_id: str) -> str:
        table = _table(ctx, run_id)
        drawn = {probe: svg(chart) for probe, chart in charts.probe_charts(table).items()}
        return render("probe.html", table=table, charts=drawn)

    @app.get("/probes/{run_id}/cells.json")
    def probe_json(run_id: str) -> Response:
        return Response(render_table(_table(ctx, run_id), "json"), media_type="application/json")

    @app.get("/probes/{run_id}/cells.csv")
    def probe_csv(run_id: str) -> Response:
        table = _table(ctx, run_id)
        disposition = {"Content-Disposition": f'attachment; filename="probe-{table.run["id"]}.csv"'}
        return Response(to_csv(table), media_type="text/csv; charset=utf-8", headers=disposition)
