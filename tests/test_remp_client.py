"""REMP client core against scripted validators on a fake clock: validator selection timing
(one, then one more every 2 s until > 1/3 answered), next-group sends near a session switch,
loss and resend, SentToValidators, Finalized, final rejection only when every validator that
said New ended, Timeout, RejectedByFullnode, and receipt verification."""
import base64
import json

import pytest

from remp_node.core.client import FinalStatus, ReceiptEvent, RempClient
from remp_node.wire.keys import NodeKey
from remp_node.wire.messages import parse_external_message
from remp_node.wire.receipts import (
    Accepted, Duplicate, Ignored, Level, New, ReceiptError, Rejected, SignedReceipt, Timeout,
    make_signed_receipt, verify_receipt_json,
)
from remp_node.core.state import build_zero_state, make_wallet_message, wallet_address
from remp_node.wire.tl import BlockIdExt
from remp_node.wire.packets import RempMessageDatagram, decode_datagram

T0 = 1_700_000_000.0
FULL = NodeKey.from_seed(b"\xf0" * 32)
ALICE = NodeKey.from_seed(b"\x01" * 32)
BOB = NodeKey.from_seed(b"\x04" * 32)
A, B = wallet_address(ALICE.public), wallet_address(BOB.public)
VALS = [NodeKey.from_seed(bytes([0x10 + i]) * 32) for i in range(14)]
BY_ID = {v.key_id: v for v in VALS}
G1, G2 = VALS[:7], VALS[7:]
SHARD_BLOCK = BlockIdExt(0, 0x4000000000000000, 9, b"\x01" * 32, b"\x02" * 32)
MC_BLOCK = BlockIdExt(-1, 0x8000000000000000, 4, b"\x03" * 32, b"\x04" * 32)


def groups_fixed(shard, now):
    return [v.public for v in G1], []


class Net:
    """The full node plus scripted validators: `answer(validator, msg_id)` -> statuses."""

    def __init__(self, client, answer=None, drop=lambda dst, n: False):
        self.c, self.answer, self.drop = client, answer, drop
        self.delivered = []  # (time, dst key id)
        self.events = []
        self.n = 0

    def step(self, now):
        for dst, data in self.c.datagrams_to_send(now):
            self.n += 1
            dg = decode_datagram(data)
            assert isinstance(dg, RempMessageDatagram) and dg.verify(FULL.public)
            if self.drop(dst, self.n):
                continue
            self.delivered.append((now, dst))
            msg = parse_external_message(dg.boc)
            assert msg.id == dg.message_id
            v = BY_ID[dst]
            for st in (self.answer(v, msg.id) if self.answer else []):
                self.send_receipt(v, msg.id, st, now)
        while (ev := self.c.next_event()) is not None:
            self.events.append(ev)

    def send_receipt(self, v, mid, status, now):
        sr = make_signed_receipt(v, mid, status, int(now * 1000))
        self.c.receive_datagram(sr.serialize(), v.key_id, now)

    def run(self, until, dt=0.5, start=T0):
        now = start
        while now <= until:
            self.step(now)
            now += dt
        return now

    def finals(self):
        return [e for e in self.events if isinstance(e, FinalStatus)]

    def kinds(self, origin=None):
        return [e.kind for e in self.events if isinstance(e, ReceiptEvent) and (origin is None or e.origin == origin)]


def client(groups=groups_fixed, **kw):
    zs = build_zero_state(wallets=[(ALICE.public, 1000), (BOB.public, 10)])
    return RempClient(FULL, zs, groups, **kw)


def wallet_msg(nonce=1, amount=10, valid_until=T0 + 600):
    return make_wallet_message(ALICE, A, B, amount, int(valid_until), nonce)


def test_selection_stops_after_more_than_a_third_answered():
    c = client()
    net = Net(c, answer=lambda v, mid: [New()])
    mid = c.submit(wallet_msg(), T0)
    net.run(T0 + 20)
    # 7 validators: 3 answers needed (3*3 > 7); one new validator every 2 s
    assert [round(t - T0, 1) for t, _ in net.delivered] == [0.0, 2.0, 4.0]
    assert len(set(d for _, d in net.delivered)) == 3
    sent = [e.receipt.status for e in net.events if isinstance(e, ReceiptEvent) and e.kind == "SentToValidators"]
    assert [(s.sent_to, s.total_validators) for s in sent] == [(1, 7), (2, 7), (3, 7)]
    assert net.kinds("validator") == ["PutIntoQueue"] * 3
    assert c.pending() == [mid] and net.finals() == []


def test_no_answers_reaches_everyone_then_resends():
    c = client()
    net = Net(c)
    c.submit(wallet_msg(), T0)
    net.run(T0 + 14.1, dt=0.25)
    times = [t - T0 for t, _ in net.delivered]
    assert times[:7] == [0, 2, 4, 6, 8, 10, 12]
    assert len(set(d for _, d in net.delivered[:7])) == 7
    assert times[7:] == [14.0] * 7  # all were tried: resend to every unanswered one


def test_loss_is_covered_by_adding_validators():
    c = client()
    net = Net(c, answer=lambda v, mid: [New()], drop=lambda dst, n: n <= 2)
    c.submit(wallet_msg(), T0)
    net.run(T0 + 20)
    assert len(net.delivered) == 3 and round(net.delivered[0][0] - T0) == 4


def test_session_switch_also_sends_to_next_group():
    def groups(shard, now):
        return [v.public for v in G1], ([v.public for v in G2] if now >= T0 + 3 else [])
    c = client(groups)
    net = Net(c)
    c.submit(wallet_msg(), T0)
    net.run(T0 + 4)
    dsts = [d for _, d in net.delivered]
    assert sum(d in {v.key_id for v in G1} for d in dsts) == 3  # t = 0, 2, 4
    assert sum(d in {v.key_id for v in G2} for d in dsts) == 1  # from t = 4 on
    sent = [e.receipt.status for e in net.events if isinstance(e, ReceiptEvent) and e.kind == "SentToValidators"]
    assert (sent[-1].sent_to, sent[-1].total_validators) == (4, 14)


def test_finalized_from_masterchain_receipt():
    c = client()
    net = Net(c, answer=lambda v, mid: [New()])
    mid = c.submit(wallet_msg(), T0)
    net.run(T0 + 1)
    v = BY_ID[net.delivered[0][1]]
    net.send_receipt(v, mid, Accepted(Level.COLLATOR, SHARD_BLOCK), T0 + 1.2)
    net.send_receipt(v, mid, Accepted(Level.MASTERCHAIN, SHARD_BLOCK, MC_BLOCK), T0 + 6)
    net.step(T0 + 6)
    (final,) = net.finals()
    assert final.outcome == "finalized" and final.kind == "Finalized" and final.elapsed == 6
    own = [e for e in net.events if isinstance(e, ReceiptEvent) and e.origin == "fullnode" and e.kind == "Finalized"]
    assert len(own) == 1 and own[0].receipt.source_id == FULL.key_id
    assert own[0].receipt.status.master_id == MC_BLOCK
    assert verify_receipt_json(own[0].to_json(), [FULL.public]) == own[0].receipt
    assert c.pending() == []
    # a resent copy of a receipt already seen is dropped; another validator's late one is
    # reported (late=True) without a second final status
    net.send_receipt(v, mid, Accepted(Level.MASTERCHAIN, SHARD_BLOCK, MC_BLOCK), T0 + 7)
    assert c.stats["late_receipts"] + c.stats["receipts_dropped"] == 1
    net.step(T0 + 7)
    assert len(net.finals()) == 1
    late = [e for e in net.events if isinstance(e, ReceiptEvent) and e.late]
    assert len(late) == c.stats["late_receipts"] and all(e.origin == "validator" for e in late)


def test_rejected_only_when_every_new_sayer_ended():
    c = client()
    net = Net(c, answer=lambda v, mid: [New()])
    mid = c.submit(wallet_msg(), T0)
    net.run(T0 + 5)
    vs = [BY_ID[d] for _, d in net.delivered]
    assert len(vs) == 3
    net.send_receipt(vs[0], mid, Rejected(Level.COLLATOR, SHARD_BLOCK, "Insufficient balance: 1 < 10"), T0 + 6)
    net.send_receipt(vs[1], mid, Ignored(Level.COLLATOR, SHARD_BLOCK), T0 + 6)
    net.send_receipt(vs[1], mid, Rejected(Level.COLLATOR, SHARD_BLOCK, "Message expired"), T0 + 7)
    net.step(T0 + 7)
    assert net.finals() == []
    net.send_receipt(vs[2], mid, Timeout(), T0 + 8)
    net.step(T0 + 8)
    (final,) = net.finals()
    assert final.outcome == "rejected" and final.kind == "RejectedByCollator"
    assert "Insufficient balance" in final.reason and "Message expired" in final.reason


def test_all_timeouts_give_timeout():
    c = client()
    net = Net(c, answer=lambda v, mid: [New(), Duplicate(SHARD_BLOCK)])
    mid = c.submit(wallet_msg(), T0)
    net.run(T0 + 5)
    for _, d in net.delivered:
        net.send_receipt(BY_ID[d], mid, Timeout(), T0 + 9)
    net.step(T0 + 9)
    (final,) = net.finals()
    assert final.outcome == "timeout" and final.kind == "Timeout"


def test_lifetime_timeout():
    c = client(lifetime=30)
    net = Net(c)
    mid = c.submit(wallet_msg(), T0)
    assert c.get_timer() == T0 + 2
    net.run(T0 + 29.5)
    assert net.finals() == []
    net.step(T0 + 30)
    (final,) = net.finals()
    assert final.message_id == mid
    # t=0..12 one each; then the unanswered seven again with backoff: t=14, 18 (+4), 26 (+8);
    # the next (+16) is past the lifetime (before the backoff: every 2 s, 7 + 7 * 8)
    assert final.outcome == "timeout" and final.datagrams == 7 + 7 * 3
    assert net.kinds("fullnode")[-1] == "Timeout"


def test_rejected_by_fullnode_precheck_and_parse():
    c = client()
    net = Net(c)
    expired = c.submit(wallet_msg(valid_until=T0 - 1), T0)
    broke = c.submit(wallet_msg(amount=5000, nonce=2), T0)
    garbage = c.submit(b"\x01\x02not a boc", T0)
    net.step(T0)
    assert net.delivered == []
    finals = {f.message_id: f for f in net.finals()}
    assert finals[expired].reason.startswith("Pre-execution failed: Message expired")
    assert finals[broke].reason == "Pre-execution failed: Insufficient balance: 1000 < 5000"
    assert finals[garbage].reason.startswith("Can't deserialize message: ")
    rej = [e for e in net.events if isinstance(e, ReceiptEvent) and e.kind == "RejectedByFullnode"]
    assert len(rej) == 3 and all(e.receipt.source_id == FULL.key_id for e in rej)
    for e in rej:
        assert verify_receipt_json(json.loads(json.dumps(e.to_json())), [FULL.public]).status.error == e.receipt.status.error


def test_negative_bocs_rejected_by_fullnode(shared_data):
    c = client()
    net = Net(c)
    rows = [json.loads(x) for x in (shared_data / "ton" / "negative_bocs.jsonl").read_text().splitlines() if x]
    for row in rows:
        try:
            boc = base64.b64decode(row["boc_base64"], validate=True)
        except ValueError:
            continue  # not base64 at all: the HTTP front end refuses it (messages.parse_external_message_base64)
        c.submit(boc, T0)
    net.step(T0)
    finals = net.finals()
    assert len(finals) == len(rows) - 1 and all(f.kind == "RejectedByFullnode" for f in finals)
    assert all(f.reason.startswith(("Can't deserialize message: ", "Not an inbound external message: "))
               for f in finals)


def test_real_messages_are_sent(shared_data):
    rows = [json.loads(x) for x in (shared_data / "ton" / "ext_messages.jsonl").read_text().splitlines() if x]
    zs = build_zero_state(open_accounts=[r["dst"] for r in rows])
    c = RempClient(FULL, zs, groups_fixed)
    net = Net(c, answer=lambda v, mid: [New()])
    ids = [c.submit(base64.b64decode(r["boc_base64"]), T0) for r in rows]
    assert [i.hex() for i in ids] == [r["root_hash_hex"] for r in rows]
    net.step(T0)
    assert len(net.delivered) == 50 and len(c.pending()) == 50


def test_forged_and_foreign_receipts():
    c = client()
    net = Net(c)
    mid = c.submit(wallet_msg(), T0)
    net.step(T0)
    outsider = NodeKey.from_seed(b"\xee" * 32)
    with pytest.raises(ReceiptError) as e:
        c.receive_datagram(make_signed_receipt(outsider, mid, New(), 1).serialize(), outsider.key_id, T0)
    assert e.value.reason == "unknown_source"
    v = G1[0]
    good = make_signed_receipt(v, mid, Rejected(Level.COLLATOR, SHARD_BLOCK, "x"), 1)
    tampered = bytearray(good.receipt)
    tampered[-40] ^= 1  # inside the timestamp
    with pytest.raises(ReceiptError) as e:
        c.receive_datagram(SignedReceipt(bytes(tampered), good.signature).serialize(), v.key_id, T0)
    assert e.value.reason == "bad_signature"
    with pytest.raises(ValueError):
        c.receive_datagram(b"\x00\x01", v.key_id, T0)
    other = make_signed_receipt(v, b"\x55" * 32, New(), 1)  # unknown message: dropped
    c.receive_datagram(other.serialize(), v.key_id, T0)
    assert c.stats["receipts_dropped"] == 1 and c.stats["receipts"] == 0
    c.receive_datagram(good.serialize(), v.key_id, T0)
    c.receive_datagram(good.serialize(), v.key_id, T0)  # duplicate datagram
    assert c.stats["receipts"] == 1 and c.stats["receipts_dropped"] == 2


def test_receipt_from_group_member_not_contacted_is_accepted():
    c = client()
    net = Net(c)
    mid = c.submit(wallet_msg(), T0)
    net.step(T0)
    (first,) = [d for _, d in net.delivered]
    other = next(v for v in G1 if v.key_id != first)  # got it from the RMQ, not from us
    net.send_receipt(other, mid, New(), T0 + 0.5)
    net.step(T0 + 0.5)
    assert net.kinds("validator") == ["PutIntoQueue"]


def test_wire_remp_message_format():
    from remp_node.wire.tl import REMP_MESSAGE, TLReader
    from remp_node.wire.packets import WireError, encode_remp_message
    boc = wallet_msg()
    mid = parse_external_message(boc).id
    data = encode_remp_message(boc, mid, 1234, FULL)
    r = TLReader(data, 1 << 20)
    assert r.constructor() == REMP_MESSAGE == 0xDD1F6DB1
    assert r.bytes() == boc and r.int256() == mid and r.long() == 1234 and len(r.bytes()) == 64
    dg = decode_datagram(data)
    assert dg.verify(FULL.public) and not dg.verify(ALICE.public)
    for bad in (data[:-1], data + b"\0\0\0\0", b"\x01\x02\x03\x04" + data[4:], b"", b"\0" * 70000):
        with pytest.raises(WireError):
            decode_datagram(bad)
    with pytest.raises(ValueError):
        c = client()
        c.receive_datagram(data, FULL.key_id, T0)  # a full node does not take rempMessage


def test_reordered_stale_receipt_cannot_reopen_a_validators_final_answer():
    """A validator's AcceptedByQueue (ts 1.0 s) overtaken by its RejectedByCollator (ts 2.0 s):
    the late, older receipt must not take the message up again on that validator, so once
    the other New-sayer rejects too the message is finally rejected."""
    c = client()
    net = Net(c, answer=lambda v, mid: [New()])
    mid = c.submit(wallet_msg(), T0)
    net.run(T0 + 2.5)
    v0, v1 = (BY_ID[d] for _, d in net.delivered)

    def deliver(v, status, ts, at):
        c.receive_datagram(make_signed_receipt(v, mid, status, int(ts * 1000)).serialize(), v.key_id, at)
        net.step(at)

    deliver(v0, Rejected(Level.COLLATOR, SHARD_BLOCK, "Message expired"), T0 + 3.0, T0 + 3.01)
    deliver(v0, Accepted(Level.QUEUE), T0 + 1.0, T0 + 3.02)          # reordered: older timestamp
    assert net.finals() == []
    deliver(v1, Rejected(Level.COLLATOR, SHARD_BLOCK, "Message expired"), T0 + 3.1, T0 + 3.2)
    (final,) = net.finals()
    assert (final.outcome, final.kind, final.reason) == ("rejected", "RejectedByCollator", "Message expired")


def test_newer_receipt_still_reopens_and_stale_final_does_not_end():
    """A New with a later timestamp (the validator took the message up again after a session
    switch) reopens; a RejectedByCollator older than that New, arriving late, ends nothing."""
    c = client()
    net = Net(c, answer=lambda v, mid: [New()])
    mid = c.submit(wallet_msg(), T0)
    net.run(T0 + 0.5)
    (v0,) = (BY_ID[d] for _, d in net.delivered)

    def deliver(status, ts, at):
        c.receive_datagram(make_signed_receipt(v0, mid, status, int(ts * 1000)).serialize(), v0.key_id, at)
        net.step(at)

    deliver(Accepted(Level.QUEUE), T0 + 0.6, T0 + 0.6)
    deliver(New(), T0 + 1.5, T0 + 1.5)                                  # taken up again
    deliver(Rejected(Level.COLLATOR, SHARD_BLOCK, "old"), T0 + 1.0, T0 + 1.6)   # stale final
    assert net.finals() == [] and c.pending() == [mid]
    deliver(Rejected(Level.COLLATOR, SHARD_BLOCK, "new"), T0 + 1.7, T0 + 1.7)
    (final,) = net.finals()
    assert (final.outcome, final.reason) == ("rejected", "new")


def test_authenticated_receipts_skip_the_second_verify_and_keep_their_signature(monkeypatch):
    """receive_authenticated (receipts out of delivery.ReceiptReceiver, whose packet signature
    covers them): no ed25519 verify per receipt, the same events as receive_datagram, each
    status still verifiable alone; a receipt whose source_id is not the vouched source is a
    local error."""
    import remp_node.wire.receipts as rmod
    from remp_node.core.client import ClientError
    c = client()
    mid = c.submit(wallet_msg(), T0)
    v = G1[0]
    calls = []
    real = rmod._verify_with
    monkeypatch.setattr(rmod, "_verify_with", lambda *a: calls.append(1) or real(*a))
    sr = make_signed_receipt(v, mid, Rejected(Level.SHARDCHAIN, SHARD_BLOCK, "no funds"), int(T0 * 1000) + 5)
    c.receive_authenticated(sr, sr.open(), v.key_id, T0 + 1)
    assert calls == [] and c.stats["receipts_preverified"] == 1
    evs = []
    while (ev := c.next_event()) is not None:
        evs.append(ev)
    got = [e for e in evs if isinstance(e, ReceiptEvent) and e.origin == "validator"]
    assert len(got) == 1 and got[0].signature == sr.signature
    assert verify_receipt_json(got[0].to_json(), [v.public]).message_id == mid     # verifies alone
    assert [e.outcome for e in evs if isinstance(e, FinalStatus)] == ["rejected"]
    other = make_signed_receipt(G1[1], mid, New(), int(T0 * 1000) + 6)
    with pytest.raises(ClientError):
        c.receive_authenticated(other, other.open(), v.key_id, T0 + 2)
    # the datagram path still verifies (and refuses a forged one)
    forged = SignedReceipt(other.receipt, b"\x00" * 64)
    c2 = client()
    c2.submit(wallet_msg(), T0)
    with pytest.raises(ReceiptError):
        c2.receive_datagram(forged.serialize(), G1[1].key_id, T0 + 1)


def test_a_silent_validator_is_passed_over_by_new_messages():
    """Validators that were sent a message and said nothing for more than silent_after (0.5 s)
    are not a new message's first choice while others are; hearing from one ends it."""
    from remp_node.core.client import MessageSent
    silent = {v.key_id for v in G1[:3]}
    c = client()
    net = Net(c, answer=lambda v, mid: [] if v.key_id in silent else [New()])

    def firsts(batch):
        out = {}
        for e in net.events:
            if isinstance(e, MessageSent) and e.message_id in batch and e.message_id not in out:
                out[e.message_id] = e.peer
        return out
    b1 = {c.submit(wallet_msg(nonce=100 + i), T0) for i in range(30)}
    net.step(T0)
    hit = {p for p in firsts(b1).values() if p in silent}
    assert hit                                          # before: some went to the silent ones
    b2 = {c.submit(wallet_msg(nonce=200 + i), T0 + 1.5) for i in range(30)}
    net.step(T0 + 1.5)
    f2 = firsts(b2)
    assert len(f2) == 30 and not [p for p in f2.values() if p in hit]
    assert c.stats["silent_skipped"] > 0
    # one of them answers again: it is a first choice again
    back = sorted(hit)[0]
    v = BY_ID[back]
    net.send_receipt(v, next(iter(b1)), New(), T0 + 1.6)
    b3 = {c.submit(wallet_msg(nonce=300 + i), T0 + 1.7) for i in range(30)}
    net.step(T0 + 1.7)
    assert back in set(firsts(b3).values())


def test_a_message_stuck_at_a_silent_validator_gets_one_early_wave():
    """A message whose validator fell silent (0.5 s) while others answer goes to the next
    one at once, not after the 2 s resend interval; with nobody answering the interval holds
    (test_no_answers_reaches_everyone_then_resends)."""
    from remp_node.core.client import MessageSent
    silent = {v.key_id for v in G1[:3]}
    c = client()
    net = Net(c, answer=lambda v, mid: [] if v.key_id in silent else [New()])
    ids = [c.submit(wallet_msg(nonce=400 + i), T0) for i in range(30)]
    net.run(T0 + 1.0, dt=0.1)
    sent = {}
    for e in net.events:
        if isinstance(e, MessageSent):
            sent.setdefault(e.message_id, []).append(e.peer)
    stuck = [m for m in ids if sent[m][0] in silent]
    assert stuck and c.stats["early_waves"] >= len(stuck)
    assert all(len(sent[m]) >= 2 and sent[m][1] not in silent for m in stuck)
    assert all(m in sent and any(
        isinstance(e, ReceiptEvent) and e.message_id == m and e.origin == "validator" for e in net.events)
        for m in ids)                                   # every one answered within 1 s


def test_receipts_do_not_rescan_every_unanswered_message():
    """300 messages wait for answers; 1,000 receipts for other messages arrive within one
    instant, get_timer after each (what a daemon step does): the early-wave scan over the
    unanswered messages runs at most once per SILENT_SCAN, not per receipt (it was per
    receipt and per get_timer: quadratic past saturation)."""
    from remp_node.core.client import SILENT_SCAN
    c = client()
    silent = [c.submit(wallet_msg(nonce=900 + i), T0) for i in range(300)]
    heard = c.submit(wallet_msg(nonce=1900), T0)
    calls = []
    orig = c._silent_at
    c._silent_at = lambda t, *limits: calls.append(1) or orig(t, *limits)
    net = Net(c, answer=lambda v, mid: [])
    # its first answer after 0.1 s (a first receipt 1 s late would make the answer time,
    # srtt + 4 rttvar = 3 s, the silence limit: test_waves_wait_for_the_observed_answer_time)
    net.send_receipt(G1[0], heard, New(), T0 + 0.1)
    now = T0 + 1.0
    for i in range(1000):
        net.send_receipt(G1[i % 7], heard, New(), now)
        c.get_timer()
        c.datagrams_to_send(now)
    assert len(calls) <= len(silent) + 1
    # the scan did run (once) and found the early waves of the messages whose validators fell silent
    c.datagrams_to_send(now + SILENT_SCAN)
    assert c.stats["early_waves"] > 0


def test_waves_wait_for_the_observed_answer_time():
    """Validators answering in 5 s (an overloaded network): once first receipts took ~5 s,
    a new message gets its second validator only after ~the answer time (srtt + 4 rttvar,
    at most 16 s), not after the fixed 2 s that, past saturation, sent every message to one
    more validator every 2 s (each queued it again in its RMQ)."""
    c = client()
    pending = []                                  # [due, validator, message id]
    clock = [T0]
    got = []                                      # (time, message id) per delivery
    net = Net(c, answer=lambda v, mid: got.append((clock[0], mid)) or pending.append([clock[0] + 5.0, v, mid]) or [])

    def run(until):
        while clock[0] <= until:
            net.step(clock[0])
            for p in [p for p in pending if p[0] <= clock[0]]:
                pending.remove(p)
                net.send_receipt(p[1], p[2], New(), clock[0])
            clock[0] += 0.25
    for i in range(10):                           # one message per second, answered in 5 s
        c.submit(wallet_msg(nonce=i + 1, amount=1), clock[0])
        run(clock[0] + 0.75)
    first = [t - T0 for t, _ in net.delivered if T0 <= t < T0 + 1.0]
    assert first == [0.0]
    assert 5.0 <= c.wave_interval() <= 16.0
    start = clock[0]
    mid = c.submit(wallet_msg(nonce=99, amount=1), start)
    run(start + 4.9)
    assert [t - start for t, m in got if m == mid] == [0.0]   # no second wave at +2 s, +4 s
    assert client().wave_interval() == 2.0        # nothing measured: the fixed interval


def test_submit_takes_the_callers_parse(monkeypatch):
    """The API parses a POSTed BOC once and hands the result over: the client core does not
    parse it again (it was parsed twice per message, plus a third time to check it decodes)."""
    import remp_node.core.client as client_mod
    boc = wallet_msg(nonce=5)
    parsed = parse_external_message(boc)
    calls = []
    real = client_mod.parse_external_message
    monkeypatch.setattr(client_mod, "parse_external_message", lambda *a: calls.append(1) or real(*a))
    c = client()
    assert c.submit(boc, T0, parsed) == parsed.id and calls == []
    assert c.pending() == [parsed.id]
    other = wallet_msg(nonce=6)
    c.submit(other, T0, parsed)            # a parse of another BOC is not taken
    assert calls == [1] and len(c.pending()) == 2


def test_submitted_message_id_is_the_id_submit_gives():
    """client.submitted_message_id (the full node records a message under it before the
    client core sends it) names a BOC as submit() does: the root hash, parsed or not, for
    an accepted message, one the pre-checks refuse and a masterchain one refused as an
    unknown account; sha256 of the bytes for garbage."""
    from remp_node.core.client import submitted_message_id
    from remp_node.wire.messages import message_id_of
    ok, broke, garbage = wallet_msg(), wallet_msg(amount=5000, nonce=2), b"\x01\x02not a boc"
    mc = make_wallet_message(ALICE, "-1:" + A.split(":")[1], B, 1, int(T0 + 600), 3)
    for boc in (ok, broke, mc):
        parsed = parse_external_message(boc, (0, -1))
        assert submitted_message_id(boc) == submitted_message_id(boc, parsed) == message_id_of(boc)
        assert client().submit(boc, T0) == submitted_message_id(boc)
        assert client().submit(boc, T0, parsed) == submitted_message_id(boc, parsed)
    assert client().submit(garbage, T0) == submitted_message_id(garbage) != message_id_of(garbage)


def test_a_status_signed_again_by_a_restarted_validator_is_reported_once():
    """A validator SIGKILLed and restarted learns its queue's messages again from the RMQ and
    signs the same statuses anew (new timestamp, new digest): the repeat is counted
    (receipts_repeated), not reported as a second status (the trace report counts a status
    logged twice by one node as a duplicate); a new status after it is still reported."""
    c = client()
    net = Net(c, answer=lambda v, mid: [New()])
    mid = c.submit(wallet_msg(), T0)
    net.run(T0 + 0.5)
    (v0,) = (BY_ID[d] for _, d in net.delivered)

    def deliver(status, ts):
        c.receive_datagram(make_signed_receipt(v0, mid, status, int(ts * 1000)).serialize(), v0.key_id, ts)
        net.step(ts)

    deliver(Accepted(Level.QUEUE), T0 + 0.6)
    deliver(Accepted(Level.QUEUE), T0 + 5.0)                 # after the restart: signed again

    def from_v0():
        return [e.kind for e in net.events if isinstance(e, ReceiptEvent) and e.receipt.source_id == v0.key_id]

    assert from_v0() == ["PutIntoQueue", "AcceptedByQueue"]
    assert c.stats["receipts_repeated"] == 1
    deliver(Rejected(Level.COLLATOR, SHARD_BLOCK, "x"), T0 + 5.1)   # new: reported
    assert from_v0() == ["PutIntoQueue", "AcceptedByQueue", "RejectedByCollator"]


def test_a_message_whose_first_datagram_was_lost_gets_one_early_wave():
    """The first datagram of one message is lost on the way to a validator that keeps
    answering every other message (1% datagram loss on a wide-area link): the message goes
    to the next validator once it is unanswered for silent_after (0.5 s) while the others
    answer, not after the 2 s resend interval (its first receipt was the interval plus a
    round trip, 2.1-2.3 s, the p99 of a run with 1% loss)."""
    from remp_node.core.client import MessageSent
    c = client()
    lost = []

    def drop(dst, n):                     # the 5th datagram: one message's only send so far
        if n == 5:
            lost.append(dst)
        return n == 5
    net = Net(c, answer=lambda v, mid: [New()], drop=drop)
    ids = []
    now = T0
    while now < T0 + 1.5:                 # 10 messages per second, every one answered at once
        ids.append(c.submit(wallet_msg(nonce=700 + len(ids)), now))
        net.step(now)
        now = round(now + 0.1, 6)
    sent = {}
    for e in net.events:
        if isinstance(e, MessageSent):
            sent.setdefault(e.message_id, []).append(e.peer)
    victim = [m for m in ids if len(sent[m]) >= 2 and sent[m][0] == lost[0]]
    assert lost and len(victim) == 1                                 # its second send ...
    when = [t for t, d in net.delivered if d == sent[victim[0]][1]]
    assert when and when[-1] - (T0 + 0.4) <= 0.7                     # ... within ~0.5 s, not 2 s
    assert sent[victim[0]][1] != lost[0] and c.stats["early_waves"] == 1
    assert any(isinstance(e, ReceiptEvent) and e.message_id == victim[0] and e.origin == "validator"
               for e in net.events)
    assert all(len(sent[m]) == 1 for m in ids if m != victim[0])    # nobody else got a second send
