"""Shard state and the wallet executor: acceptance, each failure with its error text, the
full node's precheck (RejectedByFullnode), determinism, and the zerostate with the real
messages' destination accounts."""
import base64
import json

import pytest
from pytoniq_core import Builder

from remp_node.wire.keys import NodeKey
from remp_node.wire.messages import MessageRejected, parse_external_message
from remp_node.core.state import build_zero_state, decode_wallet_body, make_wallet_message, wallet_address
from remp_node.daemon.netfiles import real_message_destinations, zero_state_from_config

ALICE = NodeKey.from_seed(b"\x01" * 32)
BOB = NodeKey.from_seed(b"\x04" * 32)  # lands in the other shard
MALLORY = NodeKey.from_seed(b"\x05" * 32)
A, B = wallet_address(ALICE.public), wallet_address(BOB.public)
NOW = 1_700_000_000


def zs():
    return build_zero_state(wallets=[(ALICE.public, 1000), (BOB.public, 5)])


def msg(key=ALICE, src=A, dest=B, amount=100, valid_until=NOW + 60, nonce=1):
    return parse_external_message(make_wallet_message(key, src, dest, amount, valid_until, nonce))


def test_wallet_body_round_trip():
    m = msg()
    tr = decode_wallet_body(m.body)
    assert (tr.valid_until, tr.nonce, tr.dest, tr.amount) == (NOW + 60, 1, B, 100)
    assert m.dst == A


def test_accept_moves_balance_across_shards():
    z = zs()
    assert z.shard_of(A) != z.shard_of(B)  # fixed seeds land in the two shards
    st = z.state_for(A)
    res = st.execute(msg(), NOW)
    assert res.ok and res.error == "" and res.amount == 100 and res.dest == B
    assert not res.credited_here
    assert st.get(A).balance == 900
    z.state_for(B).credit(res.dest, res.amount)
    assert z.state_for(B).get(B).balance == 105


def test_accept_same_shard_credit():
    z = build_zero_state(shard_count=1, wallets=[(ALICE.public, 1000), (BOB.public, 5)])
    res = z.state_for(A).execute(msg(), NOW)
    assert res.ok and res.credited_here and z.state_for(B).get(B).balance == 105


@pytest.mark.parametrize("kwargs,now,needle", [
    (dict(key=MALLORY), NOW, "Invalid signature"),
    (dict(valid_until=NOW - 1), NOW, f"Message expired: valid_until {NOW - 1} < now {NOW}"),
    (dict(amount=1001), NOW, "Insufficient balance: 1000 < 1001"),
])
def test_execution_failures_change_nothing(kwargs, now, needle):
    z = zs()
    st = z.state_for(A)
    before = st.state_hash()
    res = st.execute(msg(**kwargs), now)
    assert not res.ok and needle in res.error
    assert st.state_hash() == before
    with pytest.raises(MessageRejected) as e:
        st.precheck(msg(**kwargs), now)
    assert e.value.code == "pre_execution" and e.value.text == f"Pre-execution failed: {res.error}"


def test_unknown_account():
    z = zs()
    carol = wallet_address(NodeKey.from_seed(b"\x09" * 32).public)
    m = msg(src=carol)
    st = z.state_for(carol)
    res = st.execute(m, NOW)
    assert not res.ok and res.error == f"Unknown account {carol}"
    with pytest.raises(MessageRejected) as e:
        st.precheck(m, NOW)
    assert e.value.code == "unknown_account"


def test_bad_body_for_wallet():
    z = zs()
    from pytoniq_core import Address, MessageAny
    from pytoniq_core.tlb.transaction import ExternalMsgInfo
    wc, acc = A.split(":")
    info = ExternalMsgInfo(src=None, dest=Address((int(wc), bytes.fromhex(acc))), import_fee=0)
    boc = MessageAny(info=info, init=None, body=Builder().store_uint(5, 32).end_cell()).serialize().to_boc()
    res = z.state_for(A).execute(parse_external_message(boc), NOW)
    assert not res.ok and res.error.startswith("Bad wallet message body: body has 32 bits")


def test_precheck_passes_and_wrong_shard_is_local_error():
    z = zs()
    z.state_for(A).precheck(msg(), NOW)
    with pytest.raises(ValueError) as e:
        z.state_for(B).precheck(msg(), NOW)
    assert not isinstance(e.value, MessageRejected)


def test_determinism_and_copy():
    z1, z2 = zs(), zs()
    for z in (z1, z2):
        st = z.state_for(A)
        for n in range(3):
            st.execute(msg(nonce=n, amount=10 * (n + 1)), NOW)
    assert z1.state_for(A).state_hash() == z2.state_for(A).state_hash()
    c = z1.state_for(A).copy()
    c.execute(msg(nonce=9, amount=1), NOW)
    assert c.state_hash() != z1.state_for(A).state_hash()
    assert z1.state_for(A).get(A).balance == 1000 - 60


def test_real_messages_go_to_open_accounts(shared_data):
    path = shared_data / "ton" / "ext_messages.jsonl"
    dsts = real_message_destinations(path)
    z = zero_state_from_config({"workchain": 0, "shard_count": 2, "ext_messages": str(path),
                                "wallets": [{"public_key": ALICE.public.hex(), "balance": 7}]})
    assert sum(len(s.accounts) for s in z.states.values()) == len(dsts) + 1
    for line in path.read_text().splitlines():
        m = parse_external_message(base64.b64decode(json.loads(line)["boc_base64"]))
        st = z.state_for(m.dst)
        st.precheck(m, NOW)
        res = st.execute(m, NOW)
        assert res.ok and res.amount == 0


def test_committed_execution_skips_only_the_body_signature(monkeypatch):
    """execute(committed=True): a message from a block its shard group accepted (every member
    executed it with every check when validating the candidate) is applied by the other
    nodes without verifying the wallet's body signature again; every other check runs."""
    import remp_node.core.state as state_mod
    calls = []
    real = state_mod._signed_by
    monkeypatch.setattr(state_mod, "_signed_by", lambda pk, tr: calls.append(pk) or real(pk, tr))
    st = zs().state_for(A)
    res = st.execute(msg(nonce=7), NOW, committed=True)
    assert res.ok and st.get(A).balance == 900 and calls == []
    # a body no quorum could have accepted is still refused as a plain execute refuses it...
    assert "Invalid signature" in st.execute(msg(key=MALLORY, nonce=8), NOW).error and len(calls) == 1
    # ...and the state checks stay: expiry against the block time, balance
    assert "Message expired" in st.execute(msg(valid_until=NOW - 1, nonce=9), NOW, committed=True).error
    assert "Insufficient balance" in st.execute(msg(amount=901, nonce=10), NOW, committed=True).error
    assert st.get(A).balance == 900 and len(calls) == 1
