"""rmb-relay hardening (relay side): real sockets on
127.0.0.1, the session Redis, a real registry; the fd-limit test runs the relay as a real
process with a low RLIMIT_NOFILE."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import resource
import subprocess
import sys
import time

import aiohttp
import pytest
from websockets.asyncio.client import connect

from rmb_peer.token import make_token
from tests.relay_harness import Cluster, envelope, recv_env, roundtrip, url


@pytest.fixture
async def cluster(redis_url):
    async with Cluster(redis_url) as c:
        yield c


async def _metric(relay, name: str) -> float:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{relay.port}/metrics") as resp:
            text = await resp.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_ping_with_destination_twin_0_or_none_gets_a_pong(cluster):
    """finding 8: the TS client's ping carries destination twin 0; rmb-rs answers it."""
    relay = await cluster.relay()
    ia, a = await cluster.twin([relay.domain])
    async with connect(url(relay, ia, a, sid="ts")) as wa:
        for dst in ((0,), None):
            ping = envelope((a, "ts"), dst, kind="ping")
            await wa.send(ping.SerializeToString())
            pong = await recv_env(wa)
            assert pong.uid == ping.uid and pong.WhichOneof("message") == "pong"
            assert pong.destination.twin == a and pong.destination.connection == "ts"
            assert pong.source.twin == 0
    assert len(relay.test_events.of("rmb.relay.answered")) == 2


async def test_full_offline_queue_answers_sender_at_once_and_evicts_nothing(cluster, redis_url):
    """finding 4: over --queue-maxlen the NEW envelope is refused with an error envelope
    (metric counted); the queued ones are all kept and replayed in order."""
    relay = await cluster.relay(queue_maxlen=5, queue_per_source=5)
    ia, a = await cluster.twin([relay.domain])
    ib, b = await cluster.twin([relay.domain])          # offline
    async with connect(url(relay, ia, a)) as wa:
        sent = [envelope((a,), (b,), payload=bytes([i])) for i in range(8)]
        for env in sent[:5]:
            await wa.send(env.SerializeToString())
        r = relay.redis
        for _ in range(200):
            if await r.xlen(relay.queues.key((b, None))) == 5:
                break
            await asyncio.sleep(0.02)
        for env in sent[5:]:
            await wa.send(env.SerializeToString())
            err = await recv_env(wa)
            assert err.uid == env.uid and err.error.message == \
                "destination offline queue is full, dropping message"
        # federation into the full queue: 429, the sending relay gives up with that reason
        async with aiohttp.ClientSession() as http:
            extra = envelope((a,), (b,))
            async with http.post(f"http://127.0.0.1:{relay.port}/",
                                 data=extra.SerializeToString()) as resp:
                assert resp.status == 429
        async with connect(url(relay, ib, b)) as wb:
            got = [await recv_env(wb) for _ in range(5)]
            assert [g.uid for g in got] == [e.uid for e in sent[:5]]
    assert await _metric(relay, "rmb_relay_queue_full_total") == 4


async def test_oversized_or_long_uid_envelope_answered_not_closed(cluster):
    """finding 6: an envelope that parses but is too large (up to 4 x --max-size) or has a
    300-char uid gets an error back (requests) or a logged drop (responses); the
    connection and frames in flight on it stay."""
    relay = await cluster.relay(max_size=4096)
    ia, a = await cluster.twin([relay.domain])
    ib, b = await cluster.twin([relay.domain])
    async with connect(url(relay, ia, a)) as wa, connect(url(relay, ib, b)) as wb:
        big = envelope((a,), (b,), payload=b"x" * 10_000)      # 2.4 x max-size
        await wa.send(big.SerializeToString())
        follow = envelope((a,), (b,))
        await wa.send(follow.SerializeToString())              # in flight behind it
        err = await recv_env(wa)
        assert err.uid == big.uid and err.error.message.startswith("envelope too large")
        assert (await recv_env(wb)).uid == follow.uid
        long_req = envelope((a,), (b,))
        long_req.uid = "r" * 300
        await wa.send(long_req.SerializeToString())
        err = await recv_env(wa)
        assert err.uid == "r" * 300 and "uid too long" in err.error.message
        long_resp = envelope((a,), (b,), kind="response")
        long_resp.uid = "s" * 300
        await wa.send(long_resp.SerializeToString())
        await roundtrip(wa, a, wb, b)
        assert wa.close_code is None


async def test_vanished_peer_freed_by_heartbeat(cluster):
    """finding 7: a peer that vanished without a FIN (never answers pings) is closed and
    unregistered after 1.5 x heartbeat (was 60 s + 30 s)."""
    relay = await cluster.relay(heartbeat=0.4)
    ia, a = await cluster.twin([relay.domain])
    tok = make_token(ia, a, "gone", int(time.time()))
    r, w = await asyncio.open_connection("127.0.0.1", relay.port)
    key = base64.b64encode(os.urandom(16)).decode()
    w.write((f"GET /?{tok} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    await w.drain()
    assert b" 101 " in await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)
    for _ in range(50):
        if relay.table.get((a, "gone")) is not None:
            break
        await asyncio.sleep(0.05)
    assert relay.table.get((a, "gone")) is not None
    # we never read or answer a ping from here on
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (relay.table.get((a, "gone")) is not None
                                           or len(relay._runner.server.connections)):
        await asyncio.sleep(0.1)
    assert relay.table.get((a, "gone")) is None
    assert len(relay._runner.server.connections) == 0
    w.close()


async def test_refusal_warnings_are_rate_limited_and_counted(cluster):
    """Every refusal counted by a metric; warning lines limited to a handful per reason
    plus a `suppressed` summary (27,000 warnings in 45 s was finding 5)."""
    relay = await cluster.relay()
    ia, a = await cluster.twin([relay.domain])
    ib, b = await cluster.twin([relay.domain])
    async with connect(url(relay, ia, a)) as wa, connect(url(relay, ib, b)) as wb:
        for _ in range(200):
            await wa.send(envelope((b,), (b,)).SerializeToString())       # wrong source
        for _ in range(200):
            assert (await recv_env(wa)).error.message == "message wrong source"
        await roundtrip(wa, a, wb, b)
    rejected = relay.test_events.of("rmb.relay.rejected")
    assert 1 <= len(rejected) <= 10
    assert await _metric(relay, 'rmb_relay_envelopes_rejected_total{reason="message wrong source"}') == 200
    suppressed = await _metric(relay, "rmb_relay_log_suppressed_total")
    assert suppressed == 200 - len(rejected)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
async def test_fd_exhaustion_reported_and_listener_recovers(cluster, tmp_path, loop):
    """finding 7: at the fd limit the relay reports it (metric + log line) instead of
    going silent, and serves again once fds are free (uvloop closed the listener for good)."""
    log = tmp_path / "relay.jsonl"
    limit = 90

    def low_fds():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    proc = subprocess.Popen(
        [sys.executable, "-m", "rmb_relay.daemon", "-m", "fd.test", "--listen", "127.0.0.1:0",
         "--redis", cluster.redis_url, "--registry", cluster.registry_url, "--log", str(log),
         "--event-loop", loop, "--grace", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=low_fds)
    held = []
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        assert line.startswith("READY "), line + proc.stderr.read()
        port = json.loads(line[len("READY "):])["port"]
        for _ in range(limit + 20):
            try:
                held.append(await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port), 2))
            except (OSError, asyncio.TimeoutError):
                break
        found = False
        for _ in range(100):
            if log.exists() and "rmb.relay.accept_failed" in log.read_text():
                found = True
                break
            await asyncio.sleep(0.1)
        assert found, "no accept_failed line at the fd limit"
        for _r, w in held:
            w.close()
        held.clear()
        ident, twin = await cluster.twin(["fd.test"])
        ok = False
        for _ in range(60):
            try:
                async with connect(f"ws://127.0.0.1:{port}/?"
                                   + make_token(ident, twin, None, int(time.time())),
                                   open_timeout=3) as ws:
                    ping = envelope((twin,), (twin,), kind="ping")
                    await ws.send(ping.SerializeToString())
                    ok = (await recv_env(ws)).WhichOneof("message") == "pong"
                    break
            except (OSError, asyncio.TimeoutError, Exception):  # noqa: BLE001 - retry until served
                await asyncio.sleep(0.25)
        assert ok, "relay did not serve again after fds were freed"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                text = await resp.text()
        assert "rmb_relay_accept_failed_total" in text
        assert proc.poll() is None
    finally:
        for _r, w in held:
            w.close()
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired:
            proc.kill()


async def test_entry_point_guards_log_bugs_and_keep_serving(cluster, monkeypatch):
    """DESIGN.md section 2: one guard per entry point. A bug while handling one frame
    drops that frame and logs rmb.relay.bug; the connection and the relay keep serving.
    A malformed offline-queue entry is dropped and logged; the rest is replayed."""
    relay = await cluster.relay()
    ia, a = await cluster.twin([relay.domain])
    ib, b = await cluster.twin([relay.domain])
    poison = envelope((a,), (b,))
    real = relay.router.check_inbound

    def buggy(session, env, size, now):
        if env.uid == poison.uid:
            raise RuntimeError("injected bug")
        return real(session, env, size, now)

    monkeypatch.setattr(relay.router, "check_inbound", buggy)
    async with connect(url(relay, ia, a)) as wa, connect(url(relay, ib, b)) as wb:
        await wa.send(poison.SerializeToString())
        await roundtrip(wa, a, wb, b)
        assert wa.close_code is None
    bugs = relay.test_events.of("rmb.relay.bug")
    assert bugs and "injected bug" in bugs[0]["attrs"]["reason"]
    # a corrupt entry in b's offline stream, between two good ones
    key = relay.queues.key((b, None))
    async with connect(url(relay, ia, a)) as wa:
        first = envelope((a,), (b,))
        await wa.send(first.SerializeToString())
        for _ in range(100):
            if await relay.redis.xlen(key) == 1:
                break
            await asyncio.sleep(0.02)
        await relay.redis.xadd(key, {"x": b"no envelope here"})
        second = envelope((a,), (b,))
        await wa.send(second.SerializeToString())
        for _ in range(100):
            if await relay.redis.xlen(key) == 3:
                break
            await asyncio.sleep(0.02)
        async with connect(url(relay, ib, b)) as wb:
            got = [await recv_env(wb) for _ in range(2)]
            assert [g.uid for g in got] == [first.uid, second.uid]
    assert len(relay.test_events.of("rmb.relay.bug")) == 2


def test_unreachable_redis_names_url_and_flag():
    proc = subprocess.run(
        [sys.executable, "-m", "rmb_relay.daemon", "-m", "r.test", "--listen", "127.0.0.1:0",
         "--redis", "redis://127.0.0.1:1/3", "--registry", "http://127.0.0.1:1"],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "redis://127.0.0.1:1/3" in proc.stderr and "--redis" in proc.stderr


async def test_one_sender_cannot_crowd_others_out_of_a_queue(cluster):
    """--queue-per-source: a sender holds at most its share of a twin's offline queue
    (then gets an error at once); another sender can still queue; the share is given back
    as the queue is replayed."""
    relay = await cluster.relay(queue_maxlen=10, queue_per_source=4)
    ia, a = await cluster.twin([relay.domain])
    ic, c = await cluster.twin([relay.domain])
    ib, b = await cluster.twin([relay.domain])          # offline
    key = relay.queues.key((b, None))

    async def fill(ws, src, n):
        sent = [envelope((src,), (b,)) for _ in range(n)]
        for env in sent:
            await ws.send(env.SerializeToString())
        return sent

    async with connect(url(relay, ia, a)) as wa, connect(url(relay, ic, c)) as wc:
        from_a = await fill(wa, a, 6)
        errs = [await recv_env(wa) for _ in range(2)]
        assert [e.uid for e in errs] == [e.uid for e in from_a[4:]]
        assert all("share of the destination offline queue is full" in e.error.message
                   for e in errs)
        from_c = await fill(wc, c, 4)                  # c still has its share
        for _ in range(200):
            if await relay.redis.xlen(key) == 8:
                break
            await asyncio.sleep(0.02)
        assert await relay.redis.xlen(key) == 8
        async with connect(url(relay, ib, b)) as wb:
            got = [await recv_env(wb) for _ in range(8)]
            assert {g.uid for g in got} == {e.uid for e in from_a[:4] + from_c}
        for _ in range(200):                           # counts given back after replay
            if not await relay.redis.hgetall(key + ":src") or all(
                    int(v) == 0 for v in (await relay.redis.hgetall(key + ":src")).values()):
                break
            await asyncio.sleep(0.02)
        again = await fill(wa, a, 4)                   # b is gone again: a queues 4 more
        for _ in range(200):
            if await relay.redis.xlen(key) == 4:
                break
            await asyncio.sleep(0.02)
        assert await relay.redis.xlen(key) == 4
        assert len(again) == 4
