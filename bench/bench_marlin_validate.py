"""Bitcoin block validation at a Marlin consumer: validate.validate_block (Bitcoin Core's
CheckBlock through libbitcoinkernel, plus the header time) against python-bitcoinlib's own
path, CBlock.deserialize + CheckBlock (pure Python), same run, same block; also the lean
python-bitcoinlib path validate._btc_lib (what witness blocks and refused blocks still go
through) and the erasure decode of the block's chunks, the consumer's other step.

A consumer logs marlin.consumer.block_rebuilt after validation (seed: isValidBlock before
messageReceived), so this time is part of the report's `rebuild` stage (objective
marlin-rebuild-p99): block 413567 (1 MB, 1,557 transactions) is the demo's largest block.
Pairs alternate order; printed: median ms of each side (best in brackets) and the median
over pairs of library time / ours (> 1: ours is faster).

    .venv/bin/python bench/bench_marlin_validate.py [--pairs 20] [--block PATH] [--loop-stall]
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

from marlin_cluster.coding import coder  # noqa: E402
from marlin_cluster.params import CHANNEL_BTC  # noqa: E402
from marlin_cluster.validate import _btc_lib, validate_block  # noqa: E402

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
    ap.add_argument("--loop-stall", action="store_true",
                    help="also measure how long an event loop is held per rebuild: inline, thread, process")
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
    lean = []
    for _ in range(max(3, a.pairs // 4)):
        t0 = time.perf_counter()
        _btc_lib(raw, None)
        lean.append((time.perf_counter() - t0) * 1000)
    print(f"lean python-bitcoinlib rules (_btc_lib, witness/refused blocks): {statistics.median(lean):7.1f} ms")
    c = coder(12, 8)
    chunks = dict(enumerate(c.encode(raw)))
    dec, cpu = [], []
    for _ in range(a.pairs):
        t0, c0 = time.perf_counter(), time.process_time()
        c.decode({i: chunks[i] for i in range(4, 12)})      # 4 data chunks missing: parity used
        dec.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    print(f"erasure decode 8 of 12 chunks (pyeclib isa_l_rs_cauchy): {statistics.median(dec):7.2f} ms "
          f"(CPU {statistics.median(cpu):.2f} ms; holds the GIL)")
    if a.loop_stall:
        import asyncio
        asyncio.run(loop_stall(raw, a.pairs))
    print(f"load {open('/proc/loadavg').read().split()[:3]}")
    from result_file import write_result
    write_result("marlin_validate", {"validate_block_ms": statistics.median(our_t), "validate_block_best_ms": min(our_t),
                                     "block_bytes": len(raw)},
                 {"bitcoinlib_ms": statistics.median(lib_t), "bitcoinlib_best_ms": min(lib_t)},
                 {"bitcoinlib/ours": statistics.median(ratios)})


async def loop_stall(raw: bytes, n: int) -> None:
    """How long an event loop is held while a consumer rebuilds (decode + validate) the block
    n times, one after another, inline / in a thread pool / in a process pool (RebuildPool,
    as marlin-node consumer --validate-pool): a 1 ms ticker on the loop records how late each
    tick fires; printed: the longest and the 99th percentile lateness."""
    import asyncio

    from marlin_cluster.consumer import RebuildJob, rebuild_block
    from marlin_cluster.daemon import RebuildPool
    c = coder(12, 8)
    chunks = {i: ch for i, ch in enumerate(c.encode(raw)) if i >= 4}
    job = RebuildJob(0, [b"\0" * 20], CHANNEL_BTC, 12, 8, chunks, 0.0, len(raw))
    loop = asyncio.get_running_loop()
    for kind in ("inline", "thread", "process"):
        pool = RebuildPool(kind, 1)
        await asyncio.gather(*(asyncio.wrap_future(f) for f in pool.warm()))
        late: list[float] = []
        stop = False

        async def ticker():
            while not stop:
                t = loop.time()
                await asyncio.sleep(0.001)
                late.append((loop.time() - t - 0.001) * 1000)
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        late.clear()
        for _ in range(n):
            if kind == "inline":
                rebuild_block(*job.args(validate_block))
                await asyncio.sleep(0)
            else:
                fut = loop.create_future()
                pool.submit(job, validate_block, lambda j, out: fut.set_result(out))
                assert (await fut)[0] == "ok"
        stop = True
        await task
        pool.close()
        late.sort()
        print(f"event loop held while rebuilding {n} times, --validate-pool {kind:7s}: longest tick delay "
              f"{late[-1]:6.1f} ms, p99 {late[int(0.99 * (len(late) - 1))]:6.1f} ms ({len(late)} ticks)")


if __name__ == "__main__":
    main()
