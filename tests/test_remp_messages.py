"""External message parsing against real TON mainnet BOCs and the negative samples
(../shared/data/ton, SOURCES.md), RejectedByFullnode reasons, and shard helpers."""
import base64
import json

import pytest
from pytoniq_core import Address, Builder, Cell, MessageAny
from pytoniq_core.tlb.transaction import ExternalMsgInfo

from remp_node.wire.messages import (
    MAX_MESSAGE_SIZE, MessageRejected, parse_external_message, parse_external_message_base64,
    shard_contains, shard_depth, shard_for_account, shard_hex, shard_prefixes,
)


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_all_real_messages_parse(shared_data):
    rows = _lines(shared_data / "ton" / "ext_messages.jsonl")
    assert len(rows) == 50
    ids = set()
    for row in rows:
        msg = parse_external_message(base64.b64decode(row["boc_base64"]))
        assert msg.id.hex() == row["root_hash_hex"]
        assert msg.dst == row["dst"]
        assert msg.size == len(msg.boc) and len(msg.uid) == 32 and msg.uid != msg.id
        assert msg.uid == msg.body.hash
        ids.add(msg.id)
    assert len(ids) == 50


NEGATIVE_EXPECT = {
    "boc_parse_error": ("deserialize", "Can't deserialize message: "),
    "base64_decode_error": ("deserialize", "Can't deserialize message: invalid base64"),
    "not_external_in": ("not_external_in", "Not an inbound external message: "),
}


def test_every_negative_boc_rejected_precisely(shared_data):
    rows = _lines(shared_data / "ton" / "negative_bocs.jsonl")
    assert len(rows) == 13
    seen = {}
    for row in rows:
        with pytest.raises(MessageRejected) as e:
            parse_external_message_base64(row["boc_base64"])
        code, prefix = NEGATIVE_EXPECT[row["expected"]]
        assert e.value.code == code, row["kind"]
        assert e.value.text.startswith(prefix), (row["kind"], e.value.text)
        assert len(e.value.text) > len(prefix), row["kind"]  # says what exactly failed
        seen[row["kind"]] = e.value.text
    assert seen["valid_internal_message"].endswith("internal message")
    assert seen["valid_external_out_message"].endswith("outbound external message")
    assert "not a Message" in seen["tx_boc_not_message"]
    assert "Crc32c" in seen["bad_crc32c"]


def _ext_message(wc: int, body: Cell) -> bytes:
    info = ExternalMsgInfo(src=None, dest=Address((wc, b"\x42" * 32)), import_fee=0)
    return MessageAny(info=info, init=None, body=body).serialize().to_boc()


def test_wrong_workchain():
    boc = _ext_message(-1, Builder().store_uint(7, 32).end_cell())
    with pytest.raises(MessageRejected) as e:
        parse_external_message(boc)
    assert e.value.code == "bad_workchain" and "Wrong workchain -1" in e.value.text
    assert parse_external_message(boc, workchains=(0, -1)).workchain == -1


def test_too_big():
    boc = _ext_message(0, Builder().store_uint(1, 8).end_cell())
    with pytest.raises(MessageRejected) as e:
        parse_external_message(boc + b"\0" * (MAX_MESSAGE_SIZE + 1 - len(boc)))
    assert e.value.code == "too_big" and "65536 bytes > 65535" in e.value.text


def test_too_deep():
    cell = Builder().store_uint(1, 8).end_cell()
    for _ in range(512):
        cell = Builder().store_uint(1, 1).store_ref(cell).end_cell()
    boc = _ext_message(0, cell)
    assert len(boc) <= MAX_MESSAGE_SIZE
    with pytest.raises(MessageRejected) as e:
        parse_external_message(boc)
    assert e.value.code == "too_deep" and ">= 512" in e.value.text
    shallow = Builder().store_uint(1, 8).end_cell()
    for _ in range(500):
        shallow = Builder().store_uint(1, 1).store_ref(shallow).end_cell()
    assert parse_external_message(_ext_message(0, shallow)).workchain == 0


def test_same_body_same_uid_different_id():
    body = Builder().store_uint(99, 64).end_cell()
    a = parse_external_message(_ext_message(0, body))
    info = ExternalMsgInfo(src=None, dest=Address((0, b"\x43" * 32)), import_fee=0)
    b = parse_external_message(MessageAny(info=info, init=None, body=body).serialize().to_boc())
    assert a.uid == b.uid and a.id != b.id


def test_shards():
    assert shard_prefixes(1) == [0x8000000000000000]
    assert shard_prefixes(2) == [0x4000000000000000, 0xC000000000000000]
    assert [shard_depth(s) for s in shard_prefixes(4)] == [2, 2, 2, 2]
    two = shard_prefixes(2)
    assert shard_for_account(b"\x00" + b"\xff" * 31, two) == 0x4000000000000000
    assert shard_for_account(b"\x7f" + b"\xff" * 31, two) == 0x4000000000000000
    assert shard_for_account(b"\x80" + b"\x00" * 31, two) == 0xC000000000000000
    assert shard_contains(0x8000000000000000, b"\xab" * 32)
    four = shard_prefixes(4)
    assert shard_for_account(b"\x5f" + b"\0" * 31, four) == 0x6000000000000000
    assert shard_hex(0x4000000000000000) == "4000000000000000"
    with pytest.raises(ValueError):
        shard_prefixes(3)


def test_one_shard_implementation_behind_messages_and_schedule():
    """messages.py and schedule.py re-export shards.py (one implementation); the split by
    count and by depth agree; invalid input raises ShardError (schedule.shard_of: ScheduleError)."""
    from remp_node.wire import messages
    from remp_node.core import schedule
    from remp_node.wire import shards
    for name in ("shard_contains", "shard_hex", "shard_prefixes", "shard_for_account", "shard_depth"):
        assert getattr(messages, name) is getattr(shards, name)
    for name in ("shard_contains", "shard_hex", "split_shards", "shard_range", "is_valid_shard", "FULL_SHARD"):
        assert getattr(schedule, name) is getattr(shards, name)
    for d in range(9):
        assert shards.split_shards(d) == shards.shard_prefixes(1 << d)
        assert all(shards.shard_depth(s) == d for s in shards.split_shards(d))
        assert schedule.check_shard_cover(shards.split_shards(d))
    acc = bytes.fromhex("6a") + bytes(31)
    assert [shards.shard_contains(s, acc) for s in shards.split_shards(2)] == [False, True, False, False]
    assert shards.shard_for_account(acc, shards.split_shards(3)) == 0x7000000000000000
    assert schedule.shard_of(shards.split_shards(3), acc) == 0x7000000000000000
    for bad in (lambda: shards.shard_contains(0, acc), lambda: shards.shard_contains(1 << 64, acc),
                lambda: shards.shard_contains(shards.FULL_SHARD, b"\x01" * 7), lambda: shards.split_shards(9),
                lambda: shards.shard_for_account(acc, [0xC000000000000000])):
        with pytest.raises(shards.ShardError):
            bad()
    with pytest.raises(schedule.ScheduleError):
        schedule.shard_of([0xC000000000000000], acc)


def test_real_messages_split_across_two_shards(shared_data):
    rows = _lines(shared_data / "ton" / "ext_messages.jsonl")
    shards = {shard_for_account(bytes.fromhex(r["dst"].split(":")[1]), shard_prefixes(2)) for r in rows}
    assert shards == {0x4000000000000000, 0xC000000000000000}
