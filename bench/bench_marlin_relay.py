"""Marlin relay latency and sustained rate: a 1 MiB block producer -> member -> member ->
consumer on loopback through the real transport (LPF over TCP) and the real cores, against
a raw TCP relay of the same bytes along the same hops (the baseline measured in the same run).

    .venv/bin/python bench/bench_marlin_relay.py [--blocks 200] [--short]

Set-up, `--layout processes` (default): the producer in this process, each of the two
members and the consumer its own process (multiprocessing spawn, like the daemons), each
with its own Transport and listening socket, so every hop is a real TCP connection on
127.0.0.1; the consumer reports each rebuild over UDP with time.perf_counter() (a
system-wide monotonic clock). `--layout one`: all four nodes as tasks of one event loop.
Nodes: a producer, one cluster of two members, one consumer; params: channel raw 12 chunks of which any 8 rebuild. The
producer sends each chunk to one member (rotated by chunk id); that member witnesses it,
acknowledges it and relays it to the other member, which relays it to the consumer. The
bench removes the first member's direct copy to the consumer (a send filter in the
member's adapter), so every chunk takes the three hops producer -> member -> member ->
consumer. Each node logs its events at info to its own file, like the daemons. Also printed:
CPU per block of each node (from /proc): on a shared, loaded machine wall-clock latency
swings with other tenants, the CPU cost does not. Per chunk: coding, attestation
signatures, witness and ack signatures, signature recoveries, and keccak256 over the chunk
bytes (chunk hash and message hash: about 7 full passes per chunk along the path).

Latency: one block at a time, `produce()` -> the consumer's BlockRebuilt (1 MiB: a fixed
random base behind an 8-byte counter, so every message id differs); p50/p99 over --blocks blocks (targets p50 <= 50 ms,
p99 <= 120 ms).
Rate: blocks released on a fixed schedule at R blocks/s for --rate-seconds (R = 2, 4, 5,
6, 8, 10, 12, 16, 20 ...) until p99 latency (release -> rebuilt) > 200 ms or a block is
not rebuilt; reports the highest R with p99 <= 200 ms (target >= 5 blocks/s). Each rate run
also gives CPU per block of each process over the run (figures `at_rate.cpu_ms_per_block.<node>`
of the last run): the run's CPU minus the process's idle CPU per second, measured over
--idle-seconds of quiet just before the run, times the run's length, per block offered; the
one-at-a-time CPU per block above comes from --blocks blocks only (20 blocks: 0.5 ms steps of
/proc's 10 ms clock tick per process).
Baseline (same run, same process layout: hops in their own processes with --layout
processes): raw asyncio streams, three LPF hops, each hop
forwarding each frame as it arrives; the producer sends the same chunk frames the Marlin
producer emitted for a block (about 1.5 MiB, 12 frames); latency = first write -> last
frame at the consumer. No crypto, coding, dedupe or logging.

Prints every figure, its target and marlin/baseline ratios. Not part of the test suite.

Measured (2-core VM shared with other jobs, uvloop, --layout processes, 200 blocks):
load average 4-9: p50 46.8-53.2 ms, p99 108-120 ms (raw TCP baseline p50 2.8-5.0 ms, p99
5-16 ms); rate ladder 5 s per step: 20 blocks/s with p99 82 ms, 24 blocks/s p99 406 ms.
CPU per block 40-56 ms in total, 9-15 ms per node, most of it keccak256 over the chunk
bytes in the cores. At load average 20-30 the same run gave p50 180-270 ms and 4 blocks/s.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
from daemon_runtime.eventlog import EventLog  # noqa: E402
from daemon_runtime.lifecycle import use_event_loop  # noqa: E402
from marlin_cluster.cluster import ClusterMemberCore  # noqa: E402
from marlin_cluster.consumer import ConsumerCore  # noqa: E402
from marlin_cluster.crypto import NodeKey  # noqa: E402
from marlin_cluster.daemon import MarlinRunner, Metrics, RebuildPool  # noqa: E402
from marlin_cluster.events import MARLIN_EVENTS, BlockRebuilt, Dispute  # noqa: E402
from marlin_cluster.membership import Membership  # noqa: E402
from marlin_cluster.params import CHANNEL_BTC, CHANNEL_RAW, ChannelParams, Params  # noqa: E402
from marlin_cluster.producer import ProducerCore  # noqa: E402
from marlin_cluster.transport import LpfDecoder, Transport, encode_lpf  # noqa: E402
from marlin_cluster.wire import KIND_ATTESTED_CHUNK, peek_chunk_ids  # noqa: E402

MIB = 1024 * 1024
DEFAULT_BTC = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "btc" / "block413567.raw"


def pct(values, q):
    s = sorted(values)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))
    return s[k]


def route_filter(runner, t, producer, consumer: bytes, count) -> None:
    """The member does not send the consumer a copy of a chunk it got from a producer
    (`producer`: an address or a set of them), so the consumer only gets it from the other
    member: three hops."""
    first_hop: set = set()
    receive, send = runner.receive, t.send
    producers = producer if isinstance(producer, (set, frozenset)) else {producer}

    def receive_(peer, frame):
        if peer in producers and frame[:1] == bytes((KIND_ATTESTED_CHUNK,)):
            mid, _, cid = peek_chunk_ids(memoryview(frame)[1:])
            first_hop.add((mid, cid, peer))
            if len(first_hop) > 100_000:
                first_hop.clear()
        receive(peer, frame)

    def send_(peer, frame):
        if peer == consumer:
            mid, _, cid = peek_chunk_ids(memoryview(frame)[1:])
            if any((mid, cid, p) in first_hop for p in producers):
                count()
                return True
        return send(peer, frame)

    t.on_frame = receive_
    t.send = send_


def bench_params(btc: bool = False) -> Params:
    """Channel raw (and btc) 12 chunks of which any 8 rebuild. The Bitcoin mode sends the same
    block again and again (its id is its hash), rotating over several producers: a message
    (id, producer) may come again once the caches forget it, after TOLERABLE_LATENCY +
    max_clock_skew (3.5 s here; the consumer's finished_retention is set below that), and once
    the producer purged it, ack_retention (0.5 s here) after its last acknowledgement."""
    if btc:
        return Params(channels={CHANNEL_RAW: ChannelParams(12, 8, 2 * MIB), CHANNEL_BTC: ChannelParams(12, 8, 2 * MIB)},
                      tolerable_latency=3.0, max_clock_skew=0.5, ack_timeout=5.0, max_messages=1024,
                      ack_retention=0.5, finished_retention=0.5)
    return Params(channels={CHANNEL_RAW: ChannelParams(12, 8, 2 * MIB)}, tolerable_latency=60,
                  ack_timeout=5.0, max_messages=1024)


class MarlinPath:
    """Producer, members m1 and m2 of one cluster, a consumer, in this event loop."""

    def __init__(self, logdir: Path):
        self.keys = {n: NodeKey.generate() for n in ("producer", "m1", "m2", "consumer")}
        a = {n: k.address for n, k in self.keys.items()}
        self.addr = a
        self.params = bench_params()
        self.membership = Membership(producers={a["producer"]: self.keys["producer"].public_key},
                                     clusters={100: [a["m1"], a["m2"]]},
                                     members={a["m1"]: self.keys["m1"].public_key,
                                              a["m2"]: self.keys["m2"].public_key},
                                     consumers={a["consumer"]: self.keys["consumer"].public_key})
        self.logdir = logdir
        self.done: dict[int, float] = {}
        self.waiters: dict[int, asyncio.Future] = {}
        self.transports: dict[str, Transport] = {}
        self.runners: dict[str, MarlinRunner] = {}
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
            runner = MarlinRunner(role, cores[name], t, log, Metrics(),
                                self._on_consumer_event if name == "consumer" else None)
            self.runners[name] = runner
        for m in ("m1", "m2"):
            self._route_filter(m)
        self.transports["producer"].warm([self.addr["m1"], self.addr["m2"]])
        self.transports["m1"].warm([self.addr["m2"], self.addr["consumer"], self.addr["producer"]])
        self.transports["m2"].warm([self.addr["m1"], self.addr["consumer"], self.addr["producer"]])
        await asyncio.sleep(0.3)

    def _route_filter(self, member: str) -> None:
        def count():
            self.filtered += 1
        route_filter(self.runners[member], self.transports[member], self.addr["producer"],
                     self.addr["consumer"], count)

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


# ---------------------------------------------------------------- process layout

def _free_ports(n: int) -> list[int]:
    import socket
    socks = [socket.socket() for _ in range(n)]
    for x in socks:
        x.bind(("127.0.0.1", 0))
    ports = [x.getsockname()[1] for x in socks]
    for x in socks:
        x.close()
    return ports


def child_main(spec: dict) -> None:
    """Entry of a node process (multiprocessing spawn), on the parent's event loop kind."""
    use_event_loop(spec.get("event_loop", "auto"))
    asyncio.run(_child(spec))


async def _child(spec: dict) -> None:
    import socket
    loop = asyncio.get_running_loop()
    report = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dest = ("127.0.0.1", spec["report_port"])
    name, role, ports = spec["name"], spec["role"], spec["ports"]
    stop = asyncio.Event()
    import signal
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    if role in ("raw-hop", "raw-sink"):
        per_block = spec["frames_per_block"]
        state = {"n": 0}

        async def handle(reader, writer):
            try:
                await relay(reader)
            except (asyncio.CancelledError, ConnectionError):
                pass

        async def relay(reader):
            w = None
            if role == "raw-hop":
                _, w = await asyncio.open_connection("127.0.0.1", ports[spec["next"]])
            dec = LpfDecoder(8 * MIB)
            while data := await reader.read(1 << 18):
                for frame in dec.feed(data):
                    if w is not None:
                        w.write(encode_lpf(frame))
                    else:
                        state["n"] += 1
                        if state["n"] % per_block == 0:
                            report.sendto(f"raw {state['n'] // per_block} {time.perf_counter()}".encode(), dest)
                if w is not None:
                    await w.drain()
            if w is not None:
                w.close()
        server = await asyncio.start_server(handle, "127.0.0.1", ports[name])
        report.sendto(f"ready {name}".encode(), dest)
        await stop.wait()
        server.close()
        return
    membership = Membership.from_dict(spec["membership"])
    params = bench_params(spec.get("btc", False))
    key = NodeKey.from_secret(bytes.fromhex(spec["secret"]))
    addrs = {n: bytes.fromhex(a) for n, a in spec["addrs"].items()}
    t = Transport(key, {addrs[n]: ("127.0.0.1", ports[n]) for n in addrs if n != name},
                  on_frame=lambda p, f: None, known=[a for n, a in addrs.items() if n != name],
                  max_frame=params.max_frame)
    await t.start("127.0.0.1", ports[name])
    pool = None
    if role == "cluster":
        core = ClusterMemberCore(key, membership, params, 100)
    else:
        pool = RebuildPool(spec.get("validate_pool", "inline"), spec.get("validate_workers", 1))
        core = ConsumerCore(key, membership, params, offload=pool.offload)
        await asyncio.gather(*(asyncio.wrap_future(f) for f in pool.warm()))

    def on_event(ev):
        if type(ev) is BlockRebuilt:
            report.sendto(f"rebuilt {ev.message_id} {ev.producer.hex()} {time.perf_counter()}".encode(), dest)
        elif type(ev) is Dispute:
            report.sendto(f"dispute {ev.message_id} {ev.producers[0].hex()} {ev.reason}".encode(), dest)

    log = EventLog(f"marlin-{role}", name, [MARLIN_EVENTS], sink=spec["log"])
    runner = MarlinRunner(role, core, t, log, Metrics(), on_event, pool if pool is not None and pool.offload else None)
    if role == "cluster":
        route_filter(runner, t, {a for n, a in addrs.items() if n.startswith("producer")}, addrs["consumer"],
                     lambda: None)
        t.warm([a for n, a in addrs.items() if n != name])
    gc.collect()
    gc.freeze()
    await asyncio.sleep(0.3)
    report.sendto(f"ready {name} {','.join(str(c.pid) for c in psutil.Process().children(recursive=True))}".encode(),
                  dest)
    await stop.wait()
    dropped = {reason: n for (kind, reason), n in t.counters.items() if kind == "dropped" and n}
    if dropped:     # frames this node's transport did not send: a block short of chunks is disputed
        print(f"{name}: transport dropped frames {dropped}", file=sys.stderr, flush=True)
    await t.close()
    if pool is not None:
        pool.close()
    log.close()


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of a process (this one when pid is None)."""
    if pid is None:
        return time.process_time()
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


class _Reports(asyncio.DatagramProtocol):
    def __init__(self, owner):
        self.owner = owner

    def datagram_received(self, data, addr):
        self.owner.datagram(data.decode().split())


class ProcPath:
    """m1, m2 and the consumer as their own processes; the producer(s) in this one. Same
    interface as MarlinPath; the consumer reports each rebuild (message id, producer,
    time.perf_counter(), a system-wide monotonic clock) over UDP.

    btc=True: channel btc, `producers` producers taking turns, each sending again only after
    the caches forgot its previous message (pace()); the consumer's RebuildPool is
    `validate_pool` x `validate_workers`, like marlin-node consumer's flags."""

    def __init__(self, logdir: Path, btc: bool = False, producers: int = 1, validate_pool: str = "inline",
                 validate_workers: int = 1, event_loop: str = "auto"):
        self.event_loop = event_loop
        self.pnames = ["producer"] + [f"producer{i}" for i in range(1, producers)]
        self.keys = {n: NodeKey.generate() for n in self.pnames + ["m1", "m2", "consumer"]}
        self.addr = {n: k.address for n, k in self.keys.items()}
        self.btc = btc
        self.channel = CHANNEL_BTC if btc else CHANNEL_RAW
        self.params = bench_params(btc)
        self.horizon = self.params.tolerable_latency + self.params.max_clock_skew
        self.validate_pool, self.validate_workers = validate_pool, validate_workers
        a = self.addr
        self.membership = Membership(producers={a[n]: self.keys[n].public_key for n in self.pnames},
                                     clusters={100: [a["m1"], a["m2"]]},
                                     members={a["m1"]: self.keys["m1"].public_key,
                                              a["m2"]: self.keys["m2"].public_key},
                                     consumers={a["consumer"]: self.keys["consumer"].public_key})
        self.logdir = logdir
        self.waiters: dict[tuple, asyncio.Future] = {}
        self.raw_waiters: dict[int, asyncio.Future] = {}
        self.ready: set[str] = set()
        self.child_pids: dict[str, list[int]] = {}
        self.disputes: list = []
        self.procs = []
        self.filtered = 0
        self.turn = 0
        self.last_sent: dict[str, float] = {}

    def datagram(self, parts) -> None:
        if parts[0] == "ready":
            self.ready.add(parts[1])
            if len(parts) > 2 and parts[2]:
                self.child_pids[parts[1]] = [int(x) for x in parts[2].split(",")]
        elif parts[0] == "rebuilt":
            fut = self.waiters.pop((int(parts[1]), parts[2]), None)
            if fut is not None and not fut.done():
                fut.set_result(float(parts[3]))
        elif parts[0] == "dispute":
            self.disputes.append(parts[1:])
            fut = self.waiters.pop((int(parts[1]), parts[2]), None)
            if fut is not None and not fut.done():
                fut.set_exception(RuntimeError(f"consumer disputed {int(parts[1]):08x}: {parts[3]}"))
        elif parts[0] == "raw":
            fut = self.raw_waiters.pop(int(parts[1]), None)
            if fut is not None and not fut.done():
                fut.set_result(float(parts[2]))

    async def start(self, frames_per_block: int) -> None:
        import multiprocessing as mp
        loop = asyncio.get_running_loop()
        self._udp, _ = await loop.create_datagram_endpoint(lambda: _Reports(self), local_addr=("127.0.0.1", 0))
        report_port = self._udp.get_extra_info("sockname")[1]
        names = self.pnames + ["m1", "m2", "consumer", "raw1", "raw2", "rawsink"]
        self.ports = dict(zip(names, _free_ports(len(names))))
        ctx = mp.get_context("spawn")
        common = {"ports": self.ports, "report_port": report_port, "membership": self.membership.to_dict(),
                  "addrs": {n: a.hex() for n, a in self.addr.items()}, "frames_per_block": frames_per_block,
                  "btc": self.btc, "event_loop": self.event_loop}
        specs = [dict(common, name=n, role="cluster" if n.startswith("m") else "consumer",
                      secret=self.keys[n].secret.hex(), log=str(self.logdir / f"{n}.jsonl"),
                      validate_pool=self.validate_pool, validate_workers=self.validate_workers)
                 for n in ("m1", "m2", "consumer")]
        specs += [dict(common, name="rawsink", role="raw-sink"), dict(common, name="raw2", role="raw-hop", next="rawsink"),
                  dict(common, name="raw1", role="raw-hop", next="raw2")]
        for spec in specs:
            # not daemonic: the consumer starts its rebuild pool's worker processes
            proc = ctx.Process(target=child_main, args=(spec,), daemon=False)
            proc.start()
            self.procs.append(proc)
        deadline = loop.time() + 90
        while len(self.ready) < len(specs):
            if loop.time() > deadline or any(p.exitcode is not None for p in self.procs):
                for proc in self.procs:
                    proc.terminate()
                raise RuntimeError(f"node processes not ready: {sorted(self.ready)}")
            await asyncio.sleep(0.05)
        self.transports, self.runners, self.logs = {}, {}, []
        nodes = ("m1", "m2", "consumer")
        for n in self.pnames:
            key = self.keys[n]
            t = Transport(key, {self.addr[x]: ("127.0.0.1", self.ports[x]) for x in nodes},
                          on_frame=lambda p, f: None, known=[self.addr[x] for x in nodes],
                          max_frame=self.params.max_frame)
            await t.start("127.0.0.1", self.ports[n])
            log = EventLog("marlin-producer", n, [MARLIN_EVENTS], sink=str(self.logdir / f"{n}.jsonl"))
            self.logs.append(log)
            self.transports[n] = t
            self.runners[n] = MarlinRunner("producer", ProducerCore(key, self.membership, self.params), t, log, Metrics())
            t.warm([self.addr["m1"], self.addr["m2"]])
        self.runner = self.runners["producer"]
        _, self.raw_writer = await asyncio.open_connection("127.0.0.1", self.ports["raw1"])
        self.raw_count = 0
        await asyncio.sleep(0.5)

    async def pace(self) -> None:
        """Bitcoin mode: wait until the next producer's previous message is forgotten by the
        caches (its id repeats: the block is always the same)."""
        if not self.btc:
            return
        name = self.pnames[self.turn % len(self.pnames)]
        wait = self.last_sent.get(name, -1e9) + self.horizon + 0.3 - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)

    def produce(self, block: bytes):
        name = self.pnames[self.turn % len(self.pnames)]
        self.turn += 1
        self.last_sent[name] = time.perf_counter()
        runner = self.runners[name]
        mid = runner.core.produce(block, self.channel, time.time())
        fut = asyncio.get_running_loop().create_future()
        self.waiters[(mid, self.addr[name].hex())] = fut
        runner.pump()
        return mid, fut

    def capture_frames(self, block: bytes) -> list[bytes]:
        core = ProducerCore(self.keys["producer"], self.membership, self.params)
        core.produce(block, self.channel, time.time())
        return [f for _, f in core.frames_to_send(time.time())]

    async def raw_send(self, frames: list[bytes]) -> float:
        self.raw_count += 1
        fut = asyncio.get_running_loop().create_future()
        self.raw_waiters[self.raw_count] = fut
        t0 = time.perf_counter()
        self.raw_writer.writelines([encode_lpf(f) for f in frames])
        await self.raw_writer.drain()
        t1 = await asyncio.wait_for(fut, 30)
        return (t1 - t0) * 1000

    async def close(self) -> None:
        self.raw_writer.close()
        for n, t in self.transports.items():
            dropped = {reason: k for (kind, reason), k in t.counters.items() if kind == "dropped" and k}
            if dropped:
                print(f"{n}: transport dropped frames {dropped}", flush=True)
            await t.close()
        for log in self.logs:
            log.close()
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.join(5)
        self._udp.close()


_BASE: dict[int, bytes] = {}
_SEQ = [0]


def fresh_block(size: int) -> bytes:
    """A distinct block of `size` random-looking bytes, cheaply: a fixed random base with an
    8-byte counter in front (so every message id differs; 1 MiB of os.urandom costs ~8 ms
    of CPU on the bench VM, which would be charged to the producer)."""
    base = _BASE.get(size)
    if base is None:
        base = _BASE[size] = os.urandom(size - 8)
    _SEQ[0] += 1
    return _SEQ[0].to_bytes(8, "big") + base


async def latency(path: MarlinPath, n: int, size: int, make_block=None, failed: list | None = None) -> list[float]:
    """Rebuild latencies (ms) of `n` blocks sent one at a time. A block the consumer disputes
    or that is not rebuilt within 30 s is appended to `failed` (its reason) and the run goes
    on; without `failed` the first such block raises."""
    out = []
    for _ in range(n):
        block = make_block() if make_block is not None else fresh_block(size)
        if hasattr(path, "pace"):
            await path.pace()
        t0 = time.perf_counter()
        _, fut = path.produce(block)
        try:
            t1 = await asyncio.wait_for(fut, 30)
        except (RuntimeError, asyncio.TimeoutError) as exc:
            if failed is None:
                raise
            failed.append(str(exc) or "not rebuilt within 30 s")
            continue
        out.append((t1 - t0) * 1000)
    return out


async def rate_run(path: MarlinPath, rate: float, seconds: float, size: int) -> tuple[float, int, int, float]:
    """Release blocks at `rate`/s for `seconds`; returns (p99 ms, rebuilt, sent, p50 ms), a
    block not rebuilt within 10 s of its release counting as an infinite latency."""
    n = max(3, int(rate * seconds))
    blocks = [fresh_block(size) for _ in range(n)]
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
        futs.append((t_rel, fut, release))
    lat = []
    for t_rel, fut, release in futs:
        try:
            # 10 s from the block's own release: waiting 10 s per block in turn made an
            # overloaded run (hundreds of blocks never rebuilt) last for hours
            t1 = await asyncio.wait_for(fut, max(0.0, release + 10 - loop.time()))
            lat.append((t1 - t_rel) * 1000)
        except (RuntimeError, asyncio.TimeoutError):    # disputed or not rebuilt in time
            lat.append(float("inf"))
    ok = sum(1 for x in lat if x != float("inf"))
    return pct(lat, 99), ok, n, pct(lat, 50)


def write_result(args, figures: dict, baseline: dict, ratio: dict) -> Path | None:
    """One result in bench/results/ through the shared writer (bench/result_file.py); nested
    figure dicts are flattened to dotted names ("cpu_ms_per_block.consumer")."""
    from result_file import write_result as write_one      # bench/ is sys.path[0] as a script

    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in (d or {}).items():
            key = f"{prefix}{k}".replace(" ", "_")
            out.update(flat(v, key + ".") if isinstance(v, dict) else {key: v})
        return out
    return write_one("marlin_relay", flat(figures), flat(baseline), flat(ratio))


def cpu_ms_per_block_at_rate(used_s: float, idle_per_s: float, run_s: float, blocks: int) -> float:
    """CPU per block (ms) of one process over a rate run: `used_s` CPU seconds over `run_s`
    seconds, less its idle CPU (`idle_per_s` CPU seconds per second, measured just before the
    run) for the run's length, per block offered (never below 0)."""
    return round(max(0.0, used_s - idle_per_s * run_s) * 1000 / max(blocks, 1), 2)


async def main_async(args) -> None:
    size = args.size
    btc_block = args.btc.read_bytes() if args.btc else None
    if btc_block is not None:
        size = len(btc_block)

    def make_block() -> bytes:
        return btc_block if btc_block is not None else fresh_block(size)
    with tempfile.TemporaryDirectory(prefix="bench-marlin-") as tmp:
        if args.layout == "processes":
            path = ProcPath(Path(tmp), btc=btc_block is not None, producers=args.producers,
                            validate_pool=args.validate_pool, validate_workers=args.validate_workers,
                            event_loop=args.event_loop)
            await path.start(frames_per_block=12)
            raw = path
            raw.send = path.raw_send
        else:
            path = MarlinPath(Path(tmp))
            await path.start()
            raw = RawPath()
            await raw.start()
        try:
            gc.collect()
            gc.freeze()
            # warm-up
            await latency(path, 5, size, make_block)
            frames = path.capture_frames(make_block())
            for _ in range(5):
                await raw.send(frames)
            pids = {"producer": [None]}
            if args.layout == "processes":
                pids.update({n: [p.pid] for n, p in zip(("m1", "m2", "consumer"), path.procs)})
                workers = path.child_pids.get("consumer", [])
                if workers:
                    pids["consumer workers"] = workers

            def cpu_of(n):
                return sum(cpu_seconds(pid) for pid in pids[n])
            cpu0 = {n: cpu_of(n) for n in pids}
            failed: list[str] = []
            lat = await latency(path, args.blocks, size, make_block, failed)
            if failed:
                print(f"one at a time: {len(failed)} of {args.blocks} blocks not rebuilt (first: {failed[0]})")
            if not lat:
                raise SystemExit("no block was rebuilt")
            cpu = {n: (cpu_of(n) - cpu0[n]) * 1000 / (len(lat) + len(failed)) for n in pids}
            base = [await raw.send(path.capture_frames(make_block())) for _ in range(min(args.blocks, 100))]
            p50, p99 = statistics.median(lat), pct(lat, 99)
            b50, b99 = statistics.median(base), pct(base, 99)
            wire = sum(len(f) for f in frames)
            where = ("4 processes (producer here; m1, m2, consumer each its own; baseline hops too)"
                     if args.layout == "processes" else "one process, 4 nodes as tasks")
            what = (f"Bitcoin block {args.btc.name} ({size} bytes, channel btc, validated by the consumer: "
                    f"--validate-pool {args.validate_pool} x {args.validate_workers}; {args.producers} producers "
                    f"taking turns, each block after {path.horizon + 0.3:.1f} s)" if btc_block is not None
                    else f"block {size} bytes")
            p50_target, p99_target = (50, 150) if btc_block is not None else (50, 120)
            print(f"{what} ({wire} bytes in {len(frames)} chunk frames), path producer -> member -> "
                  f"member -> consumer, {where}, loopback TCP; members' direct copies to the consumer removed "
                  f"by the route filter")
            print(f"rebuild latency (first chunk sent -> block delivered{', validation included' if btc_block else ''})"
                  f" over {len(lat)} blocks: p50 {p50:.1f} ms (target <= {p50_target}), p99 {p99:.1f} ms "
                  f"(target <= {p99_target}), max {max(lat):.1f} ms")
            print(f"baseline raw TCP, same frames and hops, {len(base)} blocks: p50 {b50:.2f} ms, p99 {b99:.2f} ms")
            print(f"ratio marlin/baseline: p50 {p50 / b50:.1f}x, p99 {p99 / b99:.1f}x")
            if args.layout == "processes":
                print("CPU per block (ms, from /proc; what a quiet machine's latency is built from) and the "
                      "rate at which that process would saturate one core (1 s / its CPU per block):")
                for n, v in cpu.items():
                    print(f"  {n:17s} {v:7.1f} ms/block  -> {1000 / v if v > 0 else float('inf'):7.1f} blocks/s")
                print(f"  {'total':17s} {sum(cpu.values()):7.1f} ms/block")
            else:
                print(f"CPU per block (ms, all four nodes in this process): {cpu['producer']:.1f}")
            if getattr(path, "disputes", None):
                print(f"disputes: {len(path.disputes)} (first: {path.disputes[0]})")
            best = None
            at_rate: dict = {}
            if btc_block is None:
                for rate in args.rates:
                    # idle CPU of each process over a quiet window just before the run (heartbeats,
                    # timers), subtracted from the run's CPU so that CPU per block does not depend
                    # on the rate or the run's length
                    idle0, t_idle = {n: cpu_of(n) for n in pids}, time.perf_counter()
                    await asyncio.sleep(args.idle_seconds)
                    idle_s = time.perf_counter() - t_idle
                    idle = {n: (cpu_of(n) - idle0[n]) / idle_s if idle_s > 0 else 0.0 for n in pids}
                    cpu_r0, t_run = {n: cpu_of(n) for n in pids}, time.perf_counter()
                    p99r, ok, n, p50r = await rate_run(path, rate, args.rate_seconds, size)
                    run_s = time.perf_counter() - t_run
                    at_rate = {"rate_per_s": rate, "blocks": n, "run_s": round(run_s, 2),
                               "idle_s": round(idle_s, 2),
                               "idle_cpu_ms_per_s": {k: round(v * 1000, 2) for k, v in idle.items()},
                               "cpu_ms_per_block": {k: cpu_ms_per_block_at_rate(cpu_of(k) - cpu_r0[k], idle[k],
                                                                                 run_s, n) for k in pids}}
                    print(f"rate {rate:g} blocks/s ({rate * size / MIB:.1f} MiB/s) for {args.rate_seconds:g} s: "
                          f"{ok}/{n} rebuilt, p50 {p50r:.1f} ms, p99 {p99r:.1f} ms")
                    print("  CPU per block over the rate run, idle subtracted (ms): "
                          + ", ".join(f"{k} {v:.2f}" for k, v in at_rate["cpu_ms_per_block"].items())
                          + "; idle (ms/s): " + ", ".join(f"{k} {v:.1f}" for k, v in at_rate["idle_cpu_ms_per_s"].items()))
                    if ok == n and p99r <= 200:
                        best = rate
                    else:
                        break
                    await asyncio.sleep(0.5)
                print(f"highest rate with p99 <= 200 ms: {best if best is not None else 0:g} blocks/s of "
                      f"{size / MIB:g} MiB (target >= 5); ratio to target {((best or 0) / 5):.2f}")
            figures = {"mode": "btc" if btc_block is not None else "raw", "block_bytes": size,
                       "layout": args.layout, "blocks": len(lat), "not_rebuilt_one_at_a_time": len(failed), "p50_ms": round(p50, 2), "p99_ms": round(p99, 2),
                       "max_ms": round(max(lat), 2), "targets_ms": {"p50": p50_target, "p99": p99_target},
                       "cpu_ms_per_block": {n: round(v, 2) for n, v in cpu.items()},
                       "saturating_blocks_per_s": {n: round(1000 / v, 1) if v > 0 else None for n, v in cpu.items()},
                       "validate_pool": args.validate_pool, "validate_workers": args.validate_workers}
            if btc_block is None:
                figures["highest_rate_p99_200ms"] = best or 0
                if at_rate:    # the last rate run's CPU (the one a soak at one rate decides on)
                    figures["at_rate"] = at_rate
            else:
                figures.update(producers=args.producers, disputes=len(path.disputes))
            out = write_result(args, figures, {"p50_ms": round(b50, 3), "p99_ms": round(b99, 3), "blocks": len(base)},
                               {"p50": round(p50 / b50, 2), "p99": round(p99 / b99, 2)})
            print(f"result: {out}")
        finally:
            if raw is not path:
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
    ap.add_argument("--idle-seconds", type=float, default=3.0,
                    help="quiet seconds before each rate run whose CPU per second is subtracted from the "
                         "run's CPU per block (default 3)")
    ap.add_argument("--layout", choices=("processes", "one"), default="processes",
                    help="processes: each node (and each baseline hop) its own process, like the daemons "
                         "(default); one: all four nodes as tasks of one event loop")
    ap.add_argument("--btc", nargs="?", type=Path, const=DEFAULT_BTC, default=None, metavar="PATH",
                    help="send a real Bitcoin block on channel btc (default block: ../shared/data/btc/"
                         "block413567.raw, 1 MB), validated by the consumer; latency only, no rate ladder "
                         "(needs --layout processes)")
    ap.add_argument("--producers", type=int, default=None,
                    help="producers taking turns (default: 16 with --btc, so that the same block can be sent "
                         "again without waiting for the caches each time; 1 otherwise)")
    ap.add_argument("--validate-pool", choices=RebuildPool.KINDS, default="process",
                    help="the consumer's rebuild pool, as marlin-node consumer --validate-pool (default: process)")
    ap.add_argument("--validate-workers", type=int, default=1,
                    help="the consumer's rebuild workers, as marlin-node consumer --validate-workers (default: 1)")
    ap.add_argument("--event-loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                    help="event loop of every node process (default auto = uvloop when installed); asyncio "
                         "under a test-only link model (RELAY_SUITE_LINKS), whose delays need the standard "
                         "loop's TCP transports")
    ap.add_argument("--short", action="store_true",
                    help="quick look: 40 latency blocks, 3 s per rate step (not enough for a p99 claim)")
    args = ap.parse_args()
    if args.btc is not None:
        if args.layout != "processes":
            ap.error("--btc needs --layout processes")
        if not args.btc.is_file():
            ap.error(f"no Bitcoin block at {args.btc} (../shared/data absent?)")
    if args.producers is None:
        args.producers = 16 if args.btc is not None else 1
    if args.layout != "processes" and args.producers != 1:
        ap.error("--producers needs --layout processes")
    if args.short:
        args.blocks = min(args.blocks, 40)
        args.rate_seconds = 3.0
    print(f"event loop: {use_event_loop(args.event_loop)} (every node process)")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
