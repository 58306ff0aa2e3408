"""The grading log: what the container printed, framed by the host so the framing cannot be forged.

The first line carries a random token. Every command the grader runs is framed by
`<token> BEGIN <name>` / `<token> END <name> rc=N timed_out=0|1` lines that the host writes around the
command's output, with the exit code from the Docker daemon. The token never enters the container, so
nothing the patched code prints can fake a frame, an exit code or a section; readers take the LAST frame
of each name. A section's body is the command's output, capped: the test run's log is read back from a file
keeping its first 1 MiB and last 7 MiB (`env.sandbox.output.FILE_OUTPUT_HEAD_BYTES` / `FILE_OUTPUT_TAIL_BYTES`, the
test results are at its end), other commands' their first and last `max_output_bytes / 2`, each with a
marker saying how many bytes were dropped from the middle.

Logs can be large (a verbose install prints megabytes before the tests): `pack` gzips a log above 256 KiB
into text that `unpack` reverses, so the database column stays text and small logs stay readable. `unpack`
inflates at most `UNPACK_MAX_BYTES` (32 MiB, several times the largest log `grade` writes), so a stored gzip
bomb cannot exhaust a reader's memory; past it the text ends with `UNPACK_TRUNCATION_MARK`.
"""

from __future__ import annotations

import base64
import gzip
import re
import secrets
import zlib
from dataclasses import dataclass, field

from env.sandbox.output import FILE_OUTPUT_HEAD_BYTES, FILE_OUTPUT_TAIL_BYTES

LOG_HEADER = "NEXUS-EVAL GRADE LOG v2"
PACKED_PREFIX = "nexus-eval-gzip-base64:"
PACK_ABOVE_BYTES = 256 * 1024
UNPACK_MAX_BYTES = 4 * (FILE_OUTPUT_HEAD_BYTES + FILE_OUTPUT_TAIL_BYTES)
UNPACK_TRUNCATION_MARK = "\n[... stored log truncated: it unpacks past {limit} bytes; the rest is not read ...]\n"


@dataclass
class Section:
    body: str
    rc: int
    timed_out: bool


@dataclass
class HostLog:
    """Builds a framed log; `text()` is what is stored."""

    task: str
    route: str
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lines.append(f"{LOG_HEADER} token={self.token} task={self.task} route={self.route}")

    def add(self, name: str, body: str, rc: int, timed_out: bool) -> None:
        self.lines += [
            f"{self.token} BEGIN {name}",
            body.rstrip("\n"),
            f"{self.token} END {name} rc={rc} timed_out={int(timed_out)}",
        ]

    def record(self, name: str, result, *, command: str | None = None) -> bool:
        """Add a section from a `Sandbox.run` result (headed by `+ command` when given); True if it succeeded."""
        body = f"+ {command}\n{result.output}" if command else result.output
        self.add(name, body, result.exit_code, result.timed_out)
        return result.exit_code == 0 and not result.timed_out

    def infra(self, message: str) -> None:
        self.lines.append(f"{self.token} INFRA {message}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@dataclass
class ParsedLog:
    route: str
    sections: dict[str, Section]
    infra: list[str]


def parse(log: str) -> ParsedLog | None:
    """The route, sections (last frame of each name) and infra notes of a framed log; None if not one."""
    header = re.match(rf"^{re.escape(LOG_HEADER)} token=([0-9a-f]{{32}}) task=\S+ route=(\S+)", log)
    if not header:
        return None
    token, route = header.group(1), header.group(2)
    pattern = re.compile(
        rf"^{token} BEGIN ([\w.-]+)\n(.*?)^{token} END \1 rc=(-?\d+) timed_out=([01])$", flags=re.M | re.S
    )
    sections = {m.group(1): Section(m.group(2), int(m.group(3)), m.group(4) == "1") for m in pattern.finditer(log)}
    infra = re.findall(rf"^{token} INFRA (.*)$", log, flags=re.M)
    return ParsedLog(route, sections, infra)


def pack(log: str) -> str:
    """The log as stored: unchanged when small, else gzip + base64 behind a prefix."""
    raw = log.encode("utf-8", errors="replace")
    if len(raw) <= PACK_ABOVE_BYTES:
        return log
    return PACKED_PREFIX + base64.b64encode(gzip.compress(raw, compresslevel=6)).decode("ascii")


def unpack_bounded(stored: str | None, *, max_bytes: int = UNPACK_MAX_BYTES) -> tuple[str, bool]:
    """(the log as `pack` got it, False), or, for a packed log inflating past `max_bytes`, (its first
    `max_bytes` followed by UNPACK_TRUNCATION_MARK, True): at most `max_bytes` are ever inflated."""
    if not stored:
        return "", False
    if not stored.startswith(PACKED_PREFIX):
        return stored, False
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # the gzip container `pack` writes
    raw = inflate.decompress(base64.b64decode(stored[len(PACKED_PREFIX) :]), max_bytes)
    cut = len(raw) >= max_bytes and bool(inflate.decompress(inflate.unconsumed_tail, 1))
    text = raw.decode("utf-8", errors="replace")
    return (text + UNPACK_TRUNCATION_MARK.format(limit=max_bytes), True) if cut else (text, False)


def unpack(stored: str | None, *, max_bytes: int = UNPACK_MAX_BYTES) -> str:
    """The stored log as text (`unpack_bounded`'s text: bounded, with a marker where it was cut)."""
    return unpack_bounded(stored, max_bytes=max_bytes)[0]
