"""OpenAIBackend against ChatEndpointDouble, a local HTTP stand-in for a vLLM/SGLang server (127.0.0.1)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent_runner.backends import ModelError, make_backend
from agent_runner.backends.openai import OpenAIBackend
from agent_runner.records import Message

MESSAGES = [Message(role="system", content="sys"), Message(role="user", content="fix it")]


def reply(content: str, *, prompt: int = 11, completion: int = 7, reasoning: str | None = None) -> dict:
    message = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return {
        "id": "cmpl-1",
        "model": "served",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


class ChatEndpointDouble:
    """Test double for an OpenAI-compatible server: answers POST /v1/chat/completions from a queue of
    (status, json_body, delay_s) and records every request (path, headers, parsed body)."""

    def __init__(self) -> None:
        self.queue: list[tuple[int, object, float]] = []
        self.requests: list[dict] = []
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                double.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                status, payload, delay = double.queue.pop(0) if double.queue else (500, {"error": "empty"}, 0)
                time.sleep(delay)
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    double = ChatEndpointDouble()
    yield double
    double.close()


def backend(endpoint, **fields) -> OpenAIBackend:
    return OpenAIBackend(base_url=endpoint.base_url, model="deepswe", backoff_s=0.01, **fields)


def test_request_body_and_parsed_completion(endpoint, monkeypatch):
    monkeypatch.setenv("NEXUS_TEST_KEY", "sekrit")
    endpoint.queue = [(200, reply("<function=finish></function>"), 0), (200, reply("two", prompt=30, completion=3), 0)]
    model = backend(endpoint, temperature=0.6, top_p=0.95, api_key_env="NEXUS_TEST_KEY", stop=["</function>"])
    model.reset(seed=5)
    first = model.complete(MESSAGES, max_new_tokens=256)

    request = endpoint.requests[0]
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == "Bearer sekrit"
    assert request["body"] == {
        "model": "deepswe",
        "temperature": 0.6,
        "top_p": 0.95,
        "max_tokens": 256,
        "seed": 5,
        "stop": ["</function>"],
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix it"}],
    }
    assert first.text == "<function=finish></function>" and first.finish_reason == "stop"
    assert (first.prompt_tokens, first.tokens_generated, first.logical_length, first.tokens_appended) == (11, 7, 18, 11)
    assert first.info.attempts == 1 and first.decode_s > 0

    second = model.complete([*MESSAGES, Message(role="assistant", content="x"), Message(role="user", content="y")])
    assert endpoint.requests[1]["body"]["seed"] == 6  # seed + turn index
    assert "max_tokens" not in endpoint.requests[1]["body"]  # R2E sends none: the server caps at its window
    assert second.tokens_appended == 30 - 18


def test_reasoning_split_by_the_server_is_put_back_as_a_think_block(endpoint):
    endpoint.queue = [(200, reply("<function=finish></function>", reasoning=" I should finish. "), 0)]
    text = backend(endpoint).complete(MESSAGES).text
    assert text == "<think>\nI should finish.\n</think>\n\n<function=finish></function>"


def test_http_500_is_retried_then_succeeds(endpoint):
    endpoint.queue = [(500, {"error": "overloaded"}, 0), (503, {"error": "busy"}, 0), (200, reply("ok"), 0)]
    completion = backend(endpoint, max_retries=3).complete(MESSAGES)
    assert completion.text == "ok" and completion.info.attempts == 3 and len(endpoint.requests) == 3


def test_client_error_is_not_retried_and_names_the_cause(endpoint):
    endpoint.queue = [(400, {"error": "bad model name"}, 0), (200, reply("never"), 0)]
    with pytest.raises(ModelError, match="HTTP 400 Bad Request$") as raised:
        backend(endpoint).complete(MESSAGES)
    assert "bad model name" not in str(raised.value)  # the server's text never reaches episode.error
    assert len(endpoint.requests) == 1


def test_timeouts_exhaust_the_retries(endpoint):
    endpoint.queue = [(200, reply("late"), 1.0), (200, reply("late"), 1.0)]
    with pytest.raises(ModelError, match=r"failed after 2 attempt\(s\).*(timed out|Timeout)"):
        backend(endpoint, timeout_s=0.2, max_retries=1).complete(MESSAGES)


def test_unreachable_endpoint_and_malformed_reply(endpoint):
    with pytest.raises(ModelError, match="failed after 1 attempt"):
        OpenAIBackend(base_url="http://127.0.0.1:9/v1", max_retries=0).complete(MESSAGES)
    endpoint.queue = [(200, {"choices": []}, 0)]
    with pytest.raises(ModelError, match="no choices"):
        backend(endpoint).complete(MESSAGES)


def test_registry_and_config_validation():
    assert isinstance(make_backend("openai", base_url="http://127.0.0.1:1/v1"), OpenAIBackend)
    with pytest.raises(ValueError, match="temprature"):
        OpenAIBackend(temprature=1.0)
