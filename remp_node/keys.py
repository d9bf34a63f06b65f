"""Ed25519 node keys and TON-style key ids for REMP validators and full nodes.

key id (`source_id` in receipts, node id on the wire) = sha256(boxed `pub.ed25519 key:int256`),
constructor 0x4813b4c6 (DESIGN.md section 4; ton_api.tl `pub.ed25519`).
Signatures are plain ed25519 (64 bytes) from `cryptography`.
"""
from __future__ import annotations

import functools
import hashlib

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .tl import pack_id, pack_int256, tl_constructor_id

PUB_ED25519 = tl_constructor_id("pub.ed25519 key:int256 = PublicKey")


def key_id(public_key: bytes) -> bytes:
    """32-byte key id of a 32-byte ed25519 public key."""
    return hashlib.sha256(pack_id(PUB_ED25519) + pack_int256(public_key)).digest()


def verify(public_key: bytes, data: bytes, signature: bytes) -> bool:
    """True iff `signature` (64 bytes) is a valid ed25519 signature of `data` by `public_key`."""
    if len(public_key) != 32 or len(signature) != 64:
        return False
    try:
        _public(bytes(public_key)).verify(signature, data)
        return True
    except InvalidSignature:
        return False


@functools.lru_cache(maxsize=4096)
def _public(public_key: bytes) -> Ed25519PublicKey:
    """The loaded public key object (a node verifies the same few dozen validator keys for
    every vote, receipt and commit; loading one is a point decompression)."""
    return Ed25519PublicKey.from_public_bytes(public_key)


class NodeKey:
    """A node's ed25519 private key. NodeKey.generate() | NodeKey.from_seed(32 bytes)."""

    def __init__(self, private: Ed25519PrivateKey):
        self._private = private
        self.public: bytes = private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.key_id: bytes = key_id(self.public)

    @classmethod
    def generate(cls) -> "NodeKey":
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> "NodeKey":
        if len(seed) != 32:
            raise ValueError("ed25519 seed must be 32 bytes")
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    def seed(self) -> bytes:
        """The 32-byte ed25519 seed (the private key; written only to 0600 key files)."""
        return self._private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                           serialization.NoEncryption())

    def sign(self, data: bytes) -> bytes:
        """64-byte ed25519 signature of `data`."""
        return self._private.sign(data)

    def __repr__(self) -> str:
        return f"NodeKey({self.key_id.hex()[:8]})"
