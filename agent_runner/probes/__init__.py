"""Quality probes: does a method's kept cache still hold what a later question needs? (docs/probes.md)

    from agent_runner.probes import ProbeSettings, run_probes
    for result in run_probes(host, ProbeSettings(model="smollm2-135m", samples=10)):
        ...  # one ProbeResult per (probe, variant, scope, protocol, density, sample)

The settings import without torch (the CLI's --help and the dashboard read them); the runner, which needs
torch, is imported on first use of its names.
"""

from __future__ import annotations

import importlib
from typing import Any

from agent_runner.probes.settings import PROBES, SINGLE_PREFILL, ProbeResult, ProbeSettings, parse_variant

_LAZY = {
    "SOURCES": "agent_runner.probes.corpus",
    "fingerprint": "agent_runner.probes.corpus",
    "check_settings": "agent_runner.probes.runner",
    "eviction_config": "agent_runner.probes.runner",
    "run_probes": "agent_runner.probes.runner",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'agent_runner.probes' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


__all__ = ["PROBES", "SINGLE_PREFILL", "ProbeResult", "ProbeSettings", "parse_variant", *_LAZY]
