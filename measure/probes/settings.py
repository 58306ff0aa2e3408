"""What a probe run measures (``ProbeSettings``) and what one sample of one cell measured (``ProbeResult``).

Probes (see docs/probes.md):
- ``needle``: a fact sentence at a depth of 10-90% of real filler, the question after it in the same message
  (single turn: the question sits in the observation window when the cache evicts; the easy case).
- ``later_turn``: an agent's history. A tool observation (a viewed file) holds the fact; that turn ends and the
  cache evicts under the protocol; the agent replies with something neutral; the question (quote the line
  exactly, as a ``str_replace`` old string must) comes in a later turn. Scored on the answer and on the NLL of
  the exact line. Under ``true_eviction`` the question meets what the earlier eviction left; under
  ``full_context`` the whole history is re-prefilled with the question and compressed once.
- ``nll``: teacher-forced NLL of a document's continuation after its compressed context.

A cell is (probe, variant, scope, protocol, density); samples are paired across cells by their index, so a
sample means the same text in every cell of a run.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent_runner.config import PROTOCOLS, SMOLLM2, check_protocol
from agent_runner.measuring_dtypes import REFERENCE_DTYPE, check_measuring_dtype
from nexus.config import EVICTION_DEFAULTS
from nexus.methods import SCOPES, check_method, check_scope
from nexus.presets import PRESETS

PROBES: tuple[str, ...] = ("needle", "later_turn", "nll")
#: protocol label of the probes that run one prefill (needle, nll): turns do not exist there
SINGLE_PREFILL = "single_prefill"
_VARIANT = re.compile(r"^(?P<method>[a-z_0-9]+)(?:\((?P<params>[^()]*)\))?$")


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """'nexus' -> ('nexus', {}); 'nexus(lam=0, block_size=16)' -> ('nexus', {'lam': 0, 'block_size': 16}).

    A variant is a method plus settings that override the preset's (its own hyperparameters or the shared
    block_size / window / slack_blocks). ValueError names what is wrong."""
    match = _VARIANT.match(text.replace(" ", ""))
    if not match:
        raise ValueError(f"variant {text!r}: write a method name, optionally with settings: nexus(lam=0,window=32)")
    method = check_method(match["method"], noun="method")
    params: dict[str, Any] = {}
    for item in filter(None, (match["params"] or "").split(",")):
        key, sep, raw = item.partition("=")
        if not sep or not key or not raw:
            raise ValueError(f"variant {text!r}: {item!r} is not key=value")
        params[key] = _value(raw)
    return method, params


def _value(raw: str) -> Any:
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(raw.lower(), raw)


class ProbeSettings(BaseModel):
    """One probe run: every probe x variant x scope x protocol x density cell, ``samples`` samples each."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(
        SMOLLM2, description="'smollm2-135m' (a real trained model), 'tiny' (random weights), an HF id or a path"
    )
    probes: tuple[str, ...] = Field(PROBES, min_length=1)
    variants: tuple[str, ...] = Field(("dense", "snapkv", "streaming_llm", "nexus", "ada_nexus"), min_length=1)
    scopes: tuple[str, ...] = Field(("prefill_only",), min_length=1)
    protocols: tuple[str, ...] = Field(PROTOCOLS, min_length=1, description="later_turn only")
    densities: tuple[float, ...] = Field((EVICTION_DEFAULTS["density"],), min_length=1)
    samples: int = Field(10, ge=1, description="samples per cell (the same texts in every cell)")
    lengths: tuple[int, ...] = Field((1024,), min_length=1, description="filler tokens per sample")
    depths: tuple[float, ...] = Field((0.1, 0.3, 0.5, 0.7, 0.9), min_length=1)
    continuation: int = Field(128, ge=8, description="nll: scored continuation tokens per document")
    preset: str = Field("paper", description="the methods' named settings (nexus.presets)")
    seed: int = Field(0, description="texts, needles and every method's random choices")
    dtype: str = Field(
        REFERENCE_DTYPE, description="what the model measures in: float32 | bfloat16 (`probe run --dtype auto` chooses)"
    )

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        return check_measuring_dtype(value)

    @field_validator("probes")
    @classmethod
    def _probes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if name not in PROBES:
                raise ValueError(f"unknown probe {name!r}; use {', '.join(PROBES)}")
        return value

    @field_validator("variants")
    @classmethod
    def _variants(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for text in value:
            parse_variant(text)
        if len(set(value)) != len(value):
            raise ValueError("variants repeat")
        return value

    @field_validator("scopes")
    @classmethod
    def _scopes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(check_scope(s) for s in value)

    @field_validator("protocols")
    @classmethod
    def _protocols(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(check_protocol(p) for p in value)

    @field_validator("densities", "depths")
    @classmethod
    def _fractions(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if any(not 0.0 < v <= 1.0 for v in value):
            raise ValueError(f"values must be in (0, 1], got {list(value)}")
        return value

    @field_validator("lengths")
    @classmethod
    def _lengths(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(v < 256 for v in value):
            raise ValueError(f"lengths must be at least 256 tokens, got {list(value)}")
        return value

    @field_validator("preset")
    @classmethod
    def _preset(cls, value: str) -> str:
        if value not in PRESETS:
            raise ValueError(f"unknown preset {value!r}; use {', '.join(PRESETS)}")
        return value

    def cells(self, probe: str) -> list[tuple[str, str, str, float]]:
        """(variant, scope, protocol, density) of every cell of `probe`, in the run's order."""
        protocols = self.protocols if probe == "later_turn" else (SINGLE_PREFILL,)
        return [(v, s, p, d) for d in self.densities for p in protocols for s in self.scopes for v in self.variants]


@dataclass
class ProbeResult:
    """One sample of one cell. `correct`: the answer held the fact (None for nll); `nll`: mean NLL per scored
    token (nll: the continuation; later_turn: the exact line); `kept_fraction`: cache tokens / logical tokens
    (mean over layers and KV heads) when the answer started. KV memory (`nexus.memory`): `kv_held_bytes`
    (valid entries x bytes per entry) and `kv_allocated_bytes` (the K/V buffers, spare capacity and ragged
    padding included) when the answer started; `kv_peak_held_bytes` and `kv_peak_allocated_bytes` the largest
    of each over the whole sample (every prefill's pre-eviction state, the reply, the scoring, the answer)."""

    probe: str
    variant: str
    scope: str
    protocol: str
    density: float
    sample: int
    source: str
    length: int
    depth: float | None
    correct: bool | None
    nll: float | None
    scored_tokens: int
    answer: str
    expected: str
    kept_fraction: float
    kv_held_bytes: int
    kv_allocated_bytes: int
    kv_peak_held_bytes: int
    kv_peak_allocated_bytes: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


__all__ = ["PROBES", "SCOPES", "SINGLE_PREFILL", "ProbeResult", "ProbeSettings", "parse_variant"]
