"""The dashboard's read-only pages and downloads (route and DOM contract: docs/dashboard.md).

Each handler opens one read-only session, turns the rows into plain objects (``dashboard.queries``), closes
the session, then renders; handlers are sync functions, so FastAPI runs them in its thread pool.
"""

from __future__ import annotations

from fastapi import FastAPI, Query
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from dashboard import charts, queries
from dashboard.context import Context, episode_id_of, job_id_of
from dashboard.render import render, svg
from workers.compare_render import render as render_table
from workers.compare_render import to_csv

NOT_STORED = "Retention map not stored for this episode."


def notice_text(notice: str | None, n: int) -> str:
    """The banner after a write action (fixed wording; nothing from the URL is echoed but a count)."""
    if notice == "cancelled":
        return f"Job cancelled ({n} queued/running episode message(s) revoked); running ones stop at their next turn"
    if notice == "rerun":
        return f"{n} new attempt(s) enqueued." if n else "No failed episodes to rerun."
    return ""


def _episode(ctx: Context, episode_id: str) -> queries.EpisodeView:
    full_id = episode_id_of(ctx, episode_id)
    with ctx.read() as s:
        return queries.episode(s, full_id)


def _compare(ctx: Context, job_id: str, include_interactive: bool) -> tuple[str, queries.CompareView]:
    full_id = job_id_of(ctx, job_id)
    with ctx.read() as s:
        return full_id, queries.compare_view(s, full_id, include_interactive=include_interactive)


#: ``?include_interactive=1`` on the compare page and its downloads counts interactive attempts (marked)
INCLUDE_INTERACTIVE = Query(False, description="count interactive attempts (steered or not) as results, marked *")


def retention(view: queries.EpisodeView) -> tuple[str, str]:
    """(chart svg, '') for an episode with a readable retention map, else ('', why there is none)."""
    if view.retention is None:
        return "", NOT_STORED
    if isinstance(view.retention, dict) and view.retention.get("logical_length") == 0:
        return "", "The final cache was empty (logical length 0): nothing to draw."
    try:
        return svg(charts.retention_chart(view.retention)), ""
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        return "", f"The stored retention map cannot be read ({type(exc).__name__}: {exc})."


def worker_window_s() -> float:
    """How far back the jobs page lists workers: 3 sweeps of ``$NEXUS_EVAL_SWEEP`` seconds (as `doctor` does;
    ``workers.heartbeat.LIVENESS.sweep_s`` by default)."""
    from workers.app import ServiceSettings
    from workers.heartbeat import LIVENESS

    try:
        return 3 * ServiceSettings.from_env().sweep_s
    except ValueError:  # a bad NEXUS_EVAL_* variable: the commands that use it say so
        return 3 * LIVENESS.sweep_s


def register(app: FastAPI, ctx: Context) -> None:
    @app.get("/", include_in_schema=False)
    def index() -> Response:
        return RedirectResponse("/jobs", status_code=302)

    @app.get("/jobs", response_class=HTMLResponse)
    def jobs(limit: int = Query(100, ge=1, le=10_000)) -> str:
        window = worker_window_s()
        with ctx.read() as s:
            rows = queries.list_jobs(s, limit=limit)
            workers = queries.recent_workers(s, within_s=window)
        return render("jobs.html", jobs=rows, workers=workers, worker_window=f"{window:g}")

    @app.get("/jobs/{job_id}", response_class=HTMLResponse)
    def job(job_id: str, notice: str | None = None, n: int = Query(0, ge=0)) -> str:
        full_id = job_id_of(ctx, job_id)
        with ctx.read() as s:
            row = queries.job(s, full_id)
            episodes = queries.job_episodes(s, full_id)
            interactive = queries.job_interactive(s, full_id)
        return render("job.html", job=row, episodes=episodes, interactive=interactive, notice=notice_text(notice, n))

    @app.get("/api/jobs/{job_id}/progress")
    def progress(job_id: str) -> JSONResponse:
        full_id = job_id_of(ctx, job_id)
        with ctx.read() as s:
            return JSONResponse(queries.progress(s, full_id), headers={"Cache-Control": "no-store"})

    @app.get("/jobs/{job_id}/compare", response_class=HTMLResponse)
    def compare(job_id: str, include_interactive: bool = INCLUDE_INTERACTIVE) -> str:
        full_id, view = _compare(ctx, job_id, include_interactive)
        return render(
            "compare.html",
            job_id=full_id,
            view=view,
            chart=svg(charts.compare_chart(view.table)),
            include_interactive=include_interactive,
        )

    @app.get("/jobs/{job_id}/compare.json")
    def compare_json(job_id: str, include_interactive: bool = INCLUDE_INTERACTIVE) -> Response:
        _, view = _compare(ctx, job_id, include_interactive)
        return Response(render_table(view.table, "json"), media_type="application/json")

    @app.get("/jobs/{job_id}/compare.csv")
    def compare_csv(job_id: str, include_interactive: bool = INCLUDE_INTERACTIVE) -> Response:
        full_id, view = _compare(ctx, job_id, include_interactive)
        disposition = {"Content-Disposition": f'attachment; filename="compare-{full_id}.csv"'}
        return Response(to_csv(view.table), media_type="text/csv; charset=utf-8", headers=disposition)

    @app.get("/episodes/{episode_id}", response_class=HTMLResponse)
    def episode(episode_id: str) -> str:
        view = _episode(ctx, episode_id)
        chart, note = retention(view)
        return render(
            "episode.html",
            view=view,
            cache_charts=[(title, svg(chart_svg)) for title, chart_svg in charts.cache_charts(view.turns)],
            has_cache=charts.has_cache_telemetry(view.turns),
            retention_chart=chart,
            retention_note=note,
        )

    @app.get("/episodes/{a}/vs/{b}", response_class=HTMLResponse)
    def side_by_side(a: str, b: str) -> str:
        left, right = _episode(ctx, a), _episode(ctx, b)
        mismatch = ""
        if (left.row.task_id, left.row.seed) != (right.row.task_id, right.row.seed):
            mismatch = (
                f"These episodes are not the same task and seed ({left.row.task_id} seed {left.row.seed} vs "
                f"{right.row.task_id} seed {right.row.seed}): they are compared turn by turn all the same."
            )
        return render(
            "vs.html",
            a=left,
            b=right,
            mismatch=mismatch,
            diverge=queries.divergence(left.turns, right.turns),
            n_rows=max(len(left.turns), len(right.turns)),
        )
