"""REMP as processes under load: 2 shards x 7 validators + K full nodes (default 1)
(`remp-node` over the authenticated UDP transport, receipts through delivery.py), external
wallet messages POSTed at fixed rates, spread over the K full nodes by
remp_node.api.submit.Submitter (round robin; a refusal or a full node down sends the message
to the next one).

    .venv/bin/python bench/bench_remp_daemon.py [--rates 100,300] [--duration 60] [--fullnodes K]
        [--shards 2] [--validators-per-shard 7] [--block-interval 0.25] [--drain 60] [--redis]
        [--overload 3 [--sustained R] [--overload-duration 30]] [--pending-seconds 1.5] [--pending-floor N]

Per process and rate: CPU per message it handled (a full node: the messages it accepted; a
validator: the messages it logged a status for), the rate at which that process would
saturate one core (1 s / its CPU per message), and the share of the network's messages it
handled. The network's projected ceiling is, per role, the lowest such rate times the
processes of that role that share the load (network messages / messages it handled: K for
full nodes, the shard groups for validators), and over the roles the lowest of those.

Per rate: first receipt (the first PutIntoQueue the full node gets, after submit) p50/p99,
Finalized (the full node's own Finalized status) p50/p99, messages lost (no final outcome
after the drain, or not finalized), payloads and bytes per message by kind, summed over every
node (client_message = full node -> validators, receipt_batch / receipt_ack = delivery, rmq =
catchain, shard / master / announce = consensus) and transport datagrams per message (parts
of 1,232 bytes). Then the highest rate sustained with nothing lost, and the same-run baseline
of a raw asyncio UDP request/response (bench/bench_remp_udp.py `run("raw", 200, ...)`).

--overload F: after the rates, an overload run: F x the rate the network sustains (--sustained
R, or else the highest of this run's --rates that was sustained, or else the highest rate's
accepted messages per second of sending) for --overload-duration s, each message POSTed once
(documented HTTP API, round robin over the full nodes, no retry): every message must be
either accepted (202) and then finalized, or refused at once (503 with Retry-After). Prints
the accepted messages' first receipt p50/p99 (target p99 <= 200 ms) and Finalized p50/p99
(target p99 <= 3 s), accepted lost (target 0), refusals by reason and their answer time
p99 and Retry-After range, and the full nodes' remp_api_refused_total by reason.

Targets: first receipt p50 <= 50 ms, p99 <= 200 ms at 100/s; Finalized p50 <= 3 block
intervals + 0.5 s; >= 300/s with 0 lost; client + catchain payloads per message <= 2N + 3
(N = validators per shard group) in steady state. Latencies come from the full node's
event log (remp.fullnode.received / .status / .final timestamps, one clock).
"""
from __future__ import annotations

import argparse
import asyncio
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
from remp_node.wire.keys import NodeKey  # noqa: E402
from remp_node.testnet.localnet import LocalNet  # noqa: E402
from remp_node.core.state import make_wallet_message  # noqa: E402
from remp_node.api.submit import Placed, Submitter  # noqa: E402


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


def handled(ln: LocalNet, since: float) -> dict[str, int]:
    """Per process, the distinct messages it handled since `since` (Unix s): a full node the
    ones it accepted (remp.fullnode.received), a validator the ones it logged a status for
    (remp.validator.status); read from the event logs (only the matching lines are parsed)."""
    import json
    out = {}
    for label in ln.daemons:
        needle = '"remp.fullnode.received"' if label.startswith("fullnode") else '"remp.validator.status"'
        ids = set()
        for suffix in ("", ".1", ".2"):
            p = Path(str(ln.logdir / f"{label}.jsonl") + suffix)
            if not p.exists():
                continue
            with p.open(errors="replace") as fh:
                for line in fh:
                    if needle not in line:
                        continue
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue
                    if e.get("trace_id") and ts(e) >= since:
                        ids.add(e["trace_id"])
        out[label] = len(ids)
    return out


def latencies(ln: LocalNet, ids: list[str]) -> tuple[list[float], list[float]]:
    """For the messages `ids` (hex), from the full nodes' event logs (one clock): first
    receipt latency in ms (remp.fullnode.received -> the first PutIntoQueue status) and
    Finalized latency in s (received -> the full node's own Finalized status)."""
    received, first, fin = {}, {}, {}
    for f in ln.fullnode_labels():
        own = ln.net.node(f).key_id[:4].hex()
        for e in ln.events(f):
            if e["event"] == "remp.fullnode.received":
                received.setdefault(e["trace_id"], ts(e))
            if e["event"] != "remp.fullnode.status":
                continue
            k = e["attrs"].get("kind")
            if k == "PutIntoQueue" and e["trace_id"] not in first:
                first[e["trace_id"]] = ts(e)
            elif k == "Finalized" and e["attrs"].get("peer") == own:
                fin.setdefault(e["trace_id"], ts(e))
    lat_first = [(first[m] - received[m]) * 1000 for m in ids if m in first and m in received]
    lat_fin = [(fin[m] - received[m]) for m in ids if m in fin and m in received]
    return lat_first, lat_fin


async def refused_metric(s: aiohttp.ClientSession, ln: LocalNet) -> Counter:
    """remp_api_refused_total by reason, summed over the full nodes (/metrics)."""
    out = Counter()
    for label in ln.fullnode_labels():
        async with s.get(ln.http(label) + "/metrics") as r:
            text = await r.text()
        for line in text.splitlines():
            if line.startswith("remp_api_refused_total{"):
                out[line.split('reason="')[1].split('"')[0]] += float(line.split()[-1])
    return out


async def overload_phase(s, ln, net, rate: int, duration: float, drain: float, nonce0: int) -> dict:
    """Offer `rate` msg/s for `duration` s, each message POSTed ONCE to the next full node
    (round robin; the documented HTTP API: body = base64 BOC): 202 = accepted, 503 =
    refused (reason from the body, delay from Retry-After), anything else or no answer =
    an error. Then wait up to `drain` s for every accepted message to be final."""
    import base64
    bocs = transfers(net, int(rate * duration), nonce0)
    ref0 = await refused_metric(s, ln)
    c0 = cpu_s(ln)
    ids: list[str] = []
    refused, errors = Counter(), Counter()
    answer_ms: dict[str, list[float]] = {"accepted": [], "refused": []}
    retry_after: list[float] = []
    apis = ln.apis
    t0 = time.monotonic()

    async def one(i: int, boc: bytes) -> None:
        url = apis[i % len(apis)] + "/messages"
        a = time.monotonic()
        try:
            async with s.post(url, data=base64.b64encode(boc)) as r:
                status, hdr = r.status, r.headers.get("Retry-After")
                doc = await r.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            errors[type(exc).__name__] += 1
            return
        ms = (time.monotonic() - a) * 1000
        if status == 202:
            ids.append(doc["message_id"])
            answer_ms["accepted"].append(ms)
        elif status == 503:
            refused[str(doc.get("reason"))] += 1
            answer_ms["refused"].append(ms)
            if hdr is None or not hdr.strip().isdigit():
                errors["503 without a Retry-After in seconds"] += 1
            else:
                retry_after.append(float(hdr))
        else:
            errors[str(status)] += 1
    tasks = []
    for i, boc in enumerate(bocs):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(i, boc)))
    await asyncio.gather(*tasks)
    send_s = time.monotonic() - t0
    end = time.monotonic() + drain
    finals = {}
    while time.monotonic() < end:
        finals = {e["trace_id"]: e for f in ln.fullnode_labels() for e in ln.events(f, "remp.fullnode.final")}
        if all(m in finals for m in ids):
            break
        await asyncio.sleep(1)
    c1 = cpu_s(ln)
    ref1 = await refused_metric(s, ln)
    lat_first, lat_fin = latencies(ln, ids)
    outcomes = Counter(finals[m]["attrs"]["outcome"] if m in finals else "none" for m in ids)
    return {"rate": rate, "sent": len(bocs), "accepted": len(ids), "refused": dict(refused), "errors": dict(errors),
            "send_s": send_s, "accepted_per_s": len(ids) / max(send_s, 1e-9),
            "first_p50": pct(lat_first, 0.5), "first_p99": pct(lat_first, 0.99), "n_first": len(lat_first),
            "fin_p50": pct(lat_fin, 0.5), "fin_p99": pct(lat_fin, 0.99), "n_fin": len(lat_fin),
            "outcomes": dict(outcomes), "lost": len(ids) - outcomes.get("finalized", 0),
            "refused_answer_p99_ms": pct(answer_ms["refused"], 0.99),
            "accepted_answer_p99_ms": pct(answer_ms["accepted"], 0.99),
            "retry_after_min": min(retry_after, default=float("nan")),
            "retry_after_max": max(retry_after, default=float("nan")),
            "metric_refused": {k: ref1[k] - ref0.get(k, 0) for k in ref1 if ref1[k] - ref0.get(k, 0)},
            "cpu_per_accepted_ms": sum(cpu_delta(c0, c1).values()) / max(1, len(ids)) * 1000}


def report_overload(o: dict, factor: float, sustained_rate: float, src: str) -> None:
    print(f"\noverload: {o['rate']}/s offered ({factor:g} x the sustained {sustained_rate:.0f}/s, {src}) for "
          f"{o['sent'] / o['rate']:.0f} s (sent in {o['send_s']:.1f} s): {o['accepted']} accepted "
          f"({o['accepted_per_s']:.0f}/s), refused {sum(o['refused'].values())} by reason {o['refused']}, "
          f"other answers / errors {o['errors']}")
    print(f"  accepted: first receipt p50 {o['first_p50']:.1f} ms, p99 {o['first_p99']:.1f} ms over {o['n_first']} "
          f"(target p99 <= 200: {'met' if o['first_p99'] <= 200 else 'MISSED'}); Finalized p50 {o['fin_p50']:.2f} s, "
          f"p99 {o['fin_p99']:.2f} s over {o['n_fin']} (target p99 <= 3 s: {'met' if o['fin_p99'] <= 3 else 'MISSED'}); "
          f"outcomes {o['outcomes']}; accepted LOST {o['lost']} (target 0: {'met' if o['lost'] == 0 else 'MISSED'})")
    print(f"  refusals answered in p99 {o['refused_answer_p99_ms']:.1f} ms (202s in p99 "
          f"{o['accepted_answer_p99_ms']:.1f} ms), Retry-After {o['retry_after_min']:g}..{o['retry_after_max']:g} s; "
          f"full nodes' remp_api_refused_total by reason {o['metric_refused']}; CPU per accepted message "
          f"{o['cpu_per_accepted_ms']:.1f} ms (all processes)", flush=True)


async def phase(s, ln, net, rate: int, duration: float, drain: float, nonce0: int) -> dict:
    bocs = transfers(net, int(rate * duration), nonce0)
    n0, b0, d0 = await scrape(s, ln)
    ds0 = await delivery_stats(s, ln)
    c0 = cpu_s(ln)
    ids: list[str] = []
    errors = Counter()
    t0 = time.monotonic()
    wall0 = time.time()
    sub = Submitter(ln.apis, s, max_attempts=5, max_wait=30.0)

    async def one(boc):
        res = await sub.submit(boc)
        if isinstance(res, Placed) and res.status == 202:
            ids.append(res.message_id)
        elif isinstance(res, Placed):
            errors[str(res.status)] += 1
        else:
            errors["unplaced: " + res.last.split(": ", 1)[-1]] += 1
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
    fns = ln.fullnode_labels()
    while time.monotonic() < end:
        finals = {e["trace_id"]: e for f in fns for e in ln.events(f, "remp.fullnode.final")}
        if all(m in finals for m in ids):
            break
        await asyncio.sleep(1)
    done_s = time.monotonic() - t0
    c2 = cpu_s(ln)
    n1, b1, d1 = await scrape(s, ln)
    ds1 = await delivery_stats(s, ln)
    lat_first, lat_fin = latencies(ln, ids)
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
            "cpu_send": cpu_delta(c0, c1), "cpu_all": cpu_delta(c0, c2),
            "handled": handled(ln, wall0), "submitter": sub.report()}


async def amain(args) -> None:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-remp-"))
    ln = LocalNet(work, shards=args.shards, validators_per_shard=args.validators_per_shard, fullnodes=args.fullnodes,
                  mc_catchain_lifetime=args.mc_catchain_lifetime, block_interval=args.block_interval,
                  masterchain_validators=args.masterchain_validators,
                  master_block_interval=args.master_block_interval, start_timeout=180.0, log_level="info",
                  redis_url=args.redis_url,
                  fullnode_args=(["--pending-seconds", str(args.pending_seconds)]
                                 + ([] if args.pending_floor is None else ["--pending-floor", str(args.pending_floor)])))
    net = await ln.init()
    print(f"{len(net.validators())} validators ({args.shards} shards x {args.validators_per_shard}), "
          f"{args.fullnodes} full node(s), "
          f"block interval {args.block_interval} s, {os.cpu_count()} CPUs, full node's Redis stream "
          f"{'on (redis-server CPU not counted)' if args.redis_url else 'off'}; work dir {work}", flush=True)
    await ln.start()
    results = []
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256),
                                         timeout=aiohttp.ClientTimeout(total=30)) as s:
            # warm-up: one message through each full node to Finalized (genesis passed, chains running)
            warm = Submitter(ln.apis, s)
            placed = [await warm.submit(b) for b in transfers(net, len(ln.apis), 10_000_000)]
            await warm.wait_final([p.message_id for p in placed if isinstance(p, Placed) and p.message_id],
                                  time.monotonic() + 120)
            # idle cost: CPU of the whole network carrying no messages (empty rounds, syncs)
            ni0, _, di0 = await scrape(s, ln)
            ci0, ti0 = cpu_s(ln), time.monotonic()
            await asyncio.sleep(args.idle)
            idle_s = time.monotonic() - ti0
            idle_each = cpu_delta(ci0, cpu_s(ln))
            idle = sum(idle_each.values()) / idle_s
            args.idle_each = {k: v / idle_s for k, v in idle_each.items()}
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
                report_ceiling(r, getattr(args, "idle_each", None))
            if args.overload:
                if args.sustained:
                    base, src = float(args.sustained), "--sustained"
                elif any(sustained(r, args) for r in results):
                    base, src = float(max(r["rate"] for r in results if sustained(r, args))), "sustained in this run"
                else:
                    top = max(results, key=lambda r: r["rate"])
                    base = top["accepted"] / max(top["done_s"], 1e-9)
                    src = f"none of the rates sustained: {top['rate']}/s's accepted messages per second until all final"
                rate = max(1, int(round(args.overload * base)))
                args.overload_result = await overload_phase(s, ln, net, rate, args.overload_duration, args.drain, nonce)
                args.overload_result.update(factor=args.overload, base=base, base_src=src)
                report_overload(args.overload_result, args.overload, base, src)
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


def ceilings(r: dict, idle: dict[str, float] | None = None) -> tuple[list[dict], dict[str, dict], float]:
    """Per process: CPU ms per message it handled (cpu_all / handled), the rate at which it
    would saturate one core (1000 / that, msg/s), share = network messages / messages it
    handled; per role ("fullnode", "validator"): the lowest rate, the processes sharing the
    load (that process's share) and their product, the role's projected ceiling; and the
    network's projected ceiling (the lowest role ceiling, msg/s).
    idle: {process: CPU s per s it used carrying no messages} (the idle phase): then the
    same from the CPU above idle (the process's cost per message once its fixed cost per
    second, empty rounds and syncs, is paid): ms_above_idle = (cpu_all - idle x done_s) /
    handled and saturates_above_idle = (1 s - idle) / ms_above_idle, and per role
    ceiling_above_idle (rows and roles get these keys; `net` stays the plain projection)."""
    total = max(1, r["accepted"])
    rows = []
    for label, cpu in sorted(r["cpu_all"].items()):
        n = r["handled"].get(label, 0)
        if n <= 0 or cpu <= 0:
            continue
        ms = cpu / n * 1000
        row = {"process": label, "role": "fullnode" if label.startswith("fullnode") else "validator",
               "handled": n, "cpu_ms_per_message": ms, "saturates_at": 1000 / ms, "share": total / n}
        if idle is not None and label in idle:
            above = max(1e-9, cpu - idle[label] * r["done_s"]) / n * 1000
            row["ms_above_idle"] = above
            row["saturates_above_idle"] = max(0.0, 1.0 - idle[label]) * 1000 / above
        rows.append(row)
    roles = {}
    for role in ("fullnode", "validator"):
        rs = [x for x in rows if x["role"] == role]
        if rs:
            low = min(rs, key=lambda x: x["saturates_at"])
            roles[role] = {"process": low["process"], "saturates_at": low["saturates_at"], "sharing": low["share"],
                           "ceiling": low["saturates_at"] * low["share"]}
            ra = [x for x in rs if "saturates_above_idle" in x]
            if ra:
                lo = min(ra, key=lambda x: x["saturates_above_idle"])
                roles[role]["ceiling_above_idle"] = lo["saturates_above_idle"] * lo["share"]
    net = min((v["ceiling"] for v in roles.values()), default=float("nan"))
    return rows, roles, net


def report_ceiling(r: dict, idle: dict[str, float] | None = None) -> None:
    rows, roles, net = ceilings(r, idle)
    print("  per process (CPU until all final / messages it handled): " + "; ".join(
        f"{x['process']} {x['cpu_ms_per_message']:.2f} ms/msg -> one core at {x['saturates_at']:.0f}/s "
        f"(handled {x['handled']}, 1/{x['share']:.2f} of the messages)" for x in rows))
    for role, v in roles.items():
        print(f"  {role}s: lowest {v['saturates_at']:.0f} msg/s ({v['process']}) x {v['sharing']:.2f} processes "
              f"sharing the load = {v['ceiling']:.0f} msg/s")
    print(f"  network's projected ceiling: {net:.0f} msg/s (the lowest role); submitter {r['submitter']}",
          flush=True)
    if any("ms_above_idle" in x for x in rows):
        print("  above idle (CPU minus the process's idle CPU per s x the run's seconds): " + "; ".join(
            f"{x['process']} {x['ms_above_idle']:.2f} ms/msg" for x in rows if "ms_above_idle" in x))
        print("  projected ceilings above idle: " + ", ".join(
            f"{role}s {v['ceiling_above_idle']:.0f} msg/s" for role, v in roles.items() if "ceiling_above_idle" in v)
            + f"; network {min(v.get('ceiling_above_idle', float('inf')) for v in roles.values()):.0f} msg/s",
            flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="100,300", help="message rates (per second), comma separated")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of sending per rate")
    ap.add_argument("--drain", type=float, default=90.0, help="seconds to wait for final outcomes per rate")
    ap.add_argument("--fullnodes", type=int, default=1, metavar="K",
                    help="full nodes the load is spread over (remp_node.api.submit.Submitter; default 1)")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--validators-per-shard", type=int, default=7)
    ap.add_argument("--block-interval", type=float, default=0.25)
    ap.add_argument("--master-block-interval", type=float, default=0.4)
    ap.add_argument("--masterchain-validators", type=int, default=None, metavar="N",
                    help="the first N validators also validate the masterchain (default: all)")
    ap.add_argument("--mc-catchain-lifetime", type=float, default=60.0)
    ap.add_argument("--idle", type=float, default=5.0, help="seconds of idle CPU measurement before the rates")
    ap.add_argument("--overload", type=float, default=0.0, metavar="F",
                    help="after the rates, offer F x the sustained rate for --overload-duration s (module doc)")
    ap.add_argument("--sustained", type=float, default=None, metavar="R",
                    help="the sustained rate --overload multiplies (default: measured in this run)")
    ap.add_argument("--overload-duration", type=float, default=30.0)
    ap.add_argument("--pending-seconds", type=float, default=1.5, metavar="S",
                    help="the full nodes' --pending-seconds (their pending bound follows capacity; "
                         "0 = only --max-pending; default here 1.5)")
    ap.add_argument("--pending-floor", type=int, default=None, metavar="N",
                    help="the full nodes' --pending-floor (default: theirs); a network whose capacity x "
                         "--pending-seconds is below the floor queues floor / capacity s behind it")
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
        rows, roles, net = ceilings(r, getattr(args, "idle_each", None))
        figures[f"projected_ceiling_msg_per_s{at}"] = net
        for role, v in roles.items():
            figures[f"ceiling_{role}_msg_per_s{at}"] = v["ceiling"]
            if "ceiling_above_idle" in v:
                figures[f"ceiling_above_idle_{role}_msg_per_s{at}"] = v["ceiling_above_idle"]
        if all("ceiling_above_idle" in v for v in roles.values()) and roles:
            figures[f"projected_ceiling_above_idle_msg_per_s{at}"] = min(v["ceiling_above_idle"]
                                                                         for v in roles.values())
        for x in rows:
            figures[f"cpu_ms_per_message_{x['process']}{at}"] = x["cpu_ms_per_message"]
            if "ms_above_idle" in x:
                figures[f"cpu_ms_above_idle_{x['process']}{at}"] = x["ms_above_idle"]
    figures["fullnodes"] = args.fullnodes
    o = getattr(args, "overload_result", None)
    if o:
        figures.update({
            "overload_factor": o["factor"], "overload_base_rate": o["base"], "overload_offered_per_s": o["rate"],
            "overload_sent": o["sent"], "overload_accepted": o["accepted"],
            "overload_accepted_per_s": o["accepted_per_s"], "overload_refused": sum(o["refused"].values()),
            "overload_errors": sum(o["errors"].values()), "overload_accepted_lost": o["lost"],
            "overload_first_receipt_p50_ms": o["first_p50"], "overload_first_receipt_p99_ms": o["first_p99"],
            "overload_finalized_p50_s": o["fin_p50"], "overload_finalized_p99_s": o["fin_p99"],
            "overload_refusal_answer_p99_ms": o["refused_answer_p99_ms"],
            "overload_retry_after_max_s": o["retry_after_max"]})
        for reason, n in o["refused"].items():
            figures[f"overload_refused_{reason}"] = n
    write_result("remp_daemon", figures,
                 {"udp_round_trip_p50_ms": raw["p50"], "udp_round_trip_p99_ms": raw["p99"]} if raw else None)


if __name__ == "__main__":
    main()
