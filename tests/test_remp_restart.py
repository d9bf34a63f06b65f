"""A validator core restarted from its journal only (what remp_node/daemon/store.py keeps on disk)
catches up and signs again, without forking or equivocating (in memory, fake clock).

Core side: ValidatorCore.journal_updates() -> ValidatorJournal;
ValidatorCore(journal=...) replays the master commit certificates, mutes the consensus
heights and catchain sessions it signed in before the crash."""
from __future__ import annotations

import pytest

from remp_node.core import consensus as cons
from remp_node.testnet.sim import SimConfig, Simulation
from remp_node.core.validator import ForkBlamed

from tests.remp_fixtures import WalletSet

pytestmark = pytest.mark.slow


def signers(v, seqno: int) -> set[bytes]:
    raw = v.master.commit_for(seqno)
    return {who for who, _ in cons.parse_message(raw).signatures} if raw else set()


def test_restarted_validators_replay_their_journal_catch_up_and_sign_again():
    w = WalletSet(40, "restart")
    sim = Simulation(SimConfig(validators=8, group_size=4, seed=3, mc_catchain_lifetime=20.0, journal=True,
                               block_interval=0.1, master_block_interval=0.3),
                     wallets=w.genesis())
    t0 = int(sim.now)
    ids = []
    for i in range(10):
        ids.append(sim.submit(w.transfer(i, 5, t0 + 3600)))
    sim.run(3.0)
    # two validators of shard 0x4000...'s current group crash mid-run
    g = sim.validators[0].groups(sim.validators[0].session)[0x4000000000000000]
    victims = [i for i, v in enumerate(sim.validators) if v.key.public in g][:2]
    before = {i: sim.validators[i].master.height for i in victims}
    assert all(h > 1 for h in before.values())          # they had accepted master blocks
    for i in victims:
        sim.crash(i)
    for i in range(10, 25):
        ids.append(sim.submit(w.transfer(i, 5, t0 + 3600)))
    sim.run(1.0)
    restarted = {i: sim.restart(i) for i in victims}
    for i, v in restarted.items():
        # the journal alone rebuilt its chain view (before any datagram from a peer)
        v.handle_timer(sim.now)
        assert v.master.height >= before[i]
        assert v.stats["replayed_master_blocks"] >= before[i] - 1
    for i in range(25, 40):
        ids.append(sim.submit(w.transfer(i, 5, t0 + 3600)))
    assert sim.run_until(lambda: all(sim.final_outcome(m) for m in ids), 90.0)
    assert {sim.final_outcome(m) for m in ids} == {"finalized"}
    for m in ids:
        assert len(sim.committed[m]) == 1
    authored = {i: any(q.catchain.muted for q in v.rmqs.values()) for i, v in restarted.items()}
    assert any(authored.values())       # the case that matters: a session it had signed in
    sim.run(22.0)                                         # past the next session switch
    ref = next(v for i, v in enumerate(sim.validators) if i not in victims)
    for i, v in restarted.items():
        kid = v.key.key_id
        # caught up: same master chain as the others
        assert abs(v.master.height - ref.master.height) <= 2
        assert v.master.block_ids.get(ref.master.height - 3) == ref.master.block_ids.get(ref.master.height - 3)
        # signs again: its precommit is in recent master commit certificates
        recent = range(max(1, ref.master.height - 15), ref.master.height)
        assert any(kid in signers(ref, s) for s in recent), f"v{i} never signed after restart"
        # nobody blamed it for a fork or an equivocation
        for j, evs in sim.validator_events.items():
            assert not any(isinstance(e, ForkBlamed) and e.source in (kid, v.key.public) for e in evs)
        # its balances equal the others' (state rebuilt from the journal + catch-up)
        for shard, st in ref.committed.items():
            if v.tops[shard] == ref.tops[shard]:
                assert v.committed[shard].state_hash() == st.state_hash()


def test_full_node_follower_applies_master_blocks_to_its_own_state():
    """The full node's ChainFollower, fed the master commit certificates a
    validator accepted, ends with the same shard and masterchain states and knows every
    finalized message."""
    from remp_node.core.follower import ChainBlockApplied, ChainFollower
    from remp_node.wire.keys import NodeKey
    from remp_node.core.state import make_wallet_message, wallet_address
    from remp_node.core.validator import CH_MASTER, mux
    w = WalletSet(12, "follower")
    mk = NodeKey.from_seed(b"\x09" * 32)
    sim = Simulation(SimConfig(validators=8, group_size=4, seed=5, mc_catchain_lifetime=5.0),
                     wallets=w.genesis(), masterchain_wallets=[(mk.public, 500)])
    t0 = int(sim.now)
    ids = [sim.submit(w.transfer(i, 7, t0 + 3600, dest=w.addresses[(i + 1) % 12])) for i in range(12)]
    mc_addr = wallet_address(mk.public, -1)
    ids.append(sim.submit(make_wallet_message(mk, mc_addr, w.addresses[0], 40, t0 + 3600)))
    assert sim.run_until(lambda: all(sim.final_outcome(m) for m in ids), 60.0)
    sim.run(6.0)            # a session switch: the follower must use the new groups
    ref = sim.validators[0]
    f = ChainFollower(NodeKey.from_seed(b"\x07" * 32), sim.config, sim.zerostate.copy())
    src = ref.key.key_id
    for seqno in range(1, ref.master.height):
        f.receive_datagram(mux(CH_MASTER, f.master.session_id, ref.master.commit_for(seqno)), src, sim.now)
    assert f.master.height == ref.master.height
    assert not f.dropped, f.dropped
    evs = []
    while (e := f.next_event()) is not None:
        evs.append(e)
    assert sum(isinstance(e, ChainBlockApplied) for e in evs) == ref.master.height - 1
    assert set(ids) <= set(f.finalized)
    for shard, st in ref.committed.items():
        assert f.state.states[shard].state_hash() == st.state_hash()
    assert f.state.masterchain.get(mc_addr).balance == 460
    assert f.state.masterchain.state_hash() == ref.mc_committed.state_hash()
    assert f.client_groups(0x4000000000000000, sim.now)[0] == ref.client_groups(0x4000000000000000, sim.now)[0]


def test_every_status_a_validator_sends_to_the_full_node_is_reported_even_after_final():
    """Receipts that arrive after a message's final status (slower validators' Finalized,
    late IncludedIntoAcceptedBlock) are still verified and reported (ReceiptEvent.late), so a
    subscriber / the Redis stream gets every status every validator produced."""
    from remp_node.core.client import ReceiptEvent
    from remp_node.core.validator import ReceiptSent
    w = WalletSet(20, "late")
    sim = Simulation(SimConfig(validators=8, group_size=4, seed=11, mc_catchain_lifetime=30.0, reorder=0.2),
                     wallets=w.genesis())
    t0 = int(sim.now)
    ids = [sim.submit(w.transfer(i, 3, t0 + 3600)) for i in range(20)]
    produced = []
    orig = sim._on_validator_event

    def spy(i, ev):
        if isinstance(ev, ReceiptSent) and sim.fullnode_id in ev.dst:
            produced.append(ev.signed.serialize())
        orig(i, ev)
    sim._on_validator_event = spy
    assert sim.run_until(lambda: all(sim.final_outcome(m) for m in ids), 60.0)
    sim.run(3.0)
    got = [e for e in sim.client_events if isinstance(e, ReceiptEvent) and e.origin == "validator"]
    assert any(e.late for e in got)              # the case that used to be dropped
    assert sorted(e.signed().serialize() for e in got) == sorted(produced)


def test_a_restarted_validator_signs_no_second_receipt_for_a_status_it_signed():
    """A validator restarted from its journal learns the messages of its queue again from
    the RMQ (the catchain records of its session) and meets them again in blocks: for every
    (message, status) it had signed before the crash it sends the receipt it signed then or
    nothing, never a second one with a new timestamp (a different digest: the full node
    would have to tell the two apart)."""
    from remp_node.core.validator import ReceiptSent
    w = WalletSet(30, "resign")
    sim = Simulation(SimConfig(validators=8, group_size=4, seed=3, mc_catchain_lifetime=30.0, journal=True,
                               block_interval=0.1, master_block_interval=0.3),
                     wallets=w.genesis())
    t0 = int(sim.now)
    signed: dict[tuple[int, bytes, bytes], set[bytes]] = {}
    orig = sim._on_validator_event

    def spy(i, ev):
        if isinstance(ev, ReceiptSent):
            signed.setdefault((i, ev.message_id, ev.signed.open().status.pack()), set()).add(ev.signed.serialize())
        orig(i, ev)
    sim._on_validator_event = spy
    ids = [sim.submit(w.transfer(i, 5, t0 + 3600)) for i in range(15)]
    sim.run(0.2)                        # PutIntoQueue / AcceptedByQueue signed, not final yet
    g = sim.validators[0].groups(sim.validators[0].session)[0x4000000000000000]
    victims = [i for i, v in enumerate(sim.validators) if v.key.public in g][:2]
    before = {k for k in signed if k[0] in victims}
    assert before                                   # they had signed receipts before the crash
    for i in victims:
        sim.crash(i)
    ids += [sim.submit(w.transfer(i, 5, t0 + 3600)) for i in range(15, 30)]
    sim.run(0.5)
    for i in victims:
        sim.restart(i)
    assert sim.run_until(lambda: all(sim.final_outcome(m) for m in ids), 90.0)
    sim.run(3.0)
    assert {sim.final_outcome(m) for m in ids} == {"finalized"}
    twice = {k: len(v) for k, v in signed.items() if len(v) > 1}
    assert not twice, f"{len(twice)} (validator, message, status) signed twice: {list(twice.values())[:5]}"
    # the restarted validators met statuses they had signed (sent again as they were) and
    # took part again (statuses signed after the restart)
    assert sum(sim.validators[i].stats["receipts_kept"] for i in victims) > 0
    assert {k for k in signed if k[0] in victims} - before
