"""The REMP reliable message queue's wire objects (our TL lines, modelled on ever-tl `remp.*`;
constructor ids are CRC32 of the lines, little-endian): the catchain records
(`remp.catchainRecord.message` / `.digest`), the body fetch between RMQ members
(`remp.messageQuery` / `remp.messageResponse`), the RMQ's catchain session id
(`remp.rmqSession`) and the channel byte in front of every RMQ datagram (0 = catchain,
1 = body query, 2 = body response). Pure codecs; the queue that sends them is
remp_node/core/rmq.py, whose module docstring gives the rules (seeds/remp-overview.md,
"Proposals for speeding up"; DESIGN.md section 4).

Errors: RmqWireError (a RempRemoteError, a ValueError; reason "malformed_rmq") for remote
bytes that do not parse or exceed the limits.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ..errors import RempRemoteError
from .tl import TLError, TLReader, pack_bytes, pack_id, pack_int, pack_int256, pack_long, tl_constructor_id

__all__ = ["REC_MESSAGE", "REC_DIGEST", "MESSAGE_QUERY", "MESSAGE_RESPONSE", "SESSION_ID",
           "CH_CATCHAIN", "CH_QUERY", "CH_RESPONSE", "MAX_MESSAGE_BYTES", "MAX_PAYLOAD_BYTES", "MAX_QUERY_IDS",
           "RmqWireError", "Record", "decode_record", "encode_query", "decode_query", "encode_response",
           "decode_response", "rmq_session_id"]

REC_MESSAGE = tl_constructor_id(
    "remp.catchainRecord.message message_id:int256 uid:int256 masterchain_seqno:int origin:int256 "
    "message:bytes = remp.CatchainRecord")
REC_DIGEST = tl_constructor_id(
    "remp.catchainRecord.digest message_id:int256 uid:int256 masterchain_seqno:int origin:int256 "
    "finished:int = remp.CatchainRecord")
MESSAGE_QUERY = tl_constructor_id("remp.messageQuery message_ids:(vector int256) = remp.MessageQuery")
MESSAGE_RESPONSE = tl_constructor_id("remp.messageResponse messages:(vector bytes) = remp.MessageResponse")
SESSION_ID = tl_constructor_id(
    "remp.rmqSession workchain:int shard:long masterchain_seqno:int members:(vector int256) = remp.RmqSession")

#: the channel byte in front of an RMQ datagram
CH_CATCHAIN, CH_QUERY, CH_RESPONSE = 0, 1, 2

#: limits (bytes / counts) for remote input
MAX_MESSAGE_BYTES = 65535
MAX_PAYLOAD_BYTES = 4 << 20
MAX_QUERY_IDS = 256


class RmqWireError(RempRemoteError):
    """Malformed RMQ bytes from a remote member (reason "malformed_rmq")."""

    reason = "malformed_rmq"


@dataclass(frozen=True)
class Record:
    """One RMQ catchain record. body is None for a digest; finished (digests only): the
    forwarder saw the message finalized (replay protection only)."""

    message_id: bytes
    uid: bytes
    master_seqno: int
    origin: bytes
    body: bytes | None = None
    finished: bool = False

    def pack(self) -> bytes:
        """The boxed remp.catchainRecord.message (body set) or .digest."""
        head = pack_int256(self.message_id) + pack_int256(self.uid) + pack_int(self.master_seqno) + pack_int256(self.origin)
        if self.body is not None:
            return pack_id(REC_MESSAGE) + head + pack_bytes(self.body)
        return pack_id(REC_DIGEST) + head + pack_int(1 if self.finished else 0)


def decode_record(data: bytes) -> Record:
    """Parse one record (one catchain `submit` payload). Raises RmqWireError when malformed
    or over the limits (MAX_MESSAGE_BYTES per body)."""
    try:
        r = TLReader(data, MAX_MESSAGE_BYTES + 256)
        cid = r.constructor()
        mid, uid, seqno, origin = r.int256(), r.int256(), r.int(), r.int256()
        if cid == REC_MESSAGE:
            body = r.bytes()
            if len(body) > MAX_MESSAGE_BYTES:
                raise RmqWireError(f"message body of {len(body)} bytes > {MAX_MESSAGE_BYTES}")
            rec = Record(mid, uid, seqno, origin, body)
        elif cid == REC_DIGEST:
            flag = r.int()
            if flag not in (0, 1):
                raise RmqWireError(f"digest finished flag {flag}")
            rec = Record(mid, uid, seqno, origin, None, bool(flag))
        else:
            raise RmqWireError(f"unknown catchain record constructor 0x{cid:08x}")
        r.finish()
        return rec
    except TLError as exc:
        raise RmqWireError(f"catchain record: {exc}") from None


def encode_query(ids: list[bytes]) -> bytes:
    """CH_QUERY byte + boxed remp.messageQuery (32-byte message ids)."""
    return bytes([CH_QUERY]) + pack_id(MESSAGE_QUERY) + pack_int(len(ids)) + b"".join(ids)


def decode_query(data: bytes) -> list[bytes]:
    """The message ids of a remp.messageQuery (channel byte stripped; <= MAX_QUERY_IDS).
    Raises RmqWireError."""
    try:
        r = TLReader(data, 16 + 32 * MAX_QUERY_IDS)
        if r.constructor() != MESSAGE_QUERY:
            raise RmqWireError("not a remp.messageQuery")
        n = r.uint()
        if n > MAX_QUERY_IDS:
            raise RmqWireError(f"{n} ids > {MAX_QUERY_IDS}")
        ids = [r.int256() for _ in range(n)]
        r.finish()
        return ids
    except TLError as exc:
        raise RmqWireError(f"message query: {exc}") from None


def encode_response(bodies: list[bytes]) -> bytes:
    """CH_RESPONSE byte + boxed remp.messageResponse (message BOCs)."""
    return bytes([CH_RESPONSE]) + pack_id(MESSAGE_RESPONSE) + pack_int(len(bodies)) + b"".join(pack_bytes(b) for b in bodies)


def decode_response(data: bytes) -> list[bytes]:
    """The BOCs of a remp.messageResponse (channel byte stripped; <= MAX_QUERY_IDS of <=
    MAX_MESSAGE_BYTES each). Raises RmqWireError."""
    try:
        r = TLReader(data, MAX_PAYLOAD_BYTES)
        if r.constructor() != MESSAGE_RESPONSE:
            raise RmqWireError("not a remp.messageResponse")
        n = r.uint()
        if n > MAX_QUERY_IDS:
            raise RmqWireError(f"{n} bodies > {MAX_QUERY_IDS}")
        out = [r.bytes() for _ in range(n)]
        r.finish()
        if any(len(b) > MAX_MESSAGE_BYTES for b in out):
            raise RmqWireError("message body too big")
        return out
    except TLError as exc:
        raise RmqWireError(f"message response: {exc}") from None


def rmq_session_id(workchain: int, shard: int, master_seqno: int, members: list[bytes]) -> bytes:
    """32-byte catchain session id of the RMQ (sha256 of boxed remp.rmqSession with the
    members' public keys in member order)."""
    data = (pack_id(SESSION_ID) + pack_int(workchain) + pack_long(shard) + pack_int(master_seqno)
            + pack_int(len(members)) + b"".join(pack_int256(m) for m in members))
    return hashlib.sha256(data).digest()
