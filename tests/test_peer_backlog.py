"""rmb-peer daemon writes the backlog record of every app request (DESIGN.md section 3:
`SET msgbus.backlog.<uid> EX ttl`) in front of its next BRPOP on the local reader's
connection: the records are in Redis with the request's fields and TTL, for a single
request and for a burst handled as one batch, and a restarted peer answers from them."""
from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

pytest.importorskip("rmb_relay.daemon", reason="rmb_relay.daemon (the relay) has not landed yet")

from rmb_peer.core import BACKLOG_PREFIX  # noqa: E402
from rmb_peer.envelope import Backlog  # noqa: E402
from tests.rmb_harness import RmbCluster  # noqa: E402


async def echo(data: bytes) -> bytes:
    return data


async def test_backlog_records_written_for_single_and_batched_requests(redis_url, tmp_path):
    async with RmbCluster(redis_url, tmp_path) as c:
        relay = await c.start_relay()
        a = await c.new_twin([relay])
        b = await c.new_twin([relay])
        pa = await c.start_peer(a, [relay])
        pb = await c.start_peer(b, [relay])
        c.service(pb, "echo", {"bk.echo": echo})
        client = c.client(pa)
        r = aioredis.Redis.from_url(pa.redis_url)
        try:
            [one] = await client.call(b.id, "bk.echo", b"x", ttl=40)
            assert one.ok
            burst = await asyncio.gather(*[client.call(b.id, "bk.echo", b"%d" % i, ttl=50)
                                           for i in range(40)])
            assert all(rep.ok for [rep] in burst)
            keys = [k async for k in r.scan_iter(BACKLOG_PREFIX + "*")]
            assert len(keys) == 41
            ttls = sorted([await r.ttl(k) for k in keys])
            assert 0 < ttls[0] <= 40 and 40 < ttls[-1] <= 50
            record = Backlog()
            record.ParseFromString(await r.get(keys[0]))
            assert record.reply_to == client.ret and record.module == "bk.echo"
            assert BACKLOG_PREFIX + record.uid == keys[0].decode()
            assert record.reference == record.uid   # the app's ref is the uid
        finally:
            await r.aclose()
