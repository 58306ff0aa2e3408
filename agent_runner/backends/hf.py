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
next turn). The loop is a dozen lines.
"""

from __future__ import annotations

import time

import torch

import nexus
from agent_runner.backends import ModelError
from agent_runner.config import PROTOCOLS, ModelSpec, ProtocolName, SamplingConfig
from agent_runner.model_host import ModelHost, load_host, render_chat
from agent_runner.records import Completion, LayerStats, Message
from agent_runner.sampling import sample_next


def _as_dicts(messages: list[Message]) -> list[dict]:
    return [{"role": m.role, "content": m.content} for m in messages]


class HFBackend:
    """The `Model` protocol over a hosted transformers model (see agent_runner.backends)."""

    def __init__(
        self,
        host: ModelHost | None = None,
        *,
        model: ModelSpec | str | None = None,
        eviction: nexus.EvictionConfig | None = None,
        protocol: ProtocolName = "true_eviction",
        sampling: SamplingConfig | None = None,
        max_context_tokens: int = 65536,
    ):
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")
        if host is None:
            spec = model if isinstance(model, ModelSpec) else ModelSpec(name=model or "tiny")
            host = load_host(spec)
        self.host = host
        self.eviction = eviction or nexus.EvictionConfig(method="dense")
        self.protocol = protocol
        self.sampling = sampling or SamplingConfig()
        self.max_context_tokens = max_context_tokens
        self._cache_kw = nexus.cache_kwarg(host.model)
        self._stop = set(host.stop_token_ids)
        self._im_end = host.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.reset(seed=0)

    # -- the Model protocol --------------------------------------------------------------------------------
    def reset(self, *, seed: int) -> None:
        self.seed = seed
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.cache: nexus.EvictableCache | None = None
        self.stream: list[int] = []  # every token fed to the cache (true_eviction), in order
        self._consumed = 0  # messages already in the cache
        self._last_text: str | None = None
        self._pending: int | None = None  # last sampled token, fed at the start of the next call

    def complete(
        self, messages: list[Message], *, max_new_tokens: int | None = None, forced_text: str | None = None
    ) -> Completion:
        """Next assistant turn. `forced_text` teacher-forces that completion instead of sampling (replaying a
        stored turn): it is fed token by token, so decode-time evictions happen exactly as when sampling."""
        try:
            feed, mismatch = self._feed(messages)
        except ValueError as exc:
            raise ModelError(f"hf backend: {exc}") from exc
        prompt_tokens = (self.cache.logical_length if self.cache else 0) + len(feed)
        room = self.max_context_tokens - prompt_tokens
        if room <= 0:
            return Completion(
                text="",
                prompt_tokens=prompt_tokens,
                logical_length=prompt_tokens,
                finish_reason="length",
                extra={"context_full": True},
            )
        # caps: the agent's per-turn one, the sampling config's; neither set (the default) = the rest of the window
        limit = min(cap for cap in (max_new_tokens, self.sampling.max_new_tokens, room) if cap is not None)
        forced = None
        if forced_text is not None:
            forced = self.host.tokenizer.encode(forced_text, add_special_tokens=False) + [self._im_end]
        try:
            completion = self._generate(feed, limit, forced)
        except torch.OutOfMemoryError as exc:
            raise ModelError(f"hf backend: out of memory at logical length {prompt_tokens}: {exc}") from exc
        self._consumed = len(messages)
        self._last_text = completion.text
        completion.prompt_tokens = prompt_tokens
        if mismatch:
            completion.extra["history_mismatch"] = True
        return completion

    # -- what to feed ----------------------------------------------------------------------------------------
    def _render(self, messages: list[dict]) -> list[int]:
        return render_chat(self.host.tokenizer, messages)

    def _feed(self, messages: list[Message]) -> tuple[list[int], bool]:
        """Token ids to feed this call (and whether the caller edited the previous assistant text)."""
        if not messages or messages[-1].role != "user":
            raise ValueError("the conversation must end with a user message")
        if self.protocol == "full_context" or self.cache is None:
            self.cache = nexus.EvictableCache(self.host.model.config, self.eviction)
            self.stream = self._render(_as_dicts(messages))
            return list(self.stream), False
        new = messages[self._consumed :]
        if len(new) != 2 or new[0].role != "assistant" or new[1].role != "user":
            raise ValueError(
                f"true_eviction expects the previous conversation + one assistant and one user message, got "
                f"{[m.role for m in new]} after {self._consumed} messages"
            )
        # close the assistant turn with the model's own tokens: the stop token it sampled (not yet fed),
        # or <|im_end|> if it ran out of tokens
        close = [self._pending] if self._pending is not None else []
        if self._pending != self._im_end:
            close.append(self._im_end)
        nl = self.host.tokenizer.encode("\n", add_special_tokens=False)
        user = self._render([{"role": "user", "content": new[1].content}])
        feed = close + nl + user
        self.stream += feed
        return feed, new[0].content != self._last_text

    # -- the decode loop --------------------------------------------------------------------------------------
    @torch.no_grad()
    def _forward(self, ids: list[int] | torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(ids, dtype=torch.long, device=self.host.device).view(1, -1)
        out = self.host.model(input_ids=x, use_cache=True, logits_to_keep=1, **{self._cache_kw: self.cache})
        return out.logits[:, -1]

    def _sync(self) -> None:
        if self.host.device.type == "cuda":
            torch.cuda.synchronize(self.host.device)

    def _generate(self, feed: list[int], limit: int, forced: list[int] | None = None) -> Completion:
        cache = self.cache
        before = [cache.occupancy(i) + len(feed) for i in range(cache.num_layers)]
        events0 = len(cache.events)
        t0 = time.perf_counter()
        logits = self._forward(feed)
        self._sync()
        t1 = time.perf_counter()
        tokens: list[int] = []
        finish = "length"
        while True:
            if forced is not None:
                tok = forced[len(tokens)]
            else:
                tok = int(sample_next(logits, self.sampling, self.generator)[0])
            tokens.append(tok)
            if tok in self._stop:
                finish = "stop"
                break
            if len(tokens) >= limit and forced is None:
                break
            self.stream.append(tok)
            logits = self._forward([tok])
        self._sync()
        t2 = time.perf_counter()
        self._pending = tokens[-1]
        text_ids = tokens[:-1] if finish == "stop" else tokens
        decode_s = t2 - t1
        return Completion(
            text=self.host.tokenizer.decode(text_ids, skip_special_tokens=False),
            tokens_appended=len(feed),
            tokens_generated=len(tokens),
            logical_length=cache.logical_length,
            physical_before=LayerStats.of(before),
            physical_after=LayerStats.of([cache.occupancy(i) for i in range(cache.num_layers)]),
            eviction_events=len(cache.events) - events0,
            cache_bytes=cache.nbytes(),
            prefill_s=t1 - t0,
            decode_s=decode_s,
            tokens_per_s=(len(tokens) - 1) / decode_s if len(tokens) > 1 and decode_s > 0 else None,
            finish_reason=finish,
            extra={
                "budget": cache.budget(0),
                "protocol": self.protocol,
                "method": self.eviction.method,
                "scope": self.eviction.scope,
            },
        )
