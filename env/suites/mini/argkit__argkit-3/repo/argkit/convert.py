"""Turning the text of a value into a Python value, and validating it."""

from argkit.errors import ArgError

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def parse_bool(text):
    """``yes/true/on/1`` and ``no/false/off/0``, any case."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"not a boolean: {text!r}")


def type_name(target):
    return getattr(target, "__name__", repr(target))


def convert(text, target, name):
    """Apply the declared ``type`` to the raw text of a value.

    ``bool`` gets word parsing (``bool("no")`` would be ``True``); any other
    callable is called with the text. Failures become an ``ArgError`` naming the
    option or argument.
    """
    if target is bool:
        target = parse_bool
    try:
        return target(text)
    except (TypeError, ValueError):
        raise ArgError(f"{name}: invalid {type_name(target)} value: {text!r}") from None


def check_choice(value, choices, name):
    """Reject ``value`` unless it is one of ``choices`` (``None`` allows anything)."""
    if choices is None or value in choices:
        return
    allowed = ", ".join(str(choice) for choice in choices)
    raise ArgError(f"{name}: invalid choice {value!r} (choose from {allowed})")
