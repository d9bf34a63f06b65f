"""TransportCore driven in memory: cores against each other over
network.SimNetwork with a fake clock (loss, duplication, reordering), and each bad input
of must-show 4 fed to a core while honest traffic keeps flowing."""
from __future__ import annotations

import hashlib
import os
import random

import pytest

from remp_node.wire.keys import NodeKey
from remp_node.testnet.network import SimNetwork
from remp_node.transport.core import (DROP_REASONS, HEADER_SIZE, MAX_PART_SIZE, OVERHEAD, DatagramDropped,
                                 PayloadReceived, TransportCore, TransportError, TransportLimits)

T0 = 1_700_000_000.0


def key(tag: str) -> NodeKey:
    return NodeKey.from_seed(hashlib.sha256(tag.encode()).digest())


A, B, C, M = key("tr-a"), key("tr-b"), key("tr-c"), key("tr-mallory")


class Mesh:
    """Transport cores over a SimNetwork; addresses are key ids."""

    def __init__(self, keys=(A, B, C), limits=None, epochs=None, **net):
        self.now = T0
        self.net = SimNetwork(net.pop("seed", 0), latency=0.002, jitter=0.004, **net)
        self.cores = {}
        for k in keys:
            self.cores[k.key_id] = TransportCore(
                k, {o.public: o.key_id for o in keys if o is not k},
                limits=(limits or {}).get(k.key_id, TransportLimits()), epoch=(epochs or {}).get(k.key_id, 1))
        self.got: dict[bytes, list] = {k.key_id: [] for k in keys}
        self.drops: dict[bytes, list] = {k.key_id: [] for k in keys}

    def flush(self):
        for kid, c in self.cores.items():
            for data, dst in c.datagrams_to_send(self.now):
                assert len(data) <= MAX_PART_SIZE
                self.net.send(kid, dst, data, self.now)

    def inject(self, dst: bytes, data: bytes, addr=b"attacker"):
        self.cores[dst].receive_datagram(data, addr, self.now)
        self.drain()

    def drain(self):
        for kid, c in self.cores.items():
            while (ev := c.next_event()) is not None:
                (self.got if isinstance(ev, PayloadReceived) else self.drops)[kid].append(ev)

    def run(self, seconds: float):
        end = self.now + seconds
        self.flush()
        while True:
            ts = [t for t in [self.net.next_delivery(), *(c.get_timer() for c in self.cores.values())]
                  if t is not None]
            if not ts or min(ts) > end:
                self.now = end
                return
            self.now = max(self.now, min(ts))
            for dst, src, data in self.net.deliver_due(self.now):
                self.cores[dst].receive_datagram(data, src, self.now)
            for c in self.cores.values():
                t = c.get_timer()
                if t is not None and t <= self.now:
                    c.handle_timer(self.now)
            self.drain()
            self.flush()


SIZES = [0, 1, 100, 1154, 1155, 2308, 2309, 16384, 65535, 65535 + 4096]


def test_payloads_of_every_size_arrive_intact_in_parts_of_at_most_1232_bytes():
    m = Mesh()
    payloads = [os.urandom(n) for n in SIZES]
    for p in payloads:
        m.cores[A.key_id].send(B.key_id, p, m.now)
    sent = m.cores[A.key_id].counters["sent_datagrams"]
    m.run(1.0)
    assert sorted((e.src, e.payload) for e in m.got[B.key_id]) == sorted((A.key_id, p) for p in payloads)
    assert sent == sum(max(1, -(-n // (MAX_PART_SIZE - OVERHEAD))) for n in SIZES)
    assert m.net.stats.sent == sent and not m.drops[B.key_id]
    with pytest.raises(TransportError) as e:
        m.cores[A.key_id].send(B.key_id, b"x" * (65535 + 4097), m.now)
    assert not isinstance(e.value, ValueError)
    with pytest.raises(TransportError):
        m.cores[A.key_id].send(M.key_id, b"x", m.now)
    with pytest.raises(TransportError):
        m.cores[A.key_id].add_peer(M.key_id, B.public, ("127.0.0.1", 1))


def test_duplication_and_reordering_deliver_each_payload_once():
    m = Mesh(duplicate=0.3, reorder=0.5, reorder_delay=0.05, seed=3)
    payloads = [os.urandom(random.Random(i).choice([10, 900, 3000, 20000])) for i in range(150)]
    for p in payloads:
        m.cores[A.key_id].send(B.key_id, p, m.now)
        m.cores[B.key_id].send(A.key_id, p[::-1], m.now)
        m.run(0.001)
    m.run(1.0)
    assert sorted(e.payload for e in m.got[B.key_id]) == sorted(payloads)
    assert sorted(e.payload for e in m.got[A.key_id]) == sorted(p[::-1] for p in payloads)
    assert m.net.stats.duplicated > 0 and m.net.stats.reordered > 0
    replayed = sum(c.counters["dropped_replayed"] for c in m.cores.values())
    assert replayed == m.net.stats.duplicated        # every network copy refused as a replay
    assert {d.reason for drops in m.drops.values() for d in drops} == {"replayed"}


def test_loss_loses_whole_payloads_never_corrupts_and_unfinished_ones_time_out():
    lim = TransportLimits(reassembly_timeout=2.0)
    m = Mesh(loss=0.2, seed=4, limits={B.key_id: lim})
    payloads = [bytes([i]) * n for i, n in enumerate([50, 5000, 30000] * 20)]
    for p in payloads:
        m.cores[A.key_id].send(B.key_id, p, m.now)
        m.run(0.01)
    m.run(0.5)
    got = [e.payload for e in m.got[B.key_id]]
    assert set(got) <= set(payloads) and len(got) == len(set(got)) and 0 < len(got) < len(payloads)
    b = m.cores[B.key_id]
    pending = b.inflight(A.key_id)[0]
    assert pending > 0 and b.get_timer() is not None
    m.run(3.0)
    assert b.inflight(A.key_id) == (0, 0) and b.get_timer() is None
    assert b.counters["dropped_reassembly_timeout"] == pending
    # every fragmented payload that did not complete was counted
    incomplete = sum(1 for p in payloads if len(p) > 1154 and p not in got)
    assert b.counters["dropped_reassembly_timeout"] == incomplete


def _one_datagram(m: Mesh, src: NodeKey, dst: NodeKey, payload: bytes) -> bytes:
    c = m.cores[src.key_id]
    c.send(dst.key_id, payload, m.now)
    [(data, _)] = c.datagrams_to_send(m.now)
    return data


def test_each_bad_input_is_counted_by_reason_while_honest_traffic_flows():
    m = Mesh(keys=(A, B, C))
    b = m.cores[B.key_id]
    honest = []

    def honest_round(i):
        p = f"honest {i}".encode() * 50
        honest.append(p)
        m.cores[A.key_id].send(B.key_id, p, m.now)
        m.run(0.05)

    honest_round(0)
    # garbage
    m.inject(B.key_id, b"\x00" * 10)
    m.inject(B.key_id, os.urandom(200))
    honest_round(1)
    # oversized
    m.inject(B.key_id, os.urandom(MAX_PART_SIZE + 1))
    honest_round(2)
    # unknown peer: a well-formed datagram from a key B does not know
    stranger = TransportCore(M, {B.public: B.key_id}, epoch=1)
    stranger.send(B.key_id, b"hello", m.now)
    m.inject(B.key_id, stranger.datagrams_to_send(m.now)[0][0])
    # forged: A's header with a flipped ciphertext bit; a datagram sealed for C shown to B
    good = bytearray(_one_datagram(m, A, B, b"to be forged"))
    good[HEADER_SIZE + 3] ^= 1
    m.inject(B.key_id, bytes(good))
    m.inject(B.key_id, _one_datagram(m, A, C, b"for C only"))
    # forged sender id: Mallory seals with her own key but names A in the header
    mal = TransportCore(M, {B.public: B.key_id}, epoch=1)
    mal.send(B.key_id, b"I am A", m.now)
    dg = bytearray(mal.datagrams_to_send(m.now)[0][0])
    dg[2:34] = A.key_id
    m.inject(B.key_id, bytes(dg))
    honest_round(3)
    # replayed: a datagram accepted once, then played again (and again later)
    once = _one_datagram(m, A, B, b"only once")
    m.inject(B.key_id, once)
    m.inject(B.key_id, once)
    honest_round(4)
    m.inject(B.key_id, once)
    # never-completed fragmented payload from a real peer (C): all parts but the last
    c = m.cores[C.key_id]
    c.send(B.key_id, os.urandom(10000), m.now)
    parts = c.datagrams_to_send(m.now)
    for data, _ in parts[:-1]:
        m.inject(B.key_id, data, addr=C.key_id)
    assert b.inflight(C.key_id)[0] == 1
    honest_round(5)
    m.run(6.0)                                          # > reassembly_timeout (5 s)
    honest_round(6)
    cnt = b.counters
    assert cnt["dropped_garbage"] == 2 and cnt["dropped_oversized"] == 1
    assert cnt["dropped_unknown_peer"] == 1 and cnt["dropped_forged"] == 3
    assert cnt["dropped_replayed"] == 2 and cnt["dropped_reassembly_timeout"] == 1
    got = [e.payload for e in m.got[B.key_id]]
    assert got == honest[:4] + [b"only once"] + honest[4:]
    assert b"I am A" not in got and b"to be forged" not in got
    reasons = [d.reason for d in m.drops[B.key_id]]
    assert sorted(set(reasons)) == sorted({"garbage", "oversized", "unknown_peer", "forged", "replayed",
                                           "reassembly_timeout"})
    assert all(isinstance(d, DatagramDropped) for d in m.drops[B.key_id])


def test_restart_with_a_higher_epoch_resets_the_window_and_old_epoch_is_stale():
    m = Mesh(keys=(A, B))
    old = _one_datagram(m, A, B, b"epoch 1")
    m.inject(B.key_id, old, addr=A.key_id)
    # A restarts: seq starts at 1 again under a new epoch; B accepts it
    m.cores[A.key_id] = TransportCore(A, {B.public: B.key_id}, epoch=2)
    m.cores[A.key_id].send(B.key_id, b"epoch 2", m.now)
    m.run(0.1)
    assert [e.payload for e in m.got[B.key_id]] == [b"epoch 1", b"epoch 2"]
    m.inject(B.key_id, old, addr=A.key_id)
    assert m.cores[B.key_id].counters["dropped_stale_epoch"] == 1


def test_reassembly_bounds_protect_other_peers():
    lim = TransportLimits(max_inflight_messages_per_peer=4, max_inflight_bytes_per_peer=100_000,
                          reassembly_timeout=1.0)
    m = Mesh(keys=(A, B, C), limits={B.key_id: lim})
    b = m.cores[B.key_id]
    c = m.cores[C.key_id]
    for i in range(10):                               # C never finishes anything
        c.send(B.key_id, os.urandom(5000), m.now)
        for data, _ in c.datagrams_to_send(m.now)[:-1]:
            m.inject(B.key_id, data, addr=C.key_id)
    assert b.inflight(C.key_id)[0] == 4 and b.counters["dropped_inflight_limit"] > 0
    big = os.urandom(60000)                            # A's large payload still reassembles
    m.cores[A.key_id].send(B.key_id, big, m.now)
    m.run(0.2)
    assert [e.payload for e in m.got[B.key_id]] == [big]
    m.run(2.0)
    assert b.inflight(C.key_id) == (0, 0) and b.counters["dropped_reassembly_timeout"] == 4
    # too many parts: a sender with small parts
    small = TransportCore(C, {B.public: B.key_id}, epoch=5,
                          limits=TransportLimits(part_size=200, max_parts=1000, max_payload=65535))
    strict = TransportLimits(max_parts=10, max_payload=10 * 1154)
    m2 = Mesh(keys=(B, C), limits={B.key_id: strict})
    small.send(B.key_id, os.urandom(2000), m2.now)
    for data, _ in small.datagrams_to_send(m2.now):
        m2.inject(B.key_id, data, addr=C.key_id)
    assert m2.cores[B.key_id].counters["dropped_too_many_parts"] == 17


def test_rate_limits_per_address_and_per_peer():
    lim = TransportLimits(rate_per_address=100, burst_per_address=20, rate_per_peer=1000, burst_per_peer=1000)
    m = Mesh(keys=(A, B, C), limits={B.key_id: lim})
    b = m.cores[B.key_id]
    for _ in range(100):                              # a flood from one address
        m.inject(B.key_id, os.urandom(300), addr="flooder")
    assert b.counters["dropped_rate_limited"] == 80 and b.counters["dropped_garbage"] == 20
    m.cores[A.key_id].send(B.key_id, b"still fine", m.now)
    m.run(0.1)
    assert [e.payload for e in m.got[B.key_id]] == [b"still fine"]
    # per authenticated peer
    lim2 = TransportLimits(rate_per_peer=10, burst_per_peer=5)
    m2 = Mesh(keys=(A, B, C), limits={B.key_id: lim2})
    for i in range(20):
        m2.cores[C.key_id].send(B.key_id, b"c%d" % i, m2.now)
    m2.cores[A.key_id].send(B.key_id, b"from A", m2.now)
    m2.run(0.1)
    got = [e.payload for e in m2.got[B.key_id]]
    assert got.count(b"from A") == 1 and len(got) == 6
    assert m2.cores[B.key_id].counters["dropped_rate_limited"] == 15


def test_a_garbage_flood_does_not_grow_memory():
    lim = TransportLimits(max_pending_drop_events=16, rate_per_address=1e9, burst_per_address=1e9)
    c = TransportCore(B, {A.public: ("127.0.0.1", 1)}, limits=lim, epoch=1)
    for i in range(5000):
        c.receive_datagram(os.urandom(64), ("10.0.0.%d" % (i % 250), i), T0)
    assert c.counters["dropped_garbage"] == 5000
    events = []
    while (ev := c.next_event()) is not None:
        events.append(ev)
    assert len(events) == 16
    assert set(DROP_REASONS) == {k[len("dropped_"):] for k in c.counters if k.startswith("dropped_")}


def test_send_many_bundles_small_payloads_in_order_and_sends_big_ones_in_parts():
    m = Mesh(duplicate=0.2, reorder=0.3, reorder_delay=0.01, seed=7)
    a = m.cores[A.key_id]
    rng = random.Random(8)
    # small ones (votes, acks, receipt batches) between big ones (catchain blocks, proposals)
    payloads = [os.urandom(rng.choice([1, 40, 300, 600, 1100, 1162, 1163, 5000])) for _ in range(60)]
    a.send_many(B.key_id, payloads, m.now)
    dgs = a.counters["sent_datagrams"]
    m.run(1.0)
    assert [e.payload for e in m.got[B.key_id]] != [] and all(e.src == A.key_id for e in m.got[B.key_id])
    assert sorted(e.payload for e in m.got[B.key_id]) == sorted(payloads)
    # fewer datagrams than one per small payload, never more than send() one by one would use
    one_by_one = sum(max(1, -(-len(p) // (MAX_PART_SIZE - OVERHEAD))) for p in payloads)
    assert dgs < one_by_one
    assert a.counters["sent_payloads"] == len(payloads)
    assert m.cores[B.key_id].counters["received_payloads"] == len(payloads)
    assert {d.reason for d in m.drops[B.key_id]} <= {"replayed"}


def test_a_bundle_without_faults_delivers_in_send_order_in_one_datagram():
    m = Mesh()
    a = m.cores[A.key_id]
    small = [bytes([i]) * (100 + i) for i in range(8)]           # 8 x ~104 B: one datagram
    a.send_many(B.key_id, small, m.now)
    [(dg, _)] = a.datagrams_to_send(m.now)
    assert len(dg) <= MAX_PART_SIZE and dg[1] == 2
    m.inject(B.key_id, dg, addr=A.key_id)
    assert [e.payload for e in m.got[B.key_id]] == small
    # a refused payload refuses the whole call: nothing queued
    with pytest.raises(TransportError):
        a.send_many(B.key_id, [b"ok", b"x" * (65535 + 4097)], m.now)
    with pytest.raises(TransportError):
        a.send_many(M.key_id, [b"ok"], m.now)
    assert a.datagrams_to_send(m.now) == []


def test_a_tampered_or_malformed_bundle_is_dropped_whole():
    m = Mesh()
    a, b = m.cores[A.key_id], m.cores[B.key_id]
    a.send_many(B.key_id, [b"first" * 10, b"second" * 10], m.now)
    [(dg, _)] = a.datagrams_to_send(m.now)
    bad = bytearray(dg)
    bad[HEADER_SIZE + 1] ^= 1
    m.inject(B.key_id, bytes(bad), addr=A.key_id)
    assert b.counters["dropped_forged"] == 1 and not m.got[B.key_id]
    # an authenticated bundle whose entry lengths do not fill the body exactly (a peer's bug)
    from remp_node.transport.core import KIND_BUNDLE
    for body in (b"\x09\x00abcdef", b"\x00\x00" + b"x" * 8, b"\x04\x00abcd\x01"):
        a._seal(a._peers[B.key_id], KIND_BUNDLE, body)       # sealed as A's own datagrams are
        [(sealed, _)] = a.datagrams_to_send(m.now)
        m.inject(B.key_id, sealed, addr=A.key_id)
    assert b.counters["dropped_malformed"] == 3 and not m.got[B.key_id]
    m.inject(B.key_id, dg, addr=A.key_id)            # the untampered original still arrives
    assert [e.payload for e in m.got[B.key_id]] == [b"first" * 10, b"second" * 10]
