"""Receipt delivery's TL objects: remp.receiptBatch (a signed batch of
tonNode.rempSignedReceipt, validator -> full node) and remp.receiptBatchAck /
remp.receiptBatchAckWindow (full node -> validator). Pure codecs: the state machines that
send, resend and acknowledge them are remp_node/core/delivery.py, whose module docstring
gives the wire layout and the rules (DESIGN.md section 4; ever-tl ton_api.tl style boxed
objects, little-endian, constructor id = crc32 of the TL line).

    encode_batch(key, dst, stream, seqno, base, receipts) -> bytes   (signed)
    decode_batch(bytes) -> Batch         signature NOT checked
    encode_ack(source_id, stream, through, seqnos, window=None) -> bytes
    decode_ack(bytes) -> Ack

Errors: DeliveryError (a RempRemoteError, a ValueError) with `reason` "malformed" from the
decoders; the delivery core raises it with its other reasons.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Iterable

from ..errors import RempRemoteError
from .keys import NodeKey
from .tl import TLError, TLReader, pack_bytes, pack_id, pack_int, pack_int256, pack_long, tl_constructor_id

__all__ = ["TL_LINES", "RECEIPT_BATCH", "RECEIPT_BATCH_ACK", "RECEIPT_BATCH_ACK_WINDOW", "MAX_BATCH_RECEIPTS",
           "MAX_PACKET_BYTES", "MAX_ACK_SEQNOS", "MAX_WINDOW", "DeliveryError", "Batch", "Ack",
           "encode_batch", "decode_batch", "encode_ack", "decode_ack"]

TL_LINES = {
    "remp.receiptBatch":
        "remp.receiptBatch source_id:int256 dst:int256 stream:long seqno:long base:long "
        "receipts:(vector bytes) signature:bytes = remp.ReceiptBatch;",
    "remp.receiptBatchAck":
        "remp.receiptBatchAck source_id:int256 stream:long through:long seqnos:(vector long) "
        "= remp.ReceiptBatchAck;",
    "remp.receiptBatchAckWindow":
        "remp.receiptBatchAckWindow source_id:int256 stream:long through:long window:int "
        "seqnos:(vector long) = remp.ReceiptBatchAck;",
}
RECEIPT_BATCH = tl_constructor_id(TL_LINES["remp.receiptBatch"])          # 0x3d7144f4
RECEIPT_BATCH_ACK = tl_constructor_id(TL_LINES["remp.receiptBatchAck"])   # 0x9dd2f163
RECEIPT_BATCH_ACK_WINDOW = tl_constructor_id(TL_LINES["remp.receiptBatchAckWindow"])

MAX_BATCH_RECEIPTS = 256
#: constructor, source_id, dst, stream, seqno, base, the receipts' count: one unpack
_BATCH_HEAD = struct.Struct("<I32s32sqqqi")
_EMPTY_BYTES = pack_bytes(b"")
MAX_PACKET_BYTES = 65535
MAX_ACK_SEQNOS = 512
#: the largest receive window (packets) an ack may advertise
MAX_WINDOW = 4096


class DeliveryError(RempRemoteError):
    """A remote delivery packet is malformed or does not verify. reason: "malformed" |
    "unknown_source" | "bad_signature" | "wrong_destination" | "wrong_source" |
    "stale_stream" | "buffer_full"."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# --- TL objects --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Batch:
    """A decoded remp.receiptBatch (see module doc); receipts: boxed rempSignedReceipt bytes."""

    source_id: bytes
    dst: bytes
    stream: int
    seqno: int
    base: int
    receipts: tuple
    signature: bytes
    #: the signed bytes when decoded (the packet as received up to its signature field, then
    #: an empty `bytes`): what signed_part() returns without serializing the batch again
    received_signed: bytes | None = field(default=None, compare=False, repr=False)

    def signed_part(self) -> bytes:
        """The bytes the signature covers: the boxed object with an EMPTY signature field.
        For a decoded batch, the received bytes themselves (no second serialization: it was
        ~1/8 of the full node's CPU per receipt packet)."""
        if self.received_signed is not None:
            return self.received_signed
        return _pack_batch(self.source_id, self.dst, self.stream, self.seqno, self.base, self.receipts, b"")

    def serialize(self) -> bytes:
        return _pack_batch(self.source_id, self.dst, self.stream, self.seqno, self.base, self.receipts,
                           self.signature)


def _pack_batch(source_id, dst, stream, seqno, base, receipts, signature) -> bytes:
    out = [pack_id(RECEIPT_BATCH), pack_int256(source_id), pack_int256(dst), pack_long(stream),
           pack_long(seqno), pack_long(base), pack_int(len(receipts))]
    out.extend(pack_bytes(r) for r in receipts)
    out.append(pack_bytes(signature))
    return b"".join(out)


def encode_batch(key: NodeKey, dst: bytes, stream: int, seqno: int, base: int,
                 receipts: Iterable[bytes]) -> bytes:
    """A signed remp.receiptBatch (bytes)."""
    receipts = tuple(bytes(r) for r in receipts)
    unsigned = Batch(key.key_id, bytes(dst), stream, seqno, base, receipts, b"")
    return Batch(key.key_id, bytes(dst), stream, seqno, base, receipts,
                 key.sign(unsigned.signed_part())).serialize()


def decode_batch(data: bytes) -> Batch:
    """Parse a remp.receiptBatch (signature NOT checked). DeliveryError("malformed")."""
    try:
        r = TLReader(data, MAX_PACKET_BYTES)
        cid, source_id, dst, stream, seqno, base, n = r.fields(_BATCH_HEAD)
        if cid != RECEIPT_BATCH:
            raise TLError("not a remp.receiptBatch")
        if not 0 <= n <= MAX_BATCH_RECEIPTS:
            raise TLError(f"{n} receipts in one batch (max {MAX_BATCH_RECEIPTS})")
        receipts = tuple([r.bytes() for _ in range(n)])
        signed = r.data[:r.pos] + _EMPTY_BYTES
        signature = r.bytes()
        r.finish()
    except TLError as exc:
        raise DeliveryError("malformed", f"remp.receiptBatch: {exc}") from None
    if len(signature) != 64:
        raise DeliveryError("malformed", f"remp.receiptBatch signature of {len(signature)} bytes")
    if seqno < 1 or base < 1 or base > seqno or stream < 0:
        raise DeliveryError("malformed", f"remp.receiptBatch seqno {seqno} base {base} stream {stream}")
    return Batch(source_id, dst, stream, seqno, base, receipts, signature, signed)


@dataclass(frozen=True)
class Ack:
    """A decoded remp.receiptBatchAck or remp.receiptBatchAckWindow (see module doc);
    window: None for the former."""

    source_id: bytes
    stream: int
    through: int
    seqnos: tuple
    window: int | None = None


def encode_ack(source_id: bytes, stream: int, through: int, seqnos: Iterable[int],
               window: int | None = None) -> bytes:
    """remp.receiptBatchAckWindow when `window` (packets) is given, else remp.receiptBatchAck."""
    seqnos = tuple(seqnos)
    head = [pack_id(RECEIPT_BATCH_ACK if window is None else RECEIPT_BATCH_ACK_WINDOW), pack_int256(source_id),
            pack_long(stream), pack_long(through)]
    if window is not None:
        head.append(pack_int(window))
    return b"".join(head + [pack_int(len(seqnos))] + [pack_long(s) for s in seqnos])


def decode_ack(data: bytes) -> Ack:
    """Parse a remp.receiptBatchAck / remp.receiptBatchAckWindow. DeliveryError("malformed")
    (also for a window outside 1..MAX_WINDOW)."""
    window = None
    try:
        r = TLReader(data, 68 + 8 * MAX_ACK_SEQNOS)
        cid = r.constructor()
        if cid not in (RECEIPT_BATCH_ACK, RECEIPT_BATCH_ACK_WINDOW):
            raise TLError("not a remp.receiptBatchAck")
        source_id, stream, through = r.int256(), r.long(), r.long()
        if cid == RECEIPT_BATCH_ACK_WINDOW:
            window = r.int()
            if not 1 <= window <= MAX_WINDOW:
                raise TLError(f"window {window} (1..{MAX_WINDOW})")
        n = r.int()
        if not 0 <= n <= MAX_ACK_SEQNOS:
            raise TLError(f"{n} seqnos in one ack (max {MAX_ACK_SEQNOS})")
        seqnos = tuple(r.long() for _ in range(n))
        r.finish()
    except TLError as exc:
        raise DeliveryError("malformed", f"remp.receiptBatchAck: {exc}") from None
    return Ack(source_id, stream, through, seqnos, window)
