"""OracleModel: a test double that "solves" a task by applying its gold patch through the agent's tools.

It proves the whole pipeline (prompts -> parser -> tools in the container -> diff -> grading) without a
model, emitting completions in the real R2E text format so the parser is exercised:

1. ``file_editor create`` writes the gold patch, base64-encoded, to ``/tmp/gold.patch.b64``. Base64 because
   the parser strips each parameter value (as R2E does), and a patch that loses its final newline or a
   trailing blank context line no longer applies; base64 text has no significant whitespace.
2. ``execute_bash`` decodes it and applies it in /testbed with ``git apply`` (falling back to
   ``patch -p1``), printing ``ORACLE_APPLIED`` on success. The command does not start with ``git``, which
   R2E's execute_bash refuses as a first word.
3. ``finish`` -- whatever turn 2 printed; grading decides. The observation of turn 2 is kept in
   ``observations`` so a failing run shows why.

Telemetry is whitespace-word counts, like ScriptedModel. Calls past turn 3 raise ModelError.
"""

from __future__ import annotations

import base64
import textwrap
from typing import Any

from agent_runner.backends import ModelError, stand_in_completion
from agent_runner.records import Completion, Message

PATCH_B64_PATH = "/tmp/gold.patch.b64"
PATCH_PATH = "/tmp/gold.patch"
APPLIED_MARKER = "ORACLE_APPLIED"


def oracle_script(patch: str) -> list[str]:
    """The three completions (R2E XML format) that apply ``patch`` and submit."""
    if not patch.strip():
        raise ValueError("OracleModel: the task has an empty gold patch; nothing to apply")
    encoded = "\n".join(textwrap.wrap(base64.b64encode(patch.encode()).decode(), 76))
    apply_cmd = (
        f"base64 -d {PATCH_B64_PATH} > {PATCH_PATH} && cd /testbed && "
        f"(git apply --whitespace=nowarn {PATCH_PATH} || patch -p1 --forward --batch < {PATCH_PATH}) "
        f"&& echo {APPLIED_MARKER}"
    )
    return [
        "<think>\nI am the oracle. I will write the reference patch to a file first.\n</think>\n\n"
        f"<function=file_editor>\n<parameter=command>create</parameter>\n<parameter=path>{PATCH_B64_PATH}"
        f"</parameter>\n<parameter=file_text>\n{encoded}\n</parameter>\n</function>",
        "<think>\nNow decode the patch and apply it to the repository.\n</think>\n\n"
        f"<function=execute_bash>\n<parameter=cmd>{apply_cmd}</parameter>\n</function>",
        "<think>\nThe patch is applied; submit.\n</think>\n\n"
        "<function=finish>\n<parameter=command>submit</parameter>\n</function>",
    ]


class OracleModel:
    """Test double: applies ``task.patch`` (or ``patch=``) through file_editor + execute_bash, then finishes."""

    def __init__(self, task: Any = None, *, patch: str | None = None) -> None:
        if patch is None:
            if task is None or not getattr(task, "patch", None):
                raise ValueError("OracleModel needs task= with a gold patch (task.patch) or patch=")
            patch = task.patch
        self.script = oracle_script(patch)
        self.observations: list[str] = []
        self._next = 0

    def reset(self, *, seed: int) -> None:
        self._next = 0
        self.observations = []

    def complete(self, messages: list[Message], *, max_new_tokens: int | None = None) -> Completion:
        if self._next >= len(self.script):
            raise ModelError(
                f"OracleModel: asked for turn {self._next + 1} but the oracle finishes at turn 3; "
                f"last observation: {messages[-1].content[:500]!r}"
            )
        if self._next > 0:
            self.observations.append(messages[-1].content)
        text = self.script[self._next]
        self._next += 1
        return stand_in_completion(text, messages)
