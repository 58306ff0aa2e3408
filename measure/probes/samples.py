"""The token sequences of one probe sample, built from real filler and the model's own chat template.

Every sample is a pure function of (probe, index, settings.seed, lengths, depths, tokenizer), so sample i is
the same text in every cell of a run: cells are paired by index. Nothing before a later turn's question
says which fact matters: the task and the agent's replies are neutral (an assistant line such as "I will
remember the number" would sit in the observation window and tell a query-aware method what to keep).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

from agent_runner.chat_turns import user_turn_ids
from agent_runner.model_host import render_chat
from measure.probes.corpus import SOURCES, absent_number, excerpt_lines

SYSTEM = "You are a programming agent. You solve tasks in a repository by calling tools, one call per reply."
_PLACES = (
    "north archive", "harbor office", "glass tower", "river depot", "cedar lab", "amber vault", "east station",
    "copper mill", "signal room", "stone library", "orchard gate", "delta hangar",
)  # fmt: skip
_NAMES = (
    "RETRY_TIMEOUT", "MAX_WORKERS", "CACHE_TTL", "BUFFER_LIMIT", "POLL_INTERVAL", "SESSION_LIMIT",
    "QUEUE_DEPTH", "FLUSH_PERIOD", "BATCH_CEILING", "LEASE_SECONDS", "SPOOL_QUOTA", "PROBE_WINDOW",
)  # fmt: skip
_FILES = {"code": "src/{pkg}/settings.py", "reference": "docs/{pkg}/guide.txt", "licenses": "legal/{pkg}/NOTICE"}
_PACKAGES = ("relay", "ledger", "harvest", "beacon", "quarry", "meridian")


@dataclass
class Sample:
    """prefill: chat-rendered token ids prefilled into an empty cache (shared by every cell).
    later_turn under true eviction also has `reply` (the agent's neutral reply, fed as decoded tokens) and
    `question` (the later turn, prefilled into the same cache); under full context the three are one prefill.
    target: the exact text to score by teacher forcing (later_turn: the viewed line; nll: the continuation).
    expected: what a correct answer contains (needle, later_turn)."""

    probe: str
    index: int
    source: str
    length: int
    depth: float | None
    prefill: list[int]
    reply: list[int] = field(default_factory=list)
    question: list[int] = field(default_factory=list)
    target: list[int] = field(default_factory=list)
    expected: str = ""
    max_new_tokens: int = 0


def sample_grid(index: int, seed: int, lengths, depths, sources=SOURCES) -> tuple[str, int, float]:
    """(source, length, depth) of sample `index`: a seeded shuffle of every combination, cycled."""
    combos = list(itertools.product(sources, lengths, depths))
    random.Random(f"grid:{seed}").shuffle(combos)
    return combos[index % len(combos)]


def _close(tokenizer) -> list[int]:
    """How an assistant turn ends in the stream: <|im_end|> and a newline (ChatML)."""
    return [tokenizer.convert_tokens_to_ids("<|im_end|>"), *tokenizer.encode("\n", add_special_tokens=False)]


def _insert(lines: list[str], depth: float, line: str) -> list[str]:
    at = round(depth * len(lines))
    return [*lines[:at], line, *lines[at:]]


def needle_sample(tokenizer, index: int, seed: int, lengths, depths) -> Sample:
    source, length, depth = sample_grid(index, seed, lengths, depths)
    rng = random.Random(f"needle:{seed}:{index}")
    lines = excerpt_lines(source, tokenizer, length, rng)
    place = rng.choice(_PLACES)
    code = absent_number("\n".join(lines), rng)
    fact = f"The access code for the {place} is {code}."
    if source == "code":
        fact = f"# {fact}"
    document = "\n".join(_insert(lines, depth, fact))
    question = f"What is the access code for the {place}? Answer with the number only."
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{document}\n\n{question}"}]
    # the answer's opening words are fed after the question (as RULER's answer prefix does), so the model's first
    # tokens are the number: a shorter answer to decode in every cell, and a verdict that is about the number
    prefill = render_chat(tokenizer, messages) + tokenizer.encode(
        f"The access code for the {place} is", add_special_tokens=False
    )
    return Sample("needle", index, source, length, depth, prefill, expected=code, max_new_tokens=8)


def later_turn_sample(tokenizer, index: int, seed: int, lengths, depths) -> Sample:
    source, length, depth = sample_grid(index, seed, lengths, depths)
    rng = random.Random(f"later_turn:{seed}:{index}")
    # `cat -n` numbering adds about 3 tokens a line: the numbered view is about `length` tokens
    lines = excerpt_lines(source, tokenizer, int(length * 0.7), rng)
    value = absent_number("\n".join(lines), rng)
    path = "/testbed/" + _FILES[source].format(pkg=rng.choice(_PACKAGES))
    if source == "code":
        name = rng.choice(_NAMES)
        line = f"{name} = {value}"
        ask = (
            f"Quote the line of {path} that sets {name}, exactly as it appears in the file. Reply with that line only."
        )
    else:
        place = rng.choice(_PLACES)
        line = f"The default port of the {place} service is {value}."
        ask = (
            f"Quote the sentence of {path} that gives the default port of the {place} service, exactly as it "
            "appears in the file. Reply with that sentence only."
        )
    numbered = "\n".join(f"{n:6}\t{text}" for n, text in enumerate(_insert(lines, depth, line), 1))
    call = "<function=file_editor>\n<parameter=command>view</parameter>\n<parameter=path>{}</parameter>\n</function>"
    folder = path.rsplit("/", 1)[0]
    history = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Tidy up the module in {folder} without changing its behaviour."},
        {"role": "assistant", "content": "I will start by reading the main file.\n" + call.format(path)},
        {"role": "user", "content": f"Execution output of [file_editor]:\nHere's the result of running `cat -n` on "
         f"{path}:\n{numbered}"},
    ]  # fmt: skip
    reply = (
        "Before I change anything I want to see what else is in this folder.\n<function=execute_bash>\n"
        f"<parameter=cmd>ls {folder}</parameter>\n</function>"
    )
    listing = path.rsplit("/", 1)[1]
    # appended as the agent appends under true eviction: its reply as decoded tokens, the turn's close, then
    # the next user message (agent_runner.chat_turns)
    prefill = render_chat(tokenizer, history)
    reply_ids = tokenizer.encode(reply, add_special_tokens=False) + _close(tokenizer)
    question_ids = user_turn_ids(tokenizer, f"Execution output of [execute_bash]:\n__init__.py\n{listing}\n\n{ask}")
    target = tokenizer.encode(line, add_special_tokens=False)
    return Sample("later_turn", index, source, length, depth, prefill, reply_ids, question_ids, target, value, 40)


def nll_sample(tokenizer, index: int, seed: int, lengths, continuation: int) -> Sample:
    """A document's first `length` tokens as context, its next `continuation` tokens as the scored target."""
    source, length, _ = sample_grid(index, seed, lengths, (None,))
    rng = random.Random(f"nll:{seed}:{index}")
    ids = tokenizer.encode("\n".join(excerpt_lines(source, tokenizer, int((length + continuation) * 1.3), rng)))
    if len(ids) < length + continuation:
        raise ValueError(f"filler source {source!r} is shorter than {length + continuation} tokens")
    return Sample("nll", index, source, length, None, ids[:length], target=ids[length : length + continuation])


def build_sample(probe: str, tokenizer, index: int, settings) -> Sample:
    if probe == "needle":
        return needle_sample(tokenizer, index, settings.seed, settings.lengths, settings.depths)
    if probe == "later_turn":
        return later_turn_sample(tokenizer, index, settings.seed, settings.lengths, settings.depths)
    if probe == "nll":
        return nll_sample(tokenizer, index, settings.seed, settings.lengths, settings.continuation)
    raise ValueError(f"unknown probe {probe!r}")
