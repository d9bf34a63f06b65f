"""rmb-peer handles a burst in slices (rmb_peer.daemon.YIELD_EVERY): a burst of app requests
read from Redis in one round trip is handled YIELD_EVERY at a time, and what a slice
produced (frames to the relay, backlog writes) leaves before the next slice is handled,
so the relay and the peer behind it start on the burst while this peer is still signing
it. Nothing is reordered or lost: the relay sees the requests in the order the app pushed
them and every request is answered."""
from __future__ import annotations

import asyncio
import base64
import time
import uuid

import orjson
import pytest
import redis.asyncio as aioredis

pytest.importorskip("rmb_relay.daemon", reason="rmb_relay.daemon (the relay) has not landed yet")

from rmb_peer import daemon as peer_daemon  # noqa: E402
from rmb_peer.core import LOCAL_QUEUE  # noqa: E402
from rmb_peer.envelope import parse_envelope  # noqa: E402
from tests.rmb_harness import RmbCluster  # noqa: E402

BURST = 3 * peer_daemon.YIELD_EVERY + 5


async def test_burst_output_leaves_per_slice_in_order(redis_url, tmp_path):
    async with RmbCluster(redis_url, tmp_path) as c:
        relay, a, b, pa, _pb = await c.pair("echo", {"sl.echo": lambda data: asyncio.sleep(0, data)})

        # peer A knows twin B (else the burst waits for the lookup and leaves at once)
        [warm] = await c.client(pa).call(b.id, "sl.echo", b"warm", ttl=10)
        assert warm.ok
        handled = 0                       # app requests peer A's core has taken so far
        core = pa.daemon.core
        receive_local = core.receive_local

        def counting(raw, now):
            nonlocal handled
            handled += 1
            receive_local(raw, now)
        core.receive_local = counting

        sent: list[tuple[str, int]] = []   # (uid, requests A had handled when it was written)
        [conn] = pa.daemon.links.conns.values()
        ws_send = conn.ws.send

        async def recording_send(data, *args, **kw):
            sent.append((parse_envelope(bytes(data)).uid, handled))
            return await ws_send(data, *args, **kw)
        conn.ws.send = recording_send

        arrivals: list[str] = []         # request uids from A in the order the relay got them
        server = relay.server
        on_binary = server._on_binary

        async def recording(peer, data):
            env = parse_envelope(bytes(data))
            if env.source.twin == a.id and env.WhichOneof("message") == "request":
                arrivals.append(env.uid)
            return await on_binary(peer, data)
        server._on_binary = recording

        r = aioredis.Redis.from_url(pa.redis_url)
        ret = f"msgbus.test.{uuid.uuid4()}"
        refs = [str(uuid.uuid4()) for _ in range(BURST)]
        try:
            # ONE LPUSH: the peer takes the whole burst in one read (BRPOP + RPOP COUNT)
            await r.lpush(LOCAL_QUEUE, *[orjson.dumps({
                "ver": 1, "ref": ref, "cmd": "sl.echo", "exp": 30,
                "dat": base64.b64encode(b"%d" % i).decode(), "tag": None, "dst": [b.id],
                "ret": ret, "shm": None, "now": int(time.time())}) for i, ref in enumerate(refs)])
            replies = {}
            deadline = time.monotonic() + 20
            while len(replies) < BURST and time.monotonic() < deadline:
                got = await r.brpop([ret], timeout=1)
                if got is not None:
                    reply = orjson.loads(got[1])
                    replies[reply["ref"]] = reply
        finally:
            await r.aclose()
        # every request answered with its own payload, none lost
        assert sorted(replies) == sorted(refs)
        for i, ref in enumerate(refs):
            assert "err" not in replies[ref], replies[ref]
            assert base64.b64decode(replies[ref]["dat"]) == b"%d" % i
        # written and received in the app's order (a UUID ref is the envelope uid)
        assert [uid for uid, _ in sent] == refs
        assert arrivals == refs
        # the first slice's frames were written before peer A handled the rest of the
        # burst: the burst left slice by slice, not after its last request was signed
        assert sent[0][1] == peer_daemon.YIELD_EVERY, sent[:3]
        assert sent[-1][1] == BURST
