"""SIGKILL of a validator with unacknowledged receipts and of the full node (processes,
1 shard x 4 validators + full node on 127.0.0.1):

- the validator's receipt outbox (ReceiptSender(journal=True) -> ValidatorStore outbox,
  fsynced before the packets leave) survives its SIGKILL: every status it produced (its
  event log, both lives) reaches the full node (the full node's event log, both lives);
- the full node resubmits the messages POST /messages accepted before its SIGKILL: each
  still reaches a final outcome.
"""
from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from remp_node.wire.keys import NodeKey
from remp_node.testnet.localnet import LocalNet
from remp_node.core.state import make_wallet_message
from remp_node.daemon.store import FullnodeStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def _wait(pred, deadline: float, step: float = 0.5):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        r = await pred()
        if r:
            return r
        await asyncio.sleep(step)
    return await pred()


async def test_validator_outbox_and_fullnode_pending_survive_sigkill(tmp_path):
    ln = LocalNet(tmp_path, shards=1, validators_per_shard=4, mc_catchain_lifetime=30.0, block_interval=0.25,
                  master_block_interval=0.4, start_timeout=90.0)
    net = await ln.init()
    await ln.start()
    try:
        ws = [w for w in net.wallets() if w["workchain"] == 0]
        bocs = []
        for i in range(8):
            w = ws[i % len(ws)]
            k = NodeKey.from_seed(bytes.fromhex(w["seed"]))
            bocs.append(make_wallet_message(k, w["address"], w["address"], 1 + i, int(time.time()) + 3600,
                                            nonce=7000 + i))
        ids = []
        async with aiohttp.ClientSession() as s:
            for b in bocs:
                async with s.post(ln.api + "/messages", data=b) as r:
                    assert r.status == 202
                    ids.append((await r.json())["message_id"])
            # SIGKILL right after the last 202 (the message is in the full node's store): at
            # least that one cannot be final yet, so the restarted full node must resubmit
            # it. (It slept 0.3 s here first; since REMP finalizes in ~0.6 s all 8 could be
            # final before the kill: resubmitted 0 in a fresh-clone CI run.)
            ln.kill("fullnode1")                # receipts from now on are not acknowledged
            await asyncio.sleep(4.0)            # validators process the messages
            v = "v1"
            ln.kill(v)                          # with unacknowledged receipts in its outbox
            await ln.restart(v)
            await ln.restart("fullnode1")

            async def final():
                for mid in ids:
                    async with s.get(f"{ln.api}/messages/{mid}") as r:
                        if r.status != 200 or not (await r.json())["outcome"]["final"]:
                            return False
                return True
            assert await _wait(final, 120.0), "a message accepted before the full node's SIGKILL never ended"

            def produced():
                return {(e["trace_id"], e["attrs"]["kind"]) for e in ln.events(v, "remp.validator.status")}

            v_id = net.node(v).key_id.hex()

            def delivered():        # what the full node stored (fsynced before it acknowledged), both lives
                st = FullnodeStore(ln.datadir / "fullnode1")
                try:
                    return {(mid, d["kind"]) for mid in ids for d in st.statuses(bytes.fromhex(mid))
                            if d["source_id"] == v_id}
                finally:
                    st.close()

            async def all_delivered():
                await asyncio.sleep(0)
                return produced() <= delivered()
            ok = await _wait(all_delivered, 30.0)
            assert produced(), "the validator produced no status"
            assert ok, f"missing at the full node: {sorted(produced() - delivered())[:10]}"
            async with s.get(ln.http(v) + "/health") as r:
                h = await r.json()
            # not asserted: whether v1's outbox still held unacknowledged receipts at its SIGKILL
            # depends on timing (a fresh-clone CI run saw 0, every receipt acked before the full
            # node died); what must hold in every case is asserted above (nothing produced is
            # missing at the full node). The restore path itself: test_remp_delivery (journal
            # restore after a crash with receipts in flight) and test_remp_store (outbox table).
            print("v1 restored_receipts:", h["restored_receipts"])
            async with s.get(ln.api + "/health") as r:
                # the messages without a final outcome in its store at the SIGKILL (some may have ended)
                assert 0 < (await r.json())["resubmitted"] <= len(ids)
    finally:
        await ln.stop()
