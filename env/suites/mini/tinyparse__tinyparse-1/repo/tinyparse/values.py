"""Converters from configuration text to Python values, shared by the INI getters."""

from tinyparse.errors import ParseError

TRUE_WORDS = frozenset({"1", "yes", "true", "on"})
FALSE_WORDS = frozenset({"0", "no", "false", "off"})


def to_bool(text):
    """Interpret a configuration word as a boolean.

    Accepts ``1/yes/true/on`` and ``0/no/false/off`` in any letter case, with
    surrounding whitespace ignored. Anything else raises ``ParseError``.
    """
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ParseError(f"not a boolean: {text!r}")


def to_int(text):
    """Parse an integer; ``0x``/``0o``/``0b`` prefixes and ``_`` separators are allowed."""
    try:
        return int(text.strip(), 0)
    except ValueError:
        raise ParseError(f"not an integer: {text!r}") from None


def to_float(text):
    """Parse a float (``1.5``, ``2e3``, ``inf``)."""
    try:
        return float(text.strip())
    except ValueError:
        raise ParseError(f"not a number: {text!r}") from None


def to_list(text, separator=","):
    """Split a list value on ``separator`` and on newlines, dropping empty items."""
    items = []
    for line in text.splitlines():
        items.extend(part.strip() for part in line.split(separator))
    return [item for item in items if item]
