"""Cells fed together: the caches of several eviction settings that see the same tokens, as rows of one stack.

The probes and the replay measure many cells (method x scope x density) on one sample or trajectory. Every cell
is fed the very same tokens at the same logical positions; only what each cache keeps differs. ``Rows`` feeds
them as the rows of one ``nexus.CacheStack``: input_ids [N, q] (the same ids in every row), each row attending
to what its own cache holds and evicting on its own, exactly as it would alone (``tests/measure/test_stacked_cells.py``:
every cell batched equals the cell alone, fp64). One row is fed through its own cache, no stack: that is the
cell alone, the path the batched one is tested against.

Why it pays: a forward's cost on a small model is largely per-forward overhead (30 layers of small matmuls and
Python); N rows share it. Greedy answers diverge per row, so ``greedy`` feeds each row its own token and
rebuilds the stack without the rows that have finished.

Feeds that stand for decoded tokens (``decoded``) are split where any row's next decode-time event falls
(``CacheStack.decode_chunk``), and at most ``TOKENS_PER_FORWARD`` tokens over all rows go into one forward, so
the [N, q, vocab] logits stay small. Any split between events is exact, memory figures included
(``EvictableCache.precharge``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch

from nexus.attention import cache_kwarg
from nexus.batch import CacheStack
from nexus.cache import EvictableCache

#: most tokens (rows x positions) in one forward that returns every position's logits: [tokens, vocab] floats
TOKENS_PER_FORWARD = 1024


class Rows:
    """The caches of N cells fed the same tokens; ``logits`` are [N, ...] in the order of ``caches``.

    Rows that never evict (dense) are a stack of their own beside the evicting rows' stack: a stack pads every row
    to its longest, and a dense row holds the whole history where the others hold a fifth of it."""

    def __init__(self, model: torch.nn.Module, caches: Sequence[EvictableCache]):
        if not caches:
            raise ValueError("Rows needs at least one cache")
        self.model, self.caches, self.kw = model, list(caches), cache_kwarg(model)
        self.device = model.device
        evicting = [i for i, c in enumerate(self.caches) if c.config.evicts]
        dense = [i for i, c in enumerate(self.caches) if not c.config.evicts]
        self.groups = [g for g in (evicting, dense) if g]
        self.owners: list[EvictableCache | CacheStack] = [
            CacheStack([self.caches[i] for i in g]) if len(g) > 1 else self.caches[g[0]] for g in self.groups
        ]
        self.order = torch.tensor([i for g in self.groups for i in g]).argsort()  # back to the order of `caches`

    def release(self) -> None:
        """Give every row its own buffers again (of the size it would have alone)."""
        for owner in self.owners:
            if isinstance(owner, CacheStack):
                owner.release()
        self.owners = []

    def _forward(self, owner, x: torch.Tensor, **kw) -> torch.Tensor:
        if isinstance(owner, CacheStack):
            x = x.expand(len(owner.caches), -1) if x.shape[0] == 1 else x
            kw["position_ids"] = owner.position_ids(self.device, q=x.shape[1])
        return self.model(input_ids=x, use_cache=True, **kw, **{self.kw: owner}).logits

    def forward(self, ids: Sequence[int], all_logits: bool) -> torch.Tensor:
        """One forward of `ids` in every row: logits [N, len(ids), V] (all_logits) or [N, V] (the last)."""
        x = torch.as_tensor(list(ids), dtype=torch.long, device=self.device).view(1, -1)
        keep = 0 if all_logits else 1
        out = torch.cat([self._forward(owner, x, logits_to_keep=keep) for owner in self.owners])[self.order]
        return out if all_logits else out[:, -1]

    def step(self, tokens: Sequence[int]) -> torch.Tensor:
        """One decode step, row r fed ``tokens[r]``: logits [N, V]."""
        x = torch.as_tensor(list(tokens), dtype=torch.long, device=self.device).view(-1, 1)
        with self.decoding():
            out = [self._forward(o, x[g], logits_to_keep=1) for o, g in zip(self.owners, self.groups, strict=True)]
        return torch.cat(out)[self.order][:, -1]

    @contextlib.contextmanager
    def decoding(self):
        """Every row's ``decoding()``: multi-token feeds stand for decoded tokens."""
        with contextlib.ExitStack() as rows:
            for owner in self.owners:
                rows.enter_context(owner.decoding())
            yield self

    def decode_chunk(self, remaining: int) -> int:
        """Tokens of `remaining` every row can be fed next so each equals token-by-token decoding."""
        return min(owner.decode_chunk(remaining) for owner in self.owners)

    def decoded(self, ids: Sequence[int], *, all_logits: bool = True, cap: int | None = None) -> Iterator[tuple]:
        """Feed `ids` as if every row had decoded them: yields (start, logits [N, n, V] or [N, V] of the chunk's
        last position) per forward, split at every row's next decode-time event and at `cap` tokens a row."""
        per_row = max(1, TOKENS_PER_FORWARD // len(self.caches)) if all_logits else None
        limits = [c for c in (cap, per_row) if c is not None]
        pos = 0
        with self.decoding():
            while pos < len(ids):
                n = min([self.decode_chunk(len(ids) - pos), *limits])
                yield pos, self.forward(ids[pos : pos + n], all_logits)
                pos += n

    def feed_decoded(self, ids: Sequence[int]) -> None:
        """Feed `ids` as decoded tokens when only the caches they leave matter (no logits kept)."""
        for _ in self.decoded(ids, all_logits=False):
            pass

    def target_logps(self, last: torch.Tensor, target: Sequence[int]) -> torch.Tensor:
        """[N, len(target)] log p of each target token teacher-forced after `last` [N, V] (its first token's
        distribution): the target but its last token is fed as decoded."""
        out = torch.empty(len(self.caches), len(target), dtype=torch.float64)
        out[:, 0] = torch.log_softmax(last.float(), -1)[:, target[0]].double()
        ids = torch.as_tensor(list(target), device=last.device)
        for start, logits in self.decoded(target[:-1]):
            at = slice(start + 1, start + 1 + logits.shape[1])  # the tokens these positions predict
            wanted = ids[at].expand(len(logits), -1).unsqueeze(-1)
            out[:, at] = torch.log_softmax(logits.float(), -1).gather(-1, wanted).squeeze(-1).double()
        return out


def greedy(
    model: torch.nn.Module,
    caches: Sequence[EvictableCache],
    last: torch.Tensor,
    max_new_tokens: int | Sequence[int],
    stop: set[int],
    until: Callable[[int, list[int]], bool] | None = None,
) -> list[list[int]]:
    """Greedy answers of every row from its cache, `last` [N, V] its first token's logits: up to `max_new_tokens`
    (one for all rows, or one per row) or a stop token; `until(row, tokens)` True also ends that row's answer.
    Each row is fed exactly the tokens it would be fed alone (a token is fed unless it ends the answer before its
    limit), and rows that finish leave the stack."""
    limits = [max_new_tokens] * len(caches) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    answers: list[list[int]] = [[] for _ in caches]
    logits = {r: last[r] for r in range(len(caches)) if limits[r] > 0}
    rows, active = None, []
    while logits:
        feed: dict[int, int] = {}
        for r, row_logits in logits.items():
            token = int(row_logits.argmax())
            if token in stop:
                continue
            answers[r].append(token)
            if until is None or not until(r, answers[r]):
                feed[r] = token  # fed even when it is the row's last: alone, the loop feeds it before it ends
        if not feed:
            break
        if sorted(feed) != active:
            old, active = rows, sorted(feed)
            rows = Rows(model, [caches[r] for r in active])  # copies the rows that stay out of the old stack
            if old is not None:
                old.release()  # the rows that left get their own buffers
        out = rows.step([feed[r] for r in active])
        logits = {r: out[i] for i, r in enumerate(active) if len(answers[r]) < limits[r]}
    if rows is not None:
        rows.release()
    return answers
