"""Twin keys: the account (signing) key and the end-to-end (secp256k1) key.

Account key (rmb-rs `identity`): ed25519 or sr25519, derived from a BIP-39 mnemonic through
the substrate mini-secret (py-bip39-bindings `bip39_to_mini_secret(mnemonic, "")`), or from a
32-byte seed. sr25519 signs with the substrate signing context "substrate"
(py-sr25519-bindings); ed25519 uses the mini-secret as the RFC 8032 private key
(cryptography). A typed signature is 65 bytes: one type byte (b"e" ed25519, b"s" sr25519)
followed by the 64-byte signature (DESIGN.md section 3).

E2E key: secp256k1 secret = first 32 bytes of the mini-secret (or the 32-byte seed);
public key published as the twin's `pk` = 33-byte compressed point (coincurve).
"""
from __future__ import annotations

import hashlib

import bip39
import coincurve
import sr25519
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey, Ed25519PublicKey,
)

from rmb_peer.errors import RmbRemoteError

__all__ = ["SignatureError", "Identity", "E2EKey", "verify_typed", "mini_secret",
           "KEY_TYPES", "SIGNATURE_LENGTH"]

#: Accepted key types and their signature type bytes (rmb-rs: typed signatures).
KEY_TYPES = {"ed25519": b"e", "sr25519": b"s"}
_TYPE_OF_BYTE = {v: k for k, v in KEY_TYPES.items()}

#: Typed signature length: 1 type byte + 64 signature bytes.
SIGNATURE_LENGTH = 65


class SignatureError(RmbRemoteError):
    """A signature does not verify: bad length, unknown type byte, or invalid."""


def mini_secret(mnemonic: str) -> bytes:
    """The substrate mini-secret of a BIP-39 mnemonic (32 bytes): the first 32 bytes of
    PBKDF2-HMAC-SHA512(entropy, "mnemonic", 2048) (py-bip39-bindings, empty password).
    Raises ValueError for an invalid mnemonic."""
    phrase = " ".join(mnemonic.split())
    try:
        return bytes(bip39.bip39_to_mini_secret(phrase, ""))
    except Exception as exc:  # the binding raises a plain ValueError or its own type
        raise ValueError(f"invalid mnemonic: {exc}") from None


def _seed_bytes(seed: bytes | str) -> bytes:
    if isinstance(seed, str):
        text = seed[2:] if seed.startswith(("0x", "0X")) else seed
        try:
            seed = bytes.fromhex(text)
        except ValueError:
            raise ValueError("seed is not hex") from None
    seed = bytes(seed)
    if len(seed) != 32:
        raise ValueError(f"seed must be 32 bytes, got {len(seed)}")
    return seed


class Identity:
    """A twin's account (signing) key.

    key_type: "ed25519" | "sr25519"; account: 32-byte public key (the twin's account key).
    Build with `from_mnemonic` or `from_seed`; `sign(message)` -> 65-byte typed signature.
    """

    def __init__(self, seed: bytes, key_type: str = "sr25519"):
        if key_type not in KEY_TYPES:
            raise ValueError(f"unknown key type {key_type!r} (expected ed25519 or sr25519)")
        self.key_type = key_type
        self._seed = _seed_bytes(seed)
        if key_type == "sr25519":
            pub, priv = sr25519.pair_from_seed(self._seed)
            self._pair = (bytes(pub), bytes(priv))
            self.account = bytes(pub)
        else:
            self._ed = Ed25519PrivateKey.from_private_bytes(self._seed)
            self.account = self._ed.public_key().public_bytes(
                serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    @classmethod
    def from_mnemonic(cls, mnemonic: str, key_type: str = "sr25519") -> "Identity":
        """Key from a BIP-39 mnemonic via the substrate mini-secret (no derivation path).
        Raises ValueError for a bad mnemonic or key type."""
        return cls(mini_secret(mnemonic), key_type)

    @classmethod
    def from_seed(cls, seed: bytes | str, key_type: str = "sr25519") -> "Identity":
        """Key from a 32-byte seed (bytes, or hex with optional 0x). Raises ValueError."""
        return cls(_seed_bytes(seed), key_type)

    @classmethod
    def from_secret(cls, secret: str, key_type: str = "sr25519") -> "Identity":
        """rmb-peer's secret argument: "0x" + 64 hex chars = seed, anything else = mnemonic
        (as rmb-rs `--mnemonic`/`--seed`). Raises ValueError."""
        if secret.strip().startswith(("0x", "0X")):
            return cls.from_seed(secret.strip(), key_type)
        return cls.from_mnemonic(secret, key_type)

    @property
    def type_byte(self) -> bytes:
        """b"e" or b"s"."""
        return KEY_TYPES[self.key_type]

    def sign_raw(self, message: bytes) -> bytes:
        """64-byte signature over `message` (no type byte)."""
        if self.key_type == "sr25519":
            return bytes(sr25519.sign(self._pair, bytes(message)))
        return self._ed.sign(bytes(message))

    def sign(self, message: bytes) -> bytes:
        """65-byte typed signature: type byte + 64-byte signature (DESIGN.md section 3)."""
        return self.type_byte + self.sign_raw(message)

    def __repr__(self) -> str:
        return f"Identity({self.key_type}, account={self.account.hex()})"


def verify_typed(account: bytes, message: bytes, signature: bytes) -> None:
    """Verify a 65-byte typed signature over `message` with the 32-byte `account` key.

    The type byte picks the scheme (b"e" ed25519, b"s" sr25519 with context "substrate").
    Raises SignatureError: "bad signature length N", "unknown signature type 0x..",
    "bad account key length N", or "invalid <type> signature"."""
    signature = bytes(signature or b"")
    account = bytes(account or b"")
    if len(signature) != SIGNATURE_LENGTH:
        raise SignatureError(f"bad signature length {len(signature)} (expected {SIGNATURE_LENGTH})")
    if len(account) != 32:
        raise SignatureError(f"bad account key length {len(account)} (expected 32)")
    kind = _TYPE_OF_BYTE.get(signature[:1])
    if kind is None:
        raise SignatureError(f"unknown signature type 0x{signature[0]:02x}")
    raw = signature[1:]
    if kind == "sr25519":
        try:
            ok = sr25519.verify(raw, bytes(message), account)
        except Exception:  # malformed point/scalar in the binding
            ok = False
        if not ok:
            raise SignatureError("invalid sr25519 signature")
    else:
        try:
            Ed25519PublicKey.from_public_bytes(account).verify(raw, bytes(message))
        except (InvalidSignature, ValueError):
            raise SignatureError("invalid ed25519 signature") from None


class E2EKey:
    """secp256k1 key for end-to-end encryption (coincurve).

    pk: 33-byte compressed public key (the twin's published `pk`).
    Secret = first 32 bytes of the substrate mini-secret (from_mnemonic) or the 32-byte seed.
    """

    def __init__(self, secret: bytes):
        secret = _seed_bytes(secret)
        try:
            self._sk = coincurve.PrivateKey(secret)
        except ValueError as exc:
            raise ValueError(f"invalid secp256k1 secret: {exc}") from None
        self.pk = self._sk.public_key.format(compressed=True)

    @classmethod
    def from_mnemonic(cls, mnemonic: str) -> "E2EKey":
        return cls(mini_secret(mnemonic)[:32])

    @classmethod
    def from_seed(cls, seed: bytes | str) -> "E2EKey":
        return cls(_seed_bytes(seed))

    @classmethod
    def from_secret(cls, secret: str) -> "E2EKey":
        """"0x"-hex seed (used directly as the secp256k1 secret) or mnemonic (rmb-rs
        `peer/e2e` Pair::from_str). Raises ValueError."""
        if secret.strip().startswith(("0x", "0X")):
            return cls.from_seed(secret.strip())
        return cls.from_mnemonic(secret)

    def shared_key(self, peer_pk: bytes) -> bytes:
        """sha256 of the 32-byte x-coordinate of ECDH(sk, peer_pk) (DESIGN.md section 3).
        Raises ValueError for a malformed peer public key."""
        point = coincurve.PublicKey(bytes(peer_pk)).multiply(self._sk.secret)
        x = point.format(compressed=True)[1:33]
        return hashlib.sha256(x).digest()

    def __repr__(self) -> str:
        return f"E2EKey(pk={self.pk.hex()})"
