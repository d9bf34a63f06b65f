"""Deliveries written into a connection that then dies without a close handshake (a cut
link: the relay's heartbeat gets no pong): the relay queues them again for the session and
replays them when it reconnects, and the receiving peer serves a request it gets twice only
once. RelayCore and PeerCore in memory with a fake clock, no sockets (DESIGN.md section 2)."""
from __future__ import annotations

import random

from rmb_peer.envelope import Envelope
from rmb_relay.core import (
    Enqueue, FederationScheduler, Ranker, ReadQueue, RelayCore, WriteFrame,
)
from tests.test_peer_core import Sim, forge_request
from tests.test_relay_core import T0, make_env
from tests.test_relay_core_machine import drain, of

HERE = "relay1:1"
HEARTBEAT = 20.0


def core_with(**kw):
    rng = random.Random(0)
    ranker = Ranker(rng=rng)
    return RelayCore([HERE], ranker=ranker, federation=FederationScheduler(ranker, rng),
                     unconfirmed_s=1.5 * HEARTBEAT + 2.0, **kw)


def deliver_into_cut(core):
    """alice (A) sends carol (C, connected here) one request a second for 30 s while
    carol's link is cut; each is written to C. Returns the envelopes."""
    core.peer_connected("A", (1, None), T0)
    core.peer_connected("C", (3, None), T0)
    core.queue_replayed("A", T0)
    core.queue_replayed("C", T0)
    drain(core)
    sent = []
    for i in range(30):
        env = make_env(src=(1, None), dst=(3, None), ts=int(T0) + i, ttl=40)
        core.receive_frame("A", env.SerializeToString(), T0 + i)
        assert [c.conn for c in of(drain(core), WriteFrame)] == ["C"]     # written live
        sent.append(env)
    return sent


def cut_while_delivering(core, lost: bool):
    """deliver_into_cut, then the heartbeat closes C. Returns the envelopes and the
    commands of the close."""
    sent = deliver_into_cut(core)
    core.peer_disconnected("C", T0 + 30.5,
                           "websocket error: No PONG received after 10.0 seconds" if lost
                           else "closed by peer", lost)
    return sent, drain(core)


def test_deliveries_into_a_lost_connection_are_replayed_on_reconnect():
    core = core_with()
    sent, cmds = cut_while_delivering(core, lost=True)
    enq = of(cmds, Enqueue)
    # before: nothing queued, the 30 requests were gone with the socket and expired
    assert [e.uid for e in enq] == [e.uid for e in sent]
    assert all(e.session == (3, None) for e in enq)
    for e in enq:
        core.enqueued(e.token, "queued", T0 + 30.5)
    core.peer_connected("C2", (3, None), T0 + 31)        # carol is back after the heal
    assert of(drain(core), ReadQueue) == [ReadQueue("C2", (3, None))]


def test_deliveries_into_a_connection_its_twin_replaced_are_replayed_on_the_new_one():
    """carol's own keepalive gives the silent connection up first and she reconnects after
    the heal, before the relay's heartbeat closed the old one: what relay1 wrote into the
    cut is queued again and the new connection replays it (before: 'replaced by a newer
    connection' dropped it, and the requests expired at alice's end)."""
    core = core_with()
    sent = deliver_into_cut(core)
    core.peer_connected("C2", (3, None), T0 + 30.6)
    cmds = drain(core)
    enq = of(cmds, Enqueue)
    assert [e.uid for e in enq] == [e.uid for e in sent]
    assert all(e.session == (3, None) for e in enq)
    assert of(cmds, ReadQueue) == [ReadQueue("C2", (3, None))]
    for e in enq:
        core.enqueued(e.token, "queued", T0 + 30.7)
    core.peer_disconnected("C", T0 + 30.8, "replaced by a newer connection")
    assert of(drain(core), Enqueue) == []                 # queued once, not twice


def test_expired_and_old_deliveries_are_not_queued_again_nor_after_a_clean_close():
    core = core_with()
    sent, cmds = cut_while_delivering(core, lost=False)
    assert of(cmds, Enqueue) == []                        # the peer closed: it had them
    core = core_with()
    core.peer_connected("A", (1, None), T0)
    core.peer_connected("C", (3, None), T0)
    core.queue_replayed("A", T0)
    core.queue_replayed("C", T0)
    old = make_env(src=(1, None), dst=(3, None), ts=int(T0), ttl=300)
    short = make_env(src=(1, None), dst=(3, None), ts=int(T0) + 40, ttl=5)
    fresh = make_env(src=(1, None), dst=(3, None), ts=int(T0) + 40, ttl=60)
    core.receive_frame("A", old.SerializeToString(), T0)          # beyond the window
    core.receive_frame("A", short.SerializeToString(), T0 + 40)   # expired at the close
    core.receive_frame("A", fresh.SerializeToString(), T0 + 40)
    drain(core)
    core.peer_disconnected("C", T0 + 50, "websocket error: connection reset", True)
    assert [e.uid for e in of(drain(core), Enqueue)] == [fresh.uid]


def test_a_request_delivered_twice_reaches_the_service_once():
    sim = Sim()
    a, b = sim.add(1), sim.add(2)
    env = forge_request(a, 2, sim.now)
    frame = env.SerializeToString()
    sim.in_flight.extend([frame, frame])         # the original and the relay's re-delivery
    sim.pump()
    assert len(b.all("msgbus.calc.add")) == 1
    assert b.core.stats["duplicate_requests"] == 1
    other = forge_request(a, 2, sim.now)         # a new request still goes through
    sim.in_flight.append(other.SerializeToString())
    sim.pump()
    assert len(b.all("msgbus.calc.add")) == 2
    assert Envelope.FromString(frame).uid == env.uid
