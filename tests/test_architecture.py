"""The import graph: no cycles between our modules, and the layers of ARCHITECTURE.md.

Read from the source with ``ast`` (every import statement, also those inside functions; not those under
``if TYPE_CHECKING:``), so a lazy import that only dodges a cycle at run time is still a cycle here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("nexus", "agent_runner", "env", "workers", "db", "dashboard", "nexus_eval")
# code that is not imported by the service: the bundled tasks' projects and the scripts run inside containers
SKIP = ("env/suites/", "env/tool_scripts/", "db/migrations/")
# what each package may import (besides itself); nothing imports workers but the CLI and the dashboard
ALLOWED = {
    "nexus": set(),
    "env": set(),
    "db": set(),
    "agent_runner": {"nexus", "env"},
    "workers": {"nexus", "env", "db", "agent_runner"},
    # pages read db (and env's stored-log format); compare, cancel and rerun are the CLI's own functions
    "dashboard": {"db", "env", "workers"},
    "nexus_eval": set(PACKAGES),
}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(SKIP):
                continue
            parts = rel.removesuffix(".py").split("/")
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Our modules that ``name`` imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_lines(tree)
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.add(full if full in modules else base)
    return {t for t in targets if t in modules and t != name}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read(graph):
    assert "db.store" in graph and "db.claims" in graph["db.store"]
    assert "nexus.methods" in graph["nexus.policies"]


def test_no_import_cycles(graph):
    assert _cycles(graph) == []


def test_a_cycle_would_be_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_packages_import_only_the_layers_below(graph):
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if target.split(".")[0] != module.split(".")[0] and target.split(".")[0] not in ALLOWED[module.split(".")[0]]
    )
    assert wrong == []


# A module name means one thing (CLI verb modules, nexus_eval.commands.*, are named after their verbs):
# "tasks" are coding tasks (Celery's are workers.celery_tasks), "engine" is the batched decode engine (Docker's
# is env.docker_daemon), "episode" is the one episode runner, "replay" is counterfactual replay
# (``rerun --from-turn`` forces a prefix: agent_runner.backends.forced_prefix).
ONE_MEANING = {
    "tasks": ["env.tasks"],
    "engine": ["agent_runner.engine"],
    "episode": ["agent_runner.episode"],
    "replay": ["workers.replay"],
}


def test_a_module_name_means_one_thing(graph):
    for leaf, owners in ONE_MEANING.items():
        holders = sorted(m for m in graph if m.split(".")[-1] == leaf and not m.startswith("nexus_eval.commands."))
        assert holders == owners, leaf


def test_the_episode_runner_is_the_only_path(graph):
    """Only the runner builds an agent loop; the CLI's episode verb and the worker (the interactive rerun goes
    through the worker's execute_episode) are its callers."""
    assert sorted(m for m in graph if "agent_runner.agent" in graph[m]) == ["agent_runner.episode"]
    assert sorted(m for m in graph if "agent_runner.episode" in graph[m]) == [
        "nexus_eval.commands.episode",
        "workers.execution",
    ]
