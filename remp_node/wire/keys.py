"""Ed25519 node keys and TON-style key ids for REMP validators and full nodes.

key id (`source_id` in receipts, node id on the wire) = sha256(boxed `pub.ed25519 key:int256`),
constructor 0x4813b4c6 (DESIGN.md section 4; ton_api.tl `pub.ed25519`).
Signatures are plain ed25519 (64 bytes, RFC 8032) made and checked by libsodium through
PyNaCl's bindings (`crypto_sign` / `crypto_sign_open`). ed25519 is deterministic, so a key
signs the same bytes as with any other RFC 8032 implementation (tests/test_remp_keys.py
compares with `cryptography`'s OpenSSL backend, the one used before). libsodium's check is
the strict one: besides a bad signature it refuses non-canonical S, small-order R and
small-order public keys, which honest keys never produce. Why libsodium: on this project's
machine it signs in ~22-24 us and verifies in ~57-80 us against OpenSSL's ~35 and ~108-140
us, and a REMP message costs the network ~66 verifies and ~41 signatures
(bench/bench_remp_sim.py).
"""
from __future__ import annotations

import functools
import hashlib

from nacl import bindings as _sodium
from nacl.exceptions import BadSignatureError

from .tl import pack_id, pack_int256, tl_constructor_id

PUB_ED25519 = tl_constructor_id("pub.ed25519 key:int256 = PublicKey")

_crypto_sign = _sodium.crypto_sign
_crypto_sign_open = _sodium.crypto_sign_open


def key_id(public_key: bytes) -> bytes:
    """32-byte key id of a 32-byte ed25519 public key."""
    return hashlib.sha256(pack_id(PUB_ED25519) + pack_int256(public_key)).digest()


def verify(public_key: bytes, data: bytes, signature: bytes) -> bool:
    """True iff `signature` (64 bytes) is a valid ed25519 signature of `data` (bytes-like) by
    `public_key` (32 bytes); False for wrong lengths, a bad signature or an unusable key."""
    if len(public_key) != 32 or len(signature) != 64:
        return False
    try:
        _public(bytes(public_key)).verify(signature, data)
        return True
    except BadSignatureError:
        return False


class _PublicKey:
    """A 32-byte ed25519 public key; verify(signature, data) raises BadSignatureError."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes):
        self.raw = raw

    def verify(self, signature: bytes, data: bytes) -> None:
        # libsodium's combined form: signed message = signature | data (one copy of data).
        _crypto_sign_open(b"".join((signature, data)), self.raw)


@functools.lru_cache(maxsize=4096)
def _public(public_key: bytes) -> _PublicKey:
    """The public key object for 32 raw bytes (cached: a node verifies the same few dozen
    validator keys for every vote, receipt and commit; bench/bench_remp_sim.py hooks this)."""
    return _PublicKey(public_key)


class NodeKey:
    """A node's ed25519 private key. NodeKey.generate() | NodeKey.from_seed(32 bytes)."""

    def __init__(self, seed: bytes):
        if len(seed) != 32:
            raise ValueError("ed25519 seed must be 32 bytes")
        pk, sk = _sodium.crypto_sign_seed_keypair(bytes(seed))
        self._sk: bytes = sk                # libsodium's 64-byte secret key: seed | public key
        self.public: bytes = pk
        self.key_id: bytes = key_id(pk)

    @classmethod
    def generate(cls) -> "NodeKey":
        return cls(_sodium.randombytes(32))

    @classmethod
    def from_seed(cls, seed: bytes) -> "NodeKey":
        """Raises ValueError unless `seed` is 32 bytes."""
        return cls(seed)

    def seed(self) -> bytes:
        """The 32-byte ed25519 seed (the private key; written only to 0600 key files)."""
        return self._sk[:32]

    def sign(self, data: bytes) -> bytes:
        """64-byte ed25519 signature of `data` (bytes)."""
        return _crypto_sign(data, self._sk)[:64]

    def __repr__(self) -> str:
        return f"NodeKey({self.key_id.hex()[:8]})"
