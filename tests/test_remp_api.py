"""The full node's API on a small network of processes (1 shard x 4 validators + full node):
GraphQL (ever-q-server's shape) over graphql-transport-ws, the Redis stream with a consumer
group, and Redis unreachable (must-show 5 GraphQL half; item 6)."""
from __future__ import annotations

import asyncio
import base64
import json
import time

import aiohttp
import pytest
import redis

from remp_node.testnet.localnet import LocalNet
from tests.remp_fixtures import transfers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ORDER = ["SentToValidators", "PutIntoQueue", "AcceptedByQueue", "IncludedIntoBlock",
         "IncludedIntoAcceptedBlock", "Finalized"]




async def gql_ws(session, url):
    ws = await session.ws_connect(url, protocols=["graphql-transport-ws"])
    await ws.send_json({"type": "connection_init", "payload": {}})
    ack = await ws.receive_json(timeout=30)
    assert ack["type"] == "connection_ack"
    return ws


async def test_graphql_and_redis_stream(tmp_path, redis_url):
    ln = LocalNet(tmp_path, shards=1, validators_per_shard=4, mc_catchain_lifetime=30.0, block_interval=0.25,
                  master_block_interval=0.4, redis_url=redis_url, start_timeout=90.0)
    net = await ln.init()
    await ln.start()
    fn_id = net.node("fullnode1").key_id.hex()
    r = redis.Redis.from_url(redis_url)
    r.xgroup_create("remp.receipts", "app", id="0", mkstream=True)
    try:
        async with aiohttp.ClientSession() as s:
            gql = ln.api + "/graphql"
            # postRequests (mutation over HTTP)
            bocs = transfers(net, 3)
            q = ("mutation($r: [Request!]!) { postRequests(requests: $r) }")
            async with s.post(gql, json={"query": q, "variables": {"r": [
                    {"id": base64.b64encode(b"x").decode(), "body": base64.b64encode(b).decode()} for b in bocs]}}) as resp:
                doc = await resp.json()
            assert "errors" not in doc, doc
            ids = doc["data"]["postRequests"]
            assert len(ids) == 3 and all(len(i) == 64 for i in ids)
            # a refused one: a precise GraphQL error
            async with s.post(gql, json={"query": q, "variables": {"r": [{"body": "AAAA"}]}}) as resp:
                doc = await resp.json()
            assert "deserialize" in doc["errors"][0]["message"]
            # rempReceipts subscription over graphql-transport-ws, until the final status
            ws = await gql_ws(s, gql.replace("http", "ws"))
            await ws.send_json({"id": "1", "type": "subscribe", "payload": {
                "query": "subscription($m: String!) { rempReceipts(messageId: $m) { kind messageId timestamp json } }",
                "variables": {"m": ids[0]}}})
            # and a malformed id on the same connection: refused with an error, others unaffected
            await ws.send_json({"id": "2", "type": "subscribe", "payload": {
                "query": "subscription { rempReceipts(messageId: \"zz\") { kind } }"}})
            got, bad = [], None
            while True:
                m = await ws.receive_json(timeout=90)
                if m["id"] == "2":
                    if m["type"] in ("error", "next") and bad is None:
                        bad = m
                    continue
                if m["type"] == "next":
                    got.append(m["payload"]["data"]["rempReceipts"])
                elif m["type"] == "complete":
                    break
                else:
                    raise AssertionError(m)
            await ws.close()
            assert bad is not None and "64 hex digits" in json.dumps(bad)
            own = [g["kind"] for g in got if json.loads(g["json"])["source_id"] == fn_id]
            assert own[0] == "SentToValidators" and own[-1] == "Finalized"
            assert all(g["messageId"] == ids[0] for g in got)
            by_src: dict = {}
            for g in got:
                d = json.loads(g["json"])
                by_src.setdefault(d["source_id"], []).append(g["kind"])
            for src, kinds in by_src.items():       # each source's statuses arrive in order
                ranks = [ORDER.index(k) for k in kinds if k in ORDER]
                assert ranks == sorted(ranks), (src, kinds)

            # every status of the 3 messages is in the Redis stream, readable by a consumer group
            async def all_final():
                for mid in ids:
                    async with s.get(f"{ln.api}/messages/{mid}") as resp:
                        if not (await resp.json())["outcome"]["final"]:
                            return False
                return True
            end = time.monotonic() + 90
            while not await all_final():
                assert time.monotonic() < end
                await asyncio.sleep(1)
            await asyncio.sleep(2)                          # late statuses of slower validators
            want = {}
            for mid in ids:
                async with s.get(f"{ln.api}/messages/{mid}") as resp:
                    want[mid] = sorted(json.dumps(x, sort_keys=True) for x in (await resp.json())["receipts"])
            entries = r.xreadgroup("app", "c1", {"remp.receipts": ">"}, count=10_000)
            rows = entries[0][1] if entries else []
            have: dict = {}
            for _, fields in rows:
                have.setdefault(fields[b"key"].decode(), []).append(
                    json.dumps(json.loads(fields[b"value"]), sort_keys=True))
            for mid in ids:
                assert sorted(have.get(mid, [])) == want[mid]
            assert r.xack("remp.receipts", "app", *[e for e, _ in rows]) == len(rows)
            # Redis goes away: HTTP keeps serving, the URL and the flag are named, losses counted
            r.config_set("requirepass", "locked-out")
            r.client_kill_filter(_type="normal", skipme=True)     # the full node must reconnect: refused
            more = transfers(net, 2, nonce0=100)
            for b in more:
                async with s.post(ln.api + "/messages", data=base64.b64encode(b)) as resp:
                    assert resp.status == 202
            end = time.monotonic() + 60
            while True:
                async with s.get(ln.api + "/metrics") as resp:
                    text = await resp.text()
                line = [x for x in text.splitlines() if x.startswith("remp_redis_not_appended_total")]
                if line and float(line[0].split()[-1]) > 0:
                    break
                assert time.monotonic() < end, "statuses not appended were not counted"
                await asyncio.sleep(1)
            async with s.get(ln.api + "/health") as resp:
                h = await resp.json()
            assert resp.status == 200 and h["redis"]["connected"] is False
            end = time.monotonic() + 30                     # the event log flushes every 0.1 s
            while True:
                log = (ln.logdir / "fullnode1.jsonl").read_text()
                if "flag --redis" in log and redis_url in log:
                    break
                assert time.monotonic() < end, "the Redis outage was not logged with its URL and flag"
                await asyncio.sleep(0.5)
    finally:
        try:
            redis.Redis.from_url(redis_url.replace("redis://", "redis://:locked-out@")).config_set("requirepass", "")
        except redis.RedisError:
            pass
        await ln.stop()
