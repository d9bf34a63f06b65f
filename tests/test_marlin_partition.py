"""A partition between a cluster and a consumer that lasts longer than TOLERABLE_LATENCY, on
the in-memory network with a fake clock (daemon_runtime.memnet). The member's transport keeps
frames for an unreachable peer and sends them after the reconnect (transport.py), so the
consumer gets the block's chunks only after they turned stale. Seed (marlin-data.txt "Data
Exit", onChunkExpiryTimer): a block a consumer could not rebuild in time ends in
Consumer::raiseDispute; it must never vanish with only per-chunk "stale" rejections."""
from __future__ import annotations

from daemon_runtime.memnet import FakeClock
from marlin_cluster.events import BlockRebuilt, ChunkRejected, Dispute
from marlin_cluster.params import CHANNEL_RAW, Params
from marlin_cluster.wire import KIND_CHUNK

from tests.test_marlin_cores import BLOCK_RAW, Link, Net, assert_logs

TOLERABLE = 10.0     # the testnet's TOLERABLE_LATENCY (deploy/marlin_segment.py)
PARTITION = 30.0     # the testnet fault plan's partition


class HeldPartition:
    """Frames from cluster members to `consumer` are held while `active` (as a member's send
    queue holds them while the link is down) and handed back by heal()."""

    def __init__(self, consumer: bytes):
        self.consumer = consumer
        self.active = False
        self.held: list[tuple[bytes, bytes, bytes]] = []
        self.skip = 0          # chunk frames to let through before holding

    def drop(self, src: bytes, dst: bytes, frame: bytes) -> bool:
        if not self.active or dst != self.consumer or frame[0] != KIND_CHUNK:
            return False
        self.held.append((src, dst, frame))
        return True

    def heal(self, net: Net) -> None:
        self.active = False
        for src, dst, frame in self.held:
            net.wire.send(src, dst, frame, net.now)
        self.held.clear()


def _run(hold_after: int | None):
    """One block; consumer 0 is cut off from every member for PARTITION s, either from the
    start (hold_after None) or once it holds `hold_after` chunk frames. Returns (net, cut
    consumer, the other consumer, message id)."""
    part = HeldPartition(b"")
    net = Net(params=Params(tolerable_latency=TOLERABLE, max_clock_skew=2.0), link=Link(drop=part.drop))
    clock = FakeClock(net.now)        # the partition's own time line
    cut, other = net.consumers
    part.consumer = cut.address
    if hold_after is None:
        part.active = True
        clock.advance_to(net.now)
    mid = net.producer.produce(BLOCK_RAW, CHANNEL_RAW, net.now)
    if hold_after is not None:
        while sum(cut.pending().values()) < hold_after and not net.of(cut.address, BlockRebuilt):
            net.run(0.001)
        part.active = True
    started = clock.advance_to(net.now)
    net.run(PARTITION)
    assert clock.advance_to(net.now) - started >= PARTITION > TOLERABLE
    part.heal(net)
    net.run(120)
    assert part.held == []
    return net, cut, other, mid


def _outcome(net: Net, consumer, mid: int) -> list[str]:
    rebuilt = [e for e in net.of(consumer.address, BlockRebuilt) if e.message_id == mid]
    disputed = [e for e in net.of(consumer.address, Dispute) if e.message_id == mid]
    return ["rebuilt"] * len(rebuilt) + [f"dispute:{d.reason}" for d in disputed]


def test_block_whose_chunks_all_arrive_stale_ends_in_an_expired_dispute():
    net, cut, other, mid = _run(hold_after=None)
    assert _outcome(net, other, mid) == ["rebuilt"]
    stale = [e for e in net.of(cut.address, ChunkRejected) if e.reason == "stale"]
    assert stale, "the chunks reached the consumer only after TOLERABLE_LATENCY"
    assert _outcome(net, cut, mid) == ["dispute:expired"]
    (d,) = net.of(cut.address, Dispute)
    assert d.producers == [net.producer.address] and d.channel == CHANNEL_RAW and d.chunks == 0
    assert cut.pending() == {}
    # later stale copies of the same block do not raise it again
    assert cut.counters["dispute.expired"] == 1
    assert "marlin.consumer.dispute" in assert_logs(net)


def test_block_with_some_chunks_before_the_partition_ends_once():
    cp = Params().channel(CHANNEL_RAW)
    outcomes = []
    for before in (1, cp.min_chunks // 2, cp.min_chunks - 1):
        net, cut, other, mid = _run(hold_after=before)
        assert _outcome(net, other, mid) == ["rebuilt"]
        # frames already on the wire when the partition starts still arrive: one outcome
        (outcome,) = _outcome(net, cut, mid)
        outcomes.append(outcome)
        assert cut.pending() == {}
    assert outcomes[0] == "dispute:expired"


def test_stale_chunks_of_a_block_already_rebuilt_raise_no_dispute():
    cp = Params().channel(CHANNEL_RAW)
    net, cut, other, mid = _run(hold_after=cp.min_chunks)
    assert _outcome(net, cut, mid) == ["rebuilt"]
    assert _outcome(net, other, mid) == ["rebuilt"]
