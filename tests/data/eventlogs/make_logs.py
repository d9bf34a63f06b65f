"""Regenerates the hand-made event logs of tests/test_spark_report.py (run from the repo root:
`python tests/data/eventlogs/make_logs.py`). Every time below is the TRUE time in ms after
BASE; node "22" (twin 22's peer and service) logs 500 ms behind (clock skew). The expected
answers are written out in the test, from this scenario, not computed from these files.

RMB twins: 11 (requester, relay r1), 22 (r1, clock -500 ms), 33 (r1), 44 (relay r2).
Hop delays: app<->peer 1-2 ms, peer<->relay 3 ms (11) / 4 ms (22, 33, 44), relay 1 ms.
"""
import datetime as dt
import json
from pathlib import Path

HERE = Path(__file__).parent
BASE = dt.datetime(2026, 11, 20, 10, 0, 0, tzinfo=dt.timezone.utc)
SKEW = {"22": -500}
lines: dict[str, list[str]] = {}


def ev(file, ms, service, node, event, trace, lvl="info", **attrs):
    t = BASE + dt.timedelta(milliseconds=ms + SKEW.get(node, 0))
    ts = t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lines.setdefault(file, []).append((t, json.dumps(
        {"ts": ts, "level": lvl, "service": service, "node": node, "event": event,
         "trace_id": trace, "attrs": attrs}, separators=(",", ":"))))


def app(tw, ms, event, trace, **a):
    ev(f"twin{tw}.jsonl", ms, "calc" if tw != "11" else "calc-client", tw, event, trace, **a)


def peer(tw, ms, event, trace, **a):
    ev(f"twin{tw}.jsonl", ms, "rmb-peer", tw, event, trace, **a)


def relay(r, ms, event, trace, **a):
    ev(f"{r}.jsonl", ms, "rmb-relay", f"{r}.local", event, trace, **a)


def request(t0, uid, dst, ttl=30, skip=(), dup=()):
    """requester 11 -> dst via r1 up to the destination peer delivering to its service."""
    app("11", t0, "rmb.app.requested", uid, cmd="calc.add", dst=dst, count=1, size=10, ttl=ttl)
    if "peer.sent" not in skip:
        peer("11", t0 + 2, "rmb.peer.sent", uid, kind="request", dst=dst, size=200,
             encrypted=True, relay="r1.local")
    relay("r1", t0 + 5, "rmb.relay.received", uid, kind="request", src="11", dst=dst, size=200)


def deliver(t0, uid, dst, times=1):
    for i in range(times):
        relay("r1", t0 + 6 + i, "rmb.relay.delivered", uid, dst=dst, size=200, queued_ms=0.0)
        peer(dst, t0 + 10 + i, "rmb.peer.received", uid, kind="request", src="11", size=200,
             relay="r1.local")
    peer(dst, t0 + 11, "rmb.peer.delivered", uid, cmd="calc.add", src="11")


def answer(t0, uid, dst, handled, code=0, kind="response", app_trace=None):
    """dst's service handles at t0+handled, the answer travels back to 11 (whose app logs
    its reply under app_trace when given)."""
    h = t0 + handled
    app(dst, h, "rmb.app.handled", uid, cmd="calc.add", src="11", code=code, duration_ms=5.0)
    peer(dst, h + 2, "rmb.peer.sent", uid, kind=kind, dst="11", size=100, encrypted=True,
         relay="r1.local")
    relay("r1", h + 6, "rmb.relay.received", uid, kind=kind, src=dst, dst="11", size=100)
    relay("r1", h + 7, "rmb.relay.delivered", uid, dst="11", size=100, queued_ms=0.0)
    peer("11", h + 10, "rmb.peer.received", uid, kind=kind, src=dst, size=100, relay="r1.local")
    peer("11", h + 11, "rmb.peer.answered", uid, src=dst, code=code)
    app("11", h + 13, "rmb.app.replied", app_trace or uid, src=dst, code=code, size=10,
        duration_ms=1.0)


S = 1000
# T1 plain round trip 11 -> 22: round trip 33 ms
request(0, "uid-ok", "22"); deliver(0, "uid-ok", "22"); answer(0, "uid-ok", "22", 20)
# T2 multi-destination 11 -> [22, 33]: two envelopes, one uid
app("11", 1 * S, "rmb.app.requested", "uid-multi", cmd="calc.add", dst="22,33", count=2,
    size=10, ttl=30)
for tw, handled in (("22", 30), ("33", 50)):
    peer("11", S + 2, "rmb.peer.sent", "uid-multi", kind="request", dst=tw, size=200,
         encrypted=True, relay="r1.local")
    relay("r1", S + 5, "rmb.relay.received", "uid-multi", kind="request", src="11", dst=tw, size=200)
    deliver(S, "uid-multi", tw)
    answer(S, "uid-multi", tw, handled)
# T3 expired request to 33: delivered, never handled, peer 11 expires it after the ttl (5 s)
request(2 * S, "uid-expired", "33", ttl=5); deliver(2 * S, "uid-expired", "33")
peer("11", 7 * S, "rmb.peer.expired", "uid-expired", lvl="warning", dst="33", code=102)
app("11", 7 * S + 1, "rmb.app.replied", "uid-expired", src="33", code=102, size=0, duration_ms=5000.0)
# T4 error reply from 22's service: code 101 (bad payload), round trip 23 ms
request(3 * S, "uid-error", "22"); deliver(3 * S, "uid-error", "22")
answer(3 * S, "uid-error", "22", 10, code=101, kind="error")
# T5 missing stage: 11's peer never logged `sent`; round trip 43 ms
request(4 * S, "uid-missing", "22", skip=("peer.sent",)); deliver(4 * S, "uid-missing", "22")
answer(4 * S, "uid-missing", "22", 30)
# T6 duplicates: r1 delivered twice, 22 received twice (2 duplicate events); round trip 33 ms
request(5 * S, "uid-dup", "22"); deliver(5 * S, "uid-dup", "22", times=2)
answer(5 * S, "uid-dup", "22", 20)
# T7 lost: reached r1, never delivered; ttl 5 s, the logs run long past it
request(6 * S, "uid-lost", "33", ttl=5)
# T8 federation 11 (r1) -> 44 (r2): round trip 60 ms
U = "uid-fed"
app("11", 8 * S, "rmb.app.requested", U, cmd="calc.add", dst="44", count=1, size=10, ttl=30)
peer("11", 8 * S + 2, "rmb.peer.sent", U, kind="request", dst="44", size=200, encrypted=True,
     relay="r1.local")
relay("r1", 8 * S + 5, "rmb.relay.received", U, kind="request", src="11", dst="44", size=200)
relay("r2", 8 * S + 9, "rmb.relay.federation_received", U, kind="request", src="11", dst="44", size=200)
relay("r1", 8 * S + 12, "rmb.relay.federated", U, domain="r2.local", attempt=1, duration_ms=7.0)
relay("r2", 8 * S + 13, "rmb.relay.delivered", U, dst="44", size=200, queued_ms=0.0)
peer("44", 8 * S + 17, "rmb.peer.received", U, kind="request", src="11", size=200, relay="r2.local")
peer("44", 8 * S + 18, "rmb.peer.delivered", U, cmd="calc.add", src="11")
app("44", 8 * S + 25, "rmb.app.handled", U, cmd="calc.add", src="11", code=0, duration_ms=5.0)
peer("44", 8 * S + 27, "rmb.peer.sent", U, kind="response", dst="11", size=100, encrypted=True,
     relay="r2.local")
relay("r2", 8 * S + 31, "rmb.relay.received", U, kind="response", src="44", dst="11", size=100)
relay("r1", 8 * S + 35, "rmb.relay.federation_received", U, kind="response", src="44", dst="11", size=100)
relay("r2", 8 * S + 38, "rmb.relay.federated", U, domain="r1.local", attempt=1, duration_ms=7.0)
relay("r1", 8 * S + 39, "rmb.relay.delivered", U, dst="11", size=100, queued_ms=0.0)
peer("11", 8 * S + 55, "rmb.peer.received", U, kind="response", src="44", size=100, relay="r1.local")
peer("11", 8 * S + 57, "rmb.peer.answered", U, src="44", code=0)
app("11", 8 * S + 60, "rmb.app.replied", U, src="44", code=0, size=10, duration_ms=1.0)
# T9 in flight at the end of the logs: sent 1 ms before the last line, ttl 60 s
request(59 * S, "uid-inflight", "33", ttl=60)
# T10 as rmb_peer/client.py logs today: the app's two events under its own ref, everything
# else under the envelope uid; round trip 33 ms in the app's trace, delivery on the envelope's
app("11", 9500, "rmb.app.requested", "ref-app", cmd="calc.add", dst="33", count=1, size=10, ttl=30)
peer("11", 9502, "rmb.peer.sent", "uid-env", kind="request", dst="33", size=200, encrypted=True,
     relay="r1.local")
relay("r1", 9505, "rmb.relay.received", "uid-env", kind="request", src="11", dst="33", size=200)
deliver(9500, "uid-env", "33")
answer(9500, "uid-env", "33", 20, app_trace="ref-app")
# connection events (no trace) and an event no catalogue declares
peer("11", -100, "rmb.peer.connected", None, relay="r1.local")
relay("r1", -90, "rmb.relay.connected", None, src="11")
relay("r1", 9 * S, "rmb.relay.teleported", "uid-ok", dst="22")

# REMP: M1 finalized after 8 s, M2 rejected by the full node, M3 finalized after 30 s, M4 timeout
FN, V1, V2 = "fn-a1b2", "v-0011", "v-0022"
M1, M2, M3 = "a1" * 32, "b2" * 32, "c3" * 32


def fn(ms, event, m, **a):
    ev("remp.jsonl", ms, "remp-fullnode", FN, event, m, **a)


def val(v, ms, m, kind, level):
    ev("remp.jsonl", ms, "remp-validator", v, "remp.validator.status", m, kind=kind, level=level,
       shard="8000000000000000")


for m, t0, fin in ((M1, 10 * S, 8000), (M3, 20 * S, 30000)):
    fn(t0, "remp.fullnode.received", m, size=300, shard="8000000000000000")
    fn(t0 + 5, "remp.fullnode.status", m, kind="SentToValidators", level=0, count=2)
    val(V1, t0 + 150, m, "PutIntoQueue", 1)
    val(V2, t0 + 170, m, "PutIntoQueue", 1)
    fn(t0 + 180, "remp.fullnode.status", m, kind="PutIntoQueue", level=1, peer=V1)
    fn(t0 + 190, "remp.fullnode.status", m, kind="PutIntoQueue", level=1, peer=V2)
    val(V1, t0 + 2000, m, "IncludedIntoBlock", 2)
    val(V1, t0 + 3000, m, "IncludedIntoAcceptedBlock", 3)
    val(V2, t0 + 3100, m, "IncludedIntoAcceptedBlock", 3)
    fn(t0 + fin, "remp.fullnode.status", m, kind="Finalized", level=4, block_seqno=7)
fn(15 * S, "remp.fullnode.received", M2, size=70000, shard="8000000000000000")
ev("remp.jsonl", 15 * S + 3, "remp-fullnode", FN, "remp.fullnode.status", M2, lvl="warning",
   kind="RejectedByFullnode", level=0, reason="size > 65535 bytes")

# M4: sent to v1, queued there, then the full node's final verdict: timeout (shortened to 15 s)
M4 = "d4" * 32
fn(40 * S, "remp.fullnode.received", M4, size=300, shard="8000000000000000")
fn(40 * S + 3, "remp.fullnode.sent", M4, peer=V1, shard="8000000000000000", size=300, count=1)
val(V1, 40 * S + 150, M4, "PutIntoQueue", 1)
fn(55 * S, "remp.fullnode.final", M4, lvl="warning", outcome="timeout", kind="Timeout", count=3,
   duration_ms=15000.0, shard="8000000000000000")

# Marlin: one block, consumers k1 (rebuilt after 35 ms) and k2 (after 50 ms)
MID = "0a0b0c0d:0x00000000000000000000000000000000000000aa"
for c in range(3):
    ev("marlin.jsonl", 30 * S + c, "marlin-producer", "p-aa", "marlin.producer.chunk_sent", MID,
       chunk=c, cluster="c1", size=1000)
ev("marlin.jsonl", 30 * S + 5, "marlin-cluster", "c1-m1", "marlin.cluster.witnessed", MID,
   chunk=0, peer="p-aa", size=1000)
ev("marlin.jsonl", 30 * S + 8, "marlin-cluster", "c1-m1", "marlin.cluster.acknowledged", MID,
   chunk=0, cluster="c1")
for k, first, done in (("k1", 20, 35), ("k2", 25, 50)):
    ev("marlin.jsonl", 30 * S + first, "marlin-consumer", k, "marlin.consumer.chunk_received",
       MID, chunk=0, peer="c1-m1", size=1000)
    ev("marlin.jsonl", 30 * S + done, "marlin-consumer", k, "marlin.consumer.block_rebuilt",
       MID, count=2, size=2000, duration_ms=float(done - first))

for name, items in lines.items():
    body = "\n".join(line for _, line in sorted(items, key=lambda x: x[0])) + "\n"
    if name == "r1.jsonl":  # torn last line: the relay died mid-write
        body += '{"ts":"2026-11-20T10:01:00.000000Z","level":"info","service":"rmb-re'
    (HERE / name).write_text(body)
(HERE / "bad").mkdir(exist_ok=True)
(HERE / "bad" / "python-logging-ts.jsonl").write_text(
    '{"ts":"2026-11-20 10:00:00,123","level":"info","service":"rmb-peer","node":"11",'
    '"event":"rmb.peer.connected","trace_id":null,"attrs":{"relay":"r1.local"}}\n')
