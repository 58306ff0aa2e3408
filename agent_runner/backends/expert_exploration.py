"""How the expert backend (``agent_runner.backends.expert``) explores a repository: what to search for and which
related modules to read, and what the tools printed, read back.

* :func:`search_symbol` chooses the first search: a function or class a hunk header names, else an identifier of
  the patch's lines;
* :func:`package_imports` lists the modules an edited module imports from its own package (worth viewing);
* :func:`parse_view` reads the file lines back from a ``file_editor view`` observation (R2E's ``f"{n:6d} "``
  prefix) and :func:`parse_wc` the sizes from ``wc -l -c`` output, so every view is sized before it is made.

Pure functions: the expert decides each turn from the task and the observations so far.
"""

from __future__ import annotations

import builtins
import keyword
import re

from agent_runner.backends.expert_diffs import FilePatch

#: what file_editor appends where it cut a long output (env/sandbox/tool_scripts/file_editor.py)
CLIP_MARK = "<response clipped>"
_WC_RE = re.compile(r"^\s*(\d+)\s+(\d+)\s+(.+?)\s*$")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")
_FROM_RE = re.compile(r"^\s*from\s+(\.*)([\w.]*)\s+import\s+\(?([\w\s,]+)")
_IMPORT_RE = re.compile(r"^\s*import\s+([\w.]+(?:\s*,\s*[\w.]+)*)\s*$")
_COMMON = {"self", "None", "True", "False", "args", "kwargs", "value", "values", "result", "text", "name"}
_BUILTINS = set(dir(builtins))


# -- reading observations --------------------------------------------------------------------------------------


def parse_view(observation: str, first: int = 1) -> list[str]:
    """The file lines a ``file_editor view`` printed, starting at line ``first`` (R2E's ``f"{n:6d} "``
    prefix), in order; a line the view's clipping cut short is dropped."""
    found: list[str] = []
    number = first
    for line in observation.split("\n"):
        prefix = f"{number:6d} "
        if line.startswith(prefix) or (line == prefix[:-1] and found):
            if found and CLIP_MARK in found[-1]:
                break
            found.append(line[len(prefix) :])
            number += 1
        elif found:
            break
    if found and CLIP_MARK in found[-1]:
        found.pop()
    return found


def parse_wc(output: str) -> dict[str, tuple[int, int]]:
    """``path -> (lines, bytes)`` from ``wc -l -c`` output (a leading ``./`` dropped; the total left out)."""
    sizes: dict[str, tuple[int, int]] = {}
    for line in output.splitlines():
        match = _WC_RE.match(line)
        if match and match.group(3) != "total":
            sizes[match.group(3).removeprefix("./")] = (int(match.group(1)), int(match.group(2)))
    return sizes


# -- choosing what to look at ----------------------------------------------------------------------------------


def _identifiers(lines: list[str]) -> list[str]:
    found = []
    for line in lines:
        for name in _IDENT_RE.findall(line):
            if not keyword.iskeyword(name) and name not in _BUILTINS and name not in _COMMON and name not in found:
                found.append(name)
    return found


def search_symbol(patches: list[FilePatch]) -> str:
    """What to search for first: a function the hunk headers name, else a class, else an identifier of the
    removed lines, of the context lines, of the added lines, else the first file's module name."""
    hunks = [hunk for patch in patches for hunk in patch.hunks]
    for pattern in (r"\bdef\s+(\w+)", r"\bclass\s+(\w+)"):
        for hunk in hunks:
            match = re.search(pattern, hunk.header)
            if match:
                return match.group(1)
    for tag in "- +":
        names = _identifiers([line[1:] for hunk in hunks for line in hunk.lines if line[0] == tag])
        if names:
            return names[0]
    stem = patches[0].path.rsplit("/", 1)[-1].split(".")[0] if patches else ""
    return stem or "def"


def package_imports(path: str, lines: list[str]) -> list[str]:
    """Paths (``pkg/mod.py`` and ``pkg/mod/__init__.py`` forms) of the modules that the module at ``path``
    imports from its own package, in the order of its import lines."""
    parts = path.split("/")[:-1]
    found: list[str] = []

    def add(dotted: list[str], base: list[str]) -> None:
        for candidate in ("/".join([*base, *dotted]) + ".py", "/".join([*base, *dotted, "__init__.py"])):
            if candidate not in found and candidate != path:
                found.append(candidate)

    for line in lines:
        match = _FROM_RE.match(line)
        if match:
            dots, module, names = match.group(1), match.group(2), match.group(3)
            dotted = [p for p in module.split(".") if p]
            if dots:
                base = parts[: len(parts) - len(dots) + 1] if len(dots) <= len(parts) + 1 else []
            elif dotted and dotted[0] in parts:
                base = parts[: parts.index(dotted[0])]
            else:
                continue
            if dotted:
                add(dotted, base)
            for name in re.findall(r"\w+", names):
                add([*dotted, name], base)  # `from pkg import module`
            continue
        match = _IMPORT_RE.match(line)
        if match:
            for module in match.group(1).split(","):
                dotted = module.strip().split(".")
                if dotted[0] in parts:
                    add(dotted, parts[: parts.index(dotted[0])])
    return found
