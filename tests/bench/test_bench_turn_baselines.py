"""bench/turn_baselines.py: what produced a copied source, and the table it prints."""

from __future__ import annotations

from tests.bench.conftest import load_script


def test_a_sources_kind_is_the_tool_call_before_it():
    bench = load_script("turn_baselines")
    assert bench.source_kind({"name": "file_editor", "arguments": {"command": "view", "path": "/x.py"}}) == "file view"
    assert bench.source_kind({"name": "file_editor", "arguments": {"command": "str_replace"}}) == "edit snippet"
    assert bench.source_kind({"name": "execute_bash", "arguments": {"cmd": "python -m pytest -q t.py"}}) == "test run"
    assert bench.source_kind({"name": "execute_bash", "arguments": {"cmd": "find . -name '*.py'"}}) == "listing"
    assert bench.source_kind({"name": "search", "arguments": {"search_term": "parse"}}) == "search result"
    assert bench.source_kind(None) == "other"


def test_the_table_puts_held_memory_and_the_equal_memory_test_beside_each_setting():
    bench = load_script("turn_baselines")
    test = dict(tasks=16, diff=-0.05, p=0.002, down=13)
    row = dict(setting="snapkv[candidates=newest_turn]", protocol="full_context", density=0.2, tasks=16,
               copy_top1=0.62, ci=[0.58, 0.66], held_mb=23.2, peak_mb=35.1, vs_dense=test,
               vs_equal_memory=None)  # fmt: skip
    gap = dict(setting="snapkv", density=0.2, tasks=16, diff=0.04, p=0.01, down=2)
    loss = dict(setting="snapkv", protocol="true_eviction", density=0.2, group="kind:file view", tasks=5, spans=28,
                top1=0.567, dense=0.755)  # fmt: skip
    text = bench.markdown(dict(dtype="bfloat16", table=[row], gaps=[gap], losses=[loss]))
    assert "**full_context, prefill-only, density 0.2** (bfloat16)" in text
    assert (
        "| snapkv[candidates=newest_turn] | 16 | 62.0 [58-66] | 23.2 / 35.1 | -5.0 (p 0.002, 13/16 down) | - |" in text
    )
    assert "| 0.2 | snapkv | 16 | +4.0 (p 0.01, 2/16 down) |" in text
    assert "| true_eviction | 0.2 | snapkv | kind:file view | 5 | 28 | 56.7 | 75.5 |" in text
