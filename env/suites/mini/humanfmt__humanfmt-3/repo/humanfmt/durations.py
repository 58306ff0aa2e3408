"""Durations: ``precisedelta(3725) -> "1 hour 2 minutes"``."""

from datetime import timedelta

_UNITS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def _plural(count, name):
    return f"{count} {name}{'' if count == 1 else 's'}"


def _magnitude(delta):
    """``(days, seconds)`` of the length of ``delta``, ignoring its sign and microseconds."""
    length = abs(delta)
    return length.days, length.seconds


def precisedelta(delta, max_units=2):
    """Spell out a duration with up to ``max_units`` units, largest first.

    ``delta`` is a ``timedelta`` or a number of seconds. Zero-valued units are
    skipped (``"1 day 5 seconds"``); negative durations get a leading ``"-"``;
    sub-second parts are dropped.
    """
    if not isinstance(delta, timedelta):
        delta = timedelta(seconds=delta)
    days, seconds = _magnitude(delta)
    remaining = days * 86400 + seconds
    parts = []
    for name, size in _UNITS:
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(_plural(count, name))
    if not parts:
        return "0 seconds"
    sign = "-" if delta < timedelta(0) else ""
    return sign + " ".join(parts[:max_units])
