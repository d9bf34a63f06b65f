"""Two rmb-peer cores (rmb_peer.core.PeerCore) and the relay core (rmb_relay.core.
RelayCore) driven against each other in memory with a fake clock (DESIGN.md
section 2): an app request goes peer 1 -> relay -> peer 2 -> service, the reply comes back
the same way; with peer 2 offline the request is queued by the relay and replayed when it
connects. No sockets, no Redis: the test executes both cores' commands itself."""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from rmb_peer.core import Connect, LookupTwin as PeerLookupTwin, PeerCore, PushQueue, SendFrame
from rmb_peer.identity import E2EKey, Identity
from rmb_peer.twins import Twin
from rmb_relay.core import (
    AckQueue, CloseConnection, Enqueue, LookupTwin, ReadQueue, RelayCore, ReplayFrames,
    WriteFrame,
)

T0 = 1_700_000_000.0
HERE = "relay.local:1"


@dataclass
class Rec:
    relays: list


class World:
    def __init__(self):
        self.now = T0
        self.relay = RelayCore([HERE])
        self.peers: dict[int, PeerCore] = {}
        self.twins: dict[int, Twin] = {}
        self.online: dict[int, bool] = {}
        self.queues: dict[int, dict[str, list[dict]]] = {}
        self.stream: dict[tuple, list[bytes]] = {}       # the relay's offline queue

    def add(self, twin_id: int, online=True):
        ident = Identity.from_seed(bytes([twin_id]) * 32, "ed25519")
        e2e = E2EKey.from_seed(bytes([twin_id + 50]) * 32)
        self.peers[twin_id] = PeerCore(twin_id, ident, e2e, ["r1"])
        self.twins[twin_id] = Twin(twin_id, ident.account, [HERE], e2e.pk)
        self.online[twin_id] = online
        self.queues[twin_id] = {}
        if online:
            self.peers[twin_id].start(self.now)

    def connect(self, twin_id):
        self.online[twin_id] = True
        self.peers[twin_id].start(self.now)

    def step(self, rounds=50):
        for _ in range(rounds):
            busy = False
            for tid, core in self.peers.items():
                t = core.get_timer()
                if t is not None and t <= self.now:
                    core.handle_timer(self.now)
                while (ev := core.next_event()) is not None:
                    busy = True
                    if isinstance(ev, Connect) and self.online[tid]:
                        core.relay_connected(ev.relay, ev.attempt, self.now)
                        self.relay.peer_connected(tid, (tid, None), self.now)
                    elif isinstance(ev, SendFrame):
                        self.relay.receive_frame(tid, ev.data, self.now)
                    elif isinstance(ev, PeerLookupTwin):
                        core.twin_resolved(ev.twin, self.twins.get(ev.twin), self.now)
                    elif isinstance(ev, PushQueue):
                        self.queues[tid].setdefault(ev.queue, []).append(json.loads(ev.payload))
            while (cmd := self.relay.next_event()) is not None:
                busy = True
                if isinstance(cmd, WriteFrame):
                    self.peers[cmd.conn].receive_frame(cmd.data, "r1", self.now)
                elif isinstance(cmd, LookupTwin):
                    self.relay.twin_resolved(cmd.twin, Rec([HERE]), self.now)
                    self.relay.chain_done(cmd.twin, self.now)
                elif isinstance(cmd, Enqueue):
                    self.stream.setdefault(cmd.session, []).append(cmd.data)
                    self.relay.enqueued(cmd.token, "queued", self.now)
                elif isinstance(cmd, ReadQueue):
                    entries = [(str(i).encode(), {b"e": d, b"d": b"%f" % (self.now + 60),
                                                  b"t": b"%f" % self.now})
                               for i, d in enumerate(self.stream.pop(cmd.session, []))]
                    self.relay.queue_read(cmd.conn, entries, self.now)
                elif isinstance(cmd, ReplayFrames):
                    for _id, data, _log in cmd.items:
                        if data is not None:
                            self.peers[cmd.conn].receive_frame(data, "r1", self.now)
                    self.relay.replay_written(cmd.conn, len(cmd.items), self.now)
                elif isinstance(cmd, AckQueue):
                    self.relay.queue_acked(cmd.conn, cmd.more, self.now)
                elif isinstance(cmd, CloseConnection):
                    raise AssertionError(f"unexpected close {cmd}")
            if not busy:
                self.now += 0.01
        return self


def app_request(world, src, dst, ref, data=b"hi"):
    world.peers[src].receive_local(json.dumps({
        "ver": 1, "ref": ref, "cmd": "calc.add", "exp": 30, "dat": base64.b64encode(data).decode(),
        "dst": [dst], "ret": "app.ret", "now": int(world.now)}), world.now)


def serve(world, tid):
    """The service on twin `tid` answers every request it got (data reversed)."""
    for req in world.queues[tid].pop("msgbus.calc.add", []):
        world.peers[tid].receive_service_reply(json.dumps({
            "ver": 1, "ref": req["ref"], "dat": base64.b64encode(
                base64.b64decode(req["dat"])[::-1]).decode(),
            "dst": req["src"], "now": int(world.now)}), world.now)


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
    assert len(w.stream.get((2, None), [])) == 1            # queued by the relay core
    w.connect(2)
    w.step()
    serve(w, 2)
    w.step()
    (reply,) = w.queues[1]["app.ret"]
    assert reply["ref"] == "ref-2" and base64.b64decode(reply["dat"]) == b"zyx"
