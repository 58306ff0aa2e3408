"""Declarations of what a command line may contain."""

from dataclasses import dataclass, field

ACTIONS = ("store", "store_true", "count", "append")


@dataclass
class Option:
    """An option such as ``-o FILE`` / ``--output FILE``.

    ``action``:
      * ``store``: keep the (converted) value; the default is ``default``.
      * ``store_true``: a flag; ``True`` when given.
      * ``count``: a flag counted each time it is given (``-vvv`` is 3).
      * ``append``: may repeat; values are collected into a list that starts as a
        copy of ``default`` (or empty).

    ``type`` converts the text of a value (``int``, ``float``, ``bool`` or any
    callable); ``choices`` lists the allowed *converted* values.
    """

    flags: tuple
    dest: str
    action: str = "store"
    type: object = str
    default: object = None
    choices: tuple = None
    required: bool = False
    help: str = ""
    metavar: str = None

    def __post_init__(self):
        if self.action not in ACTIONS:
            raise ValueError(f"unknown action {self.action!r}; expected one of {ACTIONS}")
        for flag in self.flags:
            if not flag.startswith("-") or flag in ("-", "--"):
                raise ValueError(f"option flags must start with '-': {flag!r}")
            if not flag.startswith("--") and len(flag) != 2:
                raise ValueError(f"short flags are one letter: {flag!r}")
        if self.choices is not None:
            self.choices = tuple(self.choices)

    @property
    def takes_value(self):
        return self.action in ("store", "append")

    @property
    def display(self):
        """The name used in messages: the longest flag."""
        return max(self.flags, key=len)


@dataclass
class Argument:
    """A positional argument. ``optional`` ones may be left out (then ``default``)."""

    name: str
    type: object = str
    choices: tuple = None
    optional: bool = False
    default: object = None
    help: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.choices is not None:
            self.choices = tuple(self.choices)

    @property
    def display(self):
        return self.name


def dest_for(flags):
    """``("-n", "--dry-run") -> "dry_run"``: the longest flag, dashes stripped and inner ones underscored."""
    longest = max(flags, key=len)
    return longest.lstrip("-").replace("-", "_")
