"""rmb-relay's bounds at the HTTP upgrade, on a real relay process (127.0.0.1, port 0, the
session Redis, a real registry): the session id length (rmb_peer.token.MAX_SID_BYTES),
Sec-WebSocket-Version other than 13 (RFC 6455 4.2.2 / 4.4: 426 naming the version
spoken), and request lines aiohttp cannot parse (answered 400 with one rate-limited event
line with a reason, not a traceback on stderr)."""
from __future__ import annotations

import asyncio
import io
import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from daemon_runtime.redis_server import free_port
from rmb_peer.identity import Identity
from rmb_peer.token import JWT_ALG, MAX_SID_BYTES, _JWS, claims_json, make_token
from rmb_peer.twins import TwinDirectory
from rmb_relay.registry import RegistryServer
from daemon_runtime.eventlog import EventLog
from rmb_peer.events import RMB_EVENTS

REPO = Path(__file__).resolve().parent.parent


def _signed(ident: Identity, twin: int, sid: str) -> str:
    """A validly signed token whatever the sid (make_token refuses an over-long one)."""
    now = int(time.time())
    return _JWS.encode(claims_json(twin, sid, now, now + 600), ident, algorithm=JWT_ALG,
                       headers={"typ": "JWT"})


async def _http(port: int, head: bytes) -> tuple[int, dict[str, str]]:
    """Sends one raw request head; returns the answer's status and headers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        await writer.drain()
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    finally:
        writer.close()
    lines = raw.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return int(lines[0].split()[1]), headers


def _upgrade(path: str, version: str = "13") -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: {version}\r\n\r\n").encode()


@pytest.fixture
async def relay_proc(redis_url, tmp_path):
    """(port, twin id, Identity, event log path, process) of an rmb-relay subprocess."""
    reg = RegistryServer("127.0.0.1", 0, None, EventLog("rmb-registry", "reg", [RMB_EVENTS],
                                                        sink=io.StringIO()),
                         data_dir=str(tmp_path / "registry"))
    await reg.start()
    port = free_port()
    log = tmp_path / "relay.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmb_relay.daemon", "--domain", f"127.0.0.1:{port}",
         "--listen", f"127.0.0.1:{port}", "--redis", redis_url, "--registry", reg.url,
         "--log", str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line.startswith("READY "), line + proc.stderr.read()
        ident = Identity.from_seed(os.urandom(32), key_type="ed25519")
        d = TwinDirectory(reg.url, cache_ttl=0)
        try:
            twin = (await d.create(ident, [f"127.0.0.1:{port}"], None)).id
        finally:
            await d.close()
        yield port, twin, ident, log, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        await reg.close()


def _events(log: Path, name: str) -> list[dict]:
    return [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == name]


async def test_session_id_bounded_and_version_13_only(relay_proc):
    port, twin, ident, log, proc = relay_proc
    status, _ = await _http(port, _upgrade("/?" + _signed(ident, twin, "s" * 2500)))
    assert status == 401
    status, _ = await _http(port, _upgrade("/?" + _signed(ident, twin, "s" * (MAX_SID_BYTES + 1))))
    assert status == 401
    longest = "s" * MAX_SID_BYTES                 # the bound itself is accepted
    async with connect(f"ws://127.0.0.1:{port}/?" + make_token(ident, twin, longest,
                                                              int(time.time()))) as ws:
        await ws.ping()
    for version in ("8", "7", "14", ""):
        status, headers = await _http(
            port, _upgrade("/?" + make_token(ident, twin, "v", int(time.time())), version))
        assert status == 426 and headers.get("sec-websocket-version") == "13", (version, status)
    with pytest.raises(ValueError):
        make_token(ident, twin, "s" * (MAX_SID_BYTES + 1), int(time.time()))
    proc.send_signal(signal.SIGTERM)
    proc.wait(15)
    refused = [e["attrs"] for e in _events(log, "rmb.relay.auth_failed")]
    assert any(a["status"] == 401 and "sid longer than" in a["reason"] for a in refused)
    assert any(a["status"] == 426 and "Sec-WebSocket-Version" in a["reason"] for a in refused)


async def test_bad_request_lines_answered_400_without_tracebacks(relay_proc):
    port, _twin, _ident, log, proc = relay_proc
    heads = []
    for i in range(97):
        heads.append(b"GET /" + b"a" * (9000 + i) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        heads.append("GET /\u00e9t\u00e9\u2603 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    heads += [b"G{T / HTTP/1.1\r\nHost: x\r\n\r\n"] * 3        # bad method (aiohttp: debug)
    statuses = [(await _http(port, h))[0] for h in heads]
    assert statuses == [400] * len(heads)
    metrics = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read())
    counted = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.decode().splitlines()
                  if line.startswith("rmb_relay_bad_requests_total"))
    assert counted == len(heads)                   # every refusal counted, by error class
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0
    stderr = proc.stderr.read()
    assert "Traceback" not in stderr and "Error handling request" not in stderr, stderr[-3000:]
    bad = [e for e in _events(log, "rmb.relay.bad_request")]
    assert bad and all(e["attrs"]["status"] == 400 and e["attrs"]["reason"] for e in bad)
    reasons = {e["attrs"]["reason"].split(":")[0] for e in bad}
    assert len(reasons) >= 2                       # too long / not ASCII told apart
    assert len(bad) < 40                           # rate-limited lines, not one per request
