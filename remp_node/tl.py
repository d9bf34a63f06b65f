"""TL (Type Language) binary serialization primitives, as used by TON/Everscale.

Rules (ever-tl / TON `tl` docs): every integer is little-endian; `int` = 4 bytes,
`long` = 8 bytes, `int256` = 32 raw bytes, `int512` = 64 raw bytes; `bytes`/`string`:
if len < 254, one length byte, the data, then zero padding to a multiple of 4; otherwise
0xFE, a 3-byte little-endian length, the data, zero padding to a multiple of 4.
A boxed object starts with its 4-byte little-endian constructor id, which is the CRC32
(IEEE) of the normalized TL scheme line (`tl_constructor_id`).

Errors: a short or malformed buffer raises TLError (a ValueError); encoding a value out of
range raises TLError too.
"""
from __future__ import annotations

import re
import struct
import zlib


class TLError(ValueError):
    """Malformed TL input, or a value that does not fit its TL type."""


def normalize_tl_line(line: str) -> str:
    """Normalize a TL scheme line for constructor id computation.

    Drops the trailing ';', an explicit '#id' after the name, comments, and folds white
    space; e.g. 'pub.ed25519 key:int256 = PublicKey;' -> 'pub.ed25519 key:int256 = PublicKey'.
    """
    line = line.split("//", 1)[0].strip()
    if line.endswith(";"):
        line = line[:-1]
    line = re.sub(r"^([A-Za-z0-9_.]+)#[0-9a-fA-F]+", r"\1", line.strip())
    return " ".join(line.split())


def tl_constructor_id(line: str) -> int:
    """CRC32 of the normalized scheme line: the 32-bit constructor id (unsigned)."""
    return zlib.crc32(normalize_tl_line(line).encode()) & 0xFFFFFFFF


def pack_int(value: int) -> bytes:
    """TL `int`: 4 bytes LE, signed range (unsigned values < 2**32 also accepted)."""
    if -(1 << 31) <= value < (1 << 31):
        return struct.pack("<i", value)
    if 0 <= value < (1 << 32):
        return struct.pack("<I", value)
    raise TLError(f"int out of range: {value}")


def pack_long(value: int) -> bytes:
    """TL `long`: 8 bytes LE, signed range (unsigned values < 2**64 also accepted)."""
    if -(1 << 63) <= value < (1 << 63):
        return struct.pack("<q", value)
    if 0 <= value < (1 << 64):
        return struct.pack("<Q", value)
    raise TLError(f"long out of range: {value}")


def pack_raw(value: bytes, size: int) -> bytes:
    """Fixed-size raw field (int128/int256/int512)."""
    if len(value) != size:
        raise TLError(f"expected {size} bytes, got {len(value)}")
    return bytes(value)


def pack_int256(value: bytes) -> bytes:
    return pack_raw(value, 32)


def pack_int512(value: bytes) -> bytes:
    return pack_raw(value, 64)


def pack_bytes(value: bytes | str) -> bytes:
    """TL `bytes` / `string` (str is UTF-8 encoded)."""
    if isinstance(value, str):
        value = value.encode()
    n = len(value)
    if n < 254:
        head = bytes([n])
    elif n < (1 << 24):
        head = b"\xfe" + n.to_bytes(3, "little")
    else:
        raise TLError(f"bytes too long: {n}")
    body = head + value
    return body + b"\x00" * (-len(body) % 4)


def pack_id(constructor: int) -> bytes:
    """A boxed object's constructor id (unsigned 32-bit, LE)."""
    return struct.pack("<I", constructor & 0xFFFFFFFF)


class TLReader:
    """Sequential reader over a TL buffer; every read raises TLError when data runs short.

    r = TLReader(data); cid = r.constructor(); x = r.int(); ...; r.finish()
    """

    def __init__(self, data: bytes, max_bytes: int = 1 << 20):
        if len(data) > max_bytes:
            raise TLError(f"TL object of {len(data)} bytes exceeds limit {max_bytes}")
        self.data = memoryview(bytes(data))
        self.pos = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise TLError(f"truncated TL: need {n} bytes at offset {self.pos}, have {len(self.data) - self.pos}")
        out = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return out

    def int(self) -> int:
        return struct.unpack("<i", self._take(4))[0]

    def uint(self) -> int:
        return struct.unpack("<I", self._take(4))[0]

    def long(self) -> int:
        return struct.unpack("<q", self._take(8))[0]

    def ulong(self) -> int:
        return struct.unpack("<Q", self._take(8))[0]

    def constructor(self) -> int:
        return self.uint()

    def raw(self, n: int) -> bytes:
        return self._take(n)

    def int256(self) -> bytes:
        return self._take(32)

    def int512(self) -> bytes:
        return self._take(64)

    def bytes(self) -> bytes:
        first = self._take(1)[0]
        if first < 254:
            n, head = first, 1
        elif first == 254:
            n, head = int.from_bytes(self._take(3), "little"), 4
        else:
            raise TLError(f"bad TL bytes length prefix 0xff at offset {self.pos - 1}")
        value = self._take(n)
        pad = -(head + n) % 4
        if any(self._take(pad)):
            raise TLError("non-zero TL padding")
        return value

    def string(self) -> str:
        try:
            return self.bytes().decode()
        except UnicodeDecodeError as exc:
            raise TLError(f"TL string is not UTF-8: {exc}") from None

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def finish(self) -> None:
        """Raise TLError if bytes are left over."""
        if self.pos != len(self.data):
            raise TLError(f"{len(self.data) - self.pos} trailing bytes after TL object")


# --- tonNode.blockIdExt: shared by receipts, consensus and the masterchain ---------------

from dataclasses import dataclass  # noqa: E402

BLOCK_ID_EXT = tl_constructor_id(
    "tonNode.blockIdExt workchain:int shard:long seqno:int root_hash:int256 file_hash:int256 = tonNode.BlockIdExt")


@dataclass(frozen=True)
class BlockIdExt:
    """tonNode.blockIdExt: workchain (int), shard (64-bit prefix, unsigned here),
    seqno (int), root_hash and file_hash (32 bytes each)."""

    workchain: int
    shard: int
    seqno: int
    root_hash: bytes
    file_hash: bytes

    def pack(self) -> bytes:
        """Bare (unboxed) TL serialization, as it appears inside other objects."""
        return (pack_int(self.workchain) + pack_long(self.shard) + pack_int(self.seqno)
                + pack_int256(self.root_hash) + pack_int256(self.file_hash))

    def pack_boxed(self) -> bytes:
        return pack_id(BLOCK_ID_EXT) + self.pack()

    @classmethod
    def read(cls, r: TLReader) -> "BlockIdExt":
        return cls(r.int(), r.ulong(), r.int(), r.int256(), r.int256())

    @property
    def shard_hex(self) -> str:
        """Shard as 16 hex digits, as in the seed's JSON (e.g. '8000000000000000')."""
        return f"{self.shard & 0xFFFFFFFFFFFFFFFF:016x}"
