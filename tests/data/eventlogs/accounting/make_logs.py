"""Regenerates the hand-made event logs of tests/test_spark_accounting.py (run from the repo
root: `python tests/data/eventlogs/accounting/make_logs.py`). The outcome rule:
per (request uid, destination) the outcome is decided once, by the first reply or expiry
notice before the deadline (peer send time + ttl); anything after the deadline is a late
reply. The expected answers are written out in the test, not computed from these files.

Twins: 1 = alice (requester; app + rmb-peer log node "1"), 2 = bob, 3 = carol, 4 = dave,
relay "relay1.local". Plan (demo-plan.jsonl): R-late is expected to expire
(expiring_request); carol is offline (twin_offline) from 20.0 s to 26.0 s.
"""
import datetime as dt
import json
from pathlib import Path

HERE = Path(__file__).parent
BASE = dt.datetime(2026, 11, 22, 9, 0, 0, tzinfo=dt.timezone.utc)
lines: dict[str, list] = {}


def ev(file, ms, service, node, event, trace, lvl="info", **attrs):
    t = BASE + dt.timedelta(milliseconds=ms)
    lines.setdefault(file, []).append((t, json.dumps(
        {"ts": t.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "level": lvl, "service": service,
         "node": node, "event": event, "trace_id": trace, "attrs": attrs},
        separators=(",", ":"))))


def alice(ms, event, uid, **a):
    app = event.startswith("rmb.app.")
    ev("alice.jsonl", ms, "demo-client" if app else "rmb-peer", "1", event, uid, **a)


def svc(tw, ms, event, uid, **a):
    ev(f"twin{tw}.jsonl", ms, "blocks" if event.startswith("rmb.app.") else "rmb-peer", tw,
       event, uid, **a)


def plan(ms, event, trace=None, **a):
    ev("demo-plan.jsonl", ms, "relay-suite-demo", "launcher", event, trace, **a)


def request(t0, uid, dsts, ttl):
    alice(t0, "rmb.app.requested", uid, cmd="block.verify", dst=",".join(dsts),
          count=len(dsts), size=100, ttl=ttl)
    for d in dsts:
        alice(t0 + 1, "rmb.peer.sent", uid, kind="request", dst=d, size=300, encrypted=True,
              relay="relay1.local")
        ev("relay1.jsonl", t0 + 3, "rmb-relay", "relay1.local", "rmb.relay.forwarded", uid,
           kind="request", src="1", dst=d, size=300)


def reply(ms, uid, src, code, app=True):
    alice(ms, "rmb.peer.answered", uid, src=src, code=code)
    if app:
        alice(ms + 1, "rmb.app.replied", uid, src=src, code=code, size=0, duration_ms=1.0)


def expire(ms, uid, dst):
    alice(ms, "rmb.peer.expired", uid, lvl="warning", dst=dst, code=102)
    alice(ms + 1, "rmb.app.replied", uid, src=dst, code=102, size=0, duration_ms=1.0)


def late(ms, uid, src):
    alice(ms, "rmb.peer.rejected", uid, lvl="warning", code=102, src=src,
          reason="reply for a request that already completed or expired")


S = 1000
for label, raw in (("alice", "1"), ("bob", "2"), ("carol", "3"), ("dave", "4"),
                   ("relay1", "relay1.local")):
    plan(0, "demo.plan.node", target=label, peer=raw,
         kind="rmb-relay" if label == "relay1" else "rmb-peer")
# R-ok: answered in 40 ms
request(1 * S, "R-ok", ["2"], ttl=5)
svc("2", 1 * S + 10, "rmb.peer.delivered", "R-ok", cmd="block.verify", src="1")
reply(1 * S + 40, "R-ok", "2", 0)
# R-late (planned expiring_request): expires at 2 s; bob's reply comes at 3 s: late, rejected
plan(1500, "demo.plan.expect", "R-late", outcome="expired", fault="expiring_request")
request(2 * S, "R-late", ["2"], ttl=2)
expire(4 * S + 1, "R-late", "2")
late(5 * S, "R-late", "2")
# R-err: error reply code 101 before the deadline
request(6 * S, "R-err", ["4"], ttl=5)
reply(6 * S + 30, "R-err", "4", 101)
# error reply code 500
request(7 * S, "R-500", ["4"], ttl=5)
reply(7 * S + 30, "R-500", "4", 500)
# R-after: only a reply after the deadline was logged (ttl 1 s, answered at 1.5 s): expired
# by rule (nothing before the deadline), and a late reply; unplanned
request(8 * S, "R-after", ["2"], ttl=1)
reply(8 * S + 1500, "R-after", "2", 0, app=False)
# R-multi to bob and carol: bob answers; carol is offline (planned) and her reply comes late
plan(20 * S, "demo.plan.fault", fault="twin_offline", target="carol", duration_ms=6000.0)
request(21 * S, "R-multi", ["2", "3"], ttl=2)
reply(21 * S + 50, "R-multi", "2", 0)
expire(23 * S + 1, "R-multi", "3")
late(25 * S, "R-multi", "3")
plan(26 * S, "demo.plan.recovered", fault="twin_offline", target="carol")
# R-flight: sent at 30 s with ttl 60: still in flight when the logs end
request(30 * S, "R-flight", ["2"], ttl=60)
svc("2", 40 * S, "rmb.peer.delivered", "R-flight", cmd="block.verify", src="1")

for name, rows in lines.items():
    rows.sort(key=lambda r: r[0])
    (HERE / name).write_text("".join(r[1] + "\n" for r in rows))
