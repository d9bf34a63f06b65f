"""rmb-peer's graceful close loses no request: the frames a relay writes to a peer that is
shutting down (its Close already on the way, not yet read by the relay) are still handed
on by the closing peer (a request to its service's Redis queue, answered through the same
Redis by the restarted peer), not dropped with the process. Real rmb-relay and rmb-peer
subprocesses, a raw WebSocket client, a real Redis; the peer's writes to the relay are
held back 0.8 s by the test-only link model (daemon_runtime.linkmodel), so its Close
reaches the relay after the requests sent 0.2 s after its SIGTERM were written to it."""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import redis.asyncio as aioredis

from daemon_runtime.linkmodel import ENV
from tests.rmb_harness import RmbCluster, _spawn_ready, events_of, redis_db


async def test_requests_written_to_a_closing_peer_reach_its_service_queue(redis_url, tmp_path):
    from websockets.asyncio.client import connect

    from rmb_peer.token import make_token
    from tests.relay_harness import IDENTITIES, envelope

    count = 10
    async with RmbCluster(redis_url, tmp_path) as cluster:
        relay = await cluster.start_relay(subprocess_mode=True)
        a = await cluster.new_twin([relay], pk=False, key_type="ed25519")
        b = await cluster.new_twin([relay], pk=False, key_type="ed25519")
        IDENTITIES[a.id] = a.identity
        db_url = redis_db(cluster.redis_url, 9)
        log = tmp_path / "peer-b.jsonl"
        argv = [sys.executable, "-m", "rmb_peer.daemon",
                *cluster.peer_args(b, [relay], db_url), "--event-loop", "asyncio",
                "--log", str(log)]
        env = dict(os.environ, **{ENV: "127.0.0.1 delay_ms=800"})
        proc, _ = await _spawn_ready(argv, env=env)
        loop = asyncio.get_running_loop()
        r = aioredis.from_url(db_url)
        try:
            await r.delete("msgbus.test.echo")
            tok = make_token(a.identity, a.id, None, int(time.time()), 300)
            async with connect(f"ws://{relay.domain}/?{tok}") as wa:
                await asyncio.sleep(1.0)             # b's session is registered at the relay
                proc.send_signal(signal.SIGTERM)     # b sends its Close, held back 0.8 s
                await asyncio.sleep(0.2)
                sent = []
                for i in range(count):
                    env_ = envelope((a.id,), (b.id,), payload=f"req {i}".encode(), ttl=120)
                    sent.append(env_.uid)
                    await wa.send(env_.SerializeToString())
                assert await loop.run_in_executor(None, proc.wait, 30) == 0
            queued = await r.lrange("msgbus.test.echo", 0, -1)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
            await r.aclose()
        delivered = [e["trace_id"] for e in events_of(log) if e["event"] == "rmb.peer.delivered"]
        assert sorted(delivered) == sorted(sent), f"{len(delivered)} of {count} handed on"
        assert len(queued) == count
