"""A message every validator rejected at the collator (final RejectedByCollator from each
validator that said New) stays rejected: a validator restarted from its journal, replaying
its RMQ catchain, must not take it up again even when the account state changed since (seed
remp-protocol-b, "Rejection sequences": "all rejects for a guaranteed reject. After that,
nobody will try to collate the message"). In memory, fake clock."""
from __future__ import annotations

import pytest

from remp_node.wire.messages import parse_external_message
from remp_node.wire.shards import shard_contains

from tests.remp_fixtures import WalletSet
from remp_node.testnet.sim import SimConfig, Simulation

pytestmark = pytest.mark.slow


def test_collator_rejected_message_is_not_finalized_after_validator_restarts():
    w = WalletSet(16, "reject-replay", balance=1000)
    sim = Simulation(SimConfig(validators=8, group_size=4, seed=11, mc_catchain_lifetime=60.0, journal=True,
                               block_interval=0.1, master_block_interval=0.3),
                     wallets=w.genesis())
    t0 = int(sim.now)
    # a balance race: both pass the full node's pre-check, only one fits the balance
    a = sim.submit(w.transfer(0, 700, t0 + 3600, dest=w.addresses[2]))
    b = sim.submit(w.transfer(0, 700, t0 + 3600, dest=w.addresses[3]))
    assert sim.run_until(lambda: sim.final_outcome(a) and sim.final_outcome(b), 30.0)
    outcomes = {sim.final_outcome(a), sim.final_outcome(b)}
    assert outcomes == {"finalized", "rejected"}, outcomes
    rejected = a if sim.final_outcome(a) == "rejected" else b
    kinds = {r["kind"] for r in sim.receipts_for(rejected)}
    assert "RejectedByCollator" in kinds and "Finalized" not in kinds
    # the wallet is credited: the rejected transfer would now execute
    credit = sim.submit(w.transfer(1, 900, t0 + 3600, dest=w.addresses[0]))
    assert sim.run_until(lambda: sim.final_outcome(credit), 30.0)
    assert sim.final_outcome(credit) == "finalized"
    # one validator of the wallet's shard group crashes and comes back from its journal; it
    # replays its RMQ catchain (the rejected message's record included) and collates again
    account = parse_external_message(w.transfer(0, 1, t0 + 3600)).account
    v0 = sim.validators[0]
    shard = next(s for s in sim.config.shards if shard_contains(s, account))
    group = v0.groups(v0.session)[shard]
    victim = next(i for i, v in enumerate(sim.validators) if v.key.public in group)
    sim.crash(victim)
    sim.run(0.5)
    sim.restart(victim)
    # traffic in the same shard moves its chain on (the restarted validator gets its turns)
    same = [j for j in range(4, 16)
            if shard_contains(shard, parse_external_message(w.transfer(j, 1, t0 + 3600)).account)]
    assert len(same) >= 2
    more = []
    for k in range(30):
        more.append(sim.submit(w.transfer(same[k % len(same)], 1, t0 + 3600)))
        sim.run(0.5)
    assert sim.run_until(lambda: all(sim.final_outcome(m) for m in more), 30.0)
    assert {sim.final_outcome(m) for m in more} == {"finalized"}
    assert sim.final_outcome(rejected) == "rejected"
    assert not sim.committed.get(rejected), "a message rejected by every collator was finalized"
    late = [r["kind"] for r in sim.receipts_for(rejected)]
    assert "IncludedIntoBlock" not in late and "Finalized" not in late, late
