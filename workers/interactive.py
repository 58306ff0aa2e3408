"""``rerun EPISODE --interactive``: one episode live in the terminal, with a human at every turn.

Each turn the operator sees the model's thought and proposed action (and its raw completion, bounded, when no call
parses) and answers:

- ``c`` continue (run the action as proposed),
- ``e`` edit (type a replacement: a bash command, or a full ``<function=...>...</function>`` call),
- ``s`` skip (nothing runs in the container; the model's observation says the operator skipped the action),
- ``h`` shell (``docker exec -it`` into the episode's container, its terminal transcript recorded with util-linux
  ``script``; the turn is asked again afterwards),
- ``q`` stop (submit the repository as it is now; the patch is graded as usual).

Every act is stored with its turn (``agent_runner.records.OperatorAct`` in ``turns.extra["operator"]``): the choice,
the model's own proposed action when it was replaced or skipped, and each shell session's transcript (bounded,
``SHELL_TRANSCRIPT_CHARS``). ``inspect`` and the dashboard's episode page show them.

Who drove the attempt (``db.models.AttemptDriver``): it is ``steered`` as soon as the operator changed anything the
agent saw or the container holds: an edit, a skip, a stop, any shell session (nothing proves a shell changed
nothing), or a forced turn that repeats a stored operator's edit, skip or stop. It stays ``interactive`` only when
the model chose every live action and nothing else touched the container.

The observation of every turn is printed after it runs. ``--from-turn K`` first forces the source attempt's
stored turns 0..K-1 without asking (``agent_runner.backends.forced_prefix.ForcedPrefix``); a forced turn whose
action an operator had replaced or skipped repeats that act (``forced_actions``, :func:`replayed_act`), so the
rerun is steered too and its environment sees what the source's saw. A source's shell session cannot be repeated:
the operator is told, and the rerun is ``steered`` from its start (its forced completions were written against
what that shell changed; :func:`start_rerun`). The run is a new attempt row, written through the same
claim/record_turn/finish path and the same episode runner as a worker's.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_runner.parsing import ParsedAction, parse_response
from agent_runner.records import Intervention, OperatorAct, ShellSession
from env.sandbox.tools import ToolCall

CHOICES = "[c]ontinue  [e]dit  [s]kip  [h] shell  [q] stop"
#: the most characters of one shell session's transcript stored (its head and tail kept, the middle cut)
SHELL_TRANSCRIPT_CHARS = 32_000
#: the most characters of a raw completion shown at the live prompt when no call parses
RAW_SHOWN_CHARS = 4_000

# terminal control sequences in a transcript: CSI (colours, cursor, erase), OSC (titles), and two-byte escapes
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_BACKSPACED = re.compile(r"[^\n\x08]\x08")


def action_text(call: ToolCall | None) -> str:
    if call is None:
        return "(no function call)"
    args = "\n".join(f"  {k} = {v}" for k, v in call.arguments.items())
    return f"{call.name}\n{args}" if args else call.name


def bounded(text: str, limit: int) -> tuple[str, int]:
    """``text`` with at most ``limit`` characters: its head and tail, the middle left out and marked; and how
    many characters were left out."""
    if len(text) <= limit:
        return text, 0
    cut = len(text) - limit
    half = limit // 2
    return f"{text[:half]}\n... [{cut} characters left out] ...\n{text[len(text) - (limit - half) :]}", cut


def clean_transcript(data: bytes) -> str:
    """A ``script`` log -> plain text: its header and trailer lines, terminal escapes, carriage returns and
    erased characters removed (what the operator saw, as text)."""
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[0].startswith("Script started on "):
        lines = lines[1:]
    while lines and (not lines[-1].strip() or lines[-1].startswith("Script done on ")):
        lines.pop()
    text = _ESCAPES.sub("", "\n".join(lines)).replace("\r\n", "\n").replace("\r", "")
    while _BACKSPACED.search(text):
        text = _BACKSPACED.sub("", text)
    return text.replace("\x08", "").replace("\x07", "")


def parse_edit(text: str, thought: str) -> ParsedAction:
    """The operator's replacement: a ``<function=...>`` call, else a bash command for ``execute_bash``."""
    text = text.strip()
    if text.startswith("<function="):
        parsed = parse_response(text)
        if parsed.call is not None:
            return ParsedAction(thought=thought, call=parsed.call)
    return ParsedAction(thought=thought, call=ToolCall(name="execute_bash", arguments={"cmd": text}))


def replayed_act(
    *, thought: str, action: dict[str, Any] | None, intervened: bool, operator: OperatorAct | None
) -> Intervention | None:
    """A stored turn of the source attempt -> what a forced turn repeats of its operator's act: an edit or a stop
    runs the stored action again, a skip runs nothing again; None: the model's own action (a continue, with or
    without a shell: a shell session cannot be repeated). A row stored before ``operator`` whose action an operator
    replaced repeats it as an edit."""
    if operator is not None:
        if operator.choice == "continue":
            return None
        act = OperatorAct(choice=operator.choice, proposed=operator.proposed, forced=True)
        if operator.choice == "skip" or action is None:
            return Intervention(act=act.model_copy(update={"choice": "skip"}))
        return Intervention(act=act, action=ParsedAction(thought=thought, call=ToolCall.model_validate(action)))
    if intervened and action is not None:
        act = OperatorAct(choice="edit", forced=True)
        return Intervention(act=act, action=ParsedAction(thought=thought, call=ToolCall.model_validate(action)))
    return None


@dataclass
class RerunStart:
    """What ``rerun EPISODE --interactive --from-turn K`` starts from: the new attempt, the source's first K turns
    (text and token ids) to force, the operator acts they repeat, and the turns whose shell sessions cannot be."""

    new_id: str
    attempt: int
    recorded: list[tuple[str, Any]] = field(default_factory=list)
    edits: dict[int, Intervention] = field(default_factory=dict)
    unrepeated_shells: list[int] = field(default_factory=list)


def start_rerun(session: Any, episode: str, from_turn: int) -> RerunStart:
    """The new ``interactive`` attempt of ``episode`` (id or prefix) and what its first ``from_turn`` turns force.
    A forced prefix that holds a source's shell session makes the attempt ``steered`` at once: the shell is not
    repeated, but the forced completions were written against what it changed. ``LookupError`` / ``ValueError``
    for a bad episode or turn."""
    from db import store as db_store
    from db.claims import mark_steered
    from db.models import AttemptDriver
    from results.turn_data import TurnExtra

    source = db_store.get_episode(session, episode)
    forced = [t for t in source.turns if t.index < from_turn]
    if len(forced) < from_turn:
        raise ValueError(f"--from-turn {from_turn}: episode {source.id} has only {len(forced)} turns")
    start = RerunStart("", 0, recorded=[(t.completion, t.tokens) for t in forced])
    for t in forced:
        extra = TurnExtra.of_row(t)
        act = replayed_act(
            thought=t.thought or "", action=t.action, intervened=extra.intervened, operator=extra.operator
        )
        if act is not None:
            start.edits[t.index] = act
        if extra.operator is not None and extra.operator.shells:
            start.unrepeated_shells.append(t.index)
    row = db_store.new_attempt(session, source.id, driver=AttemptDriver.interactive.value)  # holds the job lock
    if start.unrepeated_shells:
        mark_steered(session, row.job_id, row.id)
    start.new_id, start.attempt = row.id, row.attempt
    return start


class Operator:
    """The terminal side: ``intervene`` asks at each live turn, ``show`` prints each finished turn.

    ``ask(prompt) -> str`` and ``say(text)`` default to input() and a rich console, so tests can drive it
    through a real pseudo-terminal (pexpect)."""

    def __init__(
        self,
        *,
        forced_turns: int = 0,
        forced_actions: dict[int, Intervention] | None = None,
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

    def intervene(self, index: int, parsed: ParsedAction, raw: str = "") -> Intervention | None:
        if index < self.forced_turns:
            forced = self.forced_actions.get(index)
            repeated = f" repeating its operator's {forced.act.choice}" if forced is not None else ""
            self.say(f"--- turn {index} (forced from the stored attempt{repeated}) ---", "dim")
            return forced
        self.say(f"--- turn {index} ---", "bold")
        self.say(f"thought: {parsed.thought.strip()[:2000] or '(none)'}")
        self.say(f"action: {action_text(parsed.call)}", "cyan")
        if parsed.call is None:
            shown, cut = bounded(raw.strip(), RAW_SHOWN_CHARS)
            more = f" ({cut} characters left out)" if cut else ""
            self.say(f"raw completion ({parsed.error or 'no function call'}){more}:\n{shown or '(empty)'}", "yellow")
        shells: list[ShellSession] = []
        if self.stopped:
            return self._stop(parsed, shells)
        while True:
            choice = self.ask(f"{CHOICES} > ").strip().lower()[:1] or "c"
            if choice == "c":
                # a plain continue leaves no act; after a shell the turn records it (the attempt is steered)
                return Intervention(act=OperatorAct(choice="continue", shells=shells)) if shells else None
            if choice == "e":
                replacement = self.ask("new action (bash command or <function=...>) > ")
                if replacement.strip():
                    edited = parse_edit(replacement, parsed.thought)
                    self.say(f"edited action: {action_text(edited.call)}", "cyan")
                    act = OperatorAct(choice="edit", proposed=parsed.call, shells=shells)
                    return Intervention(act=act, action=edited)
                self.say("empty replacement; asking again")
            elif choice == "s":
                self.say("skipped: nothing runs; the model is told the operator skipped its action")
                return Intervention(act=OperatorAct(choice="skip", proposed=parsed.call, shells=shells))
            elif choice == "h":
                session = self.shell()
                if session is not None:
                    shells.append(session)
            elif choice == "q":
                self.stopped = True
                return self._stop(parsed, shells)
            else:
                self.say(f"unknown choice {choice!r}")

    def _stop(self, parsed: ParsedAction, shells: list[ShellSession]) -> Intervention:
        self.say("stopping: submitting the repository as it is now")
        finish = ParsedAction(thought=parsed.thought, call=ToolCall(name="finish", arguments={"command": "submit"}))
        return Intervention(act=OperatorAct(choice="stop", proposed=parsed.call, shells=shells), action=finish)

    def shell(self) -> ShellSession | None:
        """A shell in the episode's container, its terminal transcript recorded (util-linux ``script`` on this
        host); None when there is no container to open one in."""
        if not self.container_id:
            self.say("no container to open a shell in")
            return None
        self.say(f"opening a shell in {self.container_id[:12]} (exit to come back; the session is recorded)")
        command = ["docker", "exec", "-it", "-w", "/testbed", self.container_id, "bash"]
        script = shutil.which("script")
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="nexus-eval-shell-") as tmp:
            log = Path(tmp) / "transcript"
            if script is not None:
                done = subprocess.run([script, "-q", "-f", "-e", "-c", shlex.join(command), str(log)], check=False)
                transcript = clean_transcript(log.read_bytes()) if log.exists() else ""
            else:
                done = subprocess.run(command, check=False)
                transcript = "(no transcript: util-linux `script` is not installed on the operator's host)"
        text, cut = bounded(transcript, SHELL_TRANSCRIPT_CHARS)
        session = ShellSession(
            transcript=text, cut=cut, seconds=round(time.monotonic() - started, 3), exit_code=done.returncode
        )
        self.say(f"shell session recorded ({len(transcript)} characters): this attempt is steered")
        return session

    def show(self, turn: Any) -> None:
        act = getattr(turn, "operator", None)
        if act is not None and act.choice == "skip":
            marker = " (the operator skipped the action: nothing ran)"
        elif turn.intervened:
            marker = " (of the operator's action)"
        else:
            marker = ""
        self.say(f"observation{marker}:\n{(turn.observation or '').rstrip()[:4000]}")
