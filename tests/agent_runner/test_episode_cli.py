"""`nexus-eval episode` end to end in real containers: the oracle resolves; the tiny model runs every
method x scope x protocol and its per-turn telemetry obeys the protocol's invariants."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import nexus
from nexus_eval.cli import app

TASK = "argkit__argkit-1"
runner = CliRunner()


def _episode(*args: str) -> dict:
    res = runner.invoke(app, ["episode", "--suite", "mini", "--task", TASK, *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.docker
def test_oracle_resolves_in_a_real_container(docker_ready):
    result = _episode("--backend", "oracle")
    assert result["grade"]["status"] == "resolved"
    assert result["exit_status"] == "submitted"


def _check_invariants(result: dict, method: str, scope: str, protocol: str) -> None:
    turns = result["turns"]
    assert len(turns) == 3, [t["observation"][:80] for t in turns]
    cfg = nexus.EvictionConfig(**result["config"]["episode"]["eviction"])  # what the episode ran with
    assert (cfg.method, cfg.scope) == (method, scope)
    logical = 0
    for i, t in enumerate(turns):
        c = t["completion"]
        if protocol == "true_eviction":
            # the cache holds the whole stream: everything appended + everything generated except the last
            # sampled token, which the next turn feeds
            logical += c["tokens_appended"] + c["tokens_generated"] - 1
        else:
            logical = c["tokens_appended"] + c["tokens_generated"] - 1  # a fresh cache each turn
            if i:
                assert c["tokens_appended"] > turns[i - 1]["completion"]["tokens_appended"]
        assert c["logical_length"] == logical
        after = c["physical_after"]
        if method == "dense":
            assert after["min"] == after["max"] == logical and c["eviction_events"] == 0
            continue
        budget = c["info"]["budget"]
        if cfg.policy.content_budget((), 1) is not None:
            # observation_masking's paper rule: its budget is what the rule leaves, applied at every forward (no
            # slack, no decode-time event); all of the context until an observation is older than the newest M
            assert after["max"] <= budget <= logical, (i, after, budget)
            continue
        limit = budget + cfg.slack if scope == "prefill_decode" else budget + c["tokens_generated"]
        if method not in ("pyramidkv", "ada_pyramidkv"):  # per-layer schedules: layer 0's budget is the largest
            assert after["max"] <= limit, (i, after, budget)
        assert after["mean"] < logical


#: how many of the matrix's other 38 cells a run measures: every cell over runs, a printed seed a run
EPISODES_PER_RUN = 8
ALWAYS = {("nexus", "prefill_decode", "true_eviction"), ("dense", "prefill_only", "full_context")}


def _matrix():
    """Every method x scope x protocol (an episode in a container each): the ALWAYS cells, and of the rest a seeded
    sample of :data:`EPISODES_PER_RUN` per run (``--matrix-seed``, ``--matrix-full``: tests/conftest.py)."""
    cells = [(m, s, p) for m in nexus.METHODS for s in nexus.SCOPES for p in ("true_eviction", "full_context")]
    sampled = pytest.mark.matrix(keep=EPISODES_PER_RUN)
    return [pytest.param(*c, marks=pytest.mark.matrix(always=True) if c in ALWAYS else sampled) for c in cells]


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize(("method", "scope", "protocol"), _matrix())
def test_tiny_model_every_method_scope_protocol(docker_ready, method, scope, protocol):
    result = _episode(
        "--model",
        "tiny",
        "--method",
        method,
        "--scope",
        scope,
        "--protocol",
        protocol,
        "--max-steps",
        "3",
        "--max-new-tokens",
        "24",
        "--no-grade",
        "--seed",
        "3",
    )
    assert result["exit_status"] in ("step_limit", "format_error_limit", "submitted")
    _check_invariants(result, method, scope, protocol)


@pytest.mark.docker
def test_same_seed_reproduces_completions_and_evictions(docker_ready):
    args = ("--model", "tiny", "--method", "nexus", "--max-steps", "2", "--max-new-tokens", "24", "--no-grade")
    a, b = _episode(*args, "--seed", "11"), _episode(*args, "--seed", "11")
    assert [t["completion"]["text"] for t in a["turns"]] == [t["completion"]["text"] for t in b["turns"]]
    assert [t["completion"]["physical_after"] for t in a["turns"]] == [
        t["completion"]["physical_after"] for t in b["turns"]
    ]


def test_bad_inputs_fail_before_any_container():
    for args, needle in (
        (["--method", "magic"], "unknown method 'magic'"),
        (["--method", "dense,nexus"], "unknown method 'dense,nexus'"),  # one cell: one method, never a list
        (["--model", "/no/such/model"], "does not exist"),
        (["--task", "nope__nope-1"], "no task"),
        (["--scope", "sometimes"], "scope"),
    ):
        argv = ["episode", "--suite", "mini", "--task", TASK, *args]
        res = runner.invoke(app, argv)
        assert res.exit_code == 2, (args, res.output)
        assert needle in res.output, (args, res.output)
