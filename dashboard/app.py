"""The dashboard's FastAPI app: the factory, the token guard, error pages, and the two write actions.

Pages (``dashboard.pages``) read through a read-only engine (``dashboard.readonly``); only cancel and
rerun-failed open the normal read-write database, and they do exactly what ``nexus-eval cancel JOB`` and
``nexus-eval rerun JOB --failed`` do (``jobs.control.cancel``, ``jobs.control.rerun``).
Errors are HTML pages (JSON under ``/api/``) that never show a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl, urlencode

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from dashboard import compare_pages, pages, probe_pages
from dashboard.auth import COOKIE, LOOPBACK_HOSTS, MIN_TOKEN_LENGTH, Access, HostCheck
from dashboard.context import Context, NotFound, job_id_of
from dashboard.readonly import open_readonly
from dashboard.render import STATIC, render

log = logging.getLogger(__name__)
CSP = (
    # everything is served from here: no inline or foreign script, no eval (live.js never evaluates text).
    # Charts' <image> tiles are data: URIs and SVG charts carry inline styles
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; script-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # never to another site; same-origin keeps Origin on forms
}
TITLES = {400: "Bad request", 401: "Token needed", 403: "Forbidden", 404: "Not found", 405: "Method not allowed"}


def error_page(request: Request, status: int, detail: str) -> Response:
    """The error answer: JSON ``{"error"}`` under /api/, else the error page; never a traceback."""
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": detail}, status_code=status, headers=headers)
    title = TITLES.get(status, "Internal error" if status >= 500 else "Error")
    body = render("error.html", inline_style=True, title=title, detail=detail)
    return HTMLResponse(body, status_code=status, headers=headers)


def _default_celery(db_url: str) -> Callable[[], Any]:
    """The Celery app the CLI's ``cancel``/``rerun`` would use: the environment's settings, this database."""

    def make() -> Any:
        from jobs.queue import get_app
        from jobs.settings import ServiceSettings

        return get_app(ServiceSettings.from_env(db_url=db_url))

    return make


def create_app(
    db_url: str,
    *,
    token: str | None,
    public: bool,
    allowed_hosts: Iterable[str] = LOOPBACK_HOSTS,
    celery_app: Callable[[], Any] | None = None,
) -> FastAPI:
    """The dashboard over the results database at ``db_url``.

    ``public``: the server listens beyond loopback, so every request needs ``token`` (required then).
    ``token``: at least ``MIN_TOKEN_LENGTH`` characters (ValueError otherwise), or None: no write actions.
    ``allowed_hosts``: the host names (or addresses) the ``Host`` header may name besides the loopback ones,
    which are always allowed; any port. ``serve`` passes ``dashboard.auth.allowed_hosts_for(--host,
    --allowed-host...)``. Any other ``Host`` gets a 400 (DNS rebinding). ValueError for an empty name or a
    pattern (no wildcards).
    ``celery_app``: builds the Celery app the write actions enqueue/revoke through (default: the environment's,
    as the CLI builds it). Raises ``dashboard.readonly.DatabaseUnavailable`` when the database cannot be read.
    """
    if public and not token:
        raise ValueError("a dashboard reachable from the network needs a token")
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(f"the dashboard's token must be at least {MIN_TOKEN_LENGTH} characters long")
    hosts = HostCheck.of(allowed_hosts)
    ctx = Context(db_url, open_readonly(db_url), celery_app or _default_celery(db_url))
    access = Access(token, public)
    app = FastAPI(title="nexus-eval dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ctx = ctx
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.middleware("http")
    async def guard(request: Request, call_next: Callable[[Request], Any]) -> Response:
        response = await _guarded(request, call_next)
        response.headers.update(SECURITY_HEADERS)
        return response

    async def _guarded(request: Request, call_next: Callable[[Request], Any]) -> Response:
        refused = hosts.refuses(request)  # first: a DNS-rebinding page learns nothing, not even a 401
        if refused is not None:
            return PlainTextResponse(refused, status_code=400)
        decision = access.decide(request)
        if decision.status is not None:
            return error_page(request, decision.status, decision.reason)
        if decision.set_cookie and token:  # a valid ?token=: out of the address bar, into the cookie
            response = RedirectResponse(_without_token(request), status_code=303)
            response.headers["Cache-Control"] = "no-store"
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
            return response
        return await call_next(request)

    @app.exception_handler(NotFound)
    async def not_found(request: Request, exc: NotFound) -> Response:
        return error_page(request, 404, exc.what)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        detail = f"nothing at {request.url.path}" if exc.status_code == 404 else str(exc.detail)
        return error_page(request, exc.status_code, detail)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        fields = ", ".join(".".join(str(p) for p in e.get("loc", ())) for e in exc.errors())
        return error_page(request, 400, f"bad request parameter(s): {fields}")

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        log.exception("error serving %s %s", request.method, request.url.path)
        return error_page(request, 500, "the dashboard hit an error; the server's log has the details")

    pages.register(app, ctx)
    compare_pages.register(app, ctx)
    probe_pages.register(app, ctx)
    _register_actions(app, ctx)
    return app


def _without_token(request: Request) -> str:
    """The request's own path and query without its ``token`` parameter(s), as a same-site redirect target."""
    raw = request.scope.get("raw_path") or request.url.path.encode()
    path = "/" + raw.decode("latin-1").lstrip("/")  # never "//host/...": that would leave this site
    query = [(k, v) for k, v in parse_qsl(request.url.query, keep_blank_values=True) if k != "token"]
    return f"{path}?{urlencode(query)}" if query else path


def _register_actions(app: FastAPI, ctx: Context) -> None:
    """The two POST forms of the job page; each answers with a redirect back to the job page (303)."""

    @app.post("/jobs/{job_id}/cancel")
    def cancel(job_id: str) -> Response:
        from jobs.control import cancel as cancel_job

        full_id = job_id_of(ctx, job_id)
        revoked = cancel_job(ctx.database(), full_id, app=ctx.celery_factory())
        if revoked is None:  # no queued/running episode: nothing changed (a finished job keeps its status)
            return RedirectResponse(f"/jobs/{full_id}?notice=nothing-to-cancel", status_code=303)
        return RedirectResponse(f"/jobs/{full_id}?notice=cancelled&n={len(revoked)}", status_code=303)

    @app.post("/jobs/{job_id}/rerun-failed")
    def rerun_failed(request: Request, job_id: str) -> Response:
        from db.models import RUN_FAILURE_STATUSES
        from jobs.control import NotEnqueued, rerun

        full_id = job_id_of(ctx, job_id)
        try:
            new_ids = rerun(ctx.database(), full_id, sorted(RUN_FAILURE_STATUSES), app=ctx.celery_factory())
        except NotEnqueued as exc:  # the attempts are stored (queued); `nexus-eval resume JOB` sends them
            log.exception("enqueueing reruns of job %s", full_id)
            return error_page(request, 503, str(exc))
        return RedirectResponse(f"/jobs/{full_id}?notice=rerun&n={len(new_ids)}", status_code=303)
