"""``rerun EPISODE --interactive``: one episode live in the terminal, with a human at every turn.

Each turn the operator sees the model's thought and proposed action and answers:

- ``c`` continue (run the action as proposed),
- ``e`` edit (type a replacement: a bash command, or a full ``<function=...>...</function>`` call),
- ``s`` skip (the action is not run; the model is told it was skipped),
- ``h`` shell (``docker exec -it`` into the episode's container; the turn is asked again afterwards),
- ``q`` stop (submit the repository as it is now; the patch is graded as usual).

The observation of every turn is printed after it runs. ``--from-turn K`` first forces the source attempt's
stored turns 0..K-1 without asking (``agent_runner.backends.forced_prefix.ForcedPrefix``); a forced turn whose
action an operator had replaced runs that stored replacement again (``forced_actions``), so the rerun is steered
too and its environment sees what the source's saw. The run is a new
attempt row, written through the same claim/record_turn/finish path and the same episode runner as a worker's.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

from agent_runner.parsing import ParsedAction, parse_response
from sandbox.tools import ToolCall

SKIPPED_CMD = "echo '[the operator skipped this action]'"
CHOICES = "[c]ontinue  [e]dit  [s]kip  [h] shell  [q] stop"


def action_text(call: ToolCall | None) -> str:
    if call is None:
        return "(no function call)"
    args = "\n".join(f"  {k} = {v}" for k, v in call.arguments.items())
    return f"{call.name}\n{args}" if args else call.name


def parse_edit(text: str, thought: str) -> ParsedAction:
    """The operator's replacement: a ``<function=...>`` call, else a bash command for ``execute_bash``."""
    text = text.strip()
    if text.startswith("<function="):
        parsed = parse_response(text)
        if parsed.call is not None:
            return ParsedAction(thought=thought, call=parsed.call)
    return ParsedAction(thought=thought, call=ToolCall(name="execute_bash", arguments={"cmd": text}))


class Operator:
    """The terminal side: ``intervene`` asks at each live turn, ``show`` prints each finished turn.

    ``ask(prompt) -> str`` and ``say(text)`` default to input() and a rich console, so tests can drive it
    through a real pseudo-terminal (pexpect)."""

    def __init__(
        self,
        *,
        forced_turns: int = 0,
        forced_actions: dict[int, ParsedAction] | None = None,
        ask: Callable[[str], str] | None = None,
        console: Any = None,
    ) -> None:
        from rich.console import Console

        self.forced_turns = forced_turns
        self.forced_actions = dict(forced_actions or {})
        self.ask = ask or input
        self.console = console or Console(highlight=False)
        self.container_id: str | None = None
        self.stopped = False

    def say(self, text: str, style: str | None = None) -> None:
        self.console.print(text, style=style, markup=False)

    def open_environment(self, opener: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap the environment factory to learn the container id (for the shell choice)."""

        def open_and_remember(task: Any, **kwargs: Any) -> Any:
            environment = opener(task, **kwargs)
            sandbox = getattr(environment, "sandbox", None)
            self.container_id = getattr(getattr(sandbox, "container", None), "id", None)
            return environment

        return open_and_remember

    def intervene(self, index: int, parsed: ParsedAction) -> ParsedAction | None:
        if index < self.forced_turns:
            forced = self.forced_actions.get(index)
            edited = " with its operator's action" if forced is not None else ""
            self.say(f"--- turn {index} (forced from the stored attempt{edited}) ---", "dim")
            return forced
        self.say(f"--- turn {index} ---", "bold")
        self.say(f"thought: {parsed.thought.strip()[:2000] or '(none)'}")
        self.say(f"action: {action_text(parsed.call)}", "cyan")
        if self.stopped:
            return self._stop(parsed)
        while True:
            choice = self.ask(f"{CHOICES} > ").strip().lower()[:1] or "c"
            if choice == "c":
                return None
            if choice == "e":
                replacement = self.ask("new action (bash command or <function=...>) > ")
                if replacement.strip():
                    edited = parse_edit(replacement, parsed.thought)
                    self.say(f"edited action: {action_text(edited.call)}", "cyan")
                    return edited
                self.say("empty replacement; asking again")
            elif choice == "s":
                return ParsedAction(
                    thought=parsed.thought, call=ToolCall(name="execute_bash", arguments={"cmd": SKIPPED_CMD})
                )
            elif choice == "h":
                self.shell()
            elif choice == "q":
                self.stopped = True
                return self._stop(parsed)
            else:
                self.say(f"unknown choice {choice!r}")

    def _stop(self, parsed: ParsedAction) -> ParsedAction:
        self.say("stopping: submitting the repository as it is now")
        return ParsedAction(thought=parsed.thought, call=ToolCall(name="finish", arguments={"command": "submit"}))

    def shell(self) -> None:
        if not self.container_id:
            self.say("no container to open a shell in")
            return
        self.say(f"opening a shell in {self.container_id[:12]} (exit to come back)")
        subprocess.run(["docker", "exec", "-it", "-w", "/testbed", self.container_id, "bash"], check=False)

    def show(self, turn: Any) -> None:
        marker = " (edited)" if turn.intervened else ""
        self.say(f"observation{marker}:\n{(turn.observation or '').rstrip()[:4000]}")
