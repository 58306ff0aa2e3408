"""CLI verbs for the service area (filled in by its issue)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Attach this area's verbs to the root app."""
