"""Master proposals and commits carry shard commits by reference between masterchain members.

A master block commits shard blocks by carrying their commit certificates (candidate with the
message bodies + precommits). Every masterchain member already holds them (its own group's
blocks, or the group's announces), so between members a master consensus datagram goes as
CH_MASTER_REF: each shard commit replaced by its sha256; a member that lacks one parks the
datagram and asks the sender (CH_COMMIT_NEED), which answers with the commit as an announce.
Full master blocks still go to non-members (the full node's follower) and into the journal.

In memory, fake clock (remp_node/testnet/sim.py), 2 shards x 7 validators."""
from __future__ import annotations

from collections import Counter

import pytest

from remp_node.core import consensus as cons
from remp_node.testnet.sim import SimConfig, Simulation
from remp_node.wire.node_tl import (CH_ANNOUNCE, CH_COMMIT_NEED, CH_MASTER, CH_MASTER_REF, CommitRef, PayloadError,
                                   decode_master_block, decode_refs, encode_refs)

from tests.remp_fixtures import WalletSet

pytestmark = pytest.mark.slow


def test_refs_round_trip_and_malformed_input():
    segs = [b"head", CommitRef(b"\x01" * 32), b"", CommitRef(b"\x02" * 32), b"tail" * 100]
    assert decode_refs(encode_refs(segs)) == segs
    body = encode_refs(segs)
    for bad in (body[:-1], body + b"\x00\x00\x00\x00", b"\x01\x00\x00\x00\x07\x00\x00\x00", b""):
        with pytest.raises(PayloadError):
            decode_refs(bad)
    assert issubclass(PayloadError, ValueError)


def _run(sim: Simulation, w: WalletSet, n: int, gap: float = 0.02) -> list[bytes]:
    t0 = int(sim.now)
    sim.run(1.0)
    ids = []
    for i in range(n):
        ids.append(sim.submit(w.transfer(i, 5, t0 + 3600)))
        sim.run(gap)
    assert sim.run_until(lambda: all(sim.finals.get(m) for m in ids), 60.0)
    return ids


def test_master_traffic_between_members_carries_shard_commits_by_reference():
    w = WalletSet(120, "refs")
    sim = Simulation(SimConfig(seed=11, mc_catchain_lifetime=60.0, block_interval=0.25,
                               master_block_interval=0.4), wallets=w.genesis())
    sizes: Counter = Counter()
    biggest = {CH_MASTER: 0, CH_MASTER_REF: 0}
    members = {v.key.key_id for v in sim.validators}

    def watch(src, dst, data, now):
        if data[0] in biggest and dst in members:
            biggest[data[0]] = max(biggest[data[0]], len(data))
            sizes[data[0]] += len(data)
        return False
    sim.net.drop_filter = watch
    ids = _run(sim, w, 120)
    assert {sim.final_outcome(m) for m in ids} == {"finalized"}
    # the masterchain committed multi-message shard blocks, yet no master datagram between
    # members carried them whole: every proposal / commit with shard commits went by reference
    v = sim.validators[0]
    blocks = [p for _, p in v.master_blocks if p.shard_commits]
    assert blocks and max(sum(len(c) for c in p.shard_commits) for p in blocks) > 3000
    assert sum(x.stats["master_ref_out"] for x in sim.validators) > 0
    assert sum(x.stats["master_ref_in"] for x in sim.validators) > 0
    # a reference datagram is the proposal / commit envelope (signatures, pol certificate)
    # plus 32 bytes per shard commit: at most 2 transport parts, whatever the block carries
    fullest = max(sum(len(c) for c in p.shard_commits) for p in blocks)
    assert biggest[CH_MASTER_REF] < 2 * 1154 < fullest, (biggest, fullest)
    # every member's chain is the same, with the same shard commits (references rebuilt exactly)
    chains = {tuple(bid for bid, _ in x.master_blocks[:40]) for x in sim.validators}
    assert len(chains) == 1


def test_member_lacking_a_shard_commit_fetches_it_from_the_sender():
    """Every announce is lost its first two times (both group members' copies): outside
    members lack every other group's commits, park the referencing master datagrams, ask the
    sender (CH_COMMIT_NEED), get the commit and go on; every message is finalized once."""
    w = WalletSet(60, "refs-need")
    sim = Simulation(SimConfig(seed=12, mc_catchain_lifetime=60.0, block_interval=0.25, master_block_interval=0.4,
                               loss=0.05, duplicate=0.05, reorder=0.1), wallets=w.genesis())
    seen: Counter = Counter()
    needs = []

    def drop(src, dst, data, now):
        if data[0] == CH_COMMIT_NEED:
            needs.append((src, dst))
        if data[0] != CH_ANNOUNCE:
            return False
        seen[(dst, data)] += 1
        return seen[(dst, data)] <= 2
    sim.net.drop_filter = drop
    ids = _run(sim, w, 60, gap=0.05)
    sim.run(3.0)
    assert {sim.final_outcome(m) for m in ids} == {"finalized"}
    assert [m.hex() for m in ids if len(sim.committed[m]) != 1] == []
    assert needs and sum(v.stats["commit_needs"] for v in sim.validators) > 0
    assert sum(v.stats["commits_resent"] for v in sim.validators) > 0
    assert sum(v.stats["master_ref_parked"] for v in sim.validators) > 0
    # the full node's follower got whole master blocks (it holds no shard commits) and
    # applied every committed message
    chains = {tuple(bid for bid, _ in v.master_blocks[:20]) for v in sim.validators}
    assert len(chains) == 1


def test_a_reference_the_sender_cannot_back_changes_nothing():
    """A CH_MASTER_REF naming a commit nobody has is parked (bounded), asked for once per
    NEED_RETRY, and never reaches the consensus: no vote, no drop of honest traffic."""
    w = WalletSet(4, "refs-bogus")
    sim = Simulation(SimConfig(seed=13, mc_catchain_lifetime=60.0), wallets=w.genesis())
    sim.run(2.0)
    v, other = sim.validators[0], sim.validators[1]
    from remp_node.core.validator import MAX_PARKED, mux
    sid = v.master.session_id
    h0 = v.master.height
    for i in range(MAX_PARKED + 10):
        v.receive_datagram(mux(CH_MASTER_REF, sid, encode_refs([b"x", CommitRef(bytes([i]) * 32)])), other.key.key_id,
                           sim.now)
    assert len(v._parked) == MAX_PARKED
    out = v.datagrams_to_send(sim.now)
    needs = [d for dst, d in out if d[0] == CH_COMMIT_NEED]
    assert needs and all(dst == other.key.key_id for dst, d in out if d[0] == CH_COMMIT_NEED)
    # a garbage reference body is a counted drop
    v.receive_datagram(mux(CH_MASTER_REF, sid, b"\x05"), other.key.key_id, sim.now)
    assert v.stats["dropped"] >= 1
    sim.run(2.0)
    assert v.master.height >= h0
    # decode_master_block of a whole master block still works (journal and follower format)
    assert decode_master_block(cons.parse_message(v.master.commit_for(v.master.height - 1)).candidate.payload) \
        if v.master.height > 1 else True
