"""Twin registry durability: twins survive the registry process being
SIGKILLed and restarted on the same --data-dir (SQLite, fsync'ed writes), and a Redis
restart cannot erase them (the registry no longer keeps them in Redis). Real processes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from daemon_runtime.redis_server import EmbeddedRedis
from rmb_peer.identity import Identity
from rmb_peer.twins import TwinDirectory, UnknownTwin


def _start(data_dir, redis_url="redis://127.0.0.1:1/0"):
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmb_relay.registry", "--listen", "127.0.0.1:0",
         "--data-dir", str(data_dir), "--redis", redis_url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("READY "), line + proc.stderr.read()
    return proc, f"http://127.0.0.1:{json.loads(line[6:])['port']}"


def _kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


async def test_twins_survive_sigkill_and_redis_restart(tmp_path):
    data = tmp_path / "registry"
    ident = Identity.from_seed(os.urandom(32), key_type="ed25519")
    other = Identity.from_seed(os.urandom(32), key_type="sr25519")
    with EmbeddedRedis() as redis:
        proc, base = _start(data, redis.url)
        try:
            d = TwinDirectory(base, cache_ttl=0)
            try:
                twin = await d.create(ident, ["r1.example:443"], None)
                updated = await d.update(ident, twin.id, ["r2.example:443"], None)
                assert updated.relays == ["r2.example:443"]
            finally:
                await d.close()
        finally:
            _kill(proc)                       # no shutdown path runs
        redis.stop()                          # and the Redis goes away and comes back empty
        redis.start()
        proc, base = _start(data, redis.url)
        try:
            d = TwinDirectory(base, cache_ttl=0)
            try:
                got = await d.get(twin.id)
                assert got.account == ident.account and got.relays == ["r2.example:443"]
                assert (await d.get_by_account(ident.account)).id == twin.id
                second = await d.create(other, ["r1.example:443"], None)
                assert second.id == twin.id + 1          # ids are never reused
                with pytest.raises(UnknownTwin):
                    await d.get(twin.id + 2)
            finally:
                await d.close()
        finally:
            _kill(proc)


def test_unusable_data_dir_is_a_precise_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = subprocess.run(
        [sys.executable, "-m", "rmb_relay.registry", "--listen", "127.0.0.1:0",
         "--data-dir", str(blocker / "sub")], capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert "--data-dir" in proc.stderr and str(blocker / "sub") in proc.stderr


def test_unreachable_redis_names_url_and_flag():
    proc = subprocess.run(
        [sys.executable, "-m", "rmb_relay.registry", "--listen", "127.0.0.1:0",
         "--redis", "redis://127.0.0.1:1/0"], capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0
    assert "redis://127.0.0.1:1/0" in proc.stderr and "--redis" in proc.stderr
