"""rmb-relay hot path under a burst: every envelope is delivered in order, the trace events
(one `forwarded` at info on this live local route) are logged for each, and the destination socket is never left
corked (rmb_relay.daemon write coalescing with TCP_CORK)."""
from __future__ import annotations

import asyncio
import socket

import pytest
from websockets.asyncio.client import connect

from tests.relay_harness import Cluster, envelope, recv_env, url


@pytest.fixture
async def cluster(redis_url):
    async with Cluster(redis_url) as c:
        yield c


async def test_burst_delivered_in_order_logged_and_uncorked(cluster):
    relay = await cluster.relay()
    ia, a = await cluster.twin([relay.domain])
    ib, b = await cluster.twin([relay.domain])
    async with connect(url(relay, ia, a), compression=None) as wa, \
            connect(url(relay, ib, b), compression=None) as wb:
        envs = [envelope((a,), (b,), payload=bytes([i % 256]) * 64) for i in range(300)]
        await asyncio.sleep(0.1)   # both connected, offline replay finished
        # one write: the relay reads many frames per chunk and writes them as one burst
        for env in envs:
            await wa.send(env.SerializeToString())
        got = [await recv_env(wb) for _ in envs]
        assert [g.uid for g in got] == [e.uid for e in envs]
        await asyncio.sleep(0.05)  # the relay's loop turned: the burst is over
        target = relay.table.get((b, None))
        if target.sock is not None and hasattr(socket, "TCP_CORK"):
            assert target.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 0
            assert target.burst is None
        # one more single envelope still arrives (nothing is held back)
        single = envelope((a,), (b,))
        await wa.send(single.SerializeToString())
        assert (await recv_env(wb, timeout=2)).uid == single.uid
    uids = {e.uid for e in envs}
    # the live local route logs ONE event per envelope, `forwarded`, at info
    events = [e for e in relay.test_events.of("rmb.relay.forwarded") if e["trace_id"] in uids]
    assert len(events) == len(envs) and {e["level"] for e in events} == {"info"}
    for name in ("rmb.relay.received", "rmb.relay.delivered"):
        assert not [e for e in relay.test_events.of(name) if e["trace_id"] in uids]
    forwarded = {e["trace_id"]: e["attrs"] for e in events}
    assert forwarded[envs[0].uid] == {"kind": "request", "src": str(a), "dst": str(b),
                                      "size": envs[0].ByteSize()}
