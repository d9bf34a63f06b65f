"""RMB end to end: real registry, real relays (rmb_relay.daemon.RelayServer), real rmb-peer
daemons (rmb_peer.daemon.PeerDaemon) and apps (rmb_peer.client) over a real Redis, all on
127.0.0.1. Each test proves one of the issue's must-show items."""
from __future__ import annotations

import asyncio
import io
import json
import time

import pytest
import websockets

pytest.importorskip("rmb_relay.daemon", reason="rmb_relay.daemon (the relay) has not landed yet")

from daemon_runtime.eventlog import EventLog  # noqa: E402
from rmb_peer.challenge import sign_envelope  # noqa: E402
from rmb_peer.client import ServiceError  # noqa: E402
from rmb_peer.core import VERSION  # noqa: E402
from rmb_peer.envelope import Envelope, new_uid, parse_envelope  # noqa: E402
from rmb_peer.events import RMB_EVENTS  # noqa: E402
from rmb_peer.identity import Identity  # noqa: E402
from rmb_peer.token import make_token  # noqa: E402
from tests.rmb_harness import RmbCluster, events_of  # noqa: E402


async def echo_upper(data: bytes) -> bytes:
    return data.upper()


async def wait_for(pred, timeout=10.0, step=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        await asyncio.sleep(step)
    return pred()


@pytest.fixture
async def cluster(redis_url, tmp_path):
    async with RmbCluster(redis_url, tmp_path) as c:
        yield c


async def test_two_peers_one_relay_e2e_encrypted(cluster):
    """1. request and response through the Redis queues; the relay never saw plaintext."""
    r1 = await cluster.start_relay()
    a = await cluster.new_twin([r1])
    b = await cluster.new_twin([r1])
    pa = await cluster.start_peer(a, [r1])
    pb = await cluster.start_peer(b, [r1])
    app_log, svc_log = io.StringIO(), io.StringIO()
    cluster.service(pb, "upper", {"text.upper": echo_upper},
                    log=EventLog("upper", str(b.id), [RMB_EVENTS], sink=svc_log))
    client = cluster.client(pa, log=EventLog("app", str(a.id), [RMB_EVENTS], sink=app_log))
    secret = b"the quick brown fox " + new_uid().encode()
    [reply] = await client.call(b.id, "text.upper", secret, ttl=20)
    assert reply.ok, reply
    assert reply.src == str(b.id) and reply.data == secret.upper()
    # one trace id end to end: app request = envelope uid at peers, relay and service
    [requested] = [e for e in events_of(app_log) if e["event"] == "rmb.app.requested"]
    uid = requested["trace_id"]
    assert [e["trace_id"] for e in events_of(app_log) if e["event"] == "rmb.app.replied"] == [uid]
    assert [e["trace_id"] for e in events_of(svc_log) if e["event"] == "rmb.app.handled"] == [uid]
    # both twins on r1: the live local route, one `forwarded` event per envelope
    assert {e["event"] for e in events_of(r1.log) if e["trace_id"] == uid} == {"rmb.relay.forwarded"}
    assert {e["event"] for e in events_of(pa.log) if e["trace_id"] == uid} == {"rmb.peer.sent", "rmb.peer.answered"}
    assert {e["event"] for e in events_of(pb.log) if e["trace_id"] == uid} == {"rmb.peer.delivered", "rmb.peer.sent"}
    # what the relay handled: a request and a response, both ciphertext
    frames = [parse_envelope(f) for f in r1.seen]
    kinds = sorted(env.WhichOneof("message") for env in frames)
    assert kinds == ["request", "response"]
    assert all(env.WhichOneof("payload") == "cipher" for env in frames)
    assert not any(secret in f or secret.upper() in f for f in r1.seen)
    # control: to a twin without a pk the same bytes ARE visible to the relay (the check can fail)
    c = await cluster.new_twin([r1], pk=False)
    pc = await cluster.start_peer(c, [r1])
    cluster.service(pc, "upper-c", {"text.upper": echo_upper})
    [reply] = await client.call(c.id, "text.upper", secret, ttl=20)
    assert reply.ok and reply.data == secret.upper()
    assert any(secret in f for f in r1.seen)
    # traces: the app's ref is the envelope uid the relay logged
    relay_events = events_of(r1.log)
    assert any(e["event"] == "rmb.relay.forwarded" for e in relay_events)
    assert "quick brown" not in r1.log.getvalue() + pa.log.getvalue() + pb.log.getvalue()


async def test_federation_two_relays(cluster):
    """2. twin A on relay 1 reaches twin B on relay 2 and back."""
    r1 = await cluster.start_relay()
    r2 = await cluster.start_relay()
    a = await cluster.new_twin([r1])
    b = await cluster.new_twin([r2])
    pa = await cluster.start_peer(a, [r1])
    pb = await cluster.start_peer(b, [r2])
    cluster.service(pb, "upper", {"text.upper": echo_upper})
    client = cluster.client(pa)
    replies = await asyncio.gather(*[client.call(b.id, "text.upper", f"msg {i}".encode(), ttl=20)
                                     for i in range(5)])
    assert sorted(r[0].data for r in replies) == sorted(f"MSG {i}".encode() for i in range(5))
    assert all(r[0].ok and r[0].src == str(b.id) for r in replies)
    fed1 = [e for e in events_of(r1.log) if e["event"] == "rmb.relay.federated"]
    fed2 = [e for e in events_of(r2.log) if e["event"] == "rmb.relay.federated"]
    assert len(fed1) == 5 and len(fed2) == 5     # requests r1 -> r2, responses r2 -> r1
    assert {e["attrs"]["domain"] for e in fed1} == {r2.domain}


async def test_offline_twin_gets_messages_in_order(cluster):
    """3. B offline: messages sent meanwhile are delivered in order when B's peer returns."""
    r1 = await cluster.start_relay()
    a = await cluster.new_twin([r1])
    b = await cluster.new_twin([r1])
    pa = await cluster.start_peer(a, [r1])
    pb = await cluster.start_peer(b, [r1])
    b_db = int(pb.redis_url.rsplit("/", 1)[1])
    await cluster.stop_peer(pb)
    got: list[bytes] = []

    async def record(data: bytes) -> bytes:
        got.append(data)
        return b"ack " + data

    client = cluster.client(pa)
    calls = []
    for i in range(8):
        calls.append(asyncio.create_task(client.call(b.id, "log.append", f"{i:02d}".encode(), ttl=30)))
        await asyncio.sleep(0.02)  # sent one after another
    await wait_for(lambda: sum(1 for e in events_of(r1.log) if e["event"] == "rmb.relay.queued") >= 8)
    assert not any(t.done() for t in calls)
    pb2 = await cluster.start_peer(b, [r1], db=b_db)
    cluster.service(pb2, "log", {"log.append": record})
    results = await asyncio.wait_for(asyncio.gather(*calls), 25)
    assert got == [f"{i:02d}".encode() for i in range(8)]
    assert [r[0].data for r in results] == [b"ack " + f"{i:02d}".encode() for i in range(8)]


async def test_failover_to_second_relay(cluster):
    """4. B lists two relays; the first is killed; traffic continues via the second."""
    r1 = await cluster.start_relay()
    r2 = await cluster.start_relay()
    a = await cluster.new_twin([r2])
    b = await cluster.new_twin([r1, r2])
    pa = await cluster.start_peer(a, [r2])
    pb = await cluster.start_peer(b, [r1, r2])
    assert pb.ready["relays"] and await wait_for(lambda: len(pb.daemon.core.live_relays()) == 2)
    cluster.service(pb, "upper", {"text.upper": echo_upper})
    client = cluster.client(pa)
    [reply] = await client.call(b.id, "text.upper", b"before", ttl=20)
    assert reply.ok and reply.data == b"BEFORE"
    sent = [e for e in events_of(pb.log) if e["event"] == "rmb.peer.sent"]
    assert sent[-1]["attrs"]["relay"] == r1.url   # B answers through its first relay
    await cluster.kill_relay(r1)
    assert await wait_for(lambda: pb.daemon.core.live_relays() == [r2.url])
    for i in range(5):
        [reply] = await client.call(b.id, "text.upper", f"after {i}".encode(), ttl=20)
        assert reply.ok and reply.data == f"AFTER {i}".encode()
    sent = [e for e in events_of(pb.log) if e["event"] == "rmb.peer.sent"]
    assert sent[-1]["attrs"]["relay"] == r2.url
    assert any(e["event"] == "rmb.peer.disconnected" and e["attrs"]["relay"] == r1.url
               for e in events_of(pb.log))


async def test_peer_refuses_bad_signature_and_expired_multi_dest_version(cluster):
    """5. bad signature (104) and expired envelope (102) refused with the precise codes while
    other traffic flows; multi-destination request gets N replies; rmb.version.

    The relay itself drops envelopes already expired on arrival, so B's clock runs 90 s
    ahead (clock skew): an envelope that is live at the relay is expired at B's peer."""
    r1 = await cluster.start_relay()
    a = await cluster.new_twin([r1])
    b = await cluster.new_twin([r1])
    c = await cluster.new_twin([r1])
    m = await cluster.new_twin([r1], pk=False)   # a raw websocket client (no rmb-peer)
    pa = await cluster.start_peer(a, [r1])
    pb = await cluster.start_peer(b, [r1], clock=lambda: time.time() + 90)
    pc = await cluster.start_peer(c, [r1])
    handled = []

    async def upper(data: bytes) -> bytes:
        handled.append(data)
        return data.upper()

    async def fails(data: bytes) -> bytes:
        raise ServiceError("no such thing", code=404)

    cluster.service(pb, "svc-b", {"text.upper": upper, "text.fail": fails})
    cluster.service(pc, "svc-c", {"text.upper": upper})
    client = cluster.client(pa)

    token = make_token(m.identity, m.id, None, int(time.time()))
    async with websockets.connect(f"{r1.url}/?{token}", compression=None) as ws:
        def forged(uid, stamp, exp, signer):
            env = Envelope(uid=uid, timestamp=stamp, expiration=exp)
            env.source.twin = m.id
            env.destination.twin = b.id
            env.request.command = "text.upper"
            env.plain = b"forged"
            sign_envelope(env, signer)
            return env.SerializeToString()

        bad_uid, old_uid, good_uid = new_uid(), new_uid(), new_uid()
        now = int(time.time())
        await ws.send(forged(bad_uid, now, 300, Identity.from_seed(b"\x42" * 32)))
        await ws.send(forged(old_uid, now - 30, 60, m.identity))   # live at the relay, not at B
        # legit traffic at the same time: a multi-destination call and rmb.version
        multi = asyncio.create_task(client.call([b.id, c.id], "text.upper", b"hello", ttl=300))
        version = asyncio.create_task(client.call(b.id, "rmb.version", b"", ttl=300))
        await ws.send(forged(good_uid, now, 300, m.identity))
        answers = {}
        deadline = time.monotonic() + 10
        while len(answers) < 3 and time.monotonic() < deadline:
            env = parse_envelope(await asyncio.wait_for(ws.recv(), 10))
            answers[env.uid] = env
        assert answers[bad_uid].error.code == 104
        assert answers[old_uid].error.code == 102
        assert answers[good_uid].WhichOneof("message") == "response"
        assert answers[good_uid].plain == b"FORGED"
        assert all(answers[u].source.twin == b.id for u in (bad_uid, old_uid, good_uid))
    replies = await multi
    assert sorted(r.src for r in replies) == sorted([str(b.id), str(c.id)])
    assert all(r.ok and r.data == b"HELLO" for r in replies)
    [v] = await version
    assert v.ok and json.loads(v.data) == VERSION and v.schema == "application/json"
    assert handled.count(b"forged") == 1   # only the valid forged-source request reached the service
    [err] = await client.call(b.id, "text.fail", b"x", ttl=300)
    assert (err.code, err.message) == (404, "no such thing")
    rejected = {e["trace_id"]: e["attrs"]["code"] for e in events_of(pb.log)
                if e["event"] == "rmb.peer.rejected"}
    assert rejected[bad_uid] == 104 and rejected[old_uid] == 102


async def test_unknown_twin_relay_error_and_expiry_reach_the_app(cluster):
    r1 = await cluster.start_relay()
    a = await cluster.new_twin([r1])
    b = await cluster.new_twin([r1])
    c = await cluster.new_twin([r1])    # registered, but its peer never runs
    pa = await cluster.start_peer(a, [r1])
    await cluster.start_peer(b, [r1])   # B's peer runs but no service serves "nobody.home"
    client = cluster.client(pa)
    # a relay error (source twin 0, unsigned) reaches the app as an err reply
    [offline] = await client.call(c.id, "x.y", b"", ttl=10, tags="fail-fast")
    assert offline.code == 500 and offline.message.startswith("relay: ") and offline.src == str(c.id)
    [unknown] = await client.call(999_999, "x.y", b"", ttl=5)
    assert unknown.code == 103 and unknown.src == "999999"
    started = time.monotonic()
    [late] = await client.call(b.id, "nobody.home", b"", ttl=2)
    assert late.code == 102 and late.src == str(b.id)
    assert 1.5 < time.monotonic() - started < 4.5


async def test_peer_publishes_twin_and_serves_status(cluster):
    r1 = await cluster.start_relay()
    a = await cluster.new_twin([], pk=False)
    pa = await cluster.start_peer(a, [r1], update=True, extra=["--status-listen", "127.0.0.1:0"])
    twin = await cluster.directory.get(a.id)
    assert twin.relays == [r1.domain] and twin.pk is not None
    import aiohttp
    port = pa.ready["status_port"]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/health") as resp:
            assert resp.status == 200 and (await resp.json())["relays"] == {r1.url: "up"}
        async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
            assert "rmb_peer_relays_connected 1.0" in await resp.text()


async def test_garbage_on_the_queues_never_stops_the_peer(cluster):
    """Bad input gets a precise error, is logged once, and other traffic flows."""
    import redis.asyncio as aioredis
    r1 = await cluster.start_relay()
    a = await cluster.new_twin([r1])
    b = await cluster.new_twin([r1])
    pa = await cluster.start_peer(a, [r1])
    pb = await cluster.start_peer(b, [r1])
    cluster.service(pb, "upper", {"text.upper": echo_upper})
    r = aioredis.Redis.from_url(pa.redis_url)
    garbage = [b"not json", b"\xff\xfe", b"[" * 100_000 + b"]" * 100_000, b"{}", b"null",
               json.dumps({"cmd": "x", "dst": [b.id], "ret": "app.bad", "ref": "r1", "dat": "%%%"}).encode(),
               json.dumps({"cmd": "x", "dst": "nope", "ret": "app.bad", "ref": "r2"}).encode()]
    for g in garbage:
        await r.lpush("msgbus.system.local", g)
        await r.lpush("msgbus.system.reply", g)
    client = cluster.client(pa)
    [reply] = await client.call(b.id, "text.upper", b"still alive", ttl=20)
    assert reply.ok and reply.data == b"STILL ALIVE"
    errs = [json.loads(x) for x in reversed(await r.lrange("app.bad", 0, -1))]
    assert [(e["ref"], e["err"]["code"]) for e in errs] == [("r1", 101), ("r2", 100)]
    rejected = [e for e in events_of(pa.log) if e["event"] == "rmb.peer.rejected"]
    assert len(rejected) >= 2 * len(garbage) - 2
    assert not any(e["attrs"]["code"] == 500 for e in rejected)   # no internal errors
    await r.aclose()


async def test_rmb_peer_cli_ready_serves_and_exits_0_on_sigterm(cluster):
    """The console script: READY line, real traffic, SIGTERM -> graceful exit 0."""
    r1 = await cluster.start_relay()
    a = await cluster.new_twin([r1])
    b = await cluster.new_twin([r1])
    pa = await cluster.start_peer(a, [r1], subprocess_mode=True, update=True, by_account=True)
    assert pa.ready["twin"] == a.id and pa.ready["relays"] == [r1.url]
    pb = await cluster.start_peer(b, [r1])
    cluster.service(pb, "upper", {"text.upper": echo_upper})
    client = cluster.client(pa)
    [reply] = await client.call(b.id, "text.upper", b"via the cli", ttl=20)
    assert reply.ok and reply.data == b"VIA THE CLI"
    proc = pa.proc
    await cluster.stop_peer(pa)
    assert proc.returncode == 0
