"""A burst of valid messages into one REMP network of processes: 1 shard x 4 validators
(all masterchain validators) + one full node on 127.0.0.1, the demo's session length (20 s).
3,000 wallet transfers are POSTed 200 at a time over 10 s; then it waits until every
accepted message is final.

    .venv/bin/python bench/bench_remp_burst.py [--messages 3000]
        [--seconds 10] [--batch 200] [--session 20] [--drain 900] [--receipt-window N]
        [--baseline results.json] [--out bench/results]

Prints: accepted (202), finalized, chain-rejected (rejected by the queue / collator / chain),
timeouts, not final after the drain; receipts dropped (must be 0): receipt packets the full
node refused for buffer space (/health delivery.error_buffer_full) and receipts the
validators abandoned (delivery.receipts_abandoned; packets abandoned_obsolete /
abandoned_overflow); time from the first POST until every message is final (the full
node's remp.fullnode.final events); CPU seconds per message of each process (psutil,
first POST to all final, divided by the accepted messages) and the rate at which that
process would saturate one core (1 / CPU per message).

Writes the figures as one JSON file bench/results/remp_burst-<UTC timestamp>.json with keys
command, commit, date, cores, loadavg, figures, baseline, ratio. baseline: the figures of
--baseline (an earlier result file, e.g. the same run on an older commit), else the
defect report's (3,000 messages on 8ab7959: 2,574 timeouts, error_buffer_full 38,716, all
final only at about +240 s); ratio: figures / baseline for the keys both have.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp  # noqa: E402

from remp_node.wire.keys import NodeKey  # noqa: E402
from remp_node.testnet.localnet import LocalNet  # noqa: E402
from remp_node.core.state import make_wallet_message  # noqa: E402

from bench_remp_daemon import cpu_s  # noqa: E402  (bench/ is sys.path[0] as a script)

ROOT = Path(__file__).resolve().parent.parent

#: the defect report's figures (3,000 messages, 1 x 4, 2-core machine, main 8ab7959)
REPORTED_BASELINE = {"accepted": 3000, "finalized": 426, "timeouts": 2574, "receipt_packets_refused": 38716,
                     "time_all_final_s": 240.0, "source": "defect report, main 8ab7959"}


def transfers(net, count: int) -> list[bytes]:
    ws = [w for w in net.wallets() if w["workchain"] == 0]
    keys = [NodeKey.from_seed(bytes.fromhex(w["seed"])) for w in ws]
    vu = int(time.time()) + 7200
    return [make_wallet_message(keys[i % len(ws)], ws[i % len(ws)]["address"], ws[i % len(ws)]["address"],
                                1 + i % 1000, vu, nonce=100_000 + i) for i in range(count)]


def ts(e: dict) -> float:
    return datetime.fromisoformat(e["ts"].replace("Z", "+00:00")).timestamp()


async def health(s: aiohttp.ClientSession, url: str) -> dict:
    try:
        async with s.get(url + "/health", timeout=aiohttp.ClientTimeout(total=30)) as r:
            return await r.json()
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return {}


async def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="remp-burst-"))
    ln = LocalNet(work, shards=1, validators_per_shard=4, mc_catchain_lifetime=args.session,
                  block_interval=0.2, master_block_interval=0.1, start_timeout=180.0, log_level="info")
    net = await ln.init()
    if args.receipt_window:
        ln.daemons["fullnode1"].argv += ["--receipt-window", str(args.receipt_window)]
    await ln.start()
    try:
        bocs = transfers(net, args.messages)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
            c0 = cpu_s(ln)
            t0_wall, t0 = time.time(), time.monotonic()
            statuses: Counter = Counter()
            ids: list[str] = []

            async def one(boc):
                try:
                    async with s.post(ln.api + "/messages", data=base64.b64encode(boc)) as r:
                        d = await r.json()
                        statuses[r.status] += 1
                        if r.status == 202:
                            ids.append(d["message_id"])
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    statuses[type(exc).__name__] += 1
            n_batches = max(1, (len(bocs) + args.batch - 1) // args.batch)
            for b in range(n_batches):
                due = t0 + b * args.seconds / n_batches
                if due > time.monotonic():
                    await asyncio.sleep(due - time.monotonic())
                await asyncio.gather(*(one(x) for x in bocs[b * args.batch:(b + 1) * args.batch]))
            post_s = time.monotonic() - t0
            # until every accepted message is final (the full node's /health pending == 0)
            end = t0 + args.drain
            while time.monotonic() < end:
                h = await health(s, ln.api)
                if h and h.get("pending", 1) == 0:
                    break
                await asyncio.sleep(2.0)
            c1 = cpu_s(ln)
            await asyncio.sleep(3.0)               # the late statuses, then the counters
            fh = await health(s, ln.api)
            vh = {label: await health(s, ln.http(label)) for label in ln.validators()}
        finals = {e["trace_id"]: e for e in ln.events("fullnode1", "remp.fullnode.final")}
        outcome = Counter()
        last = t0_wall
        for m in ids:
            e = finals.get(m)
            if e is None:
                outcome["not_final"] += 1
                continue
            a = e["attrs"]
            key = {"finalized": "finalized", "timeout": "timeouts"}.get(a["outcome"], "chain_rejected")
            outcome[key] += 1
            last = max(last, ts(e))
        n = max(1, len(ids))
        cpu = {k: c1.get(k, 0.0) - c0.get(k, 0.0) for k in c1}
        per_msg_ms = {k: v / n * 1000 for k, v in sorted(cpu.items())}
        vd = [v.get("delivery", {}) for v in vh.values()]
        figures = {
            "messages": len(bocs), "post_s": round(post_s, 2),
            "http": {str(k): v for k, v in statuses.items()},
            "accepted": len(ids), "finalized": outcome["finalized"], "chain_rejected": outcome["chain_rejected"],
            "timeouts": outcome["timeouts"], "not_final": outcome["not_final"],
            "receipt_packets_refused": fh.get("delivery", {}).get("error_buffer_full"),
            "receipts_abandoned": sum(d.get("receipts_abandoned", 0) for d in vd),
            "receipt_packets_abandoned": sum(d.get("abandoned_obsolete", 0) + d.get("abandoned_overflow", 0)
                                             for d in vd),
            "window_waits": sum(d.get("window_full", 0) for d in vd),
            "time_all_final_s": round(last - t0_wall, 2),
            "cpu_ms_per_message": {k: round(v, 3) for k, v in per_msg_ms.items()},
            "cpu_ms_per_message_all": round(sum(per_msg_ms.values()), 3),
            "saturation_msgs_per_s": {k: round(1000.0 / v, 1) if v > 0 else None for k, v in per_msg_ms.items()},
            "fullnode_client": fh.get("client", {}),
        }
        figures["receipts_dropped"] = (figures["receipts_abandoned"] + figures["receipt_packets_abandoned"]
                                       + (figures["receipt_packets_refused"] or 0))
        return figures
    finally:
        await ln.stop()


def report(f: dict) -> None:
    print(f"messages {f['messages']} POSTed in {f['post_s']} s; HTTP {f['http']}")
    print(f"accepted {f['accepted']}  finalized {f['finalized']}  chain-rejected {f['chain_rejected']}  "
          f"timeouts {f['timeouts']}  not final {f['not_final']}")
    print(f"receipts dropped {f['receipts_dropped']} (packets refused for buffer space "
          f"{f['receipt_packets_refused']}, receipts abandoned by validators {f['receipts_abandoned']}, "
          f"packets abandoned {f['receipt_packets_abandoned']}); validator waits for the window "
          f"{f['window_waits']}")
    print(f"time until all final {f['time_all_final_s']} s")
    print(f"{'process':<12} {'CPU ms/msg':>10} {'saturates 1 core at msg/s':>26}")
    for k, v in f["cpu_ms_per_message"].items():
        print(f"{k:<12} {v:>10.3f} {f['saturation_msgs_per_s'][k] or float('nan'):>26}")
    print(f"{'all':<12} {f['cpu_ms_per_message_all']:>10.3f}")


def flatten(d: dict, prefix: str = "") -> dict:
    """A nested figures dict as the flat name -> value dict result_file takes
    ({"cpu_ms_per_message": {"fullnode": 3.1}} -> {"cpu_ms_per_message.fullnode": 3.1})."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=3000)
    p.add_argument("--seconds", type=float, default=10.0, help="POST every message within this many seconds")
    p.add_argument("--batch", type=int, default=200, help="messages POSTed at once")
    p.add_argument("--session", type=float, default=20.0, help="master session seconds (the demo's 20)")
    p.add_argument("--drain", type=float, default=900.0, help="seconds to wait for every message to be final")
    p.add_argument("--receipt-window", type=int, default=0, help="the full node's --receipt-window (0: default)")
    p.add_argument("--baseline", default=None, help="an earlier result JSON whose figures are the baseline")
    p.add_argument("--out", default=None, help="directory for the JSON result (default: bench/results)")
    args = p.parse_args()
    figures = asyncio.run(run(args))
    report(figures)
    baseline = REPORTED_BASELINE
    if args.baseline:
        baseline = json.loads(Path(args.baseline).read_text())["figures"]
    ratio = {k: round(figures[k] / baseline[k], 4) for k in ("finalized", "timeouts", "time_all_final_s",
                                                             "receipt_packets_refused", "cpu_ms_per_message_all")
             if isinstance(baseline.get(k), (int, float)) and baseline.get(k) and
             isinstance(figures.get(k), (int, float))}
    from result_file import write_result       # bench/ is sys.path[0] when run as a script
    if args.out:
        os.environ["RELAY_BENCH_RESULTS"] = args.out
    write_result("remp_burst", flatten(figures), baseline=flatten(baseline), ratio=ratio)


if __name__ == "__main__":
    main()
