"""TwinDirectory (rmb_peer/twins.py), the registry client relays and peers share:
stale-if-error against a real registry process killed and restarted, bounded staleness,
a bounded negative cache, bounded tables, and malformed registry answers."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from daemon_runtime.lifecycle import Ready
from rmb_peer.identity import Identity
from rmb_peer.twins import DirectoryError, TwinDirectory, UnknownTwin

ALICE = Identity.from_seed(bytes([7]) * 32, "sr25519")


def start_registry(redis_url: str, port: int = 0) -> tuple[subprocess.Popen, int]:
    """A real rmb-registry process on 127.0.0.1; returns (process, port)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from rmb_relay.registry import main; sys.exit(main())",
         "--listen", f"127.0.0.1:{port}", "--redis", redis_url],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=os.environ.copy())
    info = Ready.parse(proc.stdout.readline())
    assert info and info["port"] > 0, "registry did not start"
    return proc, info["port"]


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=10)


async def test_stale_if_error_with_a_registry_killed_and_restarted(redis_url):
    proc, port = start_registry(redis_url)
    clock = [1000.0]
    stale = []
    d = TwinDirectory(f"http://127.0.0.1:{port}", cache_ttl=10.0, clock=lambda: clock[0],
                      timeout=2.0, max_stale=100.0,
                      on_stale=lambda twin, age, exc: stale.append((twin.id, age, str(exc))))
    try:
        twin = await d.create(ALICE, ["127.0.0.1:9000"], None)
        d.invalidate(twin.id)
        assert (await d.get(twin.id)).account == ALICE.account
        stop(proc)                              # the registry dies
        clock[0] += 50                          # TTL over: the registry is asked and fails
        assert (await d.get(twin.id)).id == twin.id          # served stale
        assert (await d.get_by_account(ALICE.account)).id == twin.id
        assert d.stale_served == 2 and stale[0][0] == twin.id and stale[0][1] == 50.0
        assert "unreachable" in stale[0][2]
        clock[0] += 61                          # 111 s old > ttl 10 + max_stale 100
        with pytest.raises(DirectoryError):
            await d.get(twin.id)
        proc, _ = start_registry(redis_url, port)   # back (same Redis, same port)
        assert (await d.get(twin.id)).id == twin.id
        assert d.stale_served == 2
        # without a record there is nothing stale to serve
        with pytest.raises(UnknownTwin):
            await d.get(999_999)
    finally:
        await d.close()
        stop(proc)


async def test_negative_cache_is_bounded_and_expires(redis_url):
    proc, port = start_registry(redis_url)
    clock = [0.0]
    d = TwinDirectory(f"http://127.0.0.1:{port}", clock=lambda: clock[0], negative_ttl=5.0,
                      max_records=3)
    try:
        for _ in range(3):
            with pytest.raises(UnknownTwin):
                await d.get(4242)
        assert d.fetches == 1                   # remembered for 5 s
        clock[0] += 5.1
        with pytest.raises(UnknownTwin):
            await d.get(4242)
        assert d.fetches == 2
        for tid in range(5000, 5010):
            with pytest.raises(UnknownTwin):
                await d.get(tid)
        assert len(d._unknown) == 3             # bounded: the oldest were dropped
        # a twin registered after a 404 is seen once it is created through this directory
        twin = await d.create(ALICE, [], None)
        assert (await d.get(twin.id)).id == twin.id
    finally:
        await d.close()
        stop(proc)


async def test_malformed_or_huge_registry_answers_are_directory_errors():
    """A registry answering a deeply nested or oversized body: DirectoryError, never a
    RecursionError or a memory blow-up."""
    from aiohttp import web
    bodies = iter([b"[" * 5000 + b"]" * 5000, b"{" + b" " * (200 * 1024) + b"}",
                   b'{"id": 1, "account": "zz"}'])

    async def handler(request):
        return web.Response(body=next(bodies), content_type="application/json")
    app = web.Application()
    app.router.add_get("/twins/{id}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    d = TwinDirectory(f"http://127.0.0.1:{port}", cache_ttl=0)
    try:
        for _ in range(3):
            with pytest.raises(DirectoryError):
                await d.get(1)
    finally:
        await d.close()
        await runner.cleanup()
