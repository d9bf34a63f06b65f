"""Receipt flow control, the end of a message's subscriptions, and outcomes from the chain,
on the sans-I/O cores with a fake clock (delivery.ReceiptSender / ReceiptReceiver,
client.RempClient).

- a full node with a small reorder buffer behind a lossy path: the validators never send
  more than the window it advertises, so no packet is refused for buffer space and every
  receipt arrives in order (the buffer_full refusals under a burst);
- MessageSettled: after the final decision, a message stays open until every expected
  validator sent its own final status, or the grace period;
- chain_finalized / chain_session: a message whose receipts never came is finalized from
  the chain, and declared Timeout only once the chain is past the replay window.
"""
from __future__ import annotations

import hashlib

from remp_node.core.client import FinalStatus, MessageSettled, ReceiptEvent
from remp_node.core.delivery import ReceiptReceiver, decode_ack, encode_ack
from remp_node.wire.receipts import Accepted, Level, New, make_signed_receipt

from tests.test_remp_client import (BY_ID, G1, MC_BLOCK, SHARD_BLOCK, T0, Net as ClientNet, client,
                                    wallet_msg)
from tests.test_remp_delivery import FULLNODE, VALIDATORS, Net, SEQUENCES


def test_a_small_receive_buffer_behind_loss_refuses_nothing_and_loses_nothing():
    net = Net(loss=0.15, reorder=0.2, seed=3, max_delay=0.0)
    net.receiver = ReceiptReceiver(FULLNODE, [v.public for v in VALIDATORS], max_buffered=3)
    produced = {v.key_id: [] for v in VALIDATORS}
    for m in range(150):
        mid = hashlib.sha256(b"flow%d" % m).digest()
        for v in VALIDATORS:
            for i, st in enumerate(SEQUENCES[m % len(SEQUENCES)]):
                sr = make_signed_receipt(v, mid, st, int(net.now * 1000) + i)
                produced[v.key_id].append(sr.serialize())
                net.senders[v.key_id].add(FULLNODE.key_id, sr, net.now)
        net.step(net.now + 0.01)
    net.step(net.now + 120)
    assert net.receiver.stats["error_buffer_full"] == 0, net.receiver.stats
    assert "buffer_full" not in net.errors
    for v in VALIDATORS:
        got = [e.signed.serialize() for e in net.delivered if e.source == v.key_id]
        assert got == produced[v.key_id]          # every receipt, in production order
        s = net.senders[v.key_id]
        assert s.stats["window_full"] > 0 and s.stats["receipts_abandoned"] == 0
        assert s.unacked() == 0


def test_ack_carries_the_receivers_window():
    r = ReceiptReceiver(FULLNODE, [VALIDATORS[0].public], max_buffered=7)
    v = VALIDATORS[0]
    from remp_node.core.delivery import ReceiptSender
    s = ReceiptSender(v, stream=1, max_delay=0.0)
    s.add(FULLNODE.key_id, make_signed_receipt(v, b"\x01" * 32, New(), 1), T0)
    (dst, p), = s.packets_to_send(T0)
    r.receive(v.key_id, p, T0)
    (src, ack), = r.packets_to_send(T0 + 1)
    assert decode_ack(ack).window == 7 and decode_ack(ack).through == 1
    # an ack without a window (the first TL object) still parses
    assert decode_ack(encode_ack(v.key_id, 1, 1, ())).window is None


def _finals(net):
    return [e for e in net.events if isinstance(e, FinalStatus)]


def _settled(net):
    return [e for e in net.events if isinstance(e, MessageSettled)]


def test_subscription_stays_open_until_every_group_member_is_final():
    c = client(late_memory=30.0)
    net = ClientNet(c, answer=lambda v, mid: [New()])
    mid = c.submit(wallet_msg(), T0)
    net.run(T0 + 5)                          # 3 validators answered New
    answered = {d for _, d in net.delivered}
    first = BY_ID[net.delivered[0][1]]
    net.send_receipt(first, mid, Accepted(Level.MASTERCHAIN, SHARD_BLOCK, MC_BLOCK), T0 + 6)
    net.step(T0 + 6)
    assert [f.outcome for f in _finals(net)] == ["finalized"] and _settled(net) == []
    # every other member of the group the message went to sends its Finalized, late
    for i, v in enumerate(G1):
        if v is first:
            continue
        net.send_receipt(v, mid, Accepted(Level.MASTERCHAIN, SHARD_BLOCK, MC_BLOCK), T0 + 7 + i * 0.1)
        net.step(T0 + 7 + i * 0.1)
    late = [e for e in net.events if isinstance(e, ReceiptEvent) and e.late]
    assert len(late) == len(G1) - 1 and answered <= {v.key_id for v in G1}
    assert [s.reason for s in _settled(net)] == ["complete"] and not c.settling(mid)


def test_subscription_ends_after_the_grace_period_when_a_member_stays_silent():
    c = client(late_memory=30.0)
    net = ClientNet(c, answer=lambda v, mid: [New()])
    mid = c.submit(wallet_msg(), T0)
    net.run(T0 + 5)
    first = BY_ID[net.delivered[0][1]]
    net.send_receipt(first, mid, Accepted(Level.MASTERCHAIN, SHARD_BLOCK, MC_BLOCK), T0 + 6)
    net.step(T0 + 6)
    net.step(T0 + 20)
    assert _settled(net) == [] and c.settling(mid)
    net.step(T0 + 36.1)
    assert [s.reason for s in _settled(net)] == ["grace"] and not c.settling(mid)


def test_finalized_from_the_chain_without_any_receipt_and_timeout_only_past_the_replay_window():
    session = {"n": 5}
    c = client(lifetime=None, session_at=lambda now: session["n"])
    net = ClientNet(c, answer=lambda v, mid: [])           # no receipt ever arrives
    a = c.submit(wallet_msg(1), T0)
    b = c.submit(wallet_msg(2), T0)
    net.run(T0 + 600)                                      # ten minutes: no wall-clock timeout
    assert _finals(net) == []
    assert c.chain_finalized(a, SHARD_BLOCK, MC_BLOCK, T0 + 601)
    net.step(T0 + 601)
    (fa,) = _finals(net)
    assert fa.message_id == a and fa.outcome == "finalized"
    own = [e for e in net.events if isinstance(e, ReceiptEvent) and e.message_id == a and e.kind == "Finalized"]
    assert own[0].origin == "fullnode" and own[0].receipt.status.master_id == MC_BLOCK
    last = max(e for e in [session["n"]])                  # b was last sent in session 5
    assert c.chain_session(last + 2, T0 + 602) == 0        # validators may still hold it
    assert c.chain_session(last + 3, T0 + 603) == 1
    net.step(T0 + 603)
    fb = [f for f in _finals(net) if f.message_id == b]
    assert fb and fb[0].outcome == "timeout" and "replay window" in fb[0].reason


def test_admission_bounds_pending_and_rate_limits_each_client():
    from remp_node.api.server import Admission
    a = Admission(max_pending=5, rate=2.0, burst=3.0)
    assert a.check("c1", 5, 0.0) == ("pending_full", Admission.MAX_RETRY_AFTER)   # no finalize rate yet
    for t in range(20):
        a.final(0.5 * t / 20)                     # 20 finals in the last 10 s: 2 per second
    assert a.check("c1", 8, 1.0) == ("pending_full", 2)                 # 4 over the bound / 2 per s
    assert [a.check("c1", 0, 1.0) for _ in range(3)] == [None, None, None]   # the burst
    assert a.check("c1", 0, 1.0) == ("client_rate", 1)
    assert a.check("c2", 0, 1.0) is None                                # another client has its own
    assert a.check("c1", 0, 1.5) is None                                # one token back after 0.5 s
    assert a.check("c1", 0, 1.5)[0] == "client_rate"


def test_admission_pending_bound_follows_the_finalize_rate():
    """With pending_seconds the bound is what the full node finalizes in that time at its
    recent rate (never below the floor, never above max_pending): under overload accepted
    messages wait about pending_seconds, the rest is refused at once."""
    from remp_node.api.server import Admission
    a = Admission(max_pending=1000, pending_seconds=1.5, pending_floor=20)
    assert a.bound(0.0) == 20                                           # nothing finalized yet: the floor
    assert a.check("c", 19, 0.0) is None
    assert a.check("c", 20, 0.0) == ("pending_full", 2)                 # retry after ~pending_seconds
    for i in range(1000):                                               # 100 finals per s for 10 s
        a.final(i / 100)
    assert a.bound(10.0) == 150                                         # 100/s x 1.5 s
    assert a.check("c", 149, 10.0) is None
    assert a.check("c", 200, 10.0) == ("pending_full", 1)               # 51 over / 100 per s -> 1 s
    assert a.bound(30.0) == 20                                          # idle again: back to the floor
    capped = Admission(max_pending=50, pending_seconds=10.0, pending_floor=20)
    for i in range(1000):
        capped.final(i / 100)
    assert capped.bound(10.0) == 50                                     # never above max_pending
    assert Admission(max_pending=50).bound(0.0) == 50                   # pending_seconds 0: max_pending
