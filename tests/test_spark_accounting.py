"""The outcome rule (DESIGN.md section 6) and the demo plan, on hand-made logs with known answers
(tests/data/eventlogs/accounting, scenario in make_logs.py there)."""
from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

DATA = Path(__file__).parent / "data" / "eventlogs" / "accounting"
LOGS = sorted(str(p) for p in DATA.glob("*.jsonl"))


@pytest.fixture(scope="module")
def report(spark, tmp_path_factory):
    from spark.report import run
    out = tmp_path_factory.mktemp("accounting")
    return run(LOGS, str(out), spark=spark, strict=True), out


def outcomes(out):
    import pyarrow.parquet as pq
    return {(r["trace_id"], r["branch"]): (r["outcome"], r["error_code"], r["late"], r["planned"])
            for r in pq.read_table(out / "delivery.parquet").to_pylist()}


def test_each_request_is_decided_once_and_late_replies_are_counted_apart(report):
    summary, out = report
    assert outcomes(out) == {
        ("R-ok", "2"): ("answered", None, False, False),
        # the case: expired at its deadline, bob's reply came later (peer 102 rejected)
        ("R-late", "2"): ("expired", None, True, True),
        ("R-err", "4"): ("errored", "101", False, False),
        ("R-500", "4"): ("errored", "500", False, False),
        # only a reply after the deadline was logged: expired by rule, and late
        ("R-after", "2"): ("expired", None, True, False),
        ("R-multi", "2"): ("answered", None, False, False),
        ("R-multi", "3"): ("expired", None, True, True),
        ("R-flight", "2"): ("in_flight", None, False, False),
    }
    rmb = summary["delivery"]["rmb"]
    assert {k: rmb[k] for k in ("sent", "answered", "expired", "late", "in_flight",
                                "lost_or_stuck")} == dict(
        sent=8, answered=2, expired=3, late=3, in_flight=1, lost_or_stuck=0)
    # every code, keys as strings
    assert rmb["errored_by_code"] == {"101": 1, "500": 1}
    assert summary["traces"]["rmb"] == 7


def test_planned_failures_apart_from_unplanned(report):
    summary, _ = report
    rmb = summary["delivery"]["rmb"]
    assert (rmb["planned"]["expired"], rmb["unplanned"]["expired"]) == (2, 1)
    assert rmb["unplanned"]["errored_by_code"] == {"101": 1, "500": 1}
    assert {(f["trace_id"], f["branch"]) for f in summary["failures"]["planned"]} == {
        ("R-late", "2"), ("R-multi", "3")}
    assert {(f["trace_id"], f["branch"]) for f in summary["failures"]["unplanned"]} == {
        ("R-err", "4"), ("R-500", "4"), ("R-after", "2")}
    assert summary["plan"]["labels"]["relay1.local"] == "relay1"
    [fault] = summary["plan"]["faults"]
    assert (fault["fault"], fault["target"], fault["node"]) == ("twin_offline", "carol", "3")
    assert fault["end"] == "2026-11-22T09:00:26Z"


def test_sla_judges_unplanned_traffic_and_names_its_units(report):
    summary, _ = report
    sla = {s["objective"]: s for s in summary["sla"]}
    rate = sla["rmb-delivery-rate"]
    # unplanned finished requests: R-ok, R-err, R-500, R-after, R-multi/2 -> 2 answered of 5
    assert (rate["samples"], rate["value"], rate["ok"]) == (5, 0.4, False)
    assert rate["unit"] == "ratio" and rate["target"] == 0.99
    assert rate["counts"].startswith("finished unplanned requests")
    rt = sla["rmb-round-trip-p99"]
    assert rt["unit"] == "ms" and rt["target"] == 2000.0
    assert "fraction of the error budget" in rt["budget_unit"]


def test_otlp_output_parses_as_traces_data_one_trace_per_message(report):
    """The OTLP JSON lines parse with opentelemetry-proto's TracesData (protobuf json_format;
    OTLP/JSON ids are hex, which json_format reads as base64, so they are converted the way an
    OTLP receiver does), one trace per message, one span per hop."""
    import base64
    import json
    pytest.importorskip("opentelemetry.proto.trace.v1.trace_pb2")
    import pyarrow.parquet as pq
    from google.protobuf import json_format
    from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
    summary, out = report
    hops = pq.read_table(out / "hops.parquet").to_pylist()
    want = {}
    for h in hops:
        want[h["trace_id"]] = want.get(h["trace_id"], 0) + 1
    got = {}
    files = sorted((out / "traces.otlp").glob("part-*"))
    assert files
    for f in files:
        for line in f.read_text().splitlines():
            doc = json.loads(line)
            for rs in doc["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for sp in ss["spans"]:
                        for k in ("traceId", "spanId", "parentSpanId"):
                            sp[k] = base64.b64encode(bytes.fromhex(sp[k])).decode()
            td = json_format.Parse(json.dumps(doc), TracesData())
            spans = [sp for rs in td.resource_spans for ss in rs.scope_spans for sp in ss.spans]
            assert len({sp.trace_id for sp in spans}) == 1
            assert all(len(sp.trace_id) == 16 and len(sp.span_id) == 8 for sp in spans)
            attrs = {a.key: a.value.string_value for a in spans[0].attributes}
            tid = attrs["relay_suite.trace_id"]
            assert tid not in got
            got[tid] = len(spans)
            assert all(sp.end_time_unix_nano >= sp.start_time_unix_nano > 0 for sp in spans)
            # a chain: every span but the first has the previous one as parent
            assert sum(1 for sp in spans if not sp.parent_span_id) == 1
    assert got == want
    assert got["R-ok"] == 7   # requested, sent, relay received + delivered, delivered, answered, replied


def test_peers_from_a_second_pass_give_the_same_report(spark, report, tmp_path, monkeypatch):
    """Large input computes the traces' peers (the plan's fault targets) apart, only when
    the plan has faults (spark/report.py PEERS_IN_STEP_TABLE_MAX_BYTES, _trace_peers): the
    delivery table, planned flags included, and the failures are those of the step-table
    way (small input)."""
    from spark import report as rep
    summary, out = report
    monkeypatch.setattr(rep, "PEERS_IN_STEP_TABLE_MAX_BYTES", -1)
    other = rep.run(LOGS, str(tmp_path / "out"), spark=spark, strict=True)
    assert other["plan"]["faults"], "the scenario must have faults to read the peers"
    assert outcomes(tmp_path / "out") == outcomes(out)
    assert other["failures"] == summary["failures"] and other["delivery"] == summary["delivery"]
