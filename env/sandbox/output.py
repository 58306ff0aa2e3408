"""Capped output: a command's output streamed from Docker keeping only its head and tail, with a marker between,
so a 1 GB print costs no host memory (`Sandbox.run` keeps `max_output_bytes`; `Sandbox.run_to_file`, a grading
run's log, keeps FILE_OUTPUT_HEAD_BYTES + FILE_OUTPUT_TAIL_BYTES).
"""

from __future__ import annotations

import io
from collections import deque

from pydantic import BaseModel

TRUNCATION_MARK = "\n[... output truncated: {dropped} bytes omitted from the middle ...]\n"
# What `run_to_file` keeps of a file's output (a grading run's log): the head, and a generous tail, where test
# runners print their results and summaries. The middle is dropped with TRUNCATION_MARK.
FILE_OUTPUT_HEAD_BYTES = 1024**2
FILE_OUTPUT_TAIL_BYTES = 7 * 1024**2


class ExecResult(BaseModel):
    """One command's outcome. `output` is stdout+stderr merged (decoded as UTF-8, bad bytes replaced)."""

    output: str
    exit_code: int
    timed_out: bool
    truncated: bool
    seconds: float


class CappedBuffer:
    """Keeps the first `head` bytes (default `cap/2`) and the last `cap - head` bytes of a stream and counts
    what was dropped between them. Memory stays within the cap plus one chunk, whatever the stream's size."""

    def __init__(self, cap: int, *, head: int | None = None) -> None:
        self.head_cap = cap // 2 if head is None else min(head, cap)
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_len = 0
        self._dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self._tail.append(bytes(chunk))
        self._tail_len += len(chunk)
        # whole chunks that the newer ones already replace go; the cut inside the oldest kept one is in `tail`
        while self._tail and self._tail_len - len(self._tail[0]) >= self.tail_cap:
            gone = self._tail.popleft()
            self._tail_len -= len(gone)
            self._dropped += len(gone)

    @property
    def tail(self) -> bytes:
        data = b"".join(self._tail)
        return data[len(data) - self.tail_cap :] if len(data) > self.tail_cap else data

    @property
    def dropped(self) -> int:
        return self._dropped + max(0, self._tail_len - self.tail_cap)

    def text(self) -> tuple[str, bool]:
        decode = lambda b: bytes(b).decode("utf-8", errors="replace")  # noqa: E731
        if not self.dropped:
            return decode(self.head + self.tail), False
        return decode(self.head) + TRUNCATION_MARK.format(dropped=self.dropped) + decode(self.tail), True


class ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks (docker-py's archive stream), never holding more than
    one chunk."""

    def __init__(self, chunks) -> None:
        self._chunks = iter(chunks)
        self._view = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._view:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._view = memoryview(chunk)
        n = min(len(buffer), len(self._view))
        buffer[:n] = self._view[:n]
        self._view = self._view[n:]
        return n
