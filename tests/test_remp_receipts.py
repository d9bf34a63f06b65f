"""Receipts: TL and JSON round trips for every status kind, kind<->status bijection,
signature verification and forgery detection (DESIGN.md section 4; seed remp-protocol-b)."""
import json

import pytest

from remp_node.wire.keys import NodeKey
from remp_node.wire.receipts import (
    FINAL_KINDS, KIND_NAMES, KINDS, Accepted, Duplicate, Ignored, Level, New, Receipt,
    ReceiptError, Rejected, SentToValidators, SignedReceipt, Timeout, from_json, is_final,
    is_source_final, kind_of, level_of_kind, make_signed_receipt, sign_receipt, to_json,
    verify_receipt_json,
)
from remp_node.wire.tl import ZERO_BLOCK_ID, BlockIdExt

SHARD_BLOCK = BlockIdExt(0, 0x4000000000000000, 123, bytes(range(32)), bytes(range(32, 64)))
MC_BLOCK = BlockIdExt(-1, 0x8000000000000000, 234, b"\x11" * 32, b"\x22" * 32)
MSG_ID = bytes.fromhex("16923245c4bd57762330e454926a81dcb45626b433121c51804075b3cc26984e")


def every_status():
    out = [SentToValidators(4, 5), New(), Duplicate(SHARD_BLOCK), Timeout()]
    for lvl in Level:
        out.append(Rejected(lvl, SHARD_BLOCK if lvl >= Level.COLLATOR else ZERO_BLOCK_ID,
                            f"error at {lvl.name}: Contract rejected message with error code 52"))
        out.append(Ignored(lvl, SHARD_BLOCK))
        out.append(Accepted(lvl, SHARD_BLOCK, MC_BLOCK if lvl == Level.MASTERCHAIN else ZERO_BLOCK_ID))
    return out


KEY = NodeKey.from_seed(b"\x07" * 32)
OTHER = NodeKey.from_seed(b"\x08" * 32)


def test_kind_mapping_is_total_bijection():
    statuses = every_status()
    kinds = {kind_of(s) for s in statuses}
    assert kinds == set(KINDS) and len(KINDS) == len(KIND_NAMES) == 19
    for name in ["RejectedByFullnode", "PutIntoQueue", "AcceptedByQueue", "RejectedByQueue",
                 "Duplicate", "IncludedIntoBlock", "RejectedByCollator", "IgnoredByCollator",
                 "IncludedIntoAcceptedBlock", "RejectedByShardchain", "IgnoredByShardchain",
                 "Finalized", "IgnoredByMasterchain", "Timeout", "SentToValidators"]:
        assert name in KINDS, name
    assert kind_of(Accepted(Level.MASTERCHAIN, SHARD_BLOCK, MC_BLOCK)) == "Finalized"
    assert kind_of(Accepted(Level.COLLATOR, SHARD_BLOCK)) == "IncludedIntoBlock"
    assert level_of_kind("PutIntoQueue") == Level.QUEUE
    assert level_of_kind("SentToValidators") == Level.FULLNODE
    assert level_of_kind("Finalized") == Level.MASTERCHAIN


def test_levels_are_ordered():
    assert Level.FULLNODE < Level.QUEUE < Level.COLLATOR < Level.SHARDCHAIN < Level.MASTERCHAIN
    assert [int(lvl) for lvl in Level] == [0, 1, 2, 3, 4]


def test_final_kinds():
    assert FINAL_KINDS == {"Finalized", "RejectedByFullnode"}
    assert is_final("Finalized") and not is_final("IncludedIntoAcceptedBlock")
    assert is_source_final("RejectedByCollator") and is_source_final("Timeout")
    assert not is_source_final("IgnoredByCollator") and not is_source_final("PutIntoQueue")


@pytest.mark.parametrize("status", every_status(), ids=lambda s: kind_of(s))
def test_tl_round_trip(status):
    r = Receipt(MSG_ID, status, 1632750383000, KEY.key_id)
    data = r.serialize()
    assert data[:4] == (0x3122B7A2).to_bytes(4, "little")
    assert data[4:36] == MSG_ID
    assert data[36:40] == status.constructor.to_bytes(4, "little")
    assert Receipt.parse(data) == r
    signed = sign_receipt(r, KEY)
    wire = signed.serialize()
    assert wire[:4] == (0xB361C8DD).to_bytes(4, "little")
    back = SignedReceipt.parse(wire)
    assert back == signed and back.verify([OTHER.public, KEY.public]) == r


@pytest.mark.parametrize("status", every_status(), ids=lambda s: kind_of(s))
def test_json_round_trip(status):
    signed = make_signed_receipt(KEY, MSG_ID, status, 1632750383000)
    obj = json.loads(json.dumps(to_json(signed.open(), signed.signature)))
    assert obj["kind"] == kind_of(status)
    assert obj["message_id"] == MSG_ID.hex() and obj["source_id"] == KEY.key_id.hex()
    assert obj["timestamp"] == 1632750383000
    receipt, sig = from_json(obj)
    assert receipt == signed.open() and sig == signed.signature
    assert verify_receipt_json(obj, [KEY.public]) == receipt


def test_json_shape_matches_seed():
    signed = make_signed_receipt(KEY, MSG_ID, Accepted(Level.MASTERCHAIN, SHARD_BLOCK, MC_BLOCK), 1)
    obj = to_json(signed.open(), signed.signature)
    assert obj["shard"] == "4000000000000000" and obj["wc"] == 0 and obj["block_seqno"] == 123
    assert obj["block_id"] == SHARD_BLOCK.root_hash.hex()
    assert obj["block_file_hash"] == SHARD_BLOCK.file_hash.hex()
    assert obj["mc_block_id"] == MC_BLOCK.root_hash.hex() and obj["mc_block_seqno"] == 234
    s2 = make_signed_receipt(KEY, MSG_ID, SentToValidators(4, 5), 1)
    o2 = to_json(s2.open(), s2.signature)
    assert (o2["sent_to"], o2["total_validators"]) == (4, 5) and "block_id" not in o2


def test_seed_rejected_by_fullnode_without_block_fields_and_hex_signature():
    signed = make_signed_receipt(KEY, MSG_ID, Rejected(Level.FULLNODE, ZERO_BLOCK_ID, "Can't deserialize message"), 5)
    obj = {"kind": "RejectedByFullnode", "message_id": MSG_ID.hex(), "timestamp": 5,
           "source_id": KEY.key_id.hex(), "signature": signed.signature.hex(),
           "error": "Can't deserialize message"}
    assert verify_receipt_json(obj, [KEY.public]).status.error == "Can't deserialize message"


def _signed_json(status=None, key=KEY):
    signed = make_signed_receipt(key, MSG_ID, status or Accepted(Level.COLLATOR, SHARD_BLOCK), 1000)
    return to_json(signed.open(), signed.signature)


def test_forged_status_fails():
    obj = _signed_json()
    obj["kind"] = "IncludedIntoAcceptedBlock"
    with pytest.raises(ReceiptError) as e:
        verify_receipt_json(obj, [KEY.public])
    assert e.value.reason == "bad_signature"


def test_forged_message_id_fails():
    obj = _signed_json()
    obj["message_id"] = "00" + obj["message_id"][2:]
    with pytest.raises(ReceiptError) as e:
        verify_receipt_json(obj, [KEY.public])
    assert e.value.reason == "bad_signature"


def test_forged_block_and_timestamp_fail():
    for field, value in (("block_seqno", 124), ("timestamp", 1001), ("shard", "c000000000000000")):
        obj = _signed_json()
        obj[field] = value
        with pytest.raises(ReceiptError) as e:
            verify_receipt_json(obj, [KEY.public])
        assert e.value.reason == "bad_signature", field


def test_wrong_source_fails():
    obj = _signed_json()
    with pytest.raises(ReceiptError) as e:
        verify_receipt_json(obj, [OTHER.public])
    assert e.value.reason == "unknown_source"
    obj["source_id"] = OTHER.key_id.hex()  # claims OTHER, signed by KEY
    with pytest.raises(ReceiptError) as e:
        verify_receipt_json(obj, [KEY.public, OTHER.public])
    assert e.value.reason == "bad_signature"


def test_bad_signature_fails():
    obj = _signed_json()
    sig = bytearray(from_json(obj)[1])
    sig[0] ^= 1
    obj["signature"] = bytes(sig).hex()
    with pytest.raises(ReceiptError) as e:
        verify_receipt_json(obj, [KEY.public])
    assert e.value.reason == "bad_signature"


@pytest.mark.parametrize("mutate,needle", [
    (lambda o: o.pop("message_id"), "missing field 'message_id'"),
    (lambda o: o.update(kind="AcceptedByMoon"), "unknown receipt kind"),
    (lambda o: o.update(shard="40"), "16 hex digits"),
    (lambda o: o.update(signature="!!"), "signature"),
    (lambda o: o.update(timestamp="1000"), "'timestamp' has type str"),
    (lambda o: o.update(source_id="ab" * 31), "32 bytes"),
])
def test_malformed_json(mutate, needle):
    obj = _signed_json()
    mutate(obj)
    with pytest.raises(ReceiptError) as e:
        verify_receipt_json(obj, [KEY.public])
    assert e.value.reason == "malformed" and needle in str(e.value)


def test_malformed_tl():
    good = sign_receipt(Receipt(MSG_ID, New(), 1, KEY.key_id), KEY).serialize()
    for bad in (good[:-1], good + b"\0", b"\0" * 4 + good[4:], b""):
        with pytest.raises(ReceiptError) as e:
            SignedReceipt.parse(bad)
        assert e.value.reason == "malformed"
    inner = Receipt(MSG_ID, New(), 1, KEY.key_id).serialize()
    broken = inner[:36] + b"\x01\x02\x03\x04" + inner[40:]
    with pytest.raises(ReceiptError, match="unknown tonNode.RempMessageStatus"):
        Receipt.parse(broken)


def test_local_misuse_is_not_receipt_error():
    with pytest.raises(ValueError) as e:
        sign_receipt(Receipt(MSG_ID, New(), 1, OTHER.key_id), KEY)
    assert not isinstance(e.value, ReceiptError)
    with pytest.raises(ValueError):
        Receipt(b"short", New(), 1, KEY.key_id)


def test_accepted_receipt_parses_in_one_unpack_to_the_same_object():
    """Receipts holding an Accepted status (fixed size) take a one-struct path: the same
    Receipt as the constructor builds, every level, zero master id read as
    NO_MASTER_BLOCK_ID, and a bad level constructor still refused."""
    import os as _os
    from remp_node.wire import receipts as R
    from remp_node.wire.tl import BlockIdExt as B, ZERO_BLOCK_ID as Z
    blk = B(0, 0x8000000000000000, 7, _os.urandom(32), _os.urandom(32))
    mc = B(-1, 0x8000000000000000, 9, _os.urandom(32), _os.urandom(32))
    mid, src = _os.urandom(32), _os.urandom(32)
    for st in [R.Accepted(lv, blk) for lv in R.Level] + [R.Accepted(R.Level.MASTERCHAIN, blk, mc),
                                                         R.Accepted(R.Level.QUEUE, Z, Z)]:
        rc = R.Receipt(mid, st, 1_700_000_000_123, src)
        data = rc.serialize()
        got = R.Receipt.parse(data)
        assert got == rc and got.serialize() == data
        assert type(got.status.level) is R.Level and got.status.level is st.level
    assert R.Receipt.parse(R.Receipt(mid, R.Accepted(R.Level.QUEUE, blk, Z), 1, src).serialize()).status.master_id \
        == R.NO_MASTER_BLOCK_ID
    bad = bytearray(R.Receipt(mid, R.Accepted(R.Level.QUEUE, blk), 1, src).serialize())
    bad[40:44] = b"\x01\x02\x03\x04"                  # the level constructor
    with pytest.raises(R.ReceiptError, match="malformed"):
        R.Receipt.parse(bytes(bad))


def test_signed_accepted_receipt_takes_the_slice_path_to_the_same_object():
    """A signed receipt of the fixed Accepted size is read by slicing: the same SignedReceipt
    as the TL reader gives (bytes, signature, verification), for every level; a bad
    constructor, length byte or padding in that size is still refused as malformed."""
    import os as _os
    from remp_node.wire import receipts as R
    blk = BlockIdExt(0, 0x8000000000000000, 7, _os.urandom(32), _os.urandom(32))
    for st in [Accepted(lv, blk) for lv in Level] + [Accepted(Level.MASTERCHAIN, blk, MC_BLOCK)]:
        sr = make_signed_receipt(KEY, MSG_ID, st, 1_700_000_000_123)
        data = sr.serialize()
        assert len(data) == R._SIGNED_ACCEPTED_SIZE
        got = SignedReceipt.parse(data)
        assert got == sr and got.serialize() == data
        assert got.verify([KEY.public]) == sr.open()
    good = make_signed_receipt(KEY, MSG_ID, Accepted(Level.QUEUE, blk), 1).serialize()
    for at, value in ((0, 0), (4, 243), (4 + 1 + 244, 1), (4 + 1 + 246, 7)):
        bad = bytearray(good)
        bad[at] = value
        with pytest.raises(ReceiptError) as e:
            SignedReceipt.parse(bytes(bad))
        assert e.value.reason == "malformed"
