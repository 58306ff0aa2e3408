"""JobSpec: validation with clear errors, YAML errors naming the file, hashing, fan-out counts."""

from __future__ import annotations

import pytest

from agent_runner.config import AgentConfig, EpisodeSpec, ModelSpec, SamplingConfig
from jobs.job_file import JobSpecError
from jobs.spec import JobSpec
from nexus.config import EvictionConfig
from nexus.presets import PAPER, PRESETS

BASE = {"backend": "oracle", "methods": ["dense", "nexus"], "tasks": {"suite": "mini"}}


def spec(**changes) -> JobSpec:
    return JobSpec.from_dict({**BASE, **changes})


def errors_of(data, source="<spec>") -> list[tuple[str, str]]:
    with pytest.raises(JobSpecError) as info:
        JobSpec.from_dict(data, source=source)
    return info.value.errors


def test_defaults_and_frozen():
    s = spec()
    assert (s.scopes, s.protocols, s.seeds, s.density) == (["prefill_decode"], ["true_eviction"], [0], 0.2)
    assert s.limits == AgentConfig() and s.limits.max_steps == 100 and s.limits.soft_step_limit == 40
    with pytest.raises(Exception, match="frozen"):
        s.density = 0.5


@pytest.mark.parametrize(
    ("change", "field", "needle"),
    [
        ({"methods": ["dense", "snap_kv"]}, "methods.1", "unknown method 'snap_kv'; known: dense, snapkv"),
        ({"scopes": ["decode_only"]}, "scopes.0", "unknown scope 'decode_only'"),
        (
            {"protocols": ["full"]},
            "protocols.0",
            "unknown protocol 'full'; known: true_eviction, full_context",
        ),
        ({"density": 0}, "density", "density must be in (0, 1], got 0"),
        ({"density": 1.5}, "density", "density must be in (0, 1], got 1.5"),
        ({"seeds": []}, "seeds", "at least 1 item"),
        ({"seeds": [1, 1]}, "seeds", "lists [1] more than once"),
        ({"methods": []}, "methods", "at least 1 item"),
        (
            {"method_params": {"snapkv": {"window": 8}}},
            "",
            "method_params has ['snapkv'], which are not in methods",
        ),
        ({"method_params": {"snapkvv": {}}}, "method_params.snapkvv", "unknown method 'snapkvv'"),
        ({"limits": {"seed": 3}}, "limits.seed", "a job's seeds are its top-level 'seeds'"),
        ({"limits": {"max_new_tokens": 9}}, "limits.max_new_tokens", "use sampling.max_new_tokens"),
        ({"openai": {"seed": 3, "max_tokens": 9}}, "", "openai.max_tokens -> sampling.max_new_tokens, openai.seed"),
        ({"backend": "vllm"}, "backend", "'hf', 'openai' or 'oracle'"),
        ({"tasks": {"suite": "mini", "file": "x.jsonl"}}, "tasks", "exactly one of 'suite' or 'file'"),
        ({"tasks": {"suite": "mini", "ids": []}}, "tasks", "'ids' is empty"),
        ({"limits": {"max_step": 5}}, "limits.max_step", "unknown field 'max_step'"),
        ({"limits": {"max_steps": 0}}, "limits.max_steps", "greater than or equal to 1"),
        ({"sampling": {"top_p": 1.5}}, "sampling.top_p", "less than or equal to 1"),
        ({"sampling": {"top_k": -1}}, "sampling.top_k", "greater than or equal to 0"),
        ({"eviction": {"window": 0}}, "eviction", "window must be an integer >= 1, got 0"),
        ({"eviction": {"density": 0.5}}, "eviction", "unknown field(s) ['density']"),
        ({"model": {"name": "tiny", "nmae": "x"}}, "model.nmae", "unknown field 'nmae'"),
    ],
)
def test_validation_errors_name_the_field(change, field, needle):
    errors = errors_of({**BASE, **change}, source="jobs/bad.yaml")
    assert any(loc == field and needle in msg for loc, msg in errors), errors


def test_error_text_names_file_and_field():
    with pytest.raises(JobSpecError) as info:
        JobSpec.from_dict({**BASE, "methods": ["densе"]}, source="jobs/x.yaml")  # a Cyrillic 'е'
    assert str(info.value).startswith("jobs/x.yaml: field 'methods.0': unknown method 'densе'")


def test_from_yaml_ok_and_round_trip(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: demo\nmodel: {name: Qwen/Qwen3-0.6B, revision: abc123}\nbackend: hf\nmethods: [dense, snapkv]\n"
        "scopes: [prefill_only, prefill_decode]\nprotocols: [true_eviction, full_context]\ndensity: 0.3\n"
        "method_params: {snapkv: {kernel_size: 7}}\nseeds: [0, 1]\nlimits: {max_steps: 20}\n"
        "sampling: {temperature: 0.6, top_p: 0.95, top_k: 20}\ntasks: {suite: mini, ids: ['mini__*']}\n"
    )
    s = JobSpec.from_yaml(path)
    assert (s.name, s.model.revision, s.density, s.limits.max_steps, s.sampling.top_k) == (
        "demo",
        "abc123",
        0.3,
        20,
        20,
    )
    again = tmp_path / "again.yaml"
    again.write_text(s.to_yaml())
    assert JobSpec.from_yaml(again) == s


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("methods: [dense\n", "invalid YAML: line 2"),
        ("", "the file is empty"),
        ("- dense\n- nexus\n", "a job spec must be a mapping, got list"),
        (
            "backend: oracle\nmethods: [dense, nexuss]\ntasks: {suite: mini}\n",
            "field 'methods.1': unknown method 'nexuss'",
        ),
    ],
)
def test_yaml_errors_name_the_file(tmp_path, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(JobSpecError) as info:
        JobSpec.from_yaml(path)
    assert str(info.value).startswith(str(path)) and needle in str(info.value)


def test_missing_file():
    with pytest.raises(JobSpecError, match="nope.yaml: cannot read"):
        JobSpec.from_yaml("nope.yaml")


def test_config_hash_is_stable_and_ignores_name_and_order():
    a = spec(name="a", methods=["dense", "nexus"], seeds=[0, 1])
    b = spec(name="b", methods=["nexus", "dense"], seeds=[1, 0])
    assert a.config_hash() == b.config_hash() and len(a.config_hash()) == 64
    assert a.config_hash() != spec(methods=["dense", "nexus"], seeds=[0, 1], density=0.3).config_hash()
    assert '"density":0.2' in a.canonical_json() and '"name":"a"' not in a.canonical_json()


def test_fan_out_counts_with_dense_once_per_task_and_seed():
    s = spec(
        methods=["dense", "snapkv", "nexus"],
        scopes=["prefill_only", "prefill_decode"],
        protocols=["true_eviction", "full_context"],
        seeds=[0, 1, 2],
    )
    eps = s.episodes(["t1", "t2"])
    # per task: dense 1 cell x 3 seeds + 2 evicting methods x 4 cells x 3 seeds = 3 + 24
    assert len(eps) == 2 * (3 + 24) == len(set(eps))
    dense = [e for e in eps if e.method == "dense"]
    assert {(e.scope, e.protocol) for e in dense} == {("prefill_only", "true_eviction")}
    per_cell = spec(methods=["dense"], scopes=["prefill_only", "prefill_decode"], dense_per_cell=True).episodes(["t"])
    assert [(e.scope, e.seed) for e in per_cell] == [("prefill_only", 0), ("prefill_decode", 0)]


def test_episode_config_is_the_merged_config():
    s = spec(methods=["nexus"], method_params={"nexus": {"walk_steps": 3}}, seeds=[7])
    (ep,) = s.episodes(["t1"])
    assert (ep.task_id, ep.method, ep.scope, ep.protocol, ep.seed) == (
        "t1",
        "nexus",
        "prefill_decode",
        "true_eviction",
        7,
    )
    eviction = ep.config["eviction"]
    assert eviction["method_params"] == {**PAPER["nexus"], "walk_steps": 3} and eviction["density"] == 0.2
    assert ep.config["agent"]["max_steps"] == 100 and ep.config["backend"] == "oracle"
    assert (ep.config["suite"], ep.config["tasks_file"], eviction["block_size"]) == ("mini", None, 32)
    assert ep.config["model"] == ModelSpec().model_dump(mode="json")  # oracle: the runner's default model spec


def test_task_selection_exact_and_glob():
    s = spec(tasks={"suite": "mini", "ids": ["b", "mini__a*"]})
    assert s.tasks.select(["mini__a1", "b", "c", "mini__a2"]) == ["mini__a1", "b", "mini__a2"]
    with pytest.raises(JobSpecError) as info:
        spec(tasks={"suite": "mini", "ids": ["zzz", "q*"]}).episodes(["a", "b"])
    assert [m for _, m in info.value.errors] == [
        "no task 'zzz' in mini",
        "pattern 'q*' matches no task in mini",
    ]


def test_the_job_composes_the_runners_own_configs():
    fields = JobSpec.model_fields
    assert fields["model"].annotation == ModelSpec
    assert (fields["limits"].annotation, fields["sampling"].annotation) == (AgentConfig, SamplingConfig)
    assert set(spec().eviction) == {"budget_tokens", "block_size", "window", "slack_blocks", "candidates"}
    cfg = spec(methods=["nexus"], eviction={"window": 8}).eviction_config("nexus", "prefill_only", 4)
    assert isinstance(cfg, EvictionConfig)
    assert (cfg.method, cfg.scope, cfg.seed, cfg.window, cfg.block_size, cfg.density) == (
        "nexus",
        "prefill_only",
        4,
        8,
        32,
        0.2,
    )
    # Every fanned-out episode config is a valid EpisodeSpec, with the job's values in it.
    job = JobSpec.from_dict(
        {
            "model": {"name": "tiny", "revision": "r1"},
            "methods": ["dense", "nexus"],
            "density": 0.5,
            "protocols": ["true_eviction", "full_context"],
            "seeds": [3],
            "method_params": {"nexus": {"walk_steps": 2}},
            "limits": {"max_steps": 7},
            "sampling": {"temperature": 0.0},
            "tasks": {"suite": "mini"},
        }
    )
    for ep in job.episodes(["t1"]):
        spec_ = EpisodeSpec.model_validate(ep.config)
        assert spec_ == job.episode_config("t1", ep.method, ep.scope, ep.protocol, ep.seed)
        assert (spec_.task_id, spec_.eviction.method, spec_.protocol, spec_.seed, spec_.eviction.density) == (
            "t1",
            ep.method,
            ep.protocol,
            3,
            0.5,
        )
        assert (spec_.agent.max_steps, spec_.sampling.temperature, spec_.model.revision) == (7, 0.0, "r1")
        want = {**PAPER["nexus"], "walk_steps": 2} if ep.method == "nexus" else {}
        assert spec_.eviction.method_params == want
        assert spec_.eviction.seed == 3


@pytest.mark.slow  # imports torch through nexus
def test_check_with_library_rejects_bad_method_params():
    spec(methods=["dense", "nexus"]).check_with_library()
    bad = spec(methods=["nexus", "h2o"], method_params={"nexus": {"reservoir_n": 0}, "h2o": {"recent_ratio": 1.5}})
    with pytest.raises(JobSpecError) as info:
        bad.check_with_library(source="job.yaml")
    assert info.value.errors == [
        ("method_params.nexus.reservoir_n", "nexus: reservoir_n must be an integer >= 1, got 0"),
        ("method_params.h2o.recent_ratio", "h2o: recent_ratio must be a finite number in [0.0, 1.0), got 1.5"),
    ]
    assert str(info.value).startswith("job.yaml: field 'method_params.nexus.reservoir_n': nexus: reservoir_n")
    # a per-method window that leaves a budget below what the method must keep
    small = spec(
        methods=["nexus"], density=0.2, eviction={"budget_tokens": 100}, method_params={"nexus": {"window": 64}}
    )
    with pytest.raises(JobSpecError, match="method_params.nexus.*below what nexus must keep"):
        small.check_with_library()
    # every preset builds every method
    for preset in PRESETS:
        spec(methods=list(PAPER), preset=preset).check_with_library()


def test_presets_resolve_into_the_stored_config():
    """The stored config holds every method's resolved settings; overrides win over the preset; the
    per-method shared fields reach the method's EvictionConfig and no other method's."""
    s = spec(methods=["snapkv", "morphkv", "nexus"], preset="reference", method_params={"snapkv": {"kernel_size": 5}})
    stored = s.model_dump(mode="json")
    assert stored["preset"] == "reference"
    assert stored["method_params"]["snapkv"] == {**PAPER["snapkv"], "window": 32, "kernel_size": 5}
    assert stored["method_params"]["morphkv"] == {"fusion": "max", "window": 3, "slack_blocks": 0}
    assert stored["method_params"]["nexus"] == PAPER["nexus"]
    snap = s.eviction_config("snapkv", "prefill_only", 0)
    assert (snap.window, snap.slack_blocks, snap.method_params["kernel_size"]) == (32, 1, 5)
    morph = s.eviction_config("morphkv", "prefill_decode", 0)
    assert (morph.window, morph.slack_blocks) == (3, 0)
    assert s.eviction_config("nexus", "prefill_decode", 0).window == 16  # the job's shared window
    # the stored form validates back to the same spec (a rerun reads it), and hashes the same
    again = JobSpec.from_dict(stored)
    assert again == s and again.config_hash() == s.config_hash()
    # the same methods under another preset are another configuration
    assert spec(methods=["snapkv", "morphkv", "nexus"]).config_hash() != s.config_hash()
    # an episode's stored config carries the resolved values too
    (ep,) = [e for e in s.episodes(["t1"]) if e.method == "morphkv"]
    assert ep.config["eviction"]["window"] == 3 and ep.config["eviction"]["slack_blocks"] == 0


def test_preset_and_per_method_errors_name_the_method_and_field():
    assert errors_of({**BASE, "preset": "kvpress"}) == [
        ("preset", "unknown preset 'kvpress'; known: paper, reference, kvcache_factory")
    ]
    (err,) = errors_of({**BASE, "methods": ["h2o"], "method_params": {"h2o": {"recent_ratoi": 0.1}}})
    assert err[1].startswith("method_params.h2o: unknown setting(s) ['recent_ratoi']; known: window")
    (err,) = errors_of({**BASE, "methods": ["snapkv"], "method_params": {"snapkv": {"window": 0}}})
    assert err[1] == "method_params.snapkv: window must be an integer >= 1, got 0"


def test_a_nexus_setting_stored_before_leftover_existed_reads_as_what_it_ran_with():
    """Jobs and episodes store their methods' whole resolved settings. One stored before ``leftover`` existed ran
    with whole blocks only ("unused"); read back, it must not silently become today's default ("partial_block")
    when it is replayed or rerun, and compare must not report the two as a settings difference."""
    from jobs.episode_config import stored_episode_spec

    fresh = spec(methods=["nexus", "ada_nexus"])
    assert fresh.method_params["nexus"]["leftover"] == "partial_block"
    stored = fresh.model_dump(mode="json")
    for method in ("nexus", "ada_nexus"):
        del stored["method_params"][method]["leftover"]  # as an older release stored it
    old = JobSpec.from_stored(stored)
    assert {m: old.method_params[m]["leftover"] for m in ("nexus", "ada_nexus")} == {
        "nexus": "unused",
        "ada_nexus": "unused",
    }
    assert JobSpec.from_stored(fresh.model_dump(mode="json")).method_params["nexus"]["leftover"] == "partial_block"
    episode = fresh.episode_config("t1", "nexus", "prefill_decode", "true_eviction", 0).model_dump(mode="json")
    assert stored_episode_spec(episode).eviction.method_params["leftover"] == "partial_block"
    del episode["eviction"]["method_params"]["leftover"]
    assert stored_episode_spec(episode).eviction.method_params["leftover"] == "unused"
