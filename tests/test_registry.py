"""Twin registry (rmb_relay/registry.py) over real HTTP on 127.0.0.1 port 0 and a real Redis,
driven through the TwinDirectory client (rmb_peer/twins.py)."""
from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import aiohttp
import pytest

from daemon_runtime.eventlog import EventLog
from daemon_runtime.lifecycle import Ready
from rmb_peer.events import RMB_EVENTS
from rmb_peer.identity import E2EKey, Identity
from rmb_peer.twins import (
    RegistryRefused, TwinDirectory, UnknownTwin, DirectoryError, signed_write_body,
)
from rmb_relay.registry import RegistryServer

ALICE = Identity.from_seed(bytes(range(32)), "sr25519")
BOB = Identity.from_seed(bytes(range(1, 33)), "ed25519")
ALICE_PK = E2EKey.from_seed(bytes(range(32))).pk


@pytest.fixture(params=["redis", "sqlite"])
async def registry(request, redis_url, tmp_path):
    """The registry over Redis, and over its own durable store (--data-dir)."""
    sink = io.StringIO()
    events = EventLog("rmb-registry", "test", [RMB_EVENTS], sink=sink)
    if request.param == "sqlite":
        server = RegistryServer("127.0.0.1", 0, None, events, data_dir=str(tmp_path / "reg"))
    else:
        server = RegistryServer("127.0.0.1", 0, redis_url, events)
    await server.start()
    server.sink = sink
    try:
        yield server
    finally:
        await server.close()
        events.close()


def logged(server) -> list[dict]:
    return [json.loads(line) for line in server.sink.getvalue().splitlines()]


async def test_create_and_lookup_by_id_and_account(registry):
    d = TwinDirectory(registry.url)
    try:
        a = await d.create(ALICE, ["127.0.0.1:8101"], ALICE_PK)
        b = await d.create(BOB, ["r1.example:443", "r2.example:443"], None)
        assert (a.id, b.id) == (1, 2)  # Redis INCR on a fresh db
        assert a.account == ALICE.account and a.pk == ALICE_PK
        fresh = TwinDirectory(registry.url)
        try:
            got = await fresh.get(b.id)
            assert got.account == BOB.account and got.relays == ["r1.example:443", "r2.example:443"]
            assert got.pk is None
            by_acc = await fresh.get_by_account(ALICE.account)
            assert by_acc.id == a.id and by_acc.relays == ["127.0.0.1:8101"]
        finally:
            await fresh.close()
        # one account cannot register twice
        with pytest.raises(RegistryRefused) as exc:
            await d.create(ALICE, ["x:1"], None)
        assert exc.value.status == 409 and "already registered" in exc.value.reason
    finally:
        await d.close()
    names = [e["event"] for e in logged(registry)]
    assert names.count("rmb.registry.twin_created") == 2
    assert "rmb.registry.refused" in names


async def test_unknown_twin_and_bad_queries(registry):
    d = TwinDirectory(registry.url)
    try:
        with pytest.raises(UnknownTwin):
            await d.get(42)
        with pytest.raises(UnknownTwin):
            await d.get_by_account(b"\x07" * 32)
        with pytest.raises(UnknownTwin):
            await d.get(0)
    finally:
        await d.close()
    async with aiohttp.ClientSession() as s:
        async with s.get(registry.url + "/twins/abc") as r:
            assert r.status == 400 and "bad twin id" in (await r.json())["error"]
        async with s.get(registry.url + "/twins?account=zz") as r:
            assert r.status == 400
        async with s.post(registry.url + "/twins", data=b"{not json") as r:
            assert r.status == 400 and (await r.json())["error"] == "body is not valid JSON"
        async with s.get(registry.url + "/health") as r:
            assert r.status == 200 and (await r.json())["ok"] is True
        async with s.get(registry.url + "/metrics") as r:
            assert 'rmb_registry_requests_total{route="get",status="400"} 1.0' in await r.text()


async def test_signed_update_and_refused_forged_stale_replayed(registry):
    d = TwinDirectory(registry.url)
    try:
        a = await d.create(ALICE, ["127.0.0.1:8101"], None)
        now = int(time.time())
        up = await d.update(ALICE, a.id, ["127.0.0.1:8102", "127.0.0.1:8103"], ALICE_PK, now=now)
        assert up.relays == ["127.0.0.1:8102", "127.0.0.1:8103"] and up.pk == ALICE_PK
        assert (await TwinDirectory(registry.url).get(a.id)).relays == up.relays
        # forged: Bob signs an update of Alice's twin
        with pytest.raises(RegistryRefused) as exc:
            await d.update(BOB, a.id, ["evil:1"], None, now=now + 1)
        assert exc.value.status == 401 and "does not own twin" in exc.value.reason
        # stale: outside the replay window
        with pytest.raises(RegistryRefused) as exc:
            await d.update(ALICE, a.id, ["127.0.0.1:9"], None, now=now - 3600)
        assert exc.value.status == 401 and "stale timestamp" in exc.value.reason
        # unknown twin
        with pytest.raises(UnknownTwin):
            await d.update(ALICE, 999, ["127.0.0.1:9"], None, now=now + 1)
    finally:
        await d.close()
    async with aiohttp.ClientSession() as s:
        # replay of the accepted update body: refused (timestamp not newer)
        body = signed_write_body(ALICE, "update", a.id, ["127.0.0.1:8104"], None, now + 5)
        async with s.put(f"{registry.url}/twins/{a.id}", json=body) as r:
            assert r.status == 200
        async with s.put(f"{registry.url}/twins/{a.id}", json=body) as r:
            assert r.status == 409 and "replayed" in (await r.json())["error"]
        # an older (but in-window) write cannot overwrite a newer one
        older = signed_write_body(ALICE, "update", a.id, ["127.0.0.1:8105"], None, now + 2)
        async with s.put(f"{registry.url}/twins/{a.id}", json=older) as r:
            assert r.status == 409 and "out-of-order" in (await r.json())["error"]
        # tampered relays under Alice's valid signature: signature no longer matches
        bad = dict(body, relays=["evil:1"], timestamp=now + 6)
        async with s.put(f"{registry.url}/twins/{a.id}", json=bad) as r:
            err = (await r.json())["error"]
            assert r.status == 401 and err.startswith("bad signature: invalid sr25519")
        # a forged create (signature by another key) is refused
        forged = signed_write_body(BOB, "create", 0, ["x:1"], None, now)
        forged["account"] = (b"\x09" * 32).hex()
        async with s.post(f"{registry.url}/twins", json=forged) as r:
            assert r.status == 401
        async with s.get(f"{registry.url}/twins/{a.id}") as r:
            assert (await r.json())["relays"] == ["127.0.0.1:8104"]
    refused = [e["attrs"] for e in logged(registry) if e["event"] == "rmb.registry.refused"]
    assert {r["status"] for r in refused} >= {401, 404, 409}


async def test_directory_cache_ttl(registry):
    writer = TwinDirectory(registry.url)
    clock = [1000.0]
    reader = TwinDirectory(registry.url, cache_ttl=5.0, clock=lambda: clock[0])
    try:
        a = await writer.create(ALICE, ["127.0.0.1:8101"], None)
        assert (await reader.get(a.id)).relays == ["127.0.0.1:8101"]
        assert reader.fetches == 1
        await writer.update(ALICE, a.id, ["127.0.0.1:8202"], None)
        clock[0] += 4.9  # within TTL: cached record, no HTTP
        assert (await reader.get(a.id)).relays == ["127.0.0.1:8101"]
        assert (await reader.get_by_account(ALICE.account)).relays == ["127.0.0.1:8101"]
        assert reader.fetches == 1
        clock[0] += 0.2  # TTL passed: fetched again, sees the update
        assert (await reader.get(a.id)).relays == ["127.0.0.1:8202"]
        assert reader.fetches == 2
        reader.invalidate(a.id)
        await reader.get(a.id)
        assert reader.fetches == 3
        # concurrent lookups of one twin share one request
        reader.invalidate(a.id)
        twins = await asyncio.gather(*(reader.get(a.id) for _ in range(10)))
        assert {t.id for t in twins} == {a.id} and reader.fetches == 4
    finally:
        await writer.close()
        await reader.close()


async def test_unreachable_registry_is_directory_error(registry):
    port = registry.port
    await registry.close()
    d = TwinDirectory(f"http://127.0.0.1:{port}", timeout=2.0)
    try:
        with pytest.raises(DirectoryError):
            await d.get(1)
    finally:
        await d.close()


def test_console_script_ready_and_sigterm(redis_url, tmp_path):
    log = tmp_path / "registry.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from rmb_relay.registry import main; sys.exit(main())",
         "--listen", "127.0.0.1:0", "--redis", redis_url, "--log", str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        info = Ready.parse(proc.stdout.readline())
        assert info and info["port"] > 0

        async def talk():
            d = TwinDirectory(f"http://127.0.0.1:{info['port']}")
            try:
                t = await d.create(BOB, ["127.0.0.1:8101"], None)
                return await TwinDirectory(d.base_url).get(t.id)
            finally:
                await d.close()
        assert asyncio.run(talk()).account == BOB.account
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert lines[0]["service"] == "rmb-registry" and lines[0]["event"] == "rmb.registry.storage"
    assert lines[1]["event"] == "rmb.registry.twin_created"


@contextlib.asynccontextmanager
async def _registry_app(redis_client):
    """create_app(redis_client) served on a free 127.0.0.1 port: yields (base URL, the event
    log's StringIO sink)."""
    from aiohttp import web
    from rmb_relay.registry import create_app
    sink = io.StringIO()
    events = EventLog("rmb-registry", "test", [RMB_EVENTS], sink=sink)
    runner = web.AppRunner(create_app(redis_client, events), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", sink
    finally:
        await runner.cleanup()
        events.close()


async def test_storage_down_is_503_and_unhealthy_and_oversize_is_413():
    import redis.asyncio as aioredis
    from rmb_relay.registry import MAX_BODY

    dead = aioredis.Redis.from_url("redis://127.0.0.1:1", socket_connect_timeout=1)
    try:
        async with _registry_app(dead) as (url, sink), aiohttp.ClientSession() as s:
            async with s.get(url + "/health") as r:
                assert r.status == 200
            async with s.get(url + "/twins/1") as r:
                assert r.status == 503 and (await r.json())["error"] == "registry storage unavailable"
            async with s.get(url + "/health") as r:
                assert r.status == 503 and (await r.json())["ok"] is False
            async with s.post(url + "/twins", data=b"x" * (MAX_BODY + 1)) as r:
                assert r.status == 413
    finally:
        await dead.aclose()
    statuses = [json.loads(x)["attrs"]["status"] for x in sink.getvalue().splitlines()]
    assert statuses == [503, 413]  # each refusal logged exactly once


async def test_hung_redis_is_503_after_the_store_timeout_not_a_request_held_open():
    """A Redis that hangs (SIGSTOP: connected, never answering): the lookup waits the
    store's timeout (5 s), then 503 like a Redis that is down, the reason logged."""
    import redis.asyncio as aioredis
    from daemon_runtime.redis_server import EmbeddedRedis

    hung = EmbeddedRedis().start()
    client = aioredis.Redis.from_url(hung.url)
    try:
        async with _registry_app(client) as (url, sink), aiohttp.ClientSession() as s:
            async with s.get(url + "/twins/1") as r:
                assert r.status == 404                    # answering: no such twin
            os.kill(hung.proc.pid, signal.SIGSTOP)
            async with s.get(url + "/twins/1", timeout=aiohttp.ClientTimeout(total=30)) as r:
                assert r.status == 503 and (await r.json())["error"] == "registry storage unavailable"
    finally:
        os.kill(hung.proc.pid, signal.SIGCONT)
        await client.aclose()
        hung.stop()
    refused = [json.loads(x)["attrs"] for x in sink.getvalue().splitlines()]
    assert any("no answer within 5 s" in a.get("reason", "") for a in refused), refused
