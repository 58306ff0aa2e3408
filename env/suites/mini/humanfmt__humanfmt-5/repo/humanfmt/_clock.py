"""Time helpers: every comparison in humanfmt happens between aware UTC datetimes."""

from datetime import datetime, timezone


def utcnow():
    """The current time as an aware UTC datetime."""
    return datetime.now(timezone.utc)


def as_utc(moment):
    """Express ``moment`` as an aware UTC datetime.

    Aware datetimes are converted (the instant is kept, the wall time changes);
    naive datetimes are taken to be in UTC already.
    """
    if moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)
