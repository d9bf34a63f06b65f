"""One twin pointing its relay domain at a dead address cannot saturate the relay
(federation circuits): attempts to the dead domain are bounded by its circuit, federation to a
live relay and local traffic keep flowing, warnings are a handful plus counters."""
from __future__ import annotations

import asyncio
import time

from websockets.asyncio.client import connect

from daemon_runtime.redis_server import free_port
from tests.relay_harness import Cluster, envelope, recv_env, roundtrip, url
from tests.test_relay_hardening import _metric

import pytest


@pytest.fixture
async def cluster(redis_url):
    async with Cluster(redis_url) as c:
        yield c


async def test_dead_domain_bounded_other_routes_unaffected(cluster):
    r1 = await cluster.relay()
    r2 = await cluster.relay()
    dead = f"127.0.0.1:{free_port()}"
    ia, a = await cluster.twin([r1.domain])
    ib, b = await cluster.twin([r2.domain])
    ic, c = await cluster.twin([r1.domain])
    ix, x = await cluster.twin([dead])                     # points at a dead address
    n = 400
    async with connect(url(r1, ia, a)) as wa, connect(url(r2, ib, b)) as wb, \
            connect(url(r1, ic, c)) as wc:
        sent = [envelope((a,), (x,), ttl=4) for _ in range(n)]
        for env in sent:
            await wa.send(env.SerializeToString())
        started = time.monotonic()
        # while those retry: federated and local round trips are served promptly
        for _ in range(5):
            t0 = time.monotonic()
            await roundtrip(wc, c, wb, b)
            await roundtrip(wc, c, wa, a)
            assert time.monotonic() - t0 < 3.0
            await asyncio.sleep(0.3)
        errors = [await recv_env(wa, timeout=20) for _ in range(n)]
        assert {e.error.message for e in errors} == {"message has expired"}
        assert {e.uid for e in errors} == {e.uid for e in sent}
        assert time.monotonic() - started < 20
    failed = await _metric(r1, f'rmb_relay_federation_attempts_failed_total{{domain="{dead}"}}')
    assert 5 <= failed < 150           # unbounded it was thousands (n x passes)
    lines = r1.test_events.of("rmb.relay.federation_failed")
    assert len(lines) <= 15
    circuit = r1.test_events.of("rmb.relay.circuit")
    assert circuit and circuit[0]["attrs"]["domain"] == dead
