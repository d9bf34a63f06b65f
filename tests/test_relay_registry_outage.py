"""The relay survives its registry (relay side): while the registry
hangs, a lookup delays only envelopes for that twin (no head-of-line blocking on the
sender's connection) and known twins are served from their last record at once; while it
is down past the TTL, known twins keep working (stale records, bounded, logged).
Real relay, registry and sockets; a small HTTP proxy in front of the registry hangs or
fails on demand."""
from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web
from websockets.asyncio.client import connect

from tests.relay_harness import Cluster, envelope, recv_env, roundtrip, url


class RegistryProxy:
    """Forwards GET to the real registry; mode "ok" | "hang" | "fail" (503)."""

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.mode = "ok"
        self.requests = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self.mode == "hang":
            await self.release.wait()
        if self.mode == "fail":
            return web.json_response({"error": "registry storage unavailable"}, status=503)
        async with aiohttp.ClientSession() as http:
            async with http.get(self.upstream + request.rel_url.path_qs) as resp:
                return web.Response(status=resp.status, body=await resp.read(),
                                    content_type="application/json")

    async def __aenter__(self):
        self.release = asyncio.Event()
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        self.release.set()
        self.mode = "fail"
        await self.runner.shutdown()
        await self.runner.cleanup()


@pytest.fixture
async def cluster(redis_url):
    async with Cluster(redis_url) as c:
        yield c


async def _xlen_reaches(relay, session, n, within):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await relay.redis.xlen(relay.queues.key(session)) >= n:
            return True
        await asyncio.sleep(0.02)
    return False


async def test_hung_registry_delays_only_that_twin(cluster):
    async with RegistryProxy(cluster.registry_url) as proxy:
        relay = await cluster.relay(registry_url=proxy.url)
        ia, a = await cluster.twin([relay.domain])
        ib, b = await cluster.twin([relay.domain])        # offline: needs its record
        ic, c = await cluster.twin([relay.domain])
        iy, y = await cluster.twin([relay.domain])        # never looked up before the hang
        async with connect(url(relay, ia, a)) as wa, connect(url(relay, ic, c)) as wc:
            await wa.send(envelope((a,), (b,)).SerializeToString())
            assert await _xlen_reaches(relay, (b, None), 1, 5)
            await asyncio.sleep(0.6)                      # b's record is past its TTL now
            proxy.mode = "hang"
            to_y = envelope((a,), (y,))
            await wa.send(to_y.SerializeToString())       # its lookup hangs (5 s timeout)
            started = time.monotonic()
            await wa.send(envelope((a,), (b,)).SerializeToString())
            assert await _xlen_reaches(relay, (b, None), 2, 2.0), \
                "an envelope for a known twin waited behind another twin's lookup"
            await roundtrip(wa, a, wc, c)
            assert time.monotonic() - started < 2.0
            err = await recv_env(wa, timeout=15)          # y: no record, registry hung
            assert err.uid == to_y.uid and "failed to get twin details" in err.error.message
        assert relay.core.refreshes >= 1             # b was served stale and refreshed


async def test_registry_down_past_ttl_known_twins_keep_working(cluster):
    async with RegistryProxy(cluster.registry_url) as proxy:
        relay = await cluster.relay(registry_url=proxy.url)
        ia, a = await cluster.twin([relay.domain])
        ib, b = await cluster.twin([relay.domain])
        async with connect(url(relay, ia, a)) as wa:
            await wa.send(envelope((a,), (b,)).SerializeToString())
            assert await _xlen_reaches(relay, (b, None), 1, 5)
        proxy.mode = "fail"
        await asyncio.sleep(1.5)                          # 3 x the 0.5 s TTL
        # a new connection for a known twin authenticates, traffic to known twins routes
        async with connect(url(relay, ia, a)) as wa:
            for i in range(3):
                await wa.send(envelope((a,), (b,)).SerializeToString())
                await asyncio.sleep(0.6)
            assert await _xlen_reaches(relay, (b, None), 4, 5)
            async with connect(url(relay, ib, b)) as wb:
                got = [await recv_env(wb) for _ in range(4)]
                assert len(got) == 4
        stale = relay.test_events.of("rmb.relay.twin_stale")
        assert stale and stale[0]["attrs"]["twin"] in (a, b)
        assert stale[0]["attrs"]["stale_s"] > 0.5
