"""Rounding shared by every formatter.

Python's ``round`` uses banker's rounding (``round(2.5) == 2``), which surprises
people reading reports, so humanfmt rounds half away from zero everywhere.
"""

from decimal import ROUND_HALF_UP, Decimal


def round_half_up(value, ndigits=0):
    """Round ``value`` to ``ndigits`` decimals, halves away from zero.

    ``round_half_up(2.5) == 3`` and ``round_half_up(-2.5) == -3``. The value is
    rounded from its shortest decimal representation, so ``1.005`` rounds to
    ``1.01`` rather than to ``1.0`` as its binary value would suggest.
    Returns an ``int`` when ``ndigits`` is 0, a ``float`` otherwise.
    """
    exponent = Decimal(1).scaleb(-ndigits)
    rounded = Decimal(repr(float(value))).quantize(exponent, rounding=ROUND_HALF_UP)
    return int(rounded) if ndigits == 0 else float(rounded)
