"""Whether one dense episode can stand for every protocol of a job: the check planning asks (``jobs.submit``).

Dense evicts nothing, yet the two protocols feed the model different things when the chat template re-renders
history differently from how it rendered each turn (``agent_runner.chat_stream``):

  true_eviction  the cache holds each turn as it was fed: turn 0 rendered by the template, then each assistant
                 turn's own tokens, its close, a newline and the next user message rendered alone.
  full_context   every turn re-renders the whole conversation with the template.

Qwen3's template (DeepSWE's, and the ``tiny`` preset's real one) drops the ``<think>`` block of every assistant
turn before the last user message when it re-renders, so under full context dense reads a different history
from the one true eviction holds: a different computation, which needs its own dense episodes.

:func:`dense_rendering` answers once per job, torch-free (``jobs`` loads no torch):

  ``identical``  the model's template renders a two-turn conversation with a reasoning block exactly as true
                 eviction holds it (:func:`history_renders_alike`): one dense episode is reused for every protocol
  ``no_model``   ``oracle`` and ``expert``: no model reads a history, so reuse is exact
  ``differs``    the renderings differ (or true eviction cannot render it at all): dense runs under each protocol
  ``unknown``    ``openai`` (the server renders the history, we cannot see how) or a tokenizer that could not be
                 loaded here: dense runs under each protocol

The check compares the canonical encoding of the assistant text (what ``render_trajectory`` and ``forced_text``
feed). A model that samples a non-canonical tokenization of its text still reads the re-tokenised text under full
context: ``identical`` means the rendering is the same, not that every sampled token sequence survives it.
"""

from __future__ import annotations

from functools import lru_cache

from agent_runner.chat_stream import ChatStream
from agent_runner.config import NO_MODEL_BACKENDS, DenseRendering, ModelSpec
from agent_runner.records import Message
from agent_runner.tokenizers import load_tokenizer, render_chat

#: the two-turn conversation the check renders: a reasoning block in the earlier assistant turn
CHECK_CONVERSATION = (
    Message(role="system", content="You are a programming agent. Use the tools to fix the issue."),
    Message(role="user", content="Fix the off-by-one error in parse() in parse.py."),
    Message(
        role="assistant",
        content="<think>\nThe slice probably starts at 1 instead of 0. Read the file first.\n</think>\n\n"
        "Let me read the file.\n<function=execute_bash>\n<parameter=command>cat parse.py</parameter>\n</function>",
    ),
    Message(role="user", content="def parse(s):\n    return s[1:]"),
)


def true_eviction_stream(tokenizer, messages) -> list[int]:
    """The tokens a true-eviction cache holds when the model is asked for the turn after ``messages`` (system,
    user, then assistant/user pairs): what the hf backend's ``ChatStream`` feeds, each assistant turn generated as
    its text's encoding + ``<|im_end|>``. ValueError when the stream cannot be rendered so."""
    chat = ChatStream(tokenizer)
    for end in range(2, len(messages) + 1, 2):
        chat.feed(messages[:end], fresh=end == 2)
        if end < len(messages):
            text = messages[end].content
            chat.generated(tokenizer.encode(text, add_special_tokens=False) + [chat.im_end], text, end)
    return list(chat.stream)


def full_context_stream(tokenizer, messages) -> list[int]:
    """The tokens a full-context turn prefills for the turn after ``messages``: the template over all of them."""
    return render_chat(tokenizer, [{"role": m.role, "content": m.content} for m in messages])


def history_renders_alike(tokenizer, messages=CHECK_CONVERSATION) -> bool:
    """Whether ``tokenizer``'s chat template renders ``messages`` (default: a two-turn conversation with a
    ``<think>`` block in the earlier assistant turn) the full-context way exactly as true eviction holds it."""
    try:
        held = true_eviction_stream(tokenizer, list(messages))
    except ValueError:  # true eviction cannot continue this template's stream: nothing to share
        return False
    return held == full_context_stream(tokenizer, list(messages))


def dense_rendering(backend: str, model: ModelSpec | None = None) -> DenseRendering:
    """The planning answer for a job's ``backend`` and ``model`` (see the module docstring)."""
    if backend in NO_MODEL_BACKENDS:
        return "no_model"
    if backend != "hf":
        return "unknown"
    model = model or ModelSpec()
    return _checked(model.name, model.revision)


@lru_cache(maxsize=16)
def _checked(name: str, revision: str | None) -> DenseRendering:
    try:
        tokenizer = load_tokenizer(name, revision)
    except ValueError:
        return "unknown"
    return "identical" if history_renders_alike(tokenizer) else "differs"
