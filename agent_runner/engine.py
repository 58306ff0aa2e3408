"""`DecodeEngine`: one model serving many concurrent episodes, one forward per decode step for all of them.

Batch-1 decode of a large model reads every weight once per generated token, and the GPU idles while an
episode waits on a tool call in its container. Here each episode keeps its own agent loop and sandbox (in its
own thread: a Celery thread-pool slot), and hands every model turn to the engine, whose single thread does all
the model work:

  1. a new turn is prefilled alone, on the episode's own `EvictableCache` (batch 1). Prefill is
     compute-bound and already fills the GPU, so batching it gains little; running it whole (not chunked
     between decode steps) keeps the prefill-time eviction exactly as alone. The other rows wait for it,
     which costs them latency, not tokens.
  2. every row that is decoding then advances by one token in one forward over a `nexus.CacheStack`: each
     row has its own logical length, slots, budget, policy state, events and seeded generator, and evicts
     on its own (see nexus/batch.py).
  3. a row leaves the stack when its turn ends (stop token or limit); the stack is rebuilt when rows join or
     leave, so the next decode step only carries rows that are decoding.

Both protocols work unchanged: under full_context the episode brings a fresh cache each turn.
Every row's tokens equal what the episode would produce alone (same logits to rounding, same events, same
seeded draws), whatever else is in the batch: tests/agent_runner/test_engine.py checks it for every method.
"""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

import nexus
from agent_runner.config import SamplingConfig
from agent_runner.sampling import sample_next


class TurnDecoder:
    """One turn's token choices: sampled with the episode's generator (or teacher-forced), ending at a stop
    token or after `limit` tokens. The solo loop and the engine both drive it, so they cannot disagree.

    `forced`: the turn's tokens, fed instead of sampled; the turn ends at a stop token among them, else after
    the last one (a stored turn that ran out of tokens, finish "length"). `draw_forced`: the generator still
    draws once per forced token, as sampling did, so the turns sampled after a forced stored turn continue its
    random stream where the stored run's was; `agreed` counts the forced tokens the draw chose too (all of
    them when the cache gives the stored run's logits)."""

    def __init__(
        self,
        *,
        stop: set[int],
        limit: int,
        sampling: SamplingConfig,
        generator: torch.Generator,
        forced: list[int] | None = None,
        draw_forced: bool = False,
    ):
        self.stop, self.limit, self.sampling, self.generator, self.forced = stop, limit, sampling, generator, forced
        self.draw_forced = draw_forced
        self.tokens: list[int] = []
        self.finish = "length"
        self.agreed = 0

    def next_token(self, logits: torch.Tensor) -> int | None:
        """Choose the next token from `logits` [1, V]; return it if it is to be fed, None if the turn ended."""
        drawn = None
        if self.forced is None or self.draw_forced:
            drawn = int(sample_next(logits, self.sampling, self.generator)[0])
        tok = drawn if self.forced is None else self.forced[len(self.tokens)]
        self.agreed += drawn == tok and self.forced is not None
        self.tokens.append(tok)
        if tok in self.stop:
            self.finish = "stop"
            return None
        if len(self.tokens) >= (self.limit if self.forced is None else len(self.forced)):
            return None
        return tok


@dataclass
class TurnTiming:
    prefill_s: float
    decode_s: float
    rows_mean: float = 1.0  # mean number of rows decoded together during this turn


def sync(device: torch.device) -> None:
    """Wait for the device, so host timings cover the work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward_last(model: torch.nn.Module, cache_kw: str, cache, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    """Logits [B, V] of the last fed position, with `cache` as the model's cache."""
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{cache_kw: cache}, **kwargs)
    return out.logits[:, -1]


@dataclass
class _Row:
    cache: nexus.EvictableCache
    feed: list[int]
    decoder: TurnDecoder
    future: Future = field(default_factory=Future)
    next_token: int | None = None
    prefill_s: float = 0.0
    t_decode: float = 0.0
    steps: int = 0
    rows_sum: int = 0

    def timing(self) -> TurnTiming:
        decode_s = time.perf_counter() - self.t_decode
        return TurnTiming(self.prefill_s, decode_s, self.rows_sum / self.steps if self.steps else 1.0)


class DecodeEngine:
    """Runs turns for many episodes on one model. `run_turn` may be called from any number of threads."""

    def __init__(self, model: torch.nn.Module, device: torch.device, *, max_rows: int = 8):
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.model, self.device, self.max_rows = model, device, max_rows
        self.cache_kw = nexus.cache_kwarg(model)
        self._pending: list[_Row] = []
        self._active: list[_Row] = []
        self._stack: nexus.CacheStack | None = None
        self._cv = threading.Condition()
        self._closed = False
        self.steps = 0  # batched decode forwards so far
        self.rows_decoded = 0  # tokens they produced
        self._thread = threading.Thread(target=self._loop, name="nexus-decode-engine", daemon=True)
        self._thread.start()

    def run_turn(self, cache: nexus.EvictableCache, feed: list[int], decoder: TurnDecoder) -> TurnTiming:
        """Prefill `feed` onto `cache`, then decode with `decoder` until the turn ends; blocks until then.
        Raises what the model raised (out of memory, say)."""
        row = _Row(cache=cache, feed=feed, decoder=decoder)
        with self._cv:
            if self._closed:
                raise RuntimeError("the decode engine is closed")
            self._pending.append(row)
            self._cv.notify()
        return row.future.result()

    def close(self) -> None:
        """Finish the turns already submitted, then stop the engine thread."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()

    # -- the engine thread ----------------------------------------------------------------------------------
    def _loop(self) -> None:
        torch.set_grad_enabled(False)  # grad mode is per thread
        while True:
            with self._cv:
                while not self._pending and not self._active and not self._closed:
                    self._cv.wait()
                if self._closed and not self._pending and not self._active:
                    return
                room = self.max_rows - len(self._active)
                joining, self._pending = self._pending[:room], self._pending[room:]
            changed = False
            for row in joining:
                changed |= self._prefill(row)
            try:
                if changed:
                    self._restack()
                if self._active:
                    self._step()
            except BaseException as exc:  # noqa: BLE001 - every decoding row fails; the engine goes on
                self._fail_active(exc)

    def _prefill(self, row: _Row) -> bool:
        """Prefill one row alone; True if it goes on decoding (joins the stack)."""
        try:
            t0 = time.perf_counter()
            ids = torch.as_tensor(row.feed, dtype=torch.long, device=self.device).view(1, -1)
            logits = forward_last(self.model, self.cache_kw, row.cache, ids)
            sync(self.device)
            row.t_decode = time.perf_counter()
            row.prefill_s = row.t_decode - t0
            row.next_token = row.decoder.next_token(logits)
        except BaseException as exc:  # noqa: BLE001 - handed to the episode's thread, which decides
            row.future.set_exception(exc)
            return False
        if row.next_token is None:
            row.future.set_result(row.timing())
            return False
        self._active.append(row)
        return True

    def _restack(self) -> None:
        old, self._stack = self._stack, (nexus.CacheStack([r.cache for r in self._active]) if self._active else None)
        if old is not None:
            old.release()  # rows that left get their own right-sized buffers; the old stack is freed

    def _step(self) -> None:
        rows, stack = self._active, self._stack
        ids = torch.as_tensor([[r.next_token] for r in rows], dtype=torch.long, device=self.device)
        logits = forward_last(self.model, self.cache_kw, stack, ids, position_ids=stack.position_ids(self.device))
        self.steps, self.rows_decoded = self.steps + 1, self.rows_decoded + len(rows)
        done = []
        for i, row in enumerate(rows):
            row.steps, row.rows_sum = row.steps + 1, row.rows_sum + len(rows)
            row.next_token = row.decoder.next_token(logits[i : i + 1])
            if row.next_token is None:
                done.append(row)
        if done:
            sync(self.device)
            self._active = [r for r in rows if r.next_token is not None]
            self._restack()  # before the episodes look at their caches
            for row in done:
                row.future.set_result(row.timing())

    def _fail_active(self, exc: BaseException) -> None:
        rows, self._active = self._active, []
        old, self._stack = self._stack, None
        for row in rows:
            row.future.set_exception(exc)
        if old is not None:
            # the rows already carry `exc` and their caches are not used again: a second failure adds nothing
            with contextlib.suppress(Exception):
                old.release()
