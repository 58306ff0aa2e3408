"""Every default is written once, and every ``NEXUS_EVAL_*`` variable has one reader.

- The eviction defaults (method, scope, density, seed, block size, window) are ``nexus.EvictionConfig``'s fields, and
  each method's hyperparameters its policy dataclass's; the ``paper`` preset is read from those
  (tests/nexus/test_presets.py holds them against the paper). The job spec (``jobs/spec.py``) reads the library's;
  a config built only from a higher one has none for what the higher one sets: ``EpisodeSpec`` (built by
  ``JobSpec.episode_config``) and ``HFBackend`` (built by ``agent_runner.loaded_models.backend_for``).
- ``jobs.settings.ServiceSettings.from_env`` is the one reader of the variables it defines (``NEXUS_EVAL_DB`` through
  ``db.connection.default_url``, which it calls); every other ``NEXUS_EVAL_*`` variable has one reader too.

Read from the source with ``ast``: a literal where a default must be derived, or a second reader, fails here.
"""

from __future__ import annotations

import ast
import inspect
from collections import defaultdict
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent_runner.config import EpisodeSpec
from jobs.settings import ENV_VARIABLES
from jobs.spec import JobSpec
from nexus.config import EVICTION_DEFAULTS, EvictionConfig
from nexus.methods import DENSE, POLICIES_DIR, registered_nodes
from nexus.presets import DEFAULT_PRESET, PAPER

ROOT = Path(__file__).resolve().parent.parent
#: the fields of the job spec whose defaults are the library's (``nexus.EvictionConfig``)
JOB_FIELDS_FROM_THE_LIBRARY = ("methods", "scopes", "density", "seeds", "eviction")
#: what a job sets for each episode: ``EpisodeSpec`` has no default for it
EPISODE_FIELDS_FROM_THE_JOB = ("suite", "backend", "protocol", "seed", "grade")
#: what an episode sets for its backend: ``HFBackend`` has no default for it
BACKEND_ARGS_FROM_THE_EPISODE = ("eviction", "protocol", "max_context_tokens")


def _tree(rel: str) -> ast.Module:
    return ast.parse((ROOT / rel).read_text(encoding="utf-8"), filename=rel)


def _class(tree: ast.AST, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _field(cls: ast.ClassDef, name: str) -> ast.AnnAssign:
    found = [s for s in cls.body if isinstance(s, ast.AnnAssign) and getattr(s.target, "id", None) == name]
    assert found, f"{cls.name} has no field {name!r}"
    return found[0]


def _default_parts(value: ast.expr | None) -> list[ast.expr]:
    """What a field's default is made of: a plain value, or ``Field(...)``'s default (its first argument or
    ``default=``) and ``default_factory=`` (a lambda's body); [] for a required field."""
    if value is None:
        return []
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Field":
        parts = [value.args[0]] if value.args else []
        parts += [k.value for k in value.keywords if k.arg in ("default", "default_factory")]
    else:
        parts = [value]
    parts = [p.body if isinstance(p, ast.Lambda) else p for p in parts]
    return [p for p in parts if not (isinstance(p, ast.Constant) and p.value is Ellipsis)]


def _literals(expr: ast.expr) -> list[str]:
    """The str / number literals in ``expr``, but a subscript's key (``EVICTION_DEFAULTS["density"]`` reads the
    one definition; ``0.2`` or ``["nexus"]`` restates it)."""
    keys = {id(node.slice) for node in ast.walk(expr) if isinstance(node, ast.Subscript)}
    return [
        ast.unparse(node)
        for node in ast.walk(expr)
        if isinstance(node, ast.Constant)
        and id(node) not in keys
        and isinstance(node.value, str | int | float)
        and not isinstance(node.value, bool)
    ]


def test_the_job_spec_reads_the_library_defaults():
    """``JobSpec``'s method, scope, density, seed and shared eviction defaults are read from ``nexus.EvictionConfig``,
    never written as literals of their own; the values are the library's (and ``--show`` prints them)."""
    job = _class(_tree("jobs/spec.py"), "JobSpec")
    restated = {
        name: _literals(part)
        for name in JOB_FIELDS_FROM_THE_LIBRARY
        for part in _default_parts(_field(job, name).value)
    }
    assert {name: found for name, found in restated.items() if found} == {}
    spec = JobSpec()
    assert spec.methods == [DENSE, EVICTION_DEFAULTS["method"]]
    assert (spec.scopes, spec.density, spec.seeds) == (
        [EVICTION_DEFAULTS["scope"]],
        EVICTION_DEFAULTS["density"],
        [EVICTION_DEFAULTS["seed"]],
    )
    assert spec.eviction == {k: v for k, v in EVICTION_DEFAULTS.items() if k in spec.eviction}
    assert set(spec.eviction) == {"budget_tokens", "block_size", "window", "slack_blocks", "candidates"}
    shown = spec.to_yaml()
    assert f"density: {EVICTION_DEFAULTS['density']}" in shown and f"window: {EVICTION_DEFAULTS['window']}" in shown


def test_the_episode_spec_has_no_default_for_what_the_job_sets():
    """An episode is built from its job, which holds the defaults: ``EpisodeSpec`` restates none of them."""
    episode = _class(_tree("agent_runner/config.py"), "EpisodeSpec")
    defaulted = {name: _default_parts(_field(episode, name).value) for name in EPISODE_FIELDS_FROM_THE_JOB}
    assert {name: [ast.unparse(p) for p in parts] for name, parts in defaulted.items() if parts} == {}
    assert all(EpisodeSpec.model_fields[name].is_required() for name in EPISODE_FIELDS_FROM_THE_JOB)
    given = {"suite": "mini", "task_id": "t", "backend": "hf", "protocol": "true_eviction", "seed": 3, "grade": True}
    spec = EpisodeSpec(eviction={}, **given)
    assert spec.eviction.seed == 3 and spec.eviction == EvictionConfig(seed=3)  # {}: the library's defaults
    for name in EPISODE_FIELDS_FROM_THE_JOB:
        with pytest.raises(ValidationError, match=f"{name}\n  Field required"):
            EpisodeSpec(eviction={}, **{k: v for k, v in given.items() if k != name})
    with pytest.raises(ValidationError, match="give suite or tasks_file"):
        EpisodeSpec(eviction={}, **{**given, "suite": None})
    job = JobSpec()
    built = job.episode_config("t", job.methods[0], job.scopes[0], job.protocols[0], job.seeds[0])
    assert (built.suite, built.backend, built.protocol, built.seed, built.grade) == (
        job.tasks.suite,
        job.backend,
        job.protocols[0],
        job.seeds[0],
        job.grade,
    )


def test_the_hf_backend_has_no_defaults_of_its_own():
    """``HFBackend`` is built from an episode (``backend_for``): its eviction config, protocol, context window and
    seed have no default (before: dense, true_eviction, 65536 and seed 0 of its own), and no other parameter's
    default is a literal."""
    init = next(
        n
        for n in ast.walk(_class(_tree("agent_runner/backends/hf.py"), "HFBackend"))
        if getattr(n, "name", "") == "__init__"
    )
    args = init.args
    positional = args.posonlyargs + args.args
    defaults = dict(
        zip([a.arg for a in positional[len(positional) - len(args.defaults) :]], args.defaults, strict=True)
    )
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None})
    assert sorted(set(BACKEND_ARGS_FROM_THE_EPISODE) & set(defaults)) == []
    assert set(BACKEND_ARGS_FROM_THE_EPISODE) <= {a.arg for a in positional + args.kwonlyargs}
    assert {name: ast.unparse(d) for name, d in defaults.items() if _literals(d)} == {}
    seeded = [
        ast.unparse(node)
        for node in ast.walk(init)
        if isinstance(node, ast.Call) and any(k.arg == "seed" and _literals(k.value) for k in node.keywords)
    ]
    assert seeded == []
    body = [s for s in init.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    assert [
        c for s in body for c in _literals(s) if c.strip('"').strip("'") in ("tiny", "dense", "true_eviction")
    ] == []


def test_each_method_setting_is_written_once_in_the_library():
    """A policy's hyperparameter default is its dataclass field: no registered factory restates it in its signature
    (the Ada factories took floor_alpha=0.2 / normalize=False three times over AdaKV's), the presets module writes
    no value of the ``paper`` preset, and ``EvictionConfig.from_preset`` defaults to ``DEFAULT_PRESET``."""
    classes: dict[str, ast.ClassDef] = {}
    factories: list[ast.FunctionDef] = []
    for path in sorted(POLICIES_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        classes.update({n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)})
        factories += [node for _, _, node in registered_nodes(tree) if isinstance(node, ast.FunctionDef)]
    restated = []
    for fn in factories:
        returned = classes.get(getattr(fn.returns, "id", ""))
        fields = {s.target.id for s in returned.body if isinstance(s, ast.AnnAssign)} if returned else set()
        inner = fn.args.kwarg.arg.removesuffix("_params") if fn.args.kwarg else None
        fields |= set(PAPER.get(inner, {}))
        args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        with_default = [a.arg for a in args[len(args) - len(fn.args.defaults) :]] if fn.args.defaults else []
        with_default += [a.arg for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True) if d is not None]
        restated += [f"{fn.name}({name}=...)" for name in with_default if name in fields]
    assert restated == []

    settings = {name for values in PAPER.values() for name in values}
    written = []
    for node in _tree("nexus/presets.py").body:
        targets = [t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)]
        if not targets or targets[0] in ("_CHANGES", "ADDED_SINCE_STORED") or node.value is None:
            continue  # the other presets' own values; what stored settings ran with before a setting existed
        written += [
            f"{targets[0]}: {key.value}"
            for d in ast.walk(node.value)
            if isinstance(d, ast.Dict)
            for key in d.keys
            if isinstance(key, ast.Constant) and key.value in settings
        ]
    assert written == []
    assert inspect.signature(EvictionConfig.from_preset).parameters["preset"].default == DEFAULT_PRESET


# --- NEXUS_EVAL_* variables ---------------------------------------------------------------------------------------
SOURCE_DIRS = ("nexus", "env", "db", "agent_runner", "jobs", "results", "measure", "workers", "dashboard")
SOURCE_DIRS += ("nexus_eval",)
SKIP = ("env/tasks/suites/", "env/sandbox/tool_scripts/")


def _sources() -> dict[str, str]:
    found = {p.relative_to(ROOT).as_posix(): p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py")}
    found.update({p.relative_to(ROOT).as_posix(): p for p in (ROOT / "bench").glob("*.py")})
    return {rel: p.read_text(encoding="utf-8") for rel, p in sorted(found.items()) if not rel.startswith(SKIP)}


def _named_variables(trees: dict[str, ast.Module]) -> dict[str, str]:
    """Module-level ``NAME = "NEXUS_EVAL_..."`` constants of every module (``HOSTS_VARIABLE``, ``TOKEN_ENV``)."""
    names = {}
    for tree in trees.values():
        for node in tree.body:
            value = getattr(node, "value", None)
            if isinstance(value, ast.Constant) and str(value.value).startswith("NEXUS_EVAL_"):
                names.update({t.id: value.value for t in getattr(node, "targets", []) if isinstance(t, ast.Name)})
    return names


def env_reads(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """variable -> the modules that read it: ``X.get(VAR, ...)`` / ``getenv(VAR)``, ``X[VAR]`` loaded, ``VAR in X``,
    with VAR a ``NEXUS_EVAL_*`` literal or a module constant naming one. Writing one for a child process (a dict
    key, ``pop``, an assignment) is not a read."""
    names = _named_variables(trees)

    def variable(node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and str(node.value).startswith("NEXUS_EVAL_"):
            return node.value
        return names.get(node.id) if isinstance(node, ast.Name) else None

    readers: dict[str, set[str]] = defaultdict(set)
    for rel, tree in trees.items():
        for node in ast.walk(tree):
            read = None
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "get",
                "getenv",
            ):
                read = variable(node.args[0]) if node.args else None
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                read = variable(node.slice)
            elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn):
                read = variable(node.left)
            if read is not None:
                readers[read].add(rel)
    return readers


def test_the_reader_finds_every_kind_of_read():
    source = (
        'import os\nA = "NEXUS_EVAL_A"\nos.environ.get(A)\nos.getenv("NEXUS_EVAL_B")\nenv = dict(os.environ)\n'
        'env["NEXUS_EVAL_C"]\n"NEXUS_EVAL_D" in os.environ\nenv["NEXUS_EVAL_E"] = "1"\nenv.pop("NEXUS_EVAL_F")\n'
        '{**os.environ, "NEXUS_EVAL_G": "1"}\n'
    )
    assert env_reads({"m.py": ast.parse(source)}) == {f"NEXUS_EVAL_{c}": {"m.py"} for c in "ABCD"}


def test_each_nexus_eval_variable_has_one_reader():
    """``NEXUS_EVAL_BROKER`` and every other variable ``ServiceSettings`` defines are read by
    ``ServiceSettings.from_env`` alone (``NEXUS_EVAL_DB`` by ``db.connection.default_url``, which it calls): a command
    gets the value from a ``ServiceSettings`` object (``nexus_eval.commands._common.service_settings``)."""
    readers = env_reads({rel: ast.parse(text, filename=rel) for rel, text in _sources().items()})
    owner = {var: {"db/connection.py" if var == "NEXUS_EVAL_DB" else "jobs/settings.py"} for var in ENV_VARIABLES}
    elsewhere = {
        var: sorted(found - owner[var]) for var, found in readers.items() if var in owner and found - owner[var]
    }
    assert elsewhere == {}
    assert {var: sorted(found) for var, found in readers.items() if len(found) > 1} == {}
    assert readers["NEXUS_EVAL_DB"] == {"db/connection.py"}
