"""Parse a model completion in R2E-Gym's XML call format into a thought and one tool call.

The format (DeepSWE's ``r2egym`` scaffold, non-function-calling mode)::

    <think> ...reasoning... </think>
    <function=execute_bash>
    <parameter=cmd>python -m pytest -q tests/test_x.py</parameter>
    </function>

Rules, following the agentica fork of R2E-Gym's ``parse_response`` (the parser DeepSWE was trained with):

* **thought** = the inside of the first ``<think>...</think>`` block, stripped. With no ``<think>`` block the
  thought is empty (text outside the think block and the call is discarded, as in R2E). One extension: a
  completion holding ``</think>`` but no opener (a chat template that put ``<think>`` in the generation
  prompt) takes everything before the closer as the thought.
* **action** = the first ``<function=NAME> ... </function>`` block anywhere in the text (R2E searches the
  whole completion, think block included). ``NAME`` is the text up to the first ``>``, trimmed; it must be a
  plain identifier (letters, digits, ``_ . -``) or the call is a format error. An opener without a closing
  ``</function>`` (a truncated completion) is a format error, not a partial call.
* **parameters** = every ``<parameter=KEY>VALUE</parameter>`` inside the block, KEY and VALUE stripped of
  surrounding whitespace; all values are strings (``view_range`` arrives as the text ``"[1, 50]"``).
  A parameter opener without its closer is dropped. Nesting is not understood: the value runs to the first
  ``</parameter>``, so an inner opener becomes part of the outer value (R2E's regex does the same).
  **Duplicate keys: the last one wins**, as in R2E-Gym (``duplicates="first"`` is available).

Scanning uses ``str.find`` rather than non-greedy regexes so a megabyte of text with many stray openers stays
linear time. :func:`parse_response` never raises on any string (see tests/agent_runner/test_parsing_fuzz.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from env.sandbox.tools import ToolCall

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAMETER_OPEN, PARAMETER_CLOSE = "<parameter=", "</parameter>"
_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]+")

NO_CALL_ERROR = "no function call found"


@dataclass(frozen=True)
class ParsedAction:
    """What one completion asks for. ``call`` is None exactly when ``error`` says why (a format error)."""

    thought: str
    call: ToolCall | None
    error: str | None = None


def parse_thought(text: str) -> str:
    """The inside of the first ``<think>...</think>`` block, stripped; '' when there is none."""
    start = text.find(THINK_OPEN)
    if start >= 0:
        end = text.find(THINK_CLOSE, start + len(THINK_OPEN))
        return text[start + len(THINK_OPEN) : end].strip() if end >= 0 else ""
    end = text.find(THINK_CLOSE)
    return text[:end].strip() if end >= 0 else ""


def parse_parameters(body: str, *, duplicates: Literal["first", "last"] = "last") -> dict[str, str]:
    """All complete ``<parameter=KEY>VALUE</parameter>`` pairs in ``body``, keys and values stripped."""
    params: dict[str, str] = {}
    pos = 0
    while True:
        start = body.find(PARAMETER_OPEN, pos)
        if start < 0:
            return params
        key_start = start + len(PARAMETER_OPEN)
        key_end = body.find(">", key_start)
        if key_end < 0:
            return params
        value_end = body.find(PARAMETER_CLOSE, key_end + 1)
        if value_end < 0:
            return params  # unclosed: dropped, like R2E's regex
        key = body[key_start:key_end].strip()
        if key and (duplicates == "last" or key not in params):
            params[key] = body[key_end + 1 : value_end].strip()
        pos = value_end + len(PARAMETER_CLOSE)


def parse_response(text: str, *, duplicates: Literal["first", "last"] = "last") -> ParsedAction:
    """Split one completion into thought and first tool call. Never raises; see the module docstring."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    thought = parse_thought(text)
    start = text.find(FUNCTION_OPEN)
    if start < 0:
        return ParsedAction(thought, None, NO_CALL_ERROR)
    name_start = start + len(FUNCTION_OPEN)
    name_end = text.find(">", name_start)
    if name_end < 0:
        return ParsedAction(thought, None, "truncated function call: '<function=' without a closing '>'")
    body_end = text.find(FUNCTION_CLOSE, name_end + 1)
    if body_end < 0:
        return ParsedAction(thought, None, "truncated function call: no '</function>' after '<function='")
    name = text[name_start:name_end].strip()
    if not _NAME_RE.fullmatch(name):
        shown = name if len(name) <= 60 else name[:57] + "..."
        return ParsedAction(thought, None, f"bad function name {shown!r} in '<function=...>'")
    arguments = parse_parameters(text[name_end + 1 : body_end], duplicates=duplicates)
    return ParsedAction(thought, ToolCall(name=name, arguments=arguments), None)


def render_call(call: ToolCall) -> str:
    """The canonical XML text of a call (one parameter per line), as the system prompt shows it."""
    lines = [f"{FUNCTION_OPEN}{call.name}>"]
    lines += [f"{PARAMETER_OPEN}{key}>{value}{PARAMETER_CLOSE}" for key, value in call.arguments.items()]
    lines.append(FUNCTION_CLOSE)
    return "\n".join(lines)


def resynthesize(parsed: ParsedAction) -> str:
    """R2E's re-synthesised assistant message: the think block, a blank line, then the canonical call."""
    parts = [f"{THINK_OPEN}\n{parsed.thought}\n{THINK_CLOSE}"] if parsed.thought else []
    if parsed.call is not None:
        parts.append(render_call(parsed.call))
    return "\n\n".join(parts)
