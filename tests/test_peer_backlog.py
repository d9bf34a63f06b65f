"""rmb-peer daemon and the Redis backlog (DESIGN.md section 3: `SET msgbus.backlog.<uid> EX
ttl` per app request): while requests are in flight their records are in Redis with the
request's fields and TTL, for a single request and for a burst handled as one batch; once a
request is finished (its replies pushed to the app) its record is deleted, not left to
expire."""
from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

pytest.importorskip("rmb_relay.daemon", reason="rmb_relay.daemon (the relay) has not landed yet")

from rmb_peer.core import BACKLOG_PREFIX  # noqa: E402
from rmb_peer.envelope import Backlog  # noqa: E402
from tests.rmb_harness import RmbCluster  # noqa: E402


async def test_backlog_records_while_in_flight_deleted_when_finished(redis_url, tmp_path):
    gate = asyncio.Event()
    arrived = 0

    async def held_echo(data: bytes) -> bytes:
        nonlocal arrived
        arrived += 1
        await gate.wait()          # hold every request until the test has seen the records
        return data

    async with RmbCluster(redis_url, tmp_path) as c:
        _relay, a, b, pa, _pb = await c.pair("held", {"bk.echo": held_echo})
        client = c.client(pa)
        r = aioredis.Redis.from_url(pa.redis_url)
        try:
            one = asyncio.create_task(client.call(b.id, "bk.echo", b"x", ttl=40))
            burst = [asyncio.create_task(client.call(b.id, "bk.echo", b"%d" % i, ttl=50))
                     for i in range(40)]
            for _ in range(500):                       # bounded: at most 10 s
                if arrived == 41:
                    break
                await asyncio.sleep(0.02)
            assert arrived == 41
            keys = [k async for k in r.scan_iter(BACKLOG_PREFIX + "*")]
            assert len(keys) == 41
            ttls = sorted([await r.ttl(k) for k in keys])
            assert 0 < ttls[0] <= 40 and 40 < ttls[-1] <= 50
            record = Backlog()
            record.ParseFromString(await r.get(keys[0]))
            assert record.reply_to == client.ret and record.module == "bk.echo"
            assert BACKLOG_PREFIX + record.uid == keys[0].decode()
            assert record.reference == record.uid   # the app's ref is the uid
            gate.set()
            [reply] = await one
            assert reply.ok and reply.data == b"x"
            assert all(rep.ok for [rep] in await asyncio.gather(*burst))
            left = [k async for k in r.scan_iter(BACKLOG_PREFIX + "*")]
            for _ in range(100):                       # the DELs ride the writer's next batch
                if not left:
                    break
                await asyncio.sleep(0.02)
                left = [k async for k in r.scan_iter(BACKLOG_PREFIX + "*")]
            assert left == []
        finally:
            gate.set()
            await r.aclose()
