"""The page-test harness: a results database from a real embedded job, the dashboard served on a free loopback
port, and Debian's chromium driven by Playwright.

- ``job_run`` (session): ``nexus-eval run`` of the tiny model on one mini task, dense/snapkv/nexus under
  prefill_decode and both protocols (6 episodes in real Docker sandboxes, graded: dense runs under each protocol,
  since the tiny model's Qwen3 template re-renders a history without its <think> blocks), into a fresh SQLite file,
  plus ``nexus-eval compare JOB --format json`` of it: the numbers the compare page must show. The CLI runs as
  ``python -m nexus_eval.cli`` so it is this checkout's code whatever the ``nexus-eval`` script points at.
- ``serve(public=...)``: ``dashboard.app.create_app(url, token=TOKEN, public=...)`` under uvicorn in a thread,
  on a socket bound here (port 0: no race for a free port); waits until it answers, stopped at the end.
- ``page``: a fresh browser context and page (no cookies) of one chromium per session. Console messages of
  type error and uncaught page errors are collected and must be none when the test ends (a test that expects
  one, e.g. the 404 a navigation to a bad id logs, says so with ``page_errors.allow(regex)``).
- ``shot(page, name)``: a full-page PNG in ``bench/out/dashboard/`` (``/bench/out/`` is git-ignored).

Playwright never downloads a browser here: it launches ``shutil.which("chromium")`` (``.ci/parts/60-chromium.sh``
installs it), headless, with ``--no-sandbox`` (the tests run as root).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from db import sqlite_url
from tests.conftest import docker_status, require

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "bench" / "out" / "dashboard"
TASK = "humanfmt__humanfmt-1"
METHODS = ("dense", "snapkv", "nexus")
PROTOCOLS = ("true_eviction", "full_context")
SCOPE = "prefill_decode"
TOKEN = "page-test-token-7f3a"
RUN_TIMEOUT_S = 420


def chromium() -> str | None:
    return shutil.which("chromium")


def cli(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """This checkout's CLI in a subprocess (CPU, one thread per op: the machine is shared with containers)."""
    env = {**os.environ, "NEXUS_EVAL_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("NEXUS_EVAL_BROKER", None)
    return subprocess.run(
        [sys.executable, "-m", "nexus_eval.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _failed(what: str, done: subprocess.CompletedProcess) -> str:
    return f"{what} exited {done.returncode}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"


@dataclass
class JobRun:
    """The finished job the pages show. ``episodes``: one dict per episode row (see ``_episodes``)."""

    db_path: Path
    job_id: str
    compare: dict[str, Any]  # `nexus-eval compare JOB --format json`
    episodes: list[dict[str, Any]]
    seconds: float

    @property
    def url(self) -> str:
        return sqlite_url(self.db_path)

    def episode(self, method: str, protocol: str) -> dict[str, Any]:
        return next(e for e in self.episodes if e["method"] == method and e["protocol"] == protocol)


def _episodes(url: str, job_id: str) -> list[dict[str, Any]]:
    from db import connect
    from db.models import Episode

    database = connect(url)
    try:
        with database.session() as s:
            rows = s.query(Episode).filter(Episode.job_id == job_id).order_by(Episode.method, Episode.protocol)
            return [
                {
                    "id": r.id,
                    "method": r.method,
                    "scope": r.scope,
                    "protocol": r.protocol,
                    "status": r.status,
                    "n_turns": len(r.turns),
                    "retention": r.retention,
                }
                for r in rows
            ]
    finally:
        database.dispose()


@pytest.fixture(scope="session")
def job_run(tmp_path_factory) -> JobRun:
    """A real job run with the embedded worker (about 1-3 minutes on 2 CPUs), then its compare JSON."""
    require(*docker_status())
    db_path = tmp_path_factory.mktemp("dashboard") / "results.db"
    t0 = time.monotonic()
    run = cli(
        "run",
        *("--db", str(db_path), "--methods", ",".join(METHODS), "--scopes", SCOPE),
        *("--protocols", ",".join(PROTOCOLS), "--tasks", TASK, "--max-steps", "3", "--max-new-tokens", "32"),
        *("--format", "json", "--timeout", str(RUN_TIMEOUT_S - 60)),
        timeout=RUN_TIMEOUT_S,
    )
    seconds = time.monotonic() - t0
    assert run.returncode == 0, _failed("nexus-eval run", run)
    job_id = json.loads(run.stdout)["job_ids"][0]
    compare = cli("compare", job_id, "--db", str(db_path), "--format", "json", timeout=120)
    assert compare.returncode == 0, _failed("nexus-eval compare", compare)
    episodes = _episodes(sqlite_url(db_path), job_id)
    # dense runs under each protocol: Qwen3's template renders a history differently under full context (jobs.spec)
    cells = {(m, p) for m in METHODS for p in PROTOCOLS}
    assert {(e["method"], e["protocol"]) for e in episodes} == cells and len(episodes) == len(cells), episodes
    return JobRun(db_path, job_id, json.loads(compare.stdout), episodes, seconds)


# -- the dashboard under uvicorn -------------------------------------------------------------------------------


@dataclass
class Server:
    """A dashboard app served on 127.0.0.1 in a background thread."""

    base: str
    public: bool
    token: str
    stop: Callable[[], None]


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
        return True
    except urllib.error.HTTPError:  # any HTTP answer (401, 404...) means it is serving
        return True
    except OSError:
        return False


def start_server(db_url: str, *, public: bool, token: str = TOKEN) -> Server:
    import uvicorn

    from dashboard.app import create_app

    app = create_app(db_url, token=token, public=public)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"dashboard-{port}", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not (server.started and _answers(f"{base}/jobs")):
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the dashboard did not come up on {base}")
        time.sleep(0.05)

    def stop() -> None:
        server.should_exit = True
        thread.join(15)
        sock.close()

    return Server(base, public, token, stop)


@pytest.fixture(scope="session")
def server(job_run) -> Iterator[Server]:
    """The dashboard of the job's database, not public: pages open to all, POSTs need the token."""
    s = start_server(job_run.url, public=False)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def public_server(job_run) -> Iterator[Server]:
    """The same database served with public=True: every request needs the token."""
    s = start_server(job_run.url, public=True)
    yield s
    s.stop()


# -- the browser -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def browser():
    path = chromium()
    require(path is not None, "Debian's chromium is not installed (bash .ci/parts/60-chromium.sh installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=["--no-sandbox"], headless=True)
        yield b
        b.close()


@dataclass
class PageErrors:
    """Console errors and uncaught exceptions of one page; ``allow`` a pattern a test expects."""

    seen: list[str] = field(default_factory=list)
    allowed: list[re.Pattern] = field(default_factory=list)

    def allow(self, pattern: str) -> None:
        self.allowed.append(re.compile(pattern))

    def unexpected(self) -> list[str]:
        return [m for m in self.seen if not any(p.search(m) for p in self.allowed)]


@pytest.fixture
def page_errors() -> PageErrors:
    return PageErrors()


@pytest.fixture
def page(browser, page_errors):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()

    def on_console(msg) -> None:
        if msg.type == "error":
            where = msg.location or {}
            page_errors.seen.append(f"console.error: {msg.text} ({where.get('url', '')}:{where.get('lineNumber', '')})")

    pg.on("console", on_console)
    pg.on("pageerror", lambda exc: page_errors.seen.append(f"pageerror: {exc}"))
    yield pg
    context.close()
    unexpected = page_errors.unexpected()
    assert not unexpected, "the page logged errors:\n" + "\n".join(unexpected)


@pytest.fixture(scope="session")
def shot() -> Callable[[Any, str], Path]:
    SHOTS.mkdir(parents=True, exist_ok=True)

    def take(pg, name: str) -> Path:
        path = SHOTS / f"{name}.png"
        pg.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 1000, f"empty screenshot {path}"
        return path

    return take
