"""A message's final status never contradicts the chain when the masterchain lags.

In memory, fake clock (remp_node/testnet/sim.py): 2 shards x 7 validators, 3 s master sessions and a
slow masterchain (one master block a second, each carrying at most 4 KiB of shard commits),
120 transfers in 6 s. Accepted shard blocks wait for the masterchain longer than the
messages' lifetime (received in session N, obsolete at N+2), so at the switch to N+2 some
messages sit in accepted shard blocks that the masterchain commits a moment later, or in
blocks it orphans.

Before the hold in ValidatorCore (cache.gc `hold`, `_end_held`), every validator said
Timeout (final) at the switch and the masterchain then committed the block: 10 of the 120
messages ended `timeout` at the full node while the chain finalized them (seen in the main
job under load as `remp.finalized launcher=83 report=86 MISMATCH`). Rule now: a validator
holds an obsolete message while a live block still decides it; committed -> Finalized,
orphaned or never accepted -> Timeout then.
"""
from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from remp_node.testnet.sim import SimConfig, Simulation

from tests.remp_fixtures import WalletSet

pytestmark = pytest.mark.slow


def test_lagging_masterchain_final_status_matches_the_chain():
    life, n = 3.0, 120
    w = WalletSet(n, "sim-lag")
    sim = Simulation(SimConfig(seed=7, mc_catchain_lifetime=life, master_block_interval=1.0,
                               master_commit_bytes=4 * 1024),
                     wallets=w.genesis())
    t0 = int(sim.now)
    ids = []
    for i in range(n):
        ids.append(sim.submit(w.transfer(i, 3, t0 + 3600)))
        sim.run(0.05)
    assert sim.run_until(lambda: all(sim.finals.get(m) for m in ids), 40.0)
    sim.run(2 * life)                   # late receipts and commits, if any, arrive

    # the case happened: validators held obsolete messages that a block still decided
    assert sum(v.stats["held"] for v in sim.validators) > 0
    outcomes = Counter()
    for m in ids:
        finals = sim.finals[m]
        assert len(finals) == 1, finals                       # one verdict per message
        committed = sim.committed.get(m, [])
        assert len(committed) <= 1, committed                 # never twice in the masterchain
        # the full node's verdict is the chain's: committed <=> finalized, else timeout
        assert finals[0].outcome == ("finalized" if committed else "timeout"), (m.hex(), finals, committed)
        outcomes[finals[0].outcome] += 1
        # per validator, Timeout ends that validator's copy: the next status it gives for the
        # message, if any, opens a new copy (PutIntoQueue / AcceptedByQueue: a copy received
        # again, e.g. forwarded by a member that received it a session later, lives on);
        # statuses of the same instant may arrive in either order (separate datagrams, one
        # ms timestamp); and Finalized never comes before a Timeout of the same validator
        by_source = defaultdict(list)
        for r in sim.receipts_for(m):
            by_source[r["source_id"]].append((r["timestamp"], r["kind"]))
        for src, rs in by_source.items():
            rs.sort(key=lambda x: x[0])
            for ts, kind in rs:
                if kind != "Timeout":
                    continue
                later = [(t, k) for t, k in rs if t > ts]
                # the first instant after the Timeout (its statuses in any order) opens a new copy
                first = {k for t, k in later if t == later[0][0]} if later else set()
                assert not later or first & {"PutIntoQueue", "AcceptedByQueue"}, (m.hex()[:16], src[:8], rs)
                assert not [k for t, k in rs if t < ts and k == "Finalized"], (m.hex()[:16], src[:8], rs)
    # most finalize; a few are orphaned past their lifetime (the masterchain is slow on purpose)
    assert outcomes["finalized"] >= 0.6 * n and outcomes["finalized"] + outcomes["timeout"] == n, outcomes
