"""What ``celery -A workers.celery_app worker`` loads: the app, built from the environment's settings.

The celery command line finds an app by module path only, so this one module builds it at import; everything
else asks :func:`workers.app.get_app`.
"""

from workers.app import get_app

app = get_app()
