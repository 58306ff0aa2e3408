"""Run a probe: for each sample, one dense prefill recorded once, then every cell's cache built from it.

``run_probes(host, settings, on_result=...)`` yields one ``ProbeResult`` per (cell, sample). Per sample:

1. build the sample's token sequences (``samples.build_sample``), the same in every cell;
2. prefill once, densely, and record it (``nexus.shared_prefill``): a prefill from an empty cache computes the
   same outputs under every method, only what each layer keeps differs, so each cell's cache is the recorded
   prefill replayed into that method's cache (exact; tested against real prefills);
3. per cell: carry the cache on as the probe says (later_turn under true eviction: the agent's reply as
   decoded tokens, then the question as a second prefill, which evicts again), score the exact target by
   teacher forcing on a copy of the cache, then answer greedily.

Greedy decoding (not the agent's temperature 1): a probe asks whether the kept cache still holds the fact,
and sampling noise would only widen every interval. Eviction's own random choices (Nexus's reservoir) use
the sample's seed (``sample_seed``), so cells of one sample share every draw they can.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator

import torch

from agent_runner.probes.samples import Sample, build_sample
from agent_runner.probes.settings import ProbeResult, ProbeSettings, parse_variant
from nexus.attention import cache_kwarg
from nexus.cache import EvictableCache
from nexus.config import EvictionConfig
from nexus.shared_prefill import record_prefill


def eviction_config(variant: str, scope: str, density: float, seed: int, preset: str) -> EvictionConfig:
    """The cache settings of one cell: the variant's method under `preset`, its own settings on top."""
    method, params = parse_variant(variant)
    return EvictionConfig.from_preset(method, preset, scope=scope, density=density, seed=seed, **params)


def sample_seed(seed: int, index: int) -> int:
    """The seed of eviction's random choices in sample `index` of a run seeded `seed` (every cell of the sample)."""
    return seed * 100_003 + index


def check_settings(settings: ProbeSettings) -> None:
    """Build every cell's config once, so a bad variant setting fails before any model runs (ValueError)."""
    for variant in settings.variants:
        for scope in settings.scopes:
            try:
                eviction_config(variant, scope, settings.densities[0], settings.seed, settings.preset)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"variant {variant!r}: {exc}") from exc


class CellStream:
    """One cell's cache and model, fed the way an agent feeds them."""

    def __init__(self, model, cache: EvictableCache):
        self.model, self.cache, self.kw = model, cache, cache_kwarg(model)

    def _forward(self, ids: list[int]) -> torch.Tensor:
        tensor = torch.tensor([ids], device=self.model.device)
        return self.model(input_ids=tensor, use_cache=True, **{self.kw: self.cache}).logits[0].float()

    def prefill(self, ids: list[int]) -> torch.Tensor:
        """A later turn: one multi-token forward (evicts at its end under every scope). Last logits [V]."""
        return self._forward(ids)[-1]

    def decoded(self, ids: list[int]) -> torch.Tensor:
        """Feed tokens as if the model had decoded them, split where a decode-time event falls (so the result
        equals one token at a time). Returns the logits [len(ids), V]."""
        out, pos = [], 0
        with self.cache.decoding():
            while pos < len(ids):
                n = self.cache.decode_chunk(len(ids) - pos)
                out.append(self._forward(ids[pos : pos + n]))
                pos += n
        return torch.cat(out)

    def teacher_forced_nll(self, last_logits: torch.Tensor, target: list[int]) -> float:
        """Mean NLL per token of `target` after `last_logits` (the distribution of its first token)."""
        logps = [torch.log_softmax(last_logits, -1)[target[0]]]
        if len(target) > 1:
            logits = self.decoded(target[:-1])
            picked = torch.log_softmax(logits, -1).gather(-1, torch.tensor(target[1:]).unsqueeze(-1))
            logps.extend(picked.squeeze(-1))
        return float(-torch.stack(logps).mean())

    def greedy(self, last_logits: torch.Tensor, max_new_tokens: int, stop: set[int], until=None) -> list[int]:
        """Greedy tokens up to `max_new_tokens` or a stop token; `until(tokens)` True also ends the answer
        (the verdict cannot change once the expected text is there, so the rest would only cost time)."""
        out: list[int] = []
        logits = last_logits
        for _ in range(max_new_tokens):
            token = int(logits.argmax())
            if token in stop:
                break
            out.append(token)
            if until is not None and until(out):
                break
            logits = self.decoded([token])[-1]
        return out

    def kept_fraction(self) -> float:
        c = self.cache
        return sum(c.occupancy(i) for i in range(c.num_layers)) / (c.num_layers * max(c.logical_length, 1))


@torch.no_grad()
def run_cell(host, sample: Sample, recorded, config: EvictionConfig, protocol: str) -> dict:
    """One cell of one sample from the recorded prefill: correct / nll / answer / cache numbers."""
    stream = CellStream(host.model, recorded.cache_for(config))
    last = recorded.logits[0, -1].float()
    if sample.probe == "later_turn" and protocol == "true_eviction":
        stream.decoded(sample.reply)
        last = stream.prefill(sample.question)
    kept, at_answer = stream.kept_fraction(), stream.cache.memory()
    nll, scorer = None, stream
    if sample.target:
        scorer = stream if sample.probe == "nll" else CellStream(host.model, copy.deepcopy(stream.cache))
        nll = scorer.teacher_forced_nll(last, sample.target)
    answer, correct = "", None
    if sample.max_new_tokens:
        decode = host.tokenizer.decode
        found = lambda tokens: sample.expected in decode(tokens, skip_special_tokens=True)  # noqa: E731
        tokens = stream.greedy(last, sample.max_new_tokens, set(host.stop_token_ids), until=found)
        answer = host.tokenizer.decode(tokens, skip_special_tokens=True)
        correct = sample.expected in answer
    # the peaks over the whole sample: the scoring copy starts from the answer's cache (its peaks included) and
    # stands in for it while scoring, so the larger of the two windows is the sample's
    ends = (stream.cache.memory(), scorer.cache.memory())
    return dict(
        correct=correct,
        nll=nll,
        answer=answer,
        kept_fraction=kept,
        kv_held_bytes=at_answer.kv_held_bytes,
        kv_allocated_bytes=at_answer.kv_allocated_bytes,
        kv_peak_held_bytes=max(m.kv_peak_held_bytes for m in ends),
        kv_peak_allocated_bytes=max(m.kv_peak_allocated_bytes for m in ends),
    )


def _prefill_ids(sample: Sample, protocol: str) -> list[int]:
    if sample.probe == "later_turn" and protocol == "full_context":
        return sample.prefill + sample.reply + sample.question  # the whole history, re-prefilled at once
    return sample.prefill


def run_probes(
    host, settings: ProbeSettings, *, on_result: Callable[[ProbeResult], None] | None = None
) -> Iterator[ProbeResult]:
    """Every (probe, sample, cell) of `settings` on `host` (a loaded ``ModelHost``), in a fixed order."""
    check_settings(settings)
    for probe in settings.probes:
        cells = settings.cells(probe)
        for index in range(settings.samples):
            sample = build_sample(probe, host.tokenizer, index, settings)
            seed = sample_seed(settings.seed, index)
            recorded: dict = {}
            # dense never evicts, so its cache ignores scope and density: one measurement serves every
            # dense cell of the sample (its seconds are that measurement's)
            dense: dict[tuple[str, str], tuple[dict, float]] = {}
            for variant, scope, protocol, density in cells:
                ids = _prefill_ids(sample, protocol)
                if protocol not in recorded:
                    recorded[protocol] = record_prefill(host.model, torch.tensor([ids], device=host.device))
                started = time.perf_counter()
                config = eviction_config(variant, scope, density, seed, settings.preset)
                if config.evicts or (variant, protocol) not in dense:
                    measured = run_cell(host, sample, recorded[protocol], config, protocol)
                    seconds = time.perf_counter() - started
                    if not config.evicts:
                        dense[variant, protocol] = measured, seconds
                else:
                    measured, seconds = dense[variant, protocol]
                result = ProbeResult(
                    probe=probe, variant=variant, scope=scope, protocol=protocol, density=density,
                    sample=index, source=sample.source, length=len(ids), depth=sample.depth,
                    scored_tokens=len(sample.target), expected=sample.expected,
                    seconds=seconds, **measured,
                )  # fmt: skip
                if on_result is not None:
                    on_result(result)
                yield result
            del recorded
