"""R2E-Gym's own prompts, loaded at run time: DeepSWE's scaffold, exactly (docs/agent.md).

Nothing of R2E-Gym's text lives in this project: the YAML is read from the path the user gives (or from an
installed ``r2egym`` package), and the few texts R2E-Gym keeps in Python (the step-budget line, the text past
the step limit, the reply to a completion without a call) are read from its source with ``ast`` at run time.
What we implement is R2E-Gym's *rule* for filling and placing them. :data:`NEXUS_SCAFFOLD` is our own
prompts (``agent_runner.prompts``) in the same shape.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import yaml

from agent_runner.prompts import instance_prompt, steps_remaining_text, system_prompt
from agent_runner.r2egym_source import UnreadableSource, read_continue_message, read_step_texts
from env.sandbox.tools import FINISH_NAMES, NO_FUNCTION_CALL_REMINDER, TOOL_NAMES

#: the keys R2E-Gym's ``AgentArgs.from_yaml`` cannot do without (its dataclass fields without a default)
R2E_REQUIRED_KEYS = ("system_prompt", "instance_prompt", "command_files", "llm_name")
#: the package-name prefix of ``AgentConfig.prompts``: ``r2egym:<name>`` = ``<root>/agenthub/config/<name>.yaml``
R2E_NAME_PREFIX = "r2egym:"
#: what the working directory is called in R2E-Gym's instance template (its agent fills '/testbed')
R2E_WORKING_DIR = "/testbed"
_ISSUE_OPEN, _ISSUE_CLOSE = "[ISSUE]", "[/ISSUE]"
#: where R2E-Gym defines the no-function-call reply, relative to its package root (newest layout first)
_CONTINUE_FILES = ("agenthub/__init__.py", "agenthub/observation/observation.py", "agenthub/observation.py")
_AGENT_FILE = "agenthub/agent/agent.py"

#: the texts an agent run sends; a Scaffold records where each came from under these names
TEXT_NAMES = ("system_prompt", "instance_prompt", "steps_remaining", "past_step_limit", "no_call_reply")


class ScaffoldError(ValueError):
    """``AgentConfig.prompts`` names a file that is missing, unreadable, or not an R2E-Gym prompt config."""


@dataclass(frozen=True)
class Scaffold:
    """The texts one agent run sends, and the rule that places them.

    * ``system``: the system message, sent as is;
    * ``instance_template``: R2E-Gym's instance prompt (``str.format`` template), or None for ours;
    * every user message ends with ``budget_prefix + <budget text> + budget_suffix``; the budget text is
      ``remaining_template.format(remaining=N)`` while N > 0, else ``past_limit_text``;
    * ``no_call_reply``: the observation for a completion without a function call.

    ``sources`` says, per text (``TEXT_NAMES``), the file it was read from, or ``nexus (...)`` with the reason
    when our own wording stood in.
    """

    name: Literal["nexus", "r2egym"]
    system: str
    instance_template: str | None
    remaining_template: str
    past_limit_text: str
    no_call_reply: str
    budget_prefix: str = "\n"
    budget_suffix: str = ""
    prompts_path: str | None = None
    demo: str | None = None
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return "nexus" if self.prompts_path is None else f"r2egym (from {self.prompts_path})"

    def system_prompt(self) -> str:
        return self.system

    def instance_prompt(self, task: Any, soft_step_limit: int | None = None) -> str:
        """The first user message; with ``soft_step_limit`` the step-budget line is appended."""
        if self.instance_template is None:
            text = instance_prompt(task)
        else:
            text = self.instance_template.format(**r2egym_template_values(task))
            if self.demo is not None:
                text = f"{self.demo}\n\n{text}"
        return text if soft_step_limit is None else self.with_budget(text, soft_step_limit)

    def budget_text(self, remaining: int) -> str:
        return self.remaining_template.format(remaining=remaining) if remaining > 0 else self.past_limit_text

    def with_budget(self, text: str, remaining: int) -> str:
        return f"{text}{self.budget_prefix}{self.budget_text(remaining)}{self.budget_suffix}"

    def observation_message(self, observation: str, remaining: int) -> str:
        return self.with_budget(observation, remaining)

    def templates_sha256(self) -> str:
        """A digest of every text this scaffold can send (task-independent): equal digests, equal scaffold."""
        parts = [
            self.system,
            self.instance_template,
            self.demo,
            self.remaining_template,
            self.past_limit_text,
            self.no_call_reply,
            self.budget_prefix,
            self.budget_suffix,
        ]
        return _sha256(parts)

    def record(self, sent: Iterable[str] = ()) -> dict[str, Any]:
        """What an episode stores about its scaffold; ``sent``: the system and first user message as sent."""
        return {
            "name": self.name,
            "label": self.label,
            "prompts": self.prompts_path,
            "sources": dict(self.sources),
            "templates_sha256": self.templates_sha256(),
            "sent_sha256": _sha256(list(sent)),
        }


def _sha256(parts: list[str | None]) -> str:
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode()).hexdigest()


NEXUS_SCAFFOLD = Scaffold(
    name="nexus",
    system=system_prompt(),
    instance_template=None,
    remaining_template="Steps Remaining: {remaining}",
    past_limit_text=steps_remaining_text(0),
    no_call_reply=NO_FUNCTION_CALL_REMINDER,
    sources=dict.fromkeys(TEXT_NAMES, "nexus"),
)


def r2egym_task_instruction(problem_statement: str) -> str:
    """The issue text as R2E-Gym's runtime hands it to the agent: the part between the first ``[ISSUE]`` and
    the last ``[/ISSUE]`` when both are there (R2E-Gym's own datasets wrap it so), else the whole text; never
    stripped."""
    start = problem_statement.find(_ISSUE_OPEN)
    end = problem_statement.rfind(_ISSUE_CLOSE)
    if start >= 0 and end >= start + len(_ISSUE_OPEN):
        return problem_statement[start + len(_ISSUE_OPEN) : end]
    return problem_statement


def r2egym_template_values(task: Any) -> dict[str, str]:
    """The values R2E-Gym's agent fills its instance template with (agentica fork, the one DeepSWE ran):
    the issue, the test-file part of the gold patch (``gt_patch``: SWE-bench's ``test_patch``), the working
    directory, and the verifier metadata, empty in an evaluation run."""
    return {
        "problem_statement": r2egym_task_instruction(str(task.problem_statement)),
        "gt_patch": str(getattr(task, "test_patch", "") or ""),
        "working_dir": R2E_WORKING_DIR,
        "test_patch_hint": "",
        "candidate_patch": "",
        "candidate_patch_correctness": "incorrect",
    }


def installed_r2egym_root() -> Path | None:
    """The installed ``r2egym`` package's folder (found without importing it), or None."""
    try:
        spec = importlib.util.find_spec("r2egym")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def r2egym_package_root(root: str | Path) -> Path:
    """``root`` as the package folder holding ``agenthub/``: accepts ``.../src/r2egym`` or the checkout."""
    path = Path(root).expanduser()
    for candidate in (path, path / "src" / "r2egym", path / "r2egym"):
        if (candidate / "agenthub").is_dir():
            return candidate
    raise ScaffoldError(
        f"AgentConfig.r2egym_root: {path} is not an R2E-Gym package (no agenthub/ folder in it, in src/r2egym/ "
        "or in r2egym/); give the checkout's src/r2egym"
    )


def resolve_prompts_path(prompts: str, r2egym_root: str | None = None) -> Path:
    """A path, or ``r2egym:<name>`` = ``<root>/agenthub/config/<name>[.yaml]`` with root = ``r2egym_root`` or
    the installed r2egym package."""
    if not prompts.startswith(R2E_NAME_PREFIX):
        return Path(prompts).expanduser()
    name = prompts[len(R2E_NAME_PREFIX) :].strip()
    if r2egym_root is not None:
        root = r2egym_package_root(r2egym_root)
    else:
        root = installed_r2egym_root()
        if root is None:
            raise ScaffoldError(
                f"AgentConfig.prompts={prompts!r} names a config of the r2egym package, but r2egym is not "
                "installed; install it, set AgentConfig.r2egym_root to a checkout's src/r2egym, or give the "
                "YAML's path"
            )
    config_dir = root / "agenthub" / "config"
    path = config_dir / name
    if path.suffix not in (".yaml", ".yml"):
        path = path.with_name(path.name + ".yaml")
    if not path.is_file():
        known = sorted(str(p.relative_to(config_dir).with_suffix("")) for p in config_dir.rglob("*.yaml"))
        raise ScaffoldError(f"AgentConfig.prompts={prompts!r}: no {path}; configs there: {known or 'none'}")
    return path


def read_r2egym_prompts(path: Path) -> dict[str, Any]:
    """The YAML at ``path`` checked the way R2E-Gym's ``AgentArgs.from_yaml`` needs it; ScaffoldError names
    the file and what is wrong."""
    if not path.is_file():
        raise ScaffoldError(f"AgentConfig.prompts: no R2E-Gym prompt file at {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ScaffoldError(f"AgentConfig.prompts: cannot read {path} as YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ScaffoldError(f"AgentConfig.prompts: {path} is not a mapping of R2E-Gym agent settings")
    missing = [key for key in R2E_REQUIRED_KEYS if key not in data]
    if missing:
        raise ScaffoldError(
            f"AgentConfig.prompts: {path} lacks the key(s) {', '.join(repr(k) for k in missing)} "
            f"(R2E-Gym's agent config needs {', '.join(R2E_REQUIRED_KEYS)})"
        )
    for key in ("system_prompt", "instance_prompt"):
        if not isinstance(data[key], str):
            raise ScaffoldError(
                f"AgentConfig.prompts: {path}: {key!r} must be a string, not {type(data[key]).__name__}"
            )
    _check_command_files(path, data["command_files"])
    dummy = SimpleNamespace(problem_statement="", test_patch="")
    try:
        data["instance_prompt"].format(**r2egym_template_values(dummy))
    except KeyError as exc:
        raise ScaffoldError(
            f"AgentConfig.prompts: {path}: instance_prompt uses the placeholder {{{exc.args[0]}}}, which R2E-Gym's "
            f"agent does not fill (it fills {', '.join(r2egym_template_values(dummy))})"
        ) from exc
    except (ValueError, IndexError) as exc:
        raise ScaffoldError(
            f"AgentConfig.prompts: {path}: instance_prompt is not a valid format string: {exc}"
        ) from exc
    return data


def _check_command_files(path: Path, command_files: Any) -> None:
    """The tools the YAML installs must be ones our environment runs (the r2egym scaffold's)."""
    if not isinstance(command_files, list) or not all(isinstance(f, str) for f in command_files):
        raise ScaffoldError(f"AgentConfig.prompts: {path}: 'command_files' must be a list of tool script paths")
    ours = tuple(dict.fromkeys((*TOOL_NAMES, *FINISH_NAMES)))
    unknown = [f for f in command_files if Path(f).stem not in ours]
    if unknown:
        raise ScaffoldError(
            f"AgentConfig.prompts: {path}: its command_files {unknown} are not tools this environment runs "
            f"({', '.join(ours)}); use R2E-Gym's r2egym (non-function-calling) config"
        )


def _read_demo(path: Path, data: dict[str, Any], roots: list[Path]) -> str | None:
    """R2E-Gym prepends the demo file when ``use_demo`` is true (relative paths: tried from the current folder,
    the YAML's folder and the R2E-Gym tree)."""
    if not data.get("use_demo"):
        return None
    demo = data.get("demo_file")
    if not demo:
        raise ScaffoldError(f"AgentConfig.prompts: {path}: use_demo is true but demo_file is not set")
    demo_path = Path(str(demo)).expanduser()
    bases = [Path.cwd(), path.parent, *(p for root in roots for p in (root, root.parent, root.parent.parent))]
    candidates = [demo_path] if demo_path.is_absolute() else [base / demo_path for base in bases]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.read_text(encoding="utf-8")
    raise ScaffoldError(
        f"AgentConfig.prompts: {path}: demo_file {demo!r} not found (tried {[str(c) for c in candidates]})"
    )


def _enclosing_r2egym_root(path: Path) -> Path | None:
    """The R2E-Gym package the YAML lies in (``.../r2egym/agenthub/config/x.yaml`` -> ``.../r2egym``)."""
    for parent in path.resolve().parents:
        if (parent / _AGENT_FILE).is_file():
            return parent
    return None


def _code_roots(path: Path, r2egym_root: str | None) -> list[Path]:
    """Where R2E-Gym's Python is looked for, in order: r2egym_root, the tree holding the YAML, the package."""
    roots = [r2egym_package_root(r2egym_root)] if r2egym_root is not None else []
    roots += [root for root in (_enclosing_r2egym_root(path), installed_r2egym_root()) if root is not None]
    unique: list[Path] = []
    for root in roots:
        if root.resolve() not in [r.resolve() for r in unique]:
            unique.append(root)
    return unique


def _from_code(roots: list[Path], files: tuple[str, ...], reader: Callable[[Path], Any]) -> tuple[Any, str]:
    """The first readable value over ``roots`` x ``files``: (value, source path) or (None, the reasons)."""
    reasons = []
    for root in roots:
        for name in files:
            candidate = root / name
            if not candidate.is_file():
                reasons.append(f"no {candidate}")
                continue
            try:
                return reader(candidate), str(candidate)
            except UnreadableSource as exc:
                reasons.append(str(exc))
    if not roots:
        reasons.append("no R2E-Gym source found (set AgentConfig.r2egym_root or install r2egym)")
    return None, "nexus (" + "; ".join(reasons) + ")"


def load_scaffold(prompts: str | None = None, r2egym_root: str | None = None) -> Scaffold:
    """Our own scaffold (``prompts=None``), or R2E-Gym's: the YAML's system and instance prompts, and the
    texts R2E-Gym keeps in Python read from its source (our wording where that is not to be found; the
    returned ``sources`` say which). Raises :class:`ScaffoldError` for a missing or malformed YAML."""
    if prompts is None:
        return NEXUS_SCAFFOLD
    path = resolve_prompts_path(prompts, r2egym_root)
    data = read_r2egym_prompts(path)
    roots = _code_roots(path, r2egym_root)
    steps, steps_source = _from_code(roots, (_AGENT_FILE,), read_step_texts)
    reply, reply_source = _from_code(roots, _CONTINUE_FILES, read_continue_message)
    remaining, past, prefix, suffix = steps or (
        NEXUS_SCAFFOLD.remaining_template,
        NEXUS_SCAFFOLD.past_limit_text,
        NEXUS_SCAFFOLD.budget_prefix,
        NEXUS_SCAFFOLD.budget_suffix,
    )
    return Scaffold(
        name="r2egym",
        system=data["system_prompt"],
        instance_template=data["instance_prompt"],
        remaining_template=remaining,
        past_limit_text=past,
        no_call_reply=NO_FUNCTION_CALL_REMINDER if reply is None else reply,
        budget_prefix=prefix,
        budget_suffix=suffix,
        prompts_path=str(path),
        demo=_read_demo(path, data, roots),
        sources={
            "system_prompt": str(path),
            "instance_prompt": str(path),
            "steps_remaining": steps_source,
            "past_step_limit": steps_source,
            "no_call_reply": reply_source,
        },
    )
