"""Cells fed together equal each cell fed alone: the probes' batched cells and the replay's (fp64 tiny model).

`measure.stacked_cells` feeds every cell of a sample (or trajectory) as a row of one `nexus.CacheStack`. Each row
must produce exactly what the cell produces alone: the same answers, the same scores to 1e-9, the same kept
fraction and memory figures, for every method, scope and protocol. The cells alone are the reference path
(`run_probes(batched=False)`, one cache per forward).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import nexus
from measure.probes import ProbeSettings, run_probes
from measure.stacked_cells import Rows, greedy
from tests.tiny_models import tiny_host64


@pytest.fixture(scope="module")
def host64():
    return tiny_host64(tiny_layers=3)


def _without_seconds(result) -> dict:
    return {k: v for k, v in dataclasses.asdict(result).items() if k not in ("seconds", "nll")}


#: how many of the other 8 methods a run measures beside nexus: every method over runs, a printed seed a run
PROBE_METHODS_PER_RUN = 1


def _probe_matrix():
    """One cell per evicting method (both scopes, both protocols): nexus, beside dense, always; of the rest a seeded
    sample of :data:`PROBE_METHODS_PER_RUN` per run (``--matrix-seed``, ``--matrix-full``: tests/conftest.py)."""
    sampled = (pytest.mark.slow, pytest.mark.matrix(keep=PROBE_METHODS_PER_RUN))
    return [
        pytest.param(m, marks=pytest.mark.matrix(always=True) if m == "nexus" else sampled)
        for m in nexus.METHODS
        if m != "dense"
    ]


#: method -> the settings it evicts with on these short conversations (the others: their defaults): the paper's
#: observation masking keeps the newest 10 observations, and a probe or the trajectory below has two or three
LABELLED: dict[str, dict] = {"observation_masking": {"keep_latest": 1}}


def _variant(method: str) -> str:
    """``method`` as a probe variant, with its :data:`LABELLED` settings."""
    params = LABELLED.get(method)
    return f"{method}({', '.join(f'{k}={v}' for k, v in params.items())})" if params else method


@pytest.mark.parametrize("method", _probe_matrix())
@torch.no_grad()
def test_probe_cells_batched_equal_each_cell_alone(host64, method):
    """A method x scope x protocol (nexus's beside dense), all three probes: batched == alone, result by result."""
    variants = ("dense", method) if method == "nexus" else (_variant(method),)
    settings = ProbeSettings(
        model="tiny", samples=1, lengths=(256,), densities=(0.3,), variants=variants,
        scopes=tuple(nexus.SCOPES), protocols=("true_eviction", "full_context"),
    )  # fmt: skip
    alone = list(run_probes(host64, settings, batched=False))
    batched = list(run_probes(host64, settings, batched=True))
    assert len(alone) == len(batched) == (len(variants) * 2) * (1 + 2 + 1)
    differing_answers = set()
    for a, b in zip(alone, batched, strict=True):
        assert _without_seconds(a) == _without_seconds(b), (a.probe, a.variant, a.scope, a.protocol, a.density)
        if a.nll is not None:
            assert b.nll == pytest.approx(a.nll, abs=1e-9)
        differing_answers.add(a.answer)
    assert len(differing_answers) > 2  # the rows did answer differently: a stack that mixed rows would show
    evicted = [r for r in alone if r.variant != "dense" and r.kept_fraction < 0.9]
    assert evicted and any(r.protocol == "true_eviction" and r.probe == "later_turn" for r in evicted)


@torch.no_grad()
def test_greedy_rows_leave_the_stack_and_answer_as_alone(host64):
    """Rows that stop early leave the stack; each row's answer, cache and memory equal its greedy run alone."""
    model = host64.model
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (1, 200), generator=gen)
    cfgs = [nexus.EvictionConfig(method=m, scope="prefill_decode", density=0.3, window=8, block_size=8)
            for m in ("snapkv", "nexus", "h2o", "streaming_llm", "dense")]  # fmt: skip

    def prefilled():
        caches = [nexus.EvictableCache(model.config, c) for c in cfgs]
        last = torch.cat([model(input_ids=prompt, **{nexus.cache_kwarg(model): c}).logits[:, -1] for c in caches])
        return caches, last

    stops = [3, 40, 1, 17, 40]  # each row's answer ends at its own length (40: at the limit)

    caches, last = prefilled()
    together = greedy(model, caches, last, 40, stop=set(), until=lambda r, tokens: len(tokens) >= stops[r])
    alone = []
    for r in range(len(cfgs)):
        ref_caches, ref_last = prefilled()
        answer = greedy(model, [ref_caches[r]], ref_last[r : r + 1], 40, stop=set(),
                        until=lambda _, tokens, r=r: len(tokens) >= stops[r])[0]  # fmt: skip
        alone.append((answer, ref_caches[r]))
    assert [len(t) for t in together] == [3, 40, 1, 17, 40]
    for r, (tokens, ref) in enumerate(alone):
        assert together[r] == tokens, f"row {r}"
        assert caches[r].logical_length == ref.logical_length
        assert caches[r].memory() == ref.memory(), f"row {r}"
        for layer in range(ref.num_layers):
            assert torch.equal(caches[r].retained_positions(layer), ref.retained_positions(layer))


@pytest.mark.slow  # over 10 s: the default run leaves it to CI
@torch.no_grad()
def test_target_logps_batched_equal_alone_and_split_rows_at_events(host64):
    """Teacher forcing a long target in a stack: chunks split at every row's decode events and at the per-forward
    token cap; each row's log-probs equal its own alone."""
    model = host64.model
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, model.config.vocab_size, (1, 150), generator=gen)
    target = torch.randint(0, model.config.vocab_size, (300,), generator=gen).tolist()
    cfgs = [nexus.EvictionConfig(method=m, scope="prefill_decode", density=d, window=8, block_size=8)
            for m in ("snapkv", "pyramidkv", "ada_nexus") for d in (0.2, 0.5)]  # fmt: skip

    def run(cfg_list):
        caches = [nexus.EvictableCache(model.config, c) for c in cfg_list]
        last = torch.cat([model(input_ids=prompt, **{nexus.cache_kwarg(model): c}).logits[:, -1] for c in caches])
        rows = Rows(model, caches)
        out = rows.target_logps(last, target)
        rows.release()
        return out, caches

    together, caches = run(cfgs)
    for r, cfg in enumerate(cfgs):
        ref, ref_caches = run([cfg])
        torch.testing.assert_close(together[r], ref[0], atol=1e-9, rtol=0)
        assert caches[r].memory() == ref_caches[0].memory()
        assert [dataclasses.astuple(e)[:3] for e in caches[r].events] == [
            dataclasses.astuple(e)[:3] for e in ref_caches[0].events
        ]
    assert any(e.phase == "decode" for c in caches for e in c.events)


def _turn_facts(turn) -> dict:
    out = turn.model_dump(exclude={"seconds", "chunks", "nll_mean", "spans"})
    out["spans"] = [s.model_dump(exclude={"nll"}) for s in turn.spans or ()]
    return out


#: how many of the matrix's other 38 cells a run measures (~12 s each): every cell over runs, a printed seed a run
REPLAY_CELLS_PER_RUN = 4


def _replay_matrix():
    """Every method x scope x protocol. Two cells run always; of the rest, a seeded sample of
    :data:`REPLAY_CELLS_PER_RUN` per run (``--matrix-seed``, ``--matrix-full``: tests/conftest.py)."""
    cells = [(m, s, p) for m in nexus.METHODS for s in nexus.SCOPES for p in ("true_eviction", "full_context")]
    fast = {("nexus", "prefill_decode", "true_eviction"), ("h2o", "prefill_decode", "full_context")}
    sampled = (pytest.mark.slow, pytest.mark.matrix(keep=REPLAY_CELLS_PER_RUN))
    return [pytest.param(*c, marks=pytest.mark.matrix(always=True) if c in fast else sampled) for c in cells]


@pytest.fixture(scope="module")
def trajectory(host64):
    """A text trajectory rendered into the tiny model's stream, with its planned spans (copies read mid-turn)."""
    from agent_runner.chat_segments import ChatMarkers
    from agent_runner.chat_stream import render_trajectory
    from measure.action_scores import plan_spans
    from measure.counterfactual import turn_segments
    from tests.measure.test_text_replay import conversation

    out = {}
    for protocol in ("true_eviction", "full_context"):
        rendered = render_trajectory(host64.tokenizer, conversation(filler=2), protocol)
        segments = turn_segments(rendered.turns, ChatMarkers.of(host64.tokenizer))
        out[protocol] = rendered.turns, plan_spans(rendered), segments
    return out


@pytest.mark.parametrize(("method", "scope", "protocol"), _replay_matrix())
@torch.no_grad()
def test_replay_cells_batched_equal_each_cell_alone(host64, trajectory, method, scope, protocol):
    """`replay_cells` of one method at three densities, a second method at each density and dense beside them (each
    density's rows a stack) equals `replay_episode` of each alone: every turn's per-token scores, events, what each
    layer holds, memory figures (peaks included) and spans."""
    from measure.counterfactual import model_forward, replay_episode
    from measure.replay_cells import replay_cells

    turns, plans, segments = trajectory[protocol]
    small = dict(window=8, block_size=8)
    beside = "snapkv" if method != "snapkv" else "streaming_llm"
    evictions = [nexus.EvictionConfig(method="dense")] + [
        nexus.EvictionConfig(method=m, scope=scope, density=d, **small, **LABELLED.get(m, {}))
        for d in (0.15, 0.3, 0.5)
        for m in (method, beside)
    ]
    together = replay_cells(host64.model, turns, evictions, protocol, actions=plans, segments=segments)
    forward = model_forward(host64.model, host64.device)
    for eviction, got in zip(evictions, together, strict=True):
        alone = replay_episode(
            forward, host64.model.config, turns, eviction, protocol, actions=plans, segments=segments
        )
        assert got.nll_mean == pytest.approx(alone.nll_mean, abs=1e-9) and got.top1 == alone.top1
        assert len(got.turns) == len(alone.turns) > 1
        for a, b in zip(got.turns, alone.turns, strict=True):
            assert _turn_facts(a) == _turn_facts(b), (eviction.method, eviction.density, a.index)
            assert a.nll_mean == pytest.approx(b.nll_mean, abs=1e-9)
    if method != "dense":
        assert any(t.eviction_events for t in together[1].turns)


@torch.no_grad()
def test_replay_cells_stack_rows_by_scope_and_density_so_each_row_is_fed_the_chunks_it_would_be_alone(
    host64, trajectory
):
    """Rows of other densities or scopes are stacks of their own: a row's completion is split only at its own stack's
    decode-time events, so it takes the forwards it would alone (one stack of every row would split each row's feed
    at every other row's events too)."""
    from measure.counterfactual import model_forward, replay_episode
    from measure.replay_cells import replay_cells, stack_groups

    turns, plans, _ = trajectory["true_eviction"]
    small = dict(window=8, block_size=8)
    evictions = [nexus.EvictionConfig(method="dense")] + [
        nexus.EvictionConfig(method=m, scope=sc, density=d, **small)
        for sc in ("prefill_only", "prefill_decode")
        for d in (0.15, 0.3)
        for m in ("snapkv", "nexus")
    ]
    assert stack_groups(evictions) == [[0], [1, 2], [3, 4], [5, 6], [7, 8]]
    together = replay_cells(host64.model, turns, evictions, "true_eviction", actions=plans)
    forward = model_forward(host64.model, host64.device)
    for eviction, got in zip(evictions, together, strict=True):
        alone = replay_episode(forward, host64.model.config, turns, eviction, "true_eviction", actions=plans)
        assert [t.chunks for t in got.turns] == [t.chunks for t in alone.turns], (eviction.scope, eviction.density)
