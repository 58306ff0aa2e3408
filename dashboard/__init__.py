"""A browser view of the results database: ``nexus-eval serve`` (FastAPI, server-rendered pages) and
``nexus-eval report`` (one self-contained HTML file).

- ``dashboard.app``: ``create_app(db_url, token=..., public=...)``, the token guard, error pages, the two write
  actions (cancel, rerun failed);
- ``dashboard.pages``: the read-only pages and downloads; ``dashboard.queries`` (jobs, compare, workers),
  ``dashboard.episode_queries`` (one episode) and ``dashboard.replay_queries`` (its replays): what they read, as
  plain objects;
- ``dashboard.charts``: matplotlib figures as inline SVG; ``dashboard.render``: the Jinja2 templates;
- ``dashboard.readonly``: the read-only engine the pages read through; ``dashboard.report``: the HTML report.

Depends on ``db`` and ``results.compare`` (plus ``workers.celery_tasks`` inside the write actions, as the CLI's
``cancel`` / ``rerun --failed``); nothing imports it but the CLI. Pages and rules: docs/dashboard.md.
"""
