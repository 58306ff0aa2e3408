"""Alembic environment for nexus-eval's schema (run through db.connection.migrate, not by hand).

``migrate()`` passes an open connection in ``config.attributes["connection"]``; when that is absent (an
``alembic -c`` run by a developer) the URL comes from the ``sqlalchemy.url`` option or ``$NEXUS_EVAL_DB``.
"""

from __future__ import annotations

from alembic import context

import db.measure_models  # noqa: F401  (registers the replay and probe tables on Base.metadata)
from db.connection import default_url, make_engine
from db.models import Base

config = context.config
# every table: db.models' own and db.measure_models' (imported above), all on the one Base
target_metadata = Base.metadata


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url") or default_url())
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; use db.migrate(url)")
run_migrations_online()
