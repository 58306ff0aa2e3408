"""Schema maintenance without writing an alembic.ini.

    python -m db upgrade [URL]          # migrate URL (default: $NEXUS_EVAL_DB / ./runs/nexus-eval.db) to head
    python -m db current [URL]          # print the database's revision and the newest one shipped (creates nothing)
    python -m db revision "add a column"  # after editing db/models.py: autogenerate the next revision

``revision`` diffs the models against a scratch SQLite database at head, writes
``db/migrations/versions/<NNNN>_<slug>.py``, and prints its path; review it (and write PostgreSQL-specific
bits by hand) before committing.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from db.availability import DatabaseUnavailable, check_reachable, require_existing
from db.connection import (
    MIGRATIONS_DIR,
    _alembic_config,
    current_revision,
    default_url,
    head_revision,
    migrate,
    sqlite_url,
)


def _next_rev_id() -> str:
    numbers = [
        int(m.group(1)) for p in (MIGRATIONS_DIR / "versions").glob("*.py") if (m := re.match(r"(\d+)_", p.name))
    ]
    return f"{max(numbers, default=0) + 1:04d}"


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"upgrade", "current", "revision"}:
        print(__doc__.strip())
        return 2
    verb, rest = argv[0], argv[1:]
    if verb == "upgrade":
        try:
            check_reachable(rest[0] if rest else default_url())
        except DatabaseUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        migrate(rest[0] if rest else None)
        print(f"at {current_revision(rest[0] if rest else None)}")
    elif verb == "current":  # reads: never creates the database (only `upgrade` does)
        url = rest[0] if rest else default_url()
        try:
            require_existing(url)
            check_reachable(url)
        except DatabaseUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"database: {current_revision(url)}  newest: {head_revision()}")
    else:
        from alembic import command

        if not rest:
            print('usage: python -m db revision "what changed"')
            return 2
        with tempfile.TemporaryDirectory() as scratch:
            url = sqlite_url(Path(scratch) / "scratch.db")
            migrate(url)
            script = command.revision(_alembic_config(url), message=rest[0], autogenerate=True, rev_id=_next_rev_id())
        print(getattr(script, "path", script))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
