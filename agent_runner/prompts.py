"""The prompts of DeepSWE's R2E-Gym ``r2egym`` scaffold, in our own words, with the same structure.

* system prompt: a role line, one "BEGIN/END FUNCTION #k" manual per tool (from ``env.sandbox.tools.TOOL_SPECS``),
  the call syntax shown on a dummy function with a multi-line parameter, and a reminder block;
* instance prompt: the repository location, the issue inside ``<github_issue>`` tags, "change non-test files
  only", a nine-step workflow, closing advice;
* every user message ends with the step budget: ``Steps Remaining: N`` (N = soft limit - steps taken), or,
  once N <= 0, an instruction to submit now (R2E does the same for steps 41..100);
* a completion without a function call gets ``env.sandbox.tools.NO_FUNCTION_CALL_REMINDER`` as its observation.

Those are the default (``agent_runner.scaffold.NEXUS_SCAFFOLD``). With ``AgentConfig.prompts`` set,
``agent_runner.scaffold.load_scaffold`` reads R2E-Gym's own prompt YAML at run time and the agent sends exactly
R2E-Gym's texts (docs/agent.md, "Using R2E-Gym's own prompts").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from env.sandbox.tools import NO_FUNCTION_CALL_REMINDER, TOOL_SPECS

WORKING_DIR = "/testbed"

__all__ = [
    "NO_FUNCTION_CALL_REMINDER",
    "instance_prompt",
    "observation_message",
    "steps_remaining_text",
    "system_prompt",
    "tool_manual",
]

CALL_FORMAT = """To call a function, write your reply in exactly this format:

<function=example_function_name>
<parameter=example_parameter_1>value_1</parameter>
<parameter=example_parameter_2>
A value may span
several lines.
</parameter>
</function>

<IMPORTANT>
Keep in mind:
- A function call starts with <function= and ends with </function>; nothing else is treated as a call.
- Give every required parameter.
- Make exactly ONE function call per reply.
- In every reply, first reason about what to do next, then make the function call.
</IMPORTANT>"""

WORKFLOW = """Work through these steps:
1. Explore the repository to find the code involved in the issue; grep and the search function help.
2. Write a script at {wd}/reproduce_issue.py that demonstrates the problem, and run it to see it fail.
3. Work out the root cause. Think of several ways to fix it, compare them, and choose the most robust one.
4. Make the change to the source code with the file editor.
5. Run {wd}/reproduce_issue.py again and confirm the problem is gone.
6. Run the existing unit tests that cover the code you touched (without changing them) to catch regressions.
7. Write edge cases into {wd}/edge_case_tests.py and run them to make sure the fix holds beyond the example.
8. Refine the change until everything above passes.
9. Submit your answer with the `finish` function."""


def _get(spec: Any, key: str, default: Any = None) -> Any:
    return spec.get(key, default) if isinstance(spec, Mapping) else getattr(spec, key, default)


def _parameters(spec: Any) -> list[dict[str, Any]]:
    """A tool spec's parameters as a list of {name, type, description, required, enum}; accepts a list of
    parameter records, a name->record mapping, or a JSON-schema object with ``properties``/``required``."""
    params = _get(spec, "parameters") or []
    required: Iterable[str] = ()
    if isinstance(params, Mapping) and "properties" in params:
        required, params = params.get("required", ()), params["properties"]
    if isinstance(params, Mapping):
        params = [{"name": name, **(dict(p) if isinstance(p, Mapping) else vars(p))} for name, p in params.items()]
    required = set(required)
    out = []
    for p in params:
        name = _get(p, "name")
        out.append(
            {
                "name": name,
                "type": _get(p, "type", "string"),
                "description": _get(p, "description", ""),
                "required": bool(_get(p, "required", name in required)),
                "enum": _get(p, "enum"),
            }
        )
    return out


def tool_manual(specs: Iterable[Any] | Mapping[str, Any] = TOOL_SPECS) -> str:
    """One fenced manual section per tool, numbered from 1."""
    if isinstance(specs, Mapping):
        specs = [spec if _get(spec, "name") else {"name": name, **dict(spec)} for name, spec in specs.items()]
    sections = []
    for k, spec in enumerate(specs, start=1):
        name = _get(spec, "name")
        lines = [
            f"---- BEGIN FUNCTION #{k}: {name} ----",
            f"Description: {str(_get(spec, 'description', '')).strip()}",
            "",
            "Parameters:",
        ]
        params = _parameters(spec)
        for i, p in enumerate(params, start=1):
            need = "required" if p["required"] else "optional"
            lines.append(f"  ({i}) {p['name']} ({p['type']}, {need}): {str(p['description']).strip()}")
            if p["enum"]:
                lines.append(f"      Allowed values: [{', '.join(f'`{v}`' for v in p['enum'])}]")
        if not params:
            lines.append("  (none)")
        lines.append(f"---- END FUNCTION #{k} ----")
        sections.append("\n".join(lines))
    return "\n\n".join(sections)


def system_prompt(specs: Iterable[Any] | Mapping[str, Any] = TOOL_SPECS) -> str:
    return (
        "You are a programming agent. You work in a bash environment on a code repository and your job is "
        "to resolve a GitHub issue in it.\n\nThese functions are available to you:\n\n"
        f"{tool_manual(specs)}\n\n{CALL_FORMAT}"
    )


def instance_prompt(task: Any, soft_step_limit: int | None = None, *, working_dir: str = WORKING_DIR) -> str:
    """The first user message for ``task`` (anything with ``problem_statement``); with ``soft_step_limit``
    the step budget line is appended, as on every later user message."""
    text = (
        f"A code repository has been uploaded to {working_dir}. Here is a GitHub issue about it:\n\n"
        f"<github_issue>\n{str(task.problem_statement).strip()}\n</github_issue>\n\n"
        f"Change the non-test files under {working_dir} so that the issue is resolved. The tests that check "
        "the issue are already taken care of: do not modify any test files or test logic.\n\n"
        f"{WORKFLOW.format(wd=working_dir)}\n\n"
        "Be thorough: understand the code before you change it. Make one function call per step, and "
        "combine shell commands into one call where that saves steps."
    )
    return text if soft_step_limit is None else f"{text}\n{steps_remaining_text(soft_step_limit)}"


def steps_remaining_text(remaining: int) -> str:
    if remaining > 0:
        return f"Steps Remaining: {remaining}"
    return "You have used up your step budget. Submit your answer NOW with the `finish` function."


def observation_message(observation: str, remaining: int) -> str:
    """The user message carrying a tool's observation back, with the step budget appended."""
    return f"{observation}\n{steps_remaining_text(remaining)}"
