"""Golden bytes of REMP's own wire objects: what goes on the wire between validators and into
their journals must not change when the codecs move or are rewritten. The expected values
were taken from the codecs as they were inside the cores; a mismatch here means a wire
format change, which breaks interoperation with running nodes and stored journals."""
from __future__ import annotations

import hashlib

import pytest

from remp_node.errors import RempLocalError
from remp_node.wire import node_tl as n

MSG = n.BlockMessage(bytes(range(32)), bytes(range(1, 33)), bytes(range(2, 34)), b"boc-bytes!")
MSG_HEX = ("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
           "0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20"
           "02030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f2021"
           "0a626f632d62797465732100")


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_shard_payload_bytes():
    p = n.ShardPayload(7, 1700000000123, bytes(range(3, 35)), (MSG, MSG))
    data = n.encode_shard_payload(p)
    assert data[:4].hex() == "97ab13fd"                      # remp.node.shardBlock
    assert data[4:16].hex() == "07000000" "7b68e5cf8b010000"  # session, gen_utime_ms
    assert data[48:52].hex() == "02000000"                   # two messages
    assert data[52:52 + len(MSG_HEX) // 2].hex() == MSG_HEX
    assert (len(data), _sha(data)) == (268, "20e31990acd84acb57bb6bf6b9132b9dd03acc267649aa13fed6b8009359f11b")
    assert n.decode_shard_payload(data) == p


def test_master_block_bytes():
    p = n.MasterPayload(9, 1700000000456, (b"commit-a", b"c" * 300), (MSG,))
    data = n.encode_master_block(p)
    assert data[:4].hex() == "93f4ddec"                      # remp.node.masterBlock
    assert data.endswith(bytes.fromhex("01000000" + MSG_HEX))
    assert (len(data), _sha(data)) == (448, "8fefb821e2c2bdbd4803b59c0e98f4685749702b2cce59fc7e143d3568519ed5")
    assert n.decode_master_block(data) == p


def test_master_ref_and_commit_need_bodies():
    segs = [b"lit", n.CommitRef(bytes(range(4, 36))), b""]
    body = n.encode_refs(segs)
    assert body.hex() == ("03000000" "00000000" "036c6974" "01000000"
                          "0405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20212223"
                          "00000000" "00000000")
    assert n.decode_refs(body) == segs
    hashes = [bytes([1]) * 32, bytes([2]) * 32]
    need = n.encode_commit_need(hashes)
    assert need == bytes.fromhex("02000000") + hashes[0] + hashes[1]
    assert n.decode_commit_need(need) == hashes
    with pytest.raises(n.PayloadError):
        n.decode_commit_need(need[:-1])


def test_channel_prefix():
    d = n.mux(n.CH_RMQ, bytes(range(5, 37)), b"xyz")
    assert d.hex() == "02" "05060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f2021222324" "78797a"
    assert n.demux(d) == (n.CH_RMQ, bytes(range(5, 37)), b"xyz")
    assert (n.CH_CLIENT, n.CH_RMQ, n.CH_SHARD, n.CH_MASTER, n.CH_ANNOUNCE, n.CH_MASTER_REF,
            n.CH_COMMIT_NEED) == (1, 2, 3, 4, 5, 6, 7)
    with pytest.raises(RempLocalError):
        n.mux(n.CH_RMQ, b"short", b"")


def test_catchain_datagrams():
    from remp_node.wire import catchain_tl as c
    left = c.Dep(1, 2, bytes(range(32)), bytes(64))
    right = c.Dep(1, 2, bytes(range(1, 33)), b"\x01" * 64)
    assert c.pack_get_difference([3, -1, 0]).hex() == "d8ce6cd0" "03000000" "03000000ffffffff00000000"
    assert c.pack_difference([3, -1, 0]).hex() == "cad11514" "03000000" "03000000ffffffff00000000"
    assert c.pack_get_block(bytes(range(32))).hex() == "78dd3d09" + bytes(range(32)).hex()
    assert c.pack_block_not_found().hex() == "840811b6"
    assert c.pack_block_update(b"body").hex() == "c4586723626f6479"
    assert c.pack_block_result(b"body").hex() == "47302a9d626f6479"
    fork = c.pack_difference_fork(left, right)
    assert (len(fork), _sha(fork)) == (220, "672d2e4d01c8778ab0995974f77cdf54d1414aafa336474879b8f2923bcfd35a")
    assert c.read_fork_proof(c.pack_fork_proof(left, right)) == (left, right)
    assert c.record_size(b"abc") == 4 and c.record_size(b"abcd") == 8


def test_payload_kinds_by_first_bytes():
    from remp_node.wire.batches import RECEIPT_BATCH, RECEIPT_BATCH_ACK
    from remp_node.wire.tl import REMP_MESSAGE, REMP_SIGNED_RECEIPT, pack_id
    sid = bytes(range(32))
    for cid, kind in ((REMP_MESSAGE, "client_message"), (REMP_SIGNED_RECEIPT, "receipt"),
                      (RECEIPT_BATCH, "receipt_batch"), (RECEIPT_BATCH_ACK, "receipt_ack")):
        body = pack_id(cid) + b"rest"
        assert n.classify(body) == kind and n.unwrap(body) == body
        assert n.classify(n.mux(n.CH_CLIENT, n.ZERO32, body)) == kind
        assert n.unwrap(n.mux(n.CH_CLIENT, n.ZERO32, body)) == body
    assert n.classify(n.mux(n.CH_RMQ, sid, b"x")) == "validator_mux"
    assert n.classify(n.mux(n.CH_CLIENT, n.ZERO32, b"\x00\x00\x00\x00")) == "validator_mux"
    assert n.classify(b"\x00" * 40) == "unknown" and n.classify(b"") == "unknown"
    assert set(n.KINDS) == {"client_message", "receipt", "receipt_batch", "receipt_ack", "validator_mux", "unknown"}


def test_rmq_records_fetch_and_session_id():
    from remp_node.wire import rmq_tl as q
    head = ("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
            "0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20" "05000000"
            "02030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f2021")
    msg = q.Record(bytes(range(32)), bytes(range(1, 33)), 5, bytes(range(2, 34)), b"boc!")
    digest = q.Record(bytes(range(32)), bytes(range(1, 33)), 5, bytes(range(2, 34)), None, True)
    assert msg.pack().hex() == "aed060f9" + head + "04626f6321000000"
    assert digest.pack().hex() == "96fb7846" + head + "01000000"
    assert q.decode_record(msg.pack()) == msg and q.decode_record(digest.pack()) == digest
    ids = [bytes(range(32)), bytes(32)]
    query = q.encode_query(ids)
    assert query.hex() == "01" "06c46581" "02000000" + ids[0].hex() + ids[1].hex()
    assert q.decode_query(query[1:]) == ids
    resp = q.encode_response([b"a", b"bcdef"])
    assert resp.hex() == "02" "761fda2f" "02000000" "01610000" "0562636465660000"
    assert q.decode_response(resp[1:]) == [b"a", b"bcdef"]
    assert q.rmq_session_id(0, -0x8000000000000000, 3, ids).hex() == \
        "890a83f879f8e8fb2b0f73cc3eea713e43b87ad53776b4e52287c84f84af44cf"


def test_group_seed_hash_input():
    from remp_node.core.schedule import group_seed
    assert group_seed(4, bytes(range(32)), 0, -0x8000000000000000).hex() == \
        "e7cc04c56dc635c9400506cfb6855a0b2b8b1b83bc13da5bbb21303dca4c816f"
    assert hashlib.sha256(n.pack_group_seed(bytes(range(32)), 4, 0, -0x8000000000000000)).hexdigest() == \
        "e7cc04c56dc635c9400506cfb6855a0b2b8b1b83bc13da5bbb21303dca4c816f"


def test_wallet_message_boc():
    from remp_node.wire import wallet
    from remp_node.wire.keys import NodeKey
    key = NodeKey.from_seed(bytes(range(32)))
    src, dst = wallet.wallet_address(key.public, 0), wallet.wallet_address(bytes(32), -1)
    assert src == "0:56475aa75463474c0285df5dbf2bcab73da651358839e9b77481b2eab107708c"
    assert dst == "-1:66687aadf862bd776c8fc18b8e9f8e20089714856ee233b3902a591d0d5f2925"
    boc = wallet.make_wallet_message(key, src, dst, 12345, 1700000000, 7)
    assert (len(boc), _sha(boc)) == (159, "2675dce8d2278016ff886f3022dc9d4fa5f12916389fce0525bd38107075aecd")
    body = wallet.build_wallet_body(key, dst, 12345, 1700000000, 7)
    assert body.hash.hex() == "7d82b14dd855bfefd005c8212259e2a41ec7fd0d654e637e80e564ec5748c260"
    tr = wallet.decode_wallet_body(body)
    assert (tr.valid_until, tr.nonce, tr.dest, tr.amount) == (1700000000, 7, dst, 12345)
