"""A Redis that hangs (SIGSTOP: the connection stays open, nothing answers) under rmb-peer
(before: rmb-peer's writer waited without bound and nothing reported it).
The writer keeps every operation (no dropping timeout), says how long its write has waited
and how much is pending, and bounds what it holds by pausing the producers; the peer logs
the stall once (rmb.peer.redis_stalled) and its end (rmb.peer.redis_recovered), /health is
not ok meanwhile, and every call made during the stall is answered after SIGCONT. Real
redis-server processes, an in-process relay, the peers in-process."""
from __future__ import annotations

import asyncio
import os
import signal

import redis.asyncio as aioredis

from daemon_runtime.redis_server import EmbeddedRedis
from rmb_peer.redisq import RedisWriter
from tests.rmb_harness import RmbCluster, events_of, until

TTL = 60


async def test_writer_holds_everything_while_redis_hangs_and_reports_what_is_pending():
    srv = EmbeddedRedis().start()
    errors = []
    r = aioredis.Redis.from_url(srv.url)
    writer = RedisWriter(r, max_pending=3, on_error=lambda exc, n: errors.append((exc, n)))
    writer.start()
    loop = asyncio.get_running_loop()
    try:
        writer.push("q", b"before")
        await writer.flush()
        assert writer.pending == 0 and writer.write_wait(loop.time()) == 0.0 and not writer.full
        os.kill(srv.proc.pid, signal.SIGSTOP)
        for i in range(5):
            writer.push("q", f"v{i}".encode())
        assert writer.full and writer.pending == 5
        room = asyncio.ensure_future(writer.room())
        await asyncio.sleep(0.5)
        assert not room.done()                      # producers wait
        assert writer.pending == 5 and writer.write_wait(loop.time()) >= 0.4
        os.kill(srv.proc.pid, signal.SIGCONT)
        await asyncio.wait_for(room, 10)
        await asyncio.wait_for(writer.flush(), 10)
        assert not writer.full and writer.pending == 0
        assert [x.decode() for x in reversed(await r.lrange("q", 0, -1))] == \
            ["before"] + [f"v{i}" for i in range(5)]
        assert errors == []                         # nothing was dropped

        os.kill(srv.proc.pid, signal.SIGSTOP)       # hung at shutdown: reported, not silent
        writer.push("q", b"late1")
        writer.push("q", b"late2")
        await writer.close(timeout=0.5)
        assert len(errors) == 1 and errors[0][1] == 2 and isinstance(errors[0][0], TimeoutError)
    finally:
        if srv.proc is not None:
            os.kill(srv.proc.pid, signal.SIGCONT)
        await r.aclose()
        srv.stop()


async def test_peer_reports_a_hung_redis_pauses_and_answers_every_call_after(redis_url, tmp_path):
    hung = EmbeddedRedis().start()        # the callee's Redis; the registry stays on redis_url
    try:
        async with RmbCluster(redis_url, tmp_path) as cluster:
            relay = await cluster.start_relay()
            a = await cluster.new_twin([relay], pk=False, key_type="ed25519")
            b = await cluster.new_twin([relay], pk=False, key_type="ed25519")
            pa = await cluster.start_peer(a, [relay])
            pb = await cluster.start_peer(b, [relay], redis_url=hung.url, extra=[
                "--redis-stall-after", "1", "--redis-max-pending", "4"])

            async def echo(data: bytes) -> bytes:
                return data
            cluster.service(pb, "echo", {"stall.echo": echo})
            client = cluster.client(pa)
            [reply] = await client.call(b.id, "stall.echo", b"warm", ttl=TTL)
            assert reply.data == b"warm"
            daemon = pb.daemon
            assert daemon.health()["ok"] and daemon.health()["redis"]["pending_ops"] == 0

            os.kill(hung.proc.pid, signal.SIGSTOP)
            calls = [asyncio.ensure_future(client.call(b.id, "stall.echo", f"c{i}".encode(), ttl=TTL))
                     for i in range(20)]
            await until(lambda: daemon.health()["redis"]["reads_paused"], 20,
                         "the peer paused reading for its hung Redis")
            await until(lambda: any(e["event"] == "rmb.peer.redis_stalled" for e in events_of(pb.log)),
                         20, "rmb.peer.redis_stalled logged")
            health = daemon.health()
            assert not health["ok"] and health["redis"]["stalled"], health
            assert health["redis"]["pending_ops"] >= 4 and health["redis"]["write_wait_s"] >= 1
            assert daemon.metrics.get_sample_value("rmb_peer_reads_paused") == 1
            assert daemon.metrics.get_sample_value("rmb_peer_redis_pending_ops") >= 4
            assert not any(c.done() for c in calls)

            os.kill(hung.proc.pid, signal.SIGCONT)
            replies = await asyncio.wait_for(asyncio.gather(*calls), TTL + 10)
            assert sorted(r.data for [r] in replies) == sorted(f"c{i}".encode() for i in range(20)), \
                [(r.data, r.code, r.message) for [r] in replies]
            await until(lambda: any(e["event"] == "rmb.peer.redis_recovered" for e in events_of(pb.log)),
                         10, "rmb.peer.redis_recovered logged")
            events = events_of(pb.log)
            stalled = [e for e in events if e["event"] == "rmb.peer.redis_stalled"]
            assert len(stalled) == 1 and stalled[0]["attrs"]["paused"] is True, stalled  # logged once
            assert not any(e["event"] == "rmb.peer.rejected" and e["attrs"].get("src") == "redis"
                           for e in events)                                 # nothing dropped
            health = daemon.health()
            assert health["ok"] and not health["redis"]["reads_paused"], health
    finally:
        if hung.proc is not None:
            os.kill(hung.proc.pid, signal.SIGCONT)
        hung.stop()
