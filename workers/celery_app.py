"""What ``celery -A workers.celery_app worker`` loads: the app, built from the environment's settings.

The celery command line finds an app by module path only, so this one module builds it at import; everything
else asks :func:`jobs.queue.get_app`.
"""

from jobs.queue import get_app

app = get_app()
