"""Reading the few texts R2E-Gym keeps in Python, from its source with ``ast`` (never importing it): the reply
to a completion without a function call (``CONTINUE_MSG``) and the step-budget texts ``Agent.run`` appends.
Used by ``agent_runner.scaffold`` when a user points the agent at R2E-Gym's own prompts."""

from __future__ import annotations

import ast
from pathlib import Path


class UnreadableSource(Exception):
    """The expected literal is not in this file in a shape we can read."""


def _parse(path: Path) -> ast.Module:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
        raise UnreadableSource(f"cannot parse {path}: {exc}") from exc


def read_continue_message(path: Path) -> str:
    """The last module-level ``CONTINUE_MSG = "<literal>"`` in ``path`` (R2E-Gym's no-function-call reply)."""
    found = None
    for node in _parse(path).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == "CONTINUE_MSG" for t in targets):
            value = node.value
            if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
                raise UnreadableSource(f"{path}: CONTINUE_MSG is not a string literal")
            found = value.value
    if found is None:
        raise UnreadableSource(f"no CONTINUE_MSG in {path}")
    return found


def _fstring_template(node: ast.JoinedStr, fields: dict[str, str], path: Path) -> str:
    """An f-string as a ``str.format`` template: its literal parts escaped, each ``{name}`` renamed per ``fields``."""
    out = []
    for part in node.values:
        if isinstance(part, ast.Constant) and isinstance(part.value, str):
            out.append(part.value.replace("{", "{{").replace("}", "}}"))
        elif (
            isinstance(part, ast.FormattedValue)
            and isinstance(part.value, ast.Name)
            and part.value.id in fields
            and part.conversion == -1
            and part.format_spec is None
        ):
            out.append("{" + fields[part.value.id] + "}")
        else:
            raise UnreadableSource(f"{path}:{node.lineno}: an f-string we cannot read as a template")
    return "".join(out)


def _assigned(statements: list[ast.stmt]) -> dict[str, ast.expr]:
    return {
        s.targets[0].id: s.value
        for s in statements
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)
    }


def read_step_texts(path: Path) -> tuple[str, str, str, str]:
    """R2E-Gym's step-budget texts from its ``agent.py``, read from ``Agent.run``:

    the ``if <remaining> > 0: <msg> = f"...{<remaining>}..." else: <msg> = "..."`` pair and the statement that
    appends ``<msg>`` to the last message (``... += f"<prefix>{<msg>}<suffix>"``). Returns (template with
    ``{remaining}``, the text once the budget is spent, prefix, suffix)."""
    tree = _parse(path)
    runs = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Agent"]
    functions = [f for c in runs for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "run"]
    if not functions:
        raise UnreadableSource(f"no Agent.run in {path}")
    run = functions[0]
    for node in ast.walk(run):
        test = getattr(node, "test", None)
        if not (
            isinstance(node, ast.If)
            and isinstance(test, ast.Compare)
            and isinstance(test.left, ast.Name)
            and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Gt)
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == 0
        ):
            continue
        counter = test.left.id
        then, otherwise = _assigned(node.body), _assigned(node.orelse)
        for name, value in then.items():
            spent = otherwise.get(name)
            if isinstance(value, ast.JoinedStr) and isinstance(spent, ast.Constant) and isinstance(spent.value, str):
                template = _fstring_template(value, {counter: "remaining"}, path)
                prefix, suffix = _append_statement(run, name, path)
                return template, spent.value, prefix, suffix
    raise UnreadableSource(f"no step-budget message in Agent.run of {path}")


def _append_statement(run: ast.FunctionDef, name: str, path: Path) -> tuple[str, str]:
    """(prefix, suffix) of the ``<last message> += f"<prefix>{name}<suffix>"`` statement in ``run``."""
    for node in ast.walk(run):
        if not (
            isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) and isinstance(node.value, ast.JoinedStr)
        ):
            continue
        if not isinstance(node.target, ast.Subscript):
            continue
        parts = node.value.values
        at = [
            i for i, p in enumerate(parts) if isinstance(p, ast.FormattedValue) and getattr(p.value, "id", None) == name
        ]
        if len(at) != 1 or not all(isinstance(p, ast.Constant) for i, p in enumerate(parts) if i != at[0]):
            continue
        prefix = "".join(p.value for p in parts[: at[0]])
        suffix = "".join(p.value for p in parts[at[0] + 1 :])
        return prefix, suffix
    raise UnreadableSource(f"{path}: Agent.run does not append {name} to the last message")
