"""The hf backend's final cache (``HFBackend.retention``): the carried cache under true_eviction, the last fed
turn's under full_context, None before anything was fed; ``run_episode`` stores it on the result."""

from __future__ import annotations

import pytest

import nexus
from agent_runner.backends.forced_prefix import ForcedPrefix
from agent_runner.backends.hf import HFBackend
from agent_runner.config import AgentConfig, EpisodeSpec
from agent_runner.episode import EpisodeHooks, run_episode
from agent_runner.records import Message
from agent_runner.sampling import SamplingConfig
from tests.agent_runner.conftest import RecordingEnvironment, TinyTask
from tests.tiny_models import tiny_host

SYSTEM = "You are a careful software engineer. " * 20
ISSUE = "The parser drops the last field of every row when the line ends with a comma. " * 8


@pytest.fixture(scope="module")
def host():
    return tiny_host()


def _backend(host, protocol, method="snapkv"):
    cfg = nexus.EvictionConfig(method=method, scope="prefill_decode")
    sampling = SamplingConfig(max_new_tokens=12)
    return HFBackend(host, eviction=cfg, protocol=protocol, sampling=sampling, max_context_tokens=65536)


@pytest.mark.parametrize("protocol", ["true_eviction", "full_context"])
def test_retention_is_the_last_fed_caches_even_after_a_full_context_window(host, protocol):
    b = _backend(host, protocol)
    b.reset(seed=0)
    assert b.retention() is None
    msgs = [Message(role="system", content=SYSTEM), Message(role="user", content=ISSUE)]
    first = b.complete(msgs)
    after_first = b.retention()
    assert after_first["logical_length"] == first.logical_length
    assert after_first == nexus.retention_runs(b.cache)
    # the next call finds the window full: nothing is fed, and the final cache stays the first turn's
    b.max_context_tokens = first.logical_length + 1
    msgs += [Message(role="assistant", content=first.text), Message(role="user", content="Exit code: 0\n" * 20)]
    second = b.complete(msgs)
    assert second.context_full and second.tokens_generated == 0
    assert b.retention() == after_first
    b.reset(seed=0)
    assert b.retention() is None


def test_run_episode_stores_the_retention_map_read_before_the_next_reset(host):
    b = _backend(host, "true_eviction")
    forced = ForcedPrefix(["no call here"], b)  # a forced prefix, then the live backend
    task = TinyTask()
    spec = EpisodeSpec(
        suite="mini",
        task_id=task.instance_id,
        backend="hf",
        protocol="true_eviction",
        seed=0,
        agent=AgentConfig(max_steps=2, max_format_errors=None),
        grade=False,
        eviction={},
    )
    hooks = EpisodeHooks(open_environment=lambda task, **kw: RecordingEnvironment())
    result = run_episode(spec, task=task, model=forced, hooks=hooks)
    assert result.exit_status == "step_limit", result.error
    assert result.retention is not None and result.retention == b.retention()
    assert result.retention["logical_length"] == result.turns[-1].completion.logical_length
