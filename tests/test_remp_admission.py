"""Admission control at the full node, on real processes (1 shard x 4 validators + one full
node with --max-pending 10): a burst past the bound is answered 503 with Retry-After (HTTP)
and a GraphQL error with extensions.code BACKPRESSURE and retryAfter (postRequests); a
client that retries each refused message after its Retry-After gets every one finalized,
exactly once; refusals are counted by reason in /metrics. Client side: the documented HTTP
and GraphQL API only."""
from __future__ import annotations

import asyncio
import base64
import time

import aiohttp
import pytest

from remp_node.testnet.localnet import LocalNet
from tests.remp_fixtures import transfers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]




async def test_full_node_at_its_bound_refuses_with_retry_after_and_retried_messages_finalize(tmp_path):
    ln = LocalNet(tmp_path, shards=1, validators_per_shard=4, mc_catchain_lifetime=20.0, block_interval=0.2,
                  master_block_interval=0.1, start_timeout=120.0)
    net = await ln.init()
    ln.daemons["fullnode1"].argv += ["--max-pending", "10"]
    await ln.start()
    try:
        async with aiohttp.ClientSession() as s:
            api = ln.api

            async def post(boc):
                async with s.post(api + "/messages", data=base64.b64encode(boc)) as r:
                    return r.status, r.headers.get("Retry-After"), await r.json()
            bocs = transfers(net, 40, 100)
            first = await asyncio.gather(*(post(b) for b in bocs))
            # at once, while the first ten are not final: postRequests is refused too
            extra = transfers(net, 1, 900)[0]
            async with s.post(api + "/graphql", json={
                    "query": "mutation($r: [Request!]!) { postRequests(requests: $r) }",
                    "variables": {"r": [{"body": base64.b64encode(extra).decode()}]}}) as r:
                doc = await r.json()
            refused = [(b, ra, d) for b, (st, ra, d) in zip(bocs, first) if st == 503]
            assert refused, "no refusal past --max-pending 10"
            assert sum(1 for st, _, _ in first if st == 202) >= 10
            for _, ra, d in refused:
                assert ra is not None and int(ra) >= 1 and d["retry_after"] == int(ra)
                assert d["reason"] == "pending_full" and "not accepted" in d["error"]
            (err,) = doc["errors"]
            assert err["extensions"]["code"] == "BACKPRESSURE", doc
            assert err["extensions"]["retryAfter"] >= 1 and err["extensions"]["reason"] == "pending_full"
            # the refused ones were neither stored nor sent
            async with s.get(f"{api}/messages/{refused[0][2]['message_id']}") as r:
                assert r.status == 404
            # a client that honours Retry-After: every message accepted, then finalized
            ids = {d["message_id"] for st, _, d in first if st == 202}
            todo = [b for b, _, _ in refused] + [extra]
            end = time.monotonic() + 300
            while todo and time.monotonic() < end:
                wait = 1
                again = []
                for b in todo:
                    st, ra, d = await post(b)
                    if st == 202:
                        ids.add(d["message_id"])
                    else:
                        assert st == 503, (st, d)
                        again.append(b)
                        wait = max(wait, int(ra))
                todo = again
                if todo:
                    await asyncio.sleep(wait)
            assert not todo and len(ids) == 41

            async def all_final():
                out = {}
                for mid in ids:
                    async with s.get(f"{api}/messages/{mid}") as r:
                        d = await r.json()
                    if d["outcome"]["final"]:
                        out[mid] = d
                return out
            final = {}
            end = time.monotonic() + 300
            while len(final) < len(ids) and time.monotonic() < end:
                final = await all_final()
                await asyncio.sleep(1.0)
            assert {d["outcome"]["outcome"] for d in final.values()} == {"finalized"} and len(final) == 41
            fn = net.node("fullnode1").key_id.hex()
            for mid, d in final.items():      # exactly once in the chain
                blocks = {r["block_id"] for r in d["receipts"] if r["kind"] == "Finalized" and r["source_id"] == fn}
                assert len(blocks) == 1, (mid, blocks)
            async with s.get(api + "/metrics") as r:
                text = await r.text()
            line = next(x for x in text.splitlines()
                        if x.startswith("remp_api_refused_total") and 'reason="pending_full"' in x)
            assert float(line.split()[-1]) >= len(refused) + 1
    finally:
        await ln.stop()
