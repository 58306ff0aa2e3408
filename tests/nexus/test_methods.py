"""The vocabulary (`nexus.methods`) is exactly what the policy files register, and it needs no torch."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import pytest

from nexus.methods import METHOD_MODULES, METHODS, REGISTRY, SCOPES, _registrations, check_method, check_scope


def test_every_policy_file_registers_what_the_vocabulary_lists():
    for module in sorted(set(METHOD_MODULES.values())):
        importlib.import_module(module)
    registered = {name: obj.__module__ for name, obj in REGISTRY.items() if name in METHODS}
    assert registered == dict(METHOD_MODULES)
    assert set(REGISTRY) - set(METHODS) == set(), "a policy module registered a name the source scan missed"


def test_table_order_is_the_papers():
    assert METHODS == (
        "dense",
        "snapkv",
        "pyramidkv",
        "ada_snapkv",
        "ada_pyramidkv",
        "h2o",
        "morphkv",
        "streaming_llm",
        "nexus",
        "ada_nexus",
        "observation_masking",  # not a KV method of the paper's: the text-level baseline, after them
    )
    assert SCOPES == ("prefill_only", "prefill_decode")


def test_registrations_are_read_from_the_source(tmp_path):
    source = tmp_path / "mine.py"
    source.write_text(
        textwrap.dedent(
            """
            from nexus.methods import register

            @register("late")
            class Late: ...

            @register("early", order=-1)
            def early(**params): ...

            @other("not_a_method")
            def helper(): ...
            """
        )
    )
    assert _registrations(source) == [("late", 1_000_000), ("early", -1)]


def test_unknown_names_are_clear_errors():
    with pytest.raises(ValueError, match="unknown eviction method 'snap'; known: dense, snapkv, pyramidkv"):
        check_method("snap")
    with pytest.raises(ValueError, match="unknown method 'snap'"):
        check_method("snap", noun="method")
    with pytest.raises(ValueError, match="unknown scope 'always'; use one of prefill_only, prefill_decode"):
        check_scope("always")


def test_the_vocabulary_and_the_configs_import_without_torch():
    code = (
        "import sys, nexus, nexus.methods, nexus.config, jobs.spec, db, agent_runner.config;"
        "nexus.EvictionConfig.__post_init__;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
