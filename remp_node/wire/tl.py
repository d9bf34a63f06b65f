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

from ..errors import RempRemoteError


class TLError(RempRemoteError):
    """Malformed TL input, or a value that does not fit its TL type (a RempRemoteError,
    so a ValueError; reason "malformed_tl")."""

    reason = "malformed_tl"


def normalize_tl_line(line: str) -> str:
    """Normalize a TL scheme line for constructor id computation.

    Drops the trailing ';', an explicit '#id' after the name, comments and the parentheses
    of type expressions such as `(vector int)` (as TON's TL compiler does: the id of
    `catchain.getDifference rt:(vector int) = catchain.Difference` is 0xd06cced8), and folds
    white space; e.g. 'pub.ed25519 key:int256 = PublicKey;' -> 'pub.ed25519 key:int256 = PublicKey'.
    """
    line = line.split("//", 1)[0].strip().replace("(", "").replace(")", "")
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


_I32, _U32, _I64, _U64 = struct.Struct("<i"), struct.Struct("<I"), struct.Struct("<q"), struct.Struct("<Q")


class TLReader:
    """Sequential reader over a TL buffer; every read raises TLError when data runs short.

    r = TLReader(data); cid = r.constructor(); x = r.int(); ...; r.finish()
    """

    def __init__(self, data: bytes, max_bytes: int = 1 << 20):
        if len(data) > max_bytes:
            raise TLError(f"TL object of {len(data)} bytes exceeds limit {max_bytes}")
        # bytes, read with Struct.unpack_from and one slice per raw field (it was a memoryview,
        # sliced and copied for every field: TLReader._take was the hottest pure-Python
        # function of a REMP network, 1.6 million calls per 600 messages in the simulation)
        self.data = data if type(data) is bytes else bytes(data)
        self.pos = 0
        self._n = len(self.data)

    def _short(self, n: int) -> TLError:
        return TLError(f"truncated TL: need {n} bytes at offset {self.pos}, have {self._n - self.pos}")

    def _take(self, n: int) -> bytes:
        p = self.pos
        if n < 0 or p + n > self._n:
            raise self._short(n)
        self.pos = p + n
        return self.data[p:p + n]

    def _unpack(self, st: struct.Struct) -> int:
        p = self.pos
        if p + st.size > self._n:
            raise self._short(st.size)
        self.pos = p + st.size
        return st.unpack_from(self.data, p)[0]

    def fields(self, st: struct.Struct) -> tuple:
        """Several fixed-size fields at once: st.unpack_from at the current offset (one call
        instead of one per field: a parse path's hot spot, bench/bench_remp_fullnode.py)."""
        p = self.pos
        if p + st.size > self._n:
            raise self._short(st.size)
        self.pos = p + st.size
        return st.unpack_from(self.data, p)

    def int(self) -> int:
        return self._unpack(_I32)

    def uint(self) -> int:
        return self._unpack(_U32)

    def long(self) -> int:
        return self._unpack(_I64)

    def ulong(self) -> int:
        return self._unpack(_U64)

    def constructor(self) -> int:
        return self._unpack(_U32)

    def raw(self, n: int) -> bytes:
        return self._take(n)

    def int256(self) -> bytes:
        return self._take(32)

    def int512(self) -> bytes:
        return self._take(64)

    def bytes(self) -> bytes:
        p, data = self.pos, self.data
        if p >= self._n:
            raise self._short(1)
        first = data[p]
        if first < 254:
            n, head = first, 1
        elif first == 254:
            if p + 4 > self._n:
                raise self._short(4)
            n, head = int.from_bytes(data[p + 1:p + 4], "little"), 4
        else:
            raise TLError(f"bad TL bytes length prefix 0xff at offset {p}")
        pad = -(head + n) % 4
        end = p + head + n
        if end + pad > self._n:
            self.pos = p + head
            raise self._short(n + pad)
        if pad and any(data[end:end + pad]):
            raise TLError("non-zero TL padding")
        self.pos = end + pad
        return data[p + head:end]

    def string(self) -> str:
        try:
            return self.bytes().decode()
        except UnicodeDecodeError as exc:
            raise TLError(f"TL string is not UTF-8: {exc}") from None

    def remaining(self) -> int:
        return self._n - self.pos

    def finish(self) -> None:
        """Raise TLError if bytes are left over."""
        if self.pos != self._n:
            raise TLError(f"{self._n - self.pos} trailing bytes after TL object")


# --- tonNode.blockIdExt: shared by receipts, consensus and the masterchain ---------------

from dataclasses import dataclass  # noqa: E402

BLOCK_ID_EXT = tl_constructor_id(
    "tonNode.blockIdExt workchain:int shard:long seqno:int root_hash:int256 file_hash:int256 = tonNode.BlockIdExt")


#: tonNode.blockIdExt's bare layout: workchain int, shard ulong, seqno int, two int256
_BLOCK_ID_EXT = struct.Struct("<iQi32s32s")


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
        return cls(*r.fields(_BLOCK_ID_EXT))

    @property
    def shard_hex(self) -> str:
        """Shard as 16 hex digits, as in the seed's JSON (e.g. '8000000000000000')."""
        return f"{self.shard & 0xFFFFFFFFFFFFFFFF:016x}"


# --- REMP receipt constructors (ever-tl ton_api/tl/ton_api.tl, tonNode.Remp*) -------------
# The scheme lines are copied verbatim from ever-tl; the ids are computed from them (never
# typed in), and tests/test_remp_tl.py checks them against DESIGN.md section 4.

#: Constructor name -> its TL scheme line (ever-tl ton_api.tl).
REMP_TL_LINES: dict[str, str] = {
    "tonNode.rempFullnode": "tonNode.rempFullnode = tonNode.RempMessageLevel;",
    "tonNode.rempQueue": "tonNode.rempQueue = tonNode.RempMessageLevel;",
    "tonNode.rempCollator": "tonNode.rempCollator = tonNode.RempMessageLevel;",
    "tonNode.rempShardchain": "tonNode.rempShardchain = tonNode.RempMessageLevel;",
    "tonNode.rempMasterchain": "tonNode.rempMasterchain = tonNode.RempMessageLevel;",
    "tonNode.rempSentToValidators":
        "tonNode.rempSentToValidators sent_to:int total_validators:int = tonNode.RempMessageStatus;",
    "tonNode.rempNew": "tonNode.rempNew = tonNode.RempMessageStatus;",
    "tonNode.rempRejected":
        "tonNode.rempRejected level:tonNode.RempMessageLevel block_id:tonNode.blockIdExt "
        "error:string = tonNode.RempMessageStatus;",
    "tonNode.rempAccepted":
        "tonNode.rempAccepted level:tonNode.RempMessageLevel block_id:tonNode.blockIdExt "
        "master_id:tonNode.blockIdExt = tonNode.RempMessageStatus;",
    "tonNode.rempIgnored":
        "tonNode.rempIgnored level:tonNode.RempMessageLevel block_id:tonNode.blockIdExt "
        "= tonNode.RempMessageStatus;",
    "tonNode.rempDuplicate":
        "tonNode.rempDuplicate block_id:tonNode.blockIdExt = tonNode.RempMessageStatus;",
    "tonNode.rempTimeout": "tonNode.rempTimeout = tonNode.RempMessageStatus;",
    "tonNode.rempReceipt":
        "tonNode.rempReceipt message_id:int256 status:tonNode.RempMessageStatus timestamp:long "
        "source_id:int256 = tonNode.RempReceipt;",
    "tonNode.rempSignedReceipt":
        "tonNode.rempSignedReceipt receipt:bytes signature:int512 = tonNode.RempSignedReceipt;",
    "tonNode.rempMessage":
        "tonNode.rempMessage message:bytes id:int256 timestamp:long signature:bytes "
        "= tonNode.RempMessage;",
    "tonNode.rempReceived": "tonNode.rempReceived = tonNode.RempReceived;",
}

REMP_FULLNODE = tl_constructor_id(REMP_TL_LINES["tonNode.rempFullnode"])          # 0xd7145a5a
REMP_QUEUE = tl_constructor_id(REMP_TL_LINES["tonNode.rempQueue"])                # 0xebabf815
REMP_COLLATOR = tl_constructor_id(REMP_TL_LINES["tonNode.rempCollator"])          # 0x44f07de7
REMP_SHARDCHAIN = tl_constructor_id(REMP_TL_LINES["tonNode.rempShardchain"])      # 0x237e2b37
REMP_MASTERCHAIN = tl_constructor_id(REMP_TL_LINES["tonNode.rempMasterchain"])    # 0xbcc0eaa3
REMP_SENT_TO_VALIDATORS = tl_constructor_id(REMP_TL_LINES["tonNode.rempSentToValidators"])  # 0x2ff6c87b
REMP_NEW = tl_constructor_id(REMP_TL_LINES["tonNode.rempNew"])                    # 0x5bfabd30
REMP_REJECTED = tl_constructor_id(REMP_TL_LINES["tonNode.rempRejected"])          # 0xb4e1ee77
REMP_ACCEPTED = tl_constructor_id(REMP_TL_LINES["tonNode.rempAccepted"])          # 0x30225e0e
REMP_IGNORED = tl_constructor_id(REMP_TL_LINES["tonNode.rempIgnored"])            # 0x43bebb8b
REMP_DUPLICATE = tl_constructor_id(REMP_TL_LINES["tonNode.rempDuplicate"])        # 0x9ecd4334
REMP_TIMEOUT = tl_constructor_id(REMP_TL_LINES["tonNode.rempTimeout"])            # 0xb71796af
REMP_RECEIPT = tl_constructor_id(REMP_TL_LINES["tonNode.rempReceipt"])            # 0x3122b7a2
REMP_SIGNED_RECEIPT = tl_constructor_id(REMP_TL_LINES["tonNode.rempSignedReceipt"])  # 0xb361c8dd
REMP_MESSAGE = tl_constructor_id(REMP_TL_LINES["tonNode.rempMessage"])            # 0xdd1f6db1
REMP_RECEIVED = tl_constructor_id(REMP_TL_LINES["tonNode.rempReceived"])          # 0x32e5a18a

#: The all-zero tonNode.blockIdExt: what a status carries when there is no block yet
#: (e.g. RejectedByFullnode's block_id, IncludedIntoBlock's master_id); ever-tl's Default.
ZERO_BLOCK_ID = BlockIdExt(0, 0, 0, b"\x00" * 32, b"\x00" * 32)
