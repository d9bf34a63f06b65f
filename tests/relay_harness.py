"""Raw-WebSocket test harness for rmb-relay: a real twin registry and in-process relays on
127.0.0.1 over the session Redis, twins with fresh ed25519 keys, and helpers to build
envelopes and tokens (tests/test_relay_daemon.py, tests/test_relay_burst.py). The peer-level
harness (rmb-peer, apps) is tests/rmb_harness.py."""
from __future__ import annotations

import asyncio
import io
import json
import os
import time

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from daemon_runtime.eventlog import EventLog
from daemon_runtime.redis_server import free_port
from rmb_peer.challenge import sign_envelope
from rmb_peer.envelope import Envelope, new_uid
from rmb_peer.events import RMB_EVENTS
from rmb_relay.events import RELAY_EVENTS
from rmb_peer.identity import Identity
from rmb_peer.token import make_token
from rmb_peer.twins import TwinDirectory
from rmb_relay.daemon import RelayServer
from rmb_relay.registry import RegistryServer


class Events:
    def __init__(self, service: str, node: str):
        self.buf = io.StringIO()
        self.log = EventLog(service, node, [RMB_EVENTS, RELAY_EVENTS], sink=self.buf,
                            min_level="debug")

    def names(self) -> list[dict]:
        return [json.loads(line) for line in self.buf.getvalue().splitlines() if line.strip()]

    def of(self, event: str) -> list[dict]:
        return [e for e in self.names() if e["event"] == event]


#: twin id -> Identity of every twin the harness registered: envelope() signs with it, as
#: a real peer does (relays verify federated envelopes)
IDENTITIES: dict[int, Identity] = {}


class Cluster:
    """A registry plus relays on 127.0.0.1; twins registered with fresh ed25519 keys."""

    def __init__(self, redis_url: str):
        self.redis_url = redis_url
        self.relays: list[RelayServer] = []
        self.events: dict[str, Events] = {}

    async def __aenter__(self):
        self.reg_events = Events("rmb-registry", "reg")
        self.registry = RegistryServer("127.0.0.1", 0, self.redis_url, self.reg_events.log)
        port = await self.registry.start()
        self.registry_url = f"http://127.0.0.1:{port}"
        self.directory = TwinDirectory(self.registry_url)
        return self

    async def __aexit__(self, *exc):
        for relay in self.relays:
            await relay.close(grace=0.5)
        await self.directory.close()
        await self.registry.close()

    async def relay(self, registry_url: str | None = None, **kw) -> RelayServer:
        port = free_port()
        domain = f"127.0.0.1:{port}"
        ev = Events("rmb-relay", domain)
        relay = RelayServer(domains=[domain], host="127.0.0.1", port=port,
                            redis_url=self.redis_url, registry_url=registry_url or self.registry_url,
                            events=ev.log, **kw)
        relay.directory.cache_ttl = 0.5
        await relay.start()
        relay.test_events = ev
        relay.domain = domain
        self.relays.append(relay)
        return relay

    async def twin(self, relays: list[str]):
        ident = Identity.from_seed(os.urandom(32), key_type="ed25519")
        twin = await self.directory.create(ident, relays, None)
        IDENTITIES[twin.id] = ident
        return ident, twin.id


def url(relay: RelayServer, ident: Identity, twin_id: int, sid=None, ttl=60, now=None) -> str:
    tok = make_token(ident, twin_id, sid, int(now if now is not None else time.time()), ttl)
    return f"ws://127.0.0.1:{relay.port}/?{tok}"


def envelope(src, dst, *, kind="request", ttl=60, payload=b"hello", tags=None, ts=None) -> Envelope:
    env = Envelope()
    env.uid = new_uid()
    env.timestamp = int(ts if ts is not None else time.time())
    env.expiration = ttl
    env.source.twin = src[0]
    if len(src) > 1 and src[1] is not None:
        env.source.connection = src[1]
    if dst is not None:
        env.destination.twin = dst[0]
        if len(dst) > 1 and dst[1] is not None:
            env.destination.connection = dst[1]
    if kind == "request":
        env.request.command = "test.echo"
    elif kind == "response":
        env.response.SetInParent()
    elif kind == "ping":
        env.ping.SetInParent()
    if tags:
        env.tags = tags
    env.plain = payload
    sign(env)
    return env


def sign(env: Envelope) -> Envelope:
    """Signs env with its source twin's key when the harness registered that twin (call
    again after changing a field)."""
    ident = IDENTITIES.get(env.source.twin)
    if ident is not None:
        env.ClearField("signature")
        sign_envelope(env, ident)
    return env


async def recv_env(ws, timeout=5.0) -> Envelope:
    data = await asyncio.wait_for(ws.recv(), timeout)
    assert isinstance(data, bytes), f"expected a binary frame, got {data!r}"
    return Envelope.FromString(data)


async def roundtrip(wa, a, wb, b):
    """A -> B request delivered: the relay still serves these twins."""
    env = envelope((a,), (b,), payload=os.urandom(16))
    await wa.send(env.SerializeToString())
    got = await recv_env(wb)
    assert got.uid == env.uid and got.plain == env.plain


async def status_of(uri: str) -> int:
    with pytest.raises(InvalidStatus) as info:
        async with connect(uri, open_timeout=5):
            pass
    return info.value.response.status_code
