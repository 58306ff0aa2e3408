"""Real filler text that ships with every machine: no download, the same bytes on every run of one image.

Sources (each a long string, cut into excerpts by token count at line boundaries):
- ``reference``: the Python language reference and library topics as pydoc ships them (``pydoc_data.topics``):
  technical English prose.
- ``code``: Python standard-library modules' source (a fixed list): real code, what a coding agent reads.
- ``licenses``: Debian's license texts (``/usr/share/common-licenses``): legal English prose.

``fingerprint()`` hashes every source's text, so a probe run records exactly which filler it used (a Python or
Debian upgrade that changes a text changes the fingerprint, and runs with different fingerprints are not
paired).
"""

from __future__ import annotations

import hashlib
import importlib.util
import random
from functools import cache
from pathlib import Path

SOURCES: tuple[str, ...] = ("reference", "code", "licenses")
_CODE_MODULES = (
    "argparse", "textwrap", "configparser", "shutil", "tarfile", "logging", "http.client", "email.message",
    "csv", "difflib", "inspect", "calendar", "fractions", "pprint", "string", "tokenize",
)  # fmt: skip
_LICENSES = ("GPL-3", "Apache-2.0", "MPL-2.0", "Artistic", "GFDL-1.3", "LGPL-2.1")
LICENSE_DIR = Path("/usr/share/common-licenses")


@cache
def source_text(name: str) -> str:
    """The whole text of source `name`; ValueError when it is not on this machine."""
    if name == "reference":
        from pydoc_data.topics import topics

        return "\n\n".join(topics[key].strip() for key in sorted(topics))
    if name == "code":
        parts = []
        for module in _CODE_MODULES:
            spec = importlib.util.find_spec(module)
            if spec is None or not spec.origin or not spec.origin.endswith(".py"):
                raise ValueError(f"filler source 'code': the standard-library module {module} has no source here")
            parts.append(Path(spec.origin).read_text(encoding="utf-8"))
        return "\n\n".join(parts)
    if name == "licenses":
        missing = [n for n in _LICENSES if not (LICENSE_DIR / n).is_file()]
        if missing:
            raise ValueError(f"filler source 'licenses': {LICENSE_DIR} lacks {', '.join(missing)} (Debian base-files)")
        return "\n\n".join((LICENSE_DIR / n).read_text(encoding="utf-8") for n in _LICENSES)
    raise ValueError(f"unknown filler source {name!r}; use {', '.join(SOURCES)}")


def fingerprint(names: tuple[str, ...] = SOURCES) -> dict[str, str]:
    """{source: first 16 hex digits of the sha256 of its text}."""
    return {n: hashlib.sha256(source_text(n).encode()).hexdigest()[:16] for n in names}


def excerpt_lines(name: str, tokenizer, n_tokens: int, rng: random.Random) -> list[str]:
    """Consecutive lines of source `name`, starting at a random line, about `n_tokens` tokens long (never
    more, counted line by line). Blank-line runs are kept as they are: the text stays real."""
    lines = source_text(name).splitlines()
    start = rng.randrange(len(lines))
    out: list[str] = []
    total = 0
    i = start
    while True:
        line = lines[i % len(lines)]
        cost = len(tokenizer.encode(line + "\n", add_special_tokens=False))
        if total + cost > n_tokens and out:
            return out
        out.append(line)
        total += cost
        i += 1
        if i - start > len(lines):  # the whole source is shorter than asked: take it once
            return out


def absent_number(text: str, rng: random.Random, digits: int = 5) -> str:
    """A random `digits`-digit number that does not occur in `text` (so finding it proves recall)."""
    while True:
        value = str(rng.randrange(10 ** (digits - 1), 10**digits))
        if value not in text:
            return value
