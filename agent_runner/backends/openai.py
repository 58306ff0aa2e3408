"""OpenAIBackend: any OpenAI-compatible chat-completions endpoint (vLLM, SGLang) for dense reference runs.

Standard library only (``urllib``): POST ``{base_url}/chat/completions`` with the whole conversation each
turn (the server is stateless; with prefix caching it re-uses the shared prefix itself). The reply's
``choices[0].message.content`` is the completion text; when the server split the reasoning out
(vLLM/SGLang ``--reasoning-parser`` -> ``reasoning_content`` / ``reasoning``) it is put back as a leading
``<think>...</think>`` block, so the agent sees what the model wrote either way.

Telemetry: ``usage.prompt_tokens`` / ``completion_tokens`` as the server counted them; ``logical_length`` =
their sum; ``tokens_appended`` = prompt tokens beyond the previous turn's logical length (what a stateful
host would have had to prefill); ``decode_s`` is the request's wall time (the server does not split
prefill from decode), ``prefill_s`` stays 0. No cache numbers: the cache is on the server.

Failures: connection errors, timeouts, HTTP 429 and 5xx are retried ``max_retries`` times with
exponential backoff (``backoff_s * 2**k``); other HTTP errors, malformed replies and exhausted retries raise
:class:`ModelError` naming the URL and the cause. The cause never quotes the server's reply: an HTTP error is
``HTTP <code> <reason>`` and a malformed reply is described by its length, so an endpoint cannot place its
text in ``episode.error`` (shown by the dashboard). Redirects are not followed (the key stays with the host
that was allowed).

The endpoint's settings and the operator's allow-lists (``OpenAIConfig``, ``AllowedEndpoints``) are in
``agent_runner.backend_settings``: a config reads them without loading this backend.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

from agent_runner.backend_settings import AllowedEndpoints, OpenAIConfig
from agent_runner.backends import ModelError
from agent_runner.records import Completion, CompletionInfo, Message

RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error (``HTTP 3xx``), never followed: the Authorization header stays with the allowed host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)
_JSON_KINDS = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def _reason(text: object, limit: int = 80) -> str:
    """An HTTP reason phrase as printable ASCII, at most ``limit`` characters."""
    return "".join(c for c in str(text or "") if " " <= c <= "~")[:limit].strip()


def _named(value: object) -> str | None:
    """A name the reply gives (its ``model``, its ``id``) as text; None when it gives none or not a name."""
    return str(value) if isinstance(value, str | int) and not isinstance(value, bool) else None


class OpenAIBackend:
    """The Model protocol over an OpenAI-compatible HTTP endpoint. Keyword arguments = OpenAIConfig fields.

    ``allowed``: the operator's allow-lists; when given, the config is refused here (ValueError). Without them
    the caller has checked (``workers.execution.execute_episode``, the CLI)."""

    def __init__(self, config: OpenAIConfig | None = None, *, allowed: AllowedEndpoints | None = None, **fields: Any):
        self.config = config if config is not None else OpenAIConfig(**fields)
        if allowed is not None:
            allowed.check(self.config)
        self.url = self.config.base_url.rstrip("/") + "/chat/completions"
        self._seed: int | None = None  # the episode's seed, from reset(); per request: seed + turn index
        self._turn = 0
        self._last_logical = 0

    def reset(self, *, seed: int) -> None:
        self._seed = seed
        self._turn = 0
        self._last_logical = 0

    def request_body(self, messages: list[Message], max_new_tokens: int | None) -> dict[str, Any]:
        cfg = self.config
        body: dict[str, Any] = {
            "model": cfg.model,
            "messages": [m.model_dump() for m in messages],
            "temperature": cfg.temperature,
        }
        optional = {
            "top_p": cfg.top_p,
            "max_tokens": max_new_tokens or cfg.max_tokens,
            "stop": cfg.stop or None,
            "seed": None if self._seed is None else self._seed + self._turn,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        return {**body, **cfg.extra_body}

    def complete(self, messages: list[Message], *, max_new_tokens: int | None = None) -> Completion:
        body = self.request_body(messages, max_new_tokens)
        started = time.monotonic()
        reply, attempts = self._post_with_retries(body)
        wall = time.monotonic() - started
        completion = self._completion(reply, wall, attempts)
        self._turn += 1
        self._last_logical = completion.logical_length
        return completion

    def _post_with_retries(self, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.config.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        problems: list[str] = []
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                time.sleep(self.config.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with _OPENER.open(request, timeout=self.config.timeout_s) as response:
                    raw = response.read()
            except urllib.error.HTTPError as exc:
                exc.close()  # its body is the server's text: never read into an error
                problems.append(f"HTTP {exc.code} {_reason(exc.reason)}".rstrip())
                if exc.code not in RETRYABLE_STATUS:
                    break
                continue
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                problems.append(f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}")
                continue
            try:
                return json.loads(raw), attempt + 1
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                problem = f"returned a reply that is not JSON ({len(raw)} bytes)"
                raise ModelError(f"openai backend: {self.url} {problem}") from exc
        raise ModelError(f"openai backend: {self.url} failed after {len(problems)} attempt(s): " + " | ".join(problems))

    def _completion(self, reply: dict[str, Any], wall: float, attempts: int) -> Completion:
        # the reply is the server's text: an error describes its shape, never quotes it
        try:
            choice = reply["choices"][0]
            message = choice["message"]
            content = message.get("content") or ""
            reasoning = message.get("reasoning_content") or message.get("reasoning")
            if not isinstance(content, str) or not isinstance(reasoning, str | None):
                raise TypeError("content is not text")
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            kind = _JSON_KINDS.get(type(reply), type(reply).__name__)
            problem = f"reply (a JSON {kind}) has no choices[0].message text"
            raise ModelError(f"openai backend: {self.url} {problem}") from exc
        text = f"<think>\n{reasoning.strip()}\n</think>\n\n{content.lstrip()}" if reasoning else content
        try:
            usage = reply.get("usage") or {}
            prompt = int(usage.get("prompt_tokens") or 0)
            generated = int(usage.get("completion_tokens") or 0)
        except (TypeError, ValueError, AttributeError) as exc:
            raise ModelError(f"openai backend: {self.url} reply's usage does not count tokens as numbers") from exc
        return Completion(
            text=text,
            prompt_tokens=prompt,
            tokens_generated=generated,
            logical_length=prompt + generated,
            tokens_appended=max(prompt - self._last_logical, 0) if self._turn else prompt,
            decode_s=wall,
            tokens_per_s=generated / wall if wall > 0 and generated else None,
            finish_reason=choice.get("finish_reason"),
            info=CompletionInfo(
                attempts=attempts, server_model=_named(reply.get("model")), request_id=_named(reply.get("id"))
            ),
        )
