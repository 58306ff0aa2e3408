"""The tokens an agent appends for a later user turn, rendered by the model's own chat template.

Under true eviction the agent never re-renders its history: after an assistant reply it appends that reply's
close (``<|im_end|>`` and a newline, as ChatML renders it) and the next user message rendered alone. Some
templates inject a default system prompt whenever the first message is not a system message (SmolLM2:
"You are a helpful AI assistant named SmolLM ..."), so rendering ``[user]`` alone would put a second system
prompt into the middle of the conversation. The user turn is therefore the text the template adds after a
system message: render ``[system, user]`` and ``[system]`` and keep the difference.
"""

from __future__ import annotations

_PLACEHOLDER = {"role": "system", "content": "-"}


def user_turn_text(tokenizer, content: str) -> str:
    """The chat-template text of one user message in the middle of a conversation, ending with the assistant
    header. ValueError when the template renders a system message differently with a user message after it."""
    head = tokenizer.apply_chat_template([_PLACEHOLDER], tokenize=False, add_generation_prompt=False)
    full = tokenizer.apply_chat_template(
        [_PLACEHOLDER, {"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    if not full.startswith(head):
        raise ValueError("the chat template renders a system message differently when a user message follows it")
    return full[len(head) :]


def user_turn_ids(tokenizer, content: str) -> list[int]:
    """Token ids of `user_turn_text` (no special tokens added beyond the template's own)."""
    return tokenizer.encode(user_turn_text(tokenizer, content), add_special_tokens=False)
