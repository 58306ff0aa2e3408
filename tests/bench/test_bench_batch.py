"""bench/batch.py at a tiny size: the JSON it writes keeps its schema, and its ratios come from the same run."""

from __future__ import annotations

import json

import pytest

from tests.bench.conftest import load_script

RUN_KEYS = {
    "label",
    "method",
    "scope",
    "path",
    "rows",
    "steps",
    "warmup",
    "tokens_per_s",
    "tokens_per_s_rounds",
    "wall_s_rounds",
    "step_ms_median",
    "step_ms_p95",
    "step_ms_mean",
    "ratio_vs_n1",
    "ratio_vs_solo",
    "row_hooks_ms_per_step",
    "decode_events_per_row",
    "decode_events_rows",
    "stack_bytes_per_row",
    "own_bytes_per_row",
    "capacity_layer0",
    "longest_layer0",
    "logical_lengths",
    "peak_bytes_decode",
}
PROMPT, OFFSET, PRE, STEPS, WARMUP = 256, 37, 4, 16, 2


@pytest.fixture(scope="module")
def batch_script():
    return load_script("batch")


@pytest.fixture(scope="module")
def tiny_run(batch_script, tmp_path_factory):
    out = tmp_path_factory.mktemp("batch") / "batch.json"
    # block size 8: the decode slack is 8 tokens, so a Nexus row evicts every 8-15 steps, inside the 16 timed ones
    batch_script.main(
        [
            "--model",
            "tiny",
            "--layers",
            "2",
            "--prompt-tokens",
            str(PROMPT),
            "--row-offset",
            str(OFFSET),
            "--rows",
            "1,2",
            "--methods",
            "dense,nexus",
            "--steps",
            str(STEPS),
            "--warmup",
            str(WARMUP),
            "--pre-decode",
            str(PRE),
            "--block-size",
            "8",
            "--repeats",
            "2",
            "--threads",
            "1",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    return json.loads(out.read_text())


def test_schema_is_stable(tiny_run):
    meta = tiny_run["meta"]
    assert meta["schema"] == "nexus-bench-batch/1" and meta["complete"] is True
    assert {
        "env",
        "dtype",
        "attn",
        "model",
        "layers",
        "params",
        "threads",
        "prefill_s",
        "pre_decode_s",
        "budget",
    } <= set(meta)
    assert meta["model"] == "tiny" and meta["layers"] == 2 and meta["threads"] == 1 and meta["dtype"] == "float32"
    # ragged rows: row r's prompt is r * offset shorter
    assert meta["prompt_lengths"] == [PROMPT, PROMPT - OFFSET]
    assert meta["row_prompt_lengths"] == [PROMPT, PROMPT - OFFSET]
    assert set(meta["prefill_s"]) == {"dense", "nexus"} and all(len(s) == 2 for s in meta["prefill_s"].values())
    assert meta["args"]["rows"] == [1, 2] and meta["args"]["methods"] == ["dense", "nexus"]
    assert meta["budget"]["dense"] is None and 0 < meta["budget"]["nexus"] < PROMPT
    keys = {(r["label"], r["path"], r["rows"]) for r in tiny_run["runs"]}
    assert keys == {(m, p, n) for m in ("dense", "nexus") for p, n in (("solo", 1), ("stack", 1), ("stack", 2))}
    for run in tiny_run["runs"]:
        assert set(run) == RUN_KEYS
        assert run["steps"] == STEPS and run["warmup"] == WARMUP and len(run["tokens_per_s_rounds"]) == 2
        assert run["tokens_per_s"] > 0 and run["step_ms_p95"] >= run["step_ms_median"] > 0
        assert run["peak_bytes_decode"] is None  # CPU


def test_ratios_are_against_n1_of_the_same_run(tiny_run):
    runs = {(r["label"], r["path"], r["rows"]): r for r in tiny_run["runs"]}
    for method in ("dense", "nexus"):
        n1, solo = runs[(method, "stack", 1)], runs[(method, "solo", 1)]
        assert n1["ratio_vs_n1"] == pytest.approx(1.0)
        assert solo["ratio_vs_n1"] is None and solo["ratio_vs_solo"] == pytest.approx(1.0)
        for r in (n1, runs[(method, "stack", 2)]):
            assert r["ratio_vs_n1"] == pytest.approx(r["tokens_per_s"] / n1["tokens_per_s"])
            assert r["ratio_vs_solo"] == pytest.approx(r["tokens_per_s"] / solo["tokens_per_s"])
        # tokens/s is the median over rounds of N * steps / wall
        for r in runs.values():
            rounds = [r["rows"] * STEPS / w for w in r["wall_s_rounds"]]
            assert rounds == pytest.approx(r["tokens_per_s_rounds"])


def test_rows_decode_and_evict_on_their_own(tiny_run):
    runs = {(r["label"], r["path"], r["rows"]): r for r in tiny_run["runs"]}
    dense2, nexus2 = runs[("dense", "stack", 2)], runs[("nexus", "stack", 2)]
    # every row advanced pre-decode + warmup + steps tokens from its own prompt length
    decoded = PRE + WARMUP + STEPS
    for r in (dense2, nexus2):
        assert r["logical_lengths"] == [PROMPT + decoded, PROMPT - OFFSET + decoded]
    # dense never evicts and holds every token; the stack is padded to the longest row
    assert dense2["decode_events_rows"] == [0, 0] and dense2["longest_layer0"] == PROMPT + decoded
    # nexus (prefill_decode) evicts while decoding, in every row, and holds far less than dense
    assert all(e >= 1 for e in nexus2["decode_events_rows"]) and nexus2["scope"] == "prefill_decode"
    assert nexus2["stack_bytes_per_row"] < dense2["stack_bytes_per_row"] / 2
    assert nexus2["own_bytes_per_row"] < dense2["own_bytes_per_row"] / 2
    assert runs[("nexus", "solo", 1)]["stack_bytes_per_row"] is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--methods", "dense,fastest"], "unknown method 'fastest'"),
        (["--methods", "dynamic"], "EvictableCaches only"),
        (["--rows", "0,2"], "must be >= 1"),
        (["--rows", "1,two"], "comma-separated integers"),
        (["--prompt-tokens", "64", "--rows", "1,4", "--distinct-prompts", "0"], "shortest prompt"),
    ],
)
def test_bad_arguments_name_the_value(batch_script, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        batch_script.parse_args(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_lists_and_distinct_prompts(batch_script):
    args = batch_script.parse_args(["--rows", "8,1", "2", "--methods", "nexus", "snapkv@prefill_only,nexus"])
    assert args.rows == [1, 2, 8] and args.methods == ["nexus", "snapkv@prefill_only"]
    assert batch_script.prompt_lengths(args) == [4096, 4059]  # default: 2 prompts, row r decodes a copy of r % 2
    assert args.pre_decode == 32 and args.steps == 32 and args.model == "llama-3.1-8b" and args.layers == 1
    args = batch_script.parse_args(["--rows", "1,8", "--distinct-prompts", "0", "--prompt-tokens", "8192"])
    assert batch_script.prompt_lengths(args) == [8192 - 37 * r for r in range(8)]
