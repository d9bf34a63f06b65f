"""REMP client <-> validator datagrams (the "REMP Client protocol" of the seed).

Two datagram kinds, each one boxed TL object (DESIGN.md section 4; ever-tl ton_api.tl):

full node -> validator: `tonNode.rempMessage message:bytes id:int256 timestamp:long
    signature:bytes = tonNode.RempMessage` (constructor 0xdd1f6db1). message = the external
    message BOC, id = its root cell hash (REMP message id), timestamp = ms since the Unix epoch
    when the full node sent it, signature = ed25519 by the full node's key over the same boxed
    object serialized with an EMPTY signature field (the TON convention for self-signed
    objects, e.g. dht.node). The sender's key id comes from the transport (src_key_id).

validator -> full node: `tonNode.rempSignedReceipt receipt:bytes signature:int512`
    (0xb361c8dd, receipts.SignedReceipt), one receipt per datagram. Between processes the
    receipts travel batched, signed once per packet, acknowledged and resent
    (delivery.py: remp.receiptBatch / remp.receiptBatchAck); each batch entry is still this
    exact object, so the full node feeds it to the client core unchanged.

Carriage: between processes every one of these objects is the payload of one
transport.TransportCore message (authenticated, split into <= 1,232-byte datagrams);
node_tl.classify(payload) tells the kinds apart (also inside a validator CH_CLIENT mux).

Parsing is pure and size-limited; malformed input raises WireError (a RempRemoteError,
so a ValueError) and nothing else; misuse of an encoder raises WireUsageError (a
RempLocalError, never a ValueError; remp_node/errors.py). Checking that `id` is really the root hash of `message` is the receiver's job
(messages.parse_external_message gives it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ..errors import RempLocalError, RempRemoteError
from .keys import NodeKey, verify
from .messages import MAX_MESSAGE_SIZE
from .receipts import ReceiptError, SignedReceipt
from .tl import (
    REMP_MESSAGE, REMP_SIGNED_RECEIPT, TLError, TLReader, pack_bytes, pack_id, pack_int256,
    pack_long,
)

#: Largest datagram either side accepts (bytes): a maximal message BOC plus TL overhead.
MAX_DATAGRAM_SIZE = MAX_MESSAGE_SIZE + 256


class WireError(RempRemoteError):
    """A datagram that is not a well-formed REMP client datagram (remote error; reason
    "malformed_datagram")."""

    reason = "malformed_datagram"


class WireUsageError(RempLocalError):
    """Local misuse of the datagram encoders (an oversized BOC, a message id that is not
    32 bytes)."""


@dataclass(frozen=True)
class RempMessageDatagram:
    """A decoded `tonNode.rempMessage`.

    boc: the message BOC (bytes, <= 65535); message_id: 32 bytes (claimed root hash);
    timestamp: ms since the Unix epoch; signature: 64-byte ed25519 signature (see module doc)."""

    boc: bytes
    message_id: bytes
    timestamp: int
    signature: bytes

    def signed_part(self) -> bytes:
        """The bytes the signature covers: the boxed object with an empty signature field."""
        return _pack(self.boc, self.message_id, self.timestamp, b"")

    def serialize(self) -> bytes:
        """Boxed TL bytes (the datagram payload)."""
        return _pack(self.boc, self.message_id, self.timestamp, self.signature)

    def verify(self, public_key: bytes) -> bool:
        """True iff `signature` is the full node `public_key`'s (32 bytes) signature."""
        return verify(public_key, self.signed_part(), self.signature)


def _pack(boc: bytes, message_id: bytes, timestamp: int, signature: bytes) -> bytes:
    return (pack_id(REMP_MESSAGE) + pack_bytes(boc) + pack_int256(message_id)
            + pack_long(timestamp) + pack_bytes(signature))


def encode_remp_message(boc: bytes, message_id: bytes, timestamp_ms: int, key: NodeKey) -> bytes:
    """Build and sign a `tonNode.rempMessage` datagram (bytes). WireUsageError (a
    RempLocalError) when the BOC is larger than MAX_MESSAGE_SIZE or message_id is not 32
    bytes: the caller checks both before (messages.py), so either is a bug."""
    if len(boc) > MAX_MESSAGE_SIZE:
        raise WireUsageError(f"message BOC of {len(boc)} bytes exceeds {MAX_MESSAGE_SIZE}")
    if len(message_id) != 32:
        raise WireUsageError("message_id must be 32 bytes")
    unsigned = RempMessageDatagram(bytes(boc), bytes(message_id), int(timestamp_ms), b"")
    return RempMessageDatagram(unsigned.boc, unsigned.message_id, unsigned.timestamp,
                               key.sign(unsigned.signed_part())).serialize()


def encode_receipt(signed: SignedReceipt) -> bytes:
    """A validator's (or full node's) signed receipt as a datagram (boxed rempSignedReceipt)."""
    return signed.serialize()


Datagram = Union[RempMessageDatagram, SignedReceipt]


def decode_datagram(data: bytes) -> Datagram:
    """Decode one REMP client datagram by its constructor id: RempMessageDatagram or
    receipts.SignedReceipt (signature NOT verified here). Raises WireError (size over
    MAX_DATAGRAM_SIZE, unknown constructor, truncated/trailing bytes, bad field sizes)."""
    data = bytes(data)
    if len(data) > MAX_DATAGRAM_SIZE:
        raise WireError(f"datagram of {len(data)} bytes exceeds {MAX_DATAGRAM_SIZE}")
    if len(data) < 4:
        raise WireError(f"datagram of {len(data)} bytes has no constructor id")
    cid = int.from_bytes(data[:4], "little")
    if cid == REMP_SIGNED_RECEIPT:
        try:
            return SignedReceipt.parse(data)
        except ReceiptError as exc:
            raise WireError(str(exc)) from None
    if cid == REMP_MESSAGE:
        try:
            r = TLReader(data, MAX_DATAGRAM_SIZE)
            r.constructor()
            boc = r.bytes()
            message_id = r.int256()
            timestamp = r.long()
            signature = r.bytes()
            r.finish()
        except TLError as exc:
            raise WireError(f"tonNode.rempMessage: {exc}") from None
        if len(boc) > MAX_MESSAGE_SIZE:
            raise WireError(f"tonNode.rempMessage carries a {len(boc)}-byte BOC > {MAX_MESSAGE_SIZE}")
        if len(signature) != 64:
            raise WireError(f"tonNode.rempMessage signature must be 64 bytes, got {len(signature)}")
        return RempMessageDatagram(boc, message_id, timestamp, signature)
    raise WireError(f"unknown REMP client datagram constructor 0x{cid:08x}")
