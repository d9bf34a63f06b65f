"""External messages to workchain -1 accounts are processed by the masterchain
validators like any shard's (in memory, fake clock).

Before: build_zero_state raised ValueError for a workchain -1 account, and the full node
rejected such a message with "Wrong workchain -1"."""
from __future__ import annotations

import pytest

from remp_node.wire.keys import NodeKey
from remp_node.wire.messages import parse_external_message
from remp_node.wire.receipts import verify_receipt_json
from remp_node.wire.shards import MASTERCHAIN_KEY, shard_hex
from remp_node.testnet.sim import SimConfig, Simulation
from remp_node.core.state import build_zero_state, make_wallet_message, wallet_address
from remp_node.core.validator import MasterPayload, decode_master_block, encode_master_block, BlockMessage

from tests.remp_fixtures import has_main_sequence, full_sequences, keys

pytestmark = pytest.mark.slow


def test_zerostate_holds_masterchain_accounts_and_routes_them():
    k = NodeKey.from_seed(bytes(range(32)))
    zs = build_zero_state(0, 2, [], ["-1:" + "11" * 32], masterchain_wallets=[(k.public, 50)])
    mc = wallet_address(k.public, -1)
    assert mc.startswith("-1:")
    assert zs.shard_of(mc) == MASTERCHAIN_KEY
    assert zs.state_for(mc).get(mc).balance == 50
    assert zs.state_for("-1:" + "11" * 32).get("-1:" + "11" * 32) is not None
    assert shard_hex(MASTERCHAIN_KEY) == "8000000000000000"
    # a message to the masterchain parses when -1 is allowed and says why when it is not
    boc = make_wallet_message(k, mc, mc, 1, 2_000_000_000)
    assert parse_external_message(boc, zs.workchains).workchain == -1
    with pytest.raises(ValueError, match="Wrong workchain -1"):
        parse_external_message(boc, (0,))


def test_master_payload_round_trip_with_messages():
    m = BlockMessage(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32, b"boc")
    p = MasterPayload(3, 1234, (b"commit",), (m,))
    assert decode_master_block(encode_master_block(p)) == p


def test_masterchain_wallet_messages_finalize_and_bad_ones_are_rejected():
    wk = keys(3, "mc-wallets")
    mc_wallets = [(k.public, 1000) for k in wk]
    sim = Simulation(SimConfig(validators=8, group_size=4, masterchain_validators=5, seed=7,
                               mc_catchain_lifetime=40.0),
                     masterchain_wallets=mc_wallets)
    t0 = int(sim.now)
    addr = [wallet_address(k.public, -1) for k in wk]
    good = [make_wallet_message(wk[i], addr[i], addr[(i + 1) % 3], 100 + i, t0 + 3600, nonce=i) for i in range(3)]
    # signed by the wrong key: passes the full node only if pre-execution is skipped, so it
    # must be refused at the full node (RejectedByFullnode), not with "Wrong workchain -1"
    forged = make_wallet_message(wk[1], addr[0], addr[2], 5, t0 + 3600, nonce=9)
    # two transfers that fit the balance alone but not together: the collator takes the
    # first and rejects the second (RejectedByCollator)
    race_a = make_wallet_message(wk[2], addr[2], addr[0], 700, t0 + 3600, nonce=20)
    race_b = make_wallet_message(wk[2], addr[2], addr[0], 800, t0 + 3600, nonce=21)
    ids = [sim.submit(b) for b in good]
    fid = sim.submit(forged)
    ra, rb = sim.submit(race_a), sim.submit(race_b)
    done = sim.run_until(lambda: all(sim.final_outcome(m) for m in ids + [fid, ra, rb]), 60.0)
    assert done, {m.hex()[:8]: sim.final_outcome(m) for m in ids + [fid, ra, rb]}
    for m in ids:
        assert sim.final_outcome(m) == "finalized"
        assert len(sim.committed[m]) == 1               # exactly once, in a master block
    f = sim.finals[fid][0]
    assert f.kind == "RejectedByFullnode" and "Wrong workchain" not in f.reason
    outs = sorted([sim.final_outcome(ra), sim.final_outcome(rb)])
    assert outs == ["finalized", "rejected"]
    rejected = ra if sim.final_outcome(ra) == "rejected" else rb
    assert "Insufficient balance" in sim.finals[rejected][0].reason
    # only masterchain validators answered, each with the main sequence of statuses
    mc_ids = {v.key.key_id.hex() for v in sim.validators[:5]}
    seqs = full_sequences(sim.receipts, ids[0].hex())
    validator_seqs = {s: k for s, k in seqs.items() if s != sim.fullnode_id.hex()}
    assert validator_seqs and set(validator_seqs) <= mc_ids
    assert all(has_main_sequence(k) for k in validator_seqs.values()), validator_seqs
    keyset = sim.all_validator_keys + [sim.fullnode_key.public]
    assert sim.bad_receipts == []
    for r in sim.receipts:
        verify_receipt_json(r, keyset)
    # the masterchain state moved the value on every validator that follows the chain
    for v in sim.validators:
        assert v.mc_committed.get(addr[1]).balance == 1000 - 101 + 100
