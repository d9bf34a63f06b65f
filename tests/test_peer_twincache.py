"""rmb-peer and the twin registry, with real processes: the core owns
the twin table; a registry killed keeps peers that already talk working (stale-if-error,
bounded and logged); a peer restarts from its --data-dir while the registry is down; a
hung registry (a socket that accepts and never answers) delays only the messages that need
the twin being looked up."""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from rmb_peer.twins import TwinDirectory
from tests.rmb_harness import RmbCluster
from tests.test_rmb_twins import start_registry, stop


@pytest.fixture
async def cluster(redis_url, tmp_path):
    async with RmbCluster(redis_url, tmp_path) as c:
        yield c


def events_of(sink) -> list[dict]:
    text = sink.getvalue() if hasattr(sink, "getvalue") else open(sink).read()
    return [json.loads(x) for x in text.splitlines()]


async def _use_registry(cluster: RmbCluster, url: str) -> None:
    """Point the harness (twin creation, relays started later) at another registry."""
    await cluster.directory.close()
    cluster.registry_url = url
    cluster.directory = TwinDirectory(url, cache_ttl=0.0)


async def echo(data: bytes) -> bytes:
    return data


async def test_registry_killed_peers_keep_talking_and_restart_from_data_dir(cluster, tmp_path):
    proc, port = start_registry(cluster.redis_url)
    try:
        await _use_registry(cluster, f"http://127.0.0.1:{port}")
        relay = await cluster.start_relay()
        a = await cluster.new_twin([relay])
        b = await cluster.new_twin([relay])
        ttl = ["--twin-cache-ttl", "1"]
        pa = await cluster.start_peer(a, [relay], extra=ttl + ["--data-dir", str(tmp_path / "a")])
        pb = await cluster.start_peer(b, [relay], extra=ttl + ["--data-dir", str(tmp_path / "b")])
        cluster.service(pb, "echo", {"echo": echo})
        client = cluster.client(pa)
        [r] = await client.call(b.id, "echo", b"before", ttl=20)
        assert r.ok and r.data == b"before"

        stop(proc)                                   # the registry dies
        await asyncio.sleep(2.5)                     # every twin record is past its TTL
        for i in range(20):
            [r] = await client.call(b.id, "echo", b"during %d" % i, ttl=20)
            assert r.ok and r.data == b"during %d" % i, r
        stale = [e for e in events_of(pa.log) if e["event"] == "rmb.peer.twin_stale"]
        assert stale and stale[0]["attrs"]["twin"] == b.id
        # a twin nobody knows yet fails at once with a precise error, the others flow
        [r] = await client.call(4_000_000, "echo", b"x", ttl=20)
        assert r.code == 500 and "lookup failed" in r.message

        # peer A restarts while the registry is still down: it starts from its data dir
        await cluster.stop_peer(pa)
        pa2 = await cluster.start_peer(a, [relay], db=int(pa.redis_url.rsplit("/", 1)[1]),
                                       extra=ttl + ["--data-dir", str(tmp_path / "a")],
                                       log_name="peer-a-restarted")
        assert any(e["event"] == "rmb.peer.started_offline" for e in events_of(pa2.log))
        [r] = await client.call(b.id, "echo", b"after restart", ttl=20)
        assert r.ok and r.data == b"after restart", r

        proc, _ = start_registry(cluster.redis_url, port)   # back on the same port
        deadline = time.monotonic() + 20
        while not any(e["event"] == "rmb.peer.twin_recovered" for e in events_of(pa2.log)):
            assert time.monotonic() < deadline, "peer never saw the registry again"
            [r] = await client.call(b.id, "echo", b"poll", ttl=20)
            assert r.ok
            await asyncio.sleep(0.5)
    finally:
        stop(proc)


async def test_hung_registry_delays_only_messages_for_the_new_twin(cluster, monkeypatch):
    relay = await cluster.start_relay()
    a = await cluster.new_twin([relay])
    b = await cluster.new_twin([relay])
    c = await cluster.new_twin([relay])
    pa = await cluster.start_peer(a, [relay])
    pb = await cluster.start_peer(b, [relay], extra=["--twin-cache-ttl", "60"])
    pc = await cluster.start_peer(c, [relay])
    cluster.service(pb, "echo-b", {"echo": echo})
    cluster.service(pc, "echo-c", {"echo": echo})
    client = cluster.client(pa)
    [r] = await client.call(b.id, "echo", b"warm", ttl=20)
    assert r.ok
    # a registry that accepts connections and never answers
    hung_conns = []

    async def hang(reader, writer):
        hung_conns.append(writer)
        await asyncio.sleep(3600)
    server = await asyncio.start_server(hang, "127.0.0.1", 0)
    hung_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    pa.daemon.args.twin_cache_ttl = 60
    pa.daemon.core.twin_ttl = 60.0
    pa.daemon.directory.base_url = hung_url         # peer A's registry hangs from now on
    # no timeout may end the hang while B's traffic is measured (a loaded CI machine can
    # be slow): the hang ends when the test drops the registry's connections
    pa.daemon.directory._timeout = aiohttp.ClientTimeout(total=300)
    import rmb_peer.core
    monkeypatch.setattr(rmb_peer.core, "LOOKUP_TIMEOUT", 300.0)
    try:
        to_c = asyncio.ensure_future(client.call(c.id, "echo", b"to c", ttl=30))
        await asyncio.sleep(0.2)
        assert pa.daemon.core.parked_count == 1       # waits for C's lookup...
        started = time.monotonic()
        for i in range(30):                           # ...while B traffic flows
            [r] = await client.call(b.id, "echo", b"b%d" % i, ttl=20)
            assert r.ok and r.data == b"b%d" % i
        assert not to_c.done()                        # C's message still waits
        assert hung_conns                             # the lookup really hangs
        server.close()                                # the registry goes away: no new
        for w in hung_conns:                          # connections, the hung ones dropped
            w.transport.abort()
        [r] = await asyncio.wait_for(to_c, 60)        # the lookup fails: a precise error
        assert r.code == 500 and "lookup failed" in r.message, r
    finally:
        server.close()
        for w in hung_conns:
            w.close()
