"""`hf`: an in-process causal LM whose KV cache nexus manages, under either protocol.

Protocols (what the cache holds across agent turns):
  true_eviction  one EvictableCache per episode, carried across every turn. Each call appends only the new
                 tokens: the closing of the previous assistant turn, the observation as a user turn, and the
                 next assistant header. History already in the cache is never re-tokenised, so the cache holds
                 exactly the tokens the model produced, including earlier <think> content that Qwen3's chat
                 template would drop on re-rendering. Evicted tokens never return.
  full_context   every call re-renders the whole conversation with the chat template and prefills it into a
                 fresh cache, compressed by the method at the end of that prefill; evicted tokens can return.

Why our own decode loop instead of `generate()`: we need the prefill/decode split timed per turn, the cache
statistics just after the prefill's eviction, stopping at <|im_end|>, a per-episode torch.Generator (generate
draws from the global RNG), and exact control of what is fed (the last sampled token is fed at the start of the
next turn). The loop is a few lines; with `engine=` the same turn runs batched with other episodes' turns in a
`DecodeEngine` (agent_runner/engine.py), with the same tokens.

Each completion carries its token stream in `Completion.tokens` (`TurnTokens`: keep, append, generated): this
turn's context is the previous stream's first `keep` tokens + `append`, and `generated` are the tokens sampled
(the stop token included). Counterfactual replay (measure/counterfactual.py) feeds exactly that stream, and
so does `complete(..., forced_ids=...)` (`rerun --from-turn K`, agent_runner/backends/forced_prefix.py): a
stored turn's `generated` ids fed token by token, with the generator drawing as it did when they were sampled.

Before each prefill the cache is told what every position of the context holds (`nexus.segments`: the system
prompt, the task, each assistant turn, each observation; `agent_runner.chat_segments`), read from the ChatML ids
of the whole context the cache holds after the feed; a policy that reads them (`observation_masking`, or
`candidates: newest_turn`) decides by them, every other policy ignores them. Under full context with
`observation_masking`'s paper rule (`latest`), the paper's own text-level method is applied: the rendered history
has every observation older than the newest `keep_latest` replaced by the placeholder before it is fed, so the
stored stream (`TurnTokens`) is exactly what was fed, and those messages are marked `masked`, which the KV rule
leaves alone.
"""

from __future__ import annotations

import dataclasses
import time

import torch

import nexus
from agent_runner.backends import ModelError
from agent_runner.chat_segments import ChatMarkers, chat_segments, mask_observations, text_masking
from agent_runner.chat_stream import ChatStream
from agent_runner.config import ModelSpec, ProtocolName, SamplingConfig, check_protocol
from agent_runner.engine import DecodeEngine, TurnDecoder, TurnTiming, forward_last, sync
from agent_runner.model_host import ModelHost, load_host
from agent_runner.records import Completion, CompletionInfo, LayerStats, Message, TurnTokens


class HFBackend:
    """The `Model` protocol over a hosted transformers model (see agent_runner.backends).

    ``eviction``, ``protocol`` and ``max_context_tokens`` have no default here: an episode's come from its
    ``EpisodeSpec`` (``agent_runner.loaded_models.backend_for``), whose come from the job (``jobs.spec.JobSpec``), the
    one place the defaults are written. The sampler has no seed until ``reset(seed=)``: the episode's one seed is
    applied once, by ``Agent.run``, and a completion asked for before it is an error. ``model`` (when no ``host``
    is given): a ``ModelSpec`` or a model name (None: ``ModelSpec()``'s).
    """

    def __init__(
        self,
        host: ModelHost | None = None,
        *,
        model: ModelSpec | str | None = None,
        eviction: nexus.EvictionConfig,
        protocol: ProtocolName,
        sampling: SamplingConfig | None = None,
        max_context_tokens: int,
        engine: DecodeEngine | None = None,
    ):
        check_protocol(protocol)
        if host is None:
            if not isinstance(model, ModelSpec):
                model = ModelSpec() if model is None else ModelSpec(name=model)
            host = load_host(model)
        self.host = host
        self.eviction = eviction
        self.protocol = protocol
        self.sampling = sampling or SamplingConfig()
        # the window is also the model's own: past max_position_embeddings RoPE runs on positions it never saw
        positions = getattr(host.model.config.get_text_config(), "max_position_embeddings", None)
        self.max_context_tokens = min(max_context_tokens, positions or max_context_tokens)
        if engine is not None and engine.model is not host.model:
            raise ValueError("the decode engine serves another model than this backend's host")
        self.engine = engine
        self._cache_kw = nexus.cache_kwarg(host.model)
        self._stop = set(host.stop_token_ids)
        self.chat = ChatStream(host.tokenizer)
        self._im_end = self.chat.im_end
        self._markers = ChatMarkers.of_chatml(host.tokenizer)
        self._masking = text_masking(eviction, protocol)
        self.seed: int | None = None  # set by reset: the episode's seed, applied once per episode
        self.generator: torch.Generator | None = None
        self.cache: nexus.EvictableCache | None = None

    # -- the Model protocol --------------------------------------------------------------------------------
    def reset(self, *, seed: int) -> None:
        self.seed = seed
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.cache = None
        self.chat.reset()

    def complete(
        self,
        messages: list[Message],
        *,
        max_new_tokens: int | None = None,
        forced_text: str | None = None,
        forced_ids: list[int] | None = None,
    ) -> Completion:
        """Next assistant turn. `forced_ids` teacher-forces a stored turn's sampled ids (its
        `TurnTokens.generated`, the stop token included) instead of sampling: fed token by token, so decode-time
        evictions happen exactly as when sampling, and the cache ends as the stored run's did
        (`Completion.info.forced_agreed`: how many of them the generator's own draw chose too, see `TurnDecoder`).
        `forced_text` teacher-forces a text re-tokenised (+ <|im_end|>): not the ids a model sampled in general
        (a sampled sequence is often not the tokenizer's own encoding of its text), so the cache may differ."""
        if forced_text is not None and forced_ids is not None:
            raise ValueError("give forced_text or forced_ids, not both")
        if self.generator is None:  # a caller's slip, never a run's outcome: no unseeded sample is ever drawn
            raise RuntimeError("HFBackend.reset(seed=...) comes first: the episode's seed is applied by Agent.run")
        fresh = self.protocol == "full_context" or self.cache is None
        try:
            feed, mismatch, keep, masked = self._feed(messages, fresh=fresh)
            stored = TurnTokens(keep=keep, append=self.stream[keep:], generated=[])
        except ValueError as exc:
            raise ModelError(f"hf backend: {exc}") from exc
        prompt_tokens = (0 if fresh else self.cache.logical_length) + len(feed)
        room = self.max_context_tokens - prompt_tokens
        if room <= 0:  # nothing is fed: under full_context the last turn's cache stays the final one
            return Completion(
                text="",
                prompt_tokens=prompt_tokens,
                logical_length=prompt_tokens,
                finish_reason="length",
                context_full=True,
                tokens=stored,
            )
        if forced_ids is not None and not forced_ids:  # a stored turn that was fed generated a token at least
            raise ModelError("hf backend: forced_ids is empty but the context has room: not the stored turn")
        # caps: the agent's per-turn one, the sampling config's; neither set (the default) = the rest of the window
        limit = min(cap for cap in (max_new_tokens, self.sampling.max_new_tokens, room) if cap is not None)
        if fresh:
            self.cache = None  # free the last turn's buffers before the new prefill allocates its own
            self.cache = nexus.EvictableCache(self.host.model.config, self.eviction)
        # what every position of the context holds, set before the forward that feeds it (nexus.segments)
        self.cache.segments = chat_segments(self.stream, self._markers, masked) if self._markers else ()
        forced = None
        if forced_text is not None:
            forced = self.host.tokenizer.encode(forced_text, add_special_tokens=False) + [self._im_end]
        try:
            if forced_ids is not None:
                completion, generated = self._generate(feed, limit, list(forced_ids), draw_forced=True)
            else:
                completion, generated = self._generate(feed, limit, forced)
        except torch.OutOfMemoryError as exc:
            raise ModelError(f"hf backend: out of memory at logical length {prompt_tokens}: {exc}") from exc
        self.chat.generated(generated, completion.text, len(messages))  # every token but the last was fed back
        completion.prompt_tokens = prompt_tokens
        completion.tokens = stored.model_copy(update={"generated": generated})
        completion.history_mismatch = mismatch
        return completion

    def retention(self) -> dict | None:
        """The retention map of the episode's final cache (`nexus.retention_runs`): the cache carried across
        the turns under true_eviction, the last turn's under full_context. None before any turn was fed.
        Read it after the episode's last call and before the next `reset`, which drops the cache."""
        if self.cache is None or self.cache.logical_length == 0:
            return None
        return nexus.retention_runs(self.cache)

    # -- what to feed ----------------------------------------------------------------------------------------
    @property
    def stream(self) -> list[int]:
        """Every token fed to the cache so far (true_eviction), in order."""
        return self.chat.stream

    @property
    def _pending(self) -> int | None:
        return self.chat.pending

    def _feed(self, messages: list[Message], *, fresh: bool) -> tuple[list[int], bool, int, frozenset[int]]:
        """``ChatStream.feed`` (one place for the backend and the replay of text trajectories), and the user
        messages (0: the task) it masked. Under the text-level masking (``text_masking``) the freshly rendered
        stream has its old observations replaced by the placeholder: the stream becomes the masked ids, which are
        what is fed, and ``keep`` is counted against them."""
        previous = list(self.chat.stream) if self._masking is not None else []
        feed, mismatch, keep = self.chat.feed(messages, fresh=fresh)
        if self._masking is None or self._markers is None:  # under full context only: every call is fresh
            return feed, mismatch, keep, frozenset()
        masked = mask_observations(
            feed,
            self.host.tokenizer,
            self._markers,
            keep_latest=self._masking.keep_latest,
            placeholder=self._masking.placeholder,
        )
        self.chat.stream = list(masked.ids)
        return list(masked.ids), mismatch, _shared_prefix(previous, masked.ids), masked.masked

    # -- the decode loop --------------------------------------------------------------------------------------
    @torch.no_grad()
    def _run_alone(self, feed: list[int], decoder: TurnDecoder) -> TurnTiming:
        """Prefill `feed`, then decode one token per forward until `decoder` ends the turn."""
        device, model = self.host.device, self.host.model
        t0 = time.perf_counter()
        ids = torch.as_tensor(feed, dtype=torch.long, device=device).view(1, -1)
        tok = decoder.next_token(forward_last(model, self._cache_kw, self.cache, ids))
        sync(device)
        t1 = time.perf_counter()
        while tok is not None:
            ids = torch.tensor([[tok]], dtype=torch.long, device=device)
            tok = decoder.next_token(forward_last(model, self._cache_kw, self.cache, ids))
        sync(device)
        return TurnTiming(prefill_s=t1 - t0, decode_s=time.perf_counter() - t1)

    def _generate(
        self, feed: list[int], limit: int, forced: list[int] | None = None, *, draw_forced: bool = False
    ) -> tuple[Completion, list[int]]:
        """This turn's completion and the tokens it sampled (the stop token included)."""
        cache = self.cache
        before = [cache.occupancy(i) + len(feed) for i in range(cache.num_layers)]
        events0 = len(cache.events)
        cache.reset_peaks()  # this turn's peaks: from before its prefill (a fresh cache is empty) to its end
        decoder = TurnDecoder(
            stop=self._stop,
            limit=limit,
            sampling=self.sampling,
            generator=self.generator,
            forced=forced,
            draw_forced=draw_forced,
        )
        if self.engine is not None:
            timing = self.engine.run_turn(cache, feed, decoder)
        else:
            timing = self._run_alone(feed, decoder)
        tokens, finish = decoder.tokens, decoder.finish
        memory = cache.memory()
        text_ids = tokens[:-1] if finish == "stop" else tokens
        decode_s = timing.decode_s
        text = self.host.tokenizer.decode(text_ids, skip_special_tokens=False)
        completion = Completion(
            text=text,
            tokens_appended=len(feed),
            tokens_generated=len(tokens),
            logical_length=cache.logical_length,
            physical_before=LayerStats.of(before),
            physical_after=LayerStats.of([cache.occupancy(i) for i in range(cache.num_layers)]),
            eviction_events=len(cache.events) - events0,
            **dataclasses.asdict(memory),
            prefill_s=timing.prefill_s,
            decode_s=decode_s,
            tokens_per_s=(len(tokens) - 1) / decode_s if len(tokens) > 1 and decode_s > 0 else None,
            finish_reason=finish,
            batch_rows=timing.rows_mean if self.engine is not None else None,
            info=CompletionInfo(budget=cache.budget(0), forced_agreed=decoder.agreed if draw_forced else None),
        )
        return completion, tokens


def _shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share (``TurnTokens.keep`` of a re-rendered context)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
