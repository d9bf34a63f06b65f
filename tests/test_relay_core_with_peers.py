"""rmb-peer cores (rmb_peer.core.PeerCore) and relay cores (rmb_relay.core.RelayCore)
driven against each other on the shared in-memory network with a fake clock
(daemon_runtime.memnet MemNetwork + FakeClock; DESIGN.md section 2). No sockets, no
Redis: `World` executes the cores' commands itself (WebSocket frames and federation POSTs
travel over the MemNetwork, the offline queue is a list per session standing in for the
Redis stream). Covers: a request and its reply through one relay, offline replay in order
(with traffic arriving while the replay runs), connection replacement (also with a
delivery in flight to the replaced connection), federation retry across a relay outage
and its end when the envelope expires first, expiry in the offline queue, and
Ping -> Pong."""
from __future__ import annotations

import base64
import json
import random

from daemon_runtime.memnet import FakeClock, MemNetwork
from rmb_peer.core import (
    Connect, Disconnect, LookupTwin as PeerLookupTwin, PeerCore, PushQueue, SendFrame, SendPing,
)
from rmb_peer.envelope import Envelope
from rmb_peer.identity import E2EKey, Identity
from rmb_peer.twins import Twin, UnknownTwin
from rmb_relay.core import (
    AckQueue, CloseConnection, Enqueue, FederationAnswer, Log, LookupTwin, PostFederation,
    ProbeQueue, ReadQueue, RelayCore, ReplayFrames, WriteFrame,
)
from rmb_relay.core.federation import FederationScheduler, Ranker

T0 = 1_700_000_000.0
A = "relay-a.local:1"
B = "relay-b.local:1"


class World:
    """Relays (by domain) and peers (by twin id) on one MemNetwork. A peer connection is
    the address ("conn", twin, n); frames are b"W" + envelope, federation POSTs
    b"P" + job + envelope, their answers b"A" + job + status."""

    def __init__(self, relays=(A,), seed=1):
        self.clock = FakeClock(T0)
        self.net = MemNetwork(seed=seed, latency=0.002, jitter=0.0)
        self.relays: dict[str, RelayCore] = {}
        for d in relays:
            rng = random.Random(seed)
            ranker = Ranker(3600.0, rng)
            self.relays[d] = RelayCore([d], ranker=ranker,
                                       federation=FederationScheduler(ranker, rng,
                                                                      attempt_timeout=2.0))
        self.peers: dict[int, PeerCore] = {}
        self.home: dict[int, str] = {}
        self.twins: dict[int, Twin] = {}
        self.online: dict[int, bool] = {}
        self.queues: dict[int, dict[str, list[dict]]] = {}
        self.conns: dict[int, tuple] = {}                 # twin -> its open connection
        self.conn_n = 0
        self.streams: dict[tuple, list[tuple[bytes, dict]]] = {}   # (relay, session) -> stream
        self.entry_n = 0
        self.posts: dict[tuple, float] = {}               # (relay, job) -> timeout at
        self.logs: dict[str, list[Log]] = {d: [] for d in relays}
        self.closed: list[CloseConnection] = []

    @property
    def now(self) -> float:
        return self.clock.now

    def add(self, twin_id: int, relay: str = A, online=True):
        ident = Identity.from_seed(bytes([twin_id]) * 32, "ed25519")
        e2e = E2EKey.from_seed(bytes([twin_id + 50]) * 32)
        self.peers[twin_id] = PeerCore(twin_id, ident, e2e, [relay])
        self.home[twin_id] = relay
        self.twins[twin_id] = Twin(twin_id, ident.account, [relay], e2e.pk)
        self.online[twin_id] = online
        self.queues[twin_id] = {}
        if online:
            self.peers[twin_id].start(self.now)

    def connect(self, twin_id):
        self.online[twin_id] = True
        self.peers[twin_id].start(self.now)

    def open_conn(self, twin_id) -> tuple:
        """A new WebSocket of `twin_id` to its relay (a second one replaces the first)."""
        self.conn_n += 1
        conn = ("conn", twin_id, self.conn_n)
        self.conns[twin_id] = conn
        self.relays[self.home[twin_id]].peer_connected(conn, (twin_id, None), self.now)
        return conn

    # ------------------------------------------------------------------ one pass
    def _peer_events(self) -> bool:
        busy = False
        for tid, core in self.peers.items():
            t = core.get_timer()
            if t is not None and t <= self.now:
                core.handle_timer(self.now)
            while (ev := core.next_event()) is not None:
                busy = True
                if isinstance(ev, Connect) and self.online[tid]:
                    core.relay_connected(ev.relay, ev.attempt, self.now)
                    self.open_conn(tid)
                elif isinstance(ev, SendFrame):
                    self.net.send(self.conns[tid], self.home[tid], b"W" + ev.data, self.now)
                elif isinstance(ev, SendPing):   # the relay's WebSocket stack answers
                    core.relay_activity(ev.relay, self.now, ev.attempt)
                elif isinstance(ev, Disconnect):
                    raise AssertionError(f"peer {tid} lost its relay: {ev}")
                elif isinstance(ev, PeerLookupTwin):
                    core.twin_resolved(ev.twin, self.twins.get(ev.twin), self.now)
                elif isinstance(ev, PushQueue):
                    self.queues[tid].setdefault(ev.queue, []).append(json.loads(ev.payload))
        return busy

    def _relay_commands(self, d: str, relay: RelayCore) -> bool:
        busy = False
        t = relay.get_timer()
        if t is not None and t <= self.now:
            relay.handle_timer(self.now)
        while (cmd := relay.next_event()) is not None:
            busy = True
            now = self.now
            if isinstance(cmd, WriteFrame):
                if cmd.conn in self.conns.values():
                    self.net.send(d, cmd.conn, b"W" + cmd.data, now)
                    if cmd.log is not None:
                        self.logs[d].append(cmd.log)
                else:
                    relay.write_failed(cmd, now)
            elif isinstance(cmd, Log):
                self.logs[d].append(cmd)
            elif isinstance(cmd, LookupTwin):
                twin = self.twins.get(cmd.twin)
                relay.twin_resolved(cmd.twin, twin if twin is not None
                                    else UnknownTwin(f"unknown twin {cmd.twin}"), now)
                while not relay.chain_done(cmd.twin, now):
                    pass
            elif isinstance(cmd, Enqueue):
                self.entry_n += 1
                self.streams.setdefault((d, cmd.session), []).append((b"%d-0" % self.entry_n, {
                    b"e": cmd.data, b"d": repr(cmd.until).encode(), b"t": repr(now).encode(),
                    b"s": cmd.src.split(":")[0].encode()}))
                relay.enqueued(cmd.token, "queued", now)
            elif isinstance(cmd, ReadQueue):
                relay.queue_read(cmd.conn, self.streams.get((d, cmd.session), [])[:cmd.count],
                                 now)
            elif isinstance(cmd, ReplayFrames):
                done = 0
                for _id, data, log in cmd.items:
                    if data is not None:
                        if cmd.conn not in self.conns.values():
                            break
                        self.net.send(d, cmd.conn, b"W" + data, now)
                    if log is not None:
                        self.logs[d].append(log)
                    done += 1
                relay.replay_written(cmd.conn, done, now)
            elif isinstance(cmd, AckQueue):
                gone = set(cmd.ids)
                key = (d, cmd.session)
                self.streams[key] = [e for e in self.streams.get(key, []) if e[0] not in gone]
                relay.queue_acked(cmd.conn, cmd.more, now)
            elif isinstance(cmd, ProbeQueue):
                relay.queue_probed(True, now)
            elif isinstance(cmd, PostFederation):
                self.posts[(d, cmd.job)] = now + cmd.timeout
                self.net.send(d, cmd.domain, b"P" + cmd.job.to_bytes(4, "big") + cmd.data, now)
            elif isinstance(cmd, FederationAnswer):
                origin, job = cmd.request
                self.net.send(d, origin, b"A" + job.to_bytes(4, "big")
                              + cmd.status.to_bytes(2, "big"), now)
            elif isinstance(cmd, CloseConnection):
                self.closed.append(cmd)
                for tid, conn in list(self.conns.items()):
                    if conn == cmd.conn:
                        del self.conns[tid]
                relay.peer_disconnected(cmd.conn, now, cmd.reason)
        for (rd, job), at in list(self.posts.items()):
            if rd == d and at <= self.now:             # no answer: the POST timed out
                del self.posts[(rd, job)]
                relay.federation_result(job, "failed", self.now, 0, "TimeoutError")
                busy = True
        return busy

    def _deliver(self) -> bool:
        busy = False
        for dst, src, data in self.net.deliver_due(self.now):
            busy = True
            kind, body = data[:1], data[1:]
            if isinstance(dst, tuple):                    # relay -> peer connection
                if self.conns.get(dst[1]) == dst:
                    self.peers[dst[1]].receive_frame(body, self.home[dst[1]], self.now)
            elif kind == b"W":
                relay = self.relays[dst]
                if src in self.conns.values():
                    relay.receive_frame(src, body, self.now)
            elif kind == b"P":
                self.relays[dst].receive_federation((src, int.from_bytes(body[:4], "big")),
                                                    body[4:], src, self.now)
            elif kind == b"A":
                job, status = int.from_bytes(body[:4], "big"), int.from_bytes(body[4:6], "big")
                if self.posts.pop((dst, job), None) is not None:
                    outcome = "accepted" if status == 202 else "refused" if status < 500 else "failed"
                    self.relays[dst].federation_result(job, outcome, self.now, status, "")
        return busy

    def step(self, seconds: float = 1.0) -> "World":
        """Runs every core until `seconds` of fake time passed (10 ms ticks when idle)."""
        end = self.now + seconds
        while self.now < end:
            busy = self._peer_events()
            for d, relay in self.relays.items():
                busy = self._relay_commands(d, relay) or busy
            busy = self._deliver() or busy
            if not busy:
                self.clock.advance(0.01)
        return self

    def events(self, d: str, name: str) -> list[Log]:
        return [log for log in self.logs[d] if log.event == name]


def app_request(world, src, dst, ref, data=b"hi", exp=30):
    world.peers[src].receive_local(json.dumps({
        "ver": 1, "ref": ref, "cmd": "calc.add", "exp": exp,
        "dat": base64.b64encode(data).decode(), "dst": [dst], "ret": "app.ret",
        "now": int(world.now)}), world.now)


def serve(world, tid):
    """The service on twin `tid` answers every request it got (data reversed); returns
    the refs it saw, in order."""
    seen = []
    for req in world.queues[tid].pop("msgbus.calc.add", []):
        seen.append(base64.b64decode(req["dat"]))
        world.peers[tid].receive_service_reply(json.dumps({
            "ver": 1, "ref": req["ref"], "dat": base64.b64encode(
                base64.b64decode(req["dat"])[::-1]).decode(),
            "dst": req["src"], "now": int(world.now)}), world.now)
    return seen


def test_request_and_reply_through_the_relay_core():
    w = World()
    w.add(1)
    w.add(2)
    w.step()
    app_request(w, 1, 2, "ref-1", b"abc")
    w.step()
    serve(w, 2)
    w.step()
    (reply,) = w.queues[1]["app.ret"]
    assert reply["ref"] == "ref-1" and base64.b64decode(reply["dat"]) == b"cba"
    assert reply.get("err") is None and reply["src"] == "2"


def test_offline_peer_gets_the_queued_request_on_connect():
    w = World()
    w.add(1)
    w.add(2, online=False)
    w.step()
    app_request(w, 1, 2, "ref-2", b"xyz")
    w.step()
    assert len(w.streams.get((A, (2, None)), [])) == 1       # queued by the relay core
    w.connect(2)
    w.step()
    serve(w, 2)
    w.step()
    (reply,) = w.queues[1]["app.ret"]
    assert reply["ref"] == "ref-2" and base64.b64decode(reply["dat"]) == b"zyx"


def test_offline_replay_keeps_the_order_and_traffic_sent_meanwhile_follows_it():
    w = World()
    w.add(1)
    w.add(2, online=False)
    w.step()
    for i in range(5):
        app_request(w, 1, 2, f"ref-{i}", b"m%d" % i)
    w.step()
    assert len(w.streams[(A, (2, None))]) == 5
    w.connect(2)
    # sent right after the connect: it follows the queued ones
    app_request(w, 1, 2, "ref-5", b"m5")
    w.step(2.0)
    assert serve(w, 2) == [b"m%d" % i for i in range(6)]
    assert w.streams[(A, (2, None))] == []                    # every entry deleted
    assert w.relays[A].state_of((2, None)) == "live"
    delivered = w.events(A, "rmb.relay.delivered")
    assert len(delivered) >= 5 and all(d.attrs["dst"] == "2" for d in delivered)


def test_a_new_connection_replaces_the_old_one_and_gets_the_traffic():
    w = World()
    w.add(1)
    w.add(2)
    w.step()
    old = w.conns[2]
    new = w.open_conn(2)                  # same (twin, sid): the relay closes the old one
    w.step()
    assert [c.conn for c in w.closed] == [old] and w.closed[0].code == 4000
    assert w.relays[A].state_of((2, None)) == "live"
    app_request(w, 1, 2, "ref-r", b"after")
    w.step()
    assert serve(w, 2) == [b"after"]
    assert w.conns[2] == new
    disc = w.events(A, "rmb.relay.disconnected")
    assert disc and disc[-1].attrs["reason"] == "replaced by a newer connection"


def test_federation_retries_across_a_relay_outage():
    w = World(relays=(A, B))
    w.add(1, relay=A)
    w.add(2, relay=B)
    w.step()
    w.net.crashed.add(B)                  # relay B unreachable: POSTs get no answer
    app_request(w, 1, 2, "ref-f", b"fed")
    w.step(3.0)
    failed = w.events(A, "rmb.relay.federation_failed")
    assert failed and failed[0].attrs["domain"] == B
    w.net.crashed.discard(B)
    w.step(10.0)
    assert w.events(A, "rmb.relay.federated")
    assert serve(w, 2) == [b"fed"]
    w.step(10.0)
    (reply,) = w.queues[1]["app.ret"]
    assert reply["ref"] == "ref-f" and base64.b64decode(reply["dat"]) == b"def"


def test_an_envelope_that_expires_in_the_offline_queue_is_dropped_not_delivered():
    w = World()
    w.add(1)
    w.add(2, online=False)
    w.step()
    app_request(w, 1, 2, "ref-x", b"late", exp=5)
    w.step()
    assert len(w.streams[(A, (2, None))]) == 1
    w.step(10.0)                          # the envelope's TTL runs out while 2 is offline
    w.connect(2)
    w.step()
    assert serve(w, 2) == []
    (exp,) = w.events(A, "rmb.relay.expired")
    assert exp.attrs["reason"] == "expired in the offline queue" and exp.attrs["dst"] == "2"
    assert w.streams[(A, (2, None))] == []


def test_ping_envelope_is_answered_with_pong_and_keepalives_keep_the_peer_up():
    w = World()
    w.add(1)
    w.step()
    ping = Envelope()
    ping.uid = "ping-1"
    ping.timestamp = int(w.now)
    ping.expiration = 30
    ping.source.twin = 1
    ping.ping.SetInParent()
    got: list[Envelope] = []
    real = w.peers[1].receive_frame

    def spy(frame, relay, now):
        env = Envelope()
        env.ParseFromString(frame)
        got.append(env)
        if env.WhichOneof("message") != "pong":
            real(frame, relay, now)
    w.peers[1].receive_frame = spy
    w.net.send(w.conns[1], A, b"W" + ping.SerializeToString(), w.now)
    w.step(100.0)                         # > 2 x the 40 s silence limit: pings keep it up
    (pong,) = [e for e in got if e.uid == "ping-1"]
    assert pong.WhichOneof("message") == "pong" and pong.destination.twin == 1
    (ans,) = w.events(A, "rmb.relay.answered")
    assert ans.attrs == {"kind": "pong", "dst": "1"}


def test_a_delivery_in_flight_to_a_replaced_connection_reaches_the_new_one_once():
    """The relay core routed a request to twin 2's connection; before the write happens
    twin 2 reconnects (the old connection is replaced). The write to the old connection
    fails, the core takes it back (write_failed -> offline queue -> replay) and the new
    connection gets it exactly once."""
    w = World()
    w.add(1)
    w.add(2)
    w.step()
    old = w.conns[2]
    relay, taken_back = w.relays[A], []
    real = relay.write_failed
    relay.write_failed = lambda cmd, now: (taken_back.append(cmd.conn), real(cmd, now))[1]
    app_request(w, 1, 2, "ref-m", b"moving")
    w._peer_events()                      # peer 1's frame is on the network
    w.clock.advance(0.01)
    w._deliver()                          # the relay core received it: WriteFrame(old) pending
    new = w.open_conn(2)                  # replaced before the relay executed the write
    w.step(2.0)
    assert [c.conn for c in w.closed] == [old] and taken_back == [old]
    assert serve(w, 2) == [b"moving"]
    w.step(2.0)
    assert serve(w, 2) == []              # not twice
    (reply,) = w.queues[1]["app.ret"]
    assert reply["ref"] == "ref-m" and base64.b64decode(reply["dat"]) == b"gnivom"
    assert w.conns[2] == new and w.relays[A].state_of((2, None)) == "live"
    assert w.streams.get((A, (2, None)), []) == []


def test_federation_gives_up_when_the_envelope_expires_and_the_sender_hears_of_it():
    """Relay B stays unreachable past the envelope's TTL: relay A retries, then drops the
    job (rmb.relay.expired), B never gets it, even once it is back; the app on twin 1
    gets one error reply, no data."""
    w = World(relays=(A, B))
    w.add(1, relay=A)
    w.add(2, relay=B)
    w.step()
    w.net.crashed.add(B)
    app_request(w, 1, 2, "ref-e", b"gone", exp=5)
    w.step(12.0)
    failed = w.events(A, "rmb.relay.federation_failed")
    assert len(failed) >= 2 and all(f.attrs["domain"] == B for f in failed)
    (exp,) = w.events(A, "rmb.relay.expired")
    assert exp.attrs["reason"].startswith("federation failed after")
    w.net.crashed.discard(B)
    w.step(10.0)
    assert serve(w, 2) == [] and not w.events(A, "rmb.relay.federated")
    (reply,) = w.queues[1]["app.ret"]
    assert reply["ref"] == "ref-e" and reply["err"]["code"] and not reply.get("dat")
