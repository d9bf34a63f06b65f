"""A twin's traffic survives its Redis being SIGKILLed and restarted on the same data dir
(Redis durability): rmb-peer processes, the app client and the service use
daemon_runtime.redis_server.reconnecting_redis and retry across the restart, so calls made
after the restart are answered and the peers are still the same processes. Real
redis-server (append-only file), in-process relay, rmb-peer subprocesses."""
from __future__ import annotations

import asyncio

from daemon_runtime.redis_server import EmbeddedRedis
from tests.rmb_harness import RmbCluster

TTL = 30


async def test_calls_are_answered_after_redis_sigkill_and_restart(tmp_path):
    srv = EmbeddedRedis(data_dir=tmp_path / "redis").start()
    try:
        async with RmbCluster(srv.url, tmp_path) as cluster:
            relay = await cluster.start_relay()
            a = await cluster.new_twin([relay], pk=False, key_type="ed25519")
            b = await cluster.new_twin([relay], pk=False, key_type="ed25519")
            pa = await cluster.start_peer(a, [relay], subprocess_mode=True)
            pb = await cluster.start_peer(b, [relay], subprocess_mode=True)

            async def echo(data: bytes) -> bytes:
                return data
            cluster.service(pb, "echo", {"restart.echo": echo})
            client = cluster.client(pa)
            for i in range(5):
                [reply] = await client.call(b.id, "restart.echo", f"before {i}".encode(), ttl=TTL)
                assert reply.data == f"before {i}".encode(), reply

            srv.kill()                               # no shutdown path: the AOF is all it has
            await asyncio.sleep(0.5)
            srv.start()

            async def one(i: int):
                # the first call may meet the restart window; the client retries its commands
                return await client.call(b.id, "restart.echo", f"after {i}".encode(), ttl=TTL)
            replies = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(10))), TTL + 30)
            got = sorted(r.data for [r] in replies)
            assert got == sorted(f"after {i}".encode() for i in range(10)), \
                [(r.data, r.code, r.message) for [r] in replies]
            assert pa.proc.poll() is None and pb.proc.poll() is None   # the peers rode it out
    finally:
        srv.stop()
