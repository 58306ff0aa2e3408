"""Number formatting: thousands separators, ordinals and percentages."""

from humanfmt._rounding import round_half_up


def _group(digits, sep):
    """Insert ``sep`` every three digits from the right: ``"1234567" -> "1,234,567"``."""
    groups = []
    while len(digits) > 3:
        groups.insert(0, digits[-3:])
        digits = digits[:-3]
    groups.insert(0, digits)
    return sep.join(groups)


def intcomma(value, ndigits=None, sep=","):
    """Format a number with thousands separators.

    With ``ndigits`` the value is first rounded (half away from zero) and shown
    with exactly that many decimals; without it, integers are shown as-is and
    floats with Python's shortest representation.
    """
    if ndigits is not None:
        rounded = round_half_up(value, ndigits)
        text = f"{abs(rounded):.{ndigits}f}"
        negative = rounded < 0
    else:
        text = str(abs(value))
        negative = value < 0
    whole, dot, fraction = text.partition(".")
    return ("-" if negative else "") + _group(whole, sep) + dot + fraction


def ordinal(number):
    """``1 -> "1st"``, ``2 -> "2nd"``, ``11 -> "11th"``, ``23 -> "23rd"``."""
    number = int(number)
    if abs(number) % 100 in (11, 12, 13):
        suffix = "th"
    else:
        suffix = {1: "st", 2: "nd", 3: "rd"}.get(abs(number) % 10, "th")
    return f"{number}{suffix}"


def percent(fraction, ndigits=0):
    """``0.256 -> "26%"``; ``percent(0.2561, 1) -> "25.6%"``."""
    return intcomma(fraction * 100, ndigits=ndigits) + "%"
