"""Large synthetic event logs in the real schema (DESIGN.md section 6), for bench_spark_report.

    .venv/bin/python bench/gen_eventlog.py --out /tmp/eventlogs [--events 5000000] [--seed 1]

Writes one JSON-lines file per process (rmb-peer and app per twin group, rmb-relay per relay,
remp-fullnode, remp-validator, marlin-*), lines in time order per file, like the daemons'
rotated logs. Every event is declared in the catalogues (checked at start); attrs carry the
catalogued types. Mix by events: about 70% RMB round trips (2% to two destinations, 5%
federated to a second relay, 2% error replies, 1% expired, 1% lost, a few duplicates), 20%
REMP messages (received -> SentToValidators -> PutIntoQueue x3 -> IncludedIntoBlock ->
IncludedIntoAcceptedBlock x2 -> Finalized; 2% rejected by the full node), 10% Marlin blocks.
Twin group 7's host runs 250 ms behind (clock skew the report should prove and correct).
Lines are rendered with json.dumps (never by hand).
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

BASE_US = 1_795_600_000_000_000           # 2026-11-24T09:46:40Z in microseconds
SKEW_US = {"twin-g7": -250_000}


class Writer:
    def __init__(self, out: Path):
        self.out = out
        self.buf: dict[str, list[tuple[int, str]]] = {}
        self.count = 0
        self._sec_cache: dict[int, str] = {}

    def ts(self, us: int) -> str:
        sec, frac = divmod(us, 1_000_000)
        prefix = self._sec_cache.get(sec)
        if prefix is None:
            prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
            self._sec_cache[sec] = prefix
        return f"{prefix}.{frac:06d}Z"

    def emit(self, file: str, us: int, service: str, node: str, event: str, trace, clock: str = "",
             lvl: str = "info", **attrs):
        us += SKEW_US.get(clock, 0)
        line = json.dumps({"ts": self.ts(us), "level": lvl, "service": service, "node": node,
                           "event": event, "trace_id": trace, "attrs": attrs},
                          separators=(",", ":"))
        self.buf.setdefault(file, []).append((us, line))
        self.count += 1

    def flush(self):
        for name, items in self.buf.items():
            items.sort(key=lambda x: x[0])
            with open(self.out / name, "a") as f:
                f.write("\n".join(line for _, line in items))
                f.write("\n")
        self.buf.clear()


def rmb_trace(w: Writer, rnd: random.Random, i: int, t0: int):
    uid = f"{rnd.getrandbits(128):032x}"
    uid = f"{uid[:8]}-{uid[8:12]}-4{uid[13:16]}-a{uid[17:20]}-{uid[20:32]}"
    g = i % 16
    x = str(1000 + (i % 4000))
    gx = f"twin-g{g}"
    multi = rnd.random() < 0.02
    dsts = [str(5000 + rnd.randrange(4000)) for _ in range(2 if multi else 1)]
    fed = rnd.random() < 0.05
    fate = rnd.random()
    ttl = 30
    app_f, peer_f = f"app-g{g}.jsonl", f"peer-g{g}.jsonl"
    w.emit(app_f, t0, "calc-client", x, "rmb.app.requested", uid, gx, cmd="calc.add",
           dst=",".join(dsts), count=len(dsts), size=64, ttl=ttl)
    for k, y in enumerate(dsts):
        gy_i = int(y) % 16
        gy = f"twin-g{gy_i}"
        t = t0 + 300 + k * 50
        w.emit(peer_f, t, "rmb-peer", x, "rmb.peer.sent", uid, gx, kind="request", dst=y,
               size=512, encrypted=True, relay="r1.example")
        t += 800 + rnd.randrange(400)
        w.emit("relay-r1.jsonl", t, "rmb-relay", "r1.example", "rmb.relay.received", uid,
               kind="request", src=x, dst=y, size=512)
        if fate < 0.01:        # lost in the relay
            continue
        dr = "r1.example"
        if fed:
            t += 2000 + rnd.randrange(2000)
            w.emit("relay-r2.jsonl", t, "rmb-relay", "r2.example",
                   "rmb.relay.federation_received", uid, kind="request", src=x, dst=y, size=512)
            w.emit("relay-r1.jsonl", t + 900, "rmb-relay", "r1.example", "rmb.relay.federated",
                   uid, domain="r2.example", attempt=1, duration_ms=2.5)
            dr = "r2.example"
        t += 200 + rnd.randrange(300)
        rf = "relay-r2.jsonl" if fed else "relay-r1.jsonl"
        w.emit(rf, t, "rmb-relay", dr, "rmb.relay.delivered", uid, dst=y, size=512, queued_ms=0.0)
        if rnd.random() < 0.003:   # replayed delivery: a duplicate
            w.emit(rf, t + 100, "rmb-relay", dr, "rmb.relay.delivered", uid, dst=y, size=512,
                   queued_ms=0.0)
        t += 800 + rnd.randrange(400)
        ypeer, yapp = f"peer-g{gy_i}.jsonl", f"app-g{gy_i}.jsonl"
        w.emit(ypeer, t, "rmb-peer", y, "rmb.peer.received", uid, gy, kind="request", src=x,
               size=512, relay=dr)
        w.emit(ypeer, t + 150, "rmb-peer", y, "rmb.peer.delivered", uid, gy, cmd="calc.add", src=x)
        if 0.01 <= fate < 0.02:    # service never answers: expires at the requester
            w.emit(peer_f, t0 + ttl * 1_000_000, "rmb-peer", x, "rmb.peer.expired", uid, gx,
                   lvl="warning", dst=y, code=102)
            w.emit(app_f, t0 + ttl * 1_000_000 + 500, "calc-client", x, "rmb.app.replied", uid,
                   gx, src=y, code=102, size=0, duration_ms=float(ttl * 1000))
            continue
        code = 101 if fate > 0.98 else 0
        kind = "error" if code else "response"
        t += 2000 + int(rnd.expovariate(1 / 5000))
        w.emit(yapp, t, "calc", y, "rmb.app.handled", uid, gy, cmd="calc.add", src=x, code=code,
               duration_ms=3.0)
        t += 300
        w.emit(ypeer, t, "rmb-peer", y, "rmb.peer.sent", uid, gy, kind=kind, dst=x, size=256,
               encrypted=True, relay=dr)
        t += 800 + rnd.randrange(400)
        w.emit(rf, t, "rmb-relay", dr, "rmb.relay.received", uid, kind=kind, src=y, dst=x, size=256)
        if fed:
            t += 2000 + rnd.randrange(2000)
            w.emit("relay-r1.jsonl", t, "rmb-relay", "r1.example",
                   "rmb.relay.federation_received", uid, kind=kind, src=y, dst=x, size=256)
            w.emit("relay-r2.jsonl", t + 900, "rmb-relay", "r2.example", "rmb.relay.federated",
                   uid, domain="r1.example", attempt=1, duration_ms=2.5)
        t += 200
        w.emit("relay-r1.jsonl", t, "rmb-relay", "r1.example", "rmb.relay.delivered", uid,
               dst=x, size=256, queued_ms=0.0)
        t += 800 + rnd.randrange(400)
        w.emit(peer_f, t, "rmb-peer", x, "rmb.peer.received", uid, gx, kind=kind, src=y,
               size=256, relay="r1.example")
        w.emit(peer_f, t + 100, "rmb-peer", x, "rmb.peer.answered", uid, gx, src=y, code=code)
        w.emit(app_f, t + 300, "calc-client", x, "rmb.app.replied", uid, gx, src=y, code=code,
               size=32, duration_ms=1.0)


VALIDATORS = [f"v-{k:04x}" for k in range(12)]


def remp_trace(w: Writer, rnd: random.Random, i: int, t0: int):
    m = f"{rnd.getrandbits(256):064x}"
    fn = f"fn-{i % 4}"
    f = f"remp-fullnode-{i % 4}.jsonl"
    w.emit(f, t0, "remp-fullnode", fn, "remp.fullnode.received", m, size=300,
           shard="8000000000000000")
    if rnd.random() < 0.02:
        w.emit(f, t0 + 900, "remp-fullnode", fn, "remp.fullnode.status", m, lvl="warning",
               kind="RejectedByFullnode", level=0, reason="failed pre-execution")
        return
    w.emit(f, t0 + 2000, "remp-fullnode", fn, "remp.fullnode.status", m, kind="SentToValidators",
           level=0, count=3)
    vs = rnd.sample(VALIDATORS, 3)
    t = t0 + 100_000
    for k, v in enumerate(vs):
        w.emit(f"remp-{v}.jsonl", t + k * 20_000, "remp-validator", v, "remp.validator.status",
               m, kind="PutIntoQueue", level=1, shard="8000000000000000")
    w.emit(f, t + 50_000, "remp-fullnode", fn, "remp.fullnode.status", m, kind="PutIntoQueue",
           level=1, peer=vs[0])
    t += 1_500_000 + rnd.randrange(1_000_000)
    w.emit(f"remp-{vs[0]}.jsonl", t, "remp-validator", vs[0], "remp.validator.status", m,
           kind="IncludedIntoBlock", level=2, shard="8000000000000000", block_seqno=i)
    t += 1_000_000
    for v in vs[:2]:
        w.emit(f"remp-{v}.jsonl", t, "remp-validator", v, "remp.validator.status", m,
               kind="IncludedIntoAcceptedBlock", level=3, shard="8000000000000000", block_seqno=i)
    t += 4_000_000 + int(rnd.expovariate(1 / 6_000_000))
    w.emit(f, t, "remp-fullnode", fn, "remp.fullnode.status", m, kind="Finalized", level=4,
           block_seqno=i)


def marlin_trace(w: Writer, rnd: random.Random, i: int, t0: int):
    mid = f"{rnd.getrandbits(32):08x}:0x{rnd.getrandbits(160):040x}"
    p = f"p-{i % 8}"
    for c in range(3):
        w.emit("marlin-producer.jsonl", t0 + c * 200, "marlin-producer", p,
               "marlin.producer.chunk_sent", mid, chunk=c, cluster="c1", size=4096)
    w.emit("marlin-cluster.jsonl", t0 + 3000, "marlin-cluster", "c1-m1",
           "marlin.cluster.witnessed", mid, chunk=0, peer=p, size=4096)
    w.emit("marlin-cluster.jsonl", t0 + 4000, "marlin-cluster", "c1-m1",
           "marlin.cluster.acknowledged", mid, chunk=0, cluster="c1")
    for k in ("k1", "k2"):
        t = t0 + 8000 + rnd.randrange(5000)
        w.emit(f"marlin-{k}.jsonl", t, "marlin-consumer", k, "marlin.consumer.chunk_received",
               mid, chunk=0, peer="c1-m1", size=4096)
        w.emit(f"marlin-{k}.jsonl", t + 15000 + rnd.randrange(20000), "marlin-consumer", k,
               "marlin.consumer.block_rebuilt", mid, count=2, size=8192, duration_ms=15.0)


def generate(out: Path, events: int, seed: int = 1) -> int:
    """Write about `events` events into out/*.jsonl (existing files replaced); returns the count."""
    from spark.schema import known_events
    known = known_events()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.jsonl"):
        old.unlink()
    rnd = random.Random(seed)
    w = Writer(out)
    orig = w.emit

    def checked(file, us, service, node, event, *a, **k):
        if event not in known:
            raise ValueError(f"{event} is not catalogued")
        return orig(file, us, service, node, event, *a, **k)
    w.emit = checked
    i, t0 = 0, BASE_US
    while w.count < events:
        r = rnd.random()
        if r < 0.70:
            rmb_trace(w, rnd, i, t0)
        elif r < 0.90:
            remp_trace(w, rnd, i, t0)
        else:
            marlin_trace(w, rnd, i, t0)
        i += 1
        t0 += 2000
        if len(w.buf) and i % 20000 == 0:
            w.flush()
    w.flush()
    return w.count


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    t = time.time()
    n = generate(Path(args.out), args.events, args.seed)
    size = sum(p.stat().st_size for p in Path(args.out).glob("*.jsonl"))
    print(f"{n} events, {size / 1e6:.0f} MB in {args.out} ({time.time() - t:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
