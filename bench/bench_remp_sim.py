"""CPU per message of the REMP protocol cores, in memory (remp_node/testnet/sim.py): 2 shards x 7
validators + masterchain + the full node's client core in ONE process on a fake clock, no
transport, no event logs, no stores. Unlike bench_remp_daemon.py (15 processes sharing the
machine's cores, latencies at the mercy of the load average), process CPU time here hardly
depends on what else runs, so it compares code versions.

    .venv/bin/python bench/bench_remp_sim.py [--rates 20,100] [--duration 6] [--profile]

Per rate: messages all final or not, Finalized p50/p99 (simulated time: the protocol's own
latency with 5-7 ms links), CPU ms per message (total and above the idle network's CPU per
simulated second), datagrams per message by channel (receipts are not batched here: the
`client` channel carries one datagram per receipt; the daemons batch them, delivery.py).

Same-run baseline: the ed25519 work the run did (every keys.verify and NodeKey.sign, counted
and timed), i.e. the CPU the signatures alone cost per message, the floor the protocol's
signed votes, blocks and receipts put under the cores. Note the client core here verifies
every receipt (the daemon's full node checks one signature per receipt packet instead).
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from remp_node.wire import keys  # noqa: E402
from remp_node.testnet.sim import SimConfig, Simulation  # noqa: E402
from tests.remp_fixtures import WalletSet  # noqa: E402


class _Crypto:
    """Counts and times every ed25519 verify (through keys._public) and sign."""

    def __init__(self):
        self.verifies = self.signs = 0
        self.t = 0.0
        if not hasattr(keys, "_public"):    # an older tree (keys.verify loaded the key per call)
            return
        orig_public, orig_sign = keys._public, keys.NodeKey.sign
        crypto = self

        class _Timed:
            __slots__ = ("k",)

            def __init__(self, k):
                self.k = k

            def verify(self, sig, data):
                t = time.thread_time()
                try:
                    return self.k.verify(sig, data)
                finally:
                    crypto.t += time.thread_time() - t
                    crypto.verifies += 1

        def public(pk):
            return _Timed(orig_public(pk))

        def sign(key, data):
            t = time.thread_time()
            try:
                return orig_sign(key, data)
            finally:
                crypto.t += time.thread_time() - t
                crypto.signs += 1
        keys._public = public
        keys.NodeKey.sign = sign

    def snapshot(self):
        return self.verifies, self.signs, self.t


def run(rate: float, duration: float, profile: bool, crypto: _Crypto) -> tuple[dict, dict]:
    w = WalletSet(200, "bench-sim")
    sim = Simulation(SimConfig(seed=3, mc_catchain_lifetime=60.0, block_interval=0.25, master_block_interval=0.4,
                               rmq_block_interval=0.05, jitter=0.002), wallets=w.genesis())
    t0 = int(sim.now)
    n = int(rate * duration)
    bocs = [w.transfer(i % 200, 1 + i // 200, t0 + 3600) for i in range(n)]
    sim.run(3.0)
    c0 = time.process_time()
    sim.run(5.0)
    idle = (time.process_time() - c0) / 5.0
    kinds0 = dict(sim.net.stats.by_kind)
    v0, s0, k0 = crypto.snapshot()
    prof = cProfile.Profile() if profile else None
    c0, start = time.process_time(), sim.now
    if prof:
        prof.enable()
    ids = []
    for i, boc in enumerate(bocs):
        while sim.now < start + i / rate:
            sim.step()
        ids.append(sim.submit(boc))
    ok = sim.run_until(lambda: all(m in sim.finals for m in ids), 120.0)
    if prof:
        prof.disable()
    cpu = time.process_time() - c0
    elapsed = sim.now - start
    v1, s1, k1 = crypto.snapshot()
    fin = sorted(sim.finals[m][0].elapsed for m in ids if m in sim.finals and sim.finals[m][0].outcome == "finalized")
    pct = (lambda q: fin[min(len(fin) - 1, int(len(fin) * q))]) if fin else (lambda q: float("nan"))
    print(f"\nrate {rate:g}/s for {duration:g} s: {len(fin)}/{n} finalized, all final {ok} after {elapsed:.1f} "
          f"simulated s; Finalized p50 {pct(0.5):.2f} s, p99 {pct(0.99):.2f} s")
    print(f"  CPU per message {cpu / n * 1000:.1f} ms ({(cpu - idle * elapsed) / n * 1000:.1f} ms above the idle "
          f"network's {idle * 1000:.0f} ms per simulated s)")
    kinds = {k: (v - kinds0.get(k, 0)) / n for k, v in sim.net.stats.by_kind.items()}
    print("  datagrams per message: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(kinds.items(), key=lambda x: -x[1])))
    print(f"  baseline, same run: ed25519 {(v1 - v0) / n:.0f} verifies + {(s1 - s0) / n:.0f} signs per message, "
          f"{(k1 - k0) / n * 1000:.1f} ms of CPU per message ({(k1 - k0) / cpu * 100:.0f}% of the cores' CPU)",
          flush=True)
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    at = f"@{rate:g}/s"
    return ({f"finalized{at}": len(fin), f"messages{at}": n, f"finalized_p50_s{at}": pct(0.5),
             f"finalized_p99_s{at}": pct(0.99), f"cpu_per_message_ms{at}": cpu / n * 1000,
             f"cpu_per_message_above_idle_ms{at}": (cpu - idle * elapsed) / n * 1000,
             f"datagrams_per_message{at}": sum(kinds.values())},
            {f"ed25519_verifies_per_message{at}": (v1 - v0) / n, f"ed25519_signs_per_message{at}": (s1 - s0) / n,
             f"ed25519_cpu_per_message_ms{at}": (k1 - k0) / n * 1000})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="20,100", help="message rates (per simulated second), comma separated")
    ap.add_argument("--duration", type=float, default=6.0, help="simulated seconds of sending per rate")
    ap.add_argument("--profile", action="store_true", help="cProfile each rate (top 25 by own time)")
    args = ap.parse_args()
    crypto = _Crypto()
    print(f"REMP cores in memory: 2 shards x 7 validators, block interval 0.25 s, master 0.4 s; "
          f"load average {open('/proc/loadavg').read().split()[0]}")
    figures, baseline = {}, {}
    for r in [float(x) for x in args.rates.split(",")]:
        f, b = run(r, args.duration, args.profile, crypto)
        figures.update(f)
        baseline.update(b)
    from result_file import write_result
    write_result("remp_sim", figures, baseline)


if __name__ == "__main__":
    main()
