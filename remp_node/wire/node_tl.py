"""The REMP validator node's own wire objects: the channel prefix every datagram between REMP
nodes carries, the shard and master block payloads (remp.node.shardBlock /
remp.node.masterBlock), the two bodies of "shard commits by reference" (CH_MASTER_REF,
CH_COMMIT_NEED), and `classify` / `unwrap`, which tell a transport payload's kind from its
first bytes (client datagrams and receipts, bare or in a CH_CLIENT mux; receipt batches and
acks; the validators' own channels). Pure codecs; the validator core
(remp_node/core/validator.py, its module docstring: "Multiplexing", "Shard commits by
reference") decides when they are sent, the receipt delivery core
(remp_node/core/delivery.py) and the daemons route by `classify`.

Layouts (ever-tl ton_api.tl style: little-endian, TL `bytes` padding, boxed objects start
with the crc32 constructor id of their TL line):

    datagram          kind:uint8 session_id:bytes32 payload          (mux / demux)
    shard payload     remp.node.shardBlock session:int gen_utime_ms:long collator:int256
                      messages:(vector remp.node.blockMessage)
    master payload    remp.node.masterBlock session:int gen_utime_ms:long
                      shard_commits:(vector bytes) messages:(vector remp.node.blockMessage)
    blockMessage      message_id:int256 uid:int256 origin:int256 boc:bytes     (bare)
    CH_MASTER_REF     count:int then per segment 0:int data:bytes | 1:int hash:int256
    CH_COMMIT_NEED    count:int hashes:int256*
    group seed        remp.schedule.groupSeed prev_mc_block_hash:int256 session_seqno:int
                      workchain:int shard:long      (hashed, never sent)

Errors: PayloadError (a RempRemoteError, a ValueError; reason "bad_payload", or
"short_datagram" from demux) for remote bytes that do not parse; WireUsageError (a
RempLocalError) for a session id that is not 32 bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import RempRemoteError
from .batches import RECEIPT_BATCH, RECEIPT_BATCH_ACK, RECEIPT_BATCH_ACK_WINDOW
from .consensus_tl import MAX_DATAGRAM, MAX_PAYLOAD
from .packets import WireUsageError
from .tl import (REMP_MESSAGE, REMP_SIGNED_RECEIPT, TLError, TLReader, pack_bytes, pack_id, pack_int, pack_int256,
                 pack_long, tl_constructor_id)

__all__ = ["CH_CLIENT", "CH_RMQ", "CH_SHARD", "CH_MASTER", "CH_ANNOUNCE", "CH_MASTER_REF", "CH_COMMIT_NEED",
           "CHANNEL_NAMES", "ZERO32", "PREFIX", "mux", "demux", "PayloadError",
           "MAX_REFS", "CommitRef", "encode_refs", "decode_refs", "encode_commit_need", "decode_commit_need",
           "SHARD_BLOCK", "MASTER_BLOCK", "MAX_SHARD_PAYLOAD", "BlockMessage", "ShardPayload", "MasterPayload",
           "encode_shard_payload", "decode_shard_payload", "encode_master_block", "decode_master_block",
           "KINDS", "classify", "unwrap", "TL_GROUP_SEED", "GROUP_SEED", "pack_group_seed"]

CH_CLIENT, CH_RMQ, CH_SHARD, CH_MASTER, CH_ANNOUNCE = 1, 2, 3, 4, 5
#: a CH_MASTER datagram with its shard commits by reference, and the request for the commits a
#: member lacks to rebuild one
CH_MASTER_REF, CH_COMMIT_NEED = 6, 7
CHANNEL_NAMES = {CH_CLIENT: "client", CH_RMQ: "rmq", CH_SHARD: "shard", CH_MASTER: "master",
                 CH_ANNOUNCE: "announce", CH_MASTER_REF: "master", CH_COMMIT_NEED: "commit_need"}
#: the session id of the channels that have none (CH_CLIENT, CH_ANNOUNCE, CH_COMMIT_NEED)
ZERO32 = bytes(32)
#: bytes before a datagram's payload: the kind byte and the 32-byte session id
PREFIX = 33
#: most references in one CH_MASTER_REF datagram / hashes in one CH_COMMIT_NEED
MAX_REFS = 1024

SHARD_BLOCK = tl_constructor_id(
    "remp.node.shardBlock session:int gen_utime_ms:long collator:int256 "
    "messages:(vector remp.node.blockMessage) = remp.node.ShardBlock")
MASTER_BLOCK = tl_constructor_id(
    "remp.node.masterBlock session:int gen_utime_ms:long shard_commits:(vector bytes) "
    "messages:(vector remp.node.blockMessage) = remp.node.MasterBlock")
#: largest shard block payload decode_shard_payload reads (bytes)
MAX_SHARD_PAYLOAD = 8 << 20
#: the hash input of a session's per-shard group rotation seed (remp_node/core/schedule.py)
TL_GROUP_SEED = ("remp.schedule.groupSeed prev_mc_block_hash:int256 session_seqno:int "
                 "workchain:int shard:long = remp.schedule.GroupSeed")
GROUP_SEED = tl_constructor_id(TL_GROUP_SEED)


class PayloadError(RempRemoteError):
    """A malformed shard or master block payload (remote input; reason "bad_payload")."""

    reason = "bad_payload"


# --- the channel prefix ----------------------------------------------------------------------------

def mux(kind: int, session_id: bytes, payload: bytes) -> bytes:
    """Prefix a sub-protocol datagram: kind byte + 32-byte session id + payload.
    WireUsageError when the session id is not 32 bytes."""
    if len(session_id) != 32:
        raise WireUsageError("session id must be 32 bytes")
    return bytes([kind]) + session_id + payload


def demux(data: bytes) -> tuple[int, bytes, bytes]:
    """(kind, session id, payload); PayloadError (a ValueError, reason "short_datagram")
    when shorter than the prefix."""
    if len(data) < PREFIX:
        raise PayloadError(f"datagram of {len(data)} bytes is shorter than the {PREFIX}-byte prefix",
                           "short_datagram")
    return data[0], bytes(data[1:PREFIX]), bytes(data[PREFIX:])


# --- shard commits by reference ----------------------------------------------------------------------

@dataclass(frozen=True)
class CommitRef:
    """A CH_MASTER_REF segment standing for the shard commit whose sha256 is `hash` (32 bytes)."""

    hash: bytes


def encode_refs(segments: list) -> bytes:
    """CH_MASTER_REF body: boxed-free TL `count:int` then per segment `0:int data:bytes`
    (literal bytes) or `1:int hash:int256` (the shard commit whose sha256 is `hash`).
    segments: bytes (literal) or CommitRef."""
    out = [pack_int(len(segments))]
    for seg in segments:
        if isinstance(seg, CommitRef):
            out.append(pack_int(1) + pack_int256(seg.hash))
        else:
            out.append(pack_int(0) + pack_bytes(seg))
    return b"".join(out)


def decode_refs(body: bytes) -> list:
    """Inverse of encode_refs: a list of bytes and CommitRef; raises PayloadError (remote input)."""
    try:
        r = TLReader(body, MAX_DATAGRAM)
        n = r.uint()
        if n > 2 * MAX_REFS + 1:
            raise PayloadError(f"{n} segments in a master reference datagram")
        segs: list = []
        for _ in range(n):
            k = r.int()
            if k == 0:
                segs.append(r.bytes())
            elif k == 1:
                segs.append(CommitRef(r.int256()))
            else:
                raise PayloadError(f"segment kind {k}")
        r.finish()
    except TLError as exc:
        raise PayloadError(f"master reference datagram: {exc}") from None
    return segs


def encode_commit_need(hashes: list[bytes]) -> bytes:
    """CH_COMMIT_NEED body: `count:int` (len(hashes)) then the first MAX_REFS 32-byte hashes."""
    return pack_int(len(hashes)) + b"".join(hashes[:MAX_REFS])


def decode_commit_need(body: bytes) -> list[bytes]:
    """The shard commit hashes a CH_COMMIT_NEED body asks for; raises PayloadError (remote
    input: "<n> hashes" over MAX_REFS, or the TL reader's text)."""
    try:
        r = TLReader(body, 4 + 32 * MAX_REFS)
        n = r.uint()
        if n > MAX_REFS:
            raise PayloadError(f"{n} hashes")
        hashes = [r.int256() for _ in range(n)]
        r.finish()
    except TLError as exc:
        raise PayloadError(str(exc)) from None
    return hashes


# --- block payloads ------------------------------------------------------------------------------

@dataclass(frozen=True)
class BlockMessage:
    """One message of a block: message id, uid (body hash), origin (the full node's key id;
    32 bytes each) and the message BOC."""

    message_id: bytes
    uid: bytes
    origin: bytes
    boc: bytes


@dataclass(frozen=True)
class ShardPayload:
    """A shard block's payload: session tag, generation time (ms, Unix), collator key id and
    the messages in execution order."""

    session: int
    gen_utime_ms: int
    collator: bytes
    messages: tuple[BlockMessage, ...]


@dataclass(frozen=True)
class MasterPayload:
    """A master block's payload: session tag, generation time (ms, Unix), the shard block
    commit certificates it commits, and the external messages to workchain -1 accounts it
    executes itself (in execution order)."""

    session: int
    gen_utime_ms: int
    shard_commits: tuple[bytes, ...]
    messages: tuple[BlockMessage, ...] = ()


def _pack_message(m: BlockMessage) -> bytes:
    return pack_int256(m.message_id) + pack_int256(m.uid) + pack_int256(m.origin) + pack_bytes(m.boc)


def _read_messages(r: TLReader, n: int) -> tuple[BlockMessage, ...]:
    """n BlockMessages from r (message id, uid, origin: int256 each; the BOC: bytes)."""
    return tuple(BlockMessage(r.int256(), r.int256(), r.int256(), r.bytes()) for _ in range(n))


def encode_shard_payload(p: ShardPayload) -> bytes:
    """A boxed remp.node.shardBlock."""
    out = [pack_id(SHARD_BLOCK), pack_int(p.session), pack_long(p.gen_utime_ms), pack_int256(p.collator),
           pack_int(len(p.messages))]
    out.extend(_pack_message(m) for m in p.messages)
    return b"".join(out)


def decode_shard_payload(data: bytes) -> ShardPayload:
    """Inverse of encode_shard_payload (<= MAX_SHARD_PAYLOAD bytes, <= 4096 messages);
    raises PayloadError."""
    try:
        r = TLReader(data, MAX_SHARD_PAYLOAD)
        if r.constructor() != SHARD_BLOCK:
            raise PayloadError("not a remp.node.shardBlock")
        session, gen, collator, n = r.int(), r.long(), r.int256(), r.uint()
        if n > 4096:
            raise PayloadError(f"{n} messages in a shard block")
        msgs = _read_messages(r, n)
        r.finish()
    except TLError as exc:
        raise PayloadError(f"shard block: {exc}") from None
    return ShardPayload(session, gen, collator, msgs)


def encode_master_block(p: MasterPayload) -> bytes:
    """A boxed remp.node.masterBlock."""
    out = [pack_id(MASTER_BLOCK), pack_int(p.session), pack_long(p.gen_utime_ms),
           pack_int(len(p.shard_commits)), b"".join(pack_bytes(c) for c in p.shard_commits),
           pack_int(len(p.messages))]
    out.extend(_pack_message(m) for m in p.messages)
    return b"".join(out)


def decode_master_block(data: bytes) -> MasterPayload:
    """Inverse of encode_master_block (<= consensus MAX_PAYLOAD bytes, <= 1024 shard commits,
    <= 4096 messages); raises PayloadError."""
    try:
        r = TLReader(data, MAX_PAYLOAD)
        if r.constructor() != MASTER_BLOCK:
            raise PayloadError("not a remp.node.masterBlock")
        session, gen, n = r.int(), r.long(), r.uint()
        if n > 1024:
            raise PayloadError(f"{n} shard commits in a master block")
        commits = tuple(r.bytes() for _ in range(n))
        k = r.uint()
        if k > 4096:
            raise PayloadError(f"{k} messages in a master block")
        msgs = _read_messages(r, k)
        r.finish()
    except TLError as exc:
        raise PayloadError(f"master block: {exc}") from None
    return MasterPayload(session, gen, commits, msgs)


def pack_group_seed(prev_master_block_hash: bytes, session_seqno: int, workchain: int, shard: int) -> bytes:
    """The boxed remp.schedule.groupSeed whose sha256 is a session's group rotation seed."""
    return (pack_id(GROUP_SEED) + pack_int256(prev_master_block_hash) + pack_int(session_seqno)
            + pack_int(workchain) + pack_long(shard))


# --- what a transport payload is ------------------------------------------------------------------

#: What classify() returns.
KINDS = ("client_message", "receipt", "receipt_batch", "receipt_ack", "validator_mux", "unknown")
_BY_ID = {REMP_MESSAGE: "client_message", REMP_SIGNED_RECEIPT: "receipt",
          RECEIPT_BATCH: "receipt_batch", RECEIPT_BATCH_ACK: "receipt_ack", RECEIPT_BATCH_ACK_WINDOW: "receipt_ack"}
# a boxed TL object and a muxed datagram can never be confused: no constructor id we route
# starts with a channel byte
assert all((cid & 0xFF) not in CHANNEL_NAMES for cid in _BY_ID)


def classify(payload: bytes) -> str:
    """Kind of one transport payload (KINDS): "client_message" (tonNode.rempMessage),
    "receipt" (tonNode.rempSignedReceipt), "receipt_batch", "receipt_ack" (wire/batches.py),
    bare or inside a validator CH_CLIENT mux; "validator_mux" (mux of RMQ / shard / master /
    announce traffic, or a CH_CLIENT mux of anything else); else "unknown". Looks only at
    the first 37 bytes; never raises."""
    data = bytes(payload[:PREFIX + 4])
    if len(data) >= 4:
        kind = _BY_ID.get(int.from_bytes(data[:4], "little"))
        if kind is not None:
            return kind
    if len(data) >= PREFIX and data[0] in CHANNEL_NAMES:
        if data[0] == CH_CLIENT and len(data) >= PREFIX + 4:
            inner = _BY_ID.get(int.from_bytes(data[PREFIX:PREFIX + 4], "little"))
            if inner is not None:
                return inner
        return "validator_mux"
    return "unknown"


def unwrap(payload: bytes) -> bytes:
    """The TL object of a payload classify() named (strips a CH_CLIENT mux prefix)."""
    if len(payload) >= PREFIX + 4 and payload[0] == CH_CLIENT and \
            int.from_bytes(payload[:4], "little") not in _BY_ID:
        return bytes(payload[PREFIX:])
    return bytes(payload)
