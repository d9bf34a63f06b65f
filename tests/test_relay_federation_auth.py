"""Federation in is authenticated and bounded: the receiving relay
verifies the envelope signature with the source twin's account key before queuing,
refuses unknown or foreign destinations without touching Redis, limits each source relay,
and junk can never evict legitimate queued envelopes. Real sockets, registry and Redis."""
from __future__ import annotations

import os

import aiohttp
import pytest
from websockets.asyncio.client import connect

from rmb_peer.challenge import sign_envelope
from rmb_peer.identity import Identity
from tests.relay_harness import Cluster, envelope, recv_env, roundtrip, url


@pytest.fixture
async def cluster(redis_url):
    async with Cluster(redis_url) as c:
        yield c


async def _post(relay, data: bytes) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{relay.port}/", data=data) as resp:
            return resp.status, await resp.text()


async def test_spoofed_unsigned_and_unknown_refused_and_nothing_queued(cluster):
    relay = await cluster.relay()
    ia, a = await cluster.twin(["other.example:443"])     # a real twin on another relay
    ib, b = await cluster.twin([relay.domain])            # offline here
    _ic, c = await cluster.twin(["other.example:443"])    # not served by this relay
    mallory = Identity.from_seed(os.urandom(32), key_type="ed25519")

    spoofed = envelope((a,), (b,))
    spoofed.ClearField("signature")
    sign_envelope(spoofed, mallory)                       # claims twin a, signed by mallory
    status, text = await _post(relay, spoofed.SerializeToString())
    assert status == 401 and "bad envelope signature" in text

    unsigned = envelope((a,), (b,))
    unsigned.ClearField("signature")
    assert (await _post(relay, unsigned.SerializeToString()))[0] == 401

    tampered = envelope((a,), (b,), payload=b"pay me 1")
    tampered.plain = b"pay me 9"
    assert (await _post(relay, tampered.SerializeToString()))[0] == 401

    no_source = envelope((a,), (b,))
    no_source.ClearField("source")
    assert (await _post(relay, no_source.SerializeToString()))[0] == 401

    unknown_src = envelope((3_999_000,), (b,))
    assert (await _post(relay, unknown_src.SerializeToString()))[0] == 401

    for i in range(20):                                    # random unknown destinations
        status, text = await _post(relay, envelope((a,), (3_000_000 + i,)).SerializeToString())
        assert status == 404 and "unknown twin destination" in text
    status, text = await _post(relay, envelope((a,), (c,)).SerializeToString())
    assert status == 421

    keys = await relay.redis.keys(relay.queues.prefix + "*")
    assert keys == []                                      # nothing was queued at all
    ok = envelope((a,), (b,))
    assert (await _post(relay, ok.SerializeToString()))[0] == 202
    async with connect(url(relay, ib, b)) as wb:
        got = await recv_env(wb)
        assert got.uid == ok.uid
    refused = relay.test_events.of("rmb.relay.rejected")
    assert refused and len(refused) <= 25                  # rate-limited lines


async def test_junk_cannot_evict_legitimate_queued_envelopes(cluster):
    """10,500 junk posts evicted all 100 legitimate queued requests before; now junk is
    refused before the queue and the 100 are replayed intact and in order."""
    relay = await cluster.relay(queue_maxlen=150, queue_per_source=150)
    ia, a = await cluster.twin(["other.example:443"])
    ib, b = await cluster.twin([relay.domain])
    mallory = Identity.from_seed(os.urandom(32), key_type="ed25519")
    legit = [envelope((a,), (b,), payload=i.to_bytes(2, "big")) for i in range(100)]
    async with aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{relay.port}/"
        for env in legit:
            async with http.post(base, data=env.SerializeToString()) as resp:
                assert resp.status == 202
        statuses = set()
        for _ in range(300):
            junk = envelope((a,), (b,), payload=os.urandom(32))
            junk.ClearField("signature")
            sign_envelope(junk, mallory)
            async with http.post(base, data=junk.SerializeToString()) as resp:
                statuses.add(resp.status)
        assert statuses == {401}
        # a legitimate sender filling the queue is told so (429), it never evicts
        extra = [envelope((a,), (b,)) for _ in range(60)]
        codes = []
        for env in extra:
            async with http.post(base, data=env.SerializeToString()) as resp:
                codes.append(resp.status)
        assert codes.count(202) == 50 and codes.count(429) == 10
    async with connect(url(relay, ib, b)) as wb:
        got = [await recv_env(wb) for _ in range(150)]
    assert [g.uid for g in got[:100]] == [e.uid for e in legit]


async def test_per_source_relay_limit(cluster):
    relay = await cluster.relay(federation_limit=(5, 10_000_000))
    ia, a = await cluster.twin(["other.example:443"])
    ib, b = await cluster.twin([relay.domain])
    codes = [(await _post(relay, envelope((a,), (b,)).SerializeToString()))[0] for _ in range(7)]
    # the first five pass unless the 60 s window turned in between (then all pass)
    assert codes[:5] == [202] * 5 and (codes[5:] == [429, 429] or 429 not in codes)
    # local traffic is unaffected
    ic, c = await cluster.twin([relay.domain])
    async with connect(url(relay, ib, b)) as wb, connect(url(relay, ic, c)) as wc:
        for _ in range(7 - codes.count(429)):
            await recv_env(wb)
        await roundtrip(wc, c, wb, b)


async def test_two_relays_signed_traffic_still_federates(cluster):
    r1 = await cluster.relay()
    r2 = await cluster.relay()
    ia, a = await cluster.twin([r1.domain])
    ib, b = await cluster.twin([r2.domain])
    async with connect(url(r1, ia, a)) as wa, connect(url(r2, ib, b)) as wb:
        await roundtrip(wa, a, wb, b)
        forged = envelope((a,), (b,))
        forged.plain = b"changed after signing"
        await wa.send(forged.SerializeToString())
        err = await recv_env(wa, timeout=10)       # r2 refused (401): r1 tells the sender
        assert err.uid == forged.uid and "bad envelope signature" in err.error.message
        await roundtrip(wa, a, wb, b)
