"""Turn segments of a ChatML token stream, and the paper's observation masking applied to one.

Both chat templates served here (Qwen3, SmolLM2) are ChatML: every message opens with ``<|im_start|>ROLE\\n`` and
closes with ``<|im_end|>``. So where each message lies is read from the ids themselves, whatever fed them (the hf
backend under either protocol, a replay of a stored stream, a rendered text trajectory, a probe), and nothing
needs a separate layout. :func:`chat_segments` gives the cache its ``nexus.segments``: the system message is the
``prompt``, the first user message the ``task``, each later user message an ``observation`` (the agent's tool
output), each assistant message (its header, its text, its close) an ``assistant`` turn; the last segment is left
open, so what is decoded after the last header belongs to it.

:func:`mask_observations` is the text-level method of The Complexity Trap (arXiv 2508.21433), for full context:
every observation older than the newest ``keep_latest`` has its content replaced by a placeholder
(``"Old environment output: (N lines omitted)"``), and its segment is marked ``masked``. It works on ids: the
span between ``<|im_start|>`` and ``<|im_end|>`` of such a message is re-encoded as ``user\\n`` + the placeholder,
exactly the ids the chat template gives a conversation whose message held the placeholder (the special tokens cut
the rendered text into pieces tokenised apart).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from nexus.segments import Segment

if TYPE_CHECKING:
    from nexus.config import EvictionConfig

_ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatMarkers:
    """The ids that open and close a ChatML message in one tokenizer."""

    im_start: int
    im_end: int
    roles: dict[str, list[int]]  # role -> the ids of "ROLE" right after <|im_start|>

    @classmethod
    def of(cls, tokenizer) -> ChatMarkers:
        ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>")]
        if any(i is None or i == tokenizer.unk_token_id for i in ids):
            raise ValueError("the tokenizer has no <|im_start|> / <|im_end|>: its chat template is not ChatML")
        return cls(ids[0], ids[1], {r: tokenizer.encode(r, add_special_tokens=False) for r in _ROLES})

    @classmethod
    def of_chatml(cls, tokenizer) -> ChatMarkers | None:
        """``of(tokenizer)``, or None for a chat template that is not ChatML: its caches are told no segments (every
        position ``other``), and nothing fails for it."""
        try:
            return cls.of(tokenizer)
        except ValueError:
            return None

    def role_at(self, ids: Sequence[int], at: int) -> str | None:
        """The role of the message opening at ``at`` (``ids[at]`` is ``<|im_start|>``), None if unknown."""
        for role, role_ids in self.roles.items():
            if list(ids[at + 1 : at + 1 + len(role_ids)]) == role_ids:
                return role
        return None


class TextMasking(NamedTuple):
    """The paper's text-level rule as one setting applies it (``observation_masking``'s)."""

    keep_latest: int
    placeholder: str


def text_masking(eviction: EvictionConfig, protocol: str) -> TextMasking | None:
    """The text-level masking a setting applies under ``protocol``: ``observation_masking``'s paper rule (``latest``)
    under full context, where every turn re-renders the history (the hf backend renders it masked, a replay or a
    probe feeds those rows the masked ids); None for every other setting, which is fed the history as it is
    (observation_masking under true eviction, or with rule ``budget``, is a KV method like the others). The one
    place this is decided."""
    if protocol != "full_context" or eviction.method != "observation_masking":
        return None
    policy = eviction.policy
    return TextMasking(policy.keep_latest, policy.placeholder) if policy.rule == "latest" else None


def _messages(ids: Sequence[int], markers: ChatMarkers) -> list[tuple[int, str]]:
    """(start, role) of every message in ``ids``, in order."""
    return [(i, markers.role_at(ids, i) or "other") for i, tok in enumerate(ids) if tok == markers.im_start]


def chat_segments(ids: Sequence[int], markers: ChatMarkers, masked: Collection[int] = ()) -> tuple[Segment, ...]:
    """The segments of a ChatML stream ``ids`` (see the module docstring). ``masked``: the user messages (counted
    from 0, the task) that hold a placeholder instead of their observation."""
    found = _messages(ids, markers)
    if not found:
        return (Segment(0, None, "other"),) if ids else ()
    out: list[Segment] = []
    if found[0][0] > 0:
        out.append(Segment(0, found[0][0], "other"))
    users = 0
    for n, (start, role) in enumerate(found):
        end = found[n + 1][0] if n + 1 < len(found) else None
        if role == "system":
            kind = "prompt"
        elif role == "user":
            kind = "task" if users == 0 else "masked" if users in masked else "observation"
            users += 1
        else:
            kind = "assistant" if role == "assistant" else "other"
        out.append(Segment(start, end, kind))
    return tuple(out)


def _is_placeholder(content: str, placeholder: str) -> bool:
    """Whether ``content`` is ``placeholder`` with some line count."""
    return re.fullmatch(re.escape(placeholder).replace(re.escape("{lines}"), r"\d+"), content) is not None


@dataclass(frozen=True)
class MaskedStream:
    ids: list[int]
    masked: frozenset[int]  # user messages (0: the task) whose content is now the placeholder
    #: each replaced span of the original ids: (start, end) there, and how many ids replace it
    replaced: tuple[tuple[int, int, int], ...] = ()

    def moved(self, start: int, end: int) -> tuple[int, int] | None:
        """Where original positions [start, end) sit in the masked ids; None if any of them was masked away."""
        shift = 0
        for a, b, n in self.replaced:
            if start < b and end > a:
                return None
            if b <= start:
                shift += n - (b - a)
        return start + shift, end + shift


def mask_observations(
    ids: Sequence[int], tokenizer, markers: ChatMarkers, *, keep_latest: int, placeholder: str
) -> MaskedStream:
    """``ids`` with every observation older than the newest ``keep_latest`` replaced by ``placeholder``
    (``{lines}``: the observation's line count, as ``str.splitlines`` counts). The task (user message 0) is never an
    observation; a message that already reads as the placeholder (a stored full-context stream of this method) is
    marked masked and left as it is, so masking twice changes nothing."""
    found = _messages(ids, markers)
    users = [(n, start) for n, (start, role) in enumerate(found) if role == "user"]
    observations = users[1:]
    old = observations[: max(len(observations) - keep_latest, 0)]
    if not old:
        return MaskedStream(list(ids), frozenset())
    out: list[int] = []
    at = 0
    masked = set()
    replaced = []
    for n, start in old:
        close = next((i for i in range(start + 1, len(ids)) if ids[i] == markers.im_end), None)
        if close is None:  # an unclosed message is the one being written: never old
            continue
        text = tokenizer.decode(ids[start + 1 : close], skip_special_tokens=False)
        content = text.split("\n", 1)[1] if "\n" in text else ""
        masked.add(users.index((n, start)))
        if _is_placeholder(content, placeholder):  # masked already (a stored full-context stream): as it is
            continue
        lines = len(content.splitlines())
        new = tokenizer.encode("user\n" + placeholder.format(lines=lines), add_special_tokens=False)
        out += ids[at : start + 1] + new
        replaced.append((start + 1, close, len(new)))
        at = close
    out += ids[at:]
    return MaskedStream(out, frozenset(masked), tuple(replaced))
