"""bench/decode.py at a tiny size: the JSON it writes keeps its schema, and its numbers mean what they say."""

from __future__ import annotations

import json

import pytest

RUN_KEYS = {
    "label",
    "method",
    "scope",
    "prefill_tokens",
    "batch",
    "prefill_s",
    "prefill_eviction_s",
    "budget",
    "decode_steps",
    "truncated",
    "max_seconds",
    "checkpoints",
}
CHECKPOINT_KEYS = {
    "decode_len",
    "wall_s",
    "tokens_per_s",
    "step_ms_median",
    "step_ms_p95",
    "step_ms_mean",
    "eviction_s",
    "eviction_s_host",
    "decode_events",
    "kv_held_bytes_per_seq",
    "kv_allocated_bytes_per_seq",
    "kv_slots_layer0",
    "logical_length",
    "kv_read_bytes_mean",
    "floor_step_ms",
    "floor_fraction",
    "peak_bytes_excl_weights",
}


@pytest.fixture(scope="module")
def tiny_run(decode_script, tmp_path_factory):
    out = tmp_path_factory.mktemp("decode") / "decode.json"
    decode_script.main(
        [
            "--model",
            "tiny",
            "--prefill",
            "512",
            "--decode",
            "48",
            "--report-at",
            "16",
            "48",
            "--methods",
            "dense",
            "nexus",
            "snapkv@prefill_only",
            "--threads",
            "1",
            "--copy-mib",
            "8",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    return json.loads(out.read_text())


def test_schema_is_stable(tiny_run):
    meta = tiny_run["meta"]
    assert meta["schema"] == "nexus-bench-decode/2" and meta["complete"] is True
    assert {
        "env",
        "dtype",
        "attn",
        "model",
        "layers",
        "params",
        "weight_bytes_read",
        "copy_bandwidth_gbs",
        "threads",
        "args",
    } <= set(meta)
    assert meta["threads"] == 1 and meta["dtype"] == "float32" and meta["model"] == "tiny"
    assert [r["label"] for r in tiny_run["runs"]] == ["dense", "nexus", "snapkv@prefill_only"]
    for run in tiny_run["runs"]:
        assert set(run) == RUN_KEYS
        assert [cp["decode_len"] for cp in run["checkpoints"]] == [16, 48]
        for cp in run["checkpoints"]:
            assert set(cp) == CHECKPOINT_KEYS


def test_numbers_follow_the_cache(tiny_run):
    runs = {r["label"]: r for r in tiny_run["runs"]}
    dense, nexus_run, snap = runs["dense"], runs["nexus"], runs["snapkv@prefill_only"]
    # dense keeps every token: prefill + decoded steps (the step's own token is appended during the step)
    assert [cp["kv_slots_layer0"] for cp in dense["checkpoints"]] == [512 + 16, 512 + 48]
    assert dense["budget"] is None and dense["checkpoints"][-1]["decode_events"] == 0
    # nexus under prefill_decode stays pinned near its budget (+ one block of slack) and evicts while decoding
    last = nexus_run["checkpoints"][-1]
    assert nexus_run["scope"] == "prefill_decode"
    assert last["kv_slots_layer0"] <= nexus_run["budget"] + 32 and last["decode_events"] >= 1
    assert last["kv_allocated_bytes_per_seq"] < dense["checkpoints"][-1]["kv_allocated_bytes_per_seq"]
    assert last["kv_held_bytes_per_seq"] <= last["kv_allocated_bytes_per_seq"]
    # snapkv prefill_only: one prefill eviction, then the cache grows by one slot per step
    assert snap["scope"] == "prefill_only"
    assert [cp["kv_slots_layer0"] for cp in snap["checkpoints"]] == [snap["budget"] + 16, snap["budget"] + 48]
    assert snap["checkpoints"][-1]["decode_events"] == 0 and snap["prefill_eviction_s"] > 0
    for run in runs.values():
        for cp in run["checkpoints"]:
            assert cp["logical_length"] == 512 + cp["decode_len"]
            assert cp["tokens_per_s"] > 0 and cp["step_ms_p95"] >= cp["step_ms_median"] > 0
            assert cp["floor_fraction"] > 0 and cp["floor_step_ms"] > 0
            assert abs(cp["tokens_per_s"] * cp["wall_s"] - cp["decode_len"]) < 1e-6 * cp["decode_len"]


def test_time_guard_truncates_and_says_so(decode_script, tmp_path):
    out = tmp_path / "d.json"
    decode_script.main(
        [
            "--model",
            "tiny",
            "--prefill",
            "64",
            "--decode",
            "100000",
            "--methods",
            "dense",
            "--max-seconds",
            "0.01",
            "--threads",
            "1",
            "--copy-mib",
            "8",
            "--out",
            str(out),
        ]
    )
    run = json.loads(out.read_text())["runs"][0]
    assert run["truncated"] is True and 0 < run["decode_steps"] < 100000
    assert run["checkpoints"][-1]["decode_len"] == run["decode_steps"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--methods", "fastest"], "unknown method 'fastest'"),
        (["--methods", "nexus@always"], "unknown scope 'always'"),
        (["--decode", "8", "--report-at", "16"], "exceeds --decode"),
        (["--model", "gpt-5"], "invalid choice"),
    ],
)
def test_bad_arguments_name_the_value(decode_script, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        decode_script.parse_args(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_shapes_follow_the_published_configs(decode_script):
    import common

    cfg = common.model_config("llama-3.1-8b")
    assert (
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.intermediate_size,
        cfg.vocab_size,
    ) == (32, 4096, 32, 8, 128, 14336, 128256)
    assert cfg.rope_parameters["rope_type"] == "llama3" and cfg.rope_parameters["rope_theta"] == 500000.0
    q32 = common.model_config("qwen3-32b")
    assert (q32.num_hidden_layers, q32.hidden_size, q32.num_attention_heads, q32.num_key_value_heads) == (
        64,
        5120,
        64,
        8,
    )
    assert common.model_config("qwen3-8b", layers=2).num_hidden_layers == 2
    with pytest.raises(ValueError, match="--layers must be in 1..32"):
        common.model_config("llama-3.1-8b", layers=33)
    with pytest.raises(ValueError, match="unknown model shape 'llama-9'"):
        common.model_config("llama-9")


@pytest.mark.parametrize(
    "shape, params",
    [
        ("llama-3.1-8b", 8_030_261_248),  # the published parameter counts of each release
        ("qwen3-8b", 8_190_735_360),
        ("qwen3-32b", 32_762_123_264),
    ],
)
def test_shapes_have_the_published_parameter_count(decode_script, shape, params):
    import common
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):  # no memory: only the shapes are built
        model = AutoModelForCausalLM.from_config(common.model_config(shape))
    assert sum(p.numel() for p in model.parameters()) == params
