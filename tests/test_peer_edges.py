"""rmb-peer at its edges (issue 11, finding 6), with a real relay and real Redis: local
service replies that cannot become valid envelopes are refused by the peer (the relay
used to close the peer's connection, losing the frames in flight), and the batch a
peer's writer is sending when its connection drops is re-routed, not lost."""
from __future__ import annotations

import asyncio
import base64
import json
import time

import pytest
import redis.asyncio as aioredis

from rmb_peer.core import REPLY_QUEUE, SendFrame
from tests.rmb_harness import RmbCluster


@pytest.fixture
async def cluster(redis_url, tmp_path):
    async with RmbCluster(redis_url, tmp_path) as c:
        yield c


def events_of(sink) -> list[dict]:
    return [json.loads(x) for x in sink.getvalue().splitlines()]


async def echo(data: bytes) -> bytes:
    return data


async def _raw_request(r: aioredis.Redis, cmd: str, timeout: float = 20.0) -> dict:
    got = await r.brpop(["msgbus." + cmd], timeout=timeout)
    assert got is not None, "the request never reached the service queue"
    return json.loads(got[1])


async def test_unsendable_service_replies_are_refused_and_the_connection_survives(cluster):
    relay = await cluster.start_relay()
    a = await cluster.new_twin([relay])
    b = await cluster.new_twin([relay])
    pa = await cluster.start_peer(a, [relay])
    pb = await cluster.start_peer(b, [relay])
    client = cluster.client(pa)
    svc = aioredis.Redis.from_url(pb.redis_url)     # a raw service on B's Redis
    try:
        first = asyncio.ensure_future(client.call(b.id, "raw.cmd", b"one", ttl=8))
        req = await _raw_request(svc, "raw.cmd")
        # 1. a ref of 300 chars: no envelope uid; refused and logged, nothing sent
        await svc.lpush(REPLY_QUEUE, json.dumps({"ver": 1, "ref": "r" * 300, "dat": "",
                                                  "dst": req["src"], "now": int(time.time())}))
        # 2. a 1.2 MB reply to the real ref: the requester gets 101, the relay never sees it
        big = base64.b64encode(b"x" * 1_200_000).decode()
        await svc.lpush(REPLY_QUEUE, json.dumps({"ver": 1, "ref": req["ref"], "dat": big,
                                                  "dst": req["src"], "now": int(time.time())}))
        [r] = await asyncio.wait_for(first, 30)
        assert r.code == 101 and "reply too large" in r.message, r
        # the connection of B was never closed by the relay, and traffic goes on
        second = asyncio.ensure_future(client.call(b.id, "raw.cmd", b"two", ttl=20))
        req2 = await _raw_request(svc, "raw.cmd")
        await svc.lpush(REPLY_QUEUE, json.dumps({"ver": 1, "ref": req2["ref"],
                                                  "dat": base64.b64encode(b"ok").decode(),
                                                  "dst": req2["src"], "now": int(time.time())}))
        [r2] = await asyncio.wait_for(second, 30)
        assert r2.ok and r2.data == b"ok"
        logged = events_of(pb.log)
        assert not [e for e in logged if e["event"] == "rmb.peer.disconnected"]
        reasons = [e["attrs"]["reason"] for e in logged if e["event"] == "rmb.peer.rejected"]
        assert any("300 chars" in x for x in reasons) and any("reply too large" in x for x in reasons)
        assert all(len(f) <= 1024 * 1024 for f in relay.seen)
    finally:
        await svc.aclose()


async def test_rmbservice_turns_an_oversized_reply_into_error_101(cluster):
    relay = await cluster.start_relay()
    a = await cluster.new_twin([relay])
    b = await cluster.new_twin([relay])
    pa = await cluster.start_peer(a, [relay])
    pb = await cluster.start_peer(b, [relay])

    async def huge(data: bytes) -> bytes:
        return b"h" * 2_000_000
    svc = cluster.service(pb, "huge", {"huge": huge, "echo": echo})
    client = cluster.client(pa)
    [r] = await client.call(b.id, "huge", b"", ttl=20)
    assert r.code == 101 and "reply too large" in r.message and svc.refused == 1
    [r] = await client.call(b.id, "echo", b"still fine", ttl=20)
    assert r.ok and r.data == b"still fine"


class _StuckSocket:
    """A websocket whose send() never completes (a connection dying under the writer)."""

    class _Transport:
        def get_extra_info(self, name, default=None):
            return default

    def __init__(self):
        self.sent: list[bytes] = []
        self.transport = self._Transport()

    async def send(self, data: bytes) -> None:
        self.sent.append(data)
        await asyncio.Event().wait()


async def test_the_writers_batch_is_rerouted_when_its_connection_drops(cluster):
    """The reader notices the close and cancels the writer mid-batch: every frame of the
    batch not yet written goes out through the other relay (it used to be dropped with
    the writer task's local list)."""
    r1 = await cluster.start_relay()
    r2 = await cluster.start_relay()
    a = await cluster.new_twin([r1, r2])
    b = await cluster.new_twin([r1, r2])
    pa = await cluster.start_peer(a, [r1, r2])
    daemon = pa.daemon
    core = daemon.core
    for _ in range(200):
        if len(core.live_relays()) == 2:
            break
        await asyncio.sleep(0.05)
    assert core.live_relays() == [r1.url, r2.url]
    from rmb_peer.daemon import _Conn
    real = daemon._conns[r1.url]
    stuck = _Conn(_StuckSocket(), real.attempt)     # swap r1's socket for a stuck one
    real.writer.cancel()
    daemon._conns[r1.url] = stuck
    stuck.writer = daemon._spawn(daemon._writer(r1.url, stuck))
    from rmb_peer.envelope import Envelope, new_uid

    def frame(i):
        env = Envelope(uid=new_uid(), timestamp=int(time.time()), expiration=60)
        env.destination.twin = b.id
        env.request.command = "x.y"
        env.plain = b"frame-%d" % i
        return SendFrame(r1.url, real.attempt, env.SerializeToString(), env.uid, "request", b.id)
    frames = [frame(i) for i in range(5)]
    for ev in frames:
        daemon._send(ev)
    await asyncio.sleep(0.1)
    assert stuck.ws.sent == [frames[0].data] and len(stuck.sending) == 5
    resent = []
    original = core.resend
    core.resend = lambda ev, now: (resent.append(ev), original(ev, now))[1]
    # what the reader's finally does when the connection closes
    stuck.writer.cancel()
    daemon._requeue(r1.url, stuck, "closed: test")
    core.resend = original
    assert [ev.data for ev in resent] == [f.data for f in frames]   # none lost
    assert r1.url not in core.live_relays()
