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

Where a job may send its requests and which variable's value it may send as the key is the operator's choice,
not the job's: :meth:`AllowedEndpoints.check` refuses a ``base_url`` whose host is not on the allow-list and an
``api_key_env`` that does not match it (``jobs.settings.ServiceSettings.openai_hosts`` / ``openai_key_envs``,
``$NEXUS_EVAL_OPENAI_HOSTS`` / ``$NEXUS_EVAL_OPENAI_KEY_ENVS``; defaults :data:`DEFAULT_HOSTS` and
:data:`DEFAULT_KEY_ENVS`). ``OpenAIConfig`` itself refuses what no operator can allow: a scheme other than
http/https, credentials, a query or a fragment in ``base_url``, an ``api_key_env`` that is not a plain name.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent_runner.backends import ModelError
from agent_runner.records import Completion, CompletionInfo, Message

RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}

#: the variables a job may name as ``api_key_env`` unless the operator says otherwise (names or globs)
DEFAULT_KEY_ENVS: tuple[str, ...] = ("OPENAI_API_KEY", "*_API_KEY")
#: the ``base_url`` hosts a job may send requests to unless the operator says otherwise: loopback only
DEFAULT_HOSTS: tuple[str, ...] = ("127.0.0.1", "localhost", "::1")
#: the environment variables the operator sets them by (read by ``jobs.settings.ServiceSettings.from_env``)
KEY_ENVS_VARIABLE = "NEXUS_EVAL_OPENAI_KEY_ENVS"
HOSTS_VARIABLE = "NEXUS_EVAL_OPENAI_HOSTS"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class EndpointNotAllowed(ValueError):
    """A job's endpoint that the operator's allow-lists refuse; ``field`` is the ``OpenAIConfig`` field."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


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

    @field_validator("base_url")
    @classmethod
    def _plain_url(cls, value: str) -> str:
        """http(s)://host[:port][/path] and nothing else: no credentials, no query, no fragment."""
        if any(not " " < c < "\x7f" for c in value) or "\\" in value:
            raise ValueError("must be a plain http(s) URL: ASCII without spaces, control characters or backslashes")
        try:
            parts = urlsplit(value)
            _ = parts.port  # a port that is not a number raises here
        except ValueError as exc:
            shown = "" if "@" in value else f"{value!r} "  # credentials are never echoed
            raise ValueError(f"{shown}is not a valid URL ({exc})") from None
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"{value!r} must start with http:// or https://")
        if "@" in parts.netloc:  # not echoed: it holds a password
            raise ValueError("must not carry credentials (user:password@); the key comes from api_key_env")
        if "?" in value or "#" in value:
            raise ValueError(f"{value!r} must not carry a query string or a fragment ('?', '#'); give the path only")
        if not parts.hostname:
            raise ValueError(f"{value!r} names no host")
        return value

    @field_validator("api_key_env")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(f"must be an environment variable's name (letters, digits, _), got {value!r}")
        return value

    @property
    def host(self) -> str:
        """``base_url``'s host, lower case, without the brackets of an IPv6 address."""
        return (urlsplit(self.base_url).hostname or "").lower()


def allowed_host(host: str, hosts: Sequence[str]) -> bool:
    """Whether ``host`` is on ``hosts`` (names or globs such as ``*.cluster.local``, case-insensitive)."""
    host = host.lower().strip("[]")
    return any(fnmatch.fnmatchcase(host, pattern.lower().strip("[]")) for pattern in hosts)


def allowed_key_env(name: str, key_envs: Sequence[str]) -> bool:
    """Whether the variable ``name`` is on ``key_envs`` (names or globs such as ``*_API_KEY``, case-sensitive)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in key_envs)


@dataclass(frozen=True)
class AllowedEndpoints:
    """The operator's allow-lists (``jobs.settings.ServiceSettings.openai_allowed``): which variables a job may
    name as ``api_key_env`` and which hosts its ``base_url`` may name (names or globs)."""

    key_envs: tuple[str, ...] = DEFAULT_KEY_ENVS
    hosts: tuple[str, ...] = DEFAULT_HOSTS

    def check(self, config: OpenAIConfig) -> None:
        """Refuse (:class:`EndpointNotAllowed`, a ValueError) an endpoint the operator does not allow: a
        ``base_url`` whose host is not on ``hosts``, an ``api_key_env`` not on ``key_envs``. Called where a job
        is accepted (``nexus-eval submit`` / ``run`` / ``episode``) and again in the worker before the episode
        starts, each with its own process's settings."""
        if not allowed_key_env(config.api_key_env, self.key_envs):
            raise EndpointNotAllowed(
                "api_key_env",
                f"openai.api_key_env={config.api_key_env!r} is not a variable jobs may send as the API key; "
                f"allowed: {', '.join(self.key_envs) or 'none'} (the operator's setting openai_key_envs, "
                f"${KEY_ENVS_VARIABLE})",
            )
        if not allowed_host(config.host, self.hosts):
            raise EndpointNotAllowed(
                "base_url",
                f"openai.base_url={config.base_url!r}: host {config.host!r} is not a host jobs may send requests "
                f"to; allowed: {', '.join(self.hosts) or 'none'} (the operator's setting openai_hosts, "
                f"${HOSTS_VARIABLE})",
            )


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
