"""Several full nodes in one REMP network, on real processes (1 shard x 4 validators + 2
full nodes), driven by remp_node.api.submit.Submitter over the documented HTTP API:

- messages spread over both full nodes all finalize, exactly once, and each one's
  validator receipts are at the full node that took it (the other never heard of it);
- one full node killed (SIGKILL) mid-run: the client fails over to the other and every
  message still finalizes, exactly once;
- full nodes at their --max-pending bound answer 503 with Retry-After; the client's
  retried messages all finalize.
"""
from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from remp_node.testnet.localnet import LocalNet
from tests.remp_fixtures import transfers
from remp_node.api.submit import Placed, Submitter

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]




def localnet(tmp_path, **kw) -> LocalNet:
    return LocalNet(tmp_path, shards=1, validators_per_shard=4, fullnodes=2, mc_catchain_lifetime=20.0,
                    block_interval=0.2, master_block_interval=0.1, start_timeout=120.0, **kw)


async def health(s: aiohttp.ClientSession, url: str) -> dict:
    async with s.get(url + "/health") as r:
        return await r.json()


async def get(s: aiohttp.ClientSession, url: str, mid: str) -> tuple[int, dict]:
    async with s.get(f"{url}/messages/{mid}") as r:
        return r.status, await r.json()


def once_in_chain(doc: dict, fullnode_id: str) -> None:
    """The full node's own Finalized statuses of a message name one shard block."""
    blocks = {r["block_id"] for r in doc["receipts"] if r["kind"] == "Finalized" and r["source_id"] == fullnode_id}
    assert len(blocks) == 1, (doc["message_id"], blocks)


async def test_messages_over_two_full_nodes_finalize_once_with_receipts_at_the_full_node_that_took_them(tmp_path):
    ln = localnet(tmp_path)
    net = await ln.init()
    await ln.start()
    try:
        apis = ln.apis
        assert len(apis) == 2
        ids = {u: net.node(label).key_id.hex() for u, label in zip(apis, ln.fullnode_labels())}
        async with aiohttp.ClientSession() as s, Submitter(apis, s) as sub:
            placed = [await sub.submit(b) for b in transfers(net, 20, 100)]
            assert all(isinstance(p, Placed) and p.status == 202 for p in placed), placed
            took = {p.message_id: p.node for p in placed}
            # round robin: each full node took half
            assert sorted(sum(1 for n in took.values() if n == u) for u in apis) == [10, 10]
            final = await sub.wait_final(took, time.monotonic() + 240)
            assert {o["outcome"] for o in final.values()} == {"finalized"} and len(final) == 20
            vids = {n.key_id.hex() for n in net.validators()}
            for mid, url in took.items():
                st, doc = await get(s, url, mid)
                assert st == 200
                once_in_chain(doc, ids[url])
                # the validators' own receipts reached the full node that took it
                from_validators = {r["source_id"] for r in doc["receipts"] if r["source_id"] in vids}
                assert from_validators, (mid, [r["kind"] for r in doc["receipts"]])
                assert {"PutIntoQueue", "Finalized"} <= {r["kind"] for r in doc["receipts"]
                                                         if r["source_id"] in vids}
                other = next(u for u in apis if u != url)
                st, _ = await get(s, other, mid)
                assert st == 404        # never sent there, never reported there
            for u in apis:
                h = await health(s, u)
                assert h["follower"].get("finalized_twice", 0) == 0
            assert sub.report()["failovers"] == 0 and sub.report()["unplaced"] == 0
    finally:
        await ln.stop()


async def test_a_full_node_killed_mid_run_the_client_fails_over_and_nothing_is_lost(tmp_path):
    ln = localnet(tmp_path)
    net = await ln.init()
    await ln.start()
    try:
        apis = ln.apis
        fn1, fn2 = ln.fullnode_labels()
        async with aiohttp.ClientSession() as s, Submitter(apis, s, down_for=1.0, request_timeout=5.0) as sub:
            bocs = transfers(net, 30, 500)
            placed = [await sub.submit(b) for b in bocs[:10]]
            ln.kill(fn1)            # at once: its last messages are not final yet
            for b in bocs[10:]:
                placed.append(await sub.submit(b))
                await asyncio.sleep(0.05)
            assert all(isinstance(p, Placed) and p.status == 202 for p in placed), placed
            mids = [p.message_id for p in placed]
            assert len(set(mids)) == 30
            assert sum(1 for p in placed if p.node == apis[0]) == 5     # before the kill
            final = await sub.wait_final(mids, time.monotonic() + 300)
            assert len(final) == 30, f"lost: {set(mids) - set(final)}"
            assert {o["outcome"] for o in final.values()} == {"finalized"}
            rep = sub.report()
            assert rep["unplaced"] == 0
            assert rep["nodes"][apis[0]]["errors"], rep       # the client saw it go
            assert rep["failovers"] >= 5, rep                 # fn1's messages, followed at fn2 now
            # every message is now followed at the surviving full node, finalized once
            fn2_id = net.node(fn2).key_id.hex()
            for mid in mids:
                st, doc = await get(s, apis[1], mid)
                if st == 404:
                    # finalized at fn1 before the kill and seen final there by the client
                    continue
                assert doc["outcome"]["final"] and doc["outcome"]["outcome"] == "finalized"
                once_in_chain(doc, fn2_id)
            h = await health(s, apis[1])
            assert h["follower"].get("finalized_twice", 0) == 0
    finally:
        await ln.stop()


async def test_full_nodes_at_their_bound_answer_503_and_the_clients_retried_messages_all_finalize(tmp_path):
    ln = localnet(tmp_path, fullnode_args=["--max-pending", "4"])
    net = await ln.init()
    await ln.start()
    try:
        apis = ln.apis
        async with aiohttp.ClientSession() as s, Submitter(apis, s, max_wait=400.0, max_attempts=200) as sub:
            # a first message through each, so each full node knows its finalize rate
            warm = [await sub.submit(b) for b in transfers(net, 2, 10)]
            await sub.wait_final([p.message_id for p in warm], time.monotonic() + 120)
            # a burst far past 2 x 4 pending: refused with Retry-After, retried, all placed
            placed = await asyncio.gather(*(sub.submit(b) for b in transfers(net, 30, 1000)))
            assert all(isinstance(p, Placed) and p.status == 202 for p in placed), placed
            rep = sub.report()
            refused = sum(v.get("pending_full", 0) for v in (n["refused"] for n in rep["nodes"].values()))
            assert refused > 0, rep
            assert all(p.attempts >= 1 for p in placed) and max(p.attempts for p in placed) > 1
            final = await sub.wait_final([p.message_id for p in placed], time.monotonic() + 300)
            assert len(final) == 30 and {o["outcome"] for o in final.values()} == {"finalized"}
            total = 0
            for u in apis:
                async with s.get(u + "/metrics") as r:
                    text = await r.text()
                total += sum(float(x.split()[-1]) for x in text.splitlines()
                             if x.startswith("remp_api_refused_total") and 'reason="pending_full"' in x)
            assert total == refused
            # and logged per full node (remp.fullnode.refused, at most one line per reason per
            # second: the counts add up to every refusal once the last line is flushed)
            await asyncio.sleep(1.5)
            logged = sum(e["attrs"]["count"] for f in ln.fullnode_labels()
                         for e in ln.events(f, "remp.fullnode.refused") if e["attrs"]["reason"] == "pending_full")
            assert logged == refused
    finally:
        await ln.stop()


async def test_a_message_finalized_through_one_full_node_is_not_executed_again_through_another(tmp_path):
    """Past the validators' replay window (2-3 master sessions) only the chain remembers a
    message: a client failing over with it to another full node must get its outcome (409,
    finalized), and the chain must not execute it twice."""
    ln = LocalNet(tmp_path, shards=1, validators_per_shard=4, fullnodes=2, mc_catchain_lifetime=4.0,
                  block_interval=0.2, master_block_interval=0.1, start_timeout=120.0)
    net = await ln.init()
    await ln.start()
    try:
        apis = ln.apis
        async with aiohttp.ClientSession() as s, Submitter(apis[:1], s) as first:
            (boc,) = transfers(net, 1, 7)
            p = await first.submit(boc)
            assert p.status == 202
            final = await first.wait_final([p.message_id], time.monotonic() + 120)
            assert final[p.message_id]["outcome"] == "finalized"
            await asyncio.sleep(4.0 * 4)      # past every validator's replay window
            async with Submitter(apis[1:], s) as other:
                q = await other.submit(boc)
                assert q.message_id == p.message_id
                assert q.status == 409 and q.doc["outcome"]["outcome"] == "finalized", (q.status, q.doc)
            await asyncio.sleep(3.0)
            for u in apis:
                h = await health(s, u)
                assert h["follower"].get("finalized_twice", 0) == 0, h["follower"]
    finally:
        await ln.stop()
