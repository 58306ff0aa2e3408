"""Compact column types for the two large payloads: a turn's token stream and an episode's retention map.

Both were JSON text (a token id took ~6 characters, a retention run ~8); at Table-3 scale (12,800 episodes,
~400K turns) they were most of the database. Each is now a binary column whose value reads and writes exactly
as before (the ORM attribute is the same dict), so no reader changes; ``tests/db/test_packing.py`` and the
migration's round-trip test (``0009``) hold them to bit-identical values.

- :class:`PackedTokens` (``turns.tokens``): ``{"keep": int, "append": [ids], "generated": [ids]}``
  (``agent_runner.records.TurnTokens``) as ``b"T1"`` + zlib of three little-endian uint32 counts (keep,
  len(append), len(generated)) and the ids as little-endian uint32. A token id outside [0, 2**32) or any other
  shape is refused (``ValueError``), never stored approximately.
- :class:`PackedJSON` (``episodes.retention``): ``b"J1"`` + zlib of the compact JSON text. Any JSON value.

Pure functions (:func:`pack_tokens`, :func:`unpack_tokens`, :func:`pack_json`, :func:`unpack_json`) do the work;
the migration calls them directly.
"""

from __future__ import annotations

import json
import sys
import zlib
from array import array
from collections.abc import Mapping
from typing import Any

from sqlalchemy import LargeBinary, TypeDecorator

TOKENS_MAGIC = b"T1"
JSON_MAGIC = b"J1"
_LEVEL = 6  # zlib level: 9 saves ~1% more at twice the write time
_U32 = "I"  # array typecode of a 4-byte unsigned int (checked at import: the format depends on it)
_MAX_ID = 2**32
_STREAM_KEYS = ("keep", "append", "generated")
_LITTLE = sys.byteorder == "little"  # the stored format is little-endian whatever the host
assert array(_U32).itemsize == 4, "this platform's array('I') is not 4 bytes"


def _u32_bytes(values: list[int], what: str) -> bytes:
    try:
        packed = array(_U32, values)
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"token stream: {what} must be integers in [0, 2**32): {exc}") from None
    if any(isinstance(v, bool) for v in values):
        raise ValueError(f"token stream: {what} holds a boolean, not a token id")
    if not _LITTLE:
        packed.byteswap()
    return packed.tobytes()


def pack_tokens(stream: Mapping[str, Any]) -> bytes:
    """``{"keep", "append", "generated"}`` -> the stored bytes (module docstring). ``ValueError`` for anything
    that would not read back equal."""
    if not isinstance(stream, Mapping) or set(stream) != set(_STREAM_KEYS):
        keys = sorted(stream) if isinstance(stream, Mapping) else type(stream).__name__
        raise ValueError(f"token stream: expected exactly the keys {list(_STREAM_KEYS)}, got {keys}")
    keep, append, generated = (stream[k] for k in _STREAM_KEYS)
    if not isinstance(keep, int) or isinstance(keep, bool) or not 0 <= keep < _MAX_ID:
        raise ValueError(f"token stream: keep must be an integer in [0, 2**32), got {keep!r}")
    if not isinstance(append, list) or not isinstance(generated, list):
        raise ValueError("token stream: append and generated must be lists of token ids")
    body = (
        _u32_bytes([keep, len(append), len(generated)], "counts")
        + _u32_bytes(append, "append")
        + _u32_bytes(generated, "generated")
    )
    return TOKENS_MAGIC + zlib.compress(body, _LEVEL)


def unpack_tokens(stored: bytes) -> dict[str, Any]:
    """The stored bytes -> ``{"keep": int, "append": [ids], "generated": [ids]}``."""
    if stored[:2] != TOKENS_MAGIC:
        raise ValueError(f"token stream: not a packed stream (starts {bytes(stored[:2])!r}, expected {TOKENS_MAGIC!r})")
    ids = array(_U32)
    ids.frombytes(zlib.decompress(bytes(stored[2:])))
    if not _LITTLE:
        ids.byteswap()
    keep, n_append, n_generated = ids[0], ids[1], ids[2]
    if len(ids) != 3 + n_append + n_generated:
        raise ValueError(f"token stream: {len(ids) - 3} ids stored, the header says {n_append} + {n_generated}")
    return {
        "keep": keep,
        "append": ids[3 : 3 + n_append].tolist(),
        "generated": ids[3 + n_append :].tolist(),
    }


def packed_keep(stored: bytes | None) -> int | None:
    """A stored stream's ``keep`` without unpacking it: the first of the three counts that open the zlib body, 4
    bytes inflated (the episode page needs one number per turn, not the ids)."""
    if stored is None:
        return None
    if bytes(stored[:2]) != TOKENS_MAGIC:
        raise ValueError(f"token stream: not a packed stream (starts {bytes(stored[:2])!r})")
    head = zlib.decompressobj().decompress(memoryview(stored)[2:], 4)
    return int.from_bytes(head, "little")


def pack_json(value: Any) -> bytes:
    """Any JSON value -> ``b"J1"`` + zlib of its compact JSON text."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return JSON_MAGIC + zlib.compress(text.encode("utf-8"), _LEVEL)


def unpack_json(stored: bytes) -> Any:
    if stored[:2] != JSON_MAGIC:
        raise ValueError(f"packed JSON: wrong header {bytes(stored[:2])!r} (expected {JSON_MAGIC!r})")
    return json.loads(zlib.decompress(bytes(stored[2:])).decode("utf-8"))


class PackedTokens(TypeDecorator[dict[str, Any]]):
    """A ``TurnTokens`` dict stored as :func:`pack_tokens` bytes (``None`` stays NULL)."""

    impl = LargeBinary
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> bytes | None:
        return None if value is None else pack_tokens(value)

    def process_result_value(self, value: Any, dialect: Any) -> dict[str, Any] | None:
        return None if value is None else unpack_tokens(value)


class PackedJSON(TypeDecorator[Any]):
    """A JSON value stored as :func:`pack_json` bytes (``None`` stays NULL)."""

    impl = LargeBinary
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> bytes | None:
        return None if value is None else pack_json(value)

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        return None if value is None else unpack_json(value)
