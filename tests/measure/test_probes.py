"""Quality probes: settings, the samples' construction, and that the scoring measures what it says.

The scoring tests run on the tiny model (plumbing: every cell of a sample is scored from one recorded
prefill) and on the real model (`smollm2` fixture): dense answers the needle, a method that keeps
everything answers exactly like dense, and one that provably dropped the needle's tokens does not.
"""

from __future__ import annotations

import pytest
import torch

from measure.probes import ProbeSettings, check_probe_settings, parse_variant, run_probes
from measure.probes.samples import build_sample, later_turn_sample
from tests import tiny_models

TINY = dict(model="tiny", samples=2, lengths=(256,), densities=(0.5,), protocols=("true_eviction", "full_context"))


@pytest.fixture(scope="module")
def tiny_host():
    return tiny_models.tiny_host()


def test_parse_variant():
    assert parse_variant("nexus") == ("nexus", {})
    assert parse_variant("nexus(lam=0, block_size=16, head_scores=per_head)") == (
        "nexus",
        {"lam": 0, "block_size": 16, "head_scores": "per_head"},
    )
    for bad in ("nexus(lam)", "nexus(lam=0", "nope", "nexus()x"):
        with pytest.raises(ValueError):
            parse_variant(bad)


def test_settings_are_checked_before_any_model_runs():
    with pytest.raises(ValueError, match="unknown probe"):
        ProbeSettings(probes=("needle", "haystack"))
    with pytest.raises(ValueError, match="in \\(0, 1\\]"):
        ProbeSettings(densities=(0.0,))
    with pytest.raises(ValueError, match="lam"):  # a bad method setting fails before loading anything
        check_probe_settings(ProbeSettings(variants=("dense", "nexus(lam=-1)")))


def test_samples_are_deterministic_and_the_later_turn_gives_no_hint(tiny_host):
    tok, settings = tiny_host.tokenizer, ProbeSettings(**TINY)
    for probe in ("needle", "later_turn", "nll"):
        a, b = build_sample(probe, tok, 1, settings), build_sample(probe, tok, 1, settings)
        assert (a.prefill, a.reply, a.question, a.target, a.expected) == (
            b.prefill,
            b.reply,
            b.question,
            b.target,
            b.expected,
        )
    for index in range(6):
        s = later_turn_sample(tok, index, 0, (512, 1024), (0.1, 0.5, 0.9))
        history, reply, question = (tok.decode(x) for x in (s.prefill, s.reply, s.question))
        assert history.count(s.expected) == 1  # the fact is in the viewed file, once
        assert s.expected not in reply + question  # and nowhere after it: the answer must come from the cache
        assert "Quote the" in question and "Quote the" not in history + reply  # the question comes later
        line = tok.decode(s.target)
        assert line in history and s.expected in line


def test_every_cell_is_scored_and_a_method_that_keeps_everything_equals_dense(tiny_host):
    settings = ProbeSettings(**TINY, variants=("dense", "snapkv", "nexus"), scopes=("prefill_only", "prefill_decode"))
    results = list(run_probes(tiny_host, settings))
    per_probe = {"needle": 2 * 3, "later_turn": 2 * 2 * 3, "nll": 2 * 3}
    for probe, cells in per_probe.items():
        assert len([r for r in results if r.probe == probe]) == cells * settings.samples
    keep_all = ProbeSettings(**{**TINY, "densities": (1.0,)}, variants=("dense", "snapkv"))
    by_cell = {}
    for r in run_probes(tiny_host, keep_all):
        by_cell.setdefault((r.probe, r.protocol, r.sample), {})[r.variant] = r
    for pair in by_cell.values():
        dense, snap = pair["dense"], pair["snapkv"]
        assert (snap.answer, snap.correct) == (dense.answer, dense.correct)
        assert snap.nll == pytest.approx(dense.nll, abs=1e-5) if dense.nll is not None else snap.nll is None
        assert snap.kept_fraction == 1.0


def _span(ids: list[int], tokens: list[int]) -> range:
    for start in range(len(ids) - len(tokens) + 1):
        if ids[start : start + len(tokens)] == tokens:
            return range(start, start + len(tokens))
    raise AssertionError("needle tokens not found in the prompt")


@torch.no_grad()
def test_the_needle_score_fails_exactly_when_the_needle_is_gone(smollm2_host):
    """On the real model: dense answers; snapkv at density 1 answers the same; streaming_llm at 20%, whose
    cache provably lacks every token of the needle in every layer, does not."""
    from measure.probes.runner import eviction_config, run_cell
    from nexus.shared_prefill import record_prefill

    host = smollm2_host
    settings = ProbeSettings(model="smollm2-135m", lengths=(1024,), depths=(0.5,))
    sample = build_sample("needle", host.tokenizer, 0, settings)
    recorded = record_prefill(host.model, torch.tensor([sample.prefill]))
    dense = run_cell(
        host, sample, recorded, eviction_config("dense", "prefill_only", 1.0, 0, "paper"), "single_prefill"
    )
    assert dense["correct"], dense["answer"]
    keep_all = run_cell(
        host, sample, recorded, eviction_config("snapkv", "prefill_only", 1.0, 0, "paper"), "single_prefill"
    )
    assert keep_all["answer"] == dense["answer"]

    streaming = eviction_config("streaming_llm", "prefill_only", 0.2, 0, "paper")
    needle = _span(sample.prefill, host.tokenizer.encode(sample.expected, add_special_tokens=False))
    cache = recorded.cache_for(streaming)
    for layer in range(cache.num_layers):
        kept = set(cache.retained_positions(layer).flatten().tolist())
        assert kept.isdisjoint(needle), layer
    dropped = run_cell(host, sample, recorded, streaming, "single_prefill")
    assert not dropped["correct"], dropped["answer"]
