"""A Marlin consumer keeps taking chunks of other blocks while it validates the 1 MB Bitcoin
block (block 413567 of ../shared/data/btc): decoding and validation run in the consumer's
RebuildPool, off its event loop.

Measured by the order of events, not by time: the Bitcoin block's validator (the real
validate_block) first waits until a marker file says another block was delivered, then
validates and writes its own marker. Off the loop, the other block (a raw block whose chunks
arrive over TCP after the Bitcoin block's last chunk) is delivered while the Bitcoin block is
still being validated, then the Bitcoin block. Inline (the consumer's behaviour before the
pool, kept as `--validate-pool inline`) the loop is held by the validator, so the other
block can only be delivered after the Bitcoin block's validation finished: the control
case shows the test detects the stall. The wait of the inline case is a bound on a marker
that cannot appear, not a speed assertion."""
from __future__ import annotations

import asyncio
import functools
import os
import time
from pathlib import Path

import pytest

from daemon_runtime.eventlog import EventLog
from marlin_cluster.cluster import ClusterMemberCore
from marlin_cluster.consumer import ConsumerCore
from marlin_cluster.crypto import NodeKey, keccak256
from marlin_cluster.daemon import MarlinRunner, Metrics, RebuildPool
from marlin_cluster.events import MARLIN_EVENTS, BlockRebuilt
from marlin_cluster.membership import Membership
from marlin_cluster.params import CHANNEL_BTC, CHANNEL_RAW, Params
from marlin_cluster.producer import ProducerCore
from marlin_cluster.transport import Transport
from marlin_cluster.validate import validate_block
from marlin_cluster.wire import peek_chunk_ids

OTHER_DELIVERED = "other-delivered"
BTC_VALIDATED = "btc-validated"


def gated_validate(marker_dir: str, wait_s: float, channel: int, block: bytes):
    """validate_block; for a Bitcoin block, first wait (up to wait_s) for the OTHER_DELIVERED
    marker, and write BTC_VALIDATED once validated. Module-level: a worker process unpickles
    it by name."""
    if channel == CHANNEL_BTC:
        gate = Path(marker_dir) / OTHER_DELIVERED
        deadline = time.monotonic() + wait_s
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        info = validate_block(channel, block)
        (Path(marker_dir) / BTC_VALIDATED).write_text("")
        return info
    return validate_block(channel, block)


def _key(name: str) -> NodeKey:
    return NodeKey.from_secret(keccak256(b"marlin-pool-test:" + name.encode()))


class Nodes:
    def __init__(self):
        self.producer, self.m1, self.m2, self.consumer = (_key(n) for n in ("producer", "m1", "m2", "consumer"))
        self.membership = Membership(producers={self.producer.address: self.producer.public_key},
                                     clusters={7: [self.m1.address, self.m2.address]},
                                     members={self.m1.address: self.m1.public_key,
                                              self.m2.address: self.m2.public_key},
                                     consumers={self.consumer.address: self.consumer.public_key})
        self.params = Params(tolerable_latency=600)

    def consumer_frames(self, block: bytes, channel: int, now: float) -> list[bytes]:
        """MIN_CHUNKS witnessed chunk frames of `block` for the consumer, made by the real
        producer and member cores (the last one completes the block)."""
        producer = ProducerCore(self.producer, self.membership, self.params)
        members = {k.address: ClusterMemberCore(k, self.membership, self.params, 7) for k in (self.m1, self.m2)}
        producer.produce(block, channel, now)
        out: dict[int, bytes] = {}
        for member, frame in producer.frames_to_send(now):
            core = members[member]
            core.receive_frame(frame, self.producer.address, now)
            for dst, relay in core.frames_to_send(now):
                if dst == self.consumer.address:
                    out.setdefault(peek_chunk_ids(memoryview(relay)[1:])[2], relay)
        cp = self.params.channel(channel)
        assert len(out) >= cp.min_chunks
        return [out[c] for c in sorted(out)[:cp.min_chunks]]


async def _run(pool_kind: str, marker_dir: Path, btc: bytes, wait_s: float) -> list[tuple[int, bool]]:
    nodes = Nodes()
    now = time.time()
    btc_frames = nodes.consumer_frames(btc, CHANNEL_BTC, now)
    other_frames = nodes.consumer_frames(os.urandom(200_000), CHANNEL_RAW, now)
    pool = RebuildPool(pool_kind, 2)
    core = ConsumerCore(nodes.consumer, nodes.membership, nodes.params, offload=pool.offload,
                        validate=functools.partial(gated_validate, str(marker_dir), wait_s))
    consumer_t = Transport(nodes.consumer, {}, on_frame=lambda p, f: None, known=[nodes.m1.address],
                           max_frame=nodes.params.max_frame)
    port = await consumer_t.start("127.0.0.1", 0)
    member_t = Transport(nodes.m1, {nodes.consumer.address: ("127.0.0.1", port)}, on_frame=lambda p, f: None,
                         known=[], max_frame=nodes.params.max_frame)
    await member_t.start("127.0.0.1", 0)
    log = EventLog("marlin-consumer", "consumer", [MARLIN_EVENTS], sink=str(marker_dir / "consumer.jsonl"))
    delivered: list[tuple[int, bool]] = []
    done = asyncio.Event()

    def on_event(ev) -> None:
        if type(ev) is BlockRebuilt:
            delivered.append((ev.channel, (marker_dir / BTC_VALIDATED).exists()))
            if ev.channel == CHANNEL_RAW:
                (marker_dir / OTHER_DELIVERED).write_text("")
            if len(delivered) == 2:
                done.set()

    runner = MarlinRunner("consumer", core, consumer_t, log, Metrics(), on_event, pool if pool.offload else None)
    try:
        await asyncio.gather(*(asyncio.wrap_future(f) for f in pool.warm()))
        for frame in btc_frames + other_frames:     # the Bitcoin block completes first
            member_t.send(nodes.consumer.address, frame)
        await asyncio.wait_for(done.wait(), 120)
        assert core.counters["rebuilt"] == 2 and core.rebuilding() == 0
    finally:
        runner.close()
        pool.close()
        await member_t.close()
        await consumer_t.close()
        log.close()
    return delivered


@pytest.mark.parametrize("kind", ["process", "thread"])
def test_consumer_delivers_another_block_while_the_bitcoin_block_is_validated(kind, tmp_path, shared_data):
    btc = (shared_data / "btc" / "block413567.raw").read_bytes()
    delivered = asyncio.run(_run(kind, tmp_path, btc, 60.0))
    # the raw block was delivered before the Bitcoin block's validation finished, then the
    # Bitcoin block (validated) was
    assert delivered == [(CHANNEL_RAW, False), (CHANNEL_BTC, True)]


def test_inline_validation_holds_every_other_block(tmp_path, shared_data):
    """The control: validating inside the event loop (the consumer before the pool), the
    other block's chunks wait until the Bitcoin block's validation finished."""
    btc = (shared_data / "btc" / "block413567.raw").read_bytes()
    delivered = asyncio.run(_run("inline", tmp_path, btc, 1.0))
    assert delivered == [(CHANNEL_BTC, True), (CHANNEL_RAW, True)]


def test_offloaded_core_hands_out_the_job_and_counts_its_bytes():
    """ConsumerCore(offload=True) in memory: at MIN_CHUNKS the block becomes a RebuildJob
    (later chunks are duplicates of a finished message), its chunk bytes still count against
    max_pending_bytes until rebuild_done, which gives the BlockRebuilt."""
    from marlin_cluster.consumer import rebuild_block
    nodes = Nodes()
    now = time.time()
    block = os.urandom(100_000)
    frames = nodes.consumer_frames(block, CHANNEL_RAW, now)
    core = ConsumerCore(nodes.consumer, nodes.membership, nodes.params, offload=True)
    for f in frames:
        core.receive_frame(f, nodes.m1.address, now)
    job = core.next_job()
    assert job is not None and core.next_job() is None and core.rebuilding() == 1
    assert core._inflight_bytes == job.size > len(block)
    core.receive_frame(frames[0], nodes.m1.address, now)             # a late copy
    assert core.duplicates()["replayed_attestation"] == 1
    while core.next_event() is not None:
        pass
    core.rebuild_done(job, rebuild_block(*job.args(core.validate)), now + 0.01)
    ev = core.next_event()
    assert type(ev) is BlockRebuilt and ev.block == block and core.rebuilding() == 0
    assert core._inflight_bytes == 0
