"""The parser: turns ``argv`` into a ``Namespace`` according to declared options and arguments."""

import sys

from argkit.convert import check_choice, convert
from argkit.errors import ArgError
from argkit.help import render_help
from argkit.spec import Argument, Option, dest_for


class Namespace:
    """Parsed values as attributes; ``vars(ns)`` gives the dictionary."""

    def __init__(self, **values):
        self.__dict__.update(values)

    def __repr__(self):
        inner = ", ".join(f"{key}={value!r}" for key, value in sorted(vars(self).items()))
        return f"Namespace({inner})"

    def __eq__(self, other):
        return isinstance(other, Namespace) and vars(self) == vars(other)


class Parser:
    """A command-line parser for one program.

    >>> p = Parser("greet")
    >>> _ = p.add_option("-n", "--times", type=int, default=1)
    >>> _ = p.add_argument("name")
    >>> p.parse(["-n", "2", "Ada"])
    Namespace(help=False, name='Ada', times=2)
    """

    def __init__(self, prog, description=""):
        self.prog = prog
        self.description = description
        self.options = []
        self.arguments = []
        self._flags = {}
        self.add_option("-h", "--help", action="store_true", help="show this help and exit")

    def add_option(self, *flags, dest=None, **settings):
        option = Option(flags=tuple(flags), dest=dest or dest_for(flags), **settings)
        for flag in option.flags:
            if flag in self._flags:
                raise ValueError(f"duplicate option flag {flag!r}")
            self._flags[flag] = option
        self.options.append(option)
        return option

    def add_argument(self, name, **settings):
        argument = Argument(name=name, **settings)
        if self.arguments and self.arguments[-1].optional and not argument.optional:
            raise ValueError("a required argument cannot follow an optional one")
        self.arguments.append(argument)
        return argument

    def format_help(self, width=80):
        return render_help(self, width)

    # -- parsing -----------------------------------------------------------------------

    def parse(self, argv=None):
        """Parse ``argv`` (default ``sys.argv[1:]``); raises ``ArgError`` on bad input."""
        argv = list(sys.argv[1:] if argv is None else argv)
        values = self._initial_values()
        positionals = []
        seen = set()
        only_positionals = False
        index = 0
        while index < len(argv):
            arg = argv[index]
            index += 1
            if only_positionals or not self._is_option(arg):
                positionals.append(arg)
                continue
            if arg == "--":
                only_positionals = True
                continue
            if arg.startswith("--"):
                flag, has_inline, inline = arg.partition("=")
                option = self._lookup(flag)
                if not has_inline:
                    inline = None
                elif not option.takes_value:
                    raise ArgError(f"{flag}: does not take a value")
            else:
                flag, rest = arg[:2], arg[2:]
                option = self._lookup(flag)
                inline = None
                if option.takes_value:
                    inline = rest or None
                else:
                    # A group of short flags: "-vvq".
                    for letter in rest:
                        self._set_flag(self._lookup("-" + letter), values, seen)
            if option.takes_value:
                if inline is None:
                    if index >= len(argv) or self._is_option(argv[index]):
                        raise ArgError(f"{option.display}: expected a value")
                    inline = argv[index]
                    index += 1
                self._store(option, inline, values)
                seen.add(option.dest)
            else:
                self._set_flag(option, values, seen)
        self._bind_arguments(positionals, values)
        missing = [o.display for o in self.options if o.required and o.dest not in seen]
        if missing:
            raise ArgError(f"missing required option(s): {', '.join(missing)}")
        return Namespace(**values)

    def _initial_values(self):
        values = {}
        for option in self.options:
            if option.action == "count":
                values[option.dest] = option.default or 0
            elif option.action == "store_true":
                values[option.dest] = bool(option.default)
            elif option.action == "append":
                values[option.dest] = list(option.default or [])
            else:
                values[option.dest] = option.default
        return values

    def _is_option(self, arg):
        return arg.startswith("-") and arg != "-"

    def _lookup(self, flag):
        try:
            return self._flags[flag]
        except KeyError:
            raise ArgError(f"unknown option {flag}") from None

    def _set_flag(self, option, values, seen):
        if option.takes_value:
            raise ArgError(f"{option.display}: expected a value")
        if option.action == "count":
            values[option.dest] += 1
        else:
            values[option.dest] = True
        seen.add(option.dest)

    def _value(self, spec, text):
        """Convert the text of a value, then validate the converted value against ``choices``."""
        value = convert(text, spec.type, spec.display)
        check_choice(value, spec.choices, spec.display)
        return value

    def _store(self, option, text, values):
        value = self._value(option, text)
        if option.action == "append":
            values[option.dest].append(value)
        else:
            values[option.dest] = value

    def _bind_arguments(self, positionals, values):
        required = [a for a in self.arguments if not a.optional]
        if len(positionals) < len(required):
            names = ", ".join(a.name for a in required[len(positionals) :])
            raise ArgError(f"missing argument(s): {names}")
        if len(positionals) > len(self.arguments):
            extra = " ".join(positionals[len(self.arguments) :])
            raise ArgError(f"unexpected argument(s): {extra}")
        for position, argument in enumerate(self.arguments):
            if position < len(positionals):
                values[argument.name] = self._value(argument, positionals[position])
            else:
                values[argument.name] = argument.default
