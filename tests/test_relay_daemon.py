"""rmb-relay integration: real sockets on 127.0.0.1, the session Redis (`redis_url`), a real
twin registry (rmb_relay.registry) and websockets-library clients with real tokens.

Every refusal is checked while another connected twin keeps being served (issue must-show 5
from the relay's side)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import aiohttp
import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from daemon_runtime.redis_server import free_port
from rmb_peer.identity import Identity
from rmb_peer.token import make_token
from tests.relay_harness import Cluster, envelope, recv_env, roundtrip, status_of, url



@pytest.fixture
async def cluster(redis_url):
    async with Cluster(redis_url) as c:
        yield c


async def test_auth_refusals_while_other_twin_served(cluster):
    relay = await cluster.relay()
    ia, a = await cluster.twin([relay.domain])
    ib, b = await cluster.twin([relay.domain])
    base = f"ws://127.0.0.1:{relay.port}/"
    async with connect(url(relay, ia, a)) as wa, connect(url(relay, ib, b)) as wb:
        await roundtrip(wa, a, wb, b)
        assert await status_of(base) == 400                                  # no token
        await roundtrip(wa, a, wb, b)
        assert await status_of(base + "?not.a.jwt") == 401                   # undecodable
        other = Identity.from_seed(os.urandom(32), key_type="ed25519")
        assert await status_of(url(relay, other, b)) == 401                  # signed by wrong key
        assert await status_of(url(relay, ib, b, ttl=10, now=time.time() - 60)) == 401  # expired
        assert await status_of(url(relay, other, 4_000_000)) == 401          # unknown twin
        # sid "" (rmb-rs refuses it; make_token will not build it, so sign one by hand)
        from rmb_peer.token import JWT_ALG, _JWS
        now = int(time.time())
        claims = json.dumps({"sub": b, "sid": "", "iat": now, "exp": now + 60}).encode()
        empty_sid = _JWS.encode(claims, ib, algorithm=JWT_ALG, headers={"typ": "JWT"})
        assert await status_of(base + "?" + empty_sid) == 401
        await roundtrip(wa, a, wb, b)
    fails = relay.test_events.of("rmb.relay.auth_failed")
    reasons = [f["attrs"]["reason"] for f in fails]
    assert [f["attrs"]["status"] for f in fails] == [400, 401, 401, 401, 401, 401]
    assert "token expired" in reasons and "invalid token signature" in reasons
    assert any("unknown twin 4000000" in r for r in reasons)
    assert any("sid is empty" in r for r in reasons)


async def test_lookup_failure_is_500(cluster):
    dead_registry = f"http://127.0.0.1:{free_port()}"
    relay = await cluster.relay(registry_url=dead_registry)
    ia, a = await cluster.twin([relay.domain])
    assert await status_of(url(relay, ia, a)) == 500


async def test_bad_frames_close_only_that_connection(cluster):
    relay = await cluster.relay()
    ia, a = await cluster.twin([relay.domain])
    ib, b = await cluster.twin([relay.domain])
    async with connect(url(relay, ia, a)) as wa, connect(url(relay, ib, b)) as wb:
        async with connect(url(relay, ia, a, sid="text")) as wt:
            await wt.send("hello")                        # a text frame
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(wt.recv(), 5)
            assert wt.close_code == 1003 and "text frame" in wt.close_reason
        await roundtrip(wa, a, wb, b)
        async with connect(url(relay, ia, a, sid="garbage")) as wg:
            await wg.send(b"\xff\xff\xff\xff garbage")
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(wg.recv(), 5)
            assert wg.close_code == 1007 and "undecodable" in wg.close_reason
        await roundtrip(wa, a, wb, b)


async def test_envelope_errors_answered_and_connection_stays(cluster):
    relay = await cluster.relay(max_size=4096)
    ia, a = await cluster.twin([relay.domain])
    ib, b = await cluster.twin([relay.domain])
    async with connect(url(relay, ia, a)) as wa, connect(url(relay, ib, b)) as wb:
        cases = [
            (envelope((b,), (b,)), "message wrong source"),
            (envelope((a, "other-sid"), (b,)), "message wrong source"),
            (envelope((a,), (b,), payload=b"x" * 5000), "envelope too large: "),
            (envelope((a,), None), "message with missing destination"),
            (envelope((a,), (3_999_999,)), "unknown twin destination"),
        ]
        for env, text in cases:
            await wa.send(env.SerializeToString())
            err = await recv_env(wa)
            assert err.uid == env.uid and err.WhichOneof("message") == "error"
            assert err.error.code == 0 and err.error.message.startswith(text)
            assert not err.HasField("source") and not err.HasField("signature")
            assert err.destination.twin == env.source.twin
            await roundtrip(wa, a, wb, b)
        # a response with a wrong source is dropped, never answered
        await wa.send(envelope((b,), (b,), kind="response").SerializeToString())
        await roundtrip(wa, a, wb, b)
        assert len(relay.test_events.of("rmb.relay.rejected")) == 6


async def test_rate_limit_error_and_connection_stays(cluster):
    relay = await cluster.relay(limit=(3, 1_000_000))
    ia, a = await cluster.twin([relay.domain])
    ib, b = await cluster.twin([relay.domain])
    async with connect(url(relay, ia, a)) as wa, connect(url(relay, ib, b)) as wb:
        # align to a fresh 60 s window if we are too close to the boundary
        if time.time() % 60 > 55:
            await asyncio.sleep(60 - time.time() % 60 + 0.1)
        sent = [envelope((a,), (b,)) for _ in range(4)]
        for env in sent:
            await wa.send(env.SerializeToString())
        got = [await recv_env(wb) for _ in range(3)]
        assert [g.uid for g in got] == [e.uid for e in sent[:3]]
        err = await recv_env(wa)
        assert err.uid == sent[3].uid and err.error.message == "exceeded rate limits, dropping message"
        # still connected: B (its own budget) can reach A
        await roundtrip(wb, b, wa, a)
        assert not wa.close_code
    assert len(relay.test_events.of("rmb.relay.rate_limited")) == 1


async def test_ping_pong_and_fail_fast(cluster):
    relay = await cluster.relay()
    ia, a = await cluster.twin([relay.domain])
    ib, b = await cluster.twin([relay.domain])          # never connects
    async with connect(url(relay, ia, a, sid="s1")) as wa:
        ping = envelope((a, "s1"), (a, "s1"), kind="ping")
        await wa.send(ping.SerializeToString())
        pong = await recv_env(wa)
        assert pong.uid == ping.uid and pong.WhichOneof("message") == "pong"
        assert pong.destination.twin == a and pong.destination.connection == "s1"
        ff = envelope((a, "s1"), (b,), tags="fail-fast")
        await wa.send(ff.SerializeToString())
        err = await recv_env(wa)
        assert err.uid == ff.uid and err.error.message == "destination offline"
    r = aioredis.Redis.from_url(cluster.redis_url)
    try:
        assert await r.exists(relay.queues.key((b, None))) == 0   # nothing was queued
    finally:
        await r.aclose()


async def test_offline_twin_gets_queue_in_order_then_live(cluster):
    relay = await cluster.relay()
    ia, a = await cluster.twin([relay.domain])
    ib, b = await cluster.twin([relay.domain])
    async with connect(url(relay, ia, a)) as wa:
        queued = [envelope((a,), (b,), payload=i.to_bytes(2, "big")) for i in range(30)]
        for env in queued:
            await wa.send(env.SerializeToString())
        r = aioredis.Redis.from_url(cluster.redis_url)
        try:
            for _ in range(100):
                if await r.xlen(relay.queues.key((b, None))) == 30:
                    break
                await asyncio.sleep(0.05)
            assert await r.xlen(relay.queues.key((b, None))) == 30
            assert 3000 < await r.ttl(relay.queues.key((b, None))) <= 3601
            async with connect(url(relay, ib, b)) as wb:
                # live envelopes sent while the replay runs come after the queued ones
                live = [envelope((a,), (b,), payload=b"live%d" % i) for i in range(10)]
                for env in live:
                    await wa.send(env.SerializeToString())
                got = [await recv_env(wb) for _ in range(40)]
                assert [g.uid for g in got] == [e.uid for e in queued + live]
            assert await r.xlen(relay.queues.key((b, None))) == 0    # deleted after delivery
        finally:
            await r.aclose()
    delivered = relay.test_events.of("rmb.relay.delivered")
    assert sum(1 for d in delivered if d["attrs"]["queued_ms"] > 0) >= 30


async def test_reconnect_replaces_old_connection(cluster):
    relay = await cluster.relay()
    ia, a = await cluster.twin([relay.domain])
    ib, b = await cluster.twin([relay.domain])
    async with connect(url(relay, ia, a)) as wa:
        old = await connect(url(relay, ib, b))
        async with connect(url(relay, ib, b)) as new:
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(old.recv(), 5)
            assert old.close_code == 4000
            await asyncio.sleep(0.1)     # the old connection's cleanup has run by now
            await roundtrip(wa, a, new, b)  # ... and did not unregister the new one


async def test_two_relays_federate_both_ways(cluster):
    r1 = await cluster.relay()
    r2 = await cluster.relay()
    ia, a = await cluster.twin([r1.domain])
    ib, b = await cluster.twin([r2.domain])
    async with connect(url(r1, ia, a)) as wa, connect(url(r2, ib, b)) as wb:
        await roundtrip(wa, a, wb, b)
        resp = envelope((b,), (a,), kind="response", payload=b"answer")
        await wb.send(resp.SerializeToString())
        got = await recv_env(wa)
        assert got.uid == resp.uid and got.plain == b"answer"
    assert r1.test_events.of("rmb.relay.federated")[0]["attrs"]["domain"] == r2.domain
    assert r2.test_events.of("rmb.relay.federation_received")


async def test_federation_fails_over_to_second_relay(cluster):
    r1 = await cluster.relay()
    r2 = await cluster.relay()
    dead = f"127.0.0.1:{free_port()}"
    ia, a = await cluster.twin([r1.domain])
    ib, b = await cluster.twin([dead, r2.domain])
    r1.ranker.downvote(r2.domain, time.time())  # so the dead relay is tried first
    async with connect(url(r1, ia, a)) as wa, connect(url(r2, ib, b)) as wb:
        await roundtrip(wa, a, wb, b)
    failed = r1.test_events.of("rmb.relay.federation_failed")
    assert failed[0]["attrs"]["domain"] == dead and failed[0]["attrs"]["attempt"] == 1
    ok = r1.test_events.of("rmb.relay.federated")
    assert ok[0]["attrs"]["domain"] == r2.domain and ok[0]["attrs"]["attempt"] == 2
    assert r1.ranker.failures(dead, time.time()) == 1


async def test_message_expires_when_every_relay_is_dead(cluster):
    r1 = await cluster.relay()
    ia, a = await cluster.twin([r1.domain])
    ib, b = await cluster.twin([f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"])
    async with connect(url(r1, ia, a)) as wa:
        env = envelope((a,), (b,), ttl=3)
        started = time.time()
        await wa.send(env.SerializeToString())
        err = await recv_env(wa, timeout=10)
        assert err.uid == env.uid and err.error.message == "message has expired"
        assert time.time() >= env.timestamp + 3 - 0.05      # only once the TTL ran out
        assert time.time() - started < 6
    fails = r1.test_events.of("rmb.relay.federation_failed")
    assert len(fails) >= 4                    # several passes over both relays
    assert r1.test_events.of("rmb.relay.expired")


async def test_federation_post_endpoint(cluster):
    relay = await cluster.relay(max_size=4096)
    ib, b = await cluster.twin([relay.domain])
    # the source twin lives elsewhere; its envelopes are signed (the relay verifies them)
    _ia, src = await cluster.twin(["elsewhere.example:443"])
    async with aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{relay.port}/"
        async with http.post(base, data=b"\x01garbage") as resp:
            assert resp.status == 400
        async with http.post(base, data=b"x" * 5000) as resp:
            assert resp.status == 413
        old = envelope((src,), (b,), ts=time.time() - 100, ttl=10)
        async with http.post(base, data=old.SerializeToString()) as resp:
            assert resp.status == 400 and "expired" in await resp.text()
        ff = envelope((src,), (b,), tags="fail-fast")
        async with http.post(base, data=ff.SerializeToString()) as resp:
            assert resp.status == 404 and await resp.text() == "destination offline"
        ok = envelope((src,), (b,))
        async with http.post(base, data=ok.SerializeToString()) as resp:
            assert resp.status == 202
        async with connect(url(relay, ib, b)) as wb:
            got = await recv_env(wb)
            assert got.uid == ok.uid
        async with http.get(base) as resp:
            assert resp.status == 400


async def test_metrics_and_health(cluster):
    relay = await cluster.relay()
    ia, a = await cluster.twin([relay.domain])
    ib, b = await cluster.twin([relay.domain])
    async with connect(url(relay, ia, a)) as wa, connect(url(relay, ib, b)) as wb:
        for _ in range(200):       # both offline replays done: the round trip is live
            if all(relay.core.state_of((t, None)) == "live" for t in (a, b)):
                break
            await asyncio.sleep(0.01)
        await roundtrip(wa, a, wb, b)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{relay.port}/health") as resp:
                health = await resp.json()
                assert resp.status == 200 and health["ok"] and health["connections"] == 2
            async with http.get(f"http://127.0.0.1:{relay.port}/metrics") as resp:
                text = await resp.text()
    assert 'rmb_relay_envelopes_received_total{via="peer"} 1.0' in text
    assert 'rmb_relay_envelopes_delivered_total{path="live"} 1.0' in text
    assert "rmb_relay_connections 2.0" in text


async def test_cli_ready_help_and_sigterm(cluster, tmp_path):
    help_text = subprocess.run([sys.executable, "-m", "rmb_relay.daemon", "--help"],
                               capture_output=True, text=True, timeout=30).stdout
    for flag in ("--domain", "-m", "--listen", "--redis", "--registry", "--limit",
                 "--ranker-period", "--log", "--grace", "--max-size", "--config"):
        assert flag in help_text
    log = tmp_path / "relay.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmb_relay.daemon", "-m", "r.test", "r2.test", "--listen",
         "127.0.0.1:0", "--redis", cluster.redis_url, "--registry", cluster.registry_url,
         "--limit", "100", "100000", "--log", str(log), "--grace", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        assert line.startswith("READY "), line + proc.stderr.read()
        info = json.loads(line[len("READY "):])
        assert info["domains"] == ["r.test", "r2.test"] and info["port"] > 0
        ident, twin = await cluster.twin(["r2.test"])
        async with connect(f"ws://127.0.0.1:{info['port']}/?"
                           + make_token(ident, twin, None, int(time.time()))) as ws:
            ping = envelope((twin,), (twin,), kind="ping")
            await ws.send(ping.SerializeToString())
            assert (await recv_env(ws)).WhichOneof("message") == "pong"
            proc.send_signal(signal.SIGTERM)
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)
            assert ws.close_code == 1001
        assert await asyncio.to_thread(proc.wait, 15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events = [json.loads(x) for x in log.read_text().splitlines()]
    assert any(e["event"] == "rmb.relay.answered" for e in events)
    assert all(e["service"] == "rmb-relay" and e["node"] == "r.test" for e in events)


async def test_shutdown_drains_federation_in_flight(cluster):
    """close(grace) lets a slow federation POST finish (202 logged) and closes peers 1001."""
    from aiohttp import web

    got = []

    async def slow(request):
        got.append(await request.read())
        await asyncio.sleep(0.5)
        return web.Response(status=202)

    app = web.Application()
    app.router.add_post("/", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    slow_domain = f"127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    try:
        r1 = await cluster.relay()
        ia, a = await cluster.twin([r1.domain])
        ib, b = await cluster.twin([slow_domain])
        async with connect(url(r1, ia, a)) as wa:
            env = envelope((a,), (b,))
            await wa.send(env.SerializeToString())
            for _ in range(100):
                if got:
                    break
                await asyncio.sleep(0.02)
            assert got == [env.SerializeToString()]
            cluster.relays.remove(r1)
            await r1.close(grace=3)
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(wa.recv(), 5)
            assert wa.close_code == 1001
        fed = r1.test_events.of("rmb.relay.federated")
        assert fed and fed[0]["trace_id"] == env.uid and fed[0]["attrs"]["domain"] == slow_domain
    finally:
        await runner.cleanup()


def test_cli_config_precedence(tmp_path, monkeypatch):
    """--domain takes several values and repeats; env and a TOML file fill the rest; flags win."""
    from daemon_runtime.config import load_args
    from rmb_relay.daemon import _flatten, build_parser

    cfg = tmp_path / "relay.toml"
    cfg.write_text('ranker-period = 1800\nlimit = [10, 2000]\ngrace = 3\n')
    monkeypatch.setenv("RMB_RELAY_REDIS", "redis://127.0.0.1:1/2")
    monkeypatch.setenv("RMB_RELAY_GRACE", "4")
    args = load_args(build_parser(), ["--config", str(cfg), "-m", "a.example", "b.example",
                                      "--domain", "c.example", "--grace", "5"], "RMB_RELAY_")
    assert _flatten(args.domain) == ["a.example", "b.example", "c.example"]
    assert args.ranker_period == 1800 and list(args.limit) == [10, 2000]
    assert args.redis == "redis://127.0.0.1:1/2" and args.grace == 5
