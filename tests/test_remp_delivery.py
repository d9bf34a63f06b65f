"""Receipt delivery: validators' ReceiptSender -> full node's ReceiptReceiver,
carried by transport.TransportCore over a lossy in-memory SimNetwork with a fake clock.

Proves: every status produced reaches the full node with 20% datagram loss (plus duplication
and reordering), in production order per validator, each verifiable alone, no duplicates;
no status waits more than 100 ms for batching; one packet signature per batch is checked
(forged / foreign / stale packets refused with a precise reason); obsolete packets are
abandoned at session N+2 and memory stays bounded; restarts on either side."""
from __future__ import annotations

import hashlib
import random

import pytest

from remp_node.core.delivery import (DeliveryError, ReceiptReceiver, ReceiptSender, classify, decode_batch,
                                encode_ack, encode_batch, INITIAL_WINDOW, RECEIPT_BATCH, RECEIPT_BATCH_ACK, TL_LINES)
from remp_node.wire.keys import NodeKey
from remp_node.testnet.network import SimNetwork
from remp_node.wire.receipts import (Accepted, Duplicate, Ignored, Level, New, Rejected, Timeout,
                                make_signed_receipt, signed_to_json, verify_receipt_json)
from remp_node.wire.tl import BlockIdExt, tl_constructor_id
from remp_node.transport.core import TransportCore
from remp_node.core.validator import CH_CLIENT, CH_RMQ, ZERO32, mux
from remp_node.wire.packets import encode_remp_message

T0 = 1_700_000_000.0


def key(tag: str) -> NodeKey:
    return NodeKey.from_seed(hashlib.sha256(tag.encode()).digest())


FULLNODE = key("delivery-fullnode")
VALIDATORS = [key(f"delivery-v{i}") for i in range(3)]
SHARD_BLOCK = BlockIdExt(0, 0x4000000000000000, 7, b"\x01" * 32, b"\x02" * 32)
MC_BLOCK = BlockIdExt(-1, 0x8000000000000000, 3, b"\x03" * 32, b"\x04" * 32)

#: status sequences a validator produces for one message (seed remp-protocol-b)
SEQUENCES = [
    [New(), Accepted(Level.QUEUE), Accepted(Level.COLLATOR, SHARD_BLOCK),
     Accepted(Level.SHARDCHAIN, SHARD_BLOCK), Accepted(Level.MASTERCHAIN, SHARD_BLOCK, MC_BLOCK)],
    [New(), Accepted(Level.QUEUE), Rejected(Level.COLLATOR, SHARD_BLOCK, "Contract rejected message: 52")],
    [New(), Accepted(Level.QUEUE), Ignored(Level.COLLATOR, SHARD_BLOCK), Accepted(Level.COLLATOR, SHARD_BLOCK),
     Accepted(Level.SHARDCHAIN, SHARD_BLOCK), Ignored(Level.MASTERCHAIN, SHARD_BLOCK), Accepted(Level.QUEUE),
     Accepted(Level.COLLATOR, SHARD_BLOCK), Accepted(Level.SHARDCHAIN, SHARD_BLOCK),
     Accepted(Level.MASTERCHAIN, SHARD_BLOCK, MC_BLOCK)],
    [New(), Rejected(Level.QUEUE, error="message expired")],
    [Duplicate(SHARD_BLOCK)],
    [New(), Accepted(Level.QUEUE), Timeout()],
    [New(), Accepted(Level.QUEUE), Accepted(Level.COLLATOR, SHARD_BLOCK), Ignored(Level.SHARDCHAIN, SHARD_BLOCK),
     Rejected(Level.SHARDCHAIN, SHARD_BLOCK, "block not accepted")],
]


class Net:
    """One full node and validators, each with a TransportCore, over a SimNetwork."""

    def __init__(self, loss=0.0, duplicate=0.0, reorder=0.0, seed=0, validators=VALIDATORS, **sender_kw):
        self.now = T0
        self.net = SimNetwork(seed, loss=loss, duplicate=duplicate, reorder=reorder, latency=0.002,
                              jitter=0.004, reorder_delay=0.05)
        nodes = [FULLNODE] + list(validators)
        self.tr = {k.key_id: TransportCore(k, {o.public: o.key_id for o in nodes if o is not k}, epoch=1)
                   for k in nodes}
        self.senders = {v.key_id: ReceiptSender(v, stream=1, **sender_kw) for v in validators}
        self.receiver = ReceiptReceiver(FULLNODE, [v.public for v in validators])
        self.delivered: list = []
        self.first_sent: dict[bytes, float] = {}     # receipt bytes -> first time it left
        self.packets = 0
        self.errors: list[str] = []

    def flush(self):
        now = self.now
        for vid, s in self.senders.items():
            for dst, payload in s.packets_to_send(now):
                self.packets += 1
                for r in decode_batch(payload).receipts:
                    self.first_sent.setdefault(r, now)
                self.tr[vid].send(dst, payload, now)
        for dst, payload in self.receiver.packets_to_send(now):
            self.tr[FULLNODE.key_id].send(dst, payload, now)
        for src, t in self.tr.items():
            for data, dst in t.datagrams_to_send(now):
                self.net.send(src, dst, data, now)

    def step(self, until: float):
        while True:
            ts = [t for t in [self.net.next_delivery(), self.receiver.get_timer(),
                              *(s.get_timer() for s in self.senders.values()),
                              *(t.get_timer() for t in self.tr.values())] if t is not None]
            if not ts or min(ts) > until:
                self.now = max(self.now, until)
                self.flush()
                return
            nxt = min(ts)
            self.now = max(self.now, nxt)
            for dst, src, data in self.net.deliver_due(self.now):
                self.tr[dst].receive_datagram(data, src, self.now)
            for kid, t in self.tr.items():
                tt = t.get_timer()
                if tt is not None and tt <= self.now:
                    t.handle_timer(self.now)
                while (ev := t.next_event()) is not None:
                    if not hasattr(ev, "payload"):
                        continue
                    kind = classify(ev.payload)
                    if kid == FULLNODE.key_id:
                        assert kind == "receipt_batch"
                        try:
                            self.receiver.receive(ev.src, ev.payload, self.now)
                        except DeliveryError as exc:
                            self.errors.append(exc.reason)
                    else:
                        assert kind == "receipt_ack"
                        try:
                            self.senders[kid].receive_ack(ev.src, ev.payload, self.now)
                        except DeliveryError as exc:
                            self.errors.append(exc.reason)
            while (ev := self.receiver.next_event()) is not None:
                self.delivered.append(ev)
            self.flush()


def produce(net: Net, n_messages: int, spread: float, seed: int = 0) -> dict[bytes, list[bytes]]:
    """Schedule every validator's statuses for n messages over `spread` seconds; returns
    validator key id -> serialized signed receipts in production order."""
    rng = random.Random(seed)
    plan = []
    for v in VALIDATORS:
        for m in range(n_messages):
            mid = hashlib.sha256(f"msg{m}".encode()).digest()
            seq = SEQUENCES[m % len(SEQUENCES)]
            t = net.now + rng.uniform(0, spread)
            for st in seq:
                t += rng.uniform(0.0, 0.3)
                plan.append((t, v, mid, st))
    plan.sort(key=lambda x: x[0])
    produced: dict[bytes, list[bytes]] = {v.key_id: [] for v in VALIDATORS}
    for t, v, mid, st in plan:
        net.step(t)
        signed = make_signed_receipt(v, mid, st, int(t * 1000))
        produced[v.key_id].append(signed.serialize())
        net.senders[v.key_id].add(FULLNODE.key_id, signed, net.now)
        net.flush()
    return produced


@pytest.mark.parametrize("seed", [1, 2])
def test_every_status_arrives_in_order_with_20_percent_loss(seed):
    net = Net(loss=0.2, duplicate=0.1, reorder=0.2, seed=seed)
    produced = produce(net, 40, 5.0, seed)
    for _ in range(200):
        if all(s.unacked() == 0 for s in net.senders.values()):
            break
        net.step(net.now + 0.5)
    assert all(s.unacked() == 0 for s in net.senders.values())
    total = sum(len(v) for v in produced.values())
    kinds = {d.receipt.kind for d in net.delivered}
    assert {"PutIntoQueue", "AcceptedByQueue", "IncludedIntoBlock", "IncludedIntoAcceptedBlock", "Finalized",
            "RejectedByCollator", "RejectedByQueue", "RejectedByShardchain", "IgnoredByCollator",
            "IgnoredByShardchain", "IgnoredByMasterchain", "Duplicate", "Timeout"} <= kinds
    # count produced = count delivered, per source in production order, nothing twice
    assert len(net.delivered) == total
    for vid, receipts in produced.items():
        got = [d.signed.serialize() for d in net.delivered if d.source == vid]
        assert got == receipts
    # each receipt verifies alone against the validator set (its own signature kept)
    pks = [v.public for v in VALIDATORS]
    for d in net.delivered[::7]:
        verify_receipt_json(signed_to_json(d.signed), pks)
    # the network really was lossy and the sender really resent; batching saved packets
    assert net.net.stats.lost > 50 and sum(s.stats["resends"] for s in net.senders.values()) > 0
    assert sum(s.stats["packets"] for s in net.senders.values()) < total
    assert net.receiver.stats["duplicates_packets"] > 0 and not net.errors


def test_batching_delay_is_at_most_100_ms():
    net = Net(max_delay=0.1)
    rng = random.Random(5)
    added = {}
    t = net.now
    v = VALIDATORS[0]
    for i in range(400):                       # bursts and gaps, up to ~2,000 statuses/s
        t += rng.choice([0.0, 0.0, 0.001, 0.01, 0.05, 0.2])
        net.step(t)
        # not a first status (New: leaves at once, next test)
        signed = make_signed_receipt(v, hashlib.sha256(b"%d" % i).digest(), Accepted(Level.QUEUE), int(t * 1000))
        added[signed.serialize()] = net.now
        net.senders[v.key_id].add(FULLNODE.key_id, signed, net.now)
        net.flush()                             # what a daemon does after feeding a core
    net.step(t + 2.0)
    assert len(net.delivered) == 400
    delays = [net.first_sent[r] - at for r, at in added.items()]
    assert max(delays) <= 0.1 + 1e-9
    assert net.packets < 400 / 2                # bursts were batched
    assert min(delays) == 0.0                   # an isolated status leaves at once


def test_a_first_status_takes_its_batch_along_at_once():
    """A message's first status at a validator (New, PutIntoQueue: the first receipt a user
    waits for) is never held back by batching: its batch leaves at once, with the later
    statuses of other messages that waited; up to 2,144 receipt bytes (two transport parts)
    per packet, so a packet carries ~6 full statuses (it was 990 bytes, 2-3)."""
    net = Net(max_delay=0.1)
    v = VALIDATORS[0]
    snd = net.senders[v.key_id]
    t = net.now
    mids = [hashlib.sha256(b"first%d" % i).digest() for i in range(40)]
    first = make_signed_receipt(v, mids[0], Accepted(Level.QUEUE), int(t * 1000))
    snd.add(FULLNODE.key_id, first, t)                    # idle: leaves at once
    net.flush()
    assert net.packets == 1
    t += 0.01
    net.step(t)
    held = [make_signed_receipt(v, m, Accepted(Level.SHARDCHAIN, SHARD_BLOCK), int(t * 1000)) for m in mids[1:4]]
    for r in held:
        snd.add(FULLNODE.key_id, r, t)
    net.flush()
    assert net.packets == 1                               # within max_delay of the last packet: held
    new = make_signed_receipt(v, mids[4], New(), int(t * 1000))
    snd.add(FULLNODE.key_id, new, t)
    net.flush()
    assert net.packets == 2 and net.first_sent[new.serialize()] == t
    assert all(net.first_sent[r.serialize()] == t for r in held)   # taken along
    # byte-limited batches: full statuses (block ids, ~310 bytes) about 6 per packet
    t += 0.5
    net.step(t)
    before = net.packets
    big = [make_signed_receipt(v, m, Accepted(Level.MASTERCHAIN, SHARD_BLOCK, MC_BLOCK), int(t * 1000))
           for m in mids[5:40]]
    for r in big:
        snd.add(FULLNODE.key_id, r, t)
    net.flush()
    net.step(t + 1.0)
    assert all(r.serialize() in net.first_sent for r in big)
    assert net.packets - before <= 7


def test_urgent_first_holds_the_first_status_of_messages_learned_from_the_rmq():
    """With urgent_first (the daemon passes ValidatorCore.received_directly), only the first
    status of a message the full node sent to this validator itself leaves at once; the
    PutIntoQueue of a message the validator learned from its group's RMQ waits for its batch,
    at most max_delay after the previous packet, and goes in one packet with the others."""
    direct = {hashlib.sha256(b"direct").digest()}
    net = Net(max_delay=0.1, urgent_first=lambda mid: mid in direct)
    v = VALIDATORS[0]
    snd = net.senders[v.key_id]
    t = net.now
    snd.add(FULLNODE.key_id, make_signed_receipt(v, b"\x09" * 32, Accepted(Level.QUEUE), int(t * 1000)), t)
    net.flush()
    assert net.packets == 1                               # idle: leaves at once
    t += 0.01
    net.step(t)
    via_rmq = [make_signed_receipt(v, hashlib.sha256(b"rmq%d" % i).digest(), New(), int(t * 1000)) for i in range(3)]
    for r in via_rmq:
        snd.add(FULLNODE.key_id, r, t)
    net.flush()
    assert net.packets == 1                               # held: not received directly
    mine = make_signed_receipt(v, next(iter(direct)), New(), int(t * 1000))
    snd.add(FULLNODE.key_id, mine, t)
    net.flush()
    assert net.packets == 2 and net.first_sent[mine.serialize()] == t     # at once, others along
    assert all(net.first_sent[r.serialize()] == t for r in via_rmq)
    t += 0.01
    net.step(t)
    late = make_signed_receipt(v, hashlib.sha256(b"rmq-late").digest(), New(), int(t * 1000))
    snd.add(FULLNODE.key_id, late, t)
    net.flush()
    assert late.serialize() not in net.first_sent
    net.step(t + 0.2)
    assert 0 < net.first_sent[late.serialize()] - t <= 0.1 + 1e-9
    assert len(net.delivered) == 6


def test_obsolete_packets_are_abandoned_and_memory_is_bounded():
    net = Net(loss=1.0, max_unacked_per_dst=50)
    s = net.senders[VALIDATORS[0].key_id]
    for i in range(200):
        net.step(net.now + 0.2)                 # one packet per status
        s.add(FULLNODE.key_id, make_signed_receipt(VALIDATORS[0], bytes([i]) * 32, New(), i), net.now)
    # flow control: no ack ever came, so at most the initial window of packets is in flight;
    # the rest wait at the sender (nothing abandoned for space), until they are obsolete
    assert s.unacked() == 200 and s.stats["abandoned_overflow"] == 0
    assert s.stats["packets"] == INITIAL_WINDOW and s.stats["window_full"] >= 1
    s.set_session(1, net.now)
    assert s.unacked() > 0                      # session 0's receipts live through session 1
    s.set_session(2, net.now)                   # obsolete at N + 2
    assert s.unacked() == 0 and s.stats["abandoned_obsolete"] > 0 and s.stats["receipts_abandoned"] == 200
    net.step(net.now + 10)
    assert s.get_timer() is None


def test_receiver_skips_what_the_sender_abandoned_and_keeps_order():
    v = VALIDATORS[0]
    s = ReceiptSender(v, stream=7, max_delay=0.0, initial_window=4)
    r = ReceiptReceiver(FULLNODE, [v.public])
    pk = []
    for i in range(3):
        s.add(FULLNODE.key_id, make_signed_receipt(v, bytes([i]) * 32, New(), i), T0, session=0)
        pk += s.packets_to_send(T0)
    s.set_session(1, T0)
    s.add(FULLNODE.key_id, make_signed_receipt(v, b"\x09" * 32, Timeout(), 9), T0 + 1)
    pk += s.packets_to_send(T0 + 1)
    # packets 1 and 2 are lost; packet 3 arrives first and waits for them
    r.receive(v.key_id, pk[2][1], T0)
    assert r.next_event() is None
    s.set_session(2, T0 + 2)                    # session-0 packets abandoned, session-1 Timeout kept
    again = s.packets_to_send(T0 + 5)           # resend carries base = 4
    assert again and decode_batch(again[-1][1]).base == 4
    for _, p in again:
        r.receive(v.key_id, p, T0 + 5)
    got = [r.next_event() for _ in range(2)]
    assert [g.receipt.message_id[0] for g in got] == [2, 9] and r.next_event() is None
    assert r.stats["skipped"] == 2


def test_restarts_on_either_side():
    v = VALIDATORS[0]
    s1 = ReceiptSender(v, stream=100, max_delay=0.0)
    r = ReceiptReceiver(FULLNODE, [v.public])
    s1.add(FULLNODE.key_id, make_signed_receipt(v, b"\x01" * 32, New(), 1), T0)
    for _, p in s1.packets_to_send(T0):
        r.receive(v.key_id, p, T0)
    assert r.next_event().receipt.message_id == b"\x01" * 32
    # the validator restarts: new stream, seqnos from 1 again; nothing is taken for a duplicate
    s2 = ReceiptSender(v, stream=200, max_delay=0.0)
    s2.add(FULLNODE.key_id, make_signed_receipt(v, b"\x02" * 32, New(), 2), T0 + 1)
    for _, p in s2.packets_to_send(T0 + 1):
        r.receive(v.key_id, p, T0 + 1)
    assert r.next_event().receipt.message_id == b"\x02" * 32
    # an old-stream packet after that is refused precisely
    s1.add(FULLNODE.key_id, make_signed_receipt(v, b"\x03" * 32, New(), 3), T0 + 2)
    with pytest.raises(DeliveryError) as e:
        for _, p in s1.packets_to_send(T0 + 2):
            r.receive(v.key_id, p, T0 + 2)
    assert e.value.reason == "stale_stream"
    # the full node restarts: a fresh receiver starts at the packet's base; packet 1 of
    # stream 200 is not acknowledged yet (r never acked it), so it is resent and comes first
    s2.add(FULLNODE.key_id, make_signed_receipt(v, b"\x04" * 32, New(), 4), T0 + 3)
    r2 = ReceiptReceiver(FULLNODE, [v.public])
    out = s2.packets_to_send(T0 + 3)
    assert [decode_batch(p).seqno for _, p in out] == [2, 1]
    for _, p in out:
        r2.receive(v.key_id, p, T0 + 3)
    assert [r2.next_event().receipt.message_id[0] for _ in range(2)] == [2, 4]
    # acks flow back and empty the sender
    for dst, ack in r2.packets_to_send(T0 + 5):
        s2.receive_ack(FULLNODE.key_id, ack, T0 + 5)
    assert s2.unacked() == 0


def decode_ack_stream(ack: bytes) -> int:
    from remp_node.core.delivery import decode_ack
    return decode_ack(ack).stream


def test_bad_packets_are_refused_precisely():
    v, other = VALIDATORS[0], VALIDATORS[1]
    r = ReceiptReceiver(FULLNODE, [v.public])
    good = make_signed_receipt(v, b"\x05" * 32, New(), 5).serialize()
    cases = {
        "malformed": (v.key_id, b"\xf4\x44\x71\x3d" + b"\x00" * 10),
        "unknown_source": (other.key_id, encode_batch(other, FULLNODE.key_id, 1, 1, 1, [good])),
        "wrong_source": (other.key_id, encode_batch(v, FULLNODE.key_id, 1, 1, 1, [good])),
        "wrong_destination": (v.key_id, encode_batch(v, other.key_id, 1, 1, 1, [good])),
    }
    forged = bytearray(encode_batch(v, FULLNODE.key_id, 1, 1, 1, [good]))
    forged[-40] ^= 1                                       # a bit of the signature
    cases["bad_signature"] = (v.key_id, bytes(forged))
    tampered = bytearray(encode_batch(v, FULLNODE.key_id, 1, 1, 1, [good]))
    tampered[100] ^= 1                                     # a bit of the receipt
    cases["bad_signature "] = (v.key_id, bytes(tampered))
    foreign = make_signed_receipt(other, b"\x05" * 32, New(), 5).serialize()
    cases["malformed "] = (v.key_id, encode_batch(v, FULLNODE.key_id, 1, 1, 1, [foreign]))
    for reason, (src, payload) in cases.items():
        with pytest.raises(DeliveryError) as e:
            r.receive(src, payload, T0)
        assert e.value.reason == reason.strip(), reason
    assert r.next_event() is None and r.stats["receipts"] == 0
    assert r.stats["error_bad_signature"] == 2 and r.stats["error_malformed"] == 2
    # the honest packet still goes through afterwards
    r.receive(v.key_id, encode_batch(v, FULLNODE.key_id, 1, 1, 1, [good]), T0)
    assert r.next_event().signed.serialize() == good
    # a bad ack is refused and counted by the sender
    s = ReceiptSender(v, stream=1)
    for bad in (b"junk", encode_ack(other.key_id, 1, 5, []), encode_ack(v.key_id, 2, 5, [])):
        with pytest.raises(DeliveryError):
            s.receive_ack(FULLNODE.key_id, bad, T0)
    assert s.stats["acks_bad"] == 3


def test_tl_ids_and_classify():
    assert RECEIPT_BATCH == tl_constructor_id(TL_LINES["remp.receiptBatch"])
    assert RECEIPT_BATCH_ACK == tl_constructor_id(TL_LINES["remp.receiptBatchAck"])
    v = VALIDATORS[0]
    signed = make_signed_receipt(v, b"\x05" * 32, New(), 5).serialize()
    msg = encode_remp_message(b"boc", b"\x06" * 32, 1, FULLNODE)
    assert classify(msg) == "client_message" and classify(mux(CH_CLIENT, ZERO32, msg)) == "client_message"
    assert classify(signed) == "receipt" and classify(mux(CH_CLIENT, ZERO32, signed)) == "receipt"
    assert classify(encode_batch(v, FULLNODE.key_id, 1, 1, 1, [signed])) == "receipt_batch"
    assert classify(encode_ack(v.key_id, 1, 1, [])) == "receipt_ack"
    assert classify(mux(CH_RMQ, b"\x07" * 32, b"anything")) == "validator_mux"
    assert classify(b"") == classify(b"\x00" * 40) == "unknown"


def test_real_validator_receipts_all_arrive_with_20_percent_loss():
    """The receipts the REMP validator cores really produce (validator.ReceiptSent events of
    a 4-validator simulation: finalized transfers and a collator reject from a balance race),
    replayed at their production times through ReceiptSender -> TransportCore -> lossy
    SimNetwork -> ReceiptReceiver: count produced = count delivered, order kept per validator."""
    from remp_node.testnet.sim import SimConfig, Simulation
    from remp_node.core.validator import ReceiptSent
    from tests.remp_fixtures import WalletSet

    class Recording(Simulation):
        def _on_validator_event(self, i, ev):
            if isinstance(ev, ReceiptSent):
                produced_events.append((self.now, i, ev))
            super()._on_validator_event(i, ev)

    produced_events = []
    w = WalletSet(8, "delivery-real", balance=10)
    sim = Recording(SimConfig(validators=4, shard_count=1, group_size=4, seed=21, mc_catchain_lifetime=60.0),
                    wallets=w.genesis())
    t0 = int(sim.now)
    mids = [sim.submit(w.transfer(i, 3, t0 + 3600)) for i in range(6)]
    to = w.addresses[0]
    mids += [sim.submit(w.transfer(7, 8, t0 + 3600, dest=to)), sim.submit(w.transfer(7, 9, t0 + 3600, dest=to))]
    assert sim.run_until(lambda: all(sim.finals.get(m) for m in mids), 60.0)
    kinds = {ev.kind for _, _, ev in produced_events}
    assert {"PutIntoQueue", "AcceptedByQueue", "IncludedIntoBlock", "IncludedIntoAcceptedBlock", "Finalized",
            "RejectedByCollator"} <= kinds, kinds
    validators = sim.keys
    net = Net(loss=0.2, duplicate=0.1, reorder=0.2, seed=9, validators=validators)
    net.receiver = ReceiptReceiver(FULLNODE, [k.public for k in validators])
    offset = net.now - produced_events[0][0]
    produced = {k.key_id: [] for k in validators}
    for at, i, ev in produced_events:
        net.step(at + offset)
        vid = validators[i].key_id
        produced[vid].append(ev.signed.serialize())
        net.senders[vid].add(FULLNODE.key_id, ev.signed, net.now)
        net.flush()
    for _ in range(200):
        if all(s.unacked() == 0 for s in net.senders.values()):
            break
        net.step(net.now + 0.5)
    assert len(net.delivered) == sum(len(v) for v in produced.values()) == len(produced_events)
    for vid, receipts in produced.items():
        assert [d.signed.serialize() for d in net.delivered if d.source == vid] == receipts
    pks = [k.public for k in validators]
    for d in net.delivered:
        verify_receipt_json(signed_to_json(d.signed), pks)
    assert net.net.stats.lost > 10


def test_validator_crash_loses_no_receipt_with_the_outbox_journal():
    """A validator is killed mid-run (sender, transport and everything in flight gone);
    the restarted one restores the journal's receipts without "done" into a new stream.
    With 20% loss: every receipt ever produced is delivered, exactly once, in order."""
    v = VALIDATORS[0]
    net = Net(loss=0.2, duplicate=0.1, reorder=0.2, seed=5, validators=[v], journal=True)
    store: dict[bytes, tuple] = {}          # digest -> (dst, receipt, session), insertion order

    def persist():
        for ch in net.senders[v.key_id].journal_updates():
            if ch.kind == "add":
                store[ch.digest] = (ch.dst, ch.receipt, ch.session)
            else:
                store.pop(ch.digest, None)

    flush = net.flush

    def durable_flush():                    # journal written before the packets leave
        out = []
        for vid, s in net.senders.items():
            out += [(vid, dst, p) for dst, p in s.packets_to_send(net.now)]
        persist()
        for vid, dst, p in out:
            net.tr[vid].send(dst, p, net.now)
        flush()
    net.flush = durable_flush
    produced = []
    rng = random.Random(3)

    def produce_some(n):
        for i in range(n):
            net.step(net.now + rng.uniform(0, 0.05))
            signed = make_signed_receipt(v, hashlib.sha256(b"crash%d" % len(produced)).digest(), New(),
                                         int(net.now * 1000))
            produced.append(signed.serialize())
            net.senders[v.key_id].add(FULLNODE.key_id, signed, net.now)
            net.flush()

    produce_some(120)
    # the kill comes right after a receipt reached the full node and before its ack (20 ms
    # ack delay) got back: the restored sender sends it again (a duplicate the receiver drops)
    def delivered_unacked() -> bool:
        d = net.senders[v.key_id]._dsts[FULLNODE.key_id]
        src = net.receiver._src.get(v.key_id)
        return bool(d.unacked) and src is not None and next(iter(d.unacked)) < src.next_seq
    for _ in range(100):
        produce_some(1)
        net.step(net.now + 0.008)
        if delivered_unacked():
            break
    assert delivered_unacked()
    assert net.senders[v.key_id].unacked() > 0 and store       # killed with receipts in flight
    # SIGKILL: a new sender (new stream) and a new transport core (new epoch)
    net.senders[v.key_id] = ReceiptSender(v, stream=2, journal=True)
    net.tr[v.key_id] = TransportCore(v, {FULLNODE.public: FULLNODE.key_id}, epoch=2)
    net.senders[v.key_id].restore(list(store.values()), net.now)
    assert net.senders[v.key_id].stats["restored"] == len(store)
    produce_some(60)
    for _ in range(200):
        if net.senders[v.key_id].unacked() == 0:
            break
        net.step(net.now + 0.5)
    persist()
    got = [d.signed.serialize() for d in net.delivered]
    assert got == produced                  # all, once, in production order
    assert net.receiver.stats["duplicates_receipts"] > 0   # delivered, not yet acked at the kill
    assert not store                        # every journaled receipt is done
    assert set(net.errors) <= {"stale_stream"}     # late acks for the dead stream, refused


def test_resends_behind_a_silent_full_node_stay_bounded():
    """A full node that acknowledges nothing (overloaded, or every ack lost): the sender
    resends the oldest RESEND_WINDOW packets per retransmission timeout, backing off to
    resend_max, not every unacknowledged packet (each used to go again every 2 s: 776 receipt
    packets per message at 40 msg/s in bench_remp_daemon). A packet resent with the same
    base is the same signed bytes (no new signature)."""
    from remp_node.core.delivery import RESEND_WINDOW
    v = VALIDATORS[0]
    s = ReceiptSender(v, stream=1, max_delay=0.0, resend_initial=0.25, resend_max=2.0, initial_window=512)
    first: dict[int, bytes] = {}
    for i in range(300):
        s.add(FULLNODE.key_id, make_signed_receipt(v, hashlib.sha256(b"%d" % i).digest(), New(), i), T0 + i * 0.01)
        for _, p in s.packets_to_send(T0 + i * 0.01):
            first[decode_batch(p).seqno] = p
    assert s.stats["packets"] == 300
    resent = []
    t = T0 + 3.0
    while t < T0 + 63.0:
        at = s.get_timer()
        t = max(t, at)
        resent += s.packets_to_send(t)
    # 60 s of silence: at most RESEND_WINDOW packets per firing, firings every <= 2 s
    assert 0 < len(resent) <= RESEND_WINDOW * (60 / 2.0 + 4)
    assert {decode_batch(p).seqno for _, p in resent} <= set(range(1, RESEND_WINDOW + 1))
    assert all(p == first[decode_batch(p).seqno] for _, p in resent)   # base unchanged: same bytes
    # the full node comes back: one cumulative ack through 150, 0.1 s after the timer's last
    # resend of 1-4 (a prompt answer) -> the next hole goes at once
    s.receive_ack(FULLNODE.key_id, encode_ack(v.key_id, 1, 150, ()), t + 0.1)
    out = s.packets_to_send(t + 0.1)
    assert [decode_batch(p).seqno for _, p in out] == list(range(151, 151 + RESEND_WINDOW))
    assert all(decode_batch(p).base == 151 for _, p in out)   # re-signed: base moved


def test_a_prompt_ack_resends_the_next_old_packet_at_once_a_late_one_does_not():
    """After an outage the full node answers the timer's resends promptly: the ack reveals
    that the next unacknowledged packets (sent once, long ago) are old, and they go at once
    instead of RESEND_WINDOW per (backed off) timeout. A full node that is only late (acks
    come seconds after the packets, which still wait in its queue) gets no resend from an
    ack: nothing goes before the timer."""
    v = VALIDATORS[0]

    def sender_with(n, t0):
        s = ReceiptSender(v, stream=1, max_delay=0.0, resend_initial=0.25, resend_max=2.0, initial_window=64)
        for i in range(n):
            s.add(FULLNODE.key_id, make_signed_receipt(v, hashlib.sha256(b"p%d" % i).digest(), New(), i),
                  t0 + i * 0.01)
            assert len(s.packets_to_send(t0 + i * 0.01)) == 1
        return s

    # late: 12 packets, the ack through 1 comes 3 s after 1 (the timer resent 1-4 meanwhile,
    # the last time at ~T0 + 1.76, more than resend_initial before the ack)
    s = sender_with(12, T0)
    while True:
        at = s.get_timer()
        if at > T0 + 3.0:
            break
        s.packets_to_send(at)
    before = s.stats["resends"]
    s.receive_ack(FULLNODE.key_id, encode_ack(v.key_id, 1, 1, ()), T0 + 3.0)
    assert s.packets_to_send(T0 + 3.0) == [] and s.stats["resends"] == before
    # prompt, after an outage: the timer's resend of 1-4 at `at` is acknowledged 20 ms later
    s = sender_with(12, T0)
    while True:
        at = s.get_timer()
        s.packets_to_send(at)
        if at > T0 + 10.0:
            break
    s.receive_ack(FULLNODE.key_id, encode_ack(v.key_id, 1, 4, ()), at + 0.02)
    out = s.packets_to_send(at + 0.02)
    assert [decode_batch(p).seqno for _, p in out] == [5, 6, 7, 8]


def test_retransmission_timeout_follows_the_ack_round_trip():
    """Acks that come back 0.8 s after each packet (a loaded full node) raise the timeout
    above 0.8 s, so packets waiting for their ack are not resent spuriously."""
    v = VALIDATORS[0]
    s = ReceiptSender(v, stream=1, max_delay=0.0, resend_initial=0.25, resend_max=2.0, initial_window=64)
    t = T0
    for i in range(40):
        s.add(FULLNODE.key_id, make_signed_receipt(v, hashlib.sha256(b"rtt%d" % i).digest(), New(), i), t)
        s.packets_to_send(t)
        if i >= 8:            # the ack of packet i - 7 (sent 0.8 s ago) arrives
            s.receive_ack(FULLNODE.key_id, encode_ack(v.key_id, 1, i - 7, ()), t)
        t += 0.1
    assert s._dsts[FULLNODE.key_id].rto > 0.8
    before = s.stats["resends"]
    for i in range(33, 41):   # the rest are acknowledged in time: nothing was resent meanwhile
        s.packets_to_send(t)
        s.receive_ack(FULLNODE.key_id, encode_ack(v.key_id, 1, i, ()), t)
        t += 0.1
    assert s.stats["resends"] == before


def test_packets_grow_to_four_parts_on_a_clean_path_and_shrink_after_a_hole():
    """While nothing has to be resent, a packet carries up to max_batch_bytes (four transport
    parts: at 100 msg/s the packet size, not max_delay, sets how many packets, signatures
    and full-node verifies there are); after a resend (a packet or its ack lost) packets
    stay at lossy_batch_bytes (two parts) for loss_memory seconds, then grow again. Every
    receipt still arrives, once."""
    from remp_node.core.delivery import unwrap
    v = VALIDATORS[0]
    snd = ReceiptSender(v, stream=1, max_delay=0.1, initial_window=4)
    rcv = ReceiptReceiver(FULLNODE, [v.public])
    mids = [hashlib.sha256(b"grow%d" % i).digest() for i in range(400)]
    made = [make_signed_receipt(v, m, Accepted(Level.MASTERCHAIN, SHARD_BLOCK, MC_BLOCK), 1000 + i).serialize()
            for i, m in enumerate(mids)]
    t = T0
    sizes, got = [], []

    def burst(rs, drop_first=False):
        nonlocal t
        this_burst = set(rs)
        t += 0.5
        for r in rs:
            snd.add(FULLNODE.key_id, r, t)
        out = snd.packets_to_send(t + 0.2)
        for i, (_dst, p) in enumerate(out):
            carried = decode_batch(p).receipts
            if set(carried) <= this_burst:                     # new packets (not resends of old ones)
                sizes.append(sum(len(x) for x in carried))
            if drop_first and i == 0:
                continue                                   # lost on the way
            rcv.receive(v.key_id, p, t)
        while (ev := rcv.next_event()) is not None:
            got.append(ev.signed.serialize())
        for _dst, a in rcv.packets_to_send(t + 1.0):
            snd.receive_ack(FULLNODE.key_id, unwrap(a), t)
        return len(out)

    burst(made[:40])
    clean = sizes[:]
    assert max(clean) > 2144 and all(s <= 4452 for s in clean)
    sizes.clear()
    burst(made[40:80], drop_first=True)                    # lost: the later ones wait behind it
    assert snd.stats["lossy_periods"] == 0
    t += 0.5
    for _dst, p in snd.packets_to_send(t):                 # the retransmission timer: resent
        rcv.receive(v.key_id, p, t)
    assert snd.stats["resends"] >= 1 and snd.stats["lossy_periods"] == 1
    sizes.clear()
    burst(made[80:120])
    assert sizes and all(s <= 2144 for s in sizes)
    t += snd.loss_memory                                   # nothing lost since: big again
    sizes.clear()
    burst(made[120:160])
    assert max(sizes) > 2144
    for _ in range(20):                                    # the lost packet is resent
        t += 2.5
        for _dst, p in snd.packets_to_send(t):
            rcv.receive(v.key_id, p, t)
        while (ev := rcv.next_event()) is not None:
            got.append(ev.signed.serialize())
        for _dst, a in rcv.packets_to_send(t + 1.0):
            snd.receive_ack(FULLNODE.key_id, unwrap(a), t)
    assert sorted(got) == sorted(made[:160]) and len(got) == 160


def test_a_decoded_batch_verifies_over_the_bytes_received_as_packed_anew():
    """decode_batch keeps the received bytes the signature covers (no second serialization):
    they are exactly what the sender signed, for batches of 0..20 receipts, and a bit flipped
    anywhere before the signature (header fields included) fails the packet's verify."""
    from remp_node.wire.batches import Batch
    from remp_node.wire.keys import verify
    v = VALIDATORS[0]
    receipts = [make_signed_receipt(v, bytes([i]) * 32, st, 1000 + i).serialize()
                for i, st in enumerate([New(), Accepted(Level.QUEUE), Accepted(Level.COLLATOR, SHARD_BLOCK),
                                        Accepted(Level.MASTERCHAIN, SHARD_BLOCK, MC_BLOCK),
                                        Rejected(Level.COLLATOR, SHARD_BLOCK, "x" * 300)] * 4)]
    for n in (0, 1, 5, 20):
        packet = encode_batch(v, FULLNODE.key_id, 7, 9, 3, receipts[:n])
        b = decode_batch(packet)
        anew = Batch(b.source_id, b.dst, b.stream, b.seqno, b.base, b.receipts, b.signature)
        assert b.received_signed is not None and b.signed_part() == anew.signed_part()
        assert verify(v.public, b.signed_part(), b.signature)
        for at in (5, 70, 90, len(packet) - 70):      # source_id, stream, seqno, last receipt
            bad = bytearray(packet)
            bad[at] ^= 1
            try:
                d = decode_batch(bytes(bad))
            except DeliveryError:
                continue
            assert not verify(v.public, d.signed_part(), d.signature), (n, at)
