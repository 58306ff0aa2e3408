"""Model backends behind one small protocol, and a registry that builds them by name.

The protocol
------------
A backend is anything with these two methods (structural typing; no base class needed)::

    reset(*, seed: int) -> None
        Start a new episode: drop any per-episode state (an hf backend's EvictableCache, a turn counter)
        and seed the sampler so the same seed reproduces the same completions.

    complete(messages: list[Message], *, max_new_tokens: int | None = None) -> Completion
        Continue the conversation: ``messages`` is the WHOLE conversation so far (system, user, then
        alternating assistant/user), always ending with a user message. Return the next assistant turn's
        raw text (including any ``<think>`` block) and its telemetry. ``max_new_tokens`` caps this turn's
        generation (None, the default: the backend's own cap if one is configured, else only the context
        window, as in DeepSWE's evaluation, which sent no max_tokens); a backend must also keep prompt +
        generation within its own context window (configure it with the same value as
        ``AgentConfig.max_context_tokens``) and report ``finish_reason="length"`` when it stopped early. When
        the prompt alone already fills the window, return at once (``text=""``, ``prompt_tokens`` = its
        length, ``tokens_generated=0``): the loop then ends the episode as ``context_limit`` without acting,
        like R2E's pre-call token check.
        Telemetry fields a backend cannot measure keep their defaults (see records.Completion).

A backend that keeps a KV cache may also have ``retention() -> dict | None``: the retention map of its final
cache (``nexus.retention_runs``), read once after the episode's last call (``EpisodeResult.retention``).

Guarantees the agent loop (agent_runner.agent) gives a backend, so a stateful backend can work out which
messages are new since its last call without re-tokenising history:

* messages are never edited once sent; each call's list extends the previous call's list;
* after a call, the next call's list is the previous list + ONE assistant message + ONE user message;
* the assistant message is the backend's own ``Completion.text`` verbatim, unless the agent config asks for
  R2E's re-synthesised history (``history="resynthesized"``) or a caller's ``intervene`` hook replaced the
  action; in those cases its content differs from what was generated and a true-eviction backend must
  notice (compare with its own last text) and decide how to reconcile its cache.

Errors: a backend raises :class:`ModelError` (with a message naming the backend and the cause) for
anything that ends the episode on the model side (endpoint down after retries, out of memory, script
exhausted); the loop records it as exit status ``infra_failure``. Bad configuration should raise
``ValueError`` from the constructor, before any container starts.

Registry: ``make_backend("openai", base_url=..., model=...)``. Entries are ``module:Class`` import paths,
imported lazily so ``hf`` (torch/transformers) costs nothing unless asked for.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, runtime_checkable

from agent_runner.records import Completion, Message


class ModelError(RuntimeError):
    """A backend could not produce a completion; ends the episode as ``infra_failure``."""


@runtime_checkable
class Model(Protocol):
    def reset(self, *, seed: int) -> None: ...

    def complete(self, messages: list[Message], *, max_new_tokens: int | None = None) -> Completion: ...


BACKENDS: dict[str, str] = {
    "expert": "agent_runner.backends.expert:ExpertModel",
    "hf": "agent_runner.backends.hf:HFBackend",
    "openai": "agent_runner.backends.openai:OpenAIBackend",
    "oracle": "agent_runner.backends.oracle:OracleModel",
    "scripted": "agent_runner.backends.scripted:ScriptedModel",
}


def backend_class(name: str) -> type:
    """The class registered under ``name``; ValueError naming the choices if unknown or not importable."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {sorted(BACKENDS)}")
    module_name, _, class_name = BACKENDS[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise  # the backend exists but one of ITS imports is missing: show the real cause
        raise ValueError(
            f"backend {name!r} is registered as {BACKENDS[name]} but {module_name} does not exist "
            "(an incomplete installation? reinstall with `pip install -e .`)"
        ) from exc
    try:
        return getattr(module, class_name)
    except AttributeError as exc:
        raise ValueError(f"backend {name!r}: {module_name} has no class {class_name!r}") from exc


def stand_in_completion(text: str, messages: list[Message]) -> Completion:
    """A model stand-in's completion (oracle, expert): telemetry in whitespace words, since no tokenizer ran."""
    prompt = sum(len(m.content.split()) for m in messages)
    generated = len(text.split())
    return Completion(
        text=text,
        tokens_generated=generated,
        prompt_tokens=prompt,
        tokens_appended=prompt,
        logical_length=prompt + generated,
        finish_reason="stop",
    )


def make_backend(name: str, **kwargs: Any) -> Model:
    """Build the backend registered under ``name`` with its constructor's keyword arguments."""
    return backend_class(name)(**kwargs)


__all__ = ["BACKENDS", "Model", "ModelError", "backend_class", "make_backend", "stand_in_completion"]
