"""rmb-peer core (rmb_peer/core.py) driven in memory with a fake clock: cores talk through
an in-memory relay (routes frames by destination twin; can drop, duplicate, reorder) and
in-memory Redis queues, exactly as the daemon would execute the core's events."""
from __future__ import annotations

import base64
import io
import json

import pytest

from daemon_runtime.eventlog import EventLog
from rmb_peer.challenge import sign_envelope
from rmb_peer.core import (
    BACKLOG_PREFIX, DEAD_AFTER, PING_INTERVAL, REPLY_QUEUE, VERSION, Connect,
    Disconnect, LookupBacklog, PeerCore, PeerStateError, PushQueue, SendFrame,
    SendPing, StoreBacklog, DropBacklog, LookupTwin,
)
from rmb_peer.envelope import Backlog, Envelope, new_uid, relay_error
from rmb_peer.events import RMB_EVENTS
from rmb_peer.identity import E2EKey, Identity
from rmb_peer.twins import Twin

T0 = 1_700_000_000.0


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class Node:
    def __init__(self, sim, twin_id, relays, pk=True, key_type="sr25519"):
        seed = bytes([twin_id]) * 32
        self.identity = Identity.from_seed(seed, key_type)
        self.e2e = E2EKey.from_seed(bytes([twin_id + 100]) * 32)
        self.logbuf = io.StringIO()
        self.log = EventLog("rmb-peer", str(twin_id), [RMB_EVENTS], sink=self.logbuf, min_level="debug")
        self.core = PeerCore(twin_id, self.identity, self.e2e if pk else None, list(relays), log=self.log,
                             debug=True)
        self.twin = Twin(twin_id, self.identity.account, list(relays), self.e2e.pk if pk else None)
        self.queues: dict[str, list[bytes]] = {}
        self.kv: dict[str, tuple[bytes, float]] = {}
        self.dropped: list[str] = []
        self.sent: list[SendFrame] = []
        self.pings: list[SendPing] = []
        self.disconnects: list[Disconnect] = []
        self.connects: list[Connect] = []
        self.lookups: list[LookupTwin] = []
        self.auto_connect = True

    def rpop(self, queue):
        q = self.queues.get(queue) or []
        return q.pop() if q else None

    def all(self, queue):
        """Everything on `queue`, oldest first (LPUSH puts the newest at the head)."""
        return [json.loads(x) for x in reversed(self.queues.get(queue, []))]

    def events(self):
        return [json.loads(line) for line in self.logbuf.getvalue().splitlines()]


class Sim:
    """In-memory relay + Redis + fake clock."""

    def __init__(self):
        self.now = T0
        self.nodes: dict[int, Node] = {}
        self.wire: list[bytes] = []
        self.mangle = None  # callable(list[bytes]) -> list[bytes] (loss/dup/reorder)
        self.in_flight: list[bytes] = []
        #: the end-to-end inputs (receive_frame/receive_local/receive_service_reply) and
        #: the core's own twin table instead of receive+accept with records handed in
        self.twin_table = False
        #: how the fake registry answers LookupTwin: "up", "down" (fails at once) or
        #: "hung" (never answers; the test answers node.lookups itself)
        self.registry = "up"

    def add(self, twin_id, relays=("r1",), pk=True, key_type="sr25519"):
        node = Node(self, twin_id, relays, pk, key_type)
        self.nodes[twin_id] = node
        node.core.start(self.now)
        self.fire_timers()
        return node

    def twin(self, twin_id):
        node = self.nodes.get(twin_id)
        return node.twin if node else None

    def pump(self):
        for _ in range(100):
            progressed = False
            for node in list(self.nodes.values()):
                while (ev := node.core.next_event()) is not None:
                    progressed = True
                    self.execute(node, ev)
            if self.in_flight:
                frames, self.in_flight = self.in_flight, []
                if self.mangle:
                    frames = self.mangle(frames)
                for frame in frames:
                    progressed = True
                    self.route(frame)
            if not progressed:
                return
        raise AssertionError("simulation did not settle")

    def execute(self, node, ev):
        if isinstance(ev, SendFrame):
            node.sent.append(ev)
            self.wire.append(ev.data)
            self.in_flight.append(ev.data)
        elif isinstance(ev, PushQueue):
            q = node.queues.setdefault(ev.queue, [])
            q.insert(0, ev.payload)
            del q[10000:]
        elif isinstance(ev, StoreBacklog):
            node.kv[ev.key] = (ev.record, self.now + ev.ttl)
        elif isinstance(ev, DropBacklog):
            node.kv.pop(ev.key, None)
            node.dropped.append(ev.key)
        elif isinstance(ev, LookupBacklog):
            hit = node.kv.get(ev.key)
            if hit and hit[1] > self.now:
                node.core.backlog_reply(hit[0], ev)
        elif isinstance(ev, Connect):
            node.connects.append(ev)
            if node.auto_connect:
                node.core.relay_connected(ev.relay, ev.attempt, self.now)
        elif isinstance(ev, SendPing):
            node.pings.append(ev)
        elif isinstance(ev, Disconnect):
            node.disconnects.append(ev)
        elif isinstance(ev, LookupTwin):
            node.lookups.append(ev)
            if self.registry == "up":
                node.core.twin_resolved(ev.twin, self.twin(ev.twin), self.now)
            elif self.registry == "down":
                node.core.twin_lookup_failed(ev.twin, "registry unreachable", self.now)
        else:
            raise AssertionError(f"unknown event {ev!r}")

    def route(self, frame):
        env = Envelope()
        env.ParseFromString(frame)
        node = self.nodes.get(env.destination.twin)
        if node is None:
            return
        relay = node.core.live_relays()[0] if node.core.live_relays() else node.core._order[0]
        if self.twin_table:
            node.core.receive_frame(frame, relay, self.now)
            return
        got = node.core.receive(frame, relay, self.now)
        if got is not None:
            node.core.accept(got, self.twin(got.source.twin), self.now)

    def fire_timers(self):
        for node in self.nodes.values():
            t = node.core.get_timer()
            if t is not None and t <= self.now:
                node.core.handle_timer(self.now)
        self.pump()

    def advance(self, seconds, step=1.0):
        end = self.now + seconds
        while self.now < end:
            self.now = min(end, self.now + step)
            self.fire_timers()

    # app / service helpers -----------------------------------------------------------
    def app_send(self, node, dst, cmd="calc.add", data=b"hello", exp=60, ref=None, ret="app.ret",
                 now=None, **extra):
        msg = {"ver": 1, "ref": ref or new_uid(), "cmd": cmd, "exp": exp, "dat": b64(data),
               "tag": None, "dst": dst, "ret": ret, "shm": None,
               "now": int(self.now if now is None else now)}
        msg.update(extra)
        if self.twin_table:
            node.core.receive_local(json.dumps(msg).encode(), self.now)
            self.pump()
            return msg["ref"], None
        req = node.core.app_message(json.dumps(msg).encode(), self.now)
        uid = None
        if req is not None:
            uid = node.core.send_request(req, {d: self.twin(d) for d in req.dst}, self.now)
        self.pump()
        return msg["ref"], uid

    def serve(self, node, cmd="calc.add", fn=lambda b: b[::-1], err=None):
        """The service behind `node`: answer everything on msgbus.<cmd>."""
        n = 0
        while (raw := node.rpop("msgbus." + cmd)) is not None:
            req = json.loads(raw)
            assert req["ret"] == REPLY_QUEUE
            reply = {"ver": 1, "ref": req["ref"], "dat": b64(fn(base64.b64decode(req["dat"]))),
                     "dst": req["src"], "shm": None, "now": int(self.now)}
            if err:
                reply["err"] = {"code": err[0], "message": err[1]}
            if self.twin_table:
                node.core.receive_service_reply(json.dumps(reply).encode(), self.now)
                n += 1
                continue
            rep = node.core.service_message(json.dumps(reply).encode(), self.now)
            node.core.send_response(rep, self.twin(rep.dst_twin), self.now)
            n += 1
        self.pump()
        return n


@pytest.fixture
def sim():
    return Sim()


def test_request_response_roundtrip_is_e2e_encrypted(sim):
    a, b = sim.add(1), sim.add(2)
    ref, uid = sim.app_send(a, [2], data=b"secret payload 123")
    assert uid == ref  # the app's UUID ref is reused as the envelope uid (one trace id)
    # what the relay saw: one request, ciphertext only
    req_env = Envelope()
    req_env.ParseFromString(a.sent[0].data)
    assert req_env.WhichOneof("payload") == "cipher"
    assert b"secret payload 123" not in a.sent[0].data
    assert req_env.source.twin == 1 and req_env.destination.twin == 2
    assert req_env.expiration == 60 and req_env.request.command == "calc.add"
    # the backlog record
    backlog = Backlog()
    backlog.ParseFromString(a.kv[BACKLOG_PREFIX + uid][0])
    assert (backlog.uid, backlog.reference, backlog.reply_to, backlog.module, backlog.ttl) == \
        (uid, ref, "app.ret", "calc.add", 60)
    # the service side got the incoming request JSON
    [incoming] = b.all("msgbus.calc.add")
    assert incoming["src"] == "1" and incoming["ref"] == uid and incoming["ret"] == REPLY_QUEUE
    assert base64.b64decode(incoming["dat"]) == b"secret payload 123"
    assert incoming["exp"] == 60 and incoming["cmd"] == "calc.add"
    assert sim.serve(b) == 1
    [reply] = a.all("app.ret")
    assert reply["ref"] == ref and reply["src"] == "2" and "err" not in reply
    assert base64.b64decode(reply["dat"]) == b"secret payload 123"[::-1]
    resp_env = Envelope()
    resp_env.ParseFromString(b.sent[0].data)
    assert resp_env.WhichOneof("payload") == "cipher" and resp_env.uid == uid
    assert a.core.pending_count == 0
    # a duplicated response (e.g. replayed by a relay) is not pushed to the app twice
    sim.in_flight.append(b.sent[0].data)
    sim.pump()
    assert len(a.all("app.ret")) == 1
    names = [e["event"] for e in a.events()]
    assert "rmb.peer.sent" in names and "rmb.peer.answered" in names
    assert all(e["trace_id"] == uid for e in a.events() if e["event"] in ("rmb.peer.sent", "rmb.peer.answered"))
    assert "secret" not in a.logbuf.getvalue() + b.logbuf.getvalue()


def test_plain_when_destination_has_no_pk(sim):
    a, b = sim.add(1), sim.add(2, pk=False)
    sim.app_send(a, [2], data=b"visible")
    env = Envelope()
    env.ParseFromString(a.sent[0].data)
    assert env.WhichOneof("payload") == "plain" and env.plain == b"visible"
    sim.serve(b)
    [reply] = a.all("app.ret")
    assert "err" not in reply


def test_multi_destination_one_uid_n_replies(sim):
    a = sim.add(1)
    for t in (2, 3, 4):
        sim.add(t)
    ref, uid = sim.app_send(a, [2, 3, 4])
    assert len(a.sent) == 3 and {f.uid for f in a.sent} == {uid}
    assert sorted(f.dst for f in a.sent) == [2, 3, 4]
    for t in (4, 2):
        sim.serve(sim.nodes[t])
    assert len(a.all("app.ret")) == 2 and a.core.pending_count == 1
    assert BACKLOG_PREFIX + uid in a.kv          # a reply is still due: the record stays
    sim.serve(sim.nodes[3])
    replies = a.all("app.ret")
    assert sorted(r["src"] for r in replies) == ["2", "3", "4"]
    assert all(r["ref"] == ref for r in replies)
    assert a.core.pending_count == 0
    assert a.dropped == [BACKLOG_PREFIX + uid]   # finished: the record is deleted, once


def test_expiry_sends_102_for_each_missing_reply(sim):
    a = sim.add(1)
    sim.add(2)
    sim.add(3)
    ref, uid = sim.app_send(a, [2, 3], exp=30)
    assert a.core.get_timer() <= sim.now + PING_INTERVAL
    sim.serve(sim.nodes[2])
    sim.advance(29)
    assert len(a.all("app.ret")) == 1
    sim.advance(1.5)
    replies = a.all("app.ret")
    assert len(replies) == 2
    assert replies[1]["src"] == "3" and replies[1]["err"]["code"] == 102
    assert a.core.pending_count == 0
    assert a.dropped == [BACKLOG_PREFIX + uid]   # expired is finished too
    # the late reply after expiry is not pushed to the app
    sim.serve(sim.nodes[3])
    assert len(a.all("app.ret")) == 2


@pytest.mark.parametrize("exp,stamp_offset,want", [
    (0, 0, 300),          # no expiration given -> 300
    (10_000, 0, 1800),    # capped at 1800
    (60, -20, 40),        # remaining TTL
    (60, -59.5, 1),
])
def test_ttl_rules(sim, exp, stamp_offset, want):
    a = sim.add(1)
    sim.add(2)
    sim.now += 0.5 if stamp_offset == -59.5 else 0
    sim.app_send(a, [2], exp=exp, now=int(sim.now + stamp_offset))
    env = Envelope()
    env.ParseFromString(a.sent[0].data)
    assert env.expiration == want
    store = next(v for k, v in a.kv.items())
    assert abs(store[1] - sim.now - want) < 1e-6


def test_expired_app_request_gets_102(sim):
    a = sim.add(1)
    sim.add(2)
    sim.app_send(a, [2], exp=10, now=sim.now - 10)
    assert a.sent == []
    [reply] = a.all("app.ret")
    assert reply["err"]["code"] == 102


@pytest.mark.parametrize("mutate,code", [
    (lambda m: m.update(dat="***not base64***"), 101),
    (lambda m: m.pop("cmd"), 100),
    (lambda m: m.update(dst=[]), 100),
    (lambda m: m.update(dst=["2"]), 100),
    (lambda m: m.update(dst=[0]), 100),
    (lambda m: m.update(exp=-1), 100),
    (lambda m: m.update(tag=5), 100),
])
def test_invalid_app_json_gets_precise_code(sim, mutate, code):
    a = sim.add(1)
    sim.add(2)
    msg = {"ver": 1, "ref": "r1", "cmd": "x.y", "exp": 60, "dat": b64(b"x"), "dst": [2],
           "ret": "app.ret", "now": int(sim.now)}
    mutate(msg)
    assert a.core.app_message(json.dumps(msg).encode(), sim.now) is None
    sim.pump()
    [reply] = a.all("app.ret")
    assert reply["err"]["code"] == code and reply["ref"] == "r1"
    assert a.sent == []


def test_garbage_without_ret_is_only_logged(sim):
    a = sim.add(1)
    for raw in (b"not json", b"[1,2]", json.dumps({"cmd": "x"}).encode()):
        assert a.core.app_message(raw, sim.now) is None
    sim.pump()
    assert a.queues == {}
    rejected = [e for e in a.events() if e["event"] == "rmb.peer.rejected"]
    assert [e["attrs"]["code"] for e in rejected] == [100, 100, 100]


def test_unknown_destination_twin_gets_103_others_flow(sim):
    a = sim.add(1)
    sim.add(2)
    ref, uid = sim.app_send(a, [2, 99])
    [err] = a.all("app.ret")
    assert err["src"] == "99" and err["err"]["code"] == 103
    sim.serve(sim.nodes[2])
    assert len(a.all("app.ret")) == 2 and a.core.pending_count == 0


def forge_request(sender: Node, dst: int, now: float, *, uid=None, exp=60, sign_with=None,
                  cipher=None, plain=b"x", cmd="calc.add"):
    env = Envelope(uid=uid or new_uid(), timestamp=int(now), expiration=exp)
    env.source.twin = sender.twin.id
    env.destination.twin = dst
    env.request.command = cmd
    if cipher is not None:
        env.cipher = cipher
    else:
        env.plain = plain
    sign_envelope(env, sign_with or sender.identity)
    return env


def test_bad_signature_refused_104_while_traffic_flows(sim):
    a, b = sim.add(1), sim.add(2)
    mallory = Identity.from_seed(b"\x55" * 32)
    bad = forge_request(a, 2, sim.now, sign_with=mallory)
    sim.in_flight.append(bad.SerializeToString())
    ref, uid = sim.app_send(a, [2])  # legit traffic in the same batch
    assert len(b.all("msgbus.calc.add")) == 1  # only the good one was delivered
    errs = [f for f in b.sent if f.kind == "error"]
    assert len(errs) == 1 and errs[0].uid == bad.uid
    env = Envelope()
    env.ParseFromString(errs[0].data)
    assert env.error.code == 104 and env.destination.twin == 1
    sim.serve(b)
    assert [r["ref"] for r in a.all("app.ret")] == [ref]


def test_expired_rejected_before_signature(sim):
    a, b = sim.add(1), sim.add(2)
    mallory = Identity.from_seed(b"\x55" * 32)
    old = forge_request(a, 2, sim.now - 100, exp=50, sign_with=mallory)  # expired AND forged
    sim.in_flight.append(old.SerializeToString())
    sim.pump()
    [err] = [f for f in b.sent if f.kind == "error"]
    env = Envelope()
    env.ParseFromString(err.data)
    assert env.error.code == 102 and env.uid == old.uid
    assert b.all("msgbus.calc.add") == []


def test_unknown_sender_no_pk_and_tampered_cipher(sim):
    a, b = sim.add(1), sim.add(2)
    c = sim.add(3, pk=False)
    ghost = Node(sim, 77, ["r1"])
    from rmb_peer.e2e import encrypt
    cases = [
        (forge_request(ghost, 2, sim.now), 103),
        (forge_request(c, 2, sim.now, cipher=encrypt(c.e2e, b.e2e.pk, b"x")), 105),
        (forge_request(a, 2, sim.now, cipher=b"\x00" * 40), 106),
    ]
    for env, _ in cases:
        sim.in_flight.append(env.SerializeToString())
    sim.pump()
    codes = {}
    for f in b.sent:
        env = Envelope()
        env.ParseFromString(f.data)
        codes[env.uid] = env.error.code
    assert codes == {env.uid: code for env, code in cases}
    assert b.all("msgbus.calc.add") == []


def test_rmb_version_answered_by_the_peer(sim):
    a, b = sim.add(1), sim.add(2)
    ref, uid = sim.app_send(a, [2], cmd="rmb.version", data=b"")
    assert "msgbus.rmb.version" not in b.queues
    [reply] = a.all("app.ret")
    assert json.loads(base64.b64decode(reply["dat"])) == VERSION
    assert reply["shm"] == "application/json" and reply["src"] == "2"


def test_relay_error_becomes_app_err(sim):
    a = sim.add(1)
    sim.add(2)
    sim.mangle = lambda frames: []  # the relay swallows everything
    ref, uid = sim.app_send(a, [2])
    req = Envelope()
    req.ParseFromString(a.sent[0].data)
    sim.mangle = None
    # relay errors never need accept(): receive() handles them itself
    assert a.core.receive(relay_error(req, "message has expired").SerializeToString(), "r1", sim.now) is None
    sim.pump()
    [reply] = a.all("app.ret")
    assert reply["err"]["code"] == 102 and "message has expired" in reply["err"]["message"]
    assert reply["src"] == "2" and reply["ref"] == ref
    ref2, uid2 = sim.app_send(a, [2])
    sim.pump()
    req2 = Envelope()
    req2.ParseFromString(a.sent[-1].data)
    a.core.receive(relay_error(req2, "destination offline").SerializeToString(), "r1", sim.now)
    sim.pump()
    assert a.all("app.ret")[-1]["err"]["code"] == 500


def test_reply_from_wrong_twin_is_refused(sim):
    a = sim.add(1)
    sim.add(2)  # the destination twin exists; its answer is dropped below
    c = sim.add(3)
    sim.mangle = lambda frames: []
    ref, uid = sim.app_send(a, [2])
    sim.mangle = None
    # twin 3 answers a request it never got
    forged = Envelope(uid=uid, timestamp=int(sim.now), expiration=60)
    forged.source.twin = 3
    forged.destination.twin = 1
    forged.response.SetInParent()
    forged.plain = b"spoof"
    sign_envelope(forged, c.identity)
    sim.in_flight.append(forged.SerializeToString())
    sim.pump()
    assert a.all("app.ret") == [] and a.core.pending_count == 1


def test_loss_duplication_reordering(sim):
    a, b = sim.add(1), sim.add(2)
    dropped = []

    def mangle(frames):
        out = []
        for i, f in enumerate(frames):
            if len(dropped) < 1:       # lose the very first frame
                dropped.append(f)
                continue
            out.extend([f, f])         # duplicate the rest
        return list(reversed(out))     # and reorder
    sim.mangle = mangle
    refs = [sim.app_send(a, [2], exp=20)[0] for _ in range(3)]
    sim.serve(b)
    sim.advance(21)
    replies = a.all("app.ret")
    # exactly one reply per request: duplicates of answered requests are not pushed twice
    assert sorted(r["ref"] for r in replies) == sorted(refs)
    codes = sorted(r.get("err", {}).get("code", 0) for r in replies)
    assert codes == [0, 0, 102]  # the lost one expires


def test_restarted_peer_answers_from_the_redis_backlog(sim):
    a, b = sim.add(1), sim.add(2)
    sim.mangle = lambda frames: []
    ref, uid = sim.app_send(a, [2])
    sim.mangle = None
    # peer A restarts: same identity and Redis, empty memory
    fresh = PeerCore(1, a.identity, a.e2e, ["r1"])
    fresh.start(sim.now)
    fresh.handle_timer(sim.now)
    a.core = fresh
    sim.pump()
    req = Envelope()
    req.ParseFromString(sim.wire[0])
    sim.in_flight.append(sim.wire[0])
    sim.pump()
    sim.serve(b)
    [reply] = a.all("app.ret")
    assert reply["ref"] == ref and reply["src"] == "2" and "err" not in reply


def test_service_error_reply_reaches_app(sim):
    a, b = sim.add(1), sim.add(2)
    sim.app_send(a, [2])
    sim.serve(b, err=(42, "division by zero"))
    [reply] = a.all("app.ret")
    assert reply["err"] == {"code": 42, "message": "division by zero"}


def test_bad_service_reply_payload_answers_requester_101(sim):
    a, b = sim.add(1), sim.add(2)
    ref, uid = sim.app_send(a, [2])
    raw = b.rpop("msgbus.calc.add")
    req = json.loads(raw)
    rep = b.core.service_message(json.dumps({"ver": 1, "ref": req["ref"], "dat": "!!",
                                             "dst": req["src"], "now": 0}), sim.now)
    b.core.send_response(rep, sim.twin(1), sim.now)
    sim.pump()
    [reply] = a.all("app.ret")
    assert reply["err"]["code"] == 101
    assert b.core.service_message(b"{bad", sim.now) is None
    assert b.core.service_message(json.dumps({"ref": "x", "dst": "abc"}), sim.now) is None


def test_a_silent_relay_is_dead_one_ping_timeout_after_the_ping(sim):
    """The last frame at t0: a ping at t0 + 20 s, dead at t0 + 30 s without a pong (the
    relay's own heartbeat notices a silent peer as fast); before, 40 s."""
    a = sim.add(1)
    a.auto_connect = False
    t0 = sim.now
    sim.advance(29.0, step=0.5)
    assert len(a.pings) == 1 and a.disconnects == []
    sim.advance(1.0, step=0.5)
    assert len(a.disconnects) == 1 and sim.now - t0 == 30.0
    assert "no pong 10 s after a ping" in a.disconnects[0].reason


def test_keepalive_ping_dead_reconnect_backoff(sim):
    a = sim.add(1)
    assert a.core.live_relays() == ["r1"]
    sim.advance(PING_INTERVAL)
    assert len(a.pings) == 1
    a.core.relay_activity("r1", sim.now)          # the pong
    sim.advance(PING_INTERVAL)
    assert len(a.pings) == 2 and a.disconnects == []
    a.auto_connect = False
    sim.advance(DEAD_AFTER)                       # silence: no pong since
    assert len(a.disconnects) == 1 and a.core.live_relays() == []
    dead_at = sim.now
    # reconnect after 1 s, then the attempt fails: next one after 2 s, then 4 s
    sim.advance(1.0, step=0.25)
    assert len(a.connects) == 2
    a.core.relay_failed("r1", a.connects[-1].attempt, sim.now, "refused")
    sim.advance(1.9, step=0.1)
    assert len(a.connects) == 2
    sim.advance(0.2, step=0.1)
    assert len(a.connects) == 3
    a.core.relay_failed("r1", a.connects[-1].attempt, sim.now, "refused")
    sim.advance(4.1, step=0.1)
    assert len(a.connects) == 4
    a.core.relay_connected("r1", a.connects[-1].attempt, sim.now)
    assert a.core.live_relays() == ["r1"] and sim.now - dead_at < 8
    # a stale attempt's late "lost" is ignored
    a.core.relay_lost("r1", a.connects[0].attempt, sim.now, "old socket closed")
    assert a.core.live_relays() == ["r1"]


def test_failover_and_outbox(sim):
    a = sim.add(1, relays=("r1", "r2"))
    b = sim.add(2)
    assert a.core.live_relays() == ["r1", "r2"]
    sim.app_send(a, [2])
    assert a.sent[-1].relay == "r1"
    a.auto_connect = False
    a.core.relay_lost("r1", a.sent[-1].attempt, sim.now, "closed")
    sim.app_send(a, [2])
    assert a.sent[-1].relay == "r2"
    r2_attempt = a.sent[-1].attempt
    a.core.relay_lost("r2", r2_attempt, sim.now, "closed")
    ref, _ = sim.app_send(a, [2])
    assert len(a.sent) == 2                     # held in the outbox
    sim.advance(1.0)                            # reconnect attempts come due
    assert {c.relay for c in a.connects[-2:]} == {"r1", "r2"}
    c = [c for c in a.connects if c.relay == "r2"][-1]
    a.core.relay_connected("r2", c.attempt, sim.now)
    sim.pump()
    assert len(a.sent) == 3 and a.sent[-1].relay == "r2"
    sim.serve(b)
    assert len(a.all("app.ret")) == 3


def test_write_failure_resends_through_another_relay(sim):
    a = sim.add(1, relays=("r1", "r2"))
    sim.add(2)
    sim.mangle = lambda frames: []
    sim.app_send(a, [2])
    failed = a.sent[-1]
    assert failed.relay == "r1"
    a.core.relay_lost("r1", failed.attempt, sim.now, "write failed")
    a.core.resend(failed, sim.now)
    sim.pump()
    assert a.sent[-1].relay == "r2" and a.sent[-1].data == failed.data


def test_unknown_relay_is_local_misuse(sim):
    a = sim.add(1)
    with pytest.raises(PeerStateError):
        a.core.relay_activity("nope", sim.now)
    with pytest.raises(PeerStateError):
        PeerCore(1, a.identity, a.e2e, ["r1", "r2", "r3", "r4", "r5"])


def test_ed25519_twins_interoperate(sim):
    a = sim.add(1, key_type="ed25519")
    b = sim.add(2)
    sim.app_send(b, [1])
    sim.serve(a)
    [reply] = b.all("app.ret")
    assert "err" not in reply


def test_finished_requests_are_remembered_until_their_deadline_then_forgotten(sim):
    """A duplicated reply to a finished request is dropped as late (no backlog lookup)
    until the request's deadline; after it, the uid is forgotten (a reply then goes to
    the backlog lookup). A uid finished twice (the app reused its ref) is remembered
    until the later deadline, even when the earlier record is pruned."""
    a = sim.add(1)
    b = sim.add(2)
    lookups = []
    original = sim.execute

    def execute(node, ev):
        if isinstance(ev, LookupBacklog):
            lookups.append(ev.uid)
        original(node, ev)
    sim.execute = execute
    ref, uid = sim.app_send(a, [2], exp=30)
    sim.serve(b)
    response = b.sent[-1].data
    assert a.core.pending_count == 0 and len(a.all("app.ret")) == 1
    sim.route(response)                       # duplicate within the TTL: late
    sim.pump()
    assert a.core.stats["late_replies"] == 1 and lookups == []
    sim.advance(20)
    _, uid2 = sim.app_send(a, [2], exp=30, ref=ref)   # same ref: the same uid again
    assert uid2 == uid
    sim.serve(b)
    sim.advance(15)                           # past the first deadline, before the second
    _, other = sim.app_send(a, [2], exp=30)   # a completion prunes expired records
    sim.serve(b)
    sim.route(response)
    sim.pump()
    assert a.core.stats["late_replies"] == 2 and lookups == []   # still remembered
    sim.advance(31)
    sim.app_send(a, [2], exp=30)
    sim.serve(b)                              # prunes both records of uid
    sim.route(response)
    sim.pump()
    assert a.core.stats["late_replies"] == 2 and lookups == [uid]


def test_shared_key_cache_is_exact_and_interoperates_with_plain_keys():
    """SharedKeyCache memoizes the ECDH key and its AES-GCM object per peer pk; ciphers it
    makes open with the plain E2EKey of the other side and vice versa (DESIGN.md section
    3: key = sha256 of the shared point, deterministic per key pair); a malformed pk is
    still an E2EError."""
    from rmb_peer.core import SharedKeyCache
    from rmb_peer.e2e import E2EError, decrypt, encrypt
    ours, theirs = E2EKey.from_seed(b"\x01" * 32), E2EKey.from_seed(b"\x02" * 32)
    cache = SharedKeyCache(ours, size=2)
    assert cache.shared_key(theirs.pk) == ours.shared_key(theirs.pk)
    assert cache.aead(theirs.pk) is cache.aead(theirs.pk)
    c1 = encrypt(cache, theirs.pk, b"ping")
    assert decrypt(theirs, ours.pk, c1) == b"ping"
    assert decrypt(cache, theirs.pk, encrypt(theirs, ours.pk, b"pong")) == b"pong"
    others = [E2EKey.from_seed(bytes([i]) * 32).pk for i in (3, 4, 5)]
    for pk in others:           # more peers than `size`: cleared, still correct
        assert decrypt(cache, pk, encrypt(E2EKey.from_seed(bytes([others.index(pk) + 3]) * 32),
                                          ours.pk, b"x")) == b"x"
    assert len(cache._cache) <= 2
    with pytest.raises(E2EError):
        encrypt(cache, b"\x02" + b"\x00" * 31, b"x")


# ------------------------------------------------------------------ the core's twin table
# Finding 1: a hung registry blocked the peer's whole app queue 5 s per new twin; a
# registry down longer than the 60 s cache failed 100% of traffic. The core now owns the
# twin table and asks for lookups as LookupTwin outputs; nothing waits inside it.

def _table_sim():
    sim = Sim()
    sim.twin_table = True
    a, b, c = sim.add(1), sim.add(2), sim.add(3)
    return sim, a, b, c


def _replies(node, ret="app.ret"):
    return node.all(ret)


def test_hung_registry_delays_only_messages_for_the_twin_being_looked_up():
    sim, a, b, c = _table_sim()
    sim.app_send(a, [2])                         # B resolved while the registry is up
    sim.serve(b)
    assert [r["err"] if "err" in r else r["dat"] for r in _replies(a)] == [b64(b"olleh")]
    sim.registry = "hung"
    sim.app_send(a, [3], data=b"to-c")           # C unknown to A: parked on its lookup
    assert [ev.twin for ev in a.lookups][-1] == 3 and a.core.parked_count == 1
    for i in range(50):                          # B traffic flows meanwhile, untouched
        sim.app_send(a, [2], data=b"x%d" % i)
    sim.serve(b)
    assert len(_replies(a)) == 51 and all("err" not in r for r in _replies(a))
    assert c.all("msgbus.calc.add") == []        # nothing reached C yet
    a.core.twin_resolved(3, sim.twin(3), sim.now)  # the slow answer arrives
    sim.pump()
    assert c.core.parked_count == 1              # C waits for A's record in turn
    c.core.twin_resolved(1, sim.twin(1), sim.now)
    sim.pump()
    sim.serve(c)
    assert _replies(a)[-1]["dat"] == b64(b"c-ot") and a.core.parked_count == 0


def test_registry_down_serves_stale_records_bounded_and_logged():
    sim, a, b, c = _table_sim()
    sim.app_send(a, [2])
    sim.serve(b)
    a.core.twin_max_stale = 100.0
    b.core.twin_max_stale = 100.0
    sim.registry = "down"
    sim.advance(a.core.twin_ttl + 5)             # every record is past its TTL
    for i in range(5):
        sim.app_send(a, [2], data=b"s%d" % i)
        sim.serve(b)
    assert len(_replies(a)) == 6 and all("err" not in r for r in _replies(a))
    stale = [e for e in a.events() if e["event"] == "rmb.peer.twin_stale"]
    assert len(stale) == 1 and stale[0]["attrs"]["twin"] == 2      # logged once
    assert any(e["event"] == "rmb.peer.twin_lookup_failed" for e in a.events())
    # retries are rate-limited: not one lookup per message
    assert len([ev for ev in a.lookups if ev.twin == 2]) <= 3
    sim.advance(100, step=10)                    # past TTL + max_stale: no longer served
    sim.app_send(a, [2], data=b"late")
    last = _replies(a)[-1]
    assert last["err"]["code"] == 500 and "lookup failed" in last["err"]["message"]
    sim.registry = "up"                          # recovers as soon as the registry does
    sim.app_send(a, [2], data=b"back")
    sim.serve(b)
    assert _replies(a)[-1]["dat"] == b64(b"kcab")
    assert any(e["event"] == "rmb.peer.twin_recovered" for e in a.events())


def test_lookup_without_answer_times_out_and_fails_only_its_messages():
    from rmb_peer.core import LOOKUP_TIMEOUT
    sim, a, b, c = _table_sim()
    sim.registry = "hung"
    sim.app_send(a, [3], data=b"never")
    assert a.core.parked_count == 1
    sim.advance(LOOKUP_TIMEOUT + 1)
    last = _replies(a)[-1]
    assert last["err"]["code"] == 500 and "no answer" in last["err"]["message"]
    assert a.core.parked_count == 0


def test_negative_cache_and_parked_bound(monkeypatch):
    import rmb_peer.core as core_mod
    sim, a, b, c = _table_sim()
    for _ in range(3):
        sim.app_send(a, [77])                    # no such twin
    assert [r["err"]["code"] for r in _replies(a)] == [103] * 3
    assert len([ev for ev in a.lookups if ev.twin == 77]) == 1       # remembered
    sim.advance(a.core.twin_negative_ttl + 1)
    sim.app_send(a, [77])
    assert len([ev for ev in a.lookups if ev.twin == 77]) == 2
    monkeypatch.setattr(core_mod, "MAX_PARKED", 3)
    sim.registry = "hung"
    for i in range(5):
        sim.app_send(a, [100 + i])
    refused = [r for r in _replies(a)[4:] if "err" in r]
    assert a.core.parked_count == 3 and len(refused) == 2
    assert all(r["err"]["code"] == 500 and "wait for twin lookups" in r["err"]["message"]
               for r in refused)


def test_incoming_request_from_an_unresolved_twin_waits_then_is_answered():
    sim, a, b, c = _table_sim()
    sim.registry = "hung"
    sim.app_send(a, [2], data=b"q")              # A waits for B's record
    a.core.twin_resolved(2, sim.twin(2), sim.now)
    sim.pump()
    assert b.core.parked_count == 1              # B waits for A's record to verify
    assert b.all("msgbus.calc.add") == []
    b.core.twin_resolved(1, sim.twin(1), sim.now)
    sim.pump()
    sim.serve(b)                                 # B's reply needs A's record: cached now
    assert _replies(a)[-1]["dat"] == b64(b"q")


def test_load_twins_lets_a_peer_work_while_the_registry_is_down():
    sim, a, b, c = _table_sim()
    sim.registry = "down"
    a.core.load_twins([(sim.twin(2), 1800.0)], sim.now)     # known, 30 min old
    b.core.load_twins([(sim.twin(1), 30.0)], sim.now)       # fresh
    sim.app_send(a, [2], data=b"offline")
    sim.serve(b)
    assert _replies(a)[-1]["dat"] == b64(b"enilffo")
    assert a.core.twin_record(2).id == 2
    # older than TTL + max_stale: not served, the app gets a precise error
    a.core.load_twins([(sim.twin(3), a.core.twin_ttl + a.core.twin_max_stale + 1)], sim.now)
    sim.app_send(a, [3], data=b"too old")
    assert _replies(a)[-1]["err"]["code"] == 500


def test_clock_rule_timers_on_loop_time_wire_on_wall_time():
    """`now` is the timer clock; wire timestamps and expiry use now + wall_offset."""
    sim = Sim()
    sim.now = 500.0                              # a loop clock, far from unix time
    a, b = sim.add(1), sim.add(2)
    for n in (a, b):
        n.core.wall_offset = T0 - 500.0
    sim.app_send(a, [2], now=T0)
    env = Envelope.FromString(a.sent[-1].data)
    assert env.timestamp == int(T0)              # wall time on the wire
    sim.serve(b)
    assert _replies(a)[-1]["dat"] == b64(b"olleh")  # B judged expiry on wall time
    assert a.core.get_timer() < 500.0 + 3600    # timers stay on the loop clock


# ------------------------------------------------------------------ finding 6: edge bounds

def test_service_reply_that_cannot_be_an_envelope_is_refused_not_sent():
    """A service reply whose ref is 300 chars, or whose payload would make an envelope
    over the relay's limit, used to be sent and make the relay close the peer's
    connection (frames in flight lost). Now: the ref one is refused and logged; the big
    one answers the requester with error 101 and nothing oversize reaches the wire."""
    sim = Sim()
    a, b = sim.add(1), sim.add(2)
    limit = 4096
    for n in (a, b):
        n.core.max_envelope = limit
    sim.app_send(a, [2], data=b"q")
    raw = b.rpop("msgbus.calc.add")
    req = json.loads(raw)
    sent_before = len(b.sent)
    long_ref = {"ver": 1, "ref": "r" * 300, "dat": b64(b"x"), "dst": req["src"], "now": 1}
    assert b.core.service_message(json.dumps(long_ref).encode(), sim.now) is None
    assert len(b.sent) == sent_before
    assert any("300 chars" in e["attrs"].get("reason", "") for e in b.events()
               if e["event"] == "rmb.peer.rejected")
    big = {"ver": 1, "ref": req["ref"], "dat": b64(b"y" * limit), "dst": req["src"], "now": 1}
    rep = b.core.service_message(json.dumps(big).encode(), sim.now)
    b.core.send_response(rep, sim.twin(1), sim.now)
    sim.pump()
    assert all(len(ev.data) <= limit for ev in b.sent)
    [reply] = a.all("app.ret")
    assert reply["err"]["code"] == 101 and "reply too large" in reply["err"]["message"]


def test_app_request_too_large_for_an_envelope_gets_101():
    sim = Sim()
    a, b = sim.add(1), sim.add(2)
    a.core.max_envelope = 4096
    sim.app_send(a, [2], data=b"z" * 5000)
    assert a.sent == []
    [reply] = a.all("app.ret")
    assert reply["err"]["code"] == 101 and "request too large" in reply["err"]["message"]
