"""Erasure coding speed of marlin_cluster.coding against pyeclib's raw ECDriver, same run
(target: ours >= 90% of raw).

For each (NUM_CHUNKS, MIN_CHUNKS) the same random 1 MiB blocks are encoded, and decoded
from a random MIN_CHUNKS subset, by (a) a bare pyeclib ECDriver(ec_type="isa_l_rs_cauchy")
with the same k and m and (b) coding.Coder (what the producer and consumer call). The two
are timed back to back on the same block (a sample = --batch calls), in alternating order, so a busy neighbour slows
both of a pair alike; the ratio is the median over pairs of raw time / our time, and the
MiB/s columns are each side's median per-block throughput (best in brackets).

    .venv/bin/python bench/bench_marlin_coding.py [--pairs 200] [--batch 5] [--size 1048576]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

from pyeclib.ec_iface import ECDriver

from marlin_cluster.coding import EC_TYPE, Coder

TARGET = 0.90


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=200, help="timed (raw, ours) pairs per operation and code (default 200)")
    ap.add_argument("--batch", type=int, default=5, help="calls per timed sample (default 5)")
    ap.add_argument("--size", type=int, default=1 << 20, help="block size in bytes (default 1 MiB)")
    args = ap.parse_args()
    rng = random.Random(1)
    blocks = [rng.randbytes(args.size) for _ in range(8)]
    mib = args.size / (1 << 20)
    print(f"{args.pairs} pairs per row, blocks of {args.size} bytes, ec_type {EC_TYPE}")
    print(f"{'n/k':>6} {'op':>6} {'raw MiB/s (best)':>18} {'ours MiB/s (best)':>18} {'ratio':>7}  target >= {TARGET:.0%}")
    worst = 1e9
    figures, baseline, ratios = {}, {}, {}
    pc = time.perf_counter
    for n, k in ((12, 8), (16, 8), (32, 16)):
        ours = Coder(n, k)
        raw = ECDriver(k=k, m=n - k, ec_type=EC_TYPE)
        times = {("encode", "raw"): [], ("encode", "ours"): [], ("decode", "raw"): [], ("decode", "ours"): []}
        for i in range(-50, args.pairs):          # the first 50 pairs warm up and are not kept
            b = blocks[i % len(blocks)]
            frags = raw.encode(b)
            ids = sorted(rng.sample(range(n), k))
            sub_list, sub_map = [frags[j] for j in ids], {j: frags[j] for j in ids}
            calls = {("encode", "raw"): lambda: raw.encode(b), ("encode", "ours"): lambda: ours.encode(b),
                     ("decode", "raw"): lambda: raw.decode(sub_list), ("decode", "ours"): lambda: ours.decode(sub_map)}
            for op in ("encode", "decode"):
                order = ("raw", "ours") if i % 2 == 0 else ("ours", "raw")
                for who in order:
                    f = calls[(op, who)]
                    t0 = pc()
                    for _ in range(args.batch):
                        f()
                    t = (pc() - t0) / args.batch
                    if i >= 0:
                        times[(op, who)].append(t)
        for op in ("encode", "decode"):
            r, a = times[(op, "raw")], times[(op, "ours")]
            ratio = statistics.median(x / y for x, y in zip(r, a))
            worst = min(worst, ratio)
            at = f"{op}@{n}/{k}"
            figures[f"ours_mib_s_{at}"] = mib / statistics.median(a)
            baseline[f"pyeclib_mib_s_{at}"] = mib / statistics.median(r)
            ratios[f"ours/pyeclib_{at}"] = ratio
            print(f"{n:>3}/{k:<2} {op:>6} {mib / statistics.median(r):>9.0f} ({mib / min(r):>6.0f})"
                  f" {mib / statistics.median(a):>9.0f} ({mib / min(a):>6.0f}) {ratio:>7.1%}  "
                  f"{'ok' if ratio >= TARGET else 'BELOW'}")
    print(f"worst ratio {worst:.1%} (target >= {TARGET:.0%}): {'PASS' if worst >= TARGET else 'FAIL'}")
    from result_file import write_result
    write_result("marlin_coding", figures, baseline, {**ratios, "worst": worst})


if __name__ == "__main__":
    main()
