"""rmb-relay frees a WebSocket connection when it closes: an in-process relay on
127.0.0.1 (the session Redis, a real registry) and a client process that opens and closes
2,000 connections with the `websockets` library.

The census counts the relay process's per-connection objects (WebSocketResponse, aiohttp's
RequestHandler, the asyncio socket transport) in gc.get_objects() with the cyclic garbage
collector paused, so it counts what reference counting did not free: an object kept alive
by a reference cycle would otherwise wait for a generation-2 collection, tens of seconds
on a daemon's heap. The clients run in their own process so that only the relay's memory
is measured."""
from __future__ import annotations

import asyncio
import gc
import os
import sys
import weakref

import psutil
import pytest
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from rmb_peer.identity import Identity

from tests.relay_harness import Cluster

CONNECTIONS = 2000
BATCH = 50

_CLIENT = """
import asyncio, sys, time
from websockets.asyncio.client import connect
from rmb_peer.identity import Identity
from rmb_peer.token import make_token

port, twin, seed, total, batch, tag, how = sys.argv[1:8]
ident = Identity.from_seed(bytes.fromhex(seed), key_type="ed25519")

def url(sid):
    return f"ws://127.0.0.1:{port}/?" + make_token(ident, int(twin), sid, int(time.time()), 600)

async def main():
    for start in range(0, int(total), int(batch)):
        clients = await asyncio.gather(*[connect(url(f"{tag}{start + i}"))
                                         for i in range(int(batch))])
        if how == "close":                  # RFC 6455 closing handshake
            await asyncio.gather(*[c.close() for c in clients])
        else:                               # the TCP connection reset, no close frame
            for c in clients:
                c.transport.abort()
    print("DONE", flush=True)

asyncio.run(main())
"""


async def _clients(port: int, twin: int, seed: bytes, total: int, tag: str,
                   how: str = "close") -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CLIENT, str(port), str(twin), seed.hex(), str(total),
        str(BATCH), tag, how, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out, err = await proc.communicate()
    assert proc.returncode == 0 and out.startswith(b"DONE"), err.decode()[-2000:]


def _census(port: int) -> dict[str, int]:
    """Live or uncollected WebSocketResponse and RequestHandler objects, and socket
    transports of connections accepted on `port` (the relay's own Redis and HTTP client
    connections are not per-WebSocket objects)."""
    kinds = {web.WebSocketResponse: 0, RequestHandler: 0}
    transports = 0
    for obj in gc.get_objects():
        t = type(obj)           # type(), not isinstance(): dead weakproxies are listed too
        if t in kinds:
            kinds[t] += 1
        elif t is not weakref.ProxyType and isinstance(obj, asyncio.Transport):
            sockname = obj.get_extra_info("sockname")
            if isinstance(sockname, tuple) and sockname[1] == port:
                transports += 1
    return {k.__name__: v for k, v in kinds.items()} | {"transport": transports}


def _released(census: dict[str, int], before: dict[str, int] | None) -> bool:
    """True when no more per-connection objects are left than `before` (None: no WebSocket
    object or relay transport at all). RequestHandlers may fall below `before`: the
    in-process registry's keep-alive handlers end on their own."""
    if before is None:
        return census["WebSocketResponse"] == 0 and census["transport"] == 0
    return all(census[k] <= before[k] for k in before)


async def _settled(port: int, before: dict[str, int] | None) -> dict[str, int]:
    """The census once `_released`, polled every 0.1 s for at most 30 s with the cyclic GC
    still paused: an object in a reference cycle never leaves the census, one that a loaded
    event loop frees late does (bounded wait, not a timing assertion)."""
    census = _census(port)
    for _ in range(300):
        if _released(census, before):
            break
        await asyncio.sleep(0.1)
        census = _census(port)
    return census


@pytest.mark.parametrize("how,count", [("close", CONNECTIONS), ("abort", CONNECTIONS // 4)])
async def test_closed_connections_are_released_at_close(redis_url, how, count):
    seed = os.urandom(32)
    async with Cluster(redis_url) as cluster:
        relay = await cluster.relay()
        ident = Identity.from_seed(seed, key_type="ed25519")
        twin = (await cluster.directory.create(ident, [relay.domain], None)).id
        await _clients(relay.port, twin, seed, 4 * BATCH, "w")      # warm-up
        await asyncio.sleep(0.5)
        gc.collect()
        proc = psutil.Process()
        rss_start = proc.memory_info().rss
        connected_before = len(relay.test_events.of("rmb.relay.connected"))
        gone_before = len(relay.test_events.of("rmb.relay.disconnected"))
        gc.disable()
        try:
            before = await _settled(relay.port, None)     # the warm-up's are gone
            await _clients(relay.port, twin, seed, count, "s", how)
            # the count starts when the relay has seen every close (a loaded machine may
            # take longer than the clients to get there; bounded, not a timing assertion)
            for _ in range(600):
                if len(relay.test_events.of("rmb.relay.disconnected")) - gone_before >= count:
                    break
                await asyncio.sleep(0.1)
            after = await _settled(relay.port, before)
            rss_end = proc.memory_info().rss
        finally:
            gc.enable()
        connected = len(relay.test_events.of("rmb.relay.connected")) - connected_before
        assert connected == count and len(relay.table) == 0
        assert _released(after, before), (
            f"per-connection objects before {before}, 30 s after {count} closed: {after} "
            f"(kept alive by reference cycles: only the cyclic GC would free them)")
        assert rss_end <= rss_start * 1.10, \
            f"RSS {rss_start / 1e6:.1f} MB at start, {rss_end / 1e6:.1f} MB after"
