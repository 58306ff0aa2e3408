"""What a job's ``openai`` settings may make the backend send, and where (issue 33, item 1).

``OpenAIConfig`` refuses what no operator can allow (credentials, a query or a fragment in ``base_url``, a
scheme other than http(s), an ``api_key_env`` that is not a name); ``AllowedEndpoints.check`` refuses a host or a key
variable the operator's allow-lists do not name. Against a real HTTP listener on 127.0.0.1 (``Listener``, a
test double that records every request): a refused config sends nothing, and nothing the server answers
(an error body, a non-JSON page, a reply without choices, a redirect) reaches the error text.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pydantic import ValidationError

from agent_runner.backend_settings import AllowedEndpoints, EndpointNotAllowed, OpenAIConfig
from agent_runner.backends import ModelError
from agent_runner.backends.openai import OpenAIBackend
from agent_runner.records import Message

MESSAGES = [Message(role="system", content="sys"), Message(role="user", content="fix it")]
#: a 500-byte body no error text may contain
SECRET_BODY = ("LEAKED-BODY-" * 50)[:500]


class Listener:
    """Test double: an HTTP server on 127.0.0.1 (port 0) that records every request (method, path, headers)
    and answers each from a queue of (status, body bytes, extra headers, reason phrase or None)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.requests: list[dict] = []
        self.queue: list[tuple[int, bytes, dict[str, str], str | None]] = []
        listener = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                listener.requests.append({"method": self.command, "path": self.path, "headers": dict(self.headers)})
                status, body, headers, reason = listener.queue.pop(0) if listener.queue else (500, b"", {}, None)
                self.send_response(status, reason)
                for key, value in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer  # noqa: N815 (http.server's names)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()
        self.base_url = f"http://{host}:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


def ok_reply(text: str = "<function=finish></function>") -> bytes:
    message = {"role": "assistant", "content": text}
    return json.dumps({"choices": [{"message": message, "finish_reason": "stop"}], "usage": {}}).encode()


# --- OpenAIConfig: never right, whoever the operator ------------------------------------------------------
@pytest.mark.parametrize(
    ("base_url", "words"),
    [
        ("http://127.0.0.1:8000/v1?x=", "query string"),
        ("http://127.0.0.1:8000/v1#frag", "fragment"),
        ("http://user:pw@127.0.0.1:8000/v1", "credentials"),
        ("http://evil.example\\@127.0.0.1/v1", "backslashes"),
        ("ftp://127.0.0.1/v1", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("127.0.0.1:8000/v1", "http:// or https://"),
        ("http:///v1", "names no host"),
        ("http://127.0.0.1:80x/v1", "not a valid URL"),
    ],
)
def test_config_refuses_a_base_url_no_operator_can_allow(base_url, words):
    with pytest.raises(ValidationError, match="base_url") as raised:
        OpenAIConfig(base_url=base_url)
    assert words in str(raised.value)
    if "pw@" in base_url:
        assert "pw@" not in str(raised.value).split("input_value")[0]  # our message never echoes a password


@pytest.mark.parametrize("name", ["NEXUS EVAL", "$OPENAI_API_KEY", "A-B", "", "1ABC", "X\nY"])
def test_config_refuses_an_api_key_env_that_is_not_a_name(name):
    with pytest.raises(ValidationError, match="api_key_env"):
        OpenAIConfig(api_key_env=name)


# --- AllowedEndpoints.check: the operator's allow-lists -----------------------------------------------------------
def test_allowed_endpoints_refuse_a_key_variable_off_the_list_naming_field_value_and_setting():
    config = OpenAIConfig(api_key_env="NEXUS_EVAL_DB")
    with pytest.raises(EndpointNotAllowed) as raised:
        AllowedEndpoints().check(config)
    message = str(raised.value)
    assert raised.value.field == "api_key_env" and isinstance(raised.value, ValueError)
    assert "openai.api_key_env='NEXUS_EVAL_DB'" in message
    assert "$NEXUS_EVAL_OPENAI_KEY_ENVS" in message and "*_API_KEY" in message


def test_allowed_endpoints_refuse_a_host_off_the_list_and_accepts_one_the_operator_adds():
    remote = OpenAIConfig(base_url="http://vllm.internal:8000/v1")
    with pytest.raises(EndpointNotAllowed) as raised:
        AllowedEndpoints().check(remote)
    assert raised.value.field == "base_url"
    assert "'vllm.internal'" in str(raised.value) and "$NEXUS_EVAL_OPENAI_HOSTS" in str(raised.value)
    AllowedEndpoints(hosts=("VLLM.internal",)).check(remote)  # host names: any case
    AllowedEndpoints(hosts=("*.internal",)).check(remote)  # globs
    with pytest.raises(EndpointNotAllowed):  # a look-alike is not the host
        AllowedEndpoints(key_envs=("*",)).check(OpenAIConfig(base_url="http://127.0.0.1.evil.example/v1"))


def test_the_defaults_allow_loopback_and_api_key_variables_only():
    for url in ("http://127.0.0.1:8000/v1", "http://localhost/v1", "https://[::1]:9/v1"):
        for name in ("OPENAI_API_KEY", "VLLM_API_KEY"):
            AllowedEndpoints().check(OpenAIConfig(base_url=url, api_key_env=name))
    for name in ("NEXUS_EVAL_DB", "AWS_SECRET_ACCESS_KEY", "HOME", "openai_api_key"):
        with pytest.raises(EndpointNotAllowed, match="api_key_env"):
            AllowedEndpoints().check(OpenAIConfig(api_key_env=name))


# --- against a real listener --------------------------------------------------------------------------------
def test_a_refused_key_variable_sends_nothing_to_a_real_listener(listener, monkeypatch):
    monkeypatch.setenv("NEXUS_EVAL_DB", "postgresql+psycopg://nexus:s3cret@127.0.0.1/nexus")
    listener.queue = [(200, ok_reply(), {}, None)]
    with pytest.raises(ValueError, match="NEXUS_EVAL_OPENAI_KEY_ENVS"):
        model = OpenAIBackend(base_url=listener.base_url, api_key_env="NEXUS_EVAL_DB", allowed=AllowedEndpoints())
        model.complete(MESSAGES)
    assert listener.requests == []


def test_an_error_body_never_reaches_the_error_text(listener):
    listener.queue = [(400, SECRET_BODY.encode(), {"Content-Type": "text/plain"}, None)]
    with pytest.raises(ModelError) as raised:
        OpenAIBackend(base_url=listener.base_url, max_retries=0).complete(MESSAGES)
    assert str(raised.value).endswith("HTTP 400 Bad Request")
    assert "LEAKED" not in str(raised.value)
    assert len(listener.requests) == 1


def test_retried_errors_keep_only_a_sanitised_reason_phrase(listener):
    reason = "Server \x7fError " + "x" * 200  # a control character and far too long
    listener.queue = [(500, SECRET_BODY.encode(), {}, reason), (503, SECRET_BODY.encode(), {}, None)]
    with pytest.raises(ModelError) as raised:
        OpenAIBackend(base_url=listener.base_url, max_retries=1, backoff_s=0.01).complete(MESSAGES)
    text = str(raised.value)
    assert "LEAKED" not in text and "\x7f" not in text
    first, second = text.split("attempt(s): ", 1)[1].split(" | ")
    assert first.startswith("HTTP 500 Server Error xxx") and len(first) <= len("HTTP 500 ") + 80
    assert second == "HTTP 503 Service Unavailable"


def test_a_reply_that_is_not_json_or_has_no_choices_is_described_not_quoted(listener):
    page = b"<html>" + SECRET_BODY.encode() + b"</html>"
    listener.queue = [(200, page, {"Content-Type": "text/html"}, None)]
    with pytest.raises(ModelError, match=rf"not JSON \({len(page)} bytes\)") as raised:
        OpenAIBackend(base_url=listener.base_url).complete(MESSAGES)
    assert "LEAKED" not in str(raised.value)
    listener.queue = [(200, json.dumps({"detail": SECRET_BODY}).encode(), {}, None)]
    with pytest.raises(ModelError, match="has no choices") as raised:
        OpenAIBackend(base_url=listener.base_url).complete(MESSAGES)
    assert "LEAKED" not in str(raised.value)


def test_a_redirect_is_not_followed_so_the_key_stays_with_the_allowed_host(listener, monkeypatch):
    elsewhere = Listener()
    try:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-s3cret")
        listener.queue = [(302, b"", {"Location": elsewhere.base_url + "/chat/completions"}, None)]
        with pytest.raises(ModelError, match="HTTP 302 Found"):
            OpenAIBackend(base_url=listener.base_url, max_retries=0).complete(MESSAGES)
        assert listener.requests[0]["headers"]["Authorization"] == "Bearer sk-s3cret"
        assert elsewhere.requests == []
    finally:
        elsewhere.close()


def test_an_allowed_endpoint_still_works(listener, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "sk-ok")
    listener.queue = [(200, ok_reply("done"), {}, None)]
    model = OpenAIBackend(base_url=listener.base_url, api_key_env="VLLM_API_KEY", allowed=AllowedEndpoints())
    assert model.complete(MESSAGES).text == "done"
    assert listener.requests[0]["headers"]["Authorization"] == "Bearer sk-ok"
