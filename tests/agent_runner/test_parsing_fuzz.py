"""10,000 generated completions: the parser never raises, and what it returns is self-consistent."""

from __future__ import annotations

import random
import time

from agent_runner.parsing import ParsedAction, parse_response

PIECES = [
    "<think>",
    "</think>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
    ">",
    "<",
    "=",
    "execute_bash",
    "file_editor",
    "cmd",
    "path",
    "\n",
    " ",
    "ls -la",
    "é漢字🙂",
    "\x00",
    "\\",
    "'\"",
    "<function=finish>",
    "<parameter=cmd>",
    "</parameter></parameter>",
    "<<function=>>",
    "</function></function>",
]


def _random_text(rng: random.Random) -> str:
    return "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(0, 200)))


def _structured(rng: random.Random) -> str:
    params = []
    for _ in range(rng.randrange(0, 5)):
        key = rng.choice(["cmd", "path", "command", "cmd", " cmd ", ""])
        value = rng.choice([_random_text(rng), "x" * rng.randrange(0, 50), "<parameter=inner>v</parameter>"])
        params.append(f"<parameter={key}>{value}</parameter>")
    text = (
        f"<think>{_random_text(rng)}</think>\n<function={rng.choice(['execute_bash', 'finish', ' f ', ''])}>"
        + "".join(params)
        + "</function>"
    )
    cut = rng.randrange(0, len(text) + 1)
    return text[:cut] if rng.random() < 0.5 else text  # truncated half of the time


def _soup(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randrange(0, 60)))


def _case(rng: random.Random, i: int) -> str:
    if i % 2000 == 0:  # a few huge values (~1 MB), some with stray openers throughout
        filler = ("<parameter=" if i % 4000 == 0 else "a") * (1_000_000 // (11 if i % 4000 == 0 else 1))
        return f"<function=execute_bash><parameter=cmd>{filler}</parameter></function>"
    return [_random_text, _structured, _soup][i % 3](rng)


def test_parser_never_raises_on_10000_generated_completions():
    rng = random.Random(20261202)
    started = time.monotonic()
    calls = 0
    for i in range(10_000):
        text = _case(rng, i)
        parsed = parse_response(text, duplicates=rng.choice(["first", "last"]))
        assert isinstance(parsed, ParsedAction)
        assert (parsed.call is None) == (parsed.error is not None), text[:200]
        if parsed.call is not None:
            calls += 1
            assert parsed.call.name and parsed.call.name == parsed.call.name.strip()
            assert all(v == v.strip() and k == k.strip() and k for k, v in parsed.call.arguments.items())
            assert parsed.call.name in text
    assert calls > 1000  # the generator really produces parseable calls, not only garbage
    assert time.monotonic() - started < 10
