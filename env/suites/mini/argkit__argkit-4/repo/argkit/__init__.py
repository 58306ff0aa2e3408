"""argkit: a small, predictable command-line argument parser."""

from argkit.errors import ArgError
from argkit.parser import Namespace, Parser
from argkit.spec import Argument, Option

__all__ = ["ArgError", "Argument", "Namespace", "Option", "Parser"]

__version__ = "0.9.2"
