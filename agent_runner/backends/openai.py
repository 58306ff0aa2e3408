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
:class:`ModelError` naming the URL and the cause.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent_runner.backends import ModelError
from agent_runner.records import Completion, Message

RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class OpenAIConfig(BaseModel):
    """Where the endpoint is and how to sample. ``api_key_env`` names the variable holding the key
    (vLLM/SGLang accept any key unless started with one; a missing variable sends no Authorization)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field("http://127.0.0.1:8000/v1", description="up to and including /v1")
    model: str = "agentica-org/DeepSWE-Preview"
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = Field(1.0, ge=0)  # DeepSWE's evaluation temperature
    top_p: float | None = Field(None, gt=0, le=1)  # R2E does not send top_p; None leaves the server default
    max_tokens: int | None = Field(None, ge=1, description="per-turn cap when the agent passes none")
    stop: list[str] = Field(default_factory=list)
    timeout_s: float = Field(600.0, gt=0)
    max_retries: int = Field(3, ge=0)
    backoff_s: float = Field(1.0, ge=0)
    extra_body: dict[str, Any] = Field(default_factory=dict, description="merged into every request body")


class OpenAIBackend:
    """The Model protocol over an OpenAI-compatible HTTP endpoint. Keyword arguments = OpenAIConfig fields."""

    def __init__(self, config: OpenAIConfig | None = None, **fields: Any) -> None:
        self.config = config if config is not None else OpenAIConfig(**fields)
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
                with urllib.request.urlopen(request, timeout=self.config.timeout_s) as response:
                    raw = response.read()
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:500].decode("utf-8", "replace")
                problems.append(f"HTTP {exc.code}: {detail}")
                if exc.code not in RETRYABLE_STATUS:
                    break
                continue
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                problems.append(f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}")
                continue
            try:
                return json.loads(raw), attempt + 1
            except json.JSONDecodeError as exc:
                raise ModelError(f"openai backend: {self.url} returned non-JSON: {raw[:200]!r}") from exc
        raise ModelError(f"openai backend: {self.url} failed after {len(problems)} attempt(s): " + " | ".join(problems))

    def _completion(self, reply: dict[str, Any], wall: float, attempts: int) -> Completion:
        try:
            choice = reply["choices"][0]
            message = choice["message"]
            content = message.get("content") or ""
            reasoning = message.get("reasoning_content") or message.get("reasoning")
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ModelError(f"openai backend: {self.url} reply has no choices[0].message: {str(reply)[:300]}") from exc
        text = f"<think>\n{reasoning.strip()}\n</think>\n\n{content.lstrip()}" if reasoning else content
        usage = reply.get("usage") or {}
        prompt = int(usage.get("prompt_tokens") or 0)
        generated = int(usage.get("completion_tokens") or 0)
        return Completion(
            text=text,
            prompt_tokens=prompt,
            tokens_generated=generated,
            logical_length=prompt + generated,
            tokens_appended=max(prompt - self._last_logical, 0) if self._turn else prompt,
            decode_s=wall,
            tokens_per_s=generated / wall if wall > 0 and generated else None,
            finish_reason=choice.get("finish_reason"),
            extra={"attempts": attempts, "server_model": reply.get("model"), "id": reply.get("id")},
        )
