"""A burst of messages on real processes (1 shard x 4 validators + one full node on
127.0.0.1) while the full node's receipt path is tight: it buffers and advertises a window
of 2 receipt packets per validator (--receipt-window 2) and loses 5% of its datagrams (the
test-only --faults of its adapter), the small-scale form of a CPU-bound full node whose
socket drops datagrams under a burst of 3,000 messages.

Expected (the client side uses the documented HTTP API only): every message accepted is
Finalized; not one receipt packet is refused by the full node for buffer space
(/health delivery.error_buffer_full), no validator abandons a receipt (/health
delivery.receipts_abandoned, abandoned_overflow), no message ends as Timeout, and every
Finalized message has every group member's Finalized status in GET /messages/{id}.
No speed is asserted (bench/bench_remp_burst.py measures the full-size burst).
"""
from __future__ import annotations

import asyncio
import base64
import time

import aiohttp
import pytest

from remp_node.wire.keys import NodeKey
from remp_node.testnet.localnet import LocalNet
from remp_node.core.state import make_wallet_message

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

N_MESSAGES = 240


def transfers(net, n: int) -> list[bytes]:
    ws = [w for w in net.wallets() if w["workchain"] == 0]
    out = []
    for i in range(n):
        w = ws[i % len(ws)]
        k = NodeKey.from_seed(bytes.fromhex(w["seed"]))
        out.append(make_wallet_message(k, w["address"], w["address"], 1 + i, int(time.time()) + 3600, nonce=7000 + i))
    return out


async def test_a_burst_behind_a_small_lossy_receipt_path_loses_no_receipt(tmp_path):
    ln = LocalNet(tmp_path, shards=1, validators_per_shard=4, mc_catchain_lifetime=20.0, block_interval=0.2,
                  master_block_interval=0.1, start_timeout=120.0)
    net = await ln.init()
    # the burst is taken whole (--pending-seconds 0: only --max-pending bounds it): what is
    # tested is the receipt path behind it; refusing part of a burst is test_remp_admission's
    ln.daemons["fullnode1"].argv += ["--receipt-window", "2", "--faults", "loss=0.05,seed=7", "--pending-seconds", "0"]
    await ln.start()
    try:
        async with aiohttp.ClientSession() as s:
            api = ln.api
            sem = asyncio.Semaphore(50)

            async def post(boc):
                async with sem:
                    async with s.post(api + "/messages", data=base64.b64encode(boc)) as r:
                        return r.status, await r.json()
            res = await asyncio.gather(*(post(b) for b in transfers(net, N_MESSAGES)))
            assert all(st == 202 for st, _ in res), [r for r in res if r[0] != 202][:3]
            ids = [d["message_id"] for _, d in res]

            final: dict[str, dict] = {}
            end = time.monotonic() + 600
            while len(final) < len(ids) and time.monotonic() < end:
                for mid in ids:
                    if mid in final:
                        continue
                    async with s.get(f"{api}/messages/{mid}") as r:
                        d = await r.json()
                    if d["outcome"]["final"]:
                        final[mid] = d
                await asyncio.sleep(2.0)
            assert len(final) == len(ids), f"{len(ids) - len(final)} messages not final"
            outcomes = {d["outcome"]["outcome"] for d in final.values()}
            assert outcomes == {"finalized"}, [(m, d["outcome"]) for m, d in final.items()
                                               if d["outcome"]["outcome"] != "finalized"][:3]
            await asyncio.sleep(5.0)          # the late Finalized statuses of the other members

            async with s.get(api + "/health") as r:
                h = await r.json()
            assert h["delivery"]["error_buffer_full"] == 0, h["delivery"]
            assert h["client"]["timeout"] == 0, h["client"]
            waited = 0
            for label in ln.validators():
                async with s.get(ln.http(label) + "/health") as r:
                    vh = await r.json()
                d = vh["delivery"]
                assert d.get("receipts_abandoned", 0) == 0 and d["abandoned_overflow"] == 0, (label, d)
                waited += d.get("window_full", 0)
            assert waited > 0           # the flow control was exercised: validators waited for acks
            fn_id = net.node("fullnode1").key_id.hex()
            short = []
            for mid in ids:
                async with s.get(f"{api}/messages/{mid}") as r:
                    rs = (await r.json())["receipts"]
                fin = {x["source_id"] for x in rs if x["kind"] == "Finalized" and x["source_id"] != fn_id}
                if len(fin) < 4:
                    short.append((mid, len(fin)))
            assert not short, f"{len(short)} messages without every member's Finalized: {short[:5]}"
    finally:
        await ln.stop()
