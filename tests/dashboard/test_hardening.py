"""The dashboard's hardening (issue 33, items 5 and 7): the Host check against DNS rebinding, ``?token=`` leaving
the address bar, the token's minimum length, ``--token-file`` and the ``--token`` warning, and a CSP without
``'unsafe-eval'``.

The Host check is tried against a real ``nexus-eval serve`` subprocess on a free loopback port; the rest with
FastAPI's TestClient, and ``serve``'s options through typer's CliRunner with ``uvicorn.run`` replaced (the app it
would serve is kept and tried with a TestClient).
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import time

import pytest
from fastapi.testclient import TestClient

from dashboard.app import create_app
from dashboard.auth import COOKIE
from db import connect, sqlite_url
from tests.dashboard.conftest import ROOT
from tests.support.own_services import free_port

TOKEN = "hardening-test-token-3c9e"  # 25 characters
LOCAL = "http://127.0.0.1"  # a TestClient base that the Host check lets through (TestClient's own is "testserver")


@pytest.fixture(scope="module")
def db_url(tmp_path_factory) -> str:
    """An empty results database at the current schema (``connect`` migrates it)."""
    url = sqlite_url(tmp_path_factory.mktemp("hardening") / "results.db")
    connect(url).dispose()
    return url


# -- the Host check --------------------------------------------------------------------------------------------


def _get(port: int, host: str, path: str = "/jobs") -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", host)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        conn.close()


def _serve(db_url: str, port: int, *args: str) -> subprocess.Popen:
    """``nexus-eval serve`` of this checkout on 127.0.0.1:port, answering (any status) when returned."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("NEXUS_EVAL_TOKEN", None)
    cmd = [sys.executable, "-m", "nexus_eval.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--db", db_url, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited {proc.returncode}:\n{proc.stdout.read()}")
        try:
            _get(port, f"127.0.0.1:{port}")
            return proc
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError("serve did not answer within 60 s") from None
            time.sleep(0.2)


def test_a_real_serve_answers_only_its_own_and_loopback_host_names(db_url):
    port = free_port()
    proc = _serve(db_url, port)
    try:
        status, body = _get(port, "attacker.example")  # a DNS-rebinding page: its own name in Host
        assert status == 400, (status, body[:300])
        assert "attacker.example" in body and "<" not in body  # short plain text
        assert _get(port, f"attacker.example:{port}")[0] == 400
        assert _get(port, f"127.0.0.1:{port}")[0] == 200
        assert _get(port, f"localhost:{port}")[0] == 200
        assert _get(port, f"[::1]:{port}")[0] == 200
        assert _get(port, "LOCALHOST")[0] == 200  # names are case-insensitive, the port is any
        assert _get(port, f"127.0.0.1:{port}", "/static/style.css")[0] == 200
        assert _get(port, "attacker.example", "/static/style.css")[0] == 400
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def test_the_host_check_of_the_app(db_url):
    default = TestClient(create_app(db_url, token=None, public=False))  # Host: testserver
    refused = default.get("/jobs")
    assert refused.status_code == 400 and refused.headers["content-type"].startswith("text/plain")
    assert "testserver" in refused.text and "--allowed-host" in refused.text
    assert default.get("/api/jobs/x/progress").status_code == 400
    assert default.post("/jobs/x/cancel").status_code == 400
    for host in ("127.0.0.1:8800", "localhost", "[::1]:1", "127.0.0.2", "localhost."):
        assert default.get("/jobs", headers={"Host": host}).status_code == 200, host
    for host in ("", "localhost.attacker.example", "127.0.0.1.attacker.example", "[::1", "::1:80"):
        assert default.get("/jobs", headers={"Host": host}).status_code == 400, host
    proxied = TestClient(create_app(db_url, token=None, public=False, allowed_hosts=["Dash.Example:443"]))
    assert proxied.get("/jobs", headers={"Host": "dash.example"}).status_code == 200
    assert proxied.get("/jobs", headers={"Host": "localhost:8800"}).status_code == 200  # loopback always
    assert proxied.get("/jobs", headers={"Host": "other.example"}).status_code == 400
    for bad in ("", "*", "a b", "x/y"):
        with pytest.raises(ValueError, match="allowed host"):
            create_app(db_url, token=None, public=False, allowed_hosts=[bad])


def test_allowed_hosts_of_a_listen_address():
    from dashboard.auth import allowed_hosts_for, host_name

    assert (
        host_name("[::1]:8800") == "::1" and host_name("Example.ORG:80") == "example.org" and host_name("::1") == "::1"
    )
    assert allowed_hosts_for("127.0.0.1") == {"127.0.0.1", "localhost", "::1"}
    assert allowed_hosts_for("192.168.1.5", ["dash.lan"]) == {
        "127.0.0.1",
        "localhost",
        "::1",
        "192.168.1.5",
        "dash.lan",
    }
    assert allowed_hosts_for("0.0.0.0", ["10.0.0.2"]) == {"127.0.0.1", "localhost", "::1", "10.0.0.2"}
    assert "::" not in allowed_hosts_for("::")


# -- the token -------------------------------------------------------------------------------------------------


def test_a_token_in_the_address_is_swapped_for_the_cookie(db_url):
    c = TestClient(create_app(db_url, token=TOKEN, public=True), base_url=LOCAL)
    signed = c.get(f"/jobs?limit=5&token={TOKEN}&status=done", follow_redirects=False)
    assert signed.status_code == 303 and signed.headers["location"] == "/jobs?limit=5&status=done"
    cookie = signed.headers["set-cookie"]
    assert (
        cookie.startswith(f"{COOKIE}={TOKEN}") and "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    )
    assert signed.headers["cache-control"] == "no-store"
    assert c.get(signed.headers["location"]).status_code == 200  # the page loads from the cookie
    bare = TestClient(create_app(db_url, token=TOKEN, public=False), base_url=LOCAL)
    done = bare.get(f"/api/jobs/x/progress?token={TOKEN}", follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/api/jobs/x/progress"
    from starlette.requests import Request

    from dashboard.app import _without_token

    def target(raw_path: bytes, query: bytes) -> str:
        scope = {"type": "http", "method": "GET", "path": raw_path.decode(), "raw_path": raw_path,
                 "query_string": query, "headers": [(b"host", b"127.0.0.1")]}  # fmt: skip
        return _without_token(Request(scope))

    assert target(b"//evil.example/", b"token=" + TOKEN.encode()) == "/evil.example/"  # never off this site
    assert target(b"/jobs/a%20b", b"token=x&q=a+b&token=y&q=%26") == "/jobs/a%20b?q=a+b&q=%26"
    wrong = bare.get("/jobs?token=not-the-token-at-all", follow_redirects=False)
    assert wrong.status_code == 200 and "set-cookie" not in wrong.headers  # loopback: read without it, no cookie


def test_a_short_token_is_refused(db_url, monkeypatch):
    for short in ("t", "x" * 15):
        with pytest.raises(ValueError, match="16"):
            create_app(db_url, token=short, public=False)
    create_app(db_url, token="x" * 16, public=False).state.ctx.dispose()
    from typer.testing import CliRunner

    from nexus_eval.cli import app

    monkeypatch.delenv("NEXUS_EVAL_TOKEN", raising=False)
    done = CliRunner().invoke(app, ["serve", "--db", db_url, "--token", "abc123xyz"])
    assert done.exit_code == 2 and "16" in done.output and "abc123xyz" not in done.output  # never echoed
    monkeypatch.setenv("NEXUS_EVAL_TOKEN", "also-short")
    done = CliRunner().invoke(app, ["serve", "--db", db_url])
    assert done.exit_code == 2 and "16" in done.output and "NEXUS_EVAL_TOKEN" in done.output


def test_the_production_csp_has_no_eval(db_url):
    csp = TestClient(create_app(db_url, token=None, public=False), base_url=LOCAL).get("/jobs")
    assert csp.status_code == 200
    policy = csp.headers["content-security-policy"]
    assert "unsafe-eval" not in policy and "script-src 'self'" in policy


# -- serve's options -------------------------------------------------------------------------------------------


@pytest.fixture
def served(monkeypatch):
    """``nexus-eval serve ARGS`` through CliRunner, with uvicorn.run replaced: (result, the app it got, host)."""
    import uvicorn
    from typer.testing import CliRunner

    from nexus_eval.cli import app

    monkeypatch.delenv("NEXUS_EVAL_TOKEN", raising=False)
    got: dict = {}
    monkeypatch.setattr(uvicorn, "run", lambda a, **kw: got.update(app=a, **kw))

    def run(*args: str):
        done = CliRunner().invoke(app, ["serve", *args])
        return done, got.get("app")

    yield run
    if got.get("app") is not None:
        got["app"].state.ctx.dispose()


def test_token_on_the_command_line_warns_about_ps(served, db_url):
    done, app = served("--db", db_url, "--token", TOKEN)
    assert done.exit_code == 0, done.output
    assert "ps" in done.output and "NEXUS_EVAL_TOKEN" in done.output and "--token-file" in done.output
    assert TestClient(app, base_url=LOCAL).get("/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_token_file(served, db_url, tmp_path):
    path = tmp_path / "token"
    path.write_text(f"  {TOKEN}  \nsecond line\n", encoding="utf-8")
    done, app = served("--db", db_url, "--token-file", str(path))
    assert done.exit_code == 0, done.output
    assert "ps" not in done.output.replace("http", "")  # no warning
    signed = TestClient(app, base_url=LOCAL).get(f"/jobs?token={TOKEN}", follow_redirects=False)
    assert signed.status_code == 303  # the file's first line, stripped, is the token
    assert TOKEN not in done.output


@pytest.mark.parametrize("content", [None, "", "\n\n", "   \nsecond-line-is-not-read\n"])
def test_a_missing_or_empty_token_file_is_an_error(served, db_url, tmp_path, content):
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    done, app = served("--db", db_url, "--token-file", str(path))
    assert done.exit_code == 2 and app is None
    assert str(path) in done.output.replace("\n", "") and ("empty" in done.output or "cannot read" in done.output)


def test_token_and_token_file_together_are_an_error(served, db_url, tmp_path):
    (tmp_path / "token").write_text(TOKEN, encoding="utf-8")
    done, app = served("--db", db_url, "--token", TOKEN, "--token-file", str(tmp_path / "token"))
    assert done.exit_code == 2 and app is None and "--token-file" in done.output


def test_every_address_needs_the_names_it_is_reached_by(served, db_url):
    done, app = served("--db", db_url, "--host", "0.0.0.0", "--token", TOKEN)
    assert done.exit_code == 2 and app is None and "--allowed-host" in done.output
    done, app = served("--db", db_url, "--host", "0.0.0.0", "--token", TOKEN, "--allowed-host", "dash.lan:8800")
    assert done.exit_code == 0, done.output
    c = TestClient(app, base_url=LOCAL)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert c.get("/jobs", headers={**auth, "Host": "dash.lan:8800"}).status_code == 200
    assert c.get("/jobs", headers={**auth, "Host": "0.0.0.0:8800"}).status_code == 400
    assert c.get("/jobs", headers={**auth, "Host": "attacker.example"}).status_code == 400
    assert c.get("/jobs", headers=auth).status_code == 200


def test_a_name_beyond_loopback_makes_every_request_need_the_token(served, db_url, monkeypatch):
    done, app = served("--db", db_url, "--allowed-host", "dash.example")  # a proxy in front of 127.0.0.1
    assert done.exit_code == 2 and app is None and "--allowed-host dash.example" in done.output
    done, app = served("--db", db_url, "--allowed-host", "dash.example", "--token-file", "/dev/null")
    assert done.exit_code == 2 and "empty" in done.output
    monkeypatch.setenv("NEXUS_EVAL_TOKEN", TOKEN)
    done, app = served("--db", db_url, "--allowed-host", "dash.example")
    assert done.exit_code == 0, done.output
    c = TestClient(app, base_url="http://dash.example")
    assert c.get("/jobs").status_code == 401  # the proxy's visitors need the token, reads included
    assert c.get("/jobs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
