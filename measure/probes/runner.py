"""Run a probe: for each sample, one dense prefill recorded once, then every cell's cache built from it.

``run_probes(host, settings, on_result=...)`` yields one ``ProbeResult`` per (cell, sample). Per sample:

1. build the sample's token sequences (``samples.build_sample``), the same in every cell;
2. prefill once, densely, and record it (``nexus.shared_prefill``): a prefill from an empty cache computes the
   same outputs under every method, only what each layer keeps differs, so each cell's cache is the recorded
   prefill replayed into that method's cache (exact; tested against real prefills). The full-context history
   (later_turn) extends the first turn's recording instead of computing its shared part again;
3. all cells of the sample and protocol together, as rows of one stack (``measure.stacked_cells``; each cell
   equals the cell alone, tested): carry the caches on as the probe says (later_turn under true eviction: the
   agent's reply as decoded tokens, then the question as a second prefill, which evicts again), score the exact
   target by teacher forcing on copies of the caches, then answer greedily, each row its own tokens.

The probes render chat conversations, so every cache is told the segments of what it is fed (``nexus.segments``:
its ChatML messages) before the prefill that feeds them, as the hf backend tells it live; ``observation_masking``
and ``candidates: newest_turn`` decide by them. Under full context observation_masking's paper rule is the
text-level method: a sample whose conversation has observations to mask (later_turn) is prefilled with them
masked, a recording of its own (``_feed``).

Greedy decoding (not the agent's temperature 1): a probe asks whether the kept cache still holds the fact,
and sampling noise would only widen every interval. Eviction's own random choices (Nexus's reservoir) use
the sample's seed (``sample_seed``), so cells of one sample share every draw they can.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass

import torch

from agent_runner.chat_segments import ChatMarkers, chat_segments, mask_observations, text_masking
from measure.probes.samples import Sample, build_sample
from measure.probes.settings import ProbeResult, ProbeSettings, parse_variant
from measure.replay_cells import reads_segments
from measure.stacked_cells import Rows, greedy
from nexus.cache import EvictableCache
from nexus.config import EvictionConfig
from nexus.segments import Segment
from nexus.shared_prefill import RecordedPrefill, record_prefill

#: most cells answering greedily in one stack: the samples of a batch are chosen so their cells fit
ANSWER_ROWS = 64


def eviction_config(variant: str, scope: str, density: float, seed: int, preset: str) -> EvictionConfig:
    """The cache settings of one cell: the variant's method under `preset`, its own settings on top."""
    method, params = parse_variant(variant)
    return EvictionConfig.from_preset(method, preset, scope=scope, density=density, seed=seed, **params)


def sample_seed(seed: int, index: int) -> int:
    """The seed of eviction's random choices in sample `index` of a run seeded `seed` (every cell of the sample)."""
    return seed * 100_003 + index


def check_probe_settings(settings: ProbeSettings) -> None:
    """Build every cell's config once, so a bad variant setting fails before any model runs (ValueError)."""
    for variant in settings.variants:
        for scope in settings.scopes:
            try:
                eviction_config(variant, scope, settings.densities[0], settings.seed, settings.preset)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"variant {variant!r}: {exc}") from exc


def kept_fraction(cache: EvictableCache) -> float:
    return sum(cache.occupancy(i) for i in range(cache.num_layers)) / (cache.num_layers * max(cache.logical_length, 1))


@dataclass
class _Prepared:
    """One sample's cells carried to the question and scored, before they answer."""

    sample: Sample
    caches: list[EvictableCache]
    last: torch.Tensor  # [N, V] the distribution of each cell's first answer token
    kept: list[float]
    at_answer: list
    nll: list[float | None]
    scorers: list[EvictableCache]


@dataclass
class _Stream:
    """What cells' caches are built from: the recorded prefill of the ids they are fed, and those ids' segments."""

    recorded: RecordedPrefill
    segments: tuple[Segment, ...] = ()


#: a cell's stream: its protocol's ids, or (protocol, keep_latest, placeholder): them with old observations masked
StreamKey = Hashable


def _feed(host, sample: Sample, protocol: str, masking: tuple[int, str] | None, markers) -> tuple:
    """(stream key, ids, their segments) a cell is prefilled with: its protocol's ids, told their ChatML messages
    (``markers`` None: a tokenizer that is not ChatML, no segments). ``masking``: (keep_latest, placeholder) of
    observation_masking's paper rule under full context, applied to the text
    (``agent_runner.chat_segments.text_masking``): a sample whose conversation has observations to mask is fed the
    masked ids, a stream of its own; one without any is fed its protocol's."""
    ids = _prefill_ids(sample, protocol)
    if markers is None:
        return protocol, ids, ()
    if masking is not None:
        keep_latest, placeholder = masking
        masked = mask_observations(ids, host.tokenizer, markers, keep_latest=keep_latest, placeholder=placeholder)
        if masked.masked:
            return (protocol, *masking), masked.ids, chat_segments(masked.ids, markers, masked.masked)
    return protocol, ids, chat_segments(ids, markers)


def _streams(host, sample: Sample, cells, markers, recorded: dict | None = None) -> tuple[list[StreamKey], dict]:
    """Each cell's (config, protocol) stream key, and every stream recorded once, each extending the previous
    recording where their ids share a prefix (the full-context history extends the first turn's). ``recorded``:
    recordings already made, by protocol (``run_cell``'s)."""
    keys, streams, feeds, previous = [], {}, {}, None
    for config, protocol in cells:
        masking = text_masking(config, protocol) if markers is not None else None
        if (protocol, masking) not in feeds:
            feeds[protocol, masking] = _feed(host, sample, protocol, masking, markers)
        key, ids, segments = feeds[protocol, masking]
        if key not in streams:
            if recorded is not None and key in recorded:
                streams[key] = _Stream(recorded[key], segments)
            else:
                tensor = torch.tensor([ids], device=host.device)
                previous = record_prefill(host.model, tensor, logits_to_keep=1, reuse=previous)
                streams[key] = _Stream(previous, segments)
        keys.append(key)
    return keys, streams


def _prepare(host, sample: Sample, cells, keys: list[StreamKey], streams: dict, markers) -> _Prepared:
    """Each cell's cache from its stream's recorded prefill, told the stream's segments; later_turn's true-eviction
    rows carried through the reply and the question (rows of one stack: the same tokens), told the question
    turn's segments before it; the exact target scored on copies."""
    model = host.model
    caches = [
        streams[key].recorded.cache_for(config, streams[key].segments)
        for (config, _), key in zip(cells, keys, strict=True)
    ]
    last = torch.stack([streams[key].recorded.logits[0, -1].float() for key in keys])
    carried = [
        i for i, (_, protocol) in enumerate(cells) if sample.probe == "later_turn" and protocol == "true_eviction"
    ]
    if carried:
        rows = Rows(model, [caches[i] for i in carried])
        rows.feed_decoded(sample.reply)  # the agent's reply, as decoded tokens
        if markers is not None:  # the next turn's messages, before its prefill evicts
            told = chat_segments(sample.prefill + sample.reply + sample.question, markers)
            for i in carried:
                caches[i].segments = told
        last[carried] = rows.forward(sample.question, all_logits=False).float()  # the next turn: a prefill (evicts)
        rows.release()
    prepared = _Prepared(sample, caches, last, [kept_fraction(c) for c in caches], [c.memory() for c in caches],
                         [None] * len(caches), caches)  # fmt: skip
    if sample.target:
        # the score is read on a copy, so the answer below starts from the same cache (the nll probe has none)
        prepared.scorers = caches if sample.probe == "nll" else [copy.deepcopy(c) for c in caches]
        rows = Rows(model, prepared.scorers)
        prepared.nll = [float(-row.mean()) for row in rows.target_logps(last, sample.target)]
        rows.release()
    return prepared


def _answer(host, prepared: list[_Prepared]) -> list[list[dict]]:
    """Every cell of every prepared sample answers greedily, all as rows of one stack (each its own tokens, its own
    stopping rule), then each cell's numbers."""
    decode = host.tokenizer.decode
    rows = [(p, i) for p in prepared if p.sample.max_new_tokens for i in range(len(p.caches))]
    answers: dict[tuple[int, int], str] = {}
    if rows:
        found = lambda r, tokens: rows[r][0].sample.expected in decode(tokens, skip_special_tokens=True)  # noqa: E731
        tokens = greedy(
            host.model, [p.caches[i] for p, i in rows], torch.stack([p.last[i] for p, i in rows]),
            [p.sample.max_new_tokens for p, _ in rows], set(host.stop_token_ids), until=found,
        )  # fmt: skip
        answers = {(id(p), i): decode(t, skip_special_tokens=True) for (p, i), t in zip(rows, tokens, strict=True)}
    out = []
    for p in prepared:
        numbers = []
        for i, cache in enumerate(p.caches):
            answer = answers.get((id(p), i))
            # the peaks over the whole sample: the scoring copy starts from the answer's cache (its peaks included)
            # and stands in for it while scoring, so the larger of the two windows is the sample's
            ends = (cache.memory(), p.scorers[i].memory())
            numbers.append(
                dict(
                    correct=None if answer is None else p.sample.expected in answer,
                    nll=p.nll[i],
                    answer=answer or "",
                    kept_fraction=p.kept[i],
                    kv_held_bytes=p.at_answer[i].kv_held_bytes,
                    kv_allocated_bytes=p.at_answer[i].kv_allocated_bytes,
                    kv_peak_held_bytes=max(m.kv_peak_held_bytes for m in ends),
                    kv_peak_allocated_bytes=max(m.kv_peak_allocated_bytes for m in ends),
                )
            )
        out.append(numbers)
    return out


@torch.no_grad()
def run_cells(host, sample: Sample, cells: list[tuple[EvictionConfig, str]], recorded: dict) -> list[dict]:
    """The cells (config, protocol) of one sample, each cache built from its protocol's recorded prefill
    (``recorded[protocol]``; a cell fed masked ids records its own), fed together as rows of one stack
    (``measure.stacked_cells``; one cell: the cell alone): per cell correct / nll / answer / cache numbers. Both
    protocols of later_turn end at the same question, so after the true-eviction rows have been carried there,
    every row is scored and answers together."""
    markers = ChatMarkers.of_chatml(host.tokenizer)
    keys, streams = _streams(host, sample, cells, markers, recorded)
    return _answer(host, [_prepare(host, sample, cells, keys, streams, markers)])[0]


def run_cell(host, sample: Sample, recorded, config: EvictionConfig, protocol: str) -> dict:
    """One cell of one sample alone (the reference the batched cells are tested against)."""
    return run_cells(host, sample, [(config, protocol)], {protocol: recorded})[0]


def _prefill_ids(sample: Sample, protocol: str) -> list[int]:
    if sample.probe == "later_turn" and protocol == "full_context":
        return sample.prefill + sample.reply + sample.question  # the whole history, re-prefilled at once
    return sample.prefill


def run_probes(
    host,
    settings: ProbeSettings,
    *,
    on_result: Callable[[ProbeResult], None] | None = None,
    batched: bool = True,
    samples: Sequence[int] | None = None,
) -> Iterator[ProbeResult]:
    """Every (probe, sample, cell) of `settings` on `host` (a loaded ``ModelHost``), in a fixed order.
    `batched`: the cells of a sample as rows of one stack, and the greedy answers of up to ``ANSWER_ROWS`` cells
    (several samples) as rows of one stack (False: each cell alone, the reference).
    `samples`: only these sample indices (one measuring process's share, ``measure.probes.parallel``)."""
    check_probe_settings(settings)
    # no segments to tell: a setting that reads them would mean another
    if ChatMarkers.of_chatml(host.tokenizer) is None:
        for variant in settings.variants:
            config = eviction_config(variant, settings.scopes[0], settings.densities[0], settings.seed, settings.preset)
            if reads_segments(config):
                raise ValueError(f"variant {variant!r} decides by the turn segments of a ChatML conversation, and "
                                 "this model's chat template is not ChatML")  # fmt: skip
    indices = list(range(settings.samples) if samples is None else samples)
    for probe in settings.probes:
        cells = settings.cells(probe)
        per_batch = max(1, ANSWER_ROWS // len(cells)) if batched else 1
        for start in range(0, len(indices), per_batch):
            batch = [
                build_sample(probe, host.tokenizer, index, settings) for index in indices[start : start + per_batch]
            ]
            seeds = [sample_seed(settings.seed, index) for index in indices[start : start + per_batch]]
            measured = _measure_samples(host, batch, cells, seeds, settings.preset, batched)
            for sample, index, seed, numbers in zip(
                batch, indices[start : start + per_batch], seeds, measured, strict=True
            ):
                for variant, scope, protocol, density in cells:
                    key = _cell_key(eviction_config(variant, scope, density, seed, settings.preset), variant, protocol)
                    result = ProbeResult(
                        probe=probe, variant=variant, scope=scope, protocol=protocol, density=density,
                        sample=index, source=sample.source, length=len(_prefill_ids(sample, protocol)),
                        depth=sample.depth, scored_tokens=len(sample.target), expected=sample.expected,
                        **numbers[key],
                    )  # fmt: skip
                    if on_result is not None:
                        on_result(result)
                    yield result


def _cell_key(config: EvictionConfig, variant: str, protocol: str) -> tuple:
    # dense never evicts, so its cache ignores scope and density: one measurement serves every dense cell
    return (protocol, variant) if not config.evicts else (protocol, config)


def _measure_samples(host, samples: list[Sample], cells, seeds: list[int], preset: str, batched: bool) -> list[dict]:
    """Per sample, every distinct cell: {cell key: measured numbers and seconds}. Each sample's prefill is recorded
    once per protocol (the full-context history extends the first turn's recording), logits of its last position
    only. Batched, a sample's cells are rows of one stack, every cell of the batch answers in one stack, and a
    row's seconds are the batch's over its rows; alone, each cell is measured and timed by itself."""
    started = time.perf_counter()
    markers = ChatMarkers.of_chatml(host.tokenizer)
    groups, prepared = [], []
    for sample, seed in zip(samples, seeds, strict=True):
        unique: dict[tuple, tuple[EvictionConfig, str]] = {}
        for variant, scope, protocol, density in cells:
            config = eviction_config(variant, scope, density, seed, preset)
            unique.setdefault(_cell_key(config, variant, protocol), (config, protocol))
        with torch.no_grad():
            keys, streams = _streams(host, sample, list(unique.values()), markers)
        key_of = dict(zip(unique, keys, strict=True))
        for group in [list(unique.items())] if batched else [[item] for item in unique.items()]:
            t0 = time.perf_counter()
            with torch.no_grad():
                cells_of = [cell for _, cell in group]
                prepared.append(_prepare(host, sample, cells_of, [key_of[k] for k, _ in group], streams, markers))
                if not batched:  # alone: each cell answers by itself, timed by itself
                    (numbers,) = _answer(host, [prepared.pop()])
                    group = [(key, dict(numbers[0], seconds=time.perf_counter() - t0)) for key, _ in group]
            groups.append(group)
    if batched:
        with torch.no_grad():
            answered = _answer(host, prepared)
        seconds = (time.perf_counter() - started) / sum(len(g) for g in groups)
        groups = [[(key, dict(n, seconds=seconds)) for (key, _), n in zip(g, a, strict=True)]
                  for g, a in zip(groups, answered, strict=True)]  # fmt: skip
    per_sample = len(groups) // len(samples)
    return [
        dict(pair for g in groups[k * per_sample : (k + 1) * per_sample] for pair in g) for k in range(len(samples))
    ]
