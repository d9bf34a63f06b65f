"""Redis durability for RMB's queues (queue side): the embedded Redis
runs with the append-only file in a data directory (daemon_runtime/redis_server.py), so a
Redis that is SIGKILLed and restarted on the same directory still holds the relay's
offline queues and the peers' Redis queues. Real processes: redis-server, the twin
registry and rmb-relay as subprocesses; the twins are raw WebSocket clients with real
tokens and signed envelopes."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import redis
from websockets.asyncio.client import connect

from daemon_runtime.redis_server import EmbeddedRedis, free_port
from rmb_peer.twins import TwinDirectory
from tests.relay_harness import IDENTITIES, envelope, recv_env
from rmb_peer.identity import Identity
from rmb_peer.token import make_token

REPO = Path(__file__).resolve().parent.parent
QUEUED = 40


def _spawn(argv: list[str]) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([sys.executable, "-m", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise AssertionError(f"{argv[0]} did not start: {line}{proc.stderr.read()[-2000:]}")
    return proc, json.loads(line[6:])


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _wait_until(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


async def test_offline_queue_survives_redis_sigkill(tmp_path):
    srv = EmbeddedRedis(data_dir=tmp_path / "redis").start()
    procs: list[subprocess.Popen] = []
    try:
        reg, info = _spawn(["rmb_relay.registry", "--listen", "127.0.0.1:0",
                            "--data-dir", str(tmp_path / "registry"), "--redis", srv.url])
        procs.append(reg)
        registry = f"http://127.0.0.1:{info['port']}"
        port = free_port()
        domain = f"127.0.0.1:{port}"
        relay, _ = _spawn(["rmb_relay.daemon", "--domain", domain, "--listen", domain,
                           "--redis", srv.url, "--registry", registry,
                           "--log", str(tmp_path / "relay.jsonl")])
        procs.append(relay)

        directory = TwinDirectory(registry, cache_ttl=0)
        twins = []
        for _ in range(2):
            ident = Identity.from_seed(os.urandom(32), key_type="ed25519")
            twin = await directory.create(ident, [domain], None)
            IDENTITIES[twin.id] = ident
            twins.append((ident, twin.id))
        await directory.close()
        (ia, a), (ib, b) = twins

        def ws_url(ident, twin_id):
            return f"ws://{domain}/?{make_token(ident, twin_id, None, int(time.time()), 300)}"

        # A sends requests to B while B is offline: the relay queues them in Redis
        sent = []
        async with connect(ws_url(ia, a)) as wa:
            for i in range(QUEUED):
                env = envelope((a,), (b,), payload=f"queued {i}".encode(), ttl=600)
                sent.append(env.uid)
                await wa.send(env.SerializeToString())
            r = redis.Redis.from_url(srv.url)
            qkey = f"rmb.relay.{domain}.queue.{b}"
            _wait_until(lambda: r.xlen(qkey) == QUEUED, 30, f"{QUEUED} entries in {qkey}")
            # a peer's local queue on the same server (another database) must survive too
            peer_db = redis.Redis.from_url(srv.url.rsplit("/", 1)[0] + "/3")
            peer_db.lpush("msgbus.system.local", b'{"ver":1,"ref":"r1"}')
            r.close()
            peer_db.close()

        # Redis dies without any shutdown path and comes back on the same data dir
        srv.kill()
        srv.start()
        r = redis.Redis.from_url(srv.url)
        assert r.xlen(qkey) == QUEUED
        r.close()
        peer_db = redis.Redis.from_url(srv.url.rsplit("/", 1)[0] + "/3")
        assert peer_db.lrange("msgbus.system.local", 0, -1) == [b'{"ver":1,"ref":"r1"}']
        peer_db.close()

        # B comes online: every queued request is replayed, in order
        got = []
        async with connect(ws_url(ib, b)) as wb:
            while len(got) < QUEUED:
                got.append((await recv_env(wb, timeout=30)).uid)
        assert got == sent
    finally:
        for proc in procs:
            _stop(proc)
        srv.stop()
    assert (tmp_path / "redis").is_dir()          # a given data dir is never deleted


def test_temp_dir_is_removed_and_given_dir_kept(tmp_path):
    """Without a data dir the server is throwaway (stop() removes it: a restart is empty);
    with one, stop() keeps it and a restart sees the data."""
    srv = EmbeddedRedis().start()
    kept = EmbeddedRedis(data_dir=tmp_path / "d")
    r = redis.Redis.from_url(srv.url)
    r2 = redis.Redis.from_url(kept.url)
    try:
        r.set("k", b"v")
        temp = srv.dir
        srv.stop()
        assert not os.path.exists(temp)
        srv.start()
        assert r.get("k") is None
        kept.start()
        r2.set("k", b"v")
        kept.stop()                       # SIGTERM: Redis fsyncs the AOF and exits
        kept.start()
        assert r2.get("k") == b"v"
        assert r2.config_get("appendonly") == {"appendonly": "yes"}
    finally:
        srv.stop()
        kept.stop()
        r.close()
        r2.close()


def test_unwritable_data_dir_is_a_precise_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    try:
        EmbeddedRedis(data_dir=blocker / "sub").start()
    except (OSError, RuntimeError) as exc:
        assert str(blocker) in str(exc)
    else:
        raise AssertionError("a data dir under a file was accepted")
