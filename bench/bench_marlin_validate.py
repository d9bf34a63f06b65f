"""Bitcoin block validation at a Marlin consumer: validate.validate_block (CheckBlock's
rules from python-bitcoinlib's primitives, one serialization per transaction) against the
library's own path, CBlock.deserialize + CheckBlock (five passes), same run, same block.

A consumer logs marlin.consumer.block_rebuilt after validation (seed: isValidBlock before
messageReceived), so this time is part of the report's `rebuild` stage (objective
marlin-rebuild-p99): block 413567 (1 MB, 1,557 transactions) is the demo's largest block.
Pairs alternate order; printed: median ms of each side (best in brackets) and the median
over pairs of library time / ours (> 1: ours is faster).

    .venv/bin/python bench/bench_marlin_validate.py [--pairs 20] [--block PATH]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bitcoin.core import CBlock, CheckBlock  # noqa: E402

from marlin_cluster.params import CHANNEL_BTC  # noqa: E402
from marlin_cluster.validate import validate_block  # noqa: E402

DEFAULT_BLOCK = REPO.parent / "shared" / "data" / "btc" / "block413567.raw"


def library(raw: bytes) -> None:
    b = CBlock.deserialize(raw)
    CheckBlock(b, fCheckPoW=True, fCheckMerkleRoot=True, cur_time=b.nTime)


def ours(raw: bytes) -> None:
    validate_block(CHANNEL_BTC, raw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=20, help="timed (library, ours) pairs (default 20)")
    ap.add_argument("--block", type=Path, default=DEFAULT_BLOCK, help="a raw Bitcoin block")
    a = ap.parse_args()
    if not a.block.is_file():
        sys.exit(f"no block at {a.block} (../shared/data absent?); pass --block PATH")
    raw = a.block.read_bytes()
    print(f"block {a.block.name}: {len(raw):,} bytes; load {open('/proc/loadavg').read().split()[:3]}")
    library(raw), ours(raw)                                       # warm-up
    lib_t, our_t, ratios = [], [], []
    for i in range(a.pairs):
        order = (library, ours) if i % 2 == 0 else (ours, library)
        t = {}
        for fn in order:
            t0 = time.perf_counter()
            fn(raw)
            t[fn] = time.perf_counter() - t0
        lib_t.append(t[library] * 1000)
        our_t.append(t[ours] * 1000)
        ratios.append(t[library] / t[ours])
    print(f"deserialize + CheckBlock (python-bitcoinlib): {statistics.median(lib_t):7.1f} ms  (best {min(lib_t):.1f})")
    print(f"validate_block (ours)                       : {statistics.median(our_t):7.1f} ms  (best {min(our_t):.1f})")
    print(f"ratio library/ours, median of {a.pairs} pairs: {statistics.median(ratios):.2f}x  "
          f"(CPU saved per 1 MB block: {statistics.median(lib_t) - statistics.median(our_t):.0f} ms)")
    print(f"load {open('/proc/loadavg').read().split()[:3]}")
    from result_file import write_result
    write_result("marlin_validate", {"validate_block_ms": statistics.median(our_t), "validate_block_best_ms": min(our_t),
                                     "block_bytes": len(raw)},
                 {"bitcoinlib_ms": statistics.median(lib_t), "bitcoinlib_best_ms": min(lib_t)},
                 {"bitcoinlib/ours": statistics.median(ratios)})


if __name__ == "__main__":
    main()
