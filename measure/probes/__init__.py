"""Quality probes: does a method's kept cache still hold what a later question needs? (docs/probes.md)

    from measure.probes import ProbeSettings, run_probes
    for result in run_probes(host, ProbeSettings(model="smollm2-135m", samples=10)):
        ...  # one ProbeResult per (probe, variant, scope, protocol, density, sample)

The settings import without torch (the CLI's --help and the dashboard read them); the runner, which needs
torch, is imported on first use of its names.
"""

from __future__ import annotations

from typing import Any

from measure.probes.settings import PROBES, SINGLE_PREFILL, ProbeResult, ProbeSettings, parse_variant
from nexus.lazy import lazy_attribute

_LAZY = {
    "SOURCES": "measure.probes.corpus",
    "fingerprint": "measure.probes.corpus",
    "check_probe_settings": "measure.probes.runner",
    "eviction_config": "measure.probes.runner",
    "run_probes": "measure.probes.runner",
}


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _LAZY, name, globals())


__all__ = ["PROBES", "SINGLE_PREFILL", "ProbeResult", "ProbeSettings", "parse_variant", *_LAZY]
