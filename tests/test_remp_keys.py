"""remp_node.wire.keys (libsodium via PyNaCl) against an independent RFC 8032 implementation
(`cryptography`, OpenSSL): same public keys and byte-identical signatures from the same seeds
(ed25519 is deterministic), signatures cross-verify both ways, and bad input is refused."""
import hashlib

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from remp_node.wire import keys
from remp_node.wire.keys import NodeKey


def _ossl(seed: bytes) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(seed)


def test_same_keys_and_signatures_as_openssl():
    for i in range(20):
        seed = hashlib.sha256(b"remp-keys-%d" % i).digest()
        k, o = NodeKey.from_seed(seed), _ossl(seed)
        assert k.public == o.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        assert k.seed() == seed
        for data in (b"", b"x", bytes(range(256)) * (i + 1), b"\x00" * 16384):
            sig = k.sign(data)
            assert len(sig) == 64
            assert sig == o.sign(data)
            assert keys.verify(k.public, data, sig)
            o.public_key().verify(sig, data)          # raises if OpenSSL disagrees


def test_rfc8032_test_vector_1():
    # RFC 8032 section 7.1, TEST 1 (empty message)
    seed = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    k = NodeKey.from_seed(seed)
    assert k.public.hex() == "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
    assert k.sign(b"").hex() == ("e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
                                 "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b")


def test_verify_refuses():
    k, other = NodeKey.generate(), NodeKey.generate()
    data = b"receipt bytes"
    sig = k.sign(data)
    assert keys.verify(k.public, data, sig)
    assert keys.verify(k.public, bytearray(data), memoryview(sig))
    assert not keys.verify(other.public, data, sig)                       # wrong key
    assert not keys.verify(k.public, data + b"!", sig)                    # other data
    assert not keys.verify(k.public, data, sig[:-1] + bytes([sig[-1] ^ 1]))  # flipped bit
    assert not keys.verify(k.public, data, sig[:63])                      # short signature
    assert not keys.verify(k.public[:31], data, sig)                      # short key
    assert not keys.verify(bytes(32), data, sig)                          # small-order key
    assert NodeKey.generate().public != k.public
    try:
        NodeKey.from_seed(b"short")
    except ValueError:
        pass
    else:
        raise AssertionError("a 5-byte seed was accepted")
