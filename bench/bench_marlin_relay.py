"""Marlin relay latency and sustained rate: a 1 MiB block producer -> member -> member ->
consumer on loopback through the real transport (LPF over TCP) and the real cores, against
a raw TCP relay of the same bytes along the same hops (issue #9 must-show 5).

    .venv/bin/python bench/bench_marlin_relay.py [--blocks 200] [--short]

Set-up (ONE process, one asyncio event loop, four nodes as tasks; each node has its own
Transport with its own listening socket, so every hop is a real TCP connection on
127.0.0.1 and every frame goes through kernel socket buffers): a producer, one cluster of
two members, one consumer; params: channel raw 12 chunks of which any 8 rebuild. The
producer sends each chunk to one member (rotated by chunk id); that member witnesses it,
acknowledges it and relays it to the other member, which relays it to the consumer. The
bench removes the first member's direct copy to the consumer (a send filter in the
member's adapter), so every chunk takes the three hops producer -> member -> member ->
consumer. Each node logs its events at info to its own file, like the daemons. Because all
four nodes share one process (one core), the latency includes every node's CPU work
serialised: coding, 12 attestation signatures, witness/ack signatures and ~4 signature
recoveries per chunk per node.

Latency: one block at a time, `produce()` -> the consumer's BlockRebuilt (1 MiB, random
bytes, so every message id differs); p50/p99 over --blocks blocks (targets p50 <= 50 ms,
p99 <= 120 ms).
Rate: blocks released on a fixed schedule at R blocks/s for --rate-seconds (R = 2, 4, 5,
6, 8, 10, 12, 16, 20 ...) until p99 latency (release -> rebuilt) > 200 ms or a block is
not rebuilt; reports the highest R with p99 <= 200 ms (target >= 5 blocks/s).
Baseline (same run, same process layout): raw asyncio streams, three LPF hops, each hop
forwarding each frame as it arrives; the producer sends the same chunk frames the Marlin
producer emitted for a block (about 1.5 MiB, 12 frames); latency = first write -> last
frame at the consumer. No crypto, coding, dedupe or logging.

Prints every figure, its target and marlin/baseline ratios. Not part of the test suite.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from daemon_runtime.eventlog import EventLog  # noqa: E402
from marlin_cluster.cluster import ClusterMemberCore  # noqa: E402
from marlin_cluster.consumer import ConsumerCore  # noqa: E402
from marlin_cluster.crypto import NodeKey  # noqa: E402
from marlin_cluster.daemon import CoreRunner, Metrics  # noqa: E402
from marlin_cluster.events import MARLIN_EVENTS, BlockRebuilt  # noqa: E402
from marlin_cluster.membership import Membership  # noqa: E402
from marlin_cluster.params import CHANNEL_RAW, ChannelParams, Params  # noqa: E402
from marlin_cluster.producer import ProducerCore  # noqa: E402
from marlin_cluster.transport import LpfDecoder, Transport, encode_lpf  # noqa: E402
from marlin_cluster.wire import KIND_ATTESTED_CHUNK, peek_chunk_ids  # noqa: E402

MIB = 1024 * 1024


def pct(values, q):
    s = sorted(values)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))
    return s[k]


class MarlinPath:
    """Producer, members m1 and m2 of one cluster, a consumer, in this event loop."""

    def __init__(self, logdir: Path):
        self.keys = {n: NodeKey.generate() for n in ("producer", "m1", "m2", "consumer")}
        a = {n: k.address for n, k in self.keys.items()}
        self.addr = a
        self.params = Params(channels={CHANNEL_RAW: ChannelParams(12, 8, 2 * MIB)}, tolerable_latency=60,
                             ack_timeout=5.0, max_messages=1024)
        self.membership = Membership(producers={a["producer"]: self.keys["producer"].public_key},
                                     clusters={100: [a["m1"], a["m2"]]},
                                     members={a["m1"]: self.keys["m1"].public_key,
                                              a["m2"]: self.keys["m2"].public_key},
                                     consumers={a["consumer"]: self.keys["consumer"].public_key})
        self.logdir = logdir
        self.done: dict[int, float] = {}
        self.waiters: dict[int, asyncio.Future] = {}
        self.transports: dict[str, Transport] = {}
        self.runners: dict[str, CoreRunner] = {}
        self.logs: list[EventLog] = []
        self.filtered = 0

    async def start(self) -> None:
        p = self.params
        cores = {"producer": ProducerCore(self.keys["producer"], self.membership, p),
                 "m1": ClusterMemberCore(self.keys["m1"], self.membership, p, 100),
                 "m2": ClusterMemberCore(self.keys["m2"], self.membership, p, 100),
                 "consumer": ConsumerCore(self.keys["consumer"], self.membership, p)}
        known = list(self.addr.values())
        for name, key in self.keys.items():
            t = Transport(key, {}, on_frame=lambda peer, f: None, known=[x for x in known if x != key.address],
                          max_frame=p.max_frame)
            await t.start("127.0.0.1", 0)
            self.transports[name] = t
        for name, key in self.keys.items():
            t = self.transports[name]
            t.directory = {self.addr[n]: ("127.0.0.1", self.transports[n].port) for n in self.keys if n != name}
            role = {"producer": "producer", "m1": "cluster", "m2": "cluster", "consumer": "consumer"}[name]
            log = EventLog(f"marlin-{role}", name, [MARLIN_EVENTS], sink=str(self.logdir / f"{name}.jsonl"))
            self.logs.append(log)
            runner = CoreRunner(role, cores[name], t, log, Metrics(),
                                self._on_consumer_event if name == "consumer" else None)
            self.runners[name] = runner
        for m in ("m1", "m2"):
            self._route_filter(m)
        self.transports["producer"].warm([self.addr["m1"], self.addr["m2"]])
        self.transports["m1"].warm([self.addr["m2"], self.addr["consumer"], self.addr["producer"]])
        self.transports["m2"].warm([self.addr["m1"], self.addr["consumer"], self.addr["producer"]])
        await asyncio.sleep(0.3)

    def _route_filter(self, member: str) -> None:
        """The member does not send the consumer a copy of a chunk it got from the producer
        (so the consumer only gets it from the other member: three hops)."""
        runner, t = self.runners[member], self.transports[member]
        first_hop: set = set()
        producer, consumer = self.addr["producer"], self.addr["consumer"]
        receive, send = runner.receive, t.send

        def receive_(peer, frame):
            if peer == producer and frame[:1] == bytes((KIND_ATTESTED_CHUNK,)):
                mid, _, cid = peek_chunk_ids(memoryview(frame)[1:])
                first_hop.add((mid, cid))
                if len(first_hop) > 100_000:
                    first_hop.clear()
            receive(peer, frame)

        def send_(peer, frame):
            if peer == consumer:
                mid, _, cid = peek_chunk_ids(memoryview(frame)[1:])
                if (mid, cid) in first_hop:
                    self.filtered += 1
                    return True
            return send(peer, frame)

        t.on_frame = receive_
        t.send = send_

    def _on_consumer_event(self, ev) -> None:
        if type(ev) is BlockRebuilt:
            now = time.perf_counter()
            self.done[ev.message_id] = now
            fut = self.waiters.pop(ev.message_id, None)
            if fut is not None and not fut.done():
                fut.set_result(now)

    def produce(self, block: bytes) -> tuple[int, asyncio.Future]:
        runner = self.runners["producer"]
        mid = runner.core.produce(block, CHANNEL_RAW, time.time())
        fut = asyncio.get_running_loop().create_future()
        self.waiters[mid] = fut
        runner.pump()
        return mid, fut

    def capture_frames(self, block: bytes) -> list[bytes]:
        """The chunk frames the producer core emits for `block` (for the baseline), from a
        separate core instance."""
        core = ProducerCore(self.keys["producer"], self.membership, self.params)
        core.produce(block, CHANNEL_RAW, time.time())
        return [f for _, f in core.frames_to_send(time.time())]

    async def close(self) -> None:
        for t in self.transports.values():
            await t.close()
        for log in self.logs:
            log.close()


class RawPath:
    """Baseline: producer -> hop1 -> hop2 -> consumer, asyncio streams, LPF frames forwarded
    as they arrive; the consumer resolves a future after `expect` frames."""

    def __init__(self):
        self.servers = []
        self.expect = 0
        self.got = 0
        self.fut: asyncio.Future | None = None
        self.writer = None

    async def start(self) -> None:
        async def consumer(reader, writer):
            dec = LpfDecoder(8 * MIB)
            while data := await reader.read(1 << 18):
                for _ in dec.feed(data):
                    self.got += 1
                    if self.got >= self.expect and self.fut and not self.fut.done():
                        self.fut.set_result(time.perf_counter())

        def hop(next_port_ref):
            async def handle(reader, writer):
                _, w = await asyncio.open_connection("127.0.0.1", next_port_ref[0])
                dec = LpfDecoder(8 * MIB)
                while data := await reader.read(1 << 18):
                    for frame in dec.feed(data):
                        w.write(encode_lpf(frame))
                    await w.drain()
                w.close()
            return handle

        c = await asyncio.start_server(consumer, "127.0.0.1", 0)
        p_c = [c.sockets[0].getsockname()[1]]
        h2 = await asyncio.start_server(hop(p_c), "127.0.0.1", 0)
        p_h2 = [h2.sockets[0].getsockname()[1]]
        h1 = await asyncio.start_server(hop(p_h2), "127.0.0.1", 0)
        self.servers = [c, h2, h1]
        _, self.writer = await asyncio.open_connection("127.0.0.1", h1.sockets[0].getsockname()[1])

    async def send(self, frames: list[bytes]) -> float:
        self.got = 0
        self.expect = len(frames)
        self.fut = asyncio.get_running_loop().create_future()
        t0 = time.perf_counter()
        self.writer.writelines([encode_lpf(f) for f in frames])
        await self.writer.drain()
        t1 = await self.fut
        return (t1 - t0) * 1000

    async def close(self) -> None:
        self.writer.close()
        for s in self.servers:
            s.close()


async def latency(path: MarlinPath, n: int, size: int) -> list[float]:
    out = []
    for _ in range(n):
        block = os.urandom(size)
        t0 = time.perf_counter()
        _, fut = path.produce(block)
        t1 = await asyncio.wait_for(fut, 30)
        out.append((t1 - t0) * 1000)
    return out


async def rate_run(path: MarlinPath, rate: float, seconds: float, size: int) -> tuple[float, int, int]:
    """Release blocks at `rate`/s for `seconds`; returns (p99 ms, rebuilt, sent)."""
    n = max(3, int(rate * seconds))
    blocks = [os.urandom(size) for _ in range(n)]
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.05
    futs = []
    for i, b in enumerate(blocks):
        release = start + i / rate
        delay = release - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        t_rel = time.perf_counter() - max(0.0, loop.time() - release)   # latency counts from the schedule
        _, fut = path.produce(b)
        futs.append((t_rel, fut))
    lat = []
    for t_rel, fut in futs:
        try:
            t1 = await asyncio.wait_for(fut, 10)
            lat.append((t1 - t_rel) * 1000)
        except asyncio.TimeoutError:
            lat.append(float("inf"))
    ok = sum(1 for x in lat if x != float("inf"))
    return pct(lat, 99), ok, n


async def main_async(args) -> None:
    size = args.size
    with tempfile.TemporaryDirectory(prefix="bench-marlin-") as tmp:
        path = MarlinPath(Path(tmp))
        await path.start()
        raw = RawPath()
        await raw.start()
        try:
            gc.collect()
            gc.freeze()
            # warm-up
            await latency(path, 5, size)
            frames = path.capture_frames(os.urandom(size))
            for _ in range(5):
                await raw.send(frames)
            lat = await latency(path, args.blocks, size)
            base = [await raw.send(path.capture_frames(os.urandom(size))) for _ in range(min(args.blocks, 100))]
            p50, p99 = statistics.median(lat), pct(lat, 99)
            b50, b99 = statistics.median(base), pct(base, 99)
            wire = sum(len(f) for f in frames)
            print(f"block {size} bytes ({wire} bytes in {len(frames)} chunk frames), path producer -> member -> "
                  f"member -> consumer, one process, loopback TCP; {path.filtered} direct member->consumer copies "
                  f"removed by the route filter")
            print(f"latency over {len(lat)} blocks: p50 {p50:.1f} ms (target <= 50), p99 {p99:.1f} ms "
                  f"(target <= 120), max {max(lat):.1f} ms")
            print(f"baseline raw TCP, same frames and hops, {len(base)} blocks: p50 {b50:.2f} ms, p99 {b99:.2f} ms")
            print(f"ratio marlin/baseline: p50 {p50 / b50:.1f}x, p99 {p99 / b99:.1f}x")
            best = None
            for rate in args.rates:
                p99r, ok, n = await rate_run(path, rate, args.rate_seconds, size)
                print(f"rate {rate:g} blocks/s ({rate * size / MIB:.1f} MiB/s) for {args.rate_seconds:g} s: "
                      f"{ok}/{n} rebuilt, p99 {p99r:.1f} ms")
                if ok == n and p99r <= 200:
                    best = rate
                else:
                    break
                await asyncio.sleep(0.5)
            print(f"highest rate with p99 <= 200 ms: {best if best is not None else 0:g} blocks/s of "
                  f"{size / MIB:g} MiB (target >= 5); ratio to target {((best or 0) / 5):.2f}")
        finally:
            await raw.close()
            await path.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=200, help="blocks for the latency percentiles (default 200)")
    ap.add_argument("--size", type=int, default=MIB, help="block size in bytes (default 1 MiB)")
    ap.add_argument("--rate-seconds", type=float, default=8.0, help="seconds per rate step (default 8)")
    ap.add_argument("--rates", type=float, nargs="+", default=[2, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32],
                    help="rate steps in blocks/s, ascending (stops at the first failing one)")
    ap.add_argument("--short", action="store_true",
                    help="quick look: 40 latency blocks, 3 s per rate step (not enough for a p99 claim)")
    args = ap.parse_args()
    if args.short:
        args.blocks = min(args.blocks, 40)
        args.rate_seconds = 3.0
    try:
        import uvloop  # noqa: F401
        uvloop.install()
        print("event loop: uvloop")
    except ImportError:
        print("event loop: asyncio")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
