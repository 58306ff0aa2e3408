"""The import graph: no cycles between our modules, and the layers of ARCHITECTURE.md.

A room is a top-level package or a package inside one (``env.sandbox``); a module belongs to the room that is its
longest listed prefix. A package that only groups rooms (``env``) is no room and imports nothing.

Read from the source with ``ast`` (every import statement, also those inside functions; not those under
``if TYPE_CHECKING:``), so a lazy import that only dodges a cycle at run time is still a cycle here.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the top-level folders of our code, and the packages in them that group rooms without being one
PACKAGES = ("nexus", "env", "db", "agent_runner", "jobs", "results", "measure", "workers", "dashboard", "nexus_eval")
GROUPS = ("env",)
ROOMS = (
    *("nexus", "env.sandbox", "env.tasks", "env.grading", "db", "agent_runner", "jobs", "results", "measure"),
    *("workers", "dashboard", "nexus_eval"),
)
# code that is not imported by the service: the bundled tasks' data and the scripts run inside containers
SKIP = ("env/tasks/suites/", "env/sandbox/tool_scripts/", "db/migrations/")


def _arrows() -> dict[str, set[str]]:
    """The ```arrows block of ARCHITECTURE.md: ``room -> room, room``, one line a room."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    block = text.split("```arrows\n", 1)[1].split("```", 1)[0]
    arrows = {}
    for line in block.splitlines():
        room, _, targets = line.partition("->")
        arrows[room.strip()] = {t.strip() for t in targets.split(",") if t.strip()}
    return arrows


# what each room may import (besides itself), as ARCHITECTURE.md draws it
ALLOWED = _arrows()


def room_of(module: str) -> str | None:
    """The room ``module`` belongs to: its longest prefix that is a room (None: a grouping package)."""
    rooms = [r for r in ALLOWED if module == r or module.startswith(r + ".")]
    return max(rooms, key=len) if rooms else None


# what importing a room must not load, even through the rooms it imports
FORBIDDEN_AT_IMPORT = {
    "results": {"celery", "torch", "transformers", "workers"},
    "jobs": {"torch", "transformers", "workers"},
    "dashboard": {"torch", "transformers", "workers"},
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
    assert room_of("env.sandbox.container") == "env.sandbox" and room_of("measure.probes.runner") == "measure"
    assert room_of("env") is None


def test_the_map_names_every_room_and_only_looks_down():
    assert set(ALLOWED) == set(ROOMS)
    assert _cycles({room: targets - {room} for room, targets in ALLOWED.items()}) == []


def test_every_module_is_in_a_room_and_a_group_imports_nothing(graph):
    homeless = sorted(m for m in graph if room_of(m) is None and m not in GROUPS)
    assert homeless == []
    assert {group: graph[group] for group in GROUPS} == {group: set() for group in GROUPS}


def test_no_import_cycles(graph):
    assert _cycles(graph) == []


def test_a_cycle_would_be_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _against_arrows(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module not in GROUPS
        for target in targets
        if room_of(target) != room_of(module) and room_of(target) not in ALLOWED[room_of(module)]
    )


def test_packages_import_only_the_layers_below(graph):
    assert _against_arrows(graph) == []


def test_an_import_against_a_dotted_arrow_would_be_found():
    """``env.tasks`` may import ``env.sandbox``; the sandbox importing a task module is against the arrows."""
    graph = {"env.tasks.images": {"env.sandbox.container"}, "env.sandbox.container": {"env.tasks.loading"}}
    assert _against_arrows(graph) == ["env.sandbox.container imports env.tasks.loading"]


def test_the_database_knows_of_the_runner_only_the_words_it_stores(graph):
    """``db -> agent_runner`` is drawn for two modules: the status words (``agent_runner.status``) and the measuring
    dtypes (``agent_runner.measuring_dtypes``), each defined once and stored by ``db``; nothing else of the runner
    reaches the database layer."""
    reached = {t for m in graph if room_of(m) == "db" for t in graph[m] if room_of(t) == "agent_runner"}
    assert reached <= {"agent_runner.status", "agent_runner.measuring_dtypes"}
    assert "agent_runner.status" in reached
    for words in reached:
        assert graph[words] == set()  # and the words import nothing of ours


def test_the_celery_side_imports_no_measuring_module(graph):
    """Measurement runs in the CLI's own processes: ``workers`` (the Celery side) never imports ``measure``."""
    assert (
        sorted(
            f"{m} imports {t}" for m in graph if room_of(m) == "workers" for t in graph[m] if room_of(t) == "measure"
        )
        == []
    )


def _loaded_after_import(modules: list[str]) -> set[str]:
    """The top-level packages a fresh interpreter holds after importing ``modules``."""
    code = f"import importlib, sys; [importlib.import_module(m) for m in {modules!r}]; print(sorted(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return {name.split(".")[0] for name in ast.literal_eval(out.stdout)}


@pytest.mark.parametrize("room", sorted(FORBIDDEN_AT_IMPORT))
def test_rooms_do_not_load_what_they_must_not(graph, room):
    """``results`` is analysis and text (no Celery, no torch); ``jobs`` is what a submit needs (no torch); the
    dashboard never loads ``workers`` (its Celery signal handlers) nor torch."""
    modules = sorted(m for m in graph if room_of(m) == room)
    assert _loaded_after_import(modules) & FORBIDDEN_AT_IMPORT[room] == set()


def test_a_forbidden_load_would_be_found():
    assert "celery" in _loaded_after_import(["jobs.queue"])


def _modules_after_import(module: str) -> list[str]:
    code = f"import importlib, sys; importlib.import_module({module!r}); print(sorted(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return ast.literal_eval(out.stdout)


def test_a_job_spec_loads_no_sandbox_grader_or_backend():
    """Configs are data: reading a job file (``jobs.spec``) loads the settings of the backends
    (``agent_runner.backend_settings``), never a backend, a sandbox or a grader (it loaded 29 of our modules,
    ``env.sandbox.container`` and ``env.grading.official`` among them)."""
    loaded = _modules_after_import("jobs.spec")
    ours = [m for m in loaded if m.startswith("env.") or ".backends" in m]
    assert ours == [], ours
    assert "agent_runner.backend_settings" in loaded


# A module name means one thing (CLI verb modules, nexus_eval.commands.*, are named after their verbs):
# "tasks" are coding tasks (Celery's are workers.celery_tasks), "engine" is the batched decode engine (Docker's
# is env.sandbox.docker_daemon), "episode" is the one episode runner, "replay" is counterfactual replay
# (``rerun --from-turn`` forces a prefix: agent_runner.backends.forced_prefix).
ONE_MEANING = {
    "tasks": ["env.tasks"],
    "engine": ["agent_runner.engine"],
    "episode": ["agent_runner.episode"],
    "replay": ["measure.replay"],
}


def test_a_module_name_means_one_thing(graph):
    for leaf, owners in ONE_MEANING.items():
        holders = sorted(m for m in graph if m.split(".")[-1] == leaf and not m.startswith("nexus_eval.commands."))
        assert holders == owners, leaf


# A function or class name means one thing too: each of these is defined (``def`` or ``class``, at any depth) in
# exactly the module named. The names in RETIRED meant two things at once (a stored token stream and a dashboard
# row; the replay's and the probes' settings check; a Celery worker and a measuring process) and are defined
# nowhere now; ``load_tasks`` is the task loader alone (a job's tasks are ``jobs.submit.load_job_tasks``).
ONE_DEFINITION = {
    "replayable_token_streams": "db.replays",
    "generated_turn_streams": "dashboard.streams",
    "check_replay_settings": "measure.replay",
    "check_probe_settings": "measure.probes.runner",
    "load_tasks": "env.tasks.loading",
    "load_job_tasks": "jobs.submit",
    "MeasuringProcessError": "measure.processes",
    "resolve_processes": "measure.processes",
    "WorkerContext": "workers.execution",
}
RETIRED = ("turn_streams", "check_settings", "WorkerError", "resolve_workers", "default_workers")


def _definitions() -> dict[str, list[str]]:
    """Every function and class name defined in our modules -> the modules that define it."""
    found: dict[str, list[str]] = {}
    for module, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.setdefault(node.name, []).append(module)
    return found


def test_a_function_or_class_name_means_one_thing():
    defined = _definitions()
    assert {name: sorted(defined.get(name, [])) for name in ONE_DEFINITION} == {
        name: [module] for name, module in ONE_DEFINITION.items()
    }
    assert {name: defined[name] for name in RETIRED if name in defined} == {}


def test_the_episode_runner_is_the_only_path(graph):
    """Only the runner builds an agent loop; the CLI's episode verb and the worker (the interactive rerun goes
    through the worker's execute_episode) are its callers."""
    assert sorted(m for m in graph if "agent_runner.agent" in graph[m]) == ["agent_runner.episode"]
    assert sorted(m for m in graph if "agent_runner.episode" in graph[m]) == [
        "nexus_eval.commands.episode",
        "workers.execution",
    ]
