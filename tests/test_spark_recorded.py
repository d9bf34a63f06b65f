"""The trace report on event logs recorded from a real run of the daemons
(tests/data/recorded/rmb-demo, see its README): its counts equal what the raw lines say,
counted here independently in plain Python, and the traces follow the real hops."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

RUN = Path(__file__).parent / "data" / "recorded" / "rmb-demo"


def lines():
    for path in sorted(RUN.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            yield json.loads(line)


@pytest.fixture(scope="module")
def recorded(spark, tmp_path_factory):
    from spark.report import run
    out = tmp_path_factory.mktemp("recorded")
    summary = run(sorted(str(p) for p in RUN.glob("*.jsonl")), str(out), spark=spark, strict=True)
    return summary, out


def test_counts_equal_the_raw_lines(recorded):
    summary, _ = recorded
    events = list(lines())
    requested = {e["trace_id"]: e["attrs"]["count"] for e in events if e["event"] == "rmb.app.requested"}
    replies = [e for e in events if e["event"] == "rmb.app.replied"]
    codes = Counter(e["attrs"]["code"] for e in replies)
    rmb = summary["delivery"]["rmb"]
    assert summary["traces"]["rmb"] == len(requested) == 51
    assert rmb["sent"] == sum(requested.values()) == 57
    assert rmb["answered"] == codes[0]
    assert rmb["expired"] == codes[102]
    assert {int(k): v for k, v in rmb["errored_by_code"].items() if int(k) != 102} == \
        {c: n for c, n in codes.items() if c not in (0, 102)}
    assert rmb["lost_or_stuck"] == 0 and rmb["duplicates"] == 0
    assert summary["ingest"]["torn_lines"] == 0 and summary["ingest"]["bad_lines"] == 0


def test_a_federated_trace_has_the_real_hops_in_order(recorded):
    import pyarrow.parquet as pq
    _, out = recorded
    events = list(lines())
    fed = [e["trace_id"] for e in events if e["event"] == "rmb.relay.federation_received"]
    hops = [h for h in pq.read_table(out / "hops.parquet").to_pylist() if h["trace_id"] == fed[0]]
    steps = [h["step"] for h in sorted(hops, key=lambda h: h["seq"])]
    # app -> peer -> relay 1 -> federation -> relay 2 -> peer -> service, and back the same way
    path = ["rmb:app.requested", "rmb:peer.sent.req", "rmb:relay.received.req",
            "rmb:relay.fed_received.req", "rmb:relay.delivered.req", "rmb:peer.delivered",
            "rmb:app.handled", "rmb:peer.sent.resp", "rmb:relay.received.resp",
            "rmb:relay.fed_received.resp", "rmb:relay.delivered.resp", "rmb:peer.answered",
            "rmb:app.replied"]
    assert [s for s in steps if s in path] == path, steps
    relays = {h["node"] for h in hops if h["step"].startswith("rmb:relay.")}
    assert len(relays) == 2  # both relays of the federation appear in the trace
    assert all(h["spent_ms"] is None or h["spent_ms"] >= 0 for h in hops)
    assert steps[-1] == "rmb:app.replied"


def test_round_trip_latency_is_reported_for_rmb(recorded):
    summary, _ = recorded
    rows = [r for r in summary["latency"] if r["protocol"] == "rmb" and r.get("e2e")]
    assert rows, summary["latency"]
    for r in rows:
        assert r["count"] > 0 and 0 <= r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"] <= r["max_ms"]
