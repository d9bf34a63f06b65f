"""RmbClient.call(..., ref=...): the caller chooses the request's reference and every Reply
carries it, so replies are correlated without reading logs (the launcher used
to recover the ref from the app log). Wire semantics as rmb-rs (src/peer/storage/mod.rs:
JsonOutgoingRequest `ref` is an optional free string kept in the peer's backlog and
echoed as `ref` in each JsonResponse); with this suite's rmb-peer a UUID ref is the
envelope uid. Real Redis; real peers and relay for the end-to-end cases."""
from __future__ import annotations

import asyncio
import json

import orjson
import pytest
import redis.asyncio as aioredis

from rmb_peer.client import RmbClient
from rmb_peer.envelope import new_uid
from tests.rmb_harness import RmbCluster, events_of


async def _pushed(r, queue: str = "msgbus.system.local", timeout: float = 10.0) -> dict:
    item = await r.brpop([queue], timeout=timeout)
    assert item is not None, f"nothing pushed to {queue}"
    return orjson.loads(item[1])


async def test_ref_on_the_wire_and_in_the_reply(redis_url):
    """No peer: the request JSON carries the caller's ref (any string, as rmb-rs allows);
    a reply with that ref (what a peer writes) resolves the call, Reply.ref set; a reply
    with another ref does not."""
    r = aioredis.Redis.from_url(redis_url)
    client = RmbClient(redis_url)
    try:
        ref = "order-42/attempt-1"
        call = asyncio.ensure_future(client.call([7], "calc.add", b"[1,2]", ttl=30, ref=ref))
        req = await _pushed(r)
        assert req["ref"] == ref and req["cmd"] == "calc.add" and req["dst"] == [7]
        assert {"ver", "exp", "dat", "ret", "now"} <= set(req)
        stray = {"ver": 1, "ref": "someone-else", "dat": "", "src": "7", "now": 1}
        await r.lpush(req["ret"], json.dumps(stray))
        reply = {"ver": 1, "ref": ref, "dat": "Mw==", "src": "7", "shm": None, "now": 1}
        await r.lpush(req["ret"], json.dumps(reply))
        [got] = await asyncio.wait_for(call, 10)
        assert got.ok and got.ref == ref and got.data == b"3" and got.src == "7"
        # the default ref is a fresh UUID, also on the Reply
        call = asyncio.ensure_future(client.call(7, "calc.add", b"x", ttl=30))
        req = await _pushed(r)
        assert len(req["ref"]) == 36 and req["ref"].count("-") == 4
        await r.lpush(req["ret"], json.dumps({**reply, "ref": req["ref"]}))
        [got] = await asyncio.wait_for(call, 10)
        assert got.ref == req["ref"]
    finally:
        await client.close()
        await r.aclose()


@pytest.mark.parametrize("bad", ["", "x" * 257, 42, b"bytes"])
async def test_bad_ref_is_refused(redis_url, bad):
    async with RmbClient(redis_url) as client:
        with pytest.raises(ValueError, match="ref"):
            await client.call(7, "calc.add", b"", ttl=5, ref=bad)


async def test_ref_in_flight_is_refused(redis_url):
    r = aioredis.Redis.from_url(redis_url)
    async with RmbClient(redis_url) as client:
        first = asyncio.ensure_future(client.call(7, "calc.add", b"", ttl=30, ref="dup"))
        req = await _pushed(r)
        with pytest.raises(ValueError, match="in flight"):
            await client.call(8, "calc.add", b"", ttl=30, ref="dup")
        await r.lpush(req["ret"], json.dumps({"ver": 1, "ref": "dup", "dat": "", "src": "7",
                                              "now": 1}))
        [got] = await asyncio.wait_for(first, 10)
        assert got.ref == "dup"
        # answered: the ref is free again
        again = asyncio.ensure_future(client.call(7, "calc.add", b"", ttl=30, ref="dup"))
        req = await _pushed(r)
        await r.lpush(req["ret"], json.dumps({"ver": 1, "ref": "dup", "dat": "", "src": "7",
                                              "now": 1}))
        assert (await asyncio.wait_for(again, 10))[0].ref == "dup"
    await r.aclose()


async def test_refs_through_real_peers(redis_url, tmp_path):
    """Through rmb-peer and a relay: concurrent calls with their own refs each get their
    own reply (payload and ref match); a UUID ref is the envelope uid (the service sees
    it as the request's ref; the relay logs it as the trace id)."""
    async with RmbCluster(redis_url, tmp_path) as cluster:
        relay = await cluster.start_relay()
        a = await cluster.new_twin([relay])
        b = await cluster.new_twin([relay])
        pa = await cluster.start_peer(a, [relay])
        pb = await cluster.start_peer(b, [relay])
        seen: list[bytes] = []

        async def echo(data: bytes) -> bytes:
            seen.append(data)
            return data
        cluster.service(pb, "echo", {"ref.echo": echo})
        client = cluster.client(pa)
        refs = [f"job-{i}" for i in range(20)]
        results = await asyncio.gather(*(client.call(b.id, "ref.echo", ref.encode(), ttl=20,
                                                     ref=ref) for ref in refs))
        for ref, [reply] in zip(refs, results):
            assert reply.ok and reply.ref == ref and reply.data == ref.encode()

        # a UUID ref is the envelope uid: read the request the peer hands to a service
        uid = new_uid()
        rb = aioredis.Redis.from_url(pb.redis_url)
        call = asyncio.ensure_future(client.call(b.id, "ref.raw", b"raw", ttl=20, ref=uid))
        incoming = await _pushed(rb, "msgbus.ref.raw")
        assert incoming["ref"] == uid
        await rb.lpush("msgbus.system.reply", json.dumps(
            {"ver": 1, "ref": incoming["ref"], "dat": "b2s=", "dst": incoming["src"], "now": 1}))
        [reply] = await asyncio.wait_for(call, 20)
        assert reply.ok and reply.ref == uid and reply.data == b"ok"
        assert uid in {e["trace_id"] for e in events_of(relay.log)}
        await rb.aclose()
