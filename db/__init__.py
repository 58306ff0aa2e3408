"""nexus-eval's result store: SQLAlchemy 2 models, Alembic migrations, and a repository API.

Entry points:
- :func:`connect` / :func:`migrate` (``db.connection``): open a database by URL (SQLite file by default,
  ``$NEXUS_EVAL_DB`` or ``./runs/nexus-eval.db``; PostgreSQL via ``postgresql+psycopg://``), migrating it
  to the newest schema through the Alembic API: for the verbs that store new work.
- ``db.availability.open_existing`` opens one that must already exist at the newest schema and never creates or
  migrates anything (every verb that reads); ``DatabaseUnavailable`` (missing, down, another schema) says which,
  with the URL masked and what to do.
- ``db.models``: ``Job``, ``Episode``, ``Turn`` and the status words; ``db.measure_models``: replays, probe runs.
- ``db.job_rows``: create jobs and fan out their episodes, find, list, summarize and cancel jobs.
- ``db.store``: claim/finish/grade episodes idempotently (``db.claims``, ``db.finishing``), read what a job ran or
  measured, reruns.
- ``db.probes``: quality-probe runs and their results (``nexus-eval probe run``).

This package knows nothing about Docker, models or Celery.
"""

from db.connection import Database, connect, default_url, make_engine, migrate, sqlite_url
from db.models import Episode, EpisodeStatus, Job, JobStatus, Turn

__all__ = [
    "Database",
    "Episode",
    "EpisodeStatus",
    "Job",
    "JobStatus",
    "Turn",
    "connect",
    "default_url",
    "make_engine",
    "migrate",
    "sqlite_url",
]
