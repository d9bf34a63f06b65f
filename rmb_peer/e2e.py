"""End-to-end payload encryption between twins (DESIGN.md section 3; seed: rmb.md,
"End2End Encryption").

shared key = sha256(32-byte x-coordinate of ECDH(our secp256k1 sk, peer's 33-byte pk));
cipher = nonce(12) || AES-256-GCM(shared key, nonce, plain, no AAD) (ciphertext || tag(16)).
The envelope carries it in `cipher` (field 14); plain text goes in `plain` (field 13) when
the destination twin has no pk.
"""
from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from rmb_peer.errors import RmbRemoteError
from rmb_peer.identity import E2EKey

__all__ = ["E2EError", "encrypt", "decrypt", "NONCE_SIZE", "TAG_SIZE"]

NONCE_SIZE = 12
TAG_SIZE = 16


class E2EError(RmbRemoteError):
    """Encryption or decryption failed: malformed peer pk, short cipher, or the tag does not
    verify (tampered cipher or wrong key)."""


def _aes(key: E2EKey, peer_pk: bytes) -> AESGCM:
    """The AES-256-GCM cipher for (our key, peer pk); a key object with an `aead(peer_pk)`
    method (rmb_peer.core.SharedKeyCache) hands out a cached one."""
    try:
        aead = getattr(key, "aead", None)
        if aead is not None:
            return aead(peer_pk)
        return AESGCM(key.shared_key(bytes(peer_pk)))
    except (ValueError, TypeError) as exc:
        raise E2EError(f"bad peer public key: {exc}") from None


def encrypt(key: E2EKey, peer_pk: bytes, plain: bytes) -> bytes:
    """nonce(12, random) || AES-256-GCM ciphertext || tag(16). Raises E2EError for a
    malformed peer pk (must be a 33-byte compressed or 65-byte uncompressed point)."""
    nonce = os.urandom(NONCE_SIZE)
    return nonce + _aes(key, peer_pk).encrypt(nonce, bytes(plain), None)


def decrypt(key: E2EKey, peer_pk: bytes, cipher: bytes) -> bytes:
    """Inverse of `encrypt` with the sender's pk. Raises E2EError: "cipher too short",
    "bad peer public key", "decryption failed (bad key or tampered cipher)"."""
    cipher = bytes(cipher)
    if len(cipher) < NONCE_SIZE + TAG_SIZE:
        raise E2EError(f"cipher too short: {len(cipher)} bytes < {NONCE_SIZE + TAG_SIZE}")
    aes = _aes(key, peer_pk)
    try:
        return aes.decrypt(cipher[:NONCE_SIZE], cipher[NONCE_SIZE:], None)
    except InvalidTag:
        raise E2EError("decryption failed (bad key or tampered cipher)") from None
