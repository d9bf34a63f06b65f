"""rmb-relay with a Redis that hangs (SIGSTOP: connected, never answering). Before, an
envelope for an offline twin waited for its XADD without bound, and with it every later
frame of the same sender's connection (its calls to online twins expired too) while the
relay logged nothing. Now each offline-queue command waits at most --redis-timeout: the
sender gets an error reply, Redis is reported down (/health, rmb.relay.queue_error, metric
rmb_relay_queue_failed), further offline envelopes fail at once, other traffic flows, and a
probe logs rmb.relay.redis_recovered once Redis answers. Real redis-server processes, an
in-process relay and peers."""
from __future__ import annotations

import asyncio
import os
import signal

import pytest

from daemon_runtime.redis_server import EmbeddedRedis
from tests.rmb_harness import RmbCluster, events_of, until


async def relay_on(cluster: RmbCluster, store: EmbeddedRedis, twins: int):
    """An in-process relay on `store` (--redis-timeout 1 s) and `twins` fresh ed25519 twins
    homed on it: (relay handle, [twin, ...])."""
    relay = await cluster.start_relay(redis_url=store.url, redis_timeout=1.0)
    return relay, [await cluster.new_twin([relay], pk=False, key_type="ed25519") for _ in range(twins)]


async def test_hung_relay_redis_refuses_offline_envelopes_and_keeps_other_traffic(redis_url, tmp_path):
    hung = EmbeddedRedis().start()          # the relay's Redis; registry and peers stay on redis_url
    try:
        async with RmbCluster(redis_url, tmp_path) as cluster:
            relay, (a, b, c) = await relay_on(cluster, hung, 3)     # c is never online
            server = relay.server
            pa = await cluster.start_peer(a, [relay])
            pb = await cluster.start_peer(b, [relay])

            async def echo(data: bytes) -> bytes:
                return data
            cluster.service(pb, "echo", {"hang.echo": echo})
            client = cluster.client(pa)
            [warm] = await client.call(c.id, "hang.echo", b"known", ttl=1)   # c looked up, queued
            assert warm.code == 102, warm                                       # and expired
            assert server.health()["ok"]

            os.kill(hung.proc.pid, signal.SIGSTOP)
            off = asyncio.ensure_future(client.call(c.id, "hang.echo", b"offline", ttl=30))
            await asyncio.sleep(0.1)
            [to_b] = await asyncio.wait_for(client.call(b.id, "hang.echo", b"online", ttl=30), 20)
            assert to_b.data == b"online" and not to_b.code, (to_b.code, to_b.message)
            [r] = await asyncio.wait_for(off, 20)
            assert r.code and "failed to queue" in r.message, (r.code, r.message)
            health = server.health()
            assert not health["ok"] and not health["redis"]["answering"], health
            [r2] = await asyncio.wait_for(client.call(c.id, "hang.echo", b"offline2", ttl=30), 5)
            assert r2.code and "failed to queue" in r2.message     # at once: Redis is down
            metrics = server.metrics.registry
            assert metrics.get_sample_value("rmb_relay_queue_failed_total", {"reason": "timeout"}) == 2
            events = events_of(relay.log)
            errors = [e for e in events if e["event"] == "rmb.relay.queue_error"]
            assert errors and "did not answer within 1 s" in errors[0]["attrs"]["reason"], errors

            os.kill(hung.proc.pid, signal.SIGCONT)
            await until(lambda: server.health()["ok"], 15, "Redis answering again")
            recovered = [e for e in events_of(relay.log) if e["event"] == "rmb.relay.redis_recovered"]
            assert len(recovered) == 1 and recovered[0]["attrs"]["down_s"] > 0, recovered
            [r3] = await client.call(c.id, "hang.echo", b"queued again", ttl=1)
            assert r3.code == 102, (r3.code, r3.message)     # queued (then expired), not refused
            assert metrics.get_sample_value("rmb_relay_queue_failed_total", {"reason": "timeout"}) == 2
    finally:
        if hung.proc is not None:
            os.kill(hung.proc.pid, signal.SIGCONT)
        hung.stop()


@pytest.mark.parametrize("failure", ["hung", "killed"])
async def test_replay_stopped_by_redis_failure_resumes_on_the_same_connection(redis_url, tmp_path, failure):
    """A twin connects while the relay's Redis is hung (SIGSTOP) or down (SIGKILL): its
    offline replay stops, the session goes live (a live call to it is answered meanwhile),
    and once Redis answers again the envelopes still queued for it are delivered on the
    same connection. Before, they waited in the stream until the twin reconnected."""
    store = EmbeddedRedis().start()
    try:
        async with RmbCluster(redis_url, tmp_path) as cluster:
            relay, (a, b) = await relay_on(cluster, store, 2)
            server = relay.server
            pa = await cluster.start_peer(a, [relay])
            client = cluster.client(pa)
            queued = asyncio.ensure_future(client.call(b.id, "late.echo", b"queued", ttl=60))
            await until(lambda: any(e["event"] == "rmb.relay.queued" for e in events_of(relay.log)),
                        10, "the call to offline b queued")
            await asyncio.sleep(1.2)                 # past the AOF's everysec fsync
            if failure == "hung":
                os.kill(store.proc.pid, signal.SIGSTOP)
            else:
                store.kill()
            pb = await cluster.start_peer(b, [relay])

            async def echo(data: bytes) -> bytes:
                return data
            cluster.service(pb, "late", {"late.echo": echo})
            await until(lambda: any(e["event"] == "rmb.relay.queue_error"
                                    and "replay stopped" in e["attrs"]["reason"]
                                    for e in events_of(relay.log)), 15, "replay stopped")
            [live] = await asyncio.wait_for(client.call(b.id, "late.echo", b"live", ttl=30), 20)
            assert live.data == b"live" and not live.code, (live.code, live.message)
            assert not queued.done()                 # still in b's offline stream

            if failure == "hung":
                os.kill(store.proc.pid, signal.SIGCONT)
            else:
                store.start()
            [r] = await asyncio.wait_for(queued, 20)
            assert r.data == b"queued" and not r.code, (r.code, r.message)
            delivered = [e for e in events_of(relay.log) if e["event"] == "rmb.relay.delivered"
                         and "queued_ms" in e["attrs"]]
            assert len(delivered) == 1 and delivered[0]["attrs"]["queued_ms"] > 1000, delivered
            assert server.core.stalled() == 0
            streams = [k for k in await server.redis.keys("rmb.relay.*.queue.*")
                       if not k.endswith(b":src")]
            assert streams and [await server.redis.xlen(k) for k in streams] == [0] * len(streams)
    finally:
        if store.proc is not None and failure == "hung":
            os.kill(store.proc.pid, signal.SIGCONT)
        store.stop()
