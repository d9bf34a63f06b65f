"""Must-show 2 in memory: under 20% loss PER TRANSPORT PART (transport.py fragments a payload
into parts of 1,154 bytes and never retransmits a part, so a payload of n parts arrives with
probability 0.8 ** n per send), the masterchain must keep committing shard blocks.

Found in tests/test_remp_faults.py (real processes): a master block carried every pending
shard commit (each a consensus.Commit with its whole candidate, message bodies included), so
after one lost round the master proposal grew to 36 KB (32 parts, 0.8 ** 32 = 0.08% per
receiver per send), the masterchain stalled for 20-40 s, the session switch orphaned the
accepted shard blocks (IgnoredByMasterchain) and at the next one the messages ended Timeout
at every validator. The collator now caps the commits of one master block
(validator.MAX_MASTER_COMMIT_BYTES). Same network and message mix as test_remp_faults.py:
2 shards x 4 validators, mc_catchain_lifetime 30 s, shard block interval 0.25 s, master 0.4 s,
the real messages up to 8 KiB and 30 wallet transfers; seed 4 lost message 1a1e51f7... before
the fix."""
from __future__ import annotations

import base64

import pytest

from remp_node.testnet.sim import SimConfig, Simulation

from tests.remp_fixtures import WalletSet, load_real_messages

pytest.importorskip("remp_node.core.catchain", reason="remp_node/core/catchain.py is not in the tree")
pytestmark = pytest.mark.slow

PART_PAYLOAD = 1154     # transport.py: part_size 1,232 - 78 bytes of overhead


def test_fragmented_master_blocks_keep_committing_under_part_loss(shared_data):
    rows = load_real_messages(shared_data)
    small = [r for r in rows if len(base64.b64decode(r["boc_base64"])) <= 8192]
    real = small[:6] + [r for r in small if len(base64.b64decode(r["boc_base64"])) > 4096][:4]
    w = WalletSet(30, "faults-4")
    sim = Simulation(SimConfig(seed=4, validators=8, group_size=4, loss=0.2, duplicate=0.1, reorder=0.1,
                               mc_catchain_lifetime=30.0, block_interval=0.25, master_block_interval=0.4,
                               part_payload=PART_PAYLOAD),
                     wallets=w.genesis(), open_accounts=sorted({r["dst"] for r in real}))
    t0 = int(sim.now)
    bocs = [base64.b64decode(r["boc_base64"]) for r in real] + [w.transfer(i, 7, t0 + 3600) for i in range(30)]
    sim.run(0.2)
    mids = []
    for boc in bocs:
        mids.append(sim.submit(boc))
        sim.run(0.05)
    # bounded: 150 simulated seconds = 5 master sessions; a message not finalized by then
    # has been dropped by every validator (Timeout at the GC of session n + 2)
    sim.run_until(lambda: all(sim.finals.get(m) for m in mids), 150.0)
    assert sim.net.stats.lost > 0 and sim.net.stats.duplicated > 0 and sim.net.stats.reordered > 0
    outcomes = {m.hex(): [f.outcome for f in sim.finals.get(m, [])] for m in mids}
    assert {m: o for m, o in outcomes.items() if o != ["finalized"]} == {}
    # every message committed by exactly one master block (as the first validator sees the
    # masterchain; a few simulated seconds for it to accept the last one the full node saw)
    sim.run(5.0)
    assert [m.hex() for m in mids if len(sim.committed[m]) != 1] == []
