"""A new rmb-peer (no --data-dir record) starts while the twin registry is down: it runs
with its identity from its key, answers /health not ok (registry_down), retries the
registry with backoff and, once the registry is back, resolves its twin, connects and
carries calls both ways. Real registry process, in-process relay and peers, real Redis."""
from __future__ import annotations

import asyncio
import json
import os
import time

import aiohttp
import pytest

from rmb_peer.identity import E2EKey, Identity
from tests.rmb_harness import RmbCluster, TwinInfo, events_of
from tests.test_peer_twincache import _use_registry
from tests.test_rmb_twins import start_registry, stop


@pytest.fixture
async def cluster(redis_url, tmp_path):
    async with RmbCluster(redis_url, tmp_path) as c:
        yield c


async def echo(data: bytes) -> bytes:
    return data


async def _health(port: int) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/health") as resp:
            return resp.status, json.loads(await resp.text())


async def _wait_healthy(port: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status, body = await _health(port)
        if status == 200:
            return body
        assert time.monotonic() < deadline, f"peer never became healthy: {body}"
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("registered", [True, False], ids=["known-twin", "new-twin"])
async def test_new_peer_starts_while_registry_down_and_joins_when_it_returns(
        cluster, registered):
    proc, port = start_registry(cluster.redis_url)
    try:
        await _use_registry(cluster, f"http://127.0.0.1:{port}")
        relay = await cluster.start_relay()
        b = await cluster.new_twin([relay])
        pb = await cluster.start_peer(b, [relay])
        cluster.service(pb, "echo", {"echo": echo})
        if registered:
            a = await cluster.new_twin([relay])
        else:                                   # a twin the registry has never seen
            seed = os.urandom(32).hex()
            a = TwinInfo(0, seed, Identity.from_seed(seed, "sr25519"), E2EKey.from_seed(seed),
                         "sr25519")
        stop(proc)                                        # the registry goes down

        pa = await cluster.start_peer(a, [relay], by_account=True, update=not registered,
                                      extra=["--status-listen", "127.0.0.1:0"])
        assert pa.ready["registry_down"] is True and pa.ready["relays"] == []
        status, body = await _health(pa.ready["status_port"])
        assert status == 503 and body["ok"] is False and body["registry_down"]
        cluster.service(pa, "echo", {"echo": echo})
        client_a = cluster.client(pa)
        waiting = asyncio.create_task(client_a.call(b.id, "echo", b"sent while down", ttl=60))
        await asyncio.sleep(1.5)                          # a few registry retries fail
        assert not waiting.done()

        proc, _ = start_registry(cluster.redis_url, port)  # back on the same port
        body = await _wait_healthy(pa.ready["status_port"], 45)
        assert body["registry_down"] is None and body["twin"] > 0
        a_id = body["twin"]
        if registered:
            assert a_id == a.id
        [r] = await asyncio.wait_for(waiting, 60)
        assert r.ok and r.data == b"sent while down", r
        [r] = await cluster.client(pb).call(a_id, "echo", b"to the late peer", ttl=30)
        assert r.ok and r.data == b"to the late peer", r
        names = [e["event"] for e in events_of(pa.log)]
        assert "rmb.peer.registry_wait" in names and "rmb.peer.twin_recovered" in names
    finally:
        stop(proc)
