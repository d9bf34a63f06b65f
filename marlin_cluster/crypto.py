"""Marlin identities and signatures (DESIGN.md section 5, "Signatures").

- keccak256: pycryptodome's Keccak-256 (Ethereum's hash; NOT hashlib.sha3_256, whose
  padding differs).
- Keys: secp256k1 (coincurve). A node's identity is its Ethereum-style address,
  keccak256(uncompressed public key[1:])[12:] (20 bytes).
- Signatures: 65-byte recoverable `r || s || recid` (coincurve `sign_recoverable`). Signing
  data uses a keccak256 hasher (coincurve's default hasher is SHA-256); signing a digest
  signs the 32 bytes as given.

Errors: `BadSignature` (a wire.MarlinWireError, i.e. a remote ValueError) when a signature
cannot be recovered; `KeyError`-free: a malformed secret raises MarlinLocalError.
"""
from __future__ import annotations

import os

import coincurve
from Crypto.Hash import keccak

from .wire import MarlinLocalError, MarlinWireError, SIGNATURE_LEN

__all__ = ["keccak256", "NodeKey", "address_of", "recover_address", "recover_signer",
           "BadSignature", "ADDRESS_LEN", "PUBLIC_KEY_LEN", "hex_address"]

ADDRESS_LEN = 20
PUBLIC_KEY_LEN = 65


class BadSignature(MarlinWireError):
    """A 65-byte signature that does not recover to any public key (bad recid, r/s out of
    range). Remote error."""


def keccak256(*parts: bytes) -> bytes:
    """Keccak-256 (Ethereum) of the concatenation of `parts` -> 32 bytes."""
    h = keccak.new(digest_bits=256)
    for p in parts:
        h.update(p)
    return h.digest()


def _keccak_hasher(data: bytes) -> bytes:
    return keccak.new(digest_bits=256, data=data).digest()


def address_of(public_key: bytes) -> bytes:
    """65-byte uncompressed (or 33-byte compressed) secp256k1 public key -> 20-byte address
    keccak256(uncompressed[1:])[12:]. Raises MarlinWireError for a malformed key."""
    if len(public_key) != PUBLIC_KEY_LEN or public_key[0] != 4:
        try:
            public_key = coincurve.PublicKey(public_key).format(compressed=False)
        except Exception as exc:  # coincurve raises ValueError / TypeError variants
            raise MarlinWireError(f"malformed public key: {exc}") from None
    return keccak256(public_key[1:])[12:]


def hex_address(address: bytes) -> str:
    """20-byte address -> "0x" + 40 lowercase hex digits (the event log's form)."""
    return "0x" + address.hex()


class NodeKey:
    """A node's secp256k1 key. `NodeKey.from_secret(32 bytes)` / `NodeKey.generate()`.

    .secret (32 bytes), .public_key (65 bytes uncompressed), .address (20 bytes).
    """

    __slots__ = ("_key", "secret", "public_key", "address")

    def __init__(self, key: coincurve.PrivateKey):
        self._key = key
        self.secret = key.secret
        self.public_key = key.public_key.format(compressed=False)
        self.address = keccak256(self.public_key[1:])[12:]

    @classmethod
    def from_secret(cls, secret: bytes) -> "NodeKey":
        """32-byte secret -> NodeKey. Raises MarlinLocalError for an invalid secret."""
        if not isinstance(secret, (bytes, bytearray)) or len(secret) != 32:
            raise MarlinLocalError("secret must be 32 bytes")
        try:
            return cls(coincurve.PrivateKey(bytes(secret)))
        except Exception as exc:
            raise MarlinLocalError(f"invalid secp256k1 secret: {exc}") from None

    @classmethod
    def generate(cls) -> "NodeKey":
        """A fresh random key (os.urandom via coincurve)."""
        return cls(coincurve.PrivateKey(os.urandom(32)))

    def sign_recoverable(self, digest: bytes) -> bytes:
        """Signs a 32-byte digest as given -> 65 bytes r || s || recid."""
        if len(digest) != 32:
            raise MarlinLocalError("digest must be 32 bytes")
        return self._key.sign_recoverable(digest, hasher=None)

    def sign(self, data: bytes) -> bytes:
        """Signs keccak256(data) -> 65 bytes r || s || recid (coincurve with a keccak256
        hasher)."""
        return self._key.sign_recoverable(data, hasher=_keccak_hasher)

    def __repr__(self) -> str:
        return f"NodeKey({hex_address(self.address)})"


def recover_address(digest: bytes, signature: bytes) -> bytes:
    """(32-byte digest, 65-byte signature) -> the signer's 20-byte address.
    Raises BadSignature when the signature does not recover."""
    if len(signature) != SIGNATURE_LEN:
        raise BadSignature(f"signature must be {SIGNATURE_LEN} bytes, got {len(signature)}")
    if signature[64] > 3:
        raise BadSignature(f"signature recovery id {signature[64]} is not 0..3")
    try:
        pub = coincurve.PublicKey.from_signature_and_message(signature, digest, hasher=None)
    except Exception as exc:  # coincurve raises ValueError for unrecoverable signatures
        raise BadSignature(f"signature does not recover: {exc}") from None
    return keccak256(pub.format(compressed=False)[1:])[12:]


def recover_signer(data: bytes, signature: bytes) -> bytes:
    """Like recover_address over keccak256(data) (what NodeKey.sign signs)."""
    return recover_address(_keccak_hasher(data), signature)
