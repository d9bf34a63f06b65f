"""Envelope signatures (DESIGN.md section 3; rmb-rs v1.5.1 `Challengeable for Envelope`).

challenge = MD5 over the concatenation, no separators, numbers in decimal ASCII, strings
UTF-8, of: uid, tags (if set), timestamp, expiration, source twin then source connection
(if set), destination twin then connection (if set), then the message body (request:
command; error: code then message; response / ping / pong / none: nothing), schema (if
set), federation (if set), the raw plain or cipher bytes (if set), each relays entry in
order. An unset source/destination counts as twin 0 (rmb-rs reads the default Address;
rmb-sdk-go writes nothing instead: the two differ only for envelopes without a source,
i.e. unsigned relay errors, so no signed envelope is affected).

signature = type byte (b"e"/b"s") + sign(16-byte digest) -> 65 bytes in Envelope field 9.
"""
from __future__ import annotations

import hashlib

from rmb_peer._pb.types_pb2 import Address, Envelope
from rmb_peer.identity import Identity, SignatureError, verify_typed

__all__ = ["challenge", "challenge_bytes", "sign_envelope", "verify_envelope"]


def _address(addr: Address, present: bool) -> bytes:
    if not present:
        return b"0"
    out = str(addr.twin).encode()
    if addr.HasField("connection"):
        out += addr.connection.encode()
    return out


def challenge_bytes(env: Envelope) -> bytes:
    """The exact bytes MD5 is taken over (see the module docstring). Useful for debugging."""
    parts: list[bytes] = [env.uid.encode()]
    if env.HasField("tags"):
        parts.append(env.tags.encode())
    parts.append(str(env.timestamp).encode())
    parts.append(str(env.expiration).encode())
    parts.append(_address(env.source, env.HasField("source")))
    parts.append(_address(env.destination, env.HasField("destination")))
    kind = env.WhichOneof("message")
    if kind == "request":
        parts.append(env.request.command.encode())
    elif kind == "error":
        parts.append(str(env.error.code).encode())
        parts.append(env.error.message.encode())
    if env.HasField("schema"):
        parts.append(env.schema.encode())
    if env.HasField("federation"):
        parts.append(env.federation.encode())
    payload = env.WhichOneof("payload")
    if payload == "plain":
        parts.append(env.plain)
    elif payload == "cipher":
        parts.append(env.cipher)
    for relay in env.relays:
        parts.append(relay.encode())
    return b"".join(parts)


def challenge(env: Envelope) -> bytes:
    """16-byte MD5 digest of `challenge_bytes(env)` (DESIGN.md section 3)."""
    return hashlib.md5(challenge_bytes(env)).digest()


def sign_envelope(env: Envelope, identity: Identity) -> None:
    """Set env.signature (field 9) = identity's 65-byte typed signature over challenge(env).
    The signature field itself is not part of the challenge."""
    env.signature = identity.sign(challenge(env))


def verify_envelope(env: Envelope, account: bytes) -> None:
    """Verify env.signature with the sender twin's 32-byte account key.

    Raises SignatureError: "envelope is not signed" when field 9 is absent, otherwise the
    reason from `verify_typed` (bad length, unknown type byte, invalid)."""
    if not env.HasField("signature") or not env.signature:
        raise SignatureError("envelope is not signed")
    verify_typed(account, challenge(env), env.signature)
