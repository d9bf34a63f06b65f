"""Marlin wire formats and crypto (seed: marlin-data.txt "Data Format"; DESIGN.md section 5):
exact layouts, keccak256 / address vectors, signature recovery, size limits, and a
hypothesis fuzz test that only the documented remote error escapes the parsers and cores."""
from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marlin_cluster.cluster import ClusterMemberCore
from marlin_cluster.consumer import ConsumerCore
from marlin_cluster.crypto import (BadSignature, NodeKey, address_of, keccak256, recover_address,
                                   recover_signer)
from marlin_cluster.membership import Membership, MembershipError, cluster_options
from marlin_cluster.params import ChannelParams, MarlinConfigError, Params
from marlin_cluster.producer import ProducerCore
from marlin_cluster.wire import (ACK_LEN, ATTESTATION_LEN, KIND_ACK, KIND_ATTESTED_CHUNK, KIND_CHUNK,
                                 HELLO_ACCEPTOR, HELLO_DIALLER, KIND_HELLO, KIND_HELLO_PROOF, KIND_HELLO_REPLY,
                                 SIGNED_ATTESTATION_LEN, WITNESS_LEN, Ack, Hello, HelloReply, hello_signed_data,
                                 parse_hello_proof, parse_hello_reply,
                                 MarlinLocalError, MarlinWireError, decode_frame, encode_chunk_message,
                                 encode_frame, make_attestation, parse_ack, parse_attestation,
                                 parse_chunk_message, parse_hello, peek_chunk_ids, signed_attestation_data)

# Well-known vectors: keccak256("") and the address of secret 0x...01 (Ethereum).
KECCAK_EMPTY = "c5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470"
ADDRESS_OF_ONE = "7e5f4552091a69125d5dfcb7b8c2659029395bdf"


def test_keccak256_is_not_sha3_and_addresses_are_ethereum_style():
    assert keccak256(b"").hex() == KECCAK_EMPTY
    assert keccak256(b"") != hashlib.sha3_256(b"").digest()
    k = NodeKey.from_secret((1).to_bytes(32, "big"))
    assert k.address.hex() == ADDRESS_OF_ONE
    assert len(k.public_key) == 65 and k.public_key[0] == 4
    assert address_of(k.public_key) == k.address


def test_recoverable_signatures_use_keccak_and_recover_the_signer():
    k = NodeKey.generate()
    sig = k.sign(b"marlin")
    assert len(sig) == 65 and sig[64] in (0, 1)
    assert recover_signer(b"marlin", sig) == k.address
    assert recover_address(keccak256(b"marlin"), sig) == k.address       # signs keccak256(data)
    assert recover_address(hashlib.sha256(b"marlin").digest(), sig) != k.address
    assert recover_address(keccak256(b"x"), k.sign_recoverable(keccak256(b"x"))) == k.address
    with pytest.raises(BadSignature):
        recover_address(keccak256(b"x"), sig[:64] + b"\x07")
    with pytest.raises(BadSignature):
        recover_address(keccak256(b"x"), b"\0" * 65)
    with pytest.raises(MarlinLocalError):
        NodeKey.from_secret(b"\0" * 32)
    assert not isinstance(MarlinLocalError("x"), ValueError)
    assert isinstance(BadSignature("x"), ValueError)


def test_attestation_layout_matches_the_seed():
    sig = bytes(range(65))
    att = make_attestation(0x01020304, 0x0506, 0x0708, 0x090A0B0C, 0x0D0E0F10, sig)
    wire = att.wire()
    assert len(wire) == ATTESTATION_LEN == 4 + 2 + 2 + 4 + 4 + 65
    assert wire[:16] == bytes.fromhex("01020304" "0506" "0708" "090a0b0c" "0d0e0f10") and wire[16:] == sig
    assert parse_attestation(wire) == att
    chash = bytes([0xAA]) * 32
    signed = att.signed_data(0x11121314, chash)
    # Message Id 4 | Channel Id 2 | Chunk Id 2 | Timestamp 4 | Chunk Length 4 | Stake Offset 4 | Chunk Hash 32
    assert len(signed) == SIGNED_ATTESTATION_LEN == 52
    assert signed == bytes.fromhex("01020304" "0506" "0708" "090a0b0c" "11121314" "0d0e0f10") + chash
    with pytest.raises(MarlinLocalError):
        make_attestation(1 << 32, 0, 0, 0, 0, sig)


def test_chunk_message_layout_and_witness_over_the_message_hash():
    producer, member = NodeKey.generate(), NodeKey.generate()
    chunk = b"chunk-bytes" * 10
    signed = signed_attestation_data(7, 1, 3, 1000, len(chunk), 99, keccak256(chunk))
    att = make_attestation(7, 1, 3, 1000, 99, producer.sign(signed))
    witness = member.sign_recoverable(keccak256(att.wire(), chunk))
    frame = encode_chunk_message(att.wire(), witness, chunk)
    # | kind | Attestation 81 | Witness 65 | Chunk |
    assert frame[0] == KIND_CHUNK and frame[1:82] == att.wire() and frame[82:147] == witness
    assert frame[147:] == chunk
    kind, body = decode_frame(frame)
    assert peek_chunk_ids(body) == (7, 1, 3)
    msg = parse_chunk_message(body, witnessed=True, max_chunk=len(chunk))
    assert (msg.attestation, msg.witness, msg.chunk, msg.key) == (att, witness, chunk, (7, 3))
    assert recover_signer(msg.attestation.signed_data(len(msg.chunk), keccak256(msg.chunk)),
                          msg.attestation.signature) == producer.address
    assert recover_address(keccak256(msg.attestation_wire, msg.chunk), msg.witness) == member.address
    # a producer's frame has no witness
    pframe = encode_chunk_message(att.wire(), None, chunk)
    assert pframe[0] == KIND_ATTESTED_CHUNK and len(pframe) == 1 + ATTESTATION_LEN + len(chunk)
    assert parse_chunk_message(decode_frame(pframe)[1], witnessed=False, max_chunk=1000).witness is None
    with pytest.raises(MarlinWireError) as e:
        parse_chunk_message(body, witnessed=True, max_chunk=len(chunk) - 1)
    assert e.value.reason == "oversized"
    with pytest.raises(MarlinWireError) as e:
        parse_chunk_message(body[: ATTESTATION_LEN + WITNESS_LEN], witnessed=True, max_chunk=1000)
    assert e.value.reason == "truncated"


def test_acknowledgement_layout_matches_the_seed():
    member = NodeKey.generate()
    producer = bytes(range(20))
    unsigned = Ack(0xA1A2A3A4, 0xB1B2, 0xC1C2, 0xD1D2D3D4, producer, b"")
    ack = Ack(0xA1A2A3A4, 0xB1B2, 0xC1C2, 0xD1D2D3D4, producer, member.sign(unsigned.signed_data()))
    wire = ack.wire()
    # Message Id 4 | Chunk Id 2 | Cluster Id 2 | Timestamp 4 | Producer Id 20 | Cluster Member Sign 65
    assert len(wire) == ACK_LEN == 97
    assert wire[:12] == bytes.fromhex("a1a2a3a4" "b1b2" "c1c2" "d1d2d3d4") and wire[12:32] == producer
    assert parse_ack(wire) == ack
    assert recover_signer(wire[:32], wire[32:]) == member.address
    for bad in (wire[:-1], wire + b"\0"):
        with pytest.raises(MarlinWireError):
            parse_ack(bad)


def test_frames_hello_and_limits():
    assert decode_frame(encode_frame(KIND_ACK, b"abc"))[0] == KIND_ACK
    assert bytes(decode_frame(encode_frame(KIND_ACK, b"abc"))[1]) == b"abc"
    for frame, reason in ((b"", "truncated"), (b"\x63abc", "unknown_kind"), (b"\x01" + b"\0" * 100, "oversized")):
        with pytest.raises(MarlinWireError) as e:
            decode_frame(frame, max_size=50)
        assert e.value.reason == reason
    with pytest.raises(MarlinLocalError):
        encode_frame(99, b"")
    k, other = NodeKey.generate(), NodeKey.generate()
    h = Hello(k.address, bytes(range(32)))
    assert len(h.wire()) == 52 and parse_hello(decode_frame(encode_frame(KIND_HELLO, h.wire()))[1]) == h
    signed = hello_signed_data(HELLO_ACCEPTOR, other.address, k.address, h.nonce)
    assert signed == b"marlin-hello" + b"A" + other.address + k.address + h.nonce
    r = HelloReply(other.address, bytes(32), other.sign(signed))
    parsed = parse_hello_reply(decode_frame(encode_frame(KIND_HELLO_REPLY, r.wire()))[1])
    assert parsed == r and len(r.wire()) == 117 and recover_signer(signed, parsed.signature) == other.address
    # the dialler's signature over the same fields is not the acceptor's (role byte, order)
    assert hello_signed_data(HELLO_DIALLER, other.address, k.address, h.nonce) != signed
    proof = k.sign(hello_signed_data(HELLO_DIALLER, k.address, other.address, r.nonce))
    assert parse_hello_proof(decode_frame(encode_frame(KIND_HELLO_PROOF, proof))[1]) == proof
    for bad in (b"", b"x" * 51, b"x" * 53):
        with pytest.raises(MarlinWireError):
            parse_hello(bad)
    for bad in (b"x" * 116, b"x" * 118):
        with pytest.raises(MarlinWireError):
            parse_hello_reply(bad)
    with pytest.raises(MarlinLocalError):
        hello_signed_data(b"X", k.address, other.address, h.nonce)


def test_cluster_options_are_the_closest_ids_to_the_hash():
    ids = sorted([5, 900, 20000, 40000, 65000])
    for mid in range(50):
        for cid in range(4):
            point = int.from_bytes(keccak256(struct.pack(">IH", mid, cid))[:2], "big")
            got = cluster_options(mid, cid, ids, 3)
            want = sorted(ids, key=lambda c: (abs(c - point), c))[:3]
            assert sorted(got) == sorted(want) and got[0] == want[0]
    assert cluster_options(1, 1, [7], 3) == [7]


def test_membership_checks_keys_and_round_trips():
    p, m1, m2, c = (NodeKey.generate() for _ in range(4))
    ms = Membership(producers={p.address: p.public_key}, clusters={3: [m1.address, m2.address]},
                    members={m1.address: m1.public_key, m2.address: m2.public_key},
                    consumers={c.address: c.public_key})
    assert Membership.from_dict(ms.to_dict()).to_dict() == ms.to_dict()
    assert ms.is_member(m1.address, 3) and not ms.is_member(p.address) and ms.is_producer(p.address)
    with pytest.raises(MembershipError):
        Membership(producers={m1.address: p.public_key}, clusters={}, members={})
    with pytest.raises(MembershipError):
        Membership(producers={}, clusters={1: [m1.address]}, members={})
    assert not isinstance(MembershipError("x"), ValueError)


def test_params_defaults_and_config():
    p = Params()
    assert p.channel(1).num_chunks == 12 and p.channel(1).min_chunks == 8
    assert Params.from_dict(p.to_dict()) == p
    q = Params.from_dict({"no_of_cluster_options": 3, "channels": {"7": {"num_chunks": 32, "min_chunks": 16}}})
    assert q.channel(7).min_chunks == 16 and q.no_of_cluster_options == 3
    for bad in ({"channels": {"1": {"num_chunks": 8, "min_chunks": 8}}}, {"stake_budget": (1 << 32) + 1},
                {"tolerable_latency": 0}, {"nope": 1}, {"channels": {"1": {"num_chunks": 40, "min_chunks": 8}}}):
        with pytest.raises(MarlinConfigError):
            Params.from_dict(bad)
    with pytest.raises(MarlinConfigError):
        p.channel(999)
    assert p.max_frame > ChannelParams().max_block // 8


PARSERS = [
    lambda b: parse_attestation(b),
    lambda b: parse_ack(b),
    lambda b: parse_hello(b),
    lambda b: parse_hello_reply(b),
    lambda b: parse_hello_proof(b),
    lambda b: peek_chunk_ids(b),
    lambda b: parse_chunk_message(b, witnessed=True, max_chunk=4096),
    lambda b: parse_chunk_message(b, witnessed=False, max_chunk=4096),
    lambda b: decode_frame(b, max_size=4096),
]

_KEYS = [NodeKey.from_secret(keccak256(bytes([i]))) for i in range(5)]
_MS = Membership(producers={_KEYS[0].address: _KEYS[0].public_key},
                 clusters={1: [_KEYS[1].address, _KEYS[2].address]},
                 members={k.address: k.public_key for k in _KEYS[1:3]},
                 consumers={_KEYS[3].address: _KEYS[3].public_key})
_PARAMS = Params(channels={0: ChannelParams(num_chunks=4, min_chunks=2, max_block=4096)})


def _frames():
    """Random bytes, and mutations of well-formed frames (so fuzzing gets past the headers)."""
    good = []
    chunk = b"x" * 100
    signed = signed_attestation_data(1, 0, 1, 1_800_000_000, len(chunk), 0, keccak256(chunk))
    att = make_attestation(1, 0, 1, 1_800_000_000, 0, _KEYS[0].sign(signed))
    good.append(encode_chunk_message(att.wire(), None, chunk))
    good.append(encode_chunk_message(att.wire(), _KEYS[1].sign_recoverable(keccak256(att.wire(), chunk)), chunk))
    good.append(encode_frame(KIND_ACK, Ack(1, 1, 1, 5, _KEYS[0].address, b"\1" * 65).wire()))
    mutated = st.tuples(st.sampled_from(good), st.integers(0, 400), st.binary(max_size=8), st.integers(0, 400)).map(
        lambda t: t[0][:t[1]] + t[2] + t[0][t[1] + len(t[2]):][: t[3] + 300])
    return st.one_of(st.binary(max_size=600), mutated)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_frames())
def test_fuzz_parsers_raise_only_the_remote_error(data):
    for parse in PARSERS:
        try:
            parse(data)
        except MarlinWireError:
            pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_frames(), src=st.sampled_from([k.address for k in _KEYS] + [b"\0" * 20]))
def test_fuzz_cores_never_raise_on_remote_bytes(data, src):
    now = 1_800_000_001.0
    cores = [ProducerCore(_KEYS[0], _MS, _PARAMS), ClusterMemberCore(_KEYS[1], _MS, _PARAMS, 1),
             ClusterMemberCore(_KEYS[2], _MS, _PARAMS, 1), ConsumerCore(_KEYS[3], _MS, _PARAMS)]
    for core in cores:
        core.receive_frame(data, src, now)      # never raises: refused frames become events + counts
        core.frames_to_send(now)
        while core.next_event() is not None:
            pass
