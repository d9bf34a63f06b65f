"""Regenerates the REMP and Marlin known-answer logs of tests/test_spark_remp_marlin.py (run
from the repo root: `python tests/data/eventlogs/remp_marlin/make_logs.py`). Events follow
remp_node/events.py and marlin_cluster/events.py; the expected answers are written out in
the test from this scenario. Times in ms after BASE, one clock.

REMP: full node "fn", validators "a1b2" (v1) and "c3d4" (v2).
  M1 finalized (first receipt 60 ms, Finalized at 6 s), v1's PutIntoQueue logged twice by
     the full node (a duplicate status);
  M2 rejected by both validators (planned: negative_boc); v1's reject never reached the
     full node (produced 2, delivered 1);
  M3 sent, then nothing: lost (no final status, older than the 240 s TTL at the end);
  M4 finalized at 290 s + 5 s (first receipt 40 ms).
Marlin: producer "p1", members "c1-m1"/"c1-m2", consumers "k1"/"k2".
  B1: chunks 0-3 sent, 0-2 acknowledged (chunk 3's ack missing), k1 gets 0-2 and rebuilds
      at 40 ms, k2 gets 0-1 and rebuilds at 60 ms;
  B2 (planned: corrupted_block): chunks 0-3 sent and acknowledged, k1 gets all four and
      raises a dispute;
  B3: chunks 0-3 sent and acknowledged, k1 gets chunk 0 only and never rebuilds: 3 chunks
      lost for k1 (B1's chunk 2 and 3 that k2 never got are not lost: k2 rebuilt without
      them), and the block is lost_or_stuck.
"""
import datetime as dt
import json
from pathlib import Path

HERE = Path(__file__).parent
BASE = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=dt.timezone.utc)
lines: dict[str, list] = {}


def ev(file, ms, service, node, event, trace, **attrs):
    t = BASE + dt.timedelta(milliseconds=ms)
    lines.setdefault(file, []).append((t, json.dumps(
        {"ts": t.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "level": "info", "service": service,
         "node": node, "event": event, "trace_id": trace, "attrs": attrs},
        separators=(",", ":"))))


def fn(ms, event, mid, **a):
    ev("remp-fullnode.jsonl", ms, "remp-fullnode", "fn", event, mid, **a)


def val(v, ms, mid, kind, **a):
    ev(f"remp-validator-{v}.jsonl", ms, "remp-validator", v, "remp.validator.status", mid,
       kind=kind, shard="0:8000000000000000", **a)


def status(ms, mid, kind, peer=None, **a):
    if peer:
        a["peer"] = peer
    fn(ms, "remp.fullnode.status", mid, kind=kind, shard="0:8000000000000000", **a)


def plan(ms, event, trace=None, **a):
    ev("demo-plan.jsonl", ms, "relay-suite-demo", "launcher", event, trace, **a)


V1, V2 = "a1b2", "c3d4"
M1, M2, M3, M4 = ("11" * 32, "22" * 32, "33" * 32, "44" * 32)
for label, raw, kind in (("v1", V1, "remp-validator"), ("v2", V2, "remp-validator"),
                         ("fullnode", "fn", "remp-fullnode"), ("consumer1", "k1", "marlin-consumer")):
    plan(0, "demo.plan.node", target=label, peer=raw, kind=kind)


def submit(t0, mid):
    fn(t0, "remp.fullnode.received", mid, size=200, shard="0:8000000000000000")
    status(t0 + 1, mid, "SentToValidators")
    fn(t0 + 2, "remp.fullnode.sent", mid, peer=V1, shard="0:8000000000000000", size=200, count=1)
    fn(t0 + 3, "remp.fullnode.sent", mid, peer=V2, shard="0:8000000000000000", size=200, count=2)


# M1
submit(0, M1)
val(V1, 50, M1, "PutIntoQueue")
status(60, M1, "PutIntoQueue", V1)
status(60, M1, "PutIntoQueue", V1)          # the same status logged twice: a duplicate
val(V2, 55, M1, "PutIntoQueue")
status(70, M1, "PutIntoQueue", V2)
val(V1, 1000, M1, "IncludedIntoBlock", block_seqno=5)
status(1010, M1, "IncludedIntoBlock", V1, block_seqno=5)
val(V1, 3000, M1, "IncludedIntoAcceptedBlock", block_seqno=5)
status(3010, M1, "IncludedIntoAcceptedBlock", V1, block_seqno=5)
status(6000, M1, "Finalized", block_seqno=3)
fn(6000, "remp.fullnode.final", M1, outcome="finalized", kind="Finalized", count=2,
   duration_ms=6000.0, shard="0:8000000000000000")
# M2 (planned reject)
plan(9000, "demo.plan.expect", M2, outcome="rejected", fault="negative_boc")
submit(10000, M2)
val(V1, 10100, M2, "Rejected", reason="account not found")
val(V2, 10150, M2, "Rejected", reason="account not found")
status(10200, M2, "Rejected", V2, reason="account not found")
fn(10300, "remp.fullnode.final", M2, outcome="rejected", kind="Rejected",
   reason="account not found", count=2, duration_ms=300.0, shard="0:8000000000000000")
# M3 lost
submit(20000, M3)
# M4
submit(290000, M4)
val(V2, 290030, M4, "PutIntoQueue")
status(290040, M4, "PutIntoQueue", V2)
status(295000, M4, "Finalized", block_seqno=40)
fn(295000, "remp.fullnode.final", M4, outcome="finalized", kind="Finalized", count=2,
   duration_ms=5000.0, shard="0:8000000000000000")

# Marlin
B1, B2 = "0000abcd:0x" + "01" * 20, "0000beef:0x" + "01" * 20


def mar(ms, service, node, event, trace, **a):
    ev(f"{service}-{node}.jsonl", ms, service, node, event, trace, **a)


T = 100000
for c in range(4):
    mar(T + c, "marlin-producer", "p1", "marlin.producer.chunk_sent", B1, chunk=c, cluster="c1", size=500)
mar(T + 5, "marlin-cluster", "c1-m1", "marlin.cluster.witnessed", B1, chunk=0, peer="p1", size=500)
for c in range(3):
    mar(T + 8 + c, "marlin-cluster", "c1-m1", "marlin.cluster.acknowledged", B1, chunk=c, cluster="c1")
for c in range(3):
    mar(T + 20 + c, "marlin-consumer", "k1", "marlin.consumer.chunk_received", B1, chunk=c, peer="c1-m2", size=500)
for c in range(2):
    mar(T + 30 + c, "marlin-consumer", "k2", "marlin.consumer.chunk_received", B1, chunk=c, peer="c1-m2", size=500)
mar(T + 40, "marlin-consumer", "k1", "marlin.consumer.block_rebuilt", B1, count=2, size=1000, duration_ms=20.0)
mar(T + 60, "marlin-consumer", "k2", "marlin.consumer.block_rebuilt", B1, count=2, size=1000, duration_ms=30.0)
T2 = 101000
plan(T2 - 100, "demo.plan.expect", B2, outcome="dispute", fault="corrupted_block")
for c in range(4):
    mar(T2 + c, "marlin-producer", "p1", "marlin.producer.chunk_sent", B2, chunk=c, cluster="c1", size=500)
    mar(T2 + 8 + c, "marlin-cluster", "c1-m1", "marlin.cluster.acknowledged", B2, chunk=c, cluster="c1")
    mar(T2 + 20 + c, "marlin-consumer", "k1", "marlin.consumer.chunk_received", B2, chunk=c, peer="c1-m1", size=500)
mar(T2 + 5, "marlin-cluster", "c1-m1", "marlin.cluster.witnessed", B2, chunk=0, peer="p1", size=500)
mar(T2 + 50, "marlin-consumer", "k1", "marlin.consumer.dispute", B2, reason="merkle root mismatch", peer="p1")
B3 = "0000cafe:0x" + "01" * 20
T3 = 102000
for c in range(4):
    mar(T3 + c, "marlin-producer", "p1", "marlin.producer.chunk_sent", B3, chunk=c, cluster="c1", size=500)
    mar(T3 + 8 + c, "marlin-cluster", "c1-m1", "marlin.cluster.acknowledged", B3, chunk=c, cluster="c1")
mar(T3 + 5, "marlin-cluster", "c1-m1", "marlin.cluster.witnessed", B3, chunk=0, peer="p1", size=500)
mar(T3 + 20, "marlin-consumer", "k1", "marlin.consumer.chunk_received", B3, chunk=0, peer="c1-m1", size=500)

for name, rows in lines.items():
    rows.sort(key=lambda r: r[0])
    (HERE / name).write_text("".join(r[1] + "\n" for r in rows))
