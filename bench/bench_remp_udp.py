"""REMP transport vs raw asyncio UDP: request/response on 127.0.0.1, measured in one run.

    .venv/bin/python bench/bench_remp_udp.py [--requests 2000] [--seconds 3] [--window 32]
                                             [--sizes 200,16384]

Baseline ("a same-run baseline of a raw asyncio UDP request/response
on this machine"): a client and an echo server, each a plain asyncio DatagramProtocol in
its own process, one datagram each way (a 16 KiB request is one loopback datagram).
Measured: the same client/echo pair through remp_node.transport.udp.UdpEndpoint +
transport.TransportCore (AES-256-GCM per datagram with per-peer keys, 1,232-byte parts,
replay window, rate buckets, reassembly), i.e. what every REMP datagram costs.

Per payload size: latency of sequential round trips (p50 / p99 / max, ms) and the highest
rate with `--window` requests outstanding for `--seconds` (round trips per second), then the
ratio remp / raw. Requests that get no answer within 1 s are counted as lost (there should
be none on loopback). Target (ours): the transport adds < 0.1 ms to the p50 of a
one-datagram round trip (two authenticated datagrams); the issue's REMP budget for the first
receipt is p50 <= 50 ms, so the transport must stay a negligible part of it. Fragmented
payloads (a 16 KiB catchain block = 15 datagrams each way) are printed for the record.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import multiprocessing as mp
import os
import socket
import statistics
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from remp_node.wire.keys import NodeKey  # noqa: E402
from remp_node.transport.core import TransportCore, TransportLimits  # noqa: E402
from remp_node.transport.udp import SOCKET_BUFFER, UdpEndpoint  # noqa: E402

CLIENT = NodeKey.from_seed(hashlib.sha256(b"bench-udp-client").digest())
SERVER = NodeKey.from_seed(hashlib.sha256(b"bench-udp-server").digest())
#: largest payload that fits one transport datagram (1,232 - 78 bytes of overhead)
MAX_ONE_DATAGRAM = 1154
LIMITS = TransportLimits(rate_per_peer=1e9, burst_per_peer=1e9, rate_per_address=1e9, burst_per_address=1e9)


# --- servers (child processes) -------------------------------------------------------------

def _buffers(transport) -> None:
    """The same socket buffers UdpEndpoint sets (udp.SOCKET_BUFFER), for a fair baseline."""
    sock = transport.get_extra_info("socket")
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)


class _RawEcho(asyncio.DatagramProtocol):
    def connection_made(self, transport):
        self.t = transport
        _buffers(transport)

    def datagram_received(self, data, addr):
        self.t.sendto(data, addr)


def _serve(mode: str, conn) -> None:
    async def main():
        loop = asyncio.get_running_loop()
        if mode == "raw":
            t, _ = await loop.create_datagram_endpoint(_RawEcho, local_addr=("127.0.0.1", 0))
            conn.send(t.get_extra_info("sockname")[:2])
        else:
            holder = {}
            core = TransportCore(SERVER, {}, limits=LIMITS)
            ep = await UdpEndpoint.create(core, ("127.0.0.1", 0), lambda s, p, n: holder["ep"].send(s, p))
            holder["ep"] = ep
            conn.send(ep.address)
            client_addr = conn.recv()
            core.add_peer(CLIENT.key_id, CLIENT.public, tuple(client_addr))
        while not conn.poll():
            await asyncio.sleep(0.05)
    asyncio.run(main())


# --- clients -------------------------------------------------------------------------------

class _Client:
    def __init__(self):
        self.waiting: dict[int, asyncio.Future] = {}

    def answer(self, payload: bytes) -> None:
        (rid,) = struct.unpack_from("<Q", payload)
        fut = self.waiting.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_result(time.perf_counter())


class _RawClient(asyncio.DatagramProtocol, _Client):
    def __init__(self, server):
        _Client.__init__(self)
        self.server = server

    def connection_made(self, transport):
        self.t = transport
        _buffers(transport)

    def datagram_received(self, data, addr):
        self.answer(data)

    def send(self, payload: bytes) -> None:
        self.t.sendto(payload, self.server)


async def _client(mode: str, server, conn):
    loop = asyncio.get_running_loop()
    if mode == "raw":
        t, c = await loop.create_datagram_endpoint(lambda: _RawClient(server), local_addr=("127.0.0.1", 0))
        return c, t.close
    c = _Client()
    core = TransportCore(CLIENT, {SERVER.public: tuple(server)}, limits=LIMITS)
    ep = await UdpEndpoint.create(core, ("127.0.0.1", 0), lambda s, p, n: c.answer(p))
    conn.send(ep.address)
    c.send = lambda payload: ep.send(SERVER.key_id, payload)
    return c, ep.close


async def _request(c: _Client, rid: int, body: bytes) -> float | None:
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    c.waiting[rid] = fut
    t0 = time.perf_counter()
    c.send(struct.pack("<Q", rid) + body)
    try:
        t1 = await asyncio.wait_for(fut, 1.0)
    except asyncio.TimeoutError:
        c.waiting.pop(rid, None)
        return None
    return t1 - t0


async def _measure(mode: str, server, conn, size: int, requests: int, seconds: float, window: int) -> dict:
    c, close = await _client(mode, server, conn)
    body = os.urandom(max(0, size - 8))
    rid = 0
    for _ in range(50):                                  # warm up
        rid += 1
        await _request(c, rid, body)
    rtts, lost = [], 0
    for _ in range(requests):
        rid += 1
        r = await _request(c, rid, body)
        if r is None:
            lost += 1
        else:
            rtts.append(r * 1000)
    done = 0
    end = time.perf_counter() + seconds
    counter = [rid]

    async def worker():
        nonlocal done, lost
        while time.perf_counter() < end:
            counter[0] += 1
            r = await _request(c, counter[0], body)
            if r is None:
                lost += 1
            else:
                done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(window)))
    rate = done / (time.perf_counter() - t0)
    close()
    rtts.sort()
    return {"p50": statistics.median(rtts), "p99": rtts[int(len(rtts) * 0.99) - 1], "max": rtts[-1],
            "rate": rate, "lost": lost}


def run(mode: str, size: int, args) -> dict:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_serve, args=(mode, child), daemon=True)
    p.start()
    try:
        server = parent.recv()
        return asyncio.run(_measure(mode, server, parent, size, args.requests, args.seconds, args.window))
    finally:
        parent.send("stop")
        p.join(5)
        if p.is_alive():
            p.kill()


def core_cost(size: int, n: int = 2000) -> tuple[float, float, int]:
    """In-process CPU of TransportCore alone (no sockets): (send us, receive us, datagrams)
    per payload of `size` bytes."""
    a = TransportCore(CLIENT, {SERVER.public: "server"}, limits=LIMITS, epoch=1)
    b = TransportCore(SERVER, {CLIENT.public: "client"}, limits=LIMITS, epoch=1)
    payload = os.urandom(size)
    t0 = time.perf_counter()
    batches = []
    for _ in range(n):
        a.send(SERVER.key_id, payload, 0.0)
        batches.append(a.datagrams_to_send(0.0))
    t1 = time.perf_counter()
    for batch in batches:
        for data, _ in batch:
            b.receive_datagram(data, "client", 0.0)
        while b.next_event() is not None:
            pass
    t2 = time.perf_counter()
    assert b.counters["received_payloads"] == n
    return (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6, len(batches[0])


def delivery_cost(n: int = 9000, burst: int = 30, gap: float = 0.01) -> dict:
    """CPU of receipt delivery alone (delivery.py, no sockets): `n` signed receipts (New,
    AcceptedByQueue, IncludedIntoBlock in turn) added in bursts of `burst` every `gap` s
    (3,000 receipts/s for one full node), packets received, acks returned at once."""
    from remp_node.core.delivery import ReceiptReceiver, ReceiptSender
    from remp_node.wire.keys import verify
    from remp_node.wire.receipts import Accepted, Level, New, make_signed_receipt
    from remp_node.wire.tl import BlockIdExt
    block = BlockIdExt(0, 0x4000000000000000, 1, b"\x01" * 32, b"\x02" * 32)
    statuses = [New(), Accepted(Level.QUEUE), Accepted(Level.COLLATOR, block)]
    rs = [make_signed_receipt(SERVER, hashlib.sha256(b"%d" % i).digest(), statuses[i % 3], i) for i in range(n)]
    sender, receiver = ReceiptSender(SERVER, stream=1), ReceiptReceiver(CLIENT, [SERVER.public])
    t_send = t_recv = 0.0
    now, packets = 0.0, 0
    for i, r in enumerate(rs):
        if i % burst == 0:
            now += gap
        a = time.perf_counter()
        sender.add(CLIENT.key_id, r, now)
        out = sender.packets_to_send(now)
        b = time.perf_counter()
        for _, p in out:
            receiver.receive(SERVER.key_id, p, now)
        while receiver.next_event() is not None:
            pass
        acks = receiver.packets_to_send(now)
        c = time.perf_counter()
        for _, ack in acks:
            sender.receive_ack(CLIENT.key_id, ack, now)
        t_send += (b - a) + (time.perf_counter() - c)
        t_recv += c - b
        packets += len(out)
    one = rs[0]
    t0 = time.perf_counter()
    for _ in range(500):
        verify(SERVER.public, one.receipt, one.signature)
    t_verify = (time.perf_counter() - t0) / 500
    return {"receipts": n, "packets": packets, "send_us": t_send / n * 1e6, "recv_us": t_recv / n * 1e6,
            "verify_us": t_verify * 1e6}


def client_cost(n: int = 3000) -> dict:
    """CPU per receipt in the full node's RempClient (client.py): the same `n` distinct
    signed receipts of one tracked message fed through receive_datagram (decode + its own
    ed25519 verify) and through receive_authenticated (what the daemon uses for receipts out
    of ReceiptReceiver, whose packet signature covers them: no second verify)."""
    from remp_node.core.client import RempClient
    from remp_node.wire.receipts import New, make_signed_receipt
    from remp_node.core.state import build_zero_state, make_wallet_message, wallet_address
    alice = NodeKey.from_seed(b"\x01" * 32)
    addr = wallet_address(alice.public)
    t0 = 1_700_000_000.0
    out = {}
    for mode in ("receive_datagram", "receive_authenticated"):
        c = RempClient(CLIENT, build_zero_state(wallets=[(alice.public, 1000)]), lambda shard, now: ([SERVER.public], []))
        mid = c.submit(make_wallet_message(alice, addr, addr, 1, int(t0 + 600), 1), t0)
        rs = [make_signed_receipt(SERVER, mid, New(), int(t0 * 1000) + i) for i in range(n)]
        datas = [r.serialize() for r in rs]
        opened = [r.open() for r in rs]
        a = time.perf_counter()
        if mode == "receive_datagram":
            for d in datas:
                c.receive_datagram(d, SERVER.key_id, t0 + 1)
        else:
            for r, o in zip(rs, opened):
                c.receive_authenticated(r, o, SERVER.key_id, t0 + 1)
        out[mode] = (time.perf_counter() - a) / n * 1e6
        assert c.stats["receipts"] == n
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000, help="sequential round trips per size and mode")
    ap.add_argument("--seconds", type=float, default=3.0, help="duration of the max-rate phase per size and mode")
    ap.add_argument("--window", type=int, default=32, help="requests outstanding in the max-rate phase")
    ap.add_argument("--sizes", default="200,16384", help="payload sizes in bytes, comma separated")
    ap.add_argument("--receipts-only", action="store_true",
                    help="print only the receipt CPU figures (delivery.py, RempClient), no sockets")
    args = ap.parse_args()
    from result_file import write_result
    if args.receipts_only:
        write_result("remp_udp", receipt_figures())
        return
    figures, baseline, ratio = {}, {}, {}
    print(f"request/response on 127.0.0.1, {os.cpu_count()} CPUs; latency over {args.requests} sequential "
          f"round trips, rate with {args.window} outstanding for {args.seconds:.0f} s")
    print(f"{'size':>6} {'mode':<5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'rt/s':>9} {'lost':>5}")
    for size in [int(s) for s in args.sizes.split(",")]:
        res = {}
        for mode in ("raw", "remp"):
            r = res[mode] = run(mode, size, args)
            print(f"{size:>6} {mode:<5} {r['p50']:8.3f} {r['p99']:8.3f} {r['max']:8.3f} {r['rate']:9.0f} {r['lost']:5d}")
        raw, ours = res["raw"], res["remp"]
        for k in ("p50", "p99", "rate", "lost"):
            unit = "_per_s" if k == "rate" else "" if k == "lost" else "_ms"
            figures[f"{k}{unit}@{size}B"], baseline[f"raw_{k}{unit}@{size}B"] = ours[k], raw[k]
        ratio.update({f"p50@{size}B": ours["p50"] / raw["p50"], f"p99@{size}B": ours["p99"] / raw["p99"],
                      f"rate@{size}B": ours["rate"] / raw["rate"]})
        snd, rcv, parts = core_cost(size)
        print(f"{size:>6} TransportCore CPU per payload ({parts} datagram{'s' * (parts > 1)}): send {snd:.1f} us, "
              f"receive {rcv:.1f} us (AES-GCM + framing + replay window + reassembly)")
        added = ours["p50"] - raw["p50"]
        verdict = ("met" if added < 0.1 else "MISSED") if size <= MAX_ONE_DATAGRAM else "n/a (fragmented)"
        print(f"{size:>6} ratio remp/raw: p50 x{ours['p50'] / raw['p50']:.2f}, p99 x{ours['p99'] / raw['p99']:.2f}, "
              f"rate x{ours['rate'] / raw['rate']:.2f}; p50 added {added:.3f} ms "
              f"(target < 0.100 ms for a one-datagram payload: {verdict})")

    figures.update(receipt_figures())
    write_result("remp_udp", figures, baseline, ratio)


def receipt_figures() -> dict:
    d = delivery_cost()
    print(f"receipt delivery CPU (delivery.py, {d['receipts']} receipts at 3,000/s to one full node): "
          f"{d['receipts'] / d['packets']:.1f} receipts per signed packet, sender {d['send_us']:.1f} us/receipt, "
          f"receiver {d['recv_us']:.1f} us/receipt (packet ed25519 verify + parse + order + ack); "
          f"one receipt's own ed25519 verify {d['verify_us']:.1f} us")
    c = client_cost()
    saved = c["receive_datagram"] - c["receive_authenticated"]
    print(f"RempClient CPU per receipt: receive_datagram (own ed25519 verify) {c['receive_datagram']:.1f} us, "
          f"receive_authenticated (packet-authenticated, the daemon's path) {c['receive_authenticated']:.1f} us: "
          f"saved {saved:.1f} us/receipt (x{c['receive_datagram'] / c['receive_authenticated']:.2f}; "
          f"target: no second verify, saving ~ one verify = {d['verify_us']:.1f} us)")
    return {"receipts_per_packet": d["receipts"] / d["packets"], "receipt_send_us": d["send_us"],
            "receipt_receive_us": d["recv_us"], "receipt_verify_us": d["verify_us"],
            "client_receive_authenticated_us": c["receive_authenticated"],
            "client_receive_datagram_us": c["receive_datagram"]}


if __name__ == "__main__":
    main()
