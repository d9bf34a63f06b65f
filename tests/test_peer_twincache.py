"""rmb-peer's refresh-ahead twin cache (rmb_peer.daemon.PeerDaemon._twin) against a real
registry: a record in use is re-fetched in the background during the second half of
--twin-cache-ttl (the caller never waits), a record is never used past its TTL, a changed
twin record is picked up by the refresh, and unknown twins are not cached."""
from __future__ import annotations

import asyncio

import pytest

from rmb_peer.daemon import PeerDaemon, parse_args
from tests.rmb_harness import RmbCluster


@pytest.fixture
async def cluster(redis_url, tmp_path):
    async with RmbCluster(redis_url, tmp_path) as c:
        yield c


async def test_refresh_ahead_and_ttl(cluster):
    relay = await cluster.start_relay()
    a = await cluster.new_twin([relay])
    b = await cluster.new_twin([relay])
    ttl = 2.0
    args = parse_args(cluster.peer_args(a, [relay], cluster.redis_url)
                      + ["--log", "-", "--twin-cache-ttl", str(ttl)])
    daemon = PeerDaemon(args)
    try:
        directory = daemon.directory
        twin = await daemon._twin(b.id)
        assert twin.id == b.id and directory.fetches == 1
        assert (await daemon._twin(b.id)) is twin and directory.fetches == 1   # fresh: cached
        # the record changes in the registry (b publishes no pk any more)
        await cluster.directory.update(b.identity, b.id, [relay.domain], None)
        await asyncio.sleep(ttl * 0.6)                   # second half of the TTL
        stale_ok = await daemon._twin(b.id)              # answered at once from the cache...
        assert stale_ok is twin and stale_ok.pk is not None
        for _ in range(100):                             # ...and refreshed in the background
            if daemon._twins[b.id][0].pk is None:
                break
            await asyncio.sleep(0.01)
        assert directory.fetches == 2 and (await daemon._twin(b.id)).pk is None
        # unused past its TTL: the next use waits for a fresh lookup (never a stale record)
        await asyncio.sleep(ttl * 1.1)
        assert (await daemon._twin(b.id)).pk is None and directory.fetches == 3
        # unknown twins are answered None and not cached
        assert await daemon._twin(4_000_000) is None
        assert 4_000_000 not in daemon._twins
    finally:
        for task in list(daemon._tasks):
            task.cancel()
        await daemon.directory.close()
