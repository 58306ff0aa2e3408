"""`Check`: one row of `nexus-eval doctor` and of a verb's preflight, whatever it checks.

Its own module because every family of checks (`nexus_eval.host_readiness`, `nexus_eval.service_readiness`)
makes rows and `nexus_eval.readiness` lists them: beside either it would make an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

SETUP = "nexus-eval setup"


@dataclass(frozen=True)
class Check:
    """One thing a job needs (``required``) or may use, whether it is there, and the command that fixes it.

    ``build``: ready, but an image has to be built first (`run` and `setup` do that; it takes time)."""

    name: str
    ok: bool
    required: bool
    detail: str
    fix: str = ""
    build: bool = False

    @property
    def status(self) -> str:
        if self.ok:
            return "buildable" if self.build else "ok"
        return "missing" if self.required else "optional-missing"


def few(names: list[str], n: int = 3) -> str:
    """The first ``n`` names and how many more: a row stays one line however many tasks or devices it covers."""
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")
