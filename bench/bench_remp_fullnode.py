"""The REMP full node's receipt path in one process (the ceiling one full node puts
on messages/s): CPU per status and statuses/s on one core.

    .venv/bin/python bench/bench_remp_fullnode.py [--messages 400] [--rounds 3] [--profile N]

A real `FullnodeDaemon` (remp_node/daemon/node.py) on a `remp-node init` network of 2 shards x 7
validators, with its real SQLite store in a temp dir, a real Redis stream (an EmbeddedRedis
started here, as tests/conftest.py does) and its real JSON event log (a file). The bench
POSTs `--messages` wallet messages through `daemon.submit`, then every validator of each
message's shard group makes the statuses a message gets (PutIntoQueue, AcceptedByQueue,
IncludedIntoBlock, IncludedIntoAcceptedBlock, Finalized: 5 x 7 = 35 signed receipts per
message) with `receipts.make_signed_receipt`, batched and signed by its own
`delivery.ReceiptSender` as a validator daemon does (built before the clock starts). The
packets are then fed to the daemon's datagram entry point (`_on_payload`, what the UDP
endpoint calls) in bursts of 10 ms of a 100 msg/s schedule with the event loop running
between bursts (the daemon's steps: store commit, acks; the Redis writer), until every
status is stored and appended to the stream.

Prints per round: statuses, receipt packets, the process's CPU (user + system) per status,
statuses per CPU second (one core) and the messages/s that makes at 35 statuses each, Redis
server CPU per status, and the same-run baselines: one packet's ed25519 verify + decode
(delivery.decode_batch) and one event-log line (EventLog.emit_attrs of a status line).
--profile N: cProfile (CPU clock) of one more round, the top N functions by own time.
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
from aiohttp import web  # noqa: E402

from daemon_runtime.eventlog import EventLog  # noqa: E402
from daemon_runtime.lifecycle import use_event_loop  # noqa: E402
from daemon_runtime.redis_server import EmbeddedRedis  # noqa: E402
from remp_node.core.delivery import ReceiptReceiver, ReceiptSender, decode_batch, unwrap  # noqa: E402
from remp_node.events import REMP_EVENTS  # noqa: E402
from remp_node.wire.keys import NodeKey, verify  # noqa: E402
from remp_node.testnet.localnet import LocalNet  # noqa: E402
from remp_node.daemon.netfiles import load_key  # noqa: E402
from remp_node.daemon.node import FullnodeDaemon, build_fullnode_parser  # noqa: E402
from remp_node.wire.receipts import Accepted, Level, New, make_signed_receipt  # noqa: E402
from remp_node.core.state import make_wallet_message  # noqa: E402
from remp_node.wire.tl import BlockIdExt  # noqa: E402

#: the statuses every validator of the group sends for a finalized message, in order
STATUSES_PER_VALIDATOR = 5
RATE = 100          # messages/s of the schedule the receipts follow (fake time)
TICK = 0.01         # seconds of that schedule per burst fed to the daemon


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process `pid` (psutil)."""
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def build_packets(net, fullnode: NodeKey, groups: dict[bytes, list[bytes]], mids: list[tuple[bytes, int]],
                  t0: float) -> list[tuple[float, bytes, bytes]]:
    """[(fake time, validator key id, receipt packet payload)] for every status of every
    message, as the group's validators' ReceiptSenders batch them: message i is submitted at
    t0 + i / RATE and its k-th status is made 0.1 + 0.25 * k s later by each member (a few
    ms apart). Acks come from a ReceiptReceiver of the full node's key at once, so no packet
    is resent."""
    keys = {n.public_key: load_key(net.root / n.key_file) for n in net.nodes if n.role == "validator"}
    senders = {pk: ReceiptSender(k, stream=1) for pk, k in keys.items()}
    acker = ReceiptReceiver(fullnode, list(keys))
    items = []
    for i, (mid, shard) in enumerate(mids):
        block = BlockIdExt(0, shard, 10 + i // 13, hashlib.sha256(b"r%d" % i).digest(),
                           hashlib.sha256(b"f%d" % i).digest())
        master = BlockIdExt(-1, 0x8000000000000000, 5 + i // 40, hashlib.sha256(b"m%d" % i).digest(),
                            hashlib.sha256(b"n%d" % i).digest())
        statuses = [New(), Accepted(Level.QUEUE), Accepted(Level.COLLATOR, block),
                    Accepted(Level.SHARDCHAIN, block), Accepted(Level.MASTERCHAIN, block, master)]
        for j, pk in enumerate(groups[shard]):
            for k, st in enumerate(statuses):
                items.append((t0 + i / RATE + 0.1 + 0.25 * k + 0.003 * j, pk, mid, st))
    items.sort(key=lambda x: x[0])
    out = []
    t = t0
    for at, pk, mid, st in items:
        while t + 0.005 < at:      # the validators' steps every 5 ms
            t += 0.005
            out += _drain(senders, acker, fullnode, t)
        senders[pk].add(fullnode.key_id, make_signed_receipt(keys[pk], mid, st, int(at * 1000)), at)
    for _ in range(40):
        t += 0.005
        out += _drain(senders, acker, fullnode, t)
    return out


def _drain(senders, acker, fullnode, t) -> list:
    out = []
    for s in senders.values():
        for dst, p in s.packets_to_send(t):
            out.append((t, s.key.key_id, p))
            acker.receive(s.key.key_id, p, t)
    while acker.next_event() is not None:
        pass
    by_id = {s.key.key_id: s for s in senders.values()}
    for src, ack in acker.packets_to_send(t + 1):
        by_id[src].receive_ack(fullnode.key_id, unwrap(ack), t)
    return out


async def one_round(work: Path, ln: LocalNet, redis: EmbeddedRedis, n_msgs: int, nonce0: int,
                    profile: cProfile.Profile | None) -> dict:
    net = ln.net
    fn = next(n for n in net.nodes if n.role == "fullnode")
    data = work / f"fn-{nonce0}"
    args = build_fullnode_parser().parse_args([
        "--network", str(ln.netdir), "--key", str(ln.netdir / fn.key_file), "--data-dir", str(data),
        "--log", str(work / f"fn-{nonce0}.jsonl"), "--redis", redis.url, "--redis-stream", f"s{nonce0}",
        "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
        # no resend waves to more validators: the messages are answered in fake time, but
        # building the packets takes wall time
        "--resend-interval", "600"])
    data.mkdir()
    d = FullnodeDaemon(args)
    await d.start_io(web.Application())
    await d.hub.start()
    try:
        ws = [w for w in net.wallets() if w["workchain"] == 0]
        wkeys = [NodeKey.from_seed(bytes.fromhex(w["seed"])) for w in ws]
        vu = int(time.time()) + 7200
        mids = []
        submit_cpu = 0.0
        for i in range(n_msgs):
            boc = make_wallet_message(wkeys[i % len(ws)], ws[i % len(ws)]["address"],
                                      ws[(i + 1) % len(ws)]["address"], 1 + i, vu, nonce=nonce0 + i)
            t = time.process_time()
            mid = d.submit(boc)
            submit_cpu += time.process_time() - t
            mids.append((mid, d.client._tracked[mid].shard))
        now = d.now()
        groups = {s: d.follower.client_groups(s, now)[0] for s in {s for _, s in mids}}
        packets = build_packets(net, d.key, groups, mids, 0.0)
        await asyncio.sleep(0.2)
        d.store.commit()
        statuses0 = len(mids) and sum(len(v) for v in d.hub.memory.values())
        appended0 = d.hub.m_appended._value.get()
        r0, c0, w0 = proc_cpu(redis.proc.pid), time.process_time(), time.perf_counter()
        if profile:
            profile.enable()
        i = 0
        tick = TICK
        while i < len(packets):
            while i < len(packets) and packets[i][0] <= tick:
                _, src, p = packets[i]
                d._on_payload(src, p, 0.0)
                i += 1
            tick += TICK
            await asyncio.sleep(0.004)
        want = sum(len(v) for v in d.hub.memory.values())
        while d.hub.m_appended._value.get() - appended0 < want - statuses0 or d.store._rows:
            await asyncio.sleep(0.005)
        if profile:
            profile.disable()
        c1, w1, r1 = time.process_time(), time.perf_counter(), proc_cpu(redis.proc.pid)
        statuses = want - statuses0
        received = d.receiver.stats["receipts"]
        assert received == len(mids) * STATUSES_PER_VALIDATOR * 7, (received, d.receiver.stats)
        stored = d.store.db.execute("SELECT count(*) FROM statuses").fetchone()[0]
        assert stored == want, (stored, want)
        finals = sum(1 for f in d.hub.finals.values() if f["outcome"] == "finalized")
        assert finals == len(mids), finals
        return {"statuses": statuses, "packets": len(packets), "cpu": c1 - c0, "wall": w1 - w0,
                "redis_cpu": r1 - r0, "messages": len(mids), "submit_cpu": submit_cpu}
    finally:
        await d.hub.close()
        await d.close_io()
        d.close_logs()


def baselines(work: Path, net, n: int = 2000) -> dict:
    """Same-run unit costs (us): one receipt packet's ed25519 verify + decode_batch, and
    one remp.fullnode.status event-log line to a file."""
    key = load_key(net.root / next(n for n in net.nodes if n.role == "validator").key_file)
    fnk = NodeKey.from_seed(b"\x07" * 32)
    s = ReceiptSender(key, stream=1)
    for k in range(6):
        s.add(fnk.key_id, make_signed_receipt(key, hashlib.sha256(b"%d" % k).digest(), New(), 1000 + k), 0.0)
    p = s.packets_to_send(1.0)[0][1]
    a = time.process_time()
    for _ in range(n):
        b = decode_batch(unwrap(p))
        verify(key.public, b.signed_part(), b.signature)
    t_verify = (time.process_time() - a) / n * 1e6
    log = EventLog("remp-fullnode", "bench", [REMP_EVENTS], sink=str(work / "baseline.jsonl"))
    attrs = {"kind": "IncludedIntoBlock", "level": 2, "block_seqno": 12, "block_id": "ab" * 32,
             "peer": "01020304", "shard": "4000000000000000"}
    a = time.process_time()
    for _ in range(n):
        log.emit_attrs("remp.fullnode.status", "cd" * 32, "info", attrs)
    t_log = (time.process_time() - a) / n * 1e6
    log.close()
    return {"verify_packet_us": t_verify, "log_line_us": t_log}


async def amain(args) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-remp-fn-"))
    ln = LocalNet(work, shards=2, validators_per_shard=7, genesis_delay=0.0)
    await ln.init()
    print(f"full node receipt path in one process: {args.messages} messages x 35 statuses per round, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; work dir {work}", flush=True)
    rows = []
    with EmbeddedRedis() as redis:
        for r in range(args.rounds + (1 if args.profile else 0)):
            prof = cProfile.Profile(time.process_time) if args.profile and r == args.rounds else None
            res = await one_round(work, ln, redis, args.messages, 1_000_000 * (r + 1), prof)
            base = baselines(work, ln.net)
            res.update(base)
            us = res["cpu"] / res["statuses"] * 1e6
            per = res["statuses"] / res["messages"]
            if prof is None:
                rows.append(res)
            print(f"round {r + 1}{' (profiled)' if prof else ''}: {res['statuses']} statuses "
                  f"({res['packets']} packets, {res['statuses'] / res['packets']:.1f} per packet) in "
                  f"{res['wall']:.2f} s wall, {res['cpu']:.2f} CPU s: {us:.1f} us per status, "
                  f"{1e6 / us:,.0f} statuses/s on one core = {1e6 / us / per:,.0f} messages/s "
                  f"({per:.1f} statuses per message); "
                  f"redis-server {res['redis_cpu'] / res['statuses'] * 1e6:.1f} us per status; baselines: "
                  f"packet verify + decode {base['verify_packet_us']:.1f} us, one log line "
                  f"{base['log_line_us']:.1f} us (status = {us / base['log_line_us']:.1f} log lines)",
                  flush=True)
            if prof is not None:
                pstats.Stats(prof).sort_stats(args.sort).print_stats(args.profile)
    if not rows:
        return
    us = [r["cpu"] / r["statuses"] * 1e6 for r in rows]
    ratio = [r["cpu"] / r["statuses"] * 1e6 / r["log_line_us"] for r in rows]
    per_msg = [r["cpu"] / r["messages"] * 1e3 for r in rows]
    print(f"median over {len(rows)} rounds: {statistics.median(us):.1f} us per status "
          f"({statistics.median(ratio):.1f} log lines), {1e6 / statistics.median(us):,.0f} statuses/s; "
          f"{statistics.median(per_msg):.2f} ms per message = {1e3 / statistics.median(per_msg):,.0f} "
          f"messages/s on one core (the full node's ceiling for this path)")
    from result_file import write_result
    write_result("remp_fullnode", {
        "us_per_status_median": statistics.median(us), "us_per_status_min": min(us), "us_per_status_max": max(us),
        "statuses_per_s_one_core": 1e6 / statistics.median(us),
        "ms_per_message": statistics.median(per_msg), "messages_per_s_one_core": 1e3 / statistics.median(per_msg),
        "redis_server_us_per_status": statistics.median(r["redis_cpu"] / r["statuses"] * 1e6 for r in rows)},
        {"verify_packet_us": statistics.median(r["verify_packet_us"] for r in rows),
         "log_line_us": statistics.median(r["log_line_us"] for r in rows)},
        {"status/log_line": statistics.median(ratio)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=400, help="messages per round (35 statuses each)")
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds (each a fresh daemon and store)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="one more round under cProfile (CPU clock): print the top N functions")
    ap.add_argument("--sort", default="tottime", choices=("tottime", "cumulative"),
                    help="--profile's order: own time (default) or with callees")
    args = ap.parse_args()
    use_event_loop("auto")       # as remp-node's default --event-loop
    asyncio.run(amain(args))


if __name__ == "__main__":
    main()
