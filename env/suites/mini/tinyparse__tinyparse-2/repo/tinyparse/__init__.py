"""tinyparse: small, dependency-free parsers for INI files, CSV lines and arithmetic expressions."""

from tinyparse.csvline import read_records, read_rows, split_row
from tinyparse.errors import ParseError
from tinyparse.expr import evaluate, parse
from tinyparse.ini import IniFile, parse_ini

__all__ = [
    "IniFile",
    "ParseError",
    "evaluate",
    "parse",
    "parse_ini",
    "read_records",
    "read_rows",
    "split_row",
]

__version__ = "0.4.0"
