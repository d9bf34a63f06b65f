"""REMP and Marlin in the trace report on hand-made logs with
known answers (tests/data/eventlogs/remp_marlin, scenario in make_logs.py there)."""
from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

DATA = Path(__file__).parent / "data" / "eventlogs" / "remp_marlin"
LOGS = sorted(str(p) for p in DATA.glob("*.jsonl"))
M1, M2, M3, M4 = ("11" * 32, "22" * 32, "33" * 32, "44" * 32)
B1, B2, B3 = "0000abcd:0x" + "01" * 20, "0000beef:0x" + "01" * 20, "0000cafe:0x" + "01" * 20


@pytest.fixture(scope="module")
def report(spark, tmp_path_factory):
    from spark.report import run
    out = tmp_path_factory.mktemp("remp_marlin")
    return run(LOGS, str(out), spark=spark, strict=True), out


def table(out, name):
    import pyarrow.parquet as pq
    return pq.read_table(out / f"{name}.parquet").to_pylist()


def test_remp_summary(report):
    summary, _ = report
    assert summary["remp"] == {
        "messages": 4,
        "outcomes": {"finalized": 2, "rejected": 1, "timeout": 0, "none": 1},
        "lost_or_stuck": 1, "in_flight": 0,
        "receipts_produced": 7, "receipts_delivered": 6, "duplicates": 1}
    assert [(f["trace_id"], f["outcome"]) for f in summary["failures"]["unplanned"]
            if f["protocol"] == "remp"] == [(M3, "lost_or_stuck")]
    assert [(f["trace_id"], f["outcome"]) for f in summary["failures"]["planned"]
            if f["protocol"] == "remp"] == [(M2, "errored")]


def test_remp_stages(report):
    _, out = report
    st = {(r["trace_id"], r["stage"]): r["duration_ms"] for r in table(out, "stages")
          if r["protocol"] == "remp"}
    assert st[(M1, "first_receipt")] == 60.0 and st[(M4, "first_receipt")] == 40.0
    assert st[(M2, "first_receipt")] == 200.0
    assert st[(M1, "first_put_into_queue")] == 60.0
    assert st[(M1, "included_into_block")] == 1010.0
    assert st[(M1, "included_into_accepted_block")] == 3010.0
    assert st[(M1, "finalized")] == 6000.0 and st[(M4, "finalized")] == 5000.0
    assert (M3, "first_receipt") not in st


def test_marlin_summary_and_stages(report):
    summary, out = report
    assert summary["marlin"] == {
        "blocks": 3, "rebuilt": 2, "disputes": 1, "chunks_sent": 12, "chunks_received": 10,
        "acks": 11, "chunks_lost": 3, "missing_acks": 1, "lost_or_stuck": 1}
    # chunks lost are B3's three for k1, which never rebuilt it; B1's chunks that k2 never got
    # arrived after (or were not needed for) its rebuild and are not lost
    assert [(f["trace_id"], f["outcome"]) for f in summary["failures"]["unplanned"]
            if f["protocol"] == "marlin"] == [(B3, "lost_or_stuck")]
    st = {(r["trace_id"], r["branch"], r["stage"]): r["duration_ms"] for r in table(out, "stages")
          if r["protocol"] == "marlin"}
    assert st[(B1, "k1", "rebuild")] == 40.0 and st[(B1, "k2", "rebuild")] == 60.0
    assert st[(B1, "k1", "to_cluster")] == 5.0              # producer -> first member
    assert st[(B1, "k1", "member_to_consumer")] == 15.0     # first member -> consumer
    assert [(f["trace_id"], f["branch"]) for f in summary["failures"]["planned"]
            if f["protocol"] == "marlin"] == [(B2, "k1")]


def test_remp_marlin_sla(report):
    summary, _ = report
    sla = {s["objective"]: s for s in summary["sla"]}
    assert (sla["remp-first-receipt-p99"]["value"], sla["remp-first-receipt-p99"]["ok"]) == (60.0, True)
    assert (sla["remp-finalized-p99"]["value"], sla["remp-finalized-p99"]["ok"]) == (6000.0, True)
    # unplanned finished messages M1, M3 (lost), M4: 2 of 3 finalized
    ratio = sla["remp-finalized-ratio"]
    assert (ratio["samples"], ratio["value"], ratio["ok"]) == (3, 0.666667, False)
    assert (sla["marlin-rebuild-p99"]["value"], sla["marlin-rebuild-p99"]["ok"]) == (60.0, True)
    # no RMB in these logs
    assert sla["rmb-round-trip-p99"]["status"] == "no data"


def test_trace_lookup_prints_hops(report):
    from spark.report import trace_lookup
    _, out = report
    text = trace_lookup(str(out), M1)
    assert "fullnode.received" in text and "fullnode.Finalized" in text
    assert "v1" in text          # validator a1b2 by its plan label
    with pytest.raises(KeyError):
        trace_lookup(str(out), "no-such-trace")


@pytest.mark.parametrize("peers_in_step_table", [True, False])
def test_a_block_sent_to_the_killed_member_is_planned(spark, tmp_path, monkeypatch,
                                                      peers_in_step_table):
    """spark/plan.py: a step's `peer` counts as touching that node. Block K1 had a chunk sent
    to member m9 while the plan had m9 killed: planned, so the rebuild SLA does not judge it;
    block K2, sent to m1 only, is judged. Block K0 also went to m9, but was rebuilt before
    the kill: its life ended before the window although its 30 s TTL did not, so it is judged
    (with [start, deadline] it was planned: in the demo every REMP message could be).
    Both ways of getting the trace's peers: in the step table (small input) and the second
    pass over the input (spark/report.py _trace_peers, large input)."""
    import json
    from spark import report
    from spark.report import run
    if not peers_in_step_table:
        monkeypatch.setattr(report, "PEERS_IN_STEP_TABLE_MAX_BYTES", -1)

    def line(ts, service, node, event, trace, **attrs):
        return json.dumps({"ts": f"2026-11-22T12:00:{ts:09.6f}Z", "level": "info", "service": service,
                           "node": node, "event": event, "trace_id": trace, "attrs": attrs})
    m1, m9, p = "0x" + "a1" * 20, "0x" + "a9" * 20, "0x" + "01" * 20
    k0, k1, k2 = "00009999:" + p, "0000aaaa:" + p, "0000bbbb:" + p
    (tmp_path / "demo-plan.jsonl").write_text("\n".join([
        line(0.5, "relay-suite-demo", "launcher", "demo.plan.node", None, target="m9", peer=m9, kind="marlin-cluster"),
        line(1.0, "relay-suite-demo", "launcher", "demo.plan.fault", None, fault="member_kill", target="m9",
             duration_ms=3000.0),
        line(4.0, "relay-suite-demo", "launcher", "demo.plan.recovered", None, fault="member_kill", target="m9"),
    ]) + "\n")
    (tmp_path / "producer.jsonl").write_text("\n".join([
        line(0.2, "marlin-producer", p, "marlin.producer.chunk_sent", k0, chunk=0, cluster="c9", size=500, peer=m9),
        line(2.0, "marlin-producer", p, "marlin.producer.chunk_sent", k1, chunk=0, cluster="c9", size=500, peer=m9),
        line(2.0, "marlin-producer", p, "marlin.producer.chunk_sent", k1, chunk=1, cluster="c1", size=500, peer=m1),
        line(10.0, "marlin-producer", p, "marlin.producer.chunk_sent", k2, chunk=0, cluster="c1", size=500, peer=m1),
    ]) + "\n")
    (tmp_path / "consumer.jsonl").write_text("\n".join([
        line(0.3, "marlin-consumer", "k", "marlin.consumer.block_rebuilt", k0, count=2, size=1000, duration_ms=1.0),
        line(4.5, "marlin-consumer", "k", "marlin.consumer.block_rebuilt", k1, count=2, size=1000, duration_ms=1.0),
        line(10.05, "marlin-consumer", "k", "marlin.consumer.block_rebuilt", k2, count=2, size=1000, duration_ms=1.0),
    ]) + "\n")
    summary = run(sorted(str(x) for x in tmp_path.glob("*.jsonl")), str(tmp_path / "out"), spark=spark,
                  strict=True)
    sla = {s["objective"]: s for s in summary["sla"]}
    rebuild = sla["marlin-rebuild-p99"]
    assert rebuild["samples"] == 2 and rebuild["ok"], rebuild   # K0 and K2: 100 and 50 ms
