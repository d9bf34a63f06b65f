"""REMP as processes under load: 2 shards x 7 validators + one full node
(`remp-node` over the authenticated UDP transport, receipts through delivery.py), external
wallet messages POSTed at fixed rates.

    .venv/bin/python bench/bench_remp_daemon.py [--rates 100,300] [--duration 60]
        [--shards 2] [--validators-per-shard 7] [--block-interval 0.25] [--drain 60] [--redis]

Per rate: first receipt (the first PutIntoQueue the full node gets, after submit) p50/p99,
Finalized (the full node's own Finalized status) p50/p99, messages lost (no final outcome
after the drain, or not finalized), payloads and bytes per message by kind, summed over every
node (client_message = full node -> validators, receipt_batch / receipt_ack = delivery, rmq =
catchain, shard / master / announce = consensus) and transport datagrams per message (parts
of 1,232 bytes). Then the highest rate sustained with nothing lost, and the same-run baseline
of a raw asyncio UDP request/response (bench/bench_remp_udp.py `run("raw", 200, ...)`).

Targets (issue): first receipt p50 <= 50 ms, p99 <= 200 ms at 100/s; Finalized p50 <= 3 block
intervals + 0.5 s; >= 300/s with 0 lost; client + catchain payloads per message <= 2N + 3
(N = validators per shard group) in steady state. Latencies come from the full node's
event log (remp.fullnode.received / .status / .final timestamps, one clock).
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp  # noqa: E402
import psutil  # noqa: E402

from daemon_runtime.redis_server import EmbeddedRedis  # noqa: E402
from remp_node.keys import NodeKey  # noqa: E402
from remp_node.localnet import LocalNet  # noqa: E402
from remp_node.state import make_wallet_message  # noqa: E402


def ts(e: dict) -> float:
    return datetime.fromisoformat(e["ts"].replace("Z", "+00:00")).timestamp()


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


async def scrape(s: aiohttp.ClientSession, ln: LocalNet) -> tuple[Counter, Counter, int]:
    """Summed over all nodes: payloads out by kind, bytes out by kind, transport datagrams out."""
    n, b, dg = Counter(), Counter(), 0
    for label in ln.daemons:
        async with s.get(ln.http(label) + "/metrics") as r:
            text = await r.text()
        for line in text.splitlines():
            if line.startswith("remp_datagrams_total{") and 'direction="out"' in line:
                kind = line.split('channel="')[1].split('"')[0]
                n[kind] += float(line.split()[-1])
            elif line.startswith("remp_datagram_bytes_total{") and 'direction="out"' in line:
                kind = line.split('channel="')[1].split('"')[0]
                b[kind] += float(line.split()[-1])
            elif line.startswith('remp_transport{name="sent_datagrams"}'):
                dg += float(line.split()[-1])
    return n, b, int(dg)


async def delivery_stats(s: aiohttp.ClientSession, ln: LocalNet) -> Counter:
    """Summed over the validators: their ReceiptSender stats (/health "delivery": added =
    receipts, packets = receipt packets sent once, resends)."""
    out = Counter()
    for label in ln.daemons:
        if label.startswith("fullnode"):
            continue
        try:
            async with s.get(ln.http(label) + "/health") as r:
                out.update((await r.json()).get("delivery") or {})
        except (aiohttp.ClientError, ValueError, asyncio.TimeoutError):
            pass
    return out


def cpu_s(ln: LocalNet) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each daemon process (psutil)."""
    out = {}
    for label, d in ln.daemons.items():
        if d.proc is None:
            continue
        try:
            t = psutil.Process(d.proc.pid).cpu_times()
            out[label] = t.user + t.system
        except psutil.Error:
            pass
    return out


def cpu_delta(a: dict, b: dict) -> dict[str, float]:
    return {k: b[k] - a.get(k, 0.0) for k in b}


def transfers(net, count: int, nonce0: int) -> list[bytes]:
    ws = [w for w in net.wallets() if w["workchain"] == 0]
    keys = [NodeKey.from_seed(bytes.fromhex(w["seed"])) for w in ws]
    vu = int(time.time()) + 7200
    return [make_wallet_message(keys[i % len(ws)], ws[i % len(ws)]["address"], ws[(i + 1) % len(ws)]["address"],
                                1 + i % 1000, vu, nonce=nonce0 + i) for i in range(count)]


async def phase(s, ln, net, rate: int, duration: float, drain: float, nonce0: int) -> dict:
    bocs = transfers(net, int(rate * duration), nonce0)
    n0, b0, d0 = await scrape(s, ln)
    ds0 = await delivery_stats(s, ln)
    c0 = cpu_s(ln)
    ids: list[str] = []
    errors = Counter()
    t0 = time.monotonic()

    async def one(boc):
        try:
            async with s.post(ln.api + "/messages", data=base64.b64encode(boc)) as r:
                d = await r.json()
                if r.status == 202:
                    ids.append(d["message_id"])
                else:
                    errors[str(r.status)] += 1
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            errors[type(exc).__name__] += 1
    tasks = []
    for i, boc in enumerate(bocs):
        due = t0 + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(boc)))
    await asyncio.gather(*tasks)
    sent_for = time.monotonic() - t0
    c1 = cpu_s(ln)
    # drain: wait until every message is final (or the drain deadline)
    end = time.monotonic() + drain
    finals = {}
    while time.monotonic() < end:
        finals = {e["trace_id"]: e for e in ln.events("fullnode1", "remp.fullnode.final")}
        if all(m in finals for m in ids):
            break
        await asyncio.sleep(1)
    done_s = time.monotonic() - t0
    c2 = cpu_s(ln)
    n1, b1, d1 = await scrape(s, ln)
    ds1 = await delivery_stats(s, ln)
    ev = ln.events("fullnode1")
    received = {e["trace_id"]: ts(e) for e in ev if e["event"] == "remp.fullnode.received"}
    first, fin = {}, {}
    for e in ev:
        if e["event"] != "remp.fullnode.status":
            continue
        k = e["attrs"].get("kind")
        if k == "PutIntoQueue" and e["trace_id"] not in first:
            first[e["trace_id"]] = ts(e)
        elif k == "Finalized" and e["attrs"].get("peer") == ln.net.node("fullnode1").key_id[:4].hex():
            fin.setdefault(e["trace_id"], ts(e))
    lat_first = [(first[m] - received[m]) * 1000 for m in ids if m in first and m in received]
    lat_fin = [(fin[m] - received[m]) for m in ids if m in fin and m in received]
    outcomes = Counter(finals[m]["attrs"]["outcome"] if m in finals else "none" for m in ids)
    lost = len(ids) - outcomes.get("finalized", 0) + sum(errors.values())
    per = max(1, len(ids))
    dn = {k: (n1[k] - n0.get(k, 0)) / per for k in n1}
    db = {k: (b1[k] - b0.get(k, 0)) / per for k in b1}
    return {"rate": rate, "sent": len(bocs), "accepted": len(ids), "errors": dict(errors), "send_s": sent_for,
            "first_p50": pct(lat_first, 0.5), "first_p99": pct(lat_first, 0.99), "n_first": len(lat_first),
            "fin_p50": pct(lat_fin, 0.5), "fin_p99": pct(lat_fin, 0.99), "n_fin": len(lat_fin),
            "outcomes": dict(outcomes), "lost": lost, "payloads": dn, "bytes": db,
            "datagrams": (d1 - d0) / per, "done_s": done_s,
            "delivery": {k: (ds1[k] - ds0.get(k, 0)) / per for k in ("added", "packets", "resends")},
            "cpu_send": cpu_delta(c0, c1), "cpu_all": cpu_delta(c0, c2)}


async def amain(args) -> None:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-remp-"))
    ln = LocalNet(work, shards=args.shards, validators_per_shard=args.validators_per_shard,
                  mc_catchain_lifetime=args.mc_catchain_lifetime, block_interval=args.block_interval,
                  masterchain_validators=args.masterchain_validators,
                  master_block_interval=args.master_block_interval, start_timeout=180.0, log_level="info",
                  redis_url=args.redis_url)
    net = await ln.init()
    print(f"{len(net.validators())} validators ({args.shards} shards x {args.validators_per_shard}), "
          f"block interval {args.block_interval} s, {os.cpu_count()} CPUs, full node's Redis stream "
          f"{'on (redis-server CPU not counted)' if args.redis_url else 'off'}; work dir {work}", flush=True)
    await ln.start()
    results = []
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64),
                                         timeout=aiohttp.ClientTimeout(total=30)) as s:
            # warm-up: one message through to Finalized (genesis passed, chains running)
            boc = transfers(net, 1, 10_000_000)[0]
            async with s.post(ln.api + "/messages", data=base64.b64encode(boc)) as r:
                mid = (await r.json())["message_id"]
            end = time.monotonic() + 120
            while time.monotonic() < end:
                async with s.get(f"{ln.api}/messages/{mid}") as r:
                    if (await r.json())["outcome"]["final"]:
                        break
                await asyncio.sleep(1)
            # idle cost: CPU of the whole network carrying no messages (empty rounds, syncs)
            ni0, _, di0 = await scrape(s, ln)
            ci0, ti0 = cpu_s(ln), time.monotonic()
            await asyncio.sleep(args.idle)
            idle_s = time.monotonic() - ti0
            idle = sum(cpu_delta(ci0, cpu_s(ln)).values()) / idle_s
            ni1, _, di1 = await scrape(s, ln)
            kinds = sorted(ni1, key=lambda k: -(ni1[k] - ni0.get(k, 0)))
            print(f"idle: {idle:.3f} CPU s per s summed over {len(ln.daemons)} processes "
                  f"(load average {open('/proc/loadavg').read().split()[0]}); payloads per s: "
                  + ", ".join(f"{k} {(ni1[k] - ni0.get(k, 0)) / idle_s:.0f}" for k in kinds)
                  + f"; datagrams per s {(di1 - di0) / idle_s:.0f}", flush=True)
            args.idle_rate = idle
            nonce = 0
            for rate in args.rates:
                r = await phase(s, ln, net, rate, args.duration, args.drain, nonce)
                nonce += int(rate * args.duration) + 1
                results.append(r)
                report(r, args)
    finally:
        await ln.stop()
    ok = [r["rate"] for r in results if sustained(r, args)]
    print(f"highest rate sustained with 0 lost: {max(ok) if ok else 'none'} msg/s "
          f"(target >= 300: {'met' if ok and max(ok) >= 300 else 'MISSED'}; sustained = 0 lost, sent at the "
          f"offered rate (within 10%) and all final within 3 x the Finalized target after sending ended)")
    return results


def sustained(r: dict, args) -> bool:
    """Whether the network kept up with rate r["rate"]: nothing lost, the POSTs went out at
    the offered rate (send_s <= 1.1 x duration: a saturated full node slows the sender) and
    the backlog cleared soon after sending stopped (done_s <= send_s + 3 x (3 block intervals
    + 0.5 s)). A burst that only queues and drains long after (first receipt p50 of seconds)
    loses nothing but is not sustained."""
    tgtf = 3 * args.block_interval + 0.5
    return (r["lost"] == 0 and r["send_s"] <= 1.1 * args.duration
            and r["done_s"] <= r["send_s"] + 3 * tgtf)


def baseline(results: list[dict]) -> dict:
    """The same-run baseline: bench_remp_udp.run("raw", 200) (its own event loop and process)."""
    try:
        from bench.bench_remp_udp import run as udp_run
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_remp_udp import run as udp_run
    raw = udp_run("raw", 200, SimpleNamespace(requests=500, seconds=2.0, window=16))
    print(f"baseline, same run: raw asyncio UDP request/response (200 B) p50 {raw['p50']:.3f} ms, "
          f"p99 {raw['p99']:.3f} ms, {raw['rate']:.0f} round trips/s")
    for r in results:
        if r["first_p50"] == r["first_p50"]:
            print(f"  at {r['rate']}/s: first receipt p50 = {r['first_p50'] / raw['p50']:.0f} x the raw UDP round trip")
    return raw


def report(r: dict, args) -> None:
    n = args.validators_per_shard
    bi = args.block_interval
    print(f"\nrate {r['rate']}/s for {args.duration:.0f} s: {r['accepted']}/{r['sent']} accepted "
          f"(sent in {r['send_s']:.1f} s), outcomes {r['outcomes']}, errors {r['errors']}, LOST {r['lost']} "
          f"(target 0: {'met' if r['lost'] == 0 else 'MISSED'})")
    tgt1 = "met" if r["first_p50"] <= 50 and r["first_p99"] <= 200 else "MISSED"
    print(f"  first receipt (PutIntoQueue): p50 {r['first_p50']:.1f} ms, p99 {r['first_p99']:.1f} ms "
          f"over {r['n_first']} (target p50 <= 50, p99 <= 200 at 100/s: {tgt1})")
    tgtf = 3 * bi + 0.5
    print(f"  Finalized: p50 {r['fin_p50']:.2f} s, p99 {r['fin_p99']:.2f} s over {r['n_fin']} "
          f"(target p50 <= {tgtf:.2f} s: {'met' if r['fin_p50'] <= tgtf else 'MISSED'})")
    kinds = sorted(r["payloads"], key=lambda k: -r["payloads"][k])
    print("  payloads per message by kind: " + ", ".join(f"{k} {r['payloads'][k]:.1f}" for k in kinds))
    print("  bytes per message by kind: " + ", ".join(f"{k} {r['bytes'].get(k, 0):.0f}" for k in kinds))
    cc = r["payloads"].get("client_message", 0) + r["payloads"].get("rmq", 0)
    print(f"  client + catchain payloads per message {cc:.1f} (target <= 2N + 3 = {2 * n + 3}: "
          f"{'met' if cc <= 2 * n + 3 else 'MISSED'}); transport datagrams per message (all kinds) "
          f"{r['datagrams']:.1f}")
    dl = r["delivery"]
    print(f"  receipts per message {dl['added']:.1f} in {dl['packets']:.1f} receipt packets sent once + "
          f"{dl['resends']:.1f} resent (validators' ReceiptSender stats)")
    per = max(1, r["accepted"])
    cs, ca = r["cpu_send"], r["cpu_all"]
    net_all = sum(ca.values()) - args.idle_rate * r["done_s"]
    vals = [v for k, v in ca.items() if not k.startswith("fullnode")]
    fn = sum(v for k, v in ca.items() if k.startswith("fullnode"))
    print(f"  CPU per message, summed over all processes: {sum(cs.values()) / per * 1000:.1f} ms while sending "
          f"({sum(cs.values()) / max(r['send_s'], 1e-9):.2f} CPU s/s), {sum(ca.values()) / per * 1000:.1f} ms until "
          f"all final ({r['done_s']:.1f} s), {net_all / per * 1000:.1f} ms above idle; per validator "
          f"{statistics.mean(vals) / per * 1000 if vals else 0:.1f} ms (max {max(vals, default=0) / per * 1000:.1f}), "
          f"full node {fn / per * 1000:.1f} ms; load average {open('/proc/loadavg').read().split()[0]}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="100,300", help="message rates (per second), comma separated")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of sending per rate")
    ap.add_argument("--drain", type=float, default=90.0, help="seconds to wait for final outcomes per rate")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--validators-per-shard", type=int, default=7)
    ap.add_argument("--block-interval", type=float, default=0.25)
    ap.add_argument("--master-block-interval", type=float, default=0.4)
    ap.add_argument("--masterchain-validators", type=int, default=None, metavar="N",
                    help="the first N validators also validate the masterchain (default: all)")
    ap.add_argument("--mc-catchain-lifetime", type=float, default=60.0)
    ap.add_argument("--idle", type=float, default=5.0, help="seconds of idle CPU measurement before the rates")
    ap.add_argument("--workdir", default=None, help="keep the network, data and logs here")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--redis", action="store_true",
                    help="start a redis-server (EmbeddedRedis) and give the full node its status stream "
                         "(--redis), as deployed; default: no stream")
    args = ap.parse_args()
    args.rates = [int(x) for x in args.rates.split(",")]
    args.redis_url = None
    if args.redis:
        with EmbeddedRedis() as srv:
            args.redis_url = srv.url
            results = asyncio.run(amain(args))
    else:
        results = asyncio.run(amain(args))
    raw = None if args.skip_baseline else baseline(results)
    from result_file import write_result
    figures = {"idle_cpu_s_per_s": getattr(args, "idle_rate", None)}
    for r in results:
        at, per, cs, ca = f"@{r['rate']}/s", max(1, r["accepted"]), r["cpu_send"], r["cpu_all"]
        figures.update({
            f"first_receipt_p50_ms{at}": r["first_p50"], f"first_receipt_p99_ms{at}": r["first_p99"],
            f"finalized_p50_s{at}": r["fin_p50"], f"finalized_p99_s{at}": r["fin_p99"], f"lost{at}": r["lost"],
            f"sustained{at}": sustained(r, args), f"datagrams_per_message{at}": r["datagrams"],
            f"receipt_packets_per_message{at}": r["delivery"]["packets"],
            f"cpu_per_message_sending_ms{at}": sum(cs.values()) / per * 1000,
            f"cpu_per_message_until_final_ms{at}": sum(ca.values()) / per * 1000,
            f"cpu_per_message_fullnode_ms{at}": sum(v for k, v in ca.items() if k.startswith("fullnode")) / per * 1000,
            f"cpu_s_per_s_sending{at}": sum(cs.values()) / max(r["send_s"], 1e-9)})
    write_result("remp_daemon", figures,
                 {"udp_round_trip_p50_ms": raw["p50"], "udp_round_trip_p99_ms": raw["p99"]} if raw else None)


if __name__ == "__main__":
    main()
