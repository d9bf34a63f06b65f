"""The trace report on hand-made event logs with known answers (tests/data/eventlogs, scenario
in make_logs.py there): every table is checked against the scenario's true times.

One session-scoped SparkSession on local[1] (shuffle partitions 1, UI off, UTC) serves all
Spark tests here; the report runs once per input kind (JSON, compacted Parquet) and the tests
read its Parquet output with pyarrow."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

DATA = Path(__file__).parent / "data" / "eventlogs"
LOGS = sorted(str(p) for p in DATA.glob("*.jsonl"))


@pytest.fixture(scope="module")
def report(spark, tmp_path_factory):
    from spark.report import run
    out = tmp_path_factory.mktemp("report")
    summary = run(LOGS, str(out), spark=spark, strict=True)
    return summary, out


def table(out: Path, name: str):
    import pyarrow.parquet as pq
    return pq.read_table(out / f"{name}.parquet").to_pylist()


def nearest_rank(values, q):
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


# ------------------------------------------------------------------ ingest and clock

def test_ingest_counts_torn_unknown_untraced(report):
    summary, _ = report
    ing = summary["ingest"]
    assert ing["torn_lines"] == 1
    assert list(ing["torn_files"]) == [f"file://{DATA / 'r1.jsonl'}"]
    assert ing["bad_lines"] == 0
    assert ing["unknown_events"] == {"rmb.relay.teleported": 1}
    assert ing["untraced_events"] == {"rmb.peer.connected": 1, "rmb.relay.connected": 1}
    assert summary["traces"] == {"rmb": 11, "remp": 4, "marlin": 1}


def test_clock_skew_proven_and_corrected(report):
    summary, out = report
    clock = summary["clock"]
    # twin 22 logs 500 ms behind: relay r1 -> 22 min delta -496, 22 -> r1 +504; midpoint 500
    assert clock["consistent"] is True
    assert clock["corrections_ms"] == {"22": 500.0}
    assert table(out, "clock") == [{"node": "22", "correction_ms": 500.0}]
    pairs = {(p["from"], p["to"]): p["min_delta_ms"] for p in clock["pairs"]}
    assert pairs[("r1.local", "22")] == -496.0 and pairs[("22", "r1.local")] == 504.0
    assert pairs[("r1.local", "11")] == 3.0          # no skew there: nothing corrected
    stages = {(r["trace_id"], r["stage"]): r for r in table(out, "stages")}
    assert stages[("uid-ok", "relay_to_peer")]["duration_ms"] == 4.0
    assert stages[("uid-ok", "peer_to_relay_resp")]["duration_ms"] == 4.0
    assert stages[("uid-ok", "service")]["duration_ms"] == 9.0
    assert stages[("uid-ok", "request_delivery")]["duration_ms"] == 11.0
    assert stages[("uid-ok", "service")]["from_ts"].isoformat() == "2026-11-20T10:00:00.011000"


# ------------------------------------------------------------------ traces

UID_OK_HOPS = [  # (step, node, true ms)
    ("app.requested", "11", 0), ("peer.sent.req", "11", 2), ("relay.received.req", "r1.local", 5),
    ("relay.delivered.req", "r1.local", 6), ("peer.received.req", "22", 10),
    ("peer.delivered", "22", 11), ("app.handled", "22", 20), ("peer.sent.resp", "22", 22),
    ("relay.received.resp", "r1.local", 26), ("relay.delivered.resp", "r1.local", 27),
    ("peer.received.resp", "11", 30), ("peer.answered", "11", 31), ("app.replied", "11", 33)]


def test_hops_ordered_across_processes_with_time_spent(report):
    _, out = report
    hops = sorted((h for h in table(out, "hops") if h["trace_id"] == "uid-ok"),
                  key=lambda h: h["seq"])
    assert [(h["step"], h["node"]) for h in hops] == [("rmb:" + s, n) for s, n, _ in UID_OK_HOPS]
    assert [h["seq"] for h in hops] == list(range(1, 14))
    times = [t for _, _, t in UID_OK_HOPS]
    assert [h["spent_ms"] for h in hops[:-1]] == [float(b - a) for a, b in zip(times, times[1:])]
    assert hops[-1]["spent_ms"] is None
    assert hops[4]["ts"].isoformat() == "2026-11-20T10:00:00.010000"   # corrected clock


def test_missing_stage(report):
    _, out = report
    st = {r["stage"]: r["duration_ms"] for r in table(out, "stages") if r["trace_id"] == "uid-missing"}
    assert "app_to_peer" not in st and "peer_to_relay" not in st
    assert st["round_trip"] == 43.0 and st["relay_transit"] == 1.0 and st["service"] == 19.0


def test_duplicate_events(report):
    summary, out = report
    hops = {h["step"]: h for h in table(out, "hops") if h["trace_id"] == "uid-dup"}
    assert (hops["rmb:relay.delivered.req"]["n"], hops["rmb:relay.delivered.req"]["dup"]) == (2, 1)
    assert (hops["rmb:peer.received.req"]["n"], hops["rmb:peer.received.req"]["dup"]) == (2, 1)
    st = {r["stage"]: r["duration_ms"] for r in table(out, "stages") if r["trace_id"] == "uid-dup"}
    assert st["relay_to_peer"] == 4.0       # first occurrences
    # REMP statuses from two validators and the multi-destination deliveries are not duplicates
    assert {p: d["duplicates"] for p, d in summary["delivery"].items()} == {
        "rmb": 2, "remp": 0, "marlin": 0}


def test_multi_destination_branches(report):
    _, out = report
    rows = [r for r in table(out, "stages") if r["trace_id"] == "uid-multi"]
    rt = {r["branch"]: r["duration_ms"] for r in rows if r["stage"] == "round_trip"}
    assert rt == {"22": 43.0, "33": 63.0}
    svc = {r["branch"]: r["duration_ms"] for r in rows if r["stage"] == "service"}
    assert svc == {"22": 19.0, "33": 39.0}
    # r1's two deliveries of responses to 11 carry no src: not attributed to a branch
    assert not [r for r in rows if r["stage"] == "relay_to_peer_resp"]
    out_by = {r["branch"]: r["outcome"] for r in table(out, "delivery") if r["trace_id"] == "uid-multi"}
    assert out_by == {"22": "answered", "33": "answered"}


def test_app_trace_under_its_own_ref(report):
    """The app logs under its ref, the peers and relays under the envelope uid: the round
    trip comes from the app's trace, delivery from the envelope's, nothing counted twice."""
    _, out = report
    st = {(r["trace_id"], r["stage"]): r["duration_ms"] for r in table(out, "stages")
          if r["trace_id"] in ("ref-app", "uid-env")}
    assert st[("ref-app", "round_trip")] == 33.0
    assert ("uid-env", "round_trip") not in st and st[("uid-env", "relay_to_peer")] == 4.0
    assert [r["trace_id"] for r in table(out, "delivery") if r["trace_id"] in ("ref-app", "uid-env")] \
        == ["uid-env"]


def test_federation_hops(report):
    _, out = report
    st = {r["stage"]: (r["duration_ms"], r["from_node"], r["to_node"])
          for r in table(out, "stages") if r["trace_id"] == "uid-fed"}
    assert st["federation"] == (4.0, "r1.local", "r2.local")
    assert st["federation_ack"] == (3.0, "r2.local", "r1.local")
    assert st["relay_to_peer"] == (4.0, "r2.local", "44")
    assert st["federation_resp"] == (4.0, "r2.local", "r1.local")
    assert st["relay_to_peer_resp"] == (16.0, "r1.local", "11")
    assert st["round_trip"][0] == 60.0


# ------------------------------------------------------------------ aggregates

def test_latency_table(report):
    summary, out = report
    lat = {(r["protocol"], r["stage"]): r for r in table(out, "latency")}
    assert lat == {(r["protocol"], r["stage"]): r for r in summary["latency"]}
    # expired reply excluded; ref-app: the app's own trace
    expect = {("rmb", "round_trip"): [33, 43, 63, 23, 43, 33, 60, 33],
              ("remp", "finalized"): [8000, 30000], ("remp", "first_receipt"): [180, 180],
              ("remp", "to_queue"): [150, 150, 150], ("remp", "to_first_validator"): [3],
              ("marlin", "rebuild"): [35, 50],
              ("marlin", "first_chunk"): [20, 25], ("rmb", "federation"): [4]}
    for key, vals in expect.items():
        row = lat[key]
        assert row["count"] == len(vals), key
        assert row["p50_ms"] == nearest_rank(vals, 0.5), key
        assert row["p90_ms"] == nearest_rank(vals, 0.9), key
        assert row["p99_ms"] == nearest_rank(vals, 0.99), key
        assert row["max_ms"] == max(vals), key
    assert lat[("rmb", "round_trip")]["e2e"] and not lat[("rmb", "service")]["e2e"]


def test_delivery_table(report):
    summary, out = report
    rows = {r["protocol"]: r for r in table(out, "delivery_summary")}
    expect = {
        "rmb": dict(branches=11, sent=11, delivered=9, answered=7, errored=1, expired=1,
                    lost_or_stuck=1, in_flight=1, duplicates=2),
        "remp": dict(branches=4, sent=4, delivered=3, answered=2, errored=1, expired=1,
                     lost_or_stuck=0, in_flight=0, duplicates=0),
        "marlin": dict(branches=2, sent=2, delivered=2, answered=2, errored=0, expired=0,
                       lost_or_stuck=0, in_flight=0, duplicates=0)}
    for proto, want in expect.items():
        assert {k: rows[proto][k] for k in want} == want, proto
        assert {k: summary["delivery"][proto][k] for k in want} == want, proto
    per = {r["trace_id"]: r["outcome"] for r in table(out, "delivery") if r["protocol"] == "rmb"}
    assert per == {"uid-ok": "answered", "uid-multi": "answered", "uid-expired": "expired",
                   "uid-error": "errored", "uid-missing": "answered", "uid-dup": "answered",
                   "uid-lost": "lost_or_stuck", "uid-fed": "answered",
                   "uid-inflight": "in_flight", "uid-env": "answered"}   # not ref-app
    remp = {r["trace_id"][:2]: r["outcome"] for r in table(out, "delivery") if r["protocol"] == "remp"}
    assert remp == {"a1": "answered", "b2": "errored", "c3": "answered", "d4": "expired"}
    errors = {(r["protocol"], r["code"]): r["count"] for r in table(out, "delivery_errors")}
    assert errors == {("rmb", "101"): 1, ("remp", "RejectedByFullnode"): 1}
    assert summary["delivery"]["rmb"]["errored_by_code"] == {"101": 1}


def test_sla(report):
    summary, out = report
    sla = {s["name"]: s for s in summary["sla"]}
    assert {n: s["status"] for n, s in sla.items()} == {
        "rmb-round-trip-p99": "pass", "rmb-delivery-rate": "fail",
        "remp-first-receipt-p99": "pass", "remp-finalized-p99": "fail",
        "remp-finalized-ratio": "fail", "marlin-rebuild-p99": "pass"}
    assert sla["rmb-round-trip-p99"]["actual"] == 63.0
    assert sla["rmb-round-trip-p99"]["budget_used"] == 0.0
    # 7 answered of 10 finished (1 in flight): (1 - 0.7) / (1 - 0.99)
    assert sla["rmb-delivery-rate"]["actual"] == 0.7
    assert sla["rmb-delivery-rate"]["budget_used"] == pytest.approx(0.3 / 0.01, rel=1e-5)
    # 2 of 4 finished REMP messages finalized (M4 timed out: remp.fullnode.final), one of
    # them after 25 s
    assert sla["remp-finalized-ratio"]["actual"] == 0.5
    assert sla["remp-finalized-p99"]["actual"] > 25000
    assert sla["marlin-rebuild-p99"]["actual"] == 50.0
    assert len(table(out, "sla")) == 6


def test_report_files_and_self_contained_html(report):
    summary, out = report
    for name in ("hops", "stages", "delivery", "latency", "delivery_errors", "sla", "clock",
                 "delivery_summary"):
        assert list((out / f"{name}.parquet").glob("*.parquet")), name
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["delivery"] == json.loads(json.dumps(summary["delivery"]))
    assert on_disk["sla"] == json.loads(json.dumps(summary["sla"], default=str))
    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") >= 3
    for ref in ("http://", "https://", "<script", "<link", " src=", "@import", "//cdn"):
        assert ref not in page, ref
    assert not re.search(r"url\((?!#)", page)      # only in-page references (clip paths)
    assert "rmb-round-trip-p99" in page
    # the slowest traces: full ids, an anchor each
    assert "id='trace-uid-multi'" in page and "id='trace-0a0b0c0d:0x" in page
    assert "id='trace-c3c3" in page
    assert "<details><summary>Inputs" in page


# ------------------------------------------------------------------ strictness, Parquet path

def test_bad_ts_fails_strict_and_is_counted_permissive(spark, tmp_path):
    from spark.report import run
    bad = [str(DATA / "bad" / "python-logging-ts.jsonl")]
    with pytest.raises(ValueError, match="RFC 3339"):
        run(bad, str(tmp_path / "strict"), spark=spark, strict=True)
    summary = run(bad, str(tmp_path / "lenient"), spark=spark)
    assert summary["ingest"]["bad_lines"] == 1
    assert "2026-11-20 10:00:00,123" in summary["ingest"]["bad_samples"][0]["line"]
    assert summary["traces"] == {} and summary["delivery"] == {}
    assert {s["status"] for s in summary["sla"]} == {"no data"}


def test_parquet_cache_gives_the_same_report(spark, report, tmp_path):
    """--parquet-cache: the logs are compacted (spark/compact.py) and the report reads that."""
    from spark.report import run
    cache = tmp_path / "cache"
    summary = run(LOGS, str(tmp_path / "out"), spark=spark, strict=True,
                  parquet_cache=str(cache))
    assert summary["inputs"] == [f"{cache}/events.parquet"] and "compact_s" in summary["timings"]
    assert list((cache / "events.parquet").glob("*.parquet"))
    want, _ = report
    assert summary["ingest"]["torn_lines"] == 1 and summary["ingest"]["unknown_events"] == {
        "rmb.relay.teleported": 1}
    assert summary["ingest"]["torn_files"] == want["ingest"]["torn_files"]   # source kept
    assert summary["delivery"] == want["delivery"]
    assert summary["latency"] == want["latency"]
    assert summary["sla"] == want["sla"]
    assert summary["clock"]["corrections_ms"] == want["clock"]["corrections_ms"]


# ------------------------------------------------------------------ the live local route

def test_forwarded_is_both_relay_steps(spark, tmp_path):
    """`rmb.relay.forwarded` (the relay's one event on the live local route) is read as
    relay.received and relay.delivered of its leg at one ts: the stages around the relay
    are measured, the response is attributed to the responder's branch, and the request
    counts as sent and answered. A two-destination request: the relay forwards to 22 and
    queues for 33 (received + queued + delivered), so both event shapes meet in one trace;
    33's response is delivered after a lookup with `kind` and `src`, which put it on 33's
    branch (older logs without them leave a multi-destination response unattributed)."""
    from spark.report import run

    def line(ms, service, node, event, **attrs):
        ts = f"2026-11-20T10:00:00.{ms * 1000:06d}Z"
        return json.dumps({"ts": ts, "level": "info", "service": service, "node": node,
                           "event": event, "trace_id": "uid-fwd", "attrs": attrs})

    fwd = lambda ms, **a: line(ms, "rmb-relay", "r1.local", "rmb.relay.forwarded", **a)  # noqa: E731
    rows = [
        line(0, "rmb-peer", "11", "rmb.peer.sent", kind="request", dst="22", size=200,
             encrypted=True, relay="r1.local"),
        line(1, "rmb-peer", "11", "rmb.peer.sent", kind="request", dst="33", size=200,
             encrypted=True, relay="r1.local"),
        fwd(3, kind="request", src="11", dst="22", size=200),
        line(4, "rmb-relay", "r1.local", "rmb.relay.received", kind="request", src="11",
             dst="33", size=200),
        line(5, "rmb-relay", "r1.local", "rmb.relay.queued", dst="33", size=200),
        line(7, "rmb-peer", "22", "rmb.peer.received", kind="request", src="11", size=200,
             relay="r1.local"),
        line(8, "rmb-peer", "22", "rmb.peer.delivered", cmd="calc.add", src="11"),
        line(20, "rmb-peer", "22", "rmb.peer.sent", kind="response", dst="11", size=100,
             encrypted=True, relay="r1.local"),
        fwd(24, kind="response", src="22", dst="11", size=100),
        line(27, "rmb-peer", "11", "rmb.peer.received", kind="response", src="22", size=100,
             relay="r1.local"),
        line(28, "rmb-peer", "11", "rmb.peer.answered", src="22", code=0),
        line(45, "rmb-relay", "r1.local", "rmb.relay.delivered", kind="request", src="11",
             dst="33", size=200, queued_ms=40.0),
        line(48, "rmb-peer", "33", "rmb.peer.received", kind="request", src="11", size=200,
             relay="r1.local"),
        line(60, "rmb-peer", "33", "rmb.peer.sent", kind="response", dst="11", size=100,
             encrypted=True, relay="r1.local"),
        # the response from 33 after a lookup (not the live route): received + delivered,
        # both with kind and src, so the delivery is 33's branch, not `?`
        line(63, "rmb-relay", "r1.local", "rmb.relay.received", kind="response", src="33",
             dst="11", size=100),
        line(64, "rmb-relay", "r1.local", "rmb.relay.delivered", kind="response", src="33",
             dst="11", size=100, queued_ms=0.0),
        line(66, "rmb-peer", "11", "rmb.peer.received", kind="response", src="33", size=100,
             relay="r1.local"),
        line(67, "rmb-peer", "11", "rmb.peer.answered", src="33", code=0),
    ]
    log = tmp_path / "fwd.jsonl"
    log.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    summary = run([str(log)], str(out), spark=spark, strict=True)
    assert summary["ingest"]["unknown_events"] == {}
    st = {(r["branch"], r["stage"]): r["duration_ms"] for r in table(out, "stages")}
    assert st[("22", "peer_to_relay")] == 3.0 and st[("22", "relay_transit")] == 0.0
    assert st[("22", "relay_to_peer")] == 4.0
    assert st[("22", "peer_to_relay_resp")] == 4.0 and st[("22", "relay_transit_resp")] == 0.0
    assert st[("22", "relay_to_peer_resp")] == 3.0
    # measured without rmb.peer.received (which rmb-peer logs at debug only)
    assert st[("22", "relay_to_service")] == 5.0 and st[("22", "relay_to_app")] == 4.0
    assert st[("33", "relay_queue")] == 40.0 and st[("33", "relay_transit")] == 41.0
    assert st[("33", "relay_transit_resp")] == 1.0 and st[("33", "relay_to_peer_resp")] == 2.0
    hops = [(h["branch"], h["step"]) for h in sorted(table(out, "hops"), key=lambda h: h["seq"])]
    assert ("22", "rmb:relay.received.req") in hops and ("22", "rmb:relay.delivered.resp") in hops
    assert ("33", "rmb:relay.delivered.resp") in hops
    assert not [h for h in hops if h[0] == "?"]
    outcome = {r["branch"]: r["outcome"] for r in table(out, "delivery")}
    assert outcome == {"22": "answered", "33": "answered"}


def test_step_rows_generated_methods_fit_the_jit_limit(spark):
    """Whole-stage codegen of the map side (scan, rules, explode, shuffle write) makes no
    method above HotSpot's 8,000-byte limit for JIT compilation (-XX:+DontCompileHugeMethods,
    the default): such a method runs interpreted for the whole job. All the rules in one CASE
    made a 14 KB method; steps_exprs splits them into groups of RULES_PER_GENERATOR."""
    from spark.report import REPORT_SQL_CONF, _step_rows
    # as for large input: whole-stage codegen, and no AQE (its plan is codegen'd only when run)
    conf = {**REPORT_SQL_CONF, "spark.sql.codegen.wholeStage": "true",
            "spark.sql.adaptive.enabled": "false"}
    old = {k: spark.conf.get(k, None) for k in conf}
    try:
        for key, value in conf.items():
            spark.conf.set(key, value)
        st = _step_rows(spark, LOGS).repartition("trace_id")
        plan = st._jdf.queryExecution().executedPlan()
        subtrees = spark._jvm.org.apache.spark.sql.execution.debug.package.codegenStringSeq(plan)
        sizes = [subtrees.apply(i)._3().maxMethodCodeSize() for i in range(subtrees.size())]
    finally:
        for key, value in old.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    assert sizes and max(sizes) <= 8000, sizes
