"""Byte sizes: ``naturalsize(3_500_000) -> "3.5 MB"``."""

from humanfmt._rounding import round_half_up

DECIMAL_UNITS = ("kB", "MB", "GB", "TB", "PB", "EB")
BINARY_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def naturalsize(value, binary=False, ndigits=1):
    """Format a byte count with the largest unit that keeps the number below 1000 (1024).

    Decimal (SI) units by default, IEC units with ``binary=True``. Counts below
    one unit are shown in bytes: ``"1 byte"``, ``"512 bytes"``.
    """
    base = 1024 if binary else 1000
    units = BINARY_UNITS if binary else DECIMAL_UNITS
    sign = "-" if value < 0 else ""
    size = abs(value)
    if size < base:
        count = int(size)
        return f"{sign}{count} {'byte' if count == 1 else 'bytes'}"
    exponent = 0
    size /= base
    while size >= base and exponent < len(units) - 1:
        size /= base
        exponent += 1
    shown = round_half_up(size, ndigits)
    return f"{sign}{shown:.{ndigits}f} {units[exponent]}"
