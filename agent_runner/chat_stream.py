"""The token stream of a conversation as the hf backend feeds it, under either protocol: one place for both the
backend and the replay of text trajectories.

``ChatStream`` is the bookkeeping of ``agent_runner.backends.hf.HFBackend``: which tokens a call feeds, and
what the stream holds afterwards. ``render_trajectory`` drives the same object over a stored conversation
(a text trajectory: expert, oracle or openai turns) and returns each turn's ``TurnTokens``, so a text
trajectory is teacher-forced through a model exactly as the hf backend would have rendered it with
``complete(messages, forced_text=...)``:

  true_eviction  turn 0 renders [system, user] with the chat template; each later turn appends the close of
                 the previous assistant turn (its stop token, and ``<|im_end|>`` if the stop was another token),
                 a newline and the next user message rendered alone (``agent_runner.chat_turns``).
  full_context   every turn renders the whole conversation; ``keep`` is where it first differs from the
                 previous turn's stream.

An assistant turn given as text is generated as ``encode(text) + [<|im_end|>]`` (what ``forced_text`` feeds).

``render_trajectory`` also lays out where text sits in the stream, so a score can be tied to what the model
had to copy: per turn, the logical position at which each user message's content starts and ends in that
turn's context (``Layout.messages``), and the character span of each generated token in the assistant text
(``Layout.offsets``). Both come from the tokenizer's offset mapping of the very text that was tokenised, and
are checked against the fed ids (``RenderError`` when a tokenizer cannot give them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agent_runner.chat_turns import user_turn_ids, user_turn_text
from agent_runner.records import Message, TurnTokens
from agent_runner.tokenizers import render_chat


class RenderError(ValueError):
    """A conversation cannot be rendered into a stream as asked (say why)."""


class ChatStream:
    """What an hf backend has fed a model in one episode (see the module docstring)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.newline = tokenizer.encode("\n", add_special_tokens=False)
        self.reset()

    def reset(self) -> None:
        self.stream: list[int] = []  # every token fed to the cache (true_eviction), in order
        self.consumed = 0  # messages already in the stream
        self.last_text: str | None = None  # the previous assistant turn as generated
        self.pending: int | None = None  # the last generated token, fed at the start of the next call

    def feed(self, messages: Sequence[Message], *, fresh: bool) -> tuple[list[int], bool, int]:
        """Token ids to feed this call, whether the caller edited the previous assistant text, and how many
        tokens of the previous stream this turn's context starts with. fresh: the whole conversation is
        rendered, for a new cache (full_context, or the first call). ValueError for a conversation that does
        not continue the stream."""
        if not messages or messages[-1].role != "user":
            raise ValueError("the conversation must end with a user message")
        if fresh:
            previous, self.stream = self.stream, render_chat(self.tokenizer, _as_dicts(messages))
            keep = next((i for i, (a, b) in enumerate(zip(previous, self.stream, strict=False)) if a != b), None)
            keep = min(len(previous), len(self.stream)) if keep is None else keep
            return list(self.stream), False, keep
        new = messages[self.consumed :]
        if len(new) != 2 or new[0].role != "assistant" or new[1].role != "user":
            raise ValueError(
                f"true_eviction expects the previous conversation + one assistant and one user message, got "
                f"{[m.role for m in new]} after {self.consumed} messages"
            )
        feed = self.close() + self.newline + user_turn_ids(self.tokenizer, new[1].content)
        keep = len(self.stream)
        self.stream += feed
        return feed, new[0].content != self.last_text, keep

    def close(self) -> list[int]:
        """The close of the last assistant turn with the model's own tokens: the stop token it sampled (not yet
        fed), or ``<|im_end|>`` if it ran out of tokens."""
        close = [self.pending] if self.pending is not None else []
        if self.pending != self.im_end:
            close.append(self.im_end)
        return close

    def generated(self, tokens: list[int], text: str, consumed: int) -> None:
        """A turn generated ``tokens`` (its stop token last) reading as ``text``, after ``consumed`` messages:
        every token but the last was fed back; the last opens the next feed."""
        self.stream += tokens[:-1]
        self.pending = tokens[-1]
        self.consumed = consumed
        self.last_text = text


def _as_dicts(messages: Sequence[Message]) -> list[dict]:
    return [{"role": m.role, "content": m.content} for m in messages]


@dataclass
class Layout:
    """Where text sits in one rendered turn. ``messages[i] = (start, end)``: logical positions of user message
    ``i``'s content in this turn's context (``i`` counts user messages: 0 is the task, then one per earlier
    turn's observation). ``offsets[j] = (start, end)``: characters of the assistant text that generated token
    ``j`` covers (the final ``<|im_end|>`` has none)."""

    context: int  # tokens in this turn's context
    messages: dict[int, tuple[int, int]] = field(default_factory=dict)
    offsets: list[tuple[int, int]] = field(default_factory=list)
    # per user message: the characters of its content each of its tokens covers, relative to the content
    chars: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    def positions(self, message: int, start: int, end: int) -> tuple[int, int] | None:
        """Positions [first, last) in this context of the tokens covering characters [start, end) of user
        message ``message``'s content; None when that message is not in the context or the range is empty."""
        if message not in self.messages or end <= start:
            return None
        base = self.messages[message][0]
        hits = [j for j, (a, b) in enumerate(self.chars[message]) if a < end and b > start]
        return (base + hits[0], base + hits[-1] + 1) if hits else None


@dataclass
class RenderedTrajectory:
    protocol: str
    turns: list[TurnTokens]
    layouts: list[Layout]
    assistant: list[str]  # each scored turn's assistant text
    observations: list[str]  # the user messages' contents, in order (0: the task)
    cut: int = 0  # turns left out because they did not fit the model's window


def render_trajectory(
    tokenizer, messages: Sequence[Message], protocol: str, *, max_positions: int | None = None
) -> RenderedTrajectory:
    """Each assistant turn of ``messages`` (system, user, then assistant/user pairs; a trailing assistant turn
    allowed) as the hf backend would feed and generate it under ``protocol``; turns from the first one whose
    context and generation would pass ``max_positions`` are left out (``cut``)."""
    if len(messages) < 3 or [m.role for m in messages[:2]] != ["system", "user"]:
        raise RenderError("a trajectory starts with a system and a user message and has an assistant turn")
    roles = [m.role for m in messages[2:]]
    if any(r != ("assistant" if i % 2 == 0 else "user") for i, r in enumerate(roles)):
        raise RenderError(f"after the task the roles must alternate assistant, user; got {roles}")
    chat = ChatStream(tokenizer)
    users = [m.content for m in messages if m.role == "user"]
    out = RenderedTrajectory(protocol, [], [], [], users)
    n_turns = (len(messages) - 1) // 2
    for t in range(n_turns):
        context_messages = messages[: 2 * t + 2]
        fresh = protocol == "full_context" or t == 0
        feed, _, keep = chat.feed(context_messages, fresh=fresh)
        text = messages[2 * t + 2].content
        encoded = _encode(tokenizer, text)
        tokens = [*encoded.ids, chat.im_end]
        context = keep + len(feed) if not fresh else len(feed)
        if max_positions is not None and context + len(tokens) > max_positions:
            out.cut = n_turns - t
            break
        layout = Layout(context=context, offsets=encoded.offsets)
        if fresh:
            _locate(tokenizer, context_messages, feed, layout)
        else:
            layout.messages.update(out.layouts[-1].messages)
            layout.chars.update(out.layouts[-1].chars)
            _locate_user_turn(tokenizer, feed, users[t], keep, t, chat, layout)
        out.turns.append(TurnTokens(keep=keep, append=chat.stream[keep:], generated=tokens))
        out.layouts.append(layout)
        out.assistant.append(text)
        chat.generated(tokens, text, len(context_messages))
    return out


@dataclass
class _Encoded:
    ids: list[int]
    offsets: list[tuple[int, int]]


def _encode(tokenizer, text: str) -> _Encoded:
    """``tokenizer.encode(text)`` with each token's character span (RenderError without an offset mapping)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except (NotImplementedError, ValueError) as exc:
        raise RenderError(f"the tokenizer gives no offset mapping ({exc}): a fast tokenizer is needed") from None
    if list(enc["input_ids"]) != list(ids):
        raise RenderError("the tokenizer's offset mapping tokenises the text differently from encode()")
    return _Encoded(list(ids), [tuple(o) for o in enc["offset_mapping"]])


def _place(layout: Layout, index: int, offsets: list[tuple[int, int]], start: int, end: int, base: int) -> None:
    """Record user message ``index``, characters [start, end) of a text tokenised with ``offsets`` whose first
    token sits at position ``base``: its token positions and each token's characters relative to ``start``."""
    first = next(i for i, (a, b) in enumerate(offsets) if b > start)
    last = max(i for i, (a, b) in enumerate(offsets) if a < end) if end > start else first - 1
    layout.messages[index] = (base + first, base + last + 1)
    layout.chars[index] = [(a - start, b - start) for a, b in offsets[first : last + 1]]


def _locate(tokenizer, messages: Sequence[Message], feed: list[int], layout: Layout) -> None:
    """Positions of each user message's content in ``feed``, the freshly rendered ``messages``."""
    text = tokenizer.apply_chat_template(_as_dicts(messages), tokenize=False, add_generation_prompt=True)
    encoded = _encode(tokenizer, text)
    if encoded.ids != feed:
        raise RenderError("the chat template's text does not tokenise into the ids it renders")
    at = 0
    for i, content in enumerate(m.content for m in messages if m.role == "user"):
        start = text.find(content, at)
        if start < 0:
            raise RenderError(f"user message {i} is not in the rendered conversation verbatim")
        at = start + len(content)
        _place(layout, i, encoded.offsets, start, at, 0)


def _locate_user_turn(tokenizer, feed, content, keep, index, chat: ChatStream, layout: Layout) -> None:
    """Position of user message ``index`` in a true-eviction feed (close + newline + the user turn)."""
    turn_text = user_turn_text(tokenizer, content)
    encoded = _encode(tokenizer, turn_text)
    head = len(feed) - len(encoded.ids)
    if feed[head:] != encoded.ids:
        raise RenderError("the user turn's ids differ from its text's encoding")
    start = turn_text.find(content)
    _place(layout, index, encoded.offsets, start, start + len(content), keep + head)
