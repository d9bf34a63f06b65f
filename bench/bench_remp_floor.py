"""The CPU that REMP's requirements (DESIGN.md section 4) put on one external message, measured piece by
piece in one run, and the rate that leaves on this machine's cores (target: >= 300
messages/s sustained with 2 x 7 validators, all processes on one machine).

    .venv/bin/python bench/bench_remp_floor.py [--messages 400] [--rounds 3] [--n 2000]

A lower bound, not an estimate: only work that the issue names for every finalized message
is counted, each piece at its measured cost in this process (median of `--rounds`), and
nothing of what the network does besides it (consensus rounds and their votes, RMQ catchain
blocks, announcements, block application by the other validators, acks, resends, the
status hub, the event loop, the benchmark's own HTTP client) is added. With N validators
per shard group (7):

- full node, POST /messages (`FullnodeDaemon.submit`: BOC parse and checks, pre-execution
  against its state, the message's store row, the REMP client's rempMessage): the
  full node's API. Measured by bench_remp_fullnode's round (a real daemon, SQLite store, Redis
  stream on a redis-server started here, event log file).
- full node, every status of every validator (5 per member: PutIntoQueue, AcceptedByQueue,
  IncludedIntoBlock, IncludedIntoAcceptedBlock, Finalized = 5N, plus its own): received,
  one packet signature checked per packet, stored, appended to the Redis stream, logged
  (items 5 and 6). Same round: CPU per message of the receipt path.
- validators: 5N receipts signed (item 5: each receipt keeps its own signature), and the
  message parsed and executed with its wallet signature checked by each of the N group
  members (the collator collates it; the others validate the candidate: DESIGN.md
  section 4, "the group validates it").
- transport: the issue's own datagram budget "client + catchain datagrams per message <= 2N
  + 3", each at least one AES-GCM seal and open (TransportCore, per-peer keys) and one
  UDP sendto + recvfrom on 127.0.0.1 (plain blocking sockets, no event loop).

Prints each piece (us per message), the sum F (ms per message), and F x rate against the
machine's cores at 100 and 300 messages/s: where F x rate > cores, no implementation of these
pieces at these costs sustains the rate, whatever the rest costs. Also the full node's own
pieces against one core (one process runs Python on one core at a time). The same-run baselines
are the pieces themselves (each is a unit the daemons run).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_remp_fullnode as fnb  # noqa: E402
from bench_remp_udp import core_cost  # noqa: E402

from daemon_runtime.lifecycle import use_event_loop  # noqa: E402
from daemon_runtime.redis_server import EmbeddedRedis  # noqa: E402
from remp_node.wire.keys import NodeKey  # noqa: E402
from remp_node.testnet.localnet import LocalNet  # noqa: E402
from remp_node.wire.messages import parse_external_message  # noqa: E402
from remp_node.wire.receipts import New, make_signed_receipt  # noqa: E402
from remp_node.core.state import make_wallet_message  # noqa: E402

N_PER_GROUP = 7
STATUSES = 5


def validator_pieces(net, n: int) -> dict:
    """us per unit: one receipt signed; one wallet message parsed and executed with its
    signature checked (ShardState.try_execute on the zerostate: a group member's check)."""
    key = NodeKey.from_seed(b"\x05" * 32)
    mids = [os.urandom(32) for _ in range(n)]
    t0 = time.process_time()
    for i, mid in enumerate(mids):
        make_signed_receipt(key, mid, New(), 1_000 + i)
    sign_us = (time.process_time() - t0) / n * 1e6
    zs = net.zerostate()
    ws = [w for w in net.wallets() if w["workchain"] == 0]
    keys = [NodeKey.from_seed(bytes.fromhex(w["seed"])) for w in ws]
    vu = int(time.time()) + 7200
    bocs = [make_wallet_message(keys[i % len(ws)], ws[i % len(ws)]["address"],
                                ws[(i + 1) % len(ws)]["address"], 1 + i, vu, nonce=i) for i in range(n)]
    states = list(zs.states.values())
    now = time.time()
    ok = 0
    t0 = time.process_time()
    for boc in bocs:
        msg = parse_external_message(boc, (0, -1))
        st = next(s for s in states if s.holds(msg.dst))
        ok += st.try_execute(msg, now).ok
    exec_us = (time.process_time() - t0) / n * 1e6
    assert ok == n, f"{n - ok} of {n} generated wallet messages did not execute"
    return {"sign_us": sign_us, "exec_us": exec_us}


def udp_datagram_us(n: int, size: int = 400) -> float:
    """CPU us of one datagram's sendto + recvfrom on 127.0.0.1 (blocking sockets, one process)."""
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        b.bind(("127.0.0.1", 0))
        addr = b.getsockname()
        payload = os.urandom(size)
        t0 = time.process_time()
        for _ in range(n):
            a.sendto(payload, addr)
            b.recvfrom(2048)
        return (time.process_time() - t0) / n * 1e6
    finally:
        a.close()
        b.close()


async def fullnode_pieces(work: Path, ln: LocalNet, redis: EmbeddedRedis, messages: int, nonce0: int) -> dict:
    """us per message at the full node: submit (POST handling) and the receipt path, from
    bench_remp_fullnode.one_round."""
    res = await fnb.one_round(work, ln, redis, messages, nonce0, None)
    return {"submit_us": res["submit_cpu"] / res["messages"] * 1e6,
            "statuses_us": res["cpu"] / res["messages"] * 1e6,
            "statuses_per_message": res["statuses"] / res["messages"],
            "redis_us": res["redis_cpu"] / res["messages"] * 1e6}


async def amain(args) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-remp-floor-"))
    ln = LocalNet(work, shards=2, validators_per_shard=N_PER_GROUP, genesis_delay=0.0)
    await ln.init()
    cores = os.cpu_count() or 1
    print(f"REMP per-message floor, 2 shards x {N_PER_GROUP} validators, {cores} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}; work dir {work}", flush=True)
    rows = []
    with EmbeddedRedis() as redis:
        for r in range(args.rounds):
            fn = await fullnode_pieces(work, ln, redis, args.messages, 1_000_000 * (r + 1))
            v = validator_pieces(ln.net, args.n)
            seal, open_, parts = core_cost(400, args.n)
            udp = udp_datagram_us(args.n)
            datagrams = 2 * N_PER_GROUP + 3
            pieces = {
                "full node: POST /messages (submit)": fn["submit_us"],
                f"full node: {fn['statuses_per_message']:.0f} statuses (verify, store, stream, log)": fn["statuses_us"],
                "redis-server: the stream entries": fn["redis_us"],
                f"validators: {STATUSES * N_PER_GROUP} receipts signed": STATUSES * N_PER_GROUP * v["sign_us"],
                f"validators: parse + execute at {N_PER_GROUP} group members": N_PER_GROUP * v["exec_us"],
                f"transport: {datagrams} datagrams (AES-GCM seal + open)": datagrams * (seal + open_),
                f"transport: {datagrams} datagrams (UDP sendto + recvfrom)": datagrams * udp,
            }
            total_ms = sum(pieces.values()) / 1000
            rows.append((pieces, total_ms))
            print(f"round {r + 1}: F = {total_ms:.2f} ms per message "
                  f"(units: receipt sign {v['sign_us']:.1f} us, parse + execute {v['exec_us']:.1f} us, "
                  f"seal {seal:.1f} + open {open_:.1f} us, UDP {udp:.1f} us per datagram)", flush=True)
    names = list(rows[0][0])
    print(f"\nmedian of {len(rows)} rounds, us per message:")
    for name in names:
        print(f"  {statistics.median(r[0][name] for r in rows):8.1f}  {name}")
    f_ms = statistics.median(r[1] for r in rows)
    print(f"  F = {f_ms:.2f} ms of CPU per message, counting only the pieces above")
    for rate in (100, 300):
        need = rate * f_ms / 1000
        verdict = ("exceeds the machine: not sustainable whatever the rest costs" if need > cores
                   else f"leaves {cores - need:.2f} CPU s/s for everything else")
        print(f"  at {rate} messages/s: F x rate = {need:.2f} CPU s/s of {cores} cores "
              f"({need / cores:.0%}); {verdict}")
    print(f"  the highest rate these pieces alone allow on {cores} cores: {cores * 1000 / f_ms:.0f} messages/s")
    fn_ms = statistics.median(sum(v for k, v in r[0].items() if k.startswith("full node")) for r in rows) / 1000
    print(f"  the full node's own pieces: {fn_ms:.2f} ms per message, so one full-node process (CPython "
          f"runs one thread of Python at a time: one core) takes at most {1000 / fn_ms:.0f} messages/s, "
          f"before its HTTP layer (aiohttp), chain follower, status hub and event loop")
    from result_file import write_result
    write_result("remp_floor", {**{f"{name}, us per message": statistics.median(r[0][name] for r in rows)
                                   for name in names},
                                "floor_per_message_ms": f_ms, "max_messages_per_s_all_cores": cores * 1000 / f_ms,
                                "fullnode_per_message_ms": fn_ms, "max_messages_per_s_one_fullnode": 1000 / fn_ms})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=400, help="messages per full-node round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (the median is printed)")
    ap.add_argument("--n", type=int, default=2000, help="repetitions of each unit measurement")
    args = ap.parse_args()
    use_event_loop("auto")       # as remp-node's default --event-loop
    asyncio.run(amain(args))


if __name__ == "__main__":
    main()
