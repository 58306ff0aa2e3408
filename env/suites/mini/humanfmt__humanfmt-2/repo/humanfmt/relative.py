"""Relative times: ``"5 minutes ago"``, ``"in 2 hours"``, ``"yesterday"``."""

from humanfmt._clock import as_utc, utcnow
from humanfmt._rounding import round_half_up

# (name, seconds), largest first; months and years are the usual 30 and 365 days.
_UNITS = (
    ("year", 365 * 86400),
    ("month", 30 * 86400),
    ("day", 86400),
    ("hour", 3600),
    ("minute", 60),
    ("second", 1),
)
JUST_NOW_SECONDS = 10


def _coarse(seconds):
    """The largest unit that fits, rounded: ``5400 -> "2 hours"``."""
    for name, size in _UNITS:
        if seconds >= size:
            count = round_half_up(seconds / size)
            return f"{count} {name}{'' if count == 1 else 's'}"
    return "0 seconds"


def naturaltime(moment, now=None):
    """Describe ``moment`` relative to ``now`` (default: the current time).

    Both may be naive (taken as UTC) or aware in any time zone; the instants are
    compared, not the wall-clock readings.
    """
    reference = as_utc(now) if now is not None else utcnow()
    seconds = (reference - as_utc(moment)).total_seconds()
    if abs(seconds) < JUST_NOW_SECONDS:
        return "just now"
    text = _coarse(abs(seconds))
    return f"{text} ago" if seconds > 0 else f"in {text}"


def naturalday(day, today):
    """``"today"``, ``"yesterday"``, ``"tomorrow"``, or the ISO date for other days."""
    offset = (day - today).days
    if offset == 0:
        return "today"
    if offset == -1:
        return "yesterday"
    if offset == 1:
        return "tomorrow"
    return day.isoformat()


__all__ = ["naturalday", "naturaltime"]
