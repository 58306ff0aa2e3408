"""CLI verbs for the nexus library demo (filled in by the nexus issue)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Attach this area's verbs to the root app."""
