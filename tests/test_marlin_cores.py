"""Marlin cores against each other in memory: a producer,
3 clusters of 2 members and 2 consumers over a fake link with loss, duplication and
reordering and a fake clock. Real blocks from ../shared/data (skips without them)."""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from daemon_runtime.memnet import MemNetwork
from marlin_cluster.cluster import ClusterMemberCore
from marlin_cluster.consumer import ConsumerCore
from marlin_cluster.crypto import NodeKey, keccak256, recover_signer
from marlin_cluster.events import (AckMissing, BlockRebuilt, ChunkAcknowledged, ChunkRejected, ChunkSent,
                                   Dispute, StakeEvidence, records)
from marlin_cluster.membership import Membership
from marlin_cluster.params import CHANNEL_BTC, CHANNEL_ETH, CHANNEL_RAW, ChannelParams, Params
from marlin_cluster.producer import BlockRefused, ProducerCore, StakeExhausted
from marlin_cluster.wire import (KIND_ACK, KIND_ATTESTED_CHUNK, KIND_CHUNK, encode_chunk_message,
                                 make_attestation, parse_ack, parse_attestation, signed_attestation_data)


T0 = 1_800_000_000.0


def key(name: str) -> NodeKey:
    return NodeKey.from_secret(keccak256(b"marlin-test:" + name.encode()))


@dataclass
class Link:
    """Delivery policy of the shared in-memory network (daemon_runtime.memnet.MemNetwork):
    latency uniform in [lo, hi] seconds (so frames reorder), loss and duplication
    probabilities, a deterministic drop filter drop(src, dst, frame) -> bool, and dead nodes
    (nothing to or from them; the network's `crashed` set)."""
    lo: float = 0.001
    hi: float = 0.020
    loss: float = 0.0
    dup: float = 0.0
    seed: int = 1
    drop: object = None
    dead: set = field(default_factory=set)

    def network(self) -> MemNetwork:
        net = MemNetwork(self.seed, loss=self.loss, duplicate=self.dup, latency=self.lo,
                         jitter=self.hi - self.lo)
        net.crashed = self.dead                      # one set: tests add dead nodes later
        if self.drop is not None:
            net.drop_filter = lambda src, dst, frame, now: self.drop(src, dst, frame)
        return net


class Net:
    """Cores by address; run() steps the fake clock to the next delivery or timer."""

    def __init__(self, n_clusters: int = 3, members: int = 2, consumers: int = 2, *,
                 params: Params | None = None, link: Link | None = None, selector=None,
                 cluster_ids=None, producers: int = 1):
        self.params = params or Params()
        self.link = link or Link()
        self.now = T0
        self.producer_keys = [key(f"producer{i}") for i in range(producers)]
        cids = cluster_ids or [1000 + 20000 * i for i in range(n_clusters)]
        self.member_keys = {c: [key(f"member{c}.{j}") for j in range(members)] for c in cids}
        self.consumer_keys = [key(f"consumer{i}") for i in range(consumers)]
        self.outsider = key("outsider")
        self.membership = Membership(
            producers={k.address: k.public_key for k in self.producer_keys},
            clusters={c: [k.address for k in ks] for c, ks in self.member_keys.items()},
            members={k.address: k.public_key for ks in self.member_keys.values() for k in ks},
            consumers={k.address: k.public_key for k in self.consumer_keys})
        self.producers = [ProducerCore(k, self.membership, self.params, selector=selector)
                          for k in self.producer_keys]
        self.producer = self.producers[0]
        self.members = {k.address: ClusterMemberCore(k, self.membership, self.params, c)
                        for c, ks in self.member_keys.items() for k in ks}
        self.consumers = [ConsumerCore(k, self.membership, self.params) for k in self.consumer_keys]
        self.nodes = {p.address: p for p in self.producers}
        self.nodes.update(self.members)
        self.nodes.update({c.address: c for c in self.consumers})
        self.events: dict[bytes, list] = {a: [] for a in self.nodes}
        self.wire = self.link.network()
        self.delivered = 0

    def _flush(self) -> None:
        for addr, core in self.nodes.items():
            for dst, frame in core.frames_to_send(self.now):
                self.wire.send(addr, dst, frame, self.now)
            while (ev := core.next_event()) is not None:
                self.events[addr].append(ev)

    def inject(self, dst: bytes, frame: bytes, src: bytes) -> None:
        """Deliver a frame to `dst` now, as if from `src`."""
        self.nodes[dst].receive_frame(frame, src, self.now)
        self._flush()

    def run(self, duration: float, max_steps: int = 200_000) -> None:
        """Deliver and fire timers until `duration` seconds of fake time passed or nothing
        is left to do. Bounded by max_steps."""
        end = self.now + duration
        self._flush()
        for _ in range(max_steps):
            timers = [(t, a) for a, c in self.nodes.items()
                      if c.address not in self.link.dead and (t := c.get_timer()) is not None]
            t_timer = min(timers)[0] if timers else None
            t_frame = self.wire.next_delivery()
            nxt = min(t for t in (t_timer, t_frame) if t is not None) if (t_timer or t_frame) else None
            if nxt is None or nxt > end:
                self.now = max(self.now, end) if nxt is not None else self.now
                return
            self.now = max(self.now, nxt)
            if t_frame is not None and t_frame <= self.now:
                for dst, src, frame in self.wire.deliver_due(self.now):   # frames first, in order
                    if dst in self.nodes:
                        self.nodes[dst].receive_frame(frame, src, self.now)
                        self.delivered += 1
                        self._flush()
            else:
                for t, a in timers:
                    if t <= self.now:
                        self.nodes[a].handle_timer(self.now)
            self._flush()
        raise AssertionError("network did not settle within max_steps")

    def of(self, addr: bytes, cls) -> list:
        return [e for e in self.events[addr] if isinstance(e, cls)]


BLOCK_RAW = bytes(random.Random(5).randbytes(200_000))


def assert_logs(net: Net) -> set[str]:
    """Every core event of the run goes through a real EventLog with the Marlin catalogue
    (which checks names and attribute types); returns the event names written."""
    import io
    import json
    from daemon_runtime.eventlog import EventLog
    from marlin_cluster.events import MARLIN_EVENTS, emit_records
    buf = io.StringIO()
    log = EventLog("marlin-test", "n", [MARLIN_EVENTS], sink=buf)
    for evs in net.events.values():
        for ev in evs:
            emit_records(log, records(ev))
    log.close()
    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    for line in lines:
        tid = line["trace_id"]
        if tid is not None:
            mid, prod = tid.split(":")
            assert len(mid) == 8 and prod.startswith("0x") and len(prod) == 42
    return {line["event"] for line in lines}


def real_blocks(shared_data) -> list[tuple[str, int, bytes]]:
    out = [("btc/block413567.raw", CHANNEL_BTC, (shared_data / "btc" / "block413567.raw").read_bytes())]
    for p in sorted((shared_data / "eth").glob("*.rlp")):
        out.append((f"eth/{p.name}", CHANNEL_ETH, p.read_bytes()))
    assert len(out) >= 2
    return out


def rebuilt(net: Net) -> list[dict[int, bytes]]:
    """Per consumer {message id: block}."""
    return [{e.message_id: e.block for e in net.of(c.address, BlockRebuilt)} for c in net.consumers]


def produce_all(net: Net, blocks, gap: float = 0.2) -> dict[int, bytes]:
    sent = {}
    for _, ch, data in blocks:
        sent[net.producer.produce(data, ch, net.now)] = data
        net.run(gap)
    net.run(30)
    return sent


def test_real_blocks_rebuilt_byte_identical_by_both_consumers_over_a_lossy_link(shared_data):
    net = Net(link=Link(loss=0.03, dup=0.05, seed=11))
    blocks = real_blocks(shared_data)
    sent = produce_all(net, blocks)
    assert len(sent) == len(blocks)
    for got in rebuilt(net):
        assert got == sent                      # every block, byte-identical, both consumers
    for c in net.consumers:
        assert not net.of(c.address, Dispute)
        assert not net.of(c.address, ChunkRejected)
    # the producer holds a verified acknowledgement for every chunk
    for mid in sent:
        assert net.producer.missing_acks(mid) == []
        acks = net.producer.acks(mid)
        assert sorted(acks) == list(range(net.params.channel(CHANNEL_BTC).num_chunks))
        for cid, raw in acks.items():
            ack = parse_ack(raw)
            assert (ack.message_id, ack.chunk_id, ack.producer) == (mid, cid, net.producer.address)
            signer = recover_signer(ack.signed_data(), ack.signature)
            assert net.membership.is_member(signer, ack.cluster_id)
    # the network really was lossy and duplicating, and the events map to catalogue records
    assert sum(m.counters["duplicate"] for m in net.members.values()) + \
        sum(c.counters["duplicate"] for c in net.consumers) > 0
    assert {"marlin.producer.produced", "marlin.producer.chunk_sent", "marlin.producer.acknowledged",
            "marlin.cluster.witnessed", "marlin.cluster.acknowledged", "marlin.cluster.relayed",
            "marlin.consumer.chunk_received", "marlin.consumer.block_rebuilt"} <= assert_logs(net)


def test_corrupted_bitcoin_block_is_rebuilt_refused_and_disputed(shared_data):
    net = Net()
    data = (shared_data / "btc" / "block413567_corrupted_btc2arc.raw").read_bytes()
    mid = net.producer.produce(data, CHANNEL_BTC, net.now)
    net.run(30)
    for c in net.consumers:
        assert not net.of(c.address, BlockRebuilt)
        (d,) = net.of(c.address, Dispute)
        assert d.message_id == mid and d.reason == "invalid_block"
        assert "merkle" in d.detail.lower()
        assert d.producers == [net.producer.address]
        (rec,) = records(d)
        assert rec.trace_id == f"{mid:08x}:0x{net.producer.address.hex()}" and rec.attrs["peer"] == rec.trace_id[9:]


def test_num_minus_min_chunks_dropped_per_block_still_rebuilt(shared_data):
    blocks = real_blocks(shared_data)
    cp = Params().channel(CHANNEL_BTC)
    lost = {}
    rng = random.Random(3)

    def drop(src, dst, frame):  # the chosen chunks of each message never reach a consumer
        if frame[0] != KIND_CHUNK:
            return False
        mid, cid = int.from_bytes(frame[1:5], "big"), int.from_bytes(frame[7:9], "big")
        if mid not in lost:
            lost[mid] = set(rng.sample(range(cp.num_chunks), cp.num_chunks - cp.min_chunks))
        return cid in lost[mid]

    net = Net(link=Link(drop=drop, dup=0.05, seed=4))
    sent = produce_all(net, blocks)
    assert set(lost) == set(sent) and all(len(s) == cp.num_chunks - cp.min_chunks for s in lost.values())
    for got in rebuilt(net):
        assert got == sent


def test_a_whole_cluster_dead_every_block_still_rebuilt(shared_data):
    net = Net(link=Link(seed=8))
    dead_cluster = net.membership.cluster_ids[1]
    dead = set(net.membership.clusters[dead_cluster])
    net.link.dead |= dead
    sent = produce_all(net, real_blocks(shared_data))
    for got in rebuilt(net):
        assert got == sent
    missing = net.of(net.producer.address, AckMissing)
    assert missing and {m.peer for m in missing} <= dead          # only the dead cluster is blamed
    assert {m.cluster_id for m in missing} == {dead_cluster}
    for mid in sent:                                                # re-sent chunks were acked elsewhere
        assert net.producer.missing_acks(mid) == []


def _attested(net: Net, block: bytes, ts: int, *, signer=None, offset=0, chunk_id=0, channel=CHANNEL_RAW,
              tamper_chunk=False):
    """A producer-style KIND_ATTESTED_CHUNK frame for chunk `chunk_id` of `block`."""
    from marlin_cluster.coding import coder
    from marlin_cluster.validate import message_id_of
    cp = net.params.channel(channel)
    chunk = coder(cp.num_chunks, cp.min_chunks).encode(block)[chunk_id]
    mid = message_id_of(channel, block)
    k = signer or net.producer_keys[0]
    sig = k.sign(signed_attestation_data(mid, channel, chunk_id, ts, len(chunk), offset, keccak256(chunk)))
    att = make_attestation(mid, channel, chunk_id, ts, offset, sig)
    if tamper_chunk:
        chunk = bytes([chunk[0] ^ 1]) + chunk[1:]
    return mid, att, chunk


def _witnessed(att, chunk, witness_key) -> bytes:
    return encode_chunk_message(att.wire(), witness_key.sign_recoverable(keccak256(att.wire(), chunk)), chunk)


def test_forged_chunks_are_refused_with_their_reason_and_honest_traffic_is_unaffected():
    net = Net(link=Link(loss=0.0, dup=0.02, seed=2))
    member_key = net.member_keys[net.membership.cluster_ids[0]][0]
    member = net.members[member_key.address]
    mate = net.members[net.member_keys[net.membership.cluster_ids[0]][1].address]
    consumer = net.consumers[0]
    prod = net.producer_keys[0].address
    ts = int(net.now)
    block = BLOCK_RAW
    # every forgery uses the honest message's own (message id, chunk id): none may shadow it
    mid, att, chunk = _attested(net, block, ts)
    _, tampered_att, tampered_chunk = _attested(net, block, ts, tamper_chunk=True)   # wrong chunk hash
    bad_sig = make_attestation(mid, CHANNEL_RAW, 0, ts, 0, att.signature[:64] + b"\x09")
    cases = [
        # (target core, frame, from, reason)
        (member, encode_chunk_message(bad_sig.wire(), None, chunk), prod, "bad_signature"),
        (member, encode_chunk_message(tampered_att.wire(), None, tampered_chunk), prod, "attestation_mismatch"),
        (member, encode_chunk_message(_attested(net, block, ts - 3600)[1].wire(), None, chunk), prod, "stale"),
        (member, encode_chunk_message(_attested(net, block, ts, signer=net.outsider)[1].wire(), None, chunk),
         net.outsider.address, "not_producer"),
        (consumer, _witnessed(_attested(net, block, ts, signer=net.outsider)[1], chunk, member_key),
         member_key.address, "unknown_producer"),
        (mate, _witnessed(att, chunk, net.outsider), member_key.address, "bad_witness"),
        (consumer, _witnessed(att, chunk, net.outsider), member_key.address, "bad_witness"),
        (member, encode_chunk_message(att.wire(), None, chunk)[:60], prod, "truncated"),
        (consumer, _witnessed(att, chunk, member_key)[:100], member_key.address, "truncated"),
        (member, bytes([KIND_ATTESTED_CHUNK]) + b"\0" * (net.params.max_frame + 1), prod, "oversized"),
        (consumer, bytes([KIND_CHUNK]) + att.wire() + b"\0" * 65 + b"\0" * (net.params.max_chunk + 1),
         member_key.address, "oversized"),
    ]
    for core, frame, src, reason in cases:
        before = core.counters[f"rejected.{reason}"]
        n_events = len(net.events[core.address])
        net.inject(core.address, frame, src)
        assert core.counters[f"rejected.{reason}"] == before + 1, reason
        new = net.events[core.address][n_events:]
        assert [e.reason for e in new if isinstance(e, ChunkRejected)] == [reason], (reason, new)
        assert not net.producer.frames_to_send(net.now)
    assert member.cache_size() == 0 and mate.cache_size() == 0      # nothing forged was cached
    # honest traffic: the same block and real traffic after it rebuild at both consumers
    got_mid = net.producer.produce(block, CHANNEL_RAW, net.now)
    assert got_mid == mid
    net.run(30)
    for got in rebuilt(net):
        assert got == {mid: block}
    assert {"marlin.cluster.rejected", "marlin.consumer.rejected"} <= assert_logs(net)


def test_stake_offset_reused_within_the_refresh_interval_is_recorded():
    # 2 clusters and 2 options: every chunk may go to cluster cid0, which sees both blocks
    cid0 = 1000
    net = Net(n_clusters=2, selector=lambda options, mid, cid: [cid0])
    # a cheating producer: a second core with the same key restarts its stake offsets at 0
    cheat = ProducerCore(net.producer_keys[0], net.membership, net.params, selector=lambda o, m, c: [cid0])
    a = net.producer.produce(BLOCK_RAW, CHANNEL_RAW, net.now)
    net.run(5)
    b = cheat.produce(BLOCK_RAW[::-1], CHANNEL_RAW, net.now)       # same epoch, same offsets
    for dst, frame in cheat.frames_to_send(net.now):
        net.inject(dst, frame, cheat.address)
    net.run(5)
    evidence = [ev for m in net.members.values() for ev in m.evidence]
    assert evidence, "no stake evidence recorded"
    first_member = net.members[net.membership.clusters[cid0][0]]
    assert first_member.counters["rejected.stake_reuse"] >= 1
    for ev in evidence:
        assert ev.producer == net.producer.address
        assert ev.first[0] == a and ev.second[0] == b and ev.first[1] == ev.second[1]
        # the evidence verifies: both attestations recover to the producer with the same offset
        for mid_, cid_, att_wire, clen, chash in (ev.first, ev.second):
            att = parse_attestation(att_wire)
            assert att.stake_offset == ev.stake_offset
            assert recover_signer(att.signed_data(clen, chash), att.signature) == net.producer.address
    assert any(isinstance(e, StakeEvidence) for evs in net.events.values() for e in evs)
    assert "marlin.cluster.stake_evidence" in assert_logs(net)
    # the reusing block never reached a consumer
    for got in rebuilt(net):
        assert a in got and b not in got


def test_stake_offsets_restart_in_a_new_refresh_interval_without_evidence():
    params = Params(refresh_interval=60.0)
    net = Net(n_clusters=2, params=params, selector=lambda o, m, c: [1000])
    net.now = (int(net.now) // 60) * 60 + 1.0
    a = net.producer.produce(BLOCK_RAW, CHANNEL_RAW, net.now)
    net.run(70)                                   # next epoch: offsets restart at 0 legally
    b = net.producer.produce(BLOCK_RAW[::-1], CHANNEL_RAW, net.now)
    net.run(30)
    assert not [ev for m in net.members.values() for ev in m.evidence]
    for got in rebuilt(net):
        assert set(got) == {a, b}


def test_a_producer_past_its_stake_budget_does_not_send():
    cp = ChannelParams()
    budget = 350_000            # covers one 200 kB block (302 kB of chunks + attestations), not two
    net = Net(params=Params(stake_budget=budget, refresh_interval=60.0))
    net.now = (int(net.now) // 60) * 60 + 1.0
    net.producer.produce(BLOCK_RAW, CHANNEL_RAW, net.now)
    net.producer.frames_to_send(net.now)
    with pytest.raises(StakeExhausted):
        net.producer.produce(BLOCK_RAW[::-1], CHANNEL_RAW, net.now)
    assert net.producer.frames_to_send(net.now) == []
    assert net.producer.counters["refused.stake"] == 1
    assert net.producer.stake_left(net.now) < 200_000
    net.now += 60                                    # the next refresh interval restores it
    mid = net.producer.produce(BLOCK_RAW[::-1], CHANNEL_RAW, net.now)
    frames = net.producer.frames_to_send(net.now)     # (the first block's chunks are re-sent too: no acks)
    assert len([f for _, f in frames if f[1:5] == mid.to_bytes(4, "big")]) == cp.num_chunks
    with pytest.raises(BlockRefused):                # and a block is never produced twice
        net.producer.produce(BLOCK_RAW[::-1], CHANNEL_RAW, net.now)


def test_a_member_that_never_acknowledges_shows_up_as_missing_acks():
    silent = {}

    def drop(src, dst, frame):
        return frame[0] == KIND_ACK and src in silent

    params = Params(max_send_attempts=1)            # no re-send: the gap stays visible
    net = Net(params=params, link=Link(drop=drop))
    mute = net.member_keys[net.membership.cluster_ids[0]][0].address
    silent[mute] = True
    mid = net.producer.produce(BLOCK_RAW, CHANNEL_RAW, net.now)
    net.run(30)
    sent_to_mute = {e.chunk_id for e in net.of(net.producer.address, ChunkSent) if e.peer == mute}
    assert sent_to_mute, "the selector never chose the silent member; pick another"
    assert net.producer.missing_acks(mid) == sorted(sent_to_mute)
    missing = net.of(net.producer.address, AckMissing)
    assert {m.chunk_id for m in missing} == sent_to_mute and all(m.final and m.peer == mute for m in missing)
    assert net.producer.counters["ack_missing_final"] == len(sent_to_mute)
    acked = {e.chunk_id for e in net.of(net.producer.address, ChunkAcknowledged)}
    assert acked == set(range(12)) - sent_to_mute
    # with re-sends (the default) the same silent member is blamed but every chunk gets an ack
    net2 = Net(link=Link(drop=drop))
    silent.clear()
    silent[net2.member_keys[net2.membership.cluster_ids[0]][0].address] = True
    mid2 = net2.producer.produce(BLOCK_RAW, CHANNEL_RAW, net2.now)
    net2.run(30)
    assert net2.producer.missing_acks(mid2) == []
    assert {m.peer for m in net2.of(net2.producer.address, AckMissing)} == set(silent)
    assert "marlin.producer.ack_missing" in assert_logs(net) and "marlin.producer.ack_missing" in assert_logs(net2)


def test_consumer_chunk_expiry_raises_a_dispute_naming_the_producer():
    cp = Params().channel(CHANNEL_RAW)
    keep = set(range(cp.min_chunks - 1))

    def drop(src, dst, frame):
        return frame[0] == KIND_CHUNK and int.from_bytes(frame[7:9], "big") not in keep

    net = Net(link=Link(drop=drop))
    mid = net.producer.produce(BLOCK_RAW, CHANNEL_RAW, net.now)
    net.run(60)
    for c in net.consumers:
        (d,) = net.of(c.address, Dispute)
        assert (d.message_id, d.reason, d.producers, d.chunks) == (mid, "expired", [net.producer.address],
                                                                    cp.min_chunks - 1)
        assert c.pending() == {} and (c.get_timer() is None or c.get_timer() > net.now)
    assert "marlin.consumer.dispute" in assert_logs(net)


def test_caches_stay_bounded():
    params = Params(max_cached_chunks=20, max_messages=4)
    net = Net(params=params)
    for i in range(10):
        net.producer.produce(BLOCK_RAW[i:] + bytes([i]) * 1000, CHANNEL_RAW, net.now)
        net.run(3)
    for m in net.members.values():
        assert m.cache_size() <= 20
    net.run(120)
    for m in net.members.values():
        assert m.cache_size() == 0 and m.get_timer() is None
    assert len(net.producer.messages()) <= 4


def test_forged_acknowledgements_are_refused_and_do_not_count():
    from marlin_cluster.wire import Ack, encode_frame
    net = Net()
    mid = net.producer.produce(BLOCK_RAW, CHANNEL_RAW, net.now)
    frames = net.producer.frames_to_send(net.now)
    first = frames[0]
    cid = int.from_bytes(first[1][7:9], "big")
    cluster = next(c for c, ks in net.member_keys.items() if any(k.address == first[0] for k in ks))
    other = next(c for c in net.membership.cluster_ids if c != cluster)
    member = next(k for k in net.member_keys[cluster] if k.address == first[0])
    outsider_member = net.member_keys[other][0]

    def ack(signer, cluster_id=cluster, producer=net.producer.address, chunk=cid):
        unsigned = Ack(mid, chunk, cluster_id, int(net.now), producer, b"")
        return encode_frame(KIND_ACK, Ack(mid, chunk, cluster_id, int(net.now), producer,
                                          signer.sign(unsigned.signed_data())).wire())
    cases = [(ack(net.outsider), "bad_ack"),                        # not a member
             (ack(outsider_member, cluster_id=other), "bad_ack"),   # a cluster the chunk never went to
             (ack(outsider_member), "bad_ack"),                     # a member of another cluster
             (ack(member, producer=net.outsider.address), "bad_ack"),
             (ack(member, chunk=99), "bad_ack"),
             (ack(member)[:50], "truncated")]
    for frame, reason in cases:
        before = net.producer.counters[f"rejected.{reason}"]
        net.producer.receive_frame(frame, first[0], net.now)
        assert net.producer.counters[f"rejected.{reason}"] == before + 1
    assert cid in net.producer.missing_acks(mid)
    net.producer.receive_frame(ack(member), first[0], net.now)          # the real one counts
    assert cid not in net.producer.missing_acks(mid)
    assert parse_ack(net.producer.acks(mid)[cid]).cluster_id == cluster


def test_consumer_refuses_a_witness_from_a_cluster_outside_the_chunk_options():
    net = Net()
    ts = int(net.now)
    mid, att, chunk = _attested(net, BLOCK_RAW, ts)
    options = net.membership.options(mid, 0, net.params.no_of_cluster_options)
    outside = next(c for c in net.membership.cluster_ids if c not in options)
    wk = net.member_keys[outside][0]
    c = net.consumers[0]
    net.inject(c.address, _witnessed(att, chunk, wk), wk.address)
    assert c.counters["rejected.bad_witness"] == 1
    inside = net.member_keys[options[0]][0]
    net.inject(c.address, _witnessed(att, chunk, inside), inside.address)
    assert c.counters["chunks"] == 1


def test_overlapping_stake_ranges_are_reuse_adjacent_ones_are_not():
    net = Net()
    prod = net.producer_keys[0]
    member = net.members[net.member_keys[net.membership.cluster_ids[0]][0].address]
    ts = int(net.now)
    blocks = [bytes([i]) * 50_000 + BLOCK_RAW[:1000] for i in range(4)]
    base = 100_000
    mid0, att0, chunk0 = _attested(net, blocks[0], ts, offset=base)
    cost = len(chunk0) + 81                        # STAKE_PER_BYTE = 1
    for blk, offset, reuse in ((blocks[0], base, False),            # the first use
                               (blocks[1], base + cost, False),     # adjacent: fine
                               (blocks[2], base + cost // 2, True),  # overlaps both
                               (blocks[3], base - cost + 1, True)):  # overlaps the first by one unit
        _, att, chunk = _attested(net, blk, ts, offset=offset)
        before = member.counters["stake_evidence"]
        net.inject(member.address, encode_chunk_message(att.wire(), None, chunk), prod.address)
        assert member.counters["stake_evidence"] == before + int(reuse), offset
    assert member.counters["rejected.stake_reuse"] == 2
    # stake the producer does not have
    _, att, chunk = _attested(net, blocks[3], ts, offset=net.params.stake_budget - 10)
    net.inject(member.address, encode_chunk_message(att.wire(), None, chunk), prod.address)
    assert member.counters["rejected.stake_exceeded"] == 1
    # re-sending the very same chunk (a producer retry) is not reuse
    net.inject(member.address, encode_chunk_message(att0.wire(), None, chunk0), prod.address)
    assert member.counters["stake_evidence"] == 2 and member.counters["acks_sent"] == 3


def test_two_producers_same_message_id_at_once_honest_rebuilt_corrupted_disputed(shared_data):
    """Per-message state is keyed (message id, producer): the corrupted Bitcoin block (same
    header, so the honest block's message id) sent by a second producer at the same instant
    as the honest block neither collides with the honest chunks in the members' caches nor in
    the consumers' pending/finished sets (before: its chunks were dropped as duplicates)."""
    net = Net(producers=2)
    honest = (shared_data / "btc" / "block413567.raw").read_bytes()
    bad = (shared_data / "btc" / "block413567_corrupted_btc2arc.raw").read_bytes()
    p1, p2 = net.producers
    mid = p1.produce(honest, CHANNEL_BTC, net.now)
    assert p2.produce(bad, CHANNEL_BTC, net.now) == mid          # same message id
    net.run(30)
    n = net.params.channel(CHANNEL_BTC).num_chunks
    for c in net.consumers:
        (b,) = net.of(c.address, BlockRebuilt)
        assert (b.message_id, b.producer, b.block) == (mid, p1.address, honest)
        (d,) = net.of(c.address, Dispute)
        assert (d.message_id, d.reason, d.producers) == (mid, "invalid_block", [p2.address])
        assert not net.of(c.address, ChunkRejected) and c.pending() == {}
    for p in (p1, p2):                       # every chunk of both acknowledged
        assert p.missing_acks(mid) == [] and sorted(p.acks(mid)) == list(range(n))
    witnessed = sum(m.counters["witnessed"] for m in net.members.values())
    assert witnessed == 2 * n
    assert not any(net.of(a, ChunkRejected) for a in net.members)


def test_stake_state_and_restore_stake_continue_offsets_after_a_restart():
    """ProducerCore.stake_state() / restore_stake(epoch, used): a restarted producer continues
    above the offsets it used in the same refresh interval, so no member records reuse."""
    from marlin_cluster.wire import MarlinLocalError
    net = Net()
    p = net.producer
    assert p.stake_state() == (-1, 0)
    p.produce(BLOCK_RAW, CHANNEL_RAW, net.now)
    net.run(5)
    epoch, used = p.stake_state()
    assert epoch == int(net.now // net.params.refresh_interval) and used > 0
    before = len(net.of(p.address, ChunkSent))
    fresh = ProducerCore(p.key, net.membership, net.params)          # the restarted producer
    fresh.restore_stake(epoch, used)
    assert fresh.stake_state() == (epoch, used) and fresh.stake_left(net.now) == p.stake_left(net.now)
    net.producers[0] = net.producer = net.nodes[fresh.address] = fresh
    fresh.produce(BLOCK_RAW[::-1], CHANNEL_RAW, net.now)
    net.run(10)
    later = net.of(fresh.address, ChunkSent)[before:]
    assert later and min(e.stake_offset for e in later) == used      # continues above
    assert fresh.stake_state()[1] > used
    assert sum(len(m.evidence) for m in net.members.values()) == 0
    assert not any(net.of(a, StakeEvidence) for a in net.members)
    state = fresh.stake_state()
    for bad in ((-2, 0), (epoch, -1), (epoch, net.params.stake_budget + 1), (epoch, 1.5), (True, 0)):
        with pytest.raises(MarlinLocalError):
            fresh.restore_stake(*bad)
    assert fresh.stake_state() == state                                # refused: unchanged
