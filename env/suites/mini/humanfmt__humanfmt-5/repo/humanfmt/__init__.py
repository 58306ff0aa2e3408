"""humanfmt: human-friendly formatting of numbers, byte sizes, durations and relative times."""

from humanfmt.durations import precisedelta
from humanfmt.numbers import intcomma, ordinal, percent
from humanfmt.relative import naturalday, naturaltime
from humanfmt.sizes import naturalsize

__all__ = [
    "intcomma",
    "naturalday",
    "naturalsize",
    "naturaltime",
    "ordinal",
    "percent",
    "precisedelta",
]

__version__ = "1.2.0"
