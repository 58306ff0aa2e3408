"""Every cell of one trajectory replayed together: the eviction settings of a replay sweep as rows of one stack.

``replay_episode`` (``measure.counterfactual``) teacher-forces one stored trajectory through one cache. A sweep
replays the same trajectory under many settings (method x scope x density), and every one of them is fed the same
tokens at the same logical positions: only what each cache keeps differs. ``replay_cells`` runs them together:

1. the first prefill is recorded once, densely, and each setting's cache is built from it
   (``nexus.shared_prefill``: a prefill from an empty cache computes the same outputs under every method). Under
   full_context every turn is such a prefill, so each turn is recorded once for every setting, extending the
   previous turn's recording, and observing policies (H2O) share what they observed;
2. the rows are fed in stacks of one (scope, density) each (``stack_groups``: such rows evict at the same moments
   and hold about as many tokens); under true_eviction each later turn's appended tokens are one prefill of a
   stack's rows at once (each row attends to what it holds and evicts on its own);
3. the turn's completion is fed back as decoded tokens to a stack's rows at once (``measure.stacked_cells``), split
   where any of its rows' next decode-time event falls and where a copy's source is read (``Scorer.snapshot``),
   scored chunk by chunk so no [n, vocab] logits of a whole turn are kept.

Each cache is told the turn's segments (``nexus.segments``) before the forward that feeds the turn: a shared
prefill's caches as they are built from the recording (``RecordedPrefill.cache_for``), a true-eviction row before
its turn's appended tokens. Every row of a call is fed the same stream, so the paper's text-level observation
masking (full context, rule latest), whose history differs, is replayed in a call of its own on the stream
``mask_turns`` gives (``agent_runner.chat_segments.text_masking`` says which settings are).

Each row's score equals ``replay_episode``'s for that setting alone (``tests/measure/test_stacked_cells.py``,
every method x scope x protocol, fp64): per-token NLL and top-1, events, what each layer holds, memory figures
and span scores. What differs is bookkeeping: ``chunks`` counts the forwards of the row's stack, and ``seconds``
is the turn's time split over every row.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

import nexus
from agent_runner.chat_segments import ChatMarkers, MaskedStream, chat_segments, mask_observations
from agent_runner.config import check_protocol
from agent_runner.records import TurnTokens
from measure.action_scores import PlannedSpan
from measure.counterfactual import MAX_CHUNK, ReplayError, ReplayScore, Scorer, contexts, read_index, token_scores
from measure.stacked_cells import TOKENS_PER_FORWARD, Rows
from nexus.segments import Segment
from nexus.shared_prefill import record_prefill


@torch.no_grad()
def replay_cells(
    model: torch.nn.Module,
    turns: list[TurnTokens],
    evictions: Sequence[nexus.EvictionConfig],
    protocol: str,
    *,
    chunked: bool = True,
    actions: Sequence[Sequence[PlannedSpan]] | None = None,
    segments: Sequence[Sequence[Segment]] | None = None,
) -> list[ReplayScore]:
    """One ``ReplayScore`` per eviction setting, in order, each equal to ``replay_episode(...)`` of that setting alone
    (see the module docstring). ``segments``: each turn's context as ``nexus.segments``
    (``measure.counterfactual.turn_segments``; None: the caches are told none). ``ReplayError`` when the stream
    cannot be replayed under ``protocol``."""
    try:
        check_protocol(protocol)
    except ValueError as exc:
        raise ReplayError(str(exc)) from None
    ctxs = contexts(turns)
    scorers = [Scorer(e, protocol, turns, chunked, actions) for e in evictions]
    device = next(model.parameters()).device
    groups = stack_groups(evictions)
    recorded, caches, fed = None, None, 0
    for t, turn in enumerate(turns):
        if not turn.generated:  # a turn that stopped before generating (context full): nothing to score
            continue
        started = time.perf_counter()
        told = segments[t] if segments is not None else ()  # set before the forward that feeds the turn
        shared = caches is None or protocol == "full_context"
        if shared:
            # a prefill from an empty cache: recorded once, every setting's cache built from it
            ids = torch.as_tensor(ctxs[t], dtype=torch.long, device=device).view(1, -1)
            recorded = record_prefill(model, ids, logits_to_keep=1, reuse=recorded)
            caches = [recorded.cache_for(s.eviction, told) for s in scorers]
        elif turn.keep != fed:
            raise ReplayError(
                f"turn {t} re-renders the history (keeps {turn.keep} of {fed} tokens): its stream is not a "
                "continuation, so it cannot be replayed under true_eviction; replay it under full_context"
            )
        nll, top1, forwards = None, None, [0] * len(scorers)
        for group in groups:  # each group a stack of its own: its rows' events fall together
            if not shared:
                for i in group:
                    if segments is not None:
                        caches[i].segments = told
                    caches[i].reset_peaks()  # the turn's peaks, from before its prefill
            rows = Rows(model, [caches[i] for i in group])
            if shared:
                first = recorded.logits[0, -1:].expand(len(group), -1)
            else:
                first = rows.forward(list(turn.append), all_logits=False)
            g_nll, g_top1, g_forwards = _decode_rest(
                rows, [scorers[i] for i in group], first, turn.generated, t, chunked
            )
            rows.release()
            if nll is None:
                nll = g_nll.new_empty(len(scorers), g_nll.shape[1])
                top1 = g_top1.new_empty(len(scorers), g_top1.shape[1])
            nll[group], top1[group] = g_nll, g_top1
            for i in group:
                forwards[i] = g_forwards
        seconds = (time.perf_counter() - started) / len(scorers)
        for r, scorer in enumerate(scorers):
            scorer.scored(t, caches[r], nll[r], top1[r], forwards[r], seconds)
        fed = len(ctxs[t]) + len(turn.generated) - 1
        if protocol == "true_eviction":
            recorded = None  # only the first prefill is shared; later turns extend each row's own cache
    results = [s.result() for s in scorers]
    for score in results:  # each row's share of the batch's time, like its turns' (not the batch's whole time)
        score.seconds = sum(t.seconds for t in score.turns)
    return results


@dataclass(frozen=True)
class MaskedTurns:
    """A trajectory as the text-level observation masking feeds it (``mask_turns``): its turns, each turn's
    segments and its calls' spans."""

    turns: list[TurnTokens]
    segments: list[tuple[Segment, ...]]
    actions: list[list[PlannedSpan]] | None = None


def reads_segments(eviction: nexus.EvictionConfig) -> bool:
    """Whether ``eviction`` decides by the turn segments: a cache told none would run it as another method."""
    return eviction.method == "observation_masking" or eviction.candidates == "newest_turn"


def mask_turns(
    turns: list[TurnTokens],
    actions: Sequence[Sequence[PlannedSpan]] | None,
    tokenizer,
    markers: ChatMarkers,
    *,
    keep_latest: int,
    placeholder: str,
) -> MaskedTurns:
    """Every turn's context with the observations older than its newest ``keep_latest`` replaced by ``placeholder``
    (``agent_runner.chat_segments.mask_observations``), fed whole (``keep`` 0: under full context each turn is a
    fresh prefill anyway), its segments marking those messages ``masked``.

    A copy's source moves with the masking. A source masked away becomes an empty range where its message now
    holds the placeholder: the span still counts as a copy, its source held 0% (``held_share`` of no positions)
    and its distance measured to where the source was; nothing else in the action scores changes."""
    out = MaskedTurns([], [], [] if actions is not None else None)
    for t, (turn, ctx) in enumerate(zip(turns, contexts(turns), strict=True)):
        masked = mask_observations(ctx, tokenizer, markers, keep_latest=keep_latest, placeholder=placeholder)
        out.turns.append(TurnTokens(keep=0, append=masked.ids, generated=turn.generated))
        out.segments.append(chat_segments(masked.ids, markers, masked.masked))
        if out.actions is not None:
            out.actions.append([_moved(p, masked) for p in actions[t]])
    return out


def _moved(planned: PlannedSpan, masked: MaskedStream) -> PlannedSpan:
    if planned.source is None:
        return planned
    source = masked.moved(*planned.source)
    if source is None:  # masked away: an empty range at its message's placeholder
        start, end = planned.source
        at = next(masked.moved(a, a) for a, b, _ in masked.replaced if start < b and end > a)
        source = (at[0], at[0])
    return dataclasses.replace(planned, source=source)


def stack_groups(evictions: Sequence[nexus.EvictionConfig]) -> list[list[int]]:
    """The settings' indices in stacks fed apart: rows of one (scope, density) evict at the same moments and hold
    about as many tokens, so a stack of them is split at few decode-time events and padded little; dense rows hold
    the whole history and are a stack of their own. One stack of every setting would feed each chunk up to the
    nearest event of any row (tokens apart, under prefill_decode at several densities) and pad every row to the
    longest."""
    keyed: dict[tuple, list[int]] = {}
    for i, e in enumerate(evictions):
        keyed.setdefault((e.scope, e.density) if e.evicts else ("dense",), []).append(i)
    return list(keyed.values())


def _decode_rest(
    rows: Rows, scorers: list[Scorer], first: torch.Tensor, generated: list[int], t: int, chunked: bool
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Feed a turn's stored tokens back to every row after its prompt (whose last logits are ``first`` [N, V]):
    per row the NLL and top-1 of the n generated tokens ([N, n] each), and the forwards spent (the prompt's
    included). Chunks end at every row's next decode event and where a snapshot is read (``teacher_force``)."""
    targets = torch.as_tensor(generated, device=first.device)
    dtype = torch.float64 if first.dtype == torch.float64 else torch.float32
    nll = torch.empty(len(scorers), len(generated), dtype=dtype)
    top1 = torch.empty(len(scorers), len(generated), dtype=torch.float64)
    nll[:, :1], top1[:, :1] = token_scores(first.unsqueeze(1), targets[:1])
    rest = list(generated[:-1])  # fed back as decoded tokens; the last one opens the next feed
    marks = scorers[0].marks.get(t, ()) if scorers[0].marks is not None else ()
    reads = sorted({read_index(j) for j in marks})  # the same for every row: the spans are the trajectory's
    at, forwards = 0, 1
    per_forward = max(1, TOKENS_PER_FORWARD // len(scorers))  # [N, n, vocab] logits stay small
    with rows.decoding():
        while at < len(rest):
            if reads and reads[0] == at:
                for scorer, cache in zip(scorers, rows.caches, strict=True):
                    scorer.snapshot(t, at, cache)
                reads.pop(0)
            n = min(rows.decode_chunk(len(rest) - at), MAX_CHUNK, per_forward) if chunked else 1
            if reads:
                n = min(n, reads[0] - at)
            logits = rows.forward(rest[at : at + n], all_logits=True)  # [N, n, V]
            scored = slice(at + 1, at + 1 + n)  # the generated tokens these positions predict
            nll[:, scored], top1[:, scored] = token_scores(logits, targets[scored])
            at, forwards = at + n, forwards + 1
    return nll, top1, forwards
