"""The settings of the backends that a job file names: plain pydantic models and the operator's allow-lists, with
no backend code behind them, so a config (``agent_runner.config``, ``jobs.spec``) reads them without loading a
backend, a sandbox or a grader. The backends themselves (``agent_runner.backends.openai``, ``.expert``) import
them from here.

Where a job may send its requests and which variable's value it may send as the key is the operator's choice,
not the job's: :meth:`AllowedEndpoints.check` refuses a ``base_url`` whose host is not on the allow-list and an
``api_key_env`` that does not match it (``jobs.settings.ServiceSettings.openai_hosts`` / ``openai_key_envs``,
``$NEXUS_EVAL_OPENAI_HOSTS`` / ``$NEXUS_EVAL_OPENAI_KEY_ENVS``; defaults :data:`DEFAULT_HOSTS` and
:data:`DEFAULT_KEY_ENVS`). ``OpenAIConfig`` itself refuses what no operator can allow: a scheme other than
http/https, credentials, a query or a fragment in ``base_url``, an ``api_key_env`` that is not a plain name.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

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
            what = f"openai.api_key_env={config.api_key_env!r} is not a variable jobs may send as the API key"
            raise _refusal("api_key_env", what, self.key_envs, "openai_key_envs", KEY_ENVS_VARIABLE)
        if not allowed_host(config.host, self.hosts):
            what = f"openai.base_url={config.base_url!r}: host {config.host!r} is not a host jobs may send requests to"
            raise _refusal("base_url", what, self.hosts, "openai_hosts", HOSTS_VARIABLE)


def _refusal(field: str, what: str, allowed: tuple[str, ...], setting: str, variable: str) -> EndpointNotAllowed:
    """The refusal of one endpoint field: what is wrong, then what the operator allows and where that is set."""
    where = f"the operator's setting {setting}, ${variable}"
    return EndpointNotAllowed(field, f"{what}; allowed: {', '.join(allowed) or 'none'} ({where})")


class ExpertConfig(BaseModel):
    """How much the expert explores before it reproduces and edits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    explore_chars: int = Field(
        0, ge=0, description="view related files until the observations total this many characters (0: none)"
    )
    max_chars: int = Field(
        20000, gt=0, description="never add an exploration view that would push the observations past this"
    )
