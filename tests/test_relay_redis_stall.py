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

from daemon_runtime.redis_server import EmbeddedRedis
from tests.rmb_harness import RmbCluster, events_of, until


async def test_hung_relay_redis_refuses_offline_envelopes_and_keeps_other_traffic(redis_url, tmp_path):
    hung = EmbeddedRedis().start()          # the relay's Redis; registry and peers stay on redis_url
    try:
        async with RmbCluster(redis_url, tmp_path) as cluster:
            relay = await cluster.start_relay(redis_url=hung.url, redis_timeout=1.0)
            server = relay.server
            a = await cluster.new_twin([relay], pk=False, key_type="ed25519")
            b = await cluster.new_twin([relay], pk=False, key_type="ed25519")
            c = await cluster.new_twin([relay], pk=False, key_type="ed25519")   # never online
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
