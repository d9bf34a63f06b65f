"""REMP message statuses and signed receipts: TL wire form, JSON form, signatures.

Sources: DESIGN.md section 4; ever-tl `ton_api.tl` (tonNode.RempMessageStatus,
tonNode.RempMessageLevel, tonNode.rempReceipt, tonNode.rempSignedReceipt); the JSON shape of
seeds/remp-protocol-b.txt ("All possible REMP message stages") as parsed by the reference
`ton_block_json::parse_remp_status` (everx-labs).

Model
-----
A status is one of seven TL constructors (`SentToValidators`, `New`, `Rejected`, `Accepted`,
`Ignored`, `Duplicate`, `Timeout`); Rejected/Accepted/Ignored carry a `Level`
(Fullnode 0 < Queue 1 < Collator 2 < Shardchain 3 < Masterchain 4). In JSON the constructor
and level are folded into one `kind` string (`KIND_NAMES`, a bijection with every
(constructor, level) pair, e.g. Accepted/Collator = "IncludedIntoBlock").

A `Receipt` is `tonNode.rempReceipt message_id:int256 status timestamp:long source_id:int256`
(timestamp in ms since the Unix epoch, source_id = key id of the signer, see keys.key_id).
It is signed with ed25519 over its boxed TL bytes (`Receipt.serialize()`), and travels as
`tonNode.rempSignedReceipt receipt:bytes signature:int512` (`SignedReceipt`). We sign every
receipt from every source (full node and validators).

Errors: malformed or unverifiable remote input raises `ReceiptError` (a ValueError) whose
`reason` is one of "malformed", "unknown_source", "bad_signature". Misuse of the API by
local code (e.g. a wrong-size message id when building a receipt) raises `ValueError`
(TypeError for wrong types) directly.
"""
from __future__ import annotations

import base64
import binascii
import enum
import functools
import struct
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Union

from ..errors import RempRemoteError
from .keys import NodeKey, key_id, verify
from .tl import (
    REMP_ACCEPTED, REMP_COLLATOR, REMP_DUPLICATE, REMP_FULLNODE, REMP_IGNORED,
    REMP_MASTERCHAIN, REMP_NEW, REMP_QUEUE, REMP_RECEIPT, REMP_REJECTED, REMP_SENT_TO_VALIDATORS,
    REMP_SHARDCHAIN, REMP_SIGNED_RECEIPT, REMP_TIMEOUT, ZERO_BLOCK_ID, BlockIdExt, TLError,
    TLReader, pack_bytes, pack_id, pack_int, pack_int256, pack_int512, pack_long,
)

#: Upper bound of a serialized receipt (bytes); the largest status (Rejected with a long
#: error text) stays far below it. Parsers refuse anything bigger.
MAX_RECEIPT_BYTES = 4096
#: Upper bound of a RejectedByX error text in a receipt (UTF-8 bytes); longer texts are
#: cut by `Rejected` construction helpers (`truncate_error`).
MAX_ERROR_BYTES = 1024
#: Masterchain shard ident used for `master_id` (wc -1, shard 0x8000000000000000), as the
#: reference JSON parser assumes for mc_block_* fields.
MASTERCHAIN_WORKCHAIN = -1
MASTERCHAIN_SHARD = 0x8000000000000000

#: "No masterchain block yet": the `master_id` of every Accepted status below the
#: Masterchain level (AcceptedByQueue, IncludedIntoBlock, IncludedIntoAcceptedBlock).
#: Rule: a receipt JSON without mc_block_* fields is parsed by the reference
#: (ever-block-json `src/deserialize.rs` parse_remp_status: `master_id:
#: parse_block_id_ext(&map_path, true).unwrap_or_default()`) into `BlockIdExt::default()`,
#: and in ever-block `BlockIdExt` derives Default over `ShardIdent`, whose `impl Default for
#: ShardIdent` (`src/shard.rs`) is `workchain_id: 0, prefix: SHARD_FULL` with
#: `SHARD_FULL = 0x8000_0000_0000_0000` (everx-labs/ever-block 6dfe9b39, 2025-02-06; seq_no 0,
#: root_hash and file_hash zero). So the TL bytes a verifier rebuilds from such JSON carry
#: workchain 0, shard 0x8000000000000000, and a validator must sign exactly that (before this
#: rule the project signed workchain 0, shard 0, which no reference verifier accepts).
#: `Accepted` also reads the all-zero id (ZERO_BLOCK_ID) as this value (`__post_init__`),
#: so there is one "no master block" value and every such receipt verifies from JSON.
NO_MASTER_BLOCK_ID = BlockIdExt(0, 0x8000000000000000, 0, b"\x00" * 32, b"\x00" * 32)


class ReceiptError(RempRemoteError):
    """A remote receipt (TL bytes or JSON) is malformed or does not verify.

    `reason`: "malformed" | "unknown_source" | "bad_signature"; str(exc) says exactly what.
    """

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Level(enum.IntEnum):
    """tonNode.RempMessageLevel; the int value is the seed's level number and the order
    (seed: "Full node - level 0 ... Masterchain - level 4")."""

    FULLNODE = 0
    QUEUE = 1
    COLLATOR = 2
    SHARDCHAIN = 3
    MASTERCHAIN = 4


#: Level -> TL constructor id (boxed level objects inside statuses).
LEVEL_CONSTRUCTORS: dict[Level, int] = {
    Level.FULLNODE: REMP_FULLNODE,
    Level.QUEUE: REMP_QUEUE,
    Level.COLLATOR: REMP_COLLATOR,
    Level.SHARDCHAIN: REMP_SHARDCHAIN,
    Level.MASTERCHAIN: REMP_MASTERCHAIN,
}
_LEVEL_BY_CONSTRUCTOR = {v: k for k, v in LEVEL_CONSTRUCTORS.items()}


def _check_block_id(value: Any, name: str) -> None:
    if not isinstance(value, BlockIdExt):
        raise TypeError(f"{name} must be a BlockIdExt, got {type(value).__name__}")


def _read_level(r: TLReader) -> Level:
    cid = r.constructor()
    try:
        return _LEVEL_BY_CONSTRUCTOR[cid]
    except KeyError:
        raise TLError(f"unknown tonNode.RempMessageLevel constructor 0x{cid:08x}") from None


# --- statuses ------------------------------------------------------------------------------

class RempStatus:
    """Base class of the seven tonNode.RempMessageStatus constructors.

    Every subclass has `pack() -> bytes` (boxed TL), `kind` (the JSON kind string) and
    `level` (the Level the status is reported at; see each class)."""

    constructor: int = 0

    def pack(self) -> bytes:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def kind(self) -> str:
        """The JSON `kind` of this status (seed: remp-protocol-b, "Other statuses" table)."""
        return kind_of(self)


@dataclass(frozen=True)
class SentToValidators(RempStatus):
    """`tonNode.rempSentToValidators sent_to:int total_validators:int` (kind
    "SentToValidators", level Fullnode): the full node delivered the message to `sent_to`
    of the `total_validators` validators of the destination shard group(s)."""

    sent_to: int
    total_validators: int
    constructor = REMP_SENT_TO_VALIDATORS
    level = Level.FULLNODE

    def pack(self) -> bytes:
        return pack_id(self.constructor) + pack_int(self.sent_to) + pack_int(self.total_validators)


@dataclass(frozen=True)
class New(RempStatus):
    """`tonNode.rempNew` (kind "PutIntoQueue", level Queue): a validator put the message
    into its RMQ for the first time."""

    constructor = REMP_NEW
    level = Level.QUEUE

    def pack(self) -> bytes:
        return pack_id(self.constructor)


@dataclass(frozen=True)
class Rejected(RempStatus):
    """`tonNode.rempRejected level block_id error:string`: the source will not process
    the message further (kinds "RejectedByFullnode", "RejectedByQueue",
    "RejectedByCollator", "RejectedByShardchain", "RejectedByMasterchain"). `block_id` is
    ZERO_BLOCK_ID when no block is involved; `error` is the precise reason (UTF-8)."""

    level: Level
    block_id: BlockIdExt = ZERO_BLOCK_ID
    error: str = ""
    constructor = REMP_REJECTED

    def __post_init__(self):
        object.__setattr__(self, "level", Level(self.level))
        _check_block_id(self.block_id, "block_id")

    def pack(self) -> bytes:
        return (pack_id(self.constructor) + pack_id(LEVEL_CONSTRUCTORS[self.level])
                + self.block_id.pack() + pack_bytes(self.error))


@dataclass(frozen=True)
class Accepted(RempStatus):
    """`tonNode.rempAccepted level block_id master_id`: the message passed `level`
    (kinds "AcceptedByFullnode", "AcceptedByQueue", "IncludedIntoBlock" = Collator,
    "IncludedIntoAcceptedBlock" = Shardchain, "Finalized" = Masterchain). `block_id` is the
    shard block; `master_id` the masterchain block that committed it (NO_MASTER_BLOCK_ID
    below the Masterchain level, ever-block's BlockIdExt::default(); a given ZERO_BLOCK_ID is
    read as that; otherwise wc -1, shard 0x8000000000000000)."""

    level: Level
    block_id: BlockIdExt = ZERO_BLOCK_ID
    master_id: BlockIdExt = NO_MASTER_BLOCK_ID
    constructor = REMP_ACCEPTED

    def __post_init__(self):
        object.__setattr__(self, "level", Level(self.level))
        _check_block_id(self.block_id, "block_id")
        _check_block_id(self.master_id, "master_id")
        if self.master_id == ZERO_BLOCK_ID:
            object.__setattr__(self, "master_id", NO_MASTER_BLOCK_ID)

    def pack(self) -> bytes:
        return (pack_id(self.constructor) + pack_id(LEVEL_CONSTRUCTORS[self.level])
                + self.block_id.pack() + self.master_id.pack())


@dataclass(frozen=True)
class Ignored(RempStatus):
    """`tonNode.rempIgnored level block_id`: the message did not fit (block full, block
    not accepted, ...) and returns to the Queue level (kinds "IgnoredByFullNode",
    "IgnoredByQueue", "IgnoredByCollator", "IgnoredByShardchain", "IgnoredByMasterchain")."""

    level: Level
    block_id: BlockIdExt = ZERO_BLOCK_ID
    constructor = REMP_IGNORED

    def __post_init__(self):
        object.__setattr__(self, "level", Level(self.level))
        _check_block_id(self.block_id, "block_id")

    def pack(self) -> bytes:
        return pack_id(self.constructor) + pack_id(LEVEL_CONSTRUCTORS[self.level]) + self.block_id.pack()


@dataclass(frozen=True)
class Duplicate(RempStatus):
    """`tonNode.rempDuplicate block_id` (kind "Duplicate", level Queue): a message with the
    same id or the same body (uid) is already known; `block_id` is the block that holds
    the original, or ZERO_BLOCK_ID if it is only queued."""

    block_id: BlockIdExt = ZERO_BLOCK_ID
    constructor = REMP_DUPLICATE
    level = Level.QUEUE

    def __post_init__(self):
        _check_block_id(self.block_id, "block_id")

    def pack(self) -> bytes:
        return pack_id(self.constructor) + self.block_id.pack()


@dataclass(frozen=True)
class Timeout(RempStatus):
    """`tonNode.rempTimeout` (kind "Timeout", level Queue): the message became obsolete
    (master session N+2) without being finalized by this source; final for that source.
    The full node also emits it when its own tracking lifetime runs out."""

    constructor = REMP_TIMEOUT
    level = Level.QUEUE

    def pack(self) -> bytes:
        return pack_id(self.constructor)


Status = Union[SentToValidators, New, Rejected, Accepted, Ignored, Duplicate, Timeout]

#: (status class, level or None) -> JSON kind. Total over every TL-expressible status.
KIND_NAMES: dict[tuple[type, Level | None], str] = {
    (SentToValidators, None): "SentToValidators",
    (New, None): "PutIntoQueue",
    (Duplicate, None): "Duplicate",
    (Timeout, None): "Timeout",
    (Accepted, Level.FULLNODE): "AcceptedByFullnode",
    (Accepted, Level.QUEUE): "AcceptedByQueue",
    (Accepted, Level.COLLATOR): "IncludedIntoBlock",
    (Accepted, Level.SHARDCHAIN): "IncludedIntoAcceptedBlock",
    (Accepted, Level.MASTERCHAIN): "Finalized",
    (Rejected, Level.FULLNODE): "RejectedByFullnode",
    (Rejected, Level.QUEUE): "RejectedByQueue",
    (Rejected, Level.COLLATOR): "RejectedByCollator",
    (Rejected, Level.SHARDCHAIN): "RejectedByShardchain",
    (Rejected, Level.MASTERCHAIN): "RejectedByMasterchain",
    (Ignored, Level.FULLNODE): "IgnoredByFullNode",
    (Ignored, Level.QUEUE): "IgnoredByQueue",
    (Ignored, Level.COLLATOR): "IgnoredByCollator",
    (Ignored, Level.SHARDCHAIN): "IgnoredByShardchain",
    (Ignored, Level.MASTERCHAIN): "IgnoredByMasterchain",
}
#: JSON kind -> (status class, level or None); the inverse of KIND_NAMES.
KINDS: dict[str, tuple[type, Level | None]] = {v: k for k, v in KIND_NAMES.items()}
assert len(KINDS) == len(KIND_NAMES)

#: Kinds after which nothing more happens to the message at all (DESIGN.md section 4:
#: "Final: Finalized; RejectedByFullnode").
FINAL_KINDS = frozenset({"Finalized", "RejectedByFullnode"})
#: Kinds that end the message's processing on ONE source (validator); the message is
#: finally rejected only when every validator that said New ended this way (seed:
#: "all New messages must be answered with a corresponding Reject or Timeout").
SOURCE_FINAL_KINDS = frozenset({"RejectedByQueue", "RejectedByCollator", "RejectedByShardchain",
                                "RejectedByMasterchain", "Timeout"})


def kind_of(status: RempStatus) -> str:
    """JSON kind of a status object (KIND_NAMES). Raises TypeError for a non-status."""
    cls = type(status)
    lvl = status.level if cls in (Accepted, Rejected, Ignored) else None
    try:
        return KIND_NAMES[(cls, lvl)]
    except KeyError:
        raise TypeError(f"not a REMP status: {status!r}") from None


def level_of_kind(kind: str) -> Level:
    """The Level a kind is reported at (SentToValidators/RejectedByFullnode -> FULLNODE,
    PutIntoQueue/Duplicate/Timeout -> QUEUE, ...). Raises ReceiptError for an unknown kind."""
    try:
        cls, lvl = KINDS[kind]
    except KeyError:
        raise ReceiptError("malformed", f"unknown receipt kind {kind!r}") from None
    return lvl if lvl is not None else cls.level


def is_final(kind: str) -> bool:
    """True iff `kind` ends the message's processing everywhere (FINAL_KINDS)."""
    return kind in FINAL_KINDS


def is_source_final(kind: str) -> bool:
    """True iff `kind` ends processing by the reporting validator (SOURCE_FINAL_KINDS)."""
    return kind in SOURCE_FINAL_KINDS


def truncate_error(text: str, limit: int = MAX_ERROR_BYTES) -> str:
    """`text` cut to at most `limit` UTF-8 bytes (on a character boundary)."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[:limit].decode(errors="ignore")


def read_status(r: TLReader) -> Status:
    """Read one boxed tonNode.RempMessageStatus from `r`. Raises TLError when malformed."""
    cid = r.constructor()
    if cid == REMP_SENT_TO_VALIDATORS:
        return SentToValidators(r.int(), r.int())
    if cid == REMP_NEW:
        return New()
    if cid == REMP_REJECTED:
        level = _read_level(r)
        block = BlockIdExt.read(r)
        return Rejected(level, block, r.string())
    if cid == REMP_ACCEPTED:
        level = _read_level(r)
        return Accepted(level, BlockIdExt.read(r), BlockIdExt.read(r))
    if cid == REMP_IGNORED:
        level = _read_level(r)
        return Ignored(level, BlockIdExt.read(r))
    if cid == REMP_DUPLICATE:
        return Duplicate(BlockIdExt.read(r))
    if cid == REMP_TIMEOUT:
        return Timeout()
    raise TLError(f"unknown tonNode.RempMessageStatus constructor 0x{cid:08x}")


# --- receipts ------------------------------------------------------------------------------

def _need32(value: bytes, name: str) -> bytes:
    if not isinstance(value, (bytes, bytearray)) or len(value) != 32:
        raise ValueError(f"{name} must be 32 bytes")
    return bytes(value)


@dataclass(frozen=True)
class Receipt:
    """`tonNode.rempReceipt`: one status of one message from one source.

    message_id: 32 bytes (root cell hash of the message BOC); status: a RempStatus;
    timestamp: ms since the Unix epoch (TL long); source_id: 32-byte key id of the signer.
    """

    message_id: bytes
    status: RempStatus
    timestamp: int
    source_id: bytes

    def __post_init__(self):
        _need32(self.message_id, "message_id")
        _need32(self.source_id, "source_id")
        if not isinstance(self.status, RempStatus):
            raise TypeError(f"status must be a RempStatus, got {type(self.status).__name__}")

    @property
    def kind(self) -> str:
        """JSON kind of the status."""
        return kind_of(self.status)

    def serialize(self) -> bytes:
        """Boxed TL bytes (constructor 0x3122b7a2 first): what the signature covers."""
        return (pack_id(REMP_RECEIPT) + pack_int256(self.message_id) + self.status.pack()
                + pack_long(self.timestamp) + pack_int256(self.source_id))

    @classmethod
    def parse(cls, data: bytes) -> "Receipt":
        """Parse boxed TL bytes (whole buffer, <= MAX_RECEIPT_BYTES). ReceiptError("malformed")."""
        fast = _parse_accepted(data)
        if fast is not None:
            return fast
        try:
            r = TLReader(data, MAX_RECEIPT_BYTES)
            cid = r.constructor()
            if cid != REMP_RECEIPT:
                raise TLError(f"expected tonNode.rempReceipt 0x{REMP_RECEIPT:08x}, got 0x{cid:08x}")
            message_id = r.int256()
            status = read_status(r)
            timestamp = r.long()
            source_id = r.int256()
            r.finish()
        except (TLError, ValueError) as exc:
            raise ReceiptError("malformed", f"receipt TL: {exc}") from None
        return cls(message_id, status, timestamp, source_id)


#: a whole tonNode.rempReceipt holding a tonNode.rempAccepted (4 of the 5 statuses a validator
#: sends per message), fixed size: receipt constructor, message_id, status constructor, level
#: constructor, block_id and master_id (tonNode.blockIdExt each), timestamp, source_id
_ACCEPTED_RECEIPT = struct.Struct("<I32sII" + "iQi32s32s" * 2 + "q32s")
_set = object.__setattr__


#: a boxed tonNode.rempSignedReceipt whose receipt is _ACCEPTED_RECEIPT: constructor, the TL
#: bytes (one length byte, the receipt, 3 zero bytes of padding), the 64-byte signature
_SIGNED_ACCEPTED_SIZE = 4 + (1 + _ACCEPTED_RECEIPT.size + 3) + 64
_SIGNED_PAD = slice(5 + _ACCEPTED_RECEIPT.size, 8 + _ACCEPTED_RECEIPT.size)
_PAD3 = b"\x00" * 3
_SIGNED_RECEIPT_ID = pack_id(REMP_SIGNED_RECEIPT)
assert (1 + _ACCEPTED_RECEIPT.size) % 4 == 1 and _ACCEPTED_RECEIPT.size < 254


def _parse_accepted(data: bytes) -> Receipt | None:
    """The Receipt of `data` when it is exactly a receipt with an Accepted status, in one
    struct unpack (the general TLReader path costs ~20 us per receipt, ~0.7 ms of the full
    node's CPU per message at 35 receipts); None for anything else (the general path then
    parses it, or says why it is malformed). The same object the general path builds: every
    field has its TL size by construction, the level constructor is checked, a zero master_id
    reads as NO_MASTER_BLOCK_ID (Accepted's rule)."""
    if len(data) != _ACCEPTED_RECEIPT.size:
        return None
    (cid, mid, scid, lcid, w1, s1, q1, r1, f1, w2, s2, q2, r2, f2, ts,
     src) = _ACCEPTED_RECEIPT.unpack(data)
    if cid != REMP_RECEIPT or scid != REMP_ACCEPTED:
        return None
    level = _LEVEL_BY_CONSTRUCTOR.get(lcid)
    if level is None:
        return None
    master = BlockIdExt(w2, s2, q2, r2, f2)
    if master == ZERO_BLOCK_ID:
        master = NO_MASTER_BLOCK_ID
    st = object.__new__(Accepted)
    _set(st, "level", level)
    _set(st, "block_id", BlockIdExt(w1, s1, q1, r1, f1))
    _set(st, "master_id", master)
    rc = object.__new__(Receipt)
    _set(rc, "message_id", mid)
    _set(rc, "status", st)
    _set(rc, "timestamp", ts)
    _set(rc, "source_id", src)
    return rc


@dataclass(frozen=True)
class SignedReceipt:
    """`tonNode.rempSignedReceipt receipt:bytes signature:int512`.

    receipt: the boxed serialized Receipt (bytes); signature: 64-byte ed25519 signature of
    exactly those bytes by the key whose key id is the receipt's source_id."""

    receipt: bytes
    signature: bytes

    def serialize(self) -> bytes:
        """Boxed TL bytes (constructor 0xb361c8dd first)."""
        return pack_id(REMP_SIGNED_RECEIPT) + pack_bytes(self.receipt) + pack_int512(self.signature)

    @classmethod
    def parse(cls, data: bytes) -> "SignedReceipt":
        """Parse boxed TL bytes (<= MAX_RECEIPT_BYTES + 80). ReceiptError("malformed")."""
        if len(data) == _SIGNED_ACCEPTED_SIZE and data[4] == _ACCEPTED_RECEIPT.size and \
                data[:4] == _SIGNED_RECEIPT_ID and data[_SIGNED_PAD] == _PAD3:
            # the fixed-size form of a receipt holding an Accepted status (4 of the 5 a
            # validator sends per message): the same fields the general path reads, by slicing
            # (the TLReader path was ~5 us of the full node's ~90 us per status)
            sr = object.__new__(cls)
            _set(sr, "receipt", data[5:5 + _ACCEPTED_RECEIPT.size])
            _set(sr, "signature", data[-64:])
            return sr
        try:
            r = TLReader(data, MAX_RECEIPT_BYTES + 80)
            cid = r.constructor()
            if cid != REMP_SIGNED_RECEIPT:
                raise TLError(f"expected tonNode.rempSignedReceipt 0x{REMP_SIGNED_RECEIPT:08x}, "
                              f"got 0x{cid:08x}")
            receipt = r.bytes()
            signature = r.int512()
            r.finish()
        except TLError as exc:
            raise ReceiptError("malformed", f"signed receipt TL: {exc}") from None
        return cls(receipt, signature)

    def open(self) -> Receipt:
        """The inner Receipt, parsed but NOT verified (ReceiptError("malformed"))."""
        return Receipt.parse(self.receipt)

    def verify(self, public_keys: Iterable[bytes]) -> Receipt:
        """Parse the inner receipt, find the key among `public_keys` (32-byte ed25519) whose
        key id equals source_id, and check the signature. Returns the Receipt; raises
        ReceiptError "malformed" | "unknown_source" | "bad_signature"."""
        receipt = self.open()
        _verify_with(receipt.source_id, self.receipt, self.signature, public_keys)
        return receipt


def _verify_with(source_id: bytes, data: bytes, signature: bytes, public_keys: Iterable[bytes]) -> bytes:
    for pk in public_keys:
        if len(pk) == 32 and key_id(pk) == source_id:
            if not verify(pk, data, signature):
                raise ReceiptError("bad_signature",
                                   f"ed25519 signature does not verify for source {source_id.hex()}")
            return pk
    raise ReceiptError("unknown_source", f"source_id {source_id.hex()} is not a known key id")


def sign_receipt(receipt: Receipt, key: NodeKey) -> SignedReceipt:
    """Sign `receipt` with `key` (ed25519 over receipt.serialize()). Raises ValueError when
    receipt.source_id is not key.key_id (local misuse: a source signs only its own receipts)."""
    if receipt.source_id != key.key_id:
        raise ValueError("receipt.source_id must equal the signing key's key id")
    data = receipt.serialize()
    return SignedReceipt(data, key.sign(data))


def make_signed_receipt(key: NodeKey, message_id: bytes, status: RempStatus,
                        timestamp_ms: int) -> SignedReceipt:
    """Build Receipt(message_id, status, timestamp_ms, key.key_id) and sign it."""
    return sign_receipt(Receipt(message_id, status, int(timestamp_ms), key.key_id), key)


# --- JSON (seed remp-protocol-b; reference ton_block_json::parse_remp_status) -------------

def _hex32(value: bytes) -> str:
    return bytes(value).hex()


@functools.lru_cache(maxsize=4096)
def _block_fields(block: BlockIdExt) -> dict[str, Any]:
    """The seed's fields of a block id (read only: cached, as every validator of a group
    names the same block in its receipt: 7 of 8 lookups at a full node are hits)."""
    return {"block_id": _hex32(block.root_hash), "block_file_hash": _hex32(block.file_hash),
            "block_seqno": block.seqno, "shard": block.shard_hex, "wc": block.workchain}


@functools.lru_cache(maxsize=1024)
def _mc_fields(master: BlockIdExt) -> dict[str, Any]:
    """The seed's mc_* fields of a master block id (read only: cached as _block_fields).
    Raises ValueError for a block id outside the masterchain."""
    if master == NO_MASTER_BLOCK_ID:
        return {}   # the reference parser rebuilds BlockIdExt::default() (NO_MASTER_BLOCK_ID)
    if master.workchain != MASTERCHAIN_WORKCHAIN or master.shard != MASTERCHAIN_SHARD:
        raise ValueError("master_id must be a masterchain block id (wc -1, shard 8000000000000000)")
    return {"mc_block_id": _hex32(master.root_hash), "mc_block_file_hash": _hex32(master.file_hash),
            "mc_block_seqno": master.seqno}


def to_json(receipt: Receipt, signature: bytes) -> dict[str, Any]:
    """The seed's JSON object for one signed status.

    Always: kind, message_id (64 hex), timestamp (ms), source_id (64 hex), signature (base64
    of 64 bytes, as the reference parser reads it). Per status: sent_to/total_validators;
    error (Rejected*); block_id, block_file_hash (64 hex), block_seqno, shard (16 hex digits),
    wc (Rejected/Accepted/Ignored/Duplicate); mc_block_id, mc_block_file_hash, mc_block_seqno
    (Accepted with a master_id, i.e. Finalized). Raises ValueError for a signature that is
    not 64 bytes or a master_id outside the masterchain."""
    if len(signature) != 64:
        raise ValueError("signature must be 64 bytes")
    st = receipt.status
    out: dict[str, Any] = {
        "kind": kind_of(st),
        "message_id": _hex32(receipt.message_id),
        "timestamp": receipt.timestamp,
        "source_id": _hex32(receipt.source_id),
        "signature": base64.b64encode(signature).decode(),
    }
    if isinstance(st, SentToValidators):
        out["sent_to"] = st.sent_to
        out["total_validators"] = st.total_validators
    if isinstance(st, Rejected):
        out["error"] = st.error
    if isinstance(st, (Rejected, Accepted, Ignored, Duplicate)):
        out.update(_block_fields(st.block_id))
    if isinstance(st, Accepted):
        out.update(_mc_fields(st.master_id))
    return out


def signed_to_json(signed: SignedReceipt) -> dict[str, Any]:
    """to_json of a SignedReceipt (parses the inner receipt; ReceiptError if malformed)."""
    return to_json(signed.open(), signed.signature)


def _get(obj: Mapping[str, Any], name: str, typ: type | tuple[type, ...]) -> Any:
    if name not in obj:
        raise ReceiptError("malformed", f"missing field {name!r}")
    value = obj[name]
    if not isinstance(value, typ) or isinstance(value, bool):
        raise ReceiptError("malformed", f"field {name!r} has type {type(value).__name__}")
    return value


def _get_hex32(obj: Mapping[str, Any], name: str) -> bytes:
    text = _get(obj, name, str)
    try:
        value = bytes.fromhex(text)
    except ValueError:
        raise ReceiptError("malformed", f"field {name!r} is not hex") from None
    if len(value) != 32:
        raise ReceiptError("malformed", f"field {name!r} must be 32 bytes (64 hex digits)")
    return value


def _get_signature(obj: Mapping[str, Any]) -> bytes:
    text = _get(obj, "signature", str)
    try:
        if len(text) == 128:
            sig = bytes.fromhex(text)
        else:
            sig = base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error):
        raise ReceiptError("malformed", "field 'signature' is neither base64 nor 128 hex digits") from None
    if len(sig) != 64:
        raise ReceiptError("malformed", f"signature must be 64 bytes, got {len(sig)}")
    return sig


def _get_block(obj: Mapping[str, Any], required: bool) -> BlockIdExt:
    names = ("block_id", "block_file_hash", "block_seqno", "shard", "wc")
    if not required and not any(n in obj for n in names):
        return ZERO_BLOCK_ID
    shard_text = _get(obj, "shard", str)
    if len(shard_text) != 16:
        raise ReceiptError("malformed", "field 'shard' must be 16 hex digits")
    try:
        shard = int(shard_text, 16)
    except ValueError:
        raise ReceiptError("malformed", "field 'shard' is not hex") from None
    wc = _get(obj, "wc", int)
    seqno = _get(obj, "block_seqno", int)
    if not (-(1 << 31) <= wc < (1 << 31)) or not (0 <= seqno < (1 << 32)):
        raise ReceiptError("malformed", "wc or block_seqno out of range")
    return BlockIdExt(wc, shard, seqno, _get_hex32(obj, "block_id"), _get_hex32(obj, "block_file_hash"))


def _get_master(obj: Mapping[str, Any]) -> BlockIdExt:
    if not any(n in obj for n in ("mc_block_id", "mc_block_file_hash", "mc_block_seqno")):
        return NO_MASTER_BLOCK_ID   # ever-block BlockIdExt::default(): see NO_MASTER_BLOCK_ID
    seqno = _get(obj, "mc_block_seqno", int)
    if not 0 <= seqno < (1 << 32):
        raise ReceiptError("malformed", "mc_block_seqno out of range")
    return BlockIdExt(MASTERCHAIN_WORKCHAIN, MASTERCHAIN_SHARD, seqno,
                      _get_hex32(obj, "mc_block_id"), _get_hex32(obj, "mc_block_file_hash"))


def from_json(obj: Mapping[str, Any]) -> tuple[Receipt, bytes]:
    """Rebuild (Receipt, signature) from the seed's JSON object (inverse of to_json).

    Block fields are optional for Rejected*/Ignored*/Accepted below Masterchain (missing ->
    ZERO_BLOCK_ID, e.g. the seed's RejectedByFullnode example) and required for Duplicate,
    IncludedIntoBlock, IncludedIntoAcceptedBlock and Finalized. Signature: base64 (reference)
    or 128 hex digits. Raises ReceiptError("malformed") with the offending field."""
    if not isinstance(obj, Mapping):
        raise ReceiptError("malformed", f"receipt JSON must be an object, got {type(obj).__name__}")
    kind = _get(obj, "kind", str)
    try:
        cls, level = KINDS[kind]
    except KeyError:
        raise ReceiptError("malformed", f"unknown receipt kind {kind!r}") from None
    message_id = _get_hex32(obj, "message_id")
    source_id = _get_hex32(obj, "source_id")
    timestamp = _get(obj, "timestamp", int)
    if not 0 <= timestamp < (1 << 63):
        raise ReceiptError("malformed", "timestamp out of range")
    signature = _get_signature(obj)
    status: RempStatus
    if cls is SentToValidators:
        sent_to, total = _get(obj, "sent_to", int), _get(obj, "total_validators", int)
        if not (0 <= sent_to < (1 << 31) and 0 <= total < (1 << 31)):
            raise ReceiptError("malformed", "sent_to/total_validators out of range")
        status = SentToValidators(sent_to, total)
    elif cls is New:
        status = New()
    elif cls is Timeout:
        status = Timeout()
    elif cls is Duplicate:
        status = Duplicate(_get_block(obj, True))
    elif cls is Rejected:
        error = _get(obj, "error", str)
        if len(error.encode()) > MAX_ERROR_BYTES:
            raise ReceiptError("malformed", f"error text longer than {MAX_ERROR_BYTES} bytes")
        status = Rejected(level, _get_block(obj, False), error)
    elif cls is Ignored:
        status = Ignored(level, _get_block(obj, False))
    else:  # Accepted
        block_required = level >= Level.COLLATOR
        status = Accepted(level, _get_block(obj, block_required), _get_master(obj))
        if level == Level.MASTERCHAIN and status.master_id == NO_MASTER_BLOCK_ID:
            raise ReceiptError("malformed", "Finalized needs mc_block_id, mc_block_file_hash, mc_block_seqno")
    return Receipt(message_id, status, timestamp, source_id), signature


def verify_receipt_json(obj: Mapping[str, Any], validator_public_keys: Iterable[bytes]) -> Receipt:
    """Verify one JSON status the way the seed describes (remp-protocol-b, "Checking the
    signature of the status"): JSON -> Receipt -> boxed TL bytes -> the key among
    `validator_public_keys` (32-byte ed25519; include the full node's key to check its
    statuses) whose key id equals source_id -> ed25519 verify.

    Returns the Receipt. Raises ReceiptError: "malformed" (bad JSON shape), "unknown_source"
    (no key has that key id), "bad_signature" (the key is known, the signature is wrong)."""
    receipt, signature = from_json(obj)
    _verify_with(receipt.source_id, receipt.serialize(), signature, validator_public_keys)
    return receipt


_NEW = pack_id(REMP_NEW)


def new_status_message_id(data: bytes) -> bytes | None:
    """The message id (32 bytes) when `data` (a boxed tonNode.rempSignedReceipt) carries
    tonNode.rempNew, else None: the receipt's status constructor follows its own constructor
    and the 32-byte message id. Never raises."""
    try:
        r = TLReader(data, MAX_RECEIPT_BYTES + 80)
        if r.constructor() != REMP_SIGNED_RECEIPT:
            return None
        inner = r.bytes()
        return inner[4:36] if inner[36:40] == _NEW else None
    except TLError:
        return None
