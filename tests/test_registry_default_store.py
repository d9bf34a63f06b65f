"""rmb-registry started with no storage flag keeps its twin table in a durable default data
directory (SQLite), never in a Redis whose restart would erase it; Redis mode stays
available when chosen with --redis and reports whether it is durable. Real processes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import redis as redis_sync

from daemon_runtime.redis_server import EmbeddedRedis
from rmb_peer.identity import Identity
from rmb_peer.twins import TwinDirectory
from rmb_relay.registry import default_data_dir


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RMB_REGISTRY_") and k not in ("STATE_DIRECTORY", "XDG_STATE_HOME")}
    env["HOME"] = str(tmp_path / "home")
    env.update(extra)
    return env


def _start(tmp_path: Path, env: dict[str, str], *flags: str):
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmb_relay.registry", "--listen", "127.0.0.1:0",
         "--log", str(tmp_path / "registry.jsonl"), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    line = proc.stdout.readline()
    assert line.startswith("READY "), line + proc.stderr.read()
    return proc, f"http://127.0.0.1:{json.loads(line[6:])['port']}"


def _kill(proc, sig=signal.SIGKILL) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        proc.wait(10)
    proc.stdout.close()
    proc.stderr.close()


def _health(base: str) -> dict:
    try:
        with urllib.request.urlopen(base + "/health", timeout=10) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


async def test_default_start_keeps_twins_across_sigkill(tmp_path):
    """`rmb-registry --listen ...` alone: twins land in ~/.local/state/relay-suite/
    rmb-registry and survive a SIGKILL of the registry (and any Redis on the machine)."""
    env = _env(tmp_path)
    ident = Identity.from_seed(os.urandom(32), key_type="ed25519")
    proc, base = _start(tmp_path, env)
    try:
        assert _health(base)["store"] == "sqlite" and _health(base)["durable"] is True
        d = TwinDirectory(base, cache_ttl=0)
        try:
            twin = await d.create(ident, ["r1.example:443"], None)
        finally:
            await d.close()
    finally:
        _kill(proc)
    store = tmp_path / "home" / ".local" / "state" / "relay-suite" / "rmb-registry"
    assert (store / "registry.sqlite3").exists()
    proc, base = _start(tmp_path, env)
    try:
        d = TwinDirectory(base, cache_ttl=0)
        try:
            got = await d.get(twin.id)
            assert got.account == ident.account and got.relays == ["r1.example:443"]
        finally:
            await d.close()
    finally:
        _kill(proc, signal.SIGTERM)             # flushes the event log
    events = [json.loads(x) for x in (tmp_path / "registry.jsonl").read_text().splitlines()]
    storage = [e["attrs"] | {"level": e["level"]} for e in events
               if e["event"] == "rmb.registry.storage"]
    assert storage and storage[0]["store"] == "sqlite" and storage[0]["durable"] is True
    assert storage[0]["path"] == str(store)


def test_state_directory_wins_then_xdg(tmp_path):
    """systemd's $STATE_DIRECTORY (StateDirectory= in the unit) is the default on a
    service; $XDG_STATE_HOME next; relative values are ignored (XDG spec)."""
    unit_dir = tmp_path / "var-lib"
    proc, base = _start(tmp_path, _env(tmp_path, STATE_DIRECTORY=str(unit_dir),
                                       XDG_STATE_HOME=str(tmp_path / "xdg")))
    try:
        assert _health(base)["durable"] is True
    finally:
        _kill(proc)
    assert (unit_dir / "registry.sqlite3").exists()
    assert not (tmp_path / "xdg").exists()
    assert default_data_dir({"XDG_STATE_HOME": "/x/state", "HOME": "/h"}) == \
        Path("/x/state/relay-suite/rmb-registry")
    assert default_data_dir({"XDG_STATE_HOME": "rel", "HOME": "/h"}) == \
        Path("/h/.local/state/relay-suite/rmb-registry")
    assert default_data_dir({"STATE_DIRECTORY": "/a:/b", "HOME": "/h"}) == Path("/a")


def test_explicit_redis_mode_reports_its_durability(tmp_path):
    """--redis URL alone keeps Redis mode; a Redis without appendonly is reported
    durable: false in /health and by a warning line at start."""
    with EmbeddedRedis() as srv:
        client = redis_sync.Redis.from_url(srv.url)
        try:
            proc, base = _start(tmp_path, _env(tmp_path), "--redis", srv.url)
            try:
                health = _health(base)
                assert health["store"] == "redis" and health["durable"] is True
            finally:
                _kill(proc, signal.SIGTERM)
            client.config_set("appendonly", "no")
            proc, base = _start(tmp_path, _env(tmp_path), "--redis", srv.url)
            try:
                assert _health(base)["durable"] is False
            finally:
                _kill(proc, signal.SIGTERM)
        finally:
            client.close()
    events = [json.loads(x) for x in (tmp_path / "registry.jsonl").read_text().splitlines()]
    storage = [e["attrs"] | {"level": e["level"]} for e in events
               if e["event"] == "rmb.registry.storage"]
    assert [e["durable"] for e in storage] == [True, False]
    assert storage[1]["level"] == "warning" and storage[1]["path"] == srv.url
    assert not (tmp_path / "home").exists()     # no SQLite store was made in Redis mode
