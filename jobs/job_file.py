"""Job files: reading one (YAML) into the mapping ``JobSpec`` validates, the flags set over it, and the error every
bad file or spec raises (:class:`JobSpecError`, naming the file and each bad field).

A job file looks like this; every key has a default (``jobs.spec.JobSpec``'s fields), and ``examples/`` holds the
job files for the common cases, each checked by ``tests/test_examples.py``::

    name: mini-dense-vs-nexus
    model: {name: Qwen/Qwen3-0.6B, revision: main}   # default: tiny (random weights, the real Qwen3 tokenizer)
    backend: hf                      # hf | openai | oracle | expert (oracle and expert ignore the model)
    methods: [dense, snapkv, nexus]  # default: [dense, nexus]
    scopes: [prefill_only, prefill_decode]       # default: [prefill_decode]
    protocols: [true_eviction, full_context]     # default: [true_eviction]
    density: 0.2
    eviction: {block_size: 32, window: 16}   # nexus.EvictionConfig's shared fields, for every method
    preset: paper                    # paper | reference | kvcache_factory (nexus/presets.py)
    method_params: {nexus: {walk_steps: 3}, snapkv: {window: 32, kernel_size: 5}}
    seeds: [0, 1, 2]                 # each seed samples its own episode: the sampler and the eviction policy
    limits: {max_steps: 100, soft_step_limit: 40, max_context_tokens: 65536}
    sampling: {temperature: 1.0, top_p: 1.0, top_k: 0, max_new_tokens: null}  # null: no per-turn cap
    tasks: {suite: mini, ids: ["argkit__*"]}     # default: every task of mini

**Command-line flags override a file** (``nexus-eval submit -f job.yaml --density 0.1`` stores 0.1): the
CLI turns each flag it was given into one override (:func:`apply_overrides`), set on top of the file, or on
top of these defaults without a file (``JobSpec.load``). A flag never given changes nothing.

Errors are worded here once (:func:`field_errors`, :func:`plain_message`), so a file, a flag and a spec built in
code report a bad field the same way.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from agent_runner.config import PROTOCOLS

#: the job ``nexus-eval run`` submits when it is given no file (shipped in the package)
QUICK_JOB_FILE = Path(__file__).resolve().parent / "bundled" / "quick.yaml"
AGENT_CASE_JOB_FILE = Path(__file__).resolve().parent / "bundled" / "agent_case.yaml"


class JobSpecError(ValueError):
    """A bad job file or spec. ``source`` is the file (or ``<spec>``); ``errors`` are (field, message) pairs."""

    def __init__(self, source: str, errors: list[tuple[str, str]]) -> None:
        self.source = source
        self.errors = errors
        lines = [f"{source}: field '{loc}': {msg}" if loc else f"{source}: {msg}" for loc, msg in errors]
        super().__init__("\n".join(lines))


def read_job_file(path: str | Path) -> dict[str, Any]:
    """A YAML job file's mapping, not yet validated; ``JobSpecError`` names the file (and the YAML line)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise JobSpecError(str(path), [("", f"cannot read: {exc.strerror or exc}")]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise JobSpecError(str(path), [("", f"invalid YAML: {where}{problem}")]) from None
    if data is None:
        raise JobSpecError(str(path), [("", "the file is empty")])
    if not isinstance(data, dict):
        raise JobSpecError(str(path), [("", f"a job spec must be a mapping, got {type(data).__name__}")])
    return data


def apply_overrides(
    data: Mapping[str, Any], overrides: Mapping[str, Any], *, defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``data`` (a job mapping) with each override set, in order: a dotted key sets one nested field
    (``limits.max_steps``: the rest of ``limits`` stays), a plain key replaces the whole value (``methods``,
    ``model``, ``tasks``). A nested field whose parent ``data`` lacks starts from that parent in ``defaults``
    (``tasks.ids`` alone keeps the default task source). ``data`` is not changed."""
    merged = copy.deepcopy(dict(data))
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node, fallback = merged, defaults or {}
        for part in parents:
            child, fallback = node.get(part), fallback.get(part) if isinstance(fallback, Mapping) else None
            base = child if isinstance(child, dict) else fallback if isinstance(fallback, Mapping) else {}
            node[part] = child = copy.deepcopy(dict(base))
            node = child
        node[leaf] = value
    return merged


def field_errors(exc: ValidationError, *prefix: str) -> list[tuple[str, str]]:
    """pydantic's errors as ``JobSpecError``'s (field, message) pairs; ``prefix``: where the validated mapping sits
    in the job (``"openai"``)."""
    return [(_field_path((*prefix, *e["loc"])), _field_message(e)) for e in exc.errors()]


def plain_message(exc: Exception) -> str:
    """A ValueError's text, or a pydantic ValidationError's messages without pydantic's framing."""
    if isinstance(exc, ValidationError):
        return "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
    return str(exc)


def _field_path(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as the dotted field a job file writes (``limits.max_steps``)."""
    return ".".join(str(part) for part in loc if part != "[key]")


def _field_message(error: dict[str, Any]) -> str:
    """pydantic's message, made specific for the vocabulary fields (unknown method and so on)."""
    loc, kind, value = error["loc"], error["type"], error.get("input")
    if kind == "literal_error" and loc and loc[0] == "protocols":
        return f"unknown protocol {value!r}; known: {', '.join(PROTOCOLS)}"
    if loc == ("density",) and kind in ("greater_than", "less_than_equal"):
        return f"density must be in (0, 1], got {value!r}"
    if kind == "extra_forbidden":
        moved = {"seed": "a job's seeds are its top-level 'seeds'", "max_new_tokens": "use sampling.max_new_tokens"}
        hint = f": {moved[loc[-1]]}" if loc[0] == "limits" and loc[-1] in moved else ""
        return f"unknown field {loc[-1]!r}{hint}"
    message = error["msg"].removeprefix("Value error, ")
    return f"{message} (got {value!r})" if kind not in ("missing", "value_error") and value is not None else message
