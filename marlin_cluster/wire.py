"""Marlin wire formats (seed: marlin-data.txt "Data Format"; DESIGN.md section 5). Pure,
size-limited parsers; big-endian integers.

Message on the wire (seed "Message Format"): `| Attestation | Witness | Chunk |`

    Attestation wire (seed "Attestation Wire Format"), 81 bytes:
        | Message Id 4 | Channel Id 2 | Chunk Id 2 | Timestamp 4 | Stake Offset 4 | Signature 65 |
    Signed attestation data (seed "Attestation"), 52 bytes, signature over keccak256 of it:
        | Message Id 4 | Channel Id 2 | Chunk Id 2 | Timestamp 4 | Chunk Length 4 | Stake Offset 4 | Chunk Hash 32 |
      (Chunk Length and Chunk Hash = keccak256(chunk) are derived by the receiver.)
    Witness wire (seed "Witness Wire Format"), 65 bytes: | Witness Signature 65 |
      over the message hash keccak256(attestation wire || chunk) (derived, not sent).
    Chunk: the rest of the frame (an erasure-coded fragment; coding.py).

Acknowledgement (seed "Acknowledgment format"), 97 bytes:
    | Message Id 4 | Chunk Id 2 | Cluster Id 2 | Timestamp 4 | Producer Id 20 | Cluster Member Sign 65 |
  signature over keccak256 of the first 32 bytes.

Frames (ours; the transport carries one frame per LPF record): one kind byte, then the body.

    KIND_ATTESTED_CHUNK (1): producer -> first cluster member: | Attestation | Chunk |
        (the seed's producer sends chunk + attestation; no witness exists yet)
    KIND_CHUNK (2): member -> member / consumer: | Attestation | Witness | Chunk |
    KIND_ACK (3): member -> producer: the acknowledgement
    Connection handshake (ours; a mutual challenge-response, transport.py):
    KIND_HELLO (4): dialler -> acceptor, first frame: | Address 20 | Nonce 32 |
    KIND_HELLO_REPLY (5): acceptor -> dialler: | Address 20 | Nonce 32 | Signature 65 |
        signature over keccak256(hello_signed_data(HELLO_ACCEPTOR, acceptor address, dialler
        address, dialler's nonce))
    KIND_HELLO_PROOF (6): dialler -> acceptor: | Signature 65 | over keccak256(
        hello_signed_data(HELLO_DIALLER, dialler address, acceptor address, acceptor's nonce))
    Each side signs the other's fresh 32-byte nonce plus both addresses, so a captured
    handshake proves nothing on a new connection (a fresh nonce), and a signature cannot be
    reflected (the role byte and the address order differ).

Errors: every parser raises MarlinWireError (a ValueError) and nothing else for bad input.
Local misuse (encoding out-of-range values) raises MarlinLocalError (not a ValueError).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "MarlinWireError", "MarlinLocalError",
    "KIND_ATTESTED_CHUNK", "KIND_CHUNK", "KIND_ACK", "KIND_HELLO", "KIND_HELLO_REPLY", "KIND_HELLO_PROOF",
    "KIND_NAMES", "SIGNATURE_LEN", "ATTESTATION_LEN", "WITNESS_LEN", "ACK_LEN", "HELLO_LEN", "HELLO_REPLY_LEN",
    "HELLO_PROOF_LEN", "NONCE_LEN", "HELLO_ACCEPTOR", "HELLO_DIALLER", "SIGNED_ATTESTATION_LEN",
    "Attestation", "ChunkMessage", "Ack", "Hello", "HelloReply", "hello_signed_data", "parse_hello_reply",
    "parse_hello_proof",
    "encode_frame", "decode_frame", "peek_chunk_ids",
    "parse_attestation", "parse_chunk_message", "parse_ack", "parse_hello",
    "encode_chunk_message", "DEFAULT_MAX_FRAME",
]


class MarlinWireError(ValueError):
    """Remote error: bytes from a peer that do not parse or do not verify. `reason` is a
    short code for metrics and events (e.g. "truncated", "oversized")."""

    reason = "malformed"

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class MarlinLocalError(Exception):
    """Local error: we misused the API (bad argument, unknown channel, stake exhausted...).
    Never a ValueError, so a remote-error boundary cannot swallow it."""


KIND_ATTESTED_CHUNK = 1
KIND_CHUNK = 2
KIND_ACK = 3
KIND_HELLO = 4
KIND_HELLO_REPLY = 5
KIND_HELLO_PROOF = 6
KIND_NAMES = {KIND_ATTESTED_CHUNK: "attested_chunk", KIND_CHUNK: "chunk", KIND_ACK: "ack", KIND_HELLO: "hello",
              KIND_HELLO_REPLY: "hello_reply", KIND_HELLO_PROOF: "hello_proof"}

SIGNATURE_LEN = 65
_ATT_HEAD = struct.Struct(">IHHII")       # message id, channel id, chunk id, timestamp, stake offset
_ATT_SIGNED = struct.Struct(">IHHIII32s")  # + chunk length between timestamp and stake offset, chunk hash
_ACK_HEAD = struct.Struct(">IHHI20s")     # message id, chunk id, cluster id, timestamp, producer id
_HELLO_HEAD = struct.Struct(">20s32s")     # address, nonce
NONCE_LEN = 32
ATTESTATION_LEN = _ATT_HEAD.size + SIGNATURE_LEN      # 81
SIGNED_ATTESTATION_LEN = _ATT_SIGNED.size            # 52
WITNESS_LEN = SIGNATURE_LEN                          # 65
ACK_LEN = _ACK_HEAD.size + SIGNATURE_LEN             # 97
HELLO_LEN = _HELLO_HEAD.size                         # 52
HELLO_REPLY_LEN = _HELLO_HEAD.size + SIGNATURE_LEN   # 117
HELLO_PROOF_LEN = SIGNATURE_LEN                      # 65
HELLO_DOMAIN = b"marlin-hello"
HELLO_ACCEPTOR = b"A"
HELLO_DIALLER = b"D"
#: Default bound on one frame (bytes): room for a 4 MiB block split in 2 data chunks.
DEFAULT_MAX_FRAME = 4 * 1024 * 1024


def _u(value: int, bits: int, name: str) -> int:
    if not isinstance(value, int) or not 0 <= value < (1 << bits):
        raise MarlinLocalError(f"{name} {value!r} does not fit in {bits // 8} bytes")
    return value


@dataclass(frozen=True, slots=True)
class Attestation:
    """A producer's attestation of one chunk (seed "Attestation").

    message_id:   first 4 bytes of the block hash, as an int (uint32)
    channel:      channel id = message type (uint16)
    chunk_id:     chunk number 0..NUM_CHUNKS-1 (uint16)
    timestamp:    unix seconds when the block was broadcast (uint32)
    stake_offset: offset into the producer's stake budget for this refresh interval (uint32)
    signature:    65 bytes r || s || recid over keccak256(signed_data(...))
    """

    message_id: int
    channel: int
    chunk_id: int
    timestamp: int
    stake_offset: int
    signature: bytes

    def wire(self) -> bytes:
        """The 81-byte attestation wire format."""
        return _ATT_HEAD.pack(self.message_id, self.channel, self.chunk_id, self.timestamp,
                              self.stake_offset) + self.signature

    def signed_data(self, chunk_length: int, chunk_hash: bytes) -> bytes:
        """The 52 bytes the producer signs (the receiver derives length and hash from the chunk)."""
        return signed_attestation_data(self.message_id, self.channel, self.chunk_id, self.timestamp,
                                       chunk_length, self.stake_offset, chunk_hash)


def signed_attestation_data(message_id: int, channel: int, chunk_id: int, timestamp: int,
                            chunk_length: int, stake_offset: int, chunk_hash: bytes) -> bytes:
    """seed "Attestation": | Message Id 4 | Channel Id 2 | Chunk Id 2 | Timestamp 4 |
    Chunk Length 4 | Stake Offset 4 | Chunk Hash 32 |. Raises MarlinLocalError on overflow."""
    if len(chunk_hash) != 32:
        raise MarlinLocalError("chunk hash must be 32 bytes")
    return _ATT_SIGNED.pack(_u(message_id, 32, "message id"), _u(channel, 16, "channel id"),
                            _u(chunk_id, 16, "chunk id"), _u(timestamp, 32, "timestamp"),
                            _u(chunk_length, 32, "chunk length"), _u(stake_offset, 32, "stake offset"),
                            chunk_hash)


def make_attestation(message_id: int, channel: int, chunk_id: int, timestamp: int,
                     stake_offset: int, signature: bytes) -> Attestation:
    """An Attestation with range-checked fields (MarlinLocalError otherwise)."""
    if len(signature) != SIGNATURE_LEN:
        raise MarlinLocalError("signature must be 65 bytes")
    return Attestation(_u(message_id, 32, "message id"), _u(channel, 16, "channel id"),
                       _u(chunk_id, 16, "chunk id"), _u(timestamp, 32, "timestamp"),
                       _u(stake_offset, 32, "stake offset"), bytes(signature))


def parse_attestation(data: bytes) -> Attestation:
    """81 bytes -> Attestation. Raises MarlinWireError("truncated"/"oversized")."""
    if len(data) != ATTESTATION_LEN:
        raise MarlinWireError(f"attestation must be {ATTESTATION_LEN} bytes, got {len(data)}",
                              "truncated" if len(data) < ATTESTATION_LEN else "oversized")
    mid, ch, cid, ts, off = _ATT_HEAD.unpack_from(data, 0)
    return Attestation(mid, ch, cid, ts, off, bytes(data[_ATT_HEAD.size:]))


@dataclass(frozen=True, slots=True)
class ChunkMessage:
    """One chunk message (seed "Message Format").

    attestation: the parsed Attestation
    attestation_wire: its 81 wire bytes (what the message hash covers)
    witness: 65-byte witness signature, or None in a KIND_ATTESTED_CHUNK frame
    chunk: the chunk bytes (an erasure-coded fragment)
    """

    attestation: Attestation
    attestation_wire: bytes
    witness: bytes | None
    chunk: bytes

    @property
    def key(self) -> tuple[int, int]:
        """(message id, chunk id): the chunk cache key (seed "chunkCache")."""
        return (self.attestation.message_id, self.attestation.chunk_id)


def encode_chunk_message(attestation_wire: bytes, witness: bytes | None, chunk: bytes) -> bytes:
    """A KIND_CHUNK frame (witness given) or a KIND_ATTESTED_CHUNK frame (witness None)."""
    if witness is None:
        return b"".join((bytes((KIND_ATTESTED_CHUNK,)), attestation_wire, chunk))
    if len(witness) != WITNESS_LEN:
        raise MarlinLocalError("witness must be 65 bytes")
    return b"".join((bytes((KIND_CHUNK,)), attestation_wire, witness, chunk))


def encode_frame(kind: int, body: bytes) -> bytes:
    """kind byte + body. Raises MarlinLocalError for an unknown kind."""
    if kind not in KIND_NAMES:
        raise MarlinLocalError(f"unknown frame kind {kind}")
    return bytes((kind,)) + body


def decode_frame(frame: bytes, max_size: int = DEFAULT_MAX_FRAME) -> tuple[int, memoryview]:
    """frame -> (kind, body view). Raises MarlinWireError: "oversized" beyond max_size bytes,
    "truncated" for an empty frame, "unknown_kind"."""
    if len(frame) > max_size:
        raise MarlinWireError(f"frame of {len(frame)} bytes exceeds {max_size}", "oversized")
    if not frame:
        raise MarlinWireError("empty frame", "truncated")
    kind = frame[0]
    if kind not in KIND_NAMES:
        raise MarlinWireError(f"unknown frame kind {kind}", "unknown_kind")
    return kind, memoryview(frame)[1:]


def peek_chunk_ids(body) -> tuple[int, int, int]:
    """The (message id, channel id, chunk id) of a chunk body without parsing the rest (for
    duplicate suppression before any signature check). Raises MarlinWireError("truncated")."""
    if len(body) < 8:
        raise MarlinWireError("chunk message shorter than its ids", "truncated")
    mid, ch, cid = struct.unpack_from(">IHH", body, 0)
    return mid, ch, cid


def parse_chunk_message(body, witnessed: bool, max_chunk: int) -> ChunkMessage:
    """A KIND_CHUNK (witnessed=True) or KIND_ATTESTED_CHUNK body -> ChunkMessage.
    Raises MarlinWireError: "truncated" (shorter than the headers, or an empty chunk),
    "oversized" (chunk longer than max_chunk bytes)."""
    head = ATTESTATION_LEN + (WITNESS_LEN if witnessed else 0)
    if len(body) <= head:
        raise MarlinWireError(f"chunk message of {len(body)} bytes has no chunk after its "
                              f"{head}-byte header", "truncated")
    if len(body) - head > max_chunk:
        raise MarlinWireError(f"chunk of {len(body) - head} bytes exceeds {max_chunk}", "oversized")
    att_wire = bytes(body[:ATTESTATION_LEN])
    witness = bytes(body[ATTESTATION_LEN:head]) if witnessed else None
    return ChunkMessage(parse_attestation(att_wire), att_wire, witness, bytes(body[head:]))


@dataclass(frozen=True, slots=True)
class Ack:
    """A cluster member's acknowledgement of one chunk (seed "Acknowledgment format").

    message_id: uint32; chunk_id: uint16; cluster_id: uint16 (the acknowledging cluster)
    timestamp:  unix seconds when the member processed the chunk (uint32)
    producer:   the producer's 20-byte address
    signature:  65 bytes, the member's signature over keccak256(signed_data())
    """

    message_id: int
    chunk_id: int
    cluster_id: int
    timestamp: int
    producer: bytes
    signature: bytes

    def signed_data(self) -> bytes:
        """The first 32 bytes of the acknowledgement (what the member signs)."""
        return _ACK_HEAD.pack(_u(self.message_id, 32, "message id"), _u(self.chunk_id, 16, "chunk id"),
                              _u(self.cluster_id, 16, "cluster id"), _u(self.timestamp, 32, "timestamp"),
                              self.producer)

    def wire(self) -> bytes:
        """The 97-byte acknowledgement."""
        return self.signed_data() + self.signature


def parse_ack(body) -> Ack:
    """97 bytes -> Ack. Raises MarlinWireError("truncated"/"oversized")."""
    if len(body) != ACK_LEN:
        raise MarlinWireError(f"acknowledgement must be {ACK_LEN} bytes, got {len(body)}",
                              "truncated" if len(body) < ACK_LEN else "oversized")
    mid, cid, clu, ts, prod = _ACK_HEAD.unpack_from(body, 0)
    return Ack(mid, cid, clu, ts, bytes(prod), bytes(body[_ACK_HEAD.size:]))


@dataclass(frozen=True, slots=True)
class Hello:
    """The dialler's first frame (KIND_HELLO): its address and a fresh 32-byte nonce (the
    challenge the acceptor must sign)."""

    address: bytes
    nonce: bytes

    def wire(self) -> bytes:
        if len(self.address) != 20 or len(self.nonce) != NONCE_LEN:
            raise MarlinLocalError("hello needs a 20-byte address and a 32-byte nonce")
        return _HELLO_HEAD.pack(self.address, self.nonce)


@dataclass(frozen=True, slots=True)
class HelloReply:
    """The acceptor's answer (KIND_HELLO_REPLY): its address, its own fresh nonce (the
    dialler's challenge) and its signature over hello_signed_data(HELLO_ACCEPTOR, its
    address, the dialler's address, the dialler's nonce)."""

    address: bytes
    nonce: bytes
    signature: bytes

    def wire(self) -> bytes:
        if len(self.address) != 20 or len(self.nonce) != NONCE_LEN or len(self.signature) != SIGNATURE_LEN:
            raise MarlinLocalError("hello reply needs a 20-byte address, a 32-byte nonce, a 65-byte signature")
        return _HELLO_HEAD.pack(self.address, self.nonce) + self.signature


def hello_signed_data(role: bytes, signer: bytes, other: bytes, challenge: bytes) -> bytes:
    """b"marlin-hello" || role (HELLO_ACCEPTOR / HELLO_DIALLER) || signer address || other
    side's address || the other side's nonce: what a handshake signature covers (keccak256
    of it is signed)."""
    if role not in (HELLO_ACCEPTOR, HELLO_DIALLER) or len(signer) != 20 or len(other) != 20 \
            or len(challenge) != NONCE_LEN:
        raise MarlinLocalError("hello_signed_data: role A/D, two 20-byte addresses, a 32-byte nonce")
    return HELLO_DOMAIN + role + signer + other + challenge


def parse_hello(body) -> Hello:
    """52 bytes -> Hello. Raises MarlinWireError("truncated"/"oversized")."""
    if len(body) != HELLO_LEN:
        raise MarlinWireError(f"hello must be {HELLO_LEN} bytes, got {len(body)}",
                              "truncated" if len(body) < HELLO_LEN else "oversized")
    addr, nonce = _HELLO_HEAD.unpack_from(body, 0)
    return Hello(bytes(addr), bytes(nonce))


def parse_hello_reply(body) -> HelloReply:
    """117 bytes -> HelloReply. Raises MarlinWireError("truncated"/"oversized")."""
    if len(body) != HELLO_REPLY_LEN:
        raise MarlinWireError(f"hello reply must be {HELLO_REPLY_LEN} bytes, got {len(body)}",
                              "truncated" if len(body) < HELLO_REPLY_LEN else "oversized")
    addr, nonce = _HELLO_HEAD.unpack_from(body, 0)
    return HelloReply(bytes(addr), bytes(nonce), bytes(body[_HELLO_HEAD.size:]))


def parse_hello_proof(body) -> bytes:
    """65 bytes -> the dialler's signature. Raises MarlinWireError("truncated"/"oversized")."""
    if len(body) != HELLO_PROOF_LEN:
        raise MarlinWireError(f"hello proof must be {HELLO_PROOF_LEN} bytes, got {len(body)}",
                              "truncated" if len(body) < HELLO_PROOF_LEN else "oversized")
    return bytes(body)
