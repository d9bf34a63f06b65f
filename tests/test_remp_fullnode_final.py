"""The full node never sends a final message to the validators again, and its subscriptions
deliver every status it receives: real processes on 127.0.0.1 (1 shard x 4 validators, all
masterchain validators, one full node) with 12 s master sessions (the demo's are 20 s,
deploy/cluster.toml: every wait below is a number of sessions, the replay window and the
retention as the daemons count them, so shorter sessions prove the same and take 40 s less),
the client side written against the documented API only (HTTP, WebSocket, GraphQL over
graphql-transport-ws).

1. A workchain 0 message (POST /messages) and a workchain -1 message (postRequests) are
   Finalized; live WebSocket and GraphQL subscribers opened before the POST get exactly the
   statuses GET /messages/{id} lists (every group member's Finalized included), the final
   decision marked, and the subscription then ends on its own.
2. The same BOC posted again: 409 with the stored outcome (GraphQL: extensions.code
   MESSAGE_ALREADY_FINAL), nothing sent to any validator, no new status; after a SIGKILL and
   restart of the full node (its data dir kept); and past the validators' replay window
   (three 20 s sessions after the decision), when only the full node stands between the
   user and a second execution.
3. Past --final-retention (five sessions, 60 s here; its minimum is three) the message is purged: 404.
"""
from __future__ import annotations

import asyncio
import base64
import json
import time

import aiohttp
import pytest
from pytoniq_core import Cell

from remp_node.wire.keys import NodeKey
from remp_node.testnet.localnet import LocalNet
from tests.test_remp_daemons import wait_for
from remp_node.core.state import make_wallet_message

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SESSION = 12.0          # master session length (mc_catchain_lifetime); the demo's is 20 s


def transfer(net, workchain: int, nonce: int) -> bytes:
    w = next(w for w in net.wallets() if w["workchain"] == workchain)
    k = NodeKey.from_seed(bytes.fromhex(w["seed"]))
    return make_wallet_message(k, w["address"], w["address"], 7, int(time.time()) + 3600, nonce=nonce)


async def ws_subscriber(s, api: str, mid: str) -> dict:
    """Every frame of GET /messages/{id}/ws until the server closes it."""
    statuses, finals = [], []
    async with s.ws_connect(f"{api}/messages/{mid}/ws") as w:
        async for msg in w:
            if msg.type == aiohttp.WSMsgType.TEXT:
                d = json.loads(msg.data)
                if d.get("final") is True:
                    finals.append((len(statuses), d))
                else:
                    statuses.append(d)
        return {"statuses": statuses, "finals": finals, "close": w.close_code}


async def gql_subscriber(s, api: str, mid: str) -> dict:
    """rempReceipts(messageId) over graphql-transport-ws until `complete`."""
    ws = await s.ws_connect(api.replace("http", "ws") + "/graphql", protocols=["graphql-transport-ws"])
    await ws.send_json({"type": "connection_init", "payload": {}})
    assert (await ws.receive_json(timeout=60))["type"] == "connection_ack"
    await ws.send_json({"id": "1", "type": "subscribe", "payload": {
        "query": "subscription($m: String!) { rempReceipts(messageId: $m) { kind messageId json final outcome } }",
        "variables": {"m": mid}}})
    got = []
    while True:
        m = await ws.receive_json(timeout=300)
        if m["type"] == "next":
            got.append(m["payload"]["data"]["rempReceipts"])
        elif m["type"] == "complete":
            break
        elif m["type"] == "ping":
            await ws.send_json({"type": "pong"})
        else:
            raise AssertionError(m)
    await ws.close()
    return {"statuses": [json.loads(g["json"]) for g in got], "final": [(i, g) for i, g in enumerate(got) if g["final"]]}


def sent_count(ln, mid: str) -> int:
    """rempMessage datagrams the full node logged for `mid` (remp.fullnode.sent)."""
    return sum(1 for e in ln.events("fullnode1", "remp.fullnode.sent") if e.get("trace_id") == mid)


async def test_final_message_is_not_sent_again_and_subscribers_get_every_status(tmp_path):
    ln = LocalNet(tmp_path, shards=1, validators_per_shard=4, mc_catchain_lifetime=SESSION, block_interval=0.2,
                  master_block_interval=0.1, start_timeout=120.0)
    net = await ln.init()
    retention = 5 * SESSION
    fn = ln.daemons["fullnode1"]
    fn.argv += ["--final-retention", str(retention)]
    await ln.start()
    try:
        async with aiohttp.ClientSession() as s:
            api = ln.api
            boc0, boc1 = transfer(net, 0, 11), transfer(net, -1, 12)
            mid0, mid1 = Cell.one_from_boc(boc0).hash.hex(), Cell.one_from_boc(boc1).hash.hex()
            # live subscribers before the message exists
            subs = [asyncio.ensure_future(ws_subscriber(s, api, mid0)),
                    asyncio.ensure_future(gql_subscriber(s, api, mid0)),
                    asyncio.ensure_future(ws_subscriber(s, api, mid1))]
            await asyncio.sleep(1.0)
            async with s.post(api + "/messages", data=base64.b64encode(boc0)) as r:
                assert r.status == 202 and (await r.json())["message_id"] == mid0
            q = "mutation($r: [Request!]!) { postRequests(requests: $r) }"
            async with s.post(api + "/graphql", json={"query": q, "variables": {
                    "r": [{"body": base64.b64encode(boc1).decode()}]}}) as r:
                doc = await r.json()
            assert doc.get("data", {}).get("postRequests") == [mid1], doc
            # a second POST while it is in flight: accepted again, idempotent
            async with s.post(api + "/messages", data=base64.b64encode(boc0)) as r:
                assert r.status == 202

            async def final(mid):
                async with s.get(f"{api}/messages/{mid}") as r:
                    d = await r.json()
                    return d if d["outcome"]["final"] else None
            f0, f1 = await wait_for(lambda: final(mid0), 120), await wait_for(lambda: final(mid1), 120)
            assert f0 and f0["outcome"]["outcome"] == "finalized", f0
            assert f1 and f1["outcome"]["outcome"] == "finalized", f1
            decided = time.monotonic()

            # ---- 2: posted again, at once ------------------------------------------------------
            async def repost_is_refused(tag: str):
                sent0, sent1 = sent_count(ln, mid0), sent_count(ln, mid1)
                async with s.get(f"{api}/messages/{mid0}") as r:
                    before = len((await r.json())["receipts"])
                async with s.post(api + "/messages", data=base64.b64encode(boc0)) as r:
                    body = await r.json()
                    assert r.status == 409, (tag, r.status, body)
                assert body["message_id"] == mid0 and body["outcome"]["outcome"] == "finalized", body
                assert body["outcome"]["kind"] == "Finalized" and body["retained_until"] > time.time()
                async with s.post(api + "/graphql", json={"query": q, "variables": {
                        "r": [{"body": base64.b64encode(boc1).decode()}]}}) as r:
                    doc = await r.json()
                (err,) = doc["errors"]
                assert err["extensions"]["code"] == "MESSAGE_ALREADY_FINAL", (tag, doc)
                assert err["extensions"]["messageId"] == mid1 and err["extensions"]["outcome"] == "finalized"
                await asyncio.sleep(3.0)      # a wave would have left by now
                assert (sent_count(ln, mid0), sent_count(ln, mid1)) == (sent0, sent1), tag
                async with s.get(f"{api}/messages/{mid0}") as r:
                    d = await r.json()
                assert len(d["receipts"]) == before, tag
                fin = [x for x in d["receipts"] if x["kind"] == "Finalized" and x["source_id"] == net.node("fullnode1").key_id.hex()]
                assert len(fin) == 1, (tag, fin)           # decided once, in one block

            await repost_is_refused("at once")

            # ---- 1: subscribers: every status GET lists, the decision marked, then the end ---
            done = await asyncio.wait_for(asyncio.gather(*subs), timeout=80.0)
            for (res, mid) in zip(done, (mid0, mid0, mid1)):
                async with s.get(f"{api}/messages/{mid}") as r:
                    want = (await r.json())["receipts"]
                assert res["statuses"] == want, (mid, len(res["statuses"]), len(want))
                fin_validators = {x["source_id"] for x in want if x["kind"] == "Finalized"}
                members = 4 if mid == mid0 else 4           # every masterchain validator, too
                assert len(fin_validators) == members + 1, fin_validators   # + the full node's own
            ws0, gq0, ws1 = done
            assert ws0["close"] == 1000 and ws1["close"] == 1000
            (at, marker), = ws0["finals"]
            assert marker["outcome"] == "finalized" and ws0["statuses"][at - 1]["kind"] == "Finalized"
            (i, g), = gq0["final"]
            assert g["outcome"] == "finalized" and g["kind"] == "Finalized"
            # a subscriber that comes after the end: the same statuses and marker, then the end
            again = await asyncio.wait_for(gql_subscriber(s, api, mid0), timeout=30)
            assert again["statuses"] == gq0["statuses"] and [x for x, _ in again["final"]] == [i]

            # ---- 2: after a SIGKILL and restart of the full node ------------------------------
            ln.kill("fullnode1")
            await ln.restart("fullnode1")
            api = ln.api
            await repost_is_refused("after restart")

            # ---- 2: past the validators' replay window ----------------------------------------
            await asyncio.sleep(max(0.0, decided + 3 * SESSION + 2 - time.monotonic()))
            await repost_is_refused("past the replay window")

            # ---- 3: past the retention: purged -------------------------------------------------
            async def purged():
                async with s.get(f"{api}/messages/{mid0}") as r:
                    return r.status == 404
            # retention counts from the decision; the store purges every retention / 10 s
            assert await wait_for(purged, decided + retention + retention / 10 + 30 - time.monotonic())
    finally:
        await ln.stop()
