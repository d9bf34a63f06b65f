"""Block consensus (remp_node/core/consensus.py) and the session schedule (remp_node/core/schedule.py).

The consensus cores run against each other on an in-memory datagram network with a fake
clock (event-driven: time jumps to the next delivery or timer), with loss, duplication,
reordering, crashes, a partitioned member, and one equivocating member. The agreement check
compares every accepted block id at every seqno across all members and verifies each
BlockAccepted's signatures against the members' keys.
"""
from __future__ import annotations

import hashlib
import time
from collections import defaultdict

import pytest

from daemon_runtime.memnet import MemNetwork
from remp_node.core import consensus as C
from remp_node.core import schedule as S
from remp_node.wire.keys import NodeKey
from remp_node.wire.tl import BlockIdExt, pack_id, tl_constructor_id

SHARD0 = 0x4000000000000000


def keys(n: int, tag: str = "v") -> list[NodeKey]:
    return [NodeKey.from_seed(hashlib.sha256(f"{tag}{i}".encode()).digest()) for i in range(n)]


class Node:
    """One member: a real BlockConsensus plus the caller-side block logic a validator has —
    a message pool (collate takes the oldest pending messages), and validate refusing a
    candidate that holds a message already in an accepted block."""

    def __init__(self, key, members, *, wc=0, shard=SHARD0, round_timeout=1.0, block_interval=0.2,
                 pool=None, replay=False, bad=False):
        self.key = key
        self.pool = list(pool or [])
        self.included: set[bytes] = set()
        self.replay = replay       # collates a message that is already in an accepted block
        self.bad = bad             # collates a payload everybody refuses
        self.accepted: dict[int, C.BlockAccepted] = {}
        self.events: list = []
        self.core = C.BlockConsensus(wc, shard, [k.public for k in members], key, start_seqno=1,
                                     prev_block_id=None, round_timeout=round_timeout,
                                     block_interval=block_interval, collate=self.collate,
                                     validate=self.validate)

    def collate(self, seqno: int, now: float) -> bytes | None:
        if self.bad:
            return b"BAD|" + self.key.key_id[:4]
        msgs = [m for m in self.pool if m not in self.included][:3]
        if self.replay and self.included:
            msgs = [sorted(self.included)[0]] + msgs[:2]
        return b"blk|" + b",".join(msgs)

    def validate(self, seqno: int, payload: bytes) -> str | None:
        if not payload.startswith(b"blk|"):
            return "unparsable payload"
        msgs = [m for m in payload[4:].split(b",") if m]
        dup = [m for m in msgs if m in self.included]
        if dup:
            return f"message {dup[0].decode()} already in an accepted block"
        if len(set(msgs)) != len(msgs):
            return "message twice in one candidate"
        return None

    def drain(self) -> None:
        while (ev := self.core.next_event()) is not None:
            self.events.append(ev)
            if isinstance(ev, C.BlockAccepted):
                assert ev.block_id.seqno not in self.accepted
                self.accepted[ev.block_id.seqno] = ev
                self.included.update(m for m in ev.payload[4:].split(b",") if m)


class Equivocator(Node):
    """A Byzantine member: runs a real core, but whenever it sends a proposal or a vote
    for the first time it sends a conflicting, validly signed version (another candidate /
    another block) to half of the members instead, and the original to them one step later,
    so honest members hold both signed versions. (The core's own resends used to deliver the
    original; they now go only resend_interval after a message was sent, rarely within a
    round without faults.)"""

    def __init__(self, key, members, **kw):
        super().__init__(key, members, **kw)
        self.members = members
        self.fakes: dict[tuple, bytes] = {}
        self.evil_blocks: dict[tuple, BlockIdExt] = {}
        self.originals: set[bytes] = set()
        self.later: list[tuple[bytes, bytes]] = []

    def fake_for(self, data: bytes) -> bytes:
        msg = C.parse_message(data)
        core = self.core
        if isinstance(msg, C.Proposal):
            c = msg.candidate
            ident = ("p", c.seqno, msg.round)
            if ident not in self.fakes:
                evil = C.Candidate(c.workchain, c.shard, c.seqno, c.prev, c.collator, c.payload + b",EVIL")
                self.evil_blocks[(c.seqno, msg.round)] = evil.block_id
                self.fakes[ident] = C.make_proposal(self.key, core.session_id, msg.round, -1, evil).pack()
            return self.fakes[ident]
        if isinstance(msg, C.Vote):
            ident = ("v", msg.kind, msg.block.seqno, msg.round)
            if ident not in self.fakes:
                alt = self.evil_blocks.get((msg.block.seqno, msg.round))
                if alt is None or alt == msg.block:
                    alt = (C.nil_block(core.workchain, core.shard, msg.block.seqno) if not C.is_nil(msg.block)
                           else BlockIdExt(core.workchain, core.shard, msg.block.seqno, b"\x01" * 32, b"\x02" * 32))
                self.fakes[ident] = C.make_vote(self.key, core.session_id, msg.kind, msg.round, alt).pack()
            return self.fakes[ident]
        return data

    def outgoing(self, now):
        out, self.later = self.later, []
        odd = {m.key_id for i, m in enumerate(self.members) if i % 2}
        batch = self.core.datagrams_to_send(now)
        for dst, data in batch:
            if dst in odd and data not in self.originals and not data.startswith(pack_id(C.COMMIT)):
                out.append((dst, self.fake_for(data)))
                self.later.append((dst, data))
            else:
                out.append((dst, data))
        self.originals.update(data for _, data in batch)
        return out


class Net:
    """Consensus members over the shared in-memory network (daemon_runtime.memnet) with a
    fake clock: per-datagram latency (base + jitter, so datagrams reorder), loss and
    duplication probabilities, crashed members (the network's crashed set), and partitioned
    members (all their traffic lost until healed, also what was in flight)."""

    def __init__(self, nodes: list[Node], *, seed=1, loss=0.0, dup=0.0, base=0.005, jitter=0.0):
        self.nodes = {n.key.key_id: n for n in nodes}
        self.wire = MemNetwork(seed, loss=loss, duplicate=dup, latency=base, jitter=jitter)
        self.wire.drop_filter = lambda src, dst, data, now: src in self.partitioned or dst in self.partitioned
        self.now = 0.0
        self.partitioned: set[bytes] = set()
        self.delivered = 0

    @property
    def crashed(self) -> set[bytes]:
        return self.wire.crashed

    @crashed.setter
    def crashed(self, keys) -> None:
        self.wire.crashed = set(keys)

    def _flush(self, node: Node):
        out = node.outgoing(self.now) if isinstance(node, Equivocator) else node.core.datagrams_to_send(self.now)
        src = node.key.key_id
        for dst, data in out:
            self.wire.send(src, dst, data, self.now)
        node.drain()

    def alive(self):
        return [n for k, n in self.nodes.items() if k not in self.crashed]

    def run(self, until: float, stop=None):
        for n in self.alive():
            n.core.handle_timer(self.now)
            self._flush(n)
        steps = 0
        while self.now < until:
            steps += 1
            assert steps < 2_000_000
            t_timer = min((n.core.get_timer() for n in self.alive()), default=until)
            t_msg = self.wire.next_delivery()
            t_msg = until if t_msg is None else t_msg
            self.now = max(self.now, min(t_timer, t_msg, until))
            for dst, src, data in self.wire.deliver_due(self.now):
                node = self.nodes.get(dst)
                if node is None or dst in self.partitioned or src in self.partitioned:
                    continue
                self.delivered += 1
                node.core.receive_datagram(data, src, self.now)
                self._flush(node)
            for n in self.alive():
                t = n.core.get_timer()
                if t is not None and t <= self.now:
                    n.core.handle_timer(self.now)
                    self._flush(n)
            if stop is not None and stop(self):
                return


def check_agreement(nodes: list[Node], members: list[NodeKey]) -> int:
    """Every seqno has one block id across members; each BlockAccepted carries >= quorum
    valid precommit signatures. Returns the highest seqno accepted by all."""
    by_seqno = defaultdict(set)
    for n in nodes:
        for s, ev in n.accepted.items():
            by_seqno[s].add(ev.block_id)
            data = C.vote_signed_data(n.core.session_id, C.PRECOMMIT, ev.round, ev.block_id)
            pubs = {k.key_id: k.public for k in members}
            good = [w for w, sig in ev.signatures.items() if w in pubs and C.verify(pubs[w], data, sig)]
            assert len(good) == len(ev.signatures) >= C.quorum(len(members))
    for s, ids in by_seqno.items():
        assert len(ids) == 1, f"two different blocks accepted at seqno {s}: {ids}"
    heights = [max(n.accepted, default=0) for n in nodes]
    for n in nodes:   # every member's chain is contiguous and linked
        for s in sorted(n.accepted):
            if s - 1 in n.accepted:
                commit = C.parse_message(n.core.commit_for(s)) if n.core.commit_for(s) else None
                if commit is not None:
                    assert commit.candidate.prev == n.accepted[s - 1].block_id
    return min(heights)


def report(label, nodes, net, top, wall):
    sent = sum(n.core.sent_datagrams for n in nodes)
    print(f"\n[consensus {label}] n={len(nodes)} blocks={top} in {net.now:.1f} simulated s "
          f"({top / net.now:.2f} blocks/s), datagrams sent/block={sent / max(top, 1):.0f} "
          f"(n^2={len(nodes) ** 2}), delivered={net.delivered}, wall={wall:.2f}s")


def make_net(n=7, *, pool=40, seed=1, **netkw):
    ks = keys(n)
    msgs = [f"m{i:03d}".encode() for i in range(pool)]
    nodes = [Node(k, ks, pool=msgs) for k in ks]
    return ks, nodes, Net(nodes, seed=seed, **netkw)


# --- consensus tests ----------------------------------------------------------------------------

def test_tl_constructor_ids_are_crc32_of_documented_lines():
    assert C.VOTE == tl_constructor_id(C.TL_VOTE) and C.PROPOSAL == tl_constructor_id(C.TL_PROPOSAL)
    assert len({C.CANDIDATE, C.PROPOSAL, C.VOTE, C.COMMIT, C.GET_COMMITS, C.PROPOSAL_DATA, C.VOTE_DATA,
                C.SESSION, C.BLOCK_ROOT, C.MASTER_PAYLOAD}) == 10
    assert [C.quorum(n) for n in (1, 3, 4, 6, 7, 10)] == [1, 3, 3, 5, 5, 7]
    ids = [BlockIdExt(0, SHARD0, 5, b"\x01" * 32, b"\x02" * 32), BlockIdExt(0, 0xC000000000000000, 7, b"\x03" * 32, b"\x04" * 32)]
    assert C.decode_master_payload(C.encode_master_payload(ids)) == ids
    with pytest.raises(C.ConsensusWireError):
        C.decode_master_payload(C.encode_master_payload(ids)[:-3])


def test_seven_members_agree_on_a_chain():
    ks, nodes, net = make_net()
    t0 = time.perf_counter()
    net.run(6.0)
    wall = time.perf_counter() - t0
    top = check_agreement(nodes, ks)
    assert top >= 15, top   # block_interval 0.2 s, latency 5 ms: ~1 block per 0.22 s
    report("no faults", nodes, net, top, wall)
    # leaders rotate: block at seqno s collated by members[(s + round) % n]
    for s, ev in nodes[0].accepted.items():
        cand = C.parse_message(nodes[0].core.commit_for(s)).candidate
        assert cand.collator == nodes[0].core.leader(s, ev.round)
        assert ev.round == 0
    # no message is included twice; the pool is consumed oldest first
    seen = [m for s in sorted(nodes[0].accepted) for m in nodes[0].accepted[s].payload[4:].split(b",") if m]
    assert len(seen) == len(set(seen)) and seen == sorted(seen)
    assert all(sum(n.core.drops.values()) == 0 for n in nodes)


def test_loss_duplication_reordering_progress_and_agreement():
    ks, nodes, net = make_net(seed=7, loss=0.2, dup=0.1, jitter=0.03)
    t0 = time.perf_counter()
    net.run(20.0)
    wall = time.perf_counter() - t0
    top = check_agreement(nodes, ks)
    report("20% loss, 10% dup, 30 ms jitter", nodes, net, top, wall)
    assert top >= 10, top
    assert max(max(n.accepted) for n in nodes) - top <= 2
    assert sum(n.core.ignored["duplicate"] for n in nodes) > 0


def test_two_crashed_members_including_leaders_are_skipped():
    ks, nodes, net = make_net()
    net.crashed = {ks[2].key_id, ks[5].key_id}    # leaders of seqno 1 (and every 7th), 4, ...
    net.run(20.0)
    alive = net.alive()
    top = check_agreement(alive, ks)
    assert top >= 10, top
    skipped = [e for e in alive[0].events if isinstance(e, C.RoundSkipped)]
    assert skipped and {e.leader for e in skipped} <= {ks[2].key_id, ks[5].key_id}
    assert all("no candidate" in e.reason for e in skipped)
    for s, ev in alive[0].accepted.items():
        leader0 = alive[0].core.leader(s, 0)
        assert (ev.round > 0) == (leader0 in net.crashed)
        assert len(ev.signatures) >= 5 and not set(ev.signatures) & net.crashed


def test_equivocating_member_cannot_fork_and_is_named():
    ks = keys(7)
    msgs = [f"m{i:03d}".encode() for i in range(60)]
    byz_key = ks[3]
    nodes = [Equivocator(k, ks, pool=msgs) if k is byz_key else Node(k, ks, pool=msgs) for k in ks]
    net = Net(nodes, seed=3, jitter=0.02)
    net.run(20.0)
    honest = [n for n in nodes if n.key is not byz_key]
    top = check_agreement(nodes, ks)
    assert top >= 10, top
    odd = {k.key_id for i, k in enumerate(ks) if i % 2}
    for n in honest:
        evs = [e for e in n.events if isinstance(e, C.EquivocationDetected)]
        if n.key.key_id not in odd:
            assert not evs     # they only ever saw one version
            continue
        assert evs, "a member that received both versions records the double-signing"
        assert {e.member for e in evs} == {byz_key.key_id}
        for e in evs:
            assert C.verify_evidence(n.core.session_id, [k.public for k in ks], e.evidence)
        assert {e.evidence.kind for e in evs} >= {"prevote", "precommit"}
    kinds = {e.evidence.kind for n in honest for e in n.events if isinstance(e, C.EquivocationDetected)}
    assert "proposal" in kinds
    # forged evidence (the member's real message twice, or another member named) is refused
    witness = next(n for n in honest if n.key.key_id in odd)
    ev = next(e for e in witness.events if isinstance(e, C.EquivocationDetected)).evidence
    assert not C.verify_evidence(witness.core.session_id, [k.public for k in ks],
                                 C.Evidence(ev.member, ev.seqno, ev.round, ev.kind, ev.first, ev.first))
    assert not C.verify_evidence(witness.core.session_id, [k.public for k in ks],
                                 C.Evidence(ks[0].key_id, ev.seqno, ev.round, ev.kind, ev.first, ev.second))
    # EVIL candidates were proposed but never accepted (they never gather a quorum)
    assert not any(b"EVIL" in ev.payload for n in honest for ev in n.accepted.values())


@pytest.mark.parametrize("seed", [2, 5])
def test_equivocator_with_loss_and_a_crash_still_progresses(seed):
    """Regression: members that first got the equivocator's other prevote must still count
    the polka the others locked on (all distinct signed votes count), or a locked block is
    re-proposed forever without a quorum. Seed 2 stalled at 2 blocks before the fix."""
    ks = keys(7)
    msgs = [f"m{i:03d}".encode() for i in range(200)]
    nodes = [Equivocator(k, ks, pool=msgs) if i == 3 else Node(k, ks, pool=msgs) for i, k in enumerate(ks)]
    net = Net(nodes, seed=seed, loss=0.25, dup=0.1, jitter=0.05)
    net.crashed = {ks[seed % 3].key_id}
    net.run(15.0)
    assert check_agreement(net.alive(), ks) >= 10


def test_resends_wait_resend_interval_per_message_and_skip_members_that_moved_on():
    """A round that completes within resend_interval of a message resends nothing (one timer
    for the whole round sent a vote cast 50 ms before again); a stalled round resends each
    own message resend_interval after it was last sent: the proposal only to members that
    did not prevote or precommit its block, the prevote only to members that did not
    precommit a block in the round; the precommit to everyone."""
    ks, nodes, net = make_net()
    net.run(3.0)
    assert check_agreement(nodes, ks) >= 8
    assert sum(n.core.resent for n in nodes) == 0
    # stall: 3 of 7 partitioned, the 4 others (< quorum 5) cannot finish a round
    ks, nodes, net = make_net()
    net.run(1.0)
    h = nodes[0].core.height
    cut = [n for n in nodes if n.core.leader(h, 0) != n.key.key_id][:3]
    net.partitioned = {n.key.key_id for n in cut}
    live = [n for n in nodes if n not in cut]
    leader = next(n for n in nodes if n.core.leader(h, 0) == n.key.key_id)
    net.run(net.now + 0.6, stop=lambda net: "proposal" in leader.core._my and all(
        "prevote" in n.core._my for n in live))
    assert "proposal" in leader.core._my and leader.core.height == h and leader.core.round == 0
    sent_at = leader.core._my["proposal"].at
    cut_ids = {n.key.key_id for n in cut}
    # the leader is woken at resend_interval after its proposal left (not before)
    assert leader.core.get_timer() <= sent_at + leader.core.resend_interval + 1e-9
    t = sent_at + leader.core.resend_interval
    net.run(t - 1e-3)        # the live members' prevotes reach the leader meanwhile
    assert leader.core._my["proposal"].at == sent_at and leader.core._my["prevote"].at == sent_at
    leader.core.datagrams_to_send(t)
    leader.core.handle_timer(t)
    out = leader.core.datagrams_to_send(t)
    kinds = defaultdict(set)
    for dst, data in out:
        kinds[type(C.parse_message(data)).__name__ + (
            "" if not isinstance(C.parse_message(data), C.Vote) else str(C.parse_message(data).kind))].add(dst)
    # every live member prevoted the proposal: it goes again only to the partitioned ones
    assert kinds["Proposal"] == cut_ids
    # nobody precommitted a block (no polka among 4): the prevote goes to every other member
    assert kinds["Vote0"] == {n.key.key_id for n in nodes if n is not leader}
    assert leader.core.resent == len(out)


def test_invalid_candidates_are_never_accepted():
    ks = keys(7)
    msgs = [f"m{i:03d}".encode() for i in range(60)]
    nodes = [Node(k, ks, pool=msgs, bad=(i == 1), replay=(i == 4)) for i, k in enumerate(ks)]
    net = Net(nodes, seed=5, jitter=0.01)
    net.run(20.0)
    top = check_agreement(nodes, ks)
    assert top >= 10, top
    for n in nodes:
        payloads = [ev.payload for ev in n.accepted.values()]
        assert not any(p.startswith(b"BAD") for p in payloads)
        seen = [m for p in payloads for m in p[4:].split(b",") if m]
        assert len(seen) == len(set(seen)), "a message was accepted in two blocks"
    rejected = [e for e in nodes[0].events if isinstance(e, C.CandidateRejected)]
    assert {e.leader for e in rejected} == {ks[1].key_id, ks[4].key_id}
    assert any("already in an accepted block" in e.reason for e in rejected)
    assert any(e.reason == "unparsable payload" for e in rejected)
    # rounds led by the refused leaders end early (nil quorum), well before the timeout
    for s, ev in nodes[0].accepted.items():
        if nodes[0].core.leader(s, 0) == ks[1].key_id:
            assert ev.round >= 1


def test_lagging_member_catches_up_with_commits():
    ks, nodes, net = make_net(seed=11, jitter=0.01)
    lag = nodes[6]
    net.partitioned = {lag.key.key_id}
    net.run(4.0)
    others = [n for n in nodes if n is not lag]
    assert min(max(n.accepted) for n in others) >= 10
    assert len(lag.accepted) == 0
    net.partitioned = set()
    net.run(8.0)
    top = check_agreement(nodes, ks)
    assert len(lag.accepted) >= 20 and max(lag.accepted) >= max(max(n.accepted) for n in others) - 1
    assert top >= 20


def test_observer_follows_commits_by_polling():
    ks, nodes, net = make_net(seed=2)
    obs_key = keys(1, "observer")[0]
    observer = Node(obs_key, ks, pool=[])
    observer.core = C.BlockConsensus(0, SHARD0, [k.public for k in ks], obs_key, start_seqno=1, prev_block_id=None,
                                     round_timeout=1.0, block_interval=0.2, collate=observer.collate,
                                     validate=observer.validate)
    net.nodes[obs_key.key_id] = observer
    net.run(6.0)
    assert not observer.core.is_member
    assert len(observer.accepted) >= 10
    for s, ev in observer.accepted.items():
        assert nodes[0].accepted[s].block_id == ev.block_id


def test_bad_datagrams_are_dropped_with_counted_reasons():
    ks, nodes, net = make_net(seed=4)
    net.run(1.0)
    target = nodes[0].core
    src = ks[1].key_id
    good_commit = target.commit_for(1)
    assert good_commit is not None
    commit = C.parse_message(good_commit)
    stranger = keys(1, "stranger")[0]
    cases = {
        "malformed": [b"", b"\x00\x01\x02", good_commit[:-5], b"\xff" * 40],
        "oversized": [b"\x00" * (C.MAX_DATAGRAM + 1)],
        "wrong_session": [C.GetCommits(b"\x09" * 32, 0, 4).pack()],
        "not_member": [C.make_vote(stranger, target.session_id, C.PREVOTE, 0,
                                   C.nil_block(0, SHARD0, target.height)).pack()],
        "bad_signature": [C.Vote(target.session_id, C.PREVOTE, 0, ks[1].key_id,
                                 C.nil_block(0, SHARD0, target.height), b"\x00" * 64).pack()],
        "wrong_chain": [C.make_vote(ks[1], target.session_id, C.PREVOTE, 0,
                                    C.nil_block(0, 0xC000000000000000, target.height)).pack()],
    }
    # a commit whose certificate is too small, for the next height
    nxt = C.Candidate(0, SHARD0, target.height, target.prev, ks[1].key_id, b"blk|x")
    cases["bad_commit"] = [C.Commit(target.session_id, 0, nxt.pack(), commit.signatures[:3], nxt).pack()]
    before = dict(target.drops)
    for reason, datas in cases.items():
        for d in datas:
            target.receive_datagram(d, src, net.now)
        assert target.drops[reason] - before.get(reason, 0) == len(datas), reason
    drops = [e for e in (iter(target.next_event, None)) if isinstance(e, C.DatagramDropped)]
    assert {e.reason for e in drops} == set(cases)       # reported once per (src, reason)
    assert len(drops) == len(cases)
    with pytest.raises(C.ConsensusWireError):
        C.parse_message(b"\x01\x02\x03\x04")
    # the chain goes on undisturbed
    nodes[0].drain()
    net.run(3.0)
    assert check_agreement(nodes, ks) >= 8


def test_masterchain_commits_shard_block_ids():
    ks = keys(4, "mc")
    shard_ids = [BlockIdExt(0, SHARD0, s, hashlib.sha256(b"r%d" % s).digest(), hashlib.sha256(b"f%d" % s).digest())
                 for s in range(1, 30)]

    class Master(Node):
        def collate(self, seqno, now):
            return C.encode_master_payload([b for b in shard_ids if b not in self.included][:2])

        def validate(self, seqno, payload):
            try:
                ids = C.decode_master_payload(payload)
            except C.ConsensusWireError as exc:
                return str(exc)
            return "shard block committed twice" if any(b in self.included for b in ids) else None

        def drain(self):
            while (ev := self.core.next_event()) is not None:
                self.events.append(ev)
                if isinstance(ev, C.BlockAccepted):
                    self.accepted[ev.block_id.seqno] = ev
                    self.included.update(C.decode_master_payload(ev.payload))

    nodes = []
    for k in ks:
        m = Master(k, ks)
        m.core = C.BlockConsensus(C.MASTER_WORKCHAIN, C.MASTER_SHARD, [x.public for x in ks], k, start_seqno=1,
                                  prev_block_id=None, round_timeout=1.0, block_interval=0.2,
                                  collate=m.collate, validate=m.validate)
        nodes.append(m)
    net = Net(nodes, seed=9, jitter=0.01)
    net.run(4.0)
    check_agreement(nodes, ks)
    for n in nodes:
        blk = n.accepted[1].block_id
        assert blk.workchain == -1 and blk.shard_hex == "8000000000000000"
    committed = [b for s in sorted(nodes[0].accepted) for b in C.decode_master_payload(nodes[0].accepted[s].payload)]
    assert committed == shard_ids[:len(committed)] and len(committed) >= 20


def test_step_table_refuses_impossible_transition():
    k = keys(1)[0]
    core = C.BlockConsensus(0, SHARD0, [k.public], k, start_seqno=1, prev_block_id=None, round_timeout=1.0,
                            block_interval=0.5, collate=lambda s, t: b"x", validate=lambda s, p: None)
    with pytest.raises(C.ConsensusStateError) as exc:
        core._transition("precommit")
    assert "NEW" in str(exc.value) and "precommit" in str(exc.value)
    core.handle_timer(0.0)
    assert core.height == 1 and core.get_timer() <= 0.5
    core.handle_timer(0.5)   # a single member accepts on its own, one block per interval
    assert core.height == 2 and isinstance(core.next_event(), C.BlockAccepted)
    for members, interval in (([k.public, k.public], 0.5), ([k.public], 0.0)):
        with pytest.raises(C.ConsensusUsageError):
            C.BlockConsensus(0, SHARD0, members, k, start_seqno=1, prev_block_id=None, round_timeout=1.0,
                             block_interval=interval, collate=lambda s, t: b"x", validate=lambda s, p: None)


# --- schedule tests -----------------------------------------------------------------------------------

def zcfg(n=10, **kw) -> S.ZeroStateConfig:
    ks = keys(n, "sched")
    base = dict(workchain=0, shards=S.split_shards(1),
                validators=[S.ValidatorInfo(k.public, f"127.0.0.1:{30000 + i}") for i, k in enumerate(ks)],
                shard_group_size=4, mc_catchain_lifetime=10.0, block_interval=0.5, genesis_time=100.0)
    base.update(kw)
    return S.ZeroStateConfig(**base)


def test_config_roundtrip_and_validation():
    cfg = zcfg()
    assert cfg.shards == [0x4000000000000000, 0xC000000000000000]
    d = cfg.to_dict()
    assert d["shards"] == ["4000000000000000", "c000000000000000"]
    assert S.ZeroStateConfig.from_dict(d) == cfg
    import json
    assert S.ZeroStateConfig.from_dict(json.loads(json.dumps(d))) == cfg
    mc = S.ZeroStateConfig.from_dict({**d, "masterchain_validators": [v["public_key"] for v in d["validators"][:3]]})
    assert S.masterchain_members(mc) == [v.public_key for v in cfg.validators[:3]]
    assert S.masterchain_members(cfg) == [v.public_key for v in cfg.validators]
    for bad in ({**d, "shards": ["4000000000000000"]}, {**d, "shards": ["8000000000000000", "4000000000000000"]},
                {**d, "mc_catchain_lifetime": 0}, {**d, "validators": d["validators"] + d["validators"][:1]},
                {**d, "masterchain_validators": ["00" * 32]}, {**d, "bogus": 1},
                {**d, "validators": [{"public_key": "00" * 32, "address": "nohost"}]}):
        with pytest.raises(S.ScheduleError):
            S.ZeroStateConfig.from_dict(bad)


def test_shard_of_uses_the_prefix():
    cfg = zcfg()
    assert cfg.shard_of(b"\x00" + b"\xff" * 31) == 0x4000000000000000
    assert cfg.shard_of(b"\x7f" + b"\xff" * 31) == 0x4000000000000000
    assert cfg.shard_of(b"\x80" + b"\x00" * 31) == 0xC000000000000000
    four = S.split_shards(2)
    assert four == [0x2000000000000000, 0x6000000000000000, 0xA000000000000000, 0xE000000000000000]
    assert S.shard_of(four, b"\x40" + bytes(31)) == 0x6000000000000000
    assert S.shard_of([S.FULL_SHARD], bytes(32)) == S.FULL_SHARD


def test_master_session_boundaries():
    cfg = zcfg(mc_catchain_lifetime=2.5, genesis_time=1000.0)
    assert S.master_session_at(cfg, 0.0) == 0
    assert S.master_session_at(cfg, 1000.0) == 0
    assert S.master_session_at(cfg, 1002.4999) == 0
    assert S.master_session_at(cfg, 1002.5) == 1
    assert S.master_session_at(cfg, 1000.0 + 2.5 * 7) == 7
    assert S.master_session_at(cfg, 1000.0 + 2.5 * 7 - 1e-9) == 6
    cfg2 = zcfg(mc_catchain_lifetime=0.1, genesis_time=0.0)
    for n in range(1, 200):    # float boundaries: session_start(n) is in session n
        assert S.master_session_at(cfg2, S.session_start(cfg2, n)) == n
    assert S.next_session_switch(cfg, 1003.0) == 1005.0
    assert S.message_obsolete(3, 5) and not S.message_obsolete(3, 4)


def test_shard_groups_deterministic_and_rotating():
    cfg = zcfg()
    h1, h2 = hashlib.sha256(b"mc1").digest(), hashlib.sha256(b"mc2").digest()
    g = S.shard_groups(cfg, 1, h1)
    assert g == S.shard_groups(S.ZeroStateConfig.from_dict(cfg.to_dict()), 1, h1)
    assert set(g) == set(cfg.shards)
    keys_all = {v.public_key for v in cfg.validators}
    for members in g.values():
        assert len(members) == 4 and len(set(members)) == 4 and set(members) <= keys_all
    # the seed changes the groups (session seqno and previous master block hash)
    assert S.shard_groups(cfg, 1, h2) != g and S.shard_groups(cfg, 2, h1) != g
    # across many sessions every validator serves each shard at some point
    served = defaultdict(set)
    for n in range(40):
        for shard, members in S.shard_groups(cfg, n, hashlib.sha256(b"%d" % n).digest()).items():
            served[shard].update(members)
    assert all(s == keys_all for s in served.values())
    # a group no larger than the validator set
    assert all(len(m) == 3 for m in S.shard_groups(zcfg(3, shard_group_size=7), 0, S.GENESIS_MASTER_HASH).values())


def test_dealt_shard_groups_are_disjoint_balanced_and_rotating():
    """group_draw "dealt": one seeded ranking dealt out shard after shard. 2 shards x 7 of
    14 validators: disjoint groups (each validator serves one shard per session); 3 shards x
    5 of 10: every validator in 1 or 2 groups; both rotate and stay deterministic; a config
    without the key keeps the independent draw."""
    cfg = S.ZeroStateConfig.from_dict({**zcfg(14, shard_group_size=7).to_dict(), "group_draw": "dealt"})
    assert S.ZeroStateConfig.from_dict(cfg.to_dict()).group_draw == "dealt"
    assert S.ZeroStateConfig.from_dict(zcfg(14, shard_group_size=7).to_dict()).group_draw == "independent"
    with pytest.raises(S.ScheduleError):
        S.ZeroStateConfig.from_dict({**cfg.to_dict(), "group_draw": "random"})
    keys_all = {v.public_key for v in cfg.validators}
    served = defaultdict(set)
    for n in range(40):
        h = hashlib.sha256(b"%d" % n).digest()
        g = S.shard_groups(cfg, n, h)
        assert g == S.shard_groups(cfg, n, h)
        assert all(len(m) == 7 == len(set(m)) for m in g.values())
        a, b = g.values()
        assert not set(a) & set(b) and set(a) | set(b) == keys_all
        for shard, members in g.items():
            served[shard].update(members)
            # leader order: by the shard's own seed, as the independent draw orders it
            seed = S.group_seed(n, h, cfg.workchain, shard)
            assert members == sorted(members, key=lambda k: hashlib.sha256(seed + k).digest())
    assert all(v == keys_all for v in served.values())
    assert S.shard_groups(cfg, 1, hashlib.sha256(b"x").digest()) != S.shard_groups(cfg, 1, hashlib.sha256(b"y").digest())
    three = S.ZeroStateConfig(workchain=0, shards=[0x2000000000000000, 0x6000000000000000, 0xC000000000000000],
                              validators=zcfg(10).validators, shard_group_size=5, group_draw="dealt")
    per = defaultdict(int)
    for members in S.shard_groups(three, 3, S.GENESIS_MASTER_HASH).values():
        assert len(set(members)) == 5
        for k in members:
            per[k] += 1
    assert len(per) == 10 and set(per.values()) <= {1, 2} and sum(per.values()) == 15


def test_current_and_previous_groups_union():
    cfg = zcfg()
    h0, h1 = S.GENESIS_MASTER_HASH, hashlib.sha256(b"mc-last-of-0").digest()
    s0 = S.shard_session_groups(cfg, 0, h0)
    assert all(g.previous == [] and g.remp_members == g.current for g in s0.values())
    s1 = S.shard_session_groups(cfg, 1, h1, h0)
    for shard, g in s1.items():
        assert g.current == S.shard_groups(cfg, 1, h1)[shard]
        assert g.previous == s0[shard].current
        rm = g.remp_members
        assert rm[:len(g.current)] == g.current
        assert set(rm) == set(g.current) | set(g.previous) and len(rm) == len(set(rm))
        assert 4 <= len(rm) <= 8
    with pytest.raises(S.ScheduleError):
        S.shard_session_groups(cfg, 1, h1)


def test_commit_copies_per_block_are_linear_not_quadratic():
    """After accepting a block a member sends the whole commit to members whose precommit it
    lacks; only the block's collator sends the signatures-only copy to the rest. Counted per
    accepted block over 14 members without loss: far below n(n-1) = 182 commit datagrams
    (what every member sending to every other one cost); with 20% loss the chain still
    advances and agrees."""
    ks, nodes, net = make_net(n=14, pool=200)
    counts = defaultdict(int)
    for n in nodes:
        orig = n.core.datagrams_to_send

        def watch(now, orig=orig):
            out = orig(now)
            for _, d in out:
                cid = int.from_bytes(d[:4], "little")
                if cid in (C.COMMIT, C.COMMIT_SIGS):
                    counts[cid] += 1
            return out
        n.core.datagrams_to_send = watch
    net.run(6.0)
    top = check_agreement(nodes, ks)
    assert top >= 10
    per_block = (counts[C.COMMIT] + counts[C.COMMIT_SIGS]) / top
    assert counts[C.COMMIT_SIGS] > 0 and per_block < 2 * 13, dict(counts)
    ks, nodes, net = make_net(n=14, pool=200, seed=3, loss=0.2, dup=0.1, jitter=0.03)
    net.run(20.0)
    top = check_agreement(nodes, ks)
    assert top >= 8 and max(max(n.accepted) for n in nodes) - top <= 2


def test_signature_memo_checks_each_valid_signature_once_and_never_trusts_a_bad_one():
    """consensus.SignatureMemo: an identical (key, data, signature) found valid is not checked
    with ed25519 again; an invalid one is refused every time and never remembered; bounded."""
    k = keys(1, "memo")[0]
    memo = C.SignatureMemo(max_entries=4)
    data = b"precommit bytes"
    sig = k.sign(data)
    assert memo.verify(k.public, data, sig) and memo.checks == 1 and memo.hits == 0
    assert memo.verify(k.public, data, sig) and memo.checks == 1 and memo.hits == 1
    bad = bytes([sig[0] ^ 1]) + sig[1:]
    for _ in range(2):
        assert not memo.verify(k.public, data, bad)
    assert memo.checks == 3 and memo.hits == 1
    assert not memo.verify(k.public, data + b"x", sig)       # the same signature over other bytes
    for i in range(5):                                         # oldest out beyond max_entries
        d = b"d%d" % i
        assert memo.verify(k.public, d, k.sign(d))
    assert len(memo._ok) == 4
    assert memo.verify(k.public, data, sig) and memo.hits == 1  # evicted: checked again


def test_commit_certificates_reuse_the_votes_a_member_verified_but_refuse_a_forged_one():
    """A member verified every precommit of its group as a vote: a commit certificate of the
    same block (any member's copy, any subset of those signatures) costs it no ed25519 check,
    and a certificate with one forged signature is still refused (only valid triples are
    remembered)."""
    ks, nodes, net = make_net()
    net.run(3.0)
    top = check_agreement(nodes, ks)
    assert top >= 5
    members = [k.public for k in ks]
    n0, n1 = nodes[0].core, nodes[1].core
    total = 0
    before = n0.sig_memo.checks
    for s in range(1, top + 1):
        for raw in (n0.commit_for(s), n1.commit_for(s)):       # two members' own copies
            c = C.parse_message(raw)
            total += len(c.signatures)
            assert C.verify_commit(n0.session_id, members, c, n0.sig_memo) == c.candidate.block_id
    # only the signatures n0 did not take in as votes (its own, those that came after it had
    # decided) were checked: well under a fifth of them
    assert n0.sig_memo.checks - before <= total // 5, (n0.sig_memo.checks - before, total)
    before = n0.sig_memo.checks
    for s in range(1, top + 1):                                # and each of those only once
        C.verify_commit(n0.session_id, members, C.parse_message(n1.commit_for(s)), n0.sig_memo)
    assert n0.sig_memo.checks == before
    c = C.parse_message(n1.commit_for(top))
    who, sig = c.signatures[0]
    forged = C.Commit(c.session_id, c.round, c.candidate_bytes, ((who, bytes(64)),) + tuple(c.signatures[1:]),
                      c.candidate)
    with pytest.raises(C.ConsensusWireError, match="bad signature"):
        C.verify_commit(n0.session_id, members, C.parse_message(forged.pack()), n0.sig_memo)
    fresh = C.SignatureMemo()                                  # another node: checks them itself
    C.verify_commit(n0.session_id, members, c, fresh)
    assert fresh.checks == len(c.signatures) and fresh.hits == 0
