"""The dashboard's read-only pages and downloads (route and DOM contract: docs/dashboard.md).

Each handler opens one read-only session, turns the rows into plain objects (``dashboard.queries``,
``dashboard.episode_queries``, ``dashboard.replay_queries``), closes the session, then renders; handlers are sync
functions, so FastAPI runs them in its thread pool.
"""

from __future__ import annotations

from dataclasses import replace

from fastapi import FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from dashboard import charts, copy_marks, episode_queries, list_queries, queries, replay_queries, streams
from dashboard.context import Context, NotFound, episode_id_of, job_id_of
from dashboard.render import render, svg

NOT_STORED = "Retention map not stored for this episode."
JOBS_LIMIT = 100  # jobs listed at most unless ?limit= says otherwise
EPISODES_PAGE = 200  # rows of a job's episode grid per page (?page=N): a 12,800-episode job is 64 pages


def notice_text(notice: str | None, n: int) -> str:
    """The banner after a write action (fixed wording; nothing from the URL is echoed but a count)."""
    if notice == "cancelled":
        return f"Job cancelled ({n} queued/running episode message(s) revoked); running ones stop at their next turn"
    if notice == "rerun":
        return f"{n} new attempt(s) enqueued." if n else "No failed episodes to rerun."
    if notice == "nothing-to-cancel":
        return "Nothing cancelled: no episode is queued, running or waiting for its grade: the job is unchanged."
    return ""


def _episode(ctx: Context, episode_id: str) -> episode_queries.EpisodeView:
    full_id = episode_id_of(ctx, episode_id)
    with ctx.read() as s:
        return episode_queries.episode(s, full_id)


def _episode_and_replays(
    ctx: Context, episode_id: str, replay_id: int | None
) -> tuple[episode_queries.EpisodeView, replay_queries.ReplaySection]:
    full_id = episode_id_of(ctx, episode_id)
    with ctx.read() as s:
        view = episode_queries.episode(s, full_id)
        try:
            return view, replay_queries.episode_replays(s, full_id, replay_id)
        except LookupError as exc:
            raise NotFound(str(exc)) from None


def replay_marks(
    view: episode_queries.EpisodeView, section: replay_queries.ReplaySection
) -> tuple[dict[int, copy_marks.Marked], list[copy_marks.CopyRow]]:
    """The chosen replay's spans on the page: per turn that has them its assistant text marked (``span-T-N`` ids),
    and a row per copy span for the "copies and their sources" table."""
    marks: dict[int, copy_marks.Marked] = {}
    anchors: dict[tuple[int, int], str] = {}
    for t in view.turns:
        spans = section.spans.get(t.index)
        if spans is None:
            continue
        prefix = f"span-{t.index}-"
        marks[t.index] = copy_marks.mark_text(t.text, spans, id_prefix=prefix)
        anchors.update({(t.index, n): f"{prefix}{n}" for n in marks[t.index].shown})
    return marks, copy_marks.copy_rows(section.spans, anchors)


def retention(view: episode_queries.EpisodeView) -> tuple[str, str, list[streams.TurnKept]]:
    """(chart svg with the turns' start marks, '', per turn what survived) for an episode with a readable
    retention map, else ('', why there is none, [])."""
    if view.retention is None:
        return "", NOT_STORED, []
    if isinstance(view.retention, dict) and view.retention.get("logical_length") == 0:
        return "", "The final cache was empty (logical length 0): nothing to draw.", []
    try:
        starts = list(zip((t.index for t in view.turns), streams.turn_starts(view.turns), strict=True))
        chart = svg(charts.retention_chart(view.retention, starts))
        return chart, "", streams.turn_retention(view.retention, view.turns)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        return "", f"The stored retention map cannot be read ({type(exc).__name__}: {exc}).", []


def list_query(
    spec: list_queries.ListSpec, sort: str | None, order: str | None, **filters: str | None
) -> list_queries.ListQuery:
    """The list's validated query, or the 400 page naming the bad parameter and what is allowed."""
    try:
        return spec.parse(sort, order, filters)
    except list_queries.BadListParameter as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None


def worker_window_s() -> float:
    """How far back the jobs page lists workers: 3 sweeps of ``$NEXUS_EVAL_SWEEP`` seconds (as `doctor` does;
    ``workers.faults.heartbeat.LIVENESS.sweep_s`` by default)."""
    from jobs.settings import LIVENESS, ServiceSettings

    try:
        return 3 * ServiceSettings.from_env().sweep_s
    except ValueError:  # a bad NEXUS_EVAL_* variable: the commands that use it say so
        return 3 * LIVENESS.sweep_s


def register(app: FastAPI, ctx: Context) -> None:
    @app.get("/", include_in_schema=False)
    def index() -> Response:
        return RedirectResponse("/jobs", status_code=302)

    @app.get("/jobs", response_class=HTMLResponse)
    def jobs(
        limit: int = Query(JOBS_LIMIT, ge=1, le=10_000),
        sort: str | None = None,
        order: str | None = None,
        status: str | None = None,
        q: str | None = None,
    ) -> str:
        query = list_query(list_queries.JOBS, sort, order, status=status, q=q)
        if limit != JOBS_LIMIT:
            query = replace(query, keep={"limit": str(limit)})
        window = worker_window_s()
        with ctx.read() as s:
            listing = queries.list_jobs(s, limit=limit, query=query)
            workers = queries.recent_workers(s, within_s=window)
        return render(
            "jobs.html", jobs=listing.rows, listing=listing, query=query, limit=limit, statuses=query.spec.choices,
            workers=workers, worker_window=f"{window:g}",
        )  # fmt: skip

    @app.get("/jobs/{job_id}", response_class=HTMLResponse)
    def job(
        job_id: str,
        notice: str | None = None,
        n: int = Query(0, ge=0),
        page: int = Query(1, ge=1),
        sort: str | None = None,
        order: str | None = None,
        status: str | None = None,
        method: str | None = None,
        scope: str | None = None,
        protocol: str | None = None,
        task: str | None = None,
    ) -> str:
        query = list_query(
            list_queries.EPISODES, sort, order, status=status, method=method, scope=scope, protocol=protocol, task=task
        )
        full_id = job_id_of(ctx, job_id)
        with ctx.read() as s:
            row = queries.job(s, full_id)
            try:  # one page of the grid, its counts and dropdowns: SQL over the job (db.episode_lists)
                listing = queries.job_episode_page(s, full_id, query, page=page, per_page=EPISODES_PAGE)
            except list_queries.BadListParameter as exc:
                raise HTTPException(status_code=400, detail=str(exc)) from None
            interactive = queries.job_interactive(s, full_id)
        return render(
            "job.html",
            job=row,
            listing=listing,
            episodes=listing.rows,
            query=query,
            options=listing.options,
            actions=list_queries.job_actions(row.counts, listing.result_statuses, row.apart),
            interactive=interactive,
            notice=notice_text(notice, n),
        )

    @app.get("/api/jobs/{job_id}/progress")
    def progress(job_id: str) -> JSONResponse:
        full_id = job_id_of(ctx, job_id)
        with ctx.read() as s:
            return JSONResponse(queries.progress(s, full_id), headers={"Cache-Control": "no-store"})

    @app.get("/episodes/{episode_id}", response_class=HTMLResponse)
    def episode(episode_id: str, replay: int | None = Query(None, ge=0)) -> str:
        view, replays = _episode_and_replays(ctx, episode_id, replay)
        chart, note, kept = retention(view)
        marks, copies = replay_marks(view, replays)
        return render(
            "episode.html",
            view=view,
            cache_charts=[(title, svg(chart_svg)) for title, chart_svg in charts.cache_charts(view.turns)],
            has_cache=charts.has_cache_telemetry(view.turns),
            retention_chart=chart,
            retention_note=note,
            retention_turns=kept,
            replays=replays,
            marks=marks,
            copies=copies,
            action_line=copy_marks.action_line(replays.chosen.action) if replays.chosen else "",
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
        with ctx.read() as s:
            a_stream, b_stream = (
                streams.generated_turn_streams(s, left.row.id),
                streams.generated_turn_streams(s, right.row.id),
            )
        stream = streams.stream_divergence(a_stream, b_stream)
        return render(
            "vs.html",
            a=left,
            b=right,
            mismatch=mismatch,
            diverge=episode_queries.divergence(left.turns, right.turns),
            stream=stream,
            cache_metrics=streams.CACHE_METRICS,
            cache_rows=streams.cache_rows(left.turns, right.turns),
            n_rows=max(len(left.turns), len(right.turns)),
        )
