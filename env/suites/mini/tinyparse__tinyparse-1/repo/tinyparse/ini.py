"""A small INI reader.

Format:

* ``[section]`` headers; keys before the first header live in the ``DEFAULT``
  section, whose keys every other section inherits.
* ``key = value`` pairs; keys are case-insensitive (stored lower-cased), values
  keep their case and are stripped of surrounding whitespace.
* Lines starting with ``#`` or ``;`` are comments.
* An indented line continues the previous value (joined with a newline).
"""

from tinyparse import values
from tinyparse.errors import ParseError

DEFAULT = "DEFAULT"
_MISSING = object()


def parse_ini(text):
    """Parse INI text into ``{section: {key: value}}``; the ``DEFAULT`` section is always present."""
    sections = {DEFAULT: {}}
    current = DEFAULT
    last_key = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if raw[:1].isspace() and last_key is not None:
            sections[current][last_key] += "\n" + line
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise ParseError("unclosed section header", line=number)
            current = line[1:-1].strip()
            if not current:
                raise ParseError("empty section name", line=number)
            sections.setdefault(current, {})
            last_key = None
            continue
        if "=" not in line:
            raise ParseError(f"expected 'key = value', got {line!r}", line=number)
        key, value = line.split("=", 1)
        key = key.strip().lower()
        if not key:
            raise ParseError("missing key before '='", line=number)
        sections[current][key] = value.strip()
        last_key = key
    return sections


class IniFile:
    """A parsed INI document with typed getters."""

    def __init__(self, sections):
        self._sections = sections

    @classmethod
    def from_string(cls, text):
        return cls(parse_ini(text))

    @classmethod
    def from_path(cls, path, encoding="utf-8"):
        with open(path, encoding=encoding) as handle:
            return cls(parse_ini(handle.read()))

    def sections(self):
        """Section names in file order, without ``DEFAULT``."""
        return [name for name in self._sections if name != DEFAULT]

    def has_option(self, section, key):
        return self._lookup(section, key) is not _MISSING

    def _lookup(self, section, key):
        key = key.lower()
        if section not in self._sections:
            return _MISSING
        if key in self._sections[section]:
            return self._sections[section][key]
        return self._sections[DEFAULT].get(key, _MISSING)

    def get(self, section, key, default=_MISSING):
        """The raw string value; falls back to ``DEFAULT``, then to ``default``.

        Raises ``KeyError`` when the key is missing and no default is given.
        """
        value = self._lookup(section, key)
        if value is _MISSING:
            if default is _MISSING:
                raise KeyError(f"[{section}] has no option {key!r}")
            return default
        return value

    def _typed(self, convert, section, key, default):
        value = self._lookup(section, key)
        if value is _MISSING:
            if default is _MISSING:
                raise KeyError(f"[{section}] has no option {key!r}")
            return default
        return convert(value)

    def getint(self, section, key, default=_MISSING):
        return self._typed(values.to_int, section, key, default)

    def getfloat(self, section, key, default=_MISSING):
        return self._typed(values.to_float, section, key, default)

    def getbool(self, section, key, default=_MISSING):
        return self._typed(values.to_bool, section, key, default)

    def getlist(self, section, key, default=_MISSING):
        return self._typed(values.to_list, section, key, default)
