"""RMQ over the real REMP catchain, in memory with a fake clock: put-once propagation,
duplicates by body, forwarding at a session switch with body fetch, lifetime, faults."""
from __future__ import annotations

import pytest

from remp_node.core.cache import CacheStatus, MessageCache
from remp_node.testnet.network import SimNetwork
from remp_node.core.rmq import (MessageAcceptedByQueue, MessageDuplicate, MessageQueued,
                           MessageRejectedByQueue, RecordDropped, ReliableMessageQueue,
                           Record, decode_record, RmqWireError)
from remp_node.core.state import make_wallet_message, wallet_address

from tests.remp_fixtures import RmqHarness, T0, catchain_factory, keys, parse, same_body_new_id

pytest.importorskip("remp_node.core.catchain", reason="remp_node/core/catchain.py is not in the tree yet")

SHARD = 0x8000000000000000
CLIENT = b"\xcc" * 32


def wallet_msgs(n: int, tag: str = "w") -> list[bytes]:
    ks = keys(n, tag)
    out = []
    for i, k in enumerate(ks):
        src = wallet_address(k.public)
        out.append(make_wallet_message(k, src, src, 1, int(T0) + 3600, nonce=i))
    return out


def build(members, session, cur, prev, h: RmqHarness, caches=None, bodies=None):
    qs = []
    for k in members:
        cache = caches[k.key_id] if caches is not None else MessageCache()
        q = ReliableMessageQueue(0, SHARD, session, [m.public for m in cur], [m.public for m in prev], k,
                                 cache, parse, catchain_factory,
                                 bodies=(bodies or {}).get(k.key_id))
        h.add(q)
        qs.append(q)
    return qs


def kinds(evs, mid):
    return [type(e).__name__ for e in evs if getattr(e, "message_id", None) == mid]


def test_client_message_put_into_catchain_once_and_reaches_all():
    net = SimNetwork(seed=1)
    h = RmqHarness(net)
    ks = keys(7, "rmq1")
    qs = build(ks, 5, ks, [], h)
    msgs = [parse(b) for b in wallet_msgs(10)]
    for m in msgs:
        qs[0].add_client_message(m, CLIENT, h.now)
    h.run(1.0)
    for kid, evs in h.events.items():
        for m in msgs:
            ks_ = kinds(evs, m.id)
            assert ks_.count("MessageAcceptedByQueue") == 1, ks_
            if kid == qs[0].local.key_id:
                assert ks_ == ["MessageQueued", "MessageAcceptedByQueue"]
            else:
                assert ks_ == ["MessageQueued", "MessageAcceptedByQueue"]
                q = next(e for e in evs if isinstance(e, MessageQueued) and e.message_id == m.id)
                assert q.via == "catchain" and q.new_to_node and q.origin == CLIENT and q.master_seqno == 5
    # exactly one record per message went into the catchain (nobody re-broadcast)
    assert sum(q.stats["records_submitted"] for q in qs) == 10
    # a later client copy to another validator is KNOWN and not re-broadcast
    for m in msgs:
        qs[3].add_client_message(m, CLIENT, h.now)
    h.run(0.5)
    assert sum(q.stats["records_submitted"] for q in qs) == 10
    # every member has the same queue order
    orders = [[p.message_id for p in q.pending()] for q in qs]
    assert all(o == orders[0] for o in orders) and len(orders[0]) == 10


def test_duplicate_by_body_and_wrong_shard():
    net = SimNetwork(seed=2)
    h = RmqHarness(net)
    ks = keys(4, "rmq2")
    half = 0x4000000000000000
    qs = []
    for k in ks:
        q = ReliableMessageQueue(0, half, 1, [m.public for m in ks], [], k, MessageCache(), parse,
                                 catchain_factory,
                                 shard_check=lambda p: p.account[0] < 0x80)
        h.add(q)
        qs.append(q)
    boc = next(b for b in wallet_msgs(20, "rmq2w") if parse(b).account[0] < 0x80)
    other = next(b for b in wallet_msgs(20, "rmq2w") if parse(b).account[0] >= 0x80)
    m = parse(boc)
    qs[0].add_client_message(m, CLIENT, h.now)
    h.run(0.5)
    twin = parse(same_body_new_id(boc))
    assert twin.id != m.id and twin.uid == m.uid
    qs[1].add_client_message(twin, CLIENT, h.now)
    qs[2].add_client_message(parse(other), CLIENT, h.now)
    h.run(0.5)
    dup = [e for e in h.events[ks[1].key_id] if isinstance(e, MessageDuplicate)]
    assert [(d.message_id, d.original_id) for d in dup] == [(twin.id, m.id)]
    rej = [e for e in h.events[ks[2].key_id] if isinstance(e, MessageRejectedByQueue)]
    assert len(rej) == 1 and "not for shard" in rej[0].reason
    assert all(len(q.pending()) == 1 for q in qs)


def test_forward_at_session_switch_with_body_fetch_and_lifetime():
    net = SimNetwork(seed=3)
    h = RmqHarness(net)
    ks = keys(8, "rmq3")
    g1, g2 = ks[:4], ks[4:]
    caches = {k.key_id: MessageCache() for k in ks}
    bodies = {k.key_id: {} for k in ks}
    s1 = build(g1, 1, g1, [], h, caches, bodies)
    msgs = [parse(b) for b in wallet_msgs(6, "rmq3w")]
    for i, m in enumerate(msgs):
        s1[i % 2].add_client_message(m, CLIENT, h.now)        # originators: g1[0], g1[1]
    h.run(1.0)
    # message 0 was finalized in session 1 (every g1 member saw the master block): only a
    # digest travels, and nobody fetches its body
    for k in g1:
        caches[k.key_id].set_status(msgs[0].id, CacheStatus.FINALIZED)
    # an old message from session 0 must not be forwarded into session 2
    stale = parse(wallet_msgs(1, "rmq3stale")[0])
    caches[g1[0].key_id].add(stale.id, stale.uid, 0)
    s1[0].queue[stale.id] = type(s1[0].queue[msgs[1].id])(stale.id, stale.uid, 0, CLIENT, stale.boc, order=99, local=True)
    h2 = RmqHarness(net, h.now)
    s2_new = build(g2, 2, g2, g1, h2, caches, bodies)
    s2_old = build(g1, 2, g2, g1, h2, caches, bodies)
    net.crashed.add(g1[1].key_id)     # an originator crashed: its messages arrive as digests only
    for q_old, q in zip(s1, s2_old):
        if q.local.key_id in net.crashed:
            continue
        recs = q_old.forward_records(2)
        assert stale.id not in {r.message_id for r in recs}
        fin = [r for r in recs if r.message_id == msgs[0].id]
        if q_old is s1[0]:
            assert fin[0].body is None and fin[0].finished
        q.add_forwarded(recs, h2.now)
    h2.run(2.0)
    for q in s2_new:
        evs = h2.events[q.local.key_id]
        pend = {p.message_id for p in q.pending()}
        assert pend == {m.id for m in msgs[1:]}, q
        for m in msgs[1:]:
            assert kinds(evs, m.id) == ["MessageQueued", "MessageAcceptedByQueue"]
        assert kinds(evs, msgs[0].id) == []          # finalized: replay info only
        assert caches[q.local.key_id].get(msgs[0].id) is not None
    # bodies of the crashed originator's messages were fetched from other members
    assert sum(q.stats["bodies_fetched"] for q in s2_new) >= len(g2) * 2


def test_lossy_network_all_members_converge():
    net = SimNetwork(seed=4, loss=0.2, duplicate=0.2, reorder=0.2)
    h = RmqHarness(net)
    ks = keys(7, "rmq4")
    qs = build(ks, 3, ks, [], h)
    msgs = [parse(b) for b in wallet_msgs(20, "rmq4w")]
    for i, m in enumerate(msgs):
        qs[i % 3].add_client_message(m, CLIENT, h.now)
    h.run(6.0)
    for q in qs:
        assert {p.message_id for p in q.pending()} == {m.id for m in msgs}
        acc = [e for e in h.events[q.local.key_id] if isinstance(e, MessageAcceptedByQueue)]
        assert len(acc) == len(msgs)                       # each exactly once
    orders = [[p.message_id for p in q.pending()] for q in qs]
    assert all(sorted(o) == sorted(orders[0]) for o in orders)


def test_records_parse_strictly():
    rec = Record(b"\x01" * 32, b"\x02" * 32, 7, CLIENT, b"boc")
    assert decode_record(rec.pack()) == rec
    dig = Record(b"\x01" * 32, b"\x02" * 32, 7, CLIENT, None, True)
    assert decode_record(dig.pack()) == dig
    for bad in (b"", rec.pack()[:-1], rec.pack() + b"\0\0\0\0", b"\xff" * 80):
        with pytest.raises(RmqWireError):
            decode_record(bad)


def test_forged_record_is_dropped():
    net = SimNetwork(seed=5)
    h = RmqHarness(net)
    ks = keys(4, "rmq5")
    qs = build(ks, 1, ks, [], h)
    m = parse(wallet_msgs(1, "rmq5w")[0])
    forged = Record(b"\x09" * 32, m.uid, 1, CLIENT, m.boc)      # id does not match the BOC
    qs[0].catchain.submit(forged.pack(), h.now)
    h.run(0.5)
    for q in qs:
        assert q.pending() == []
        assert any(isinstance(e, RecordDropped) and "do not match" in e.reason for e in h.events[q.local.key_id])
