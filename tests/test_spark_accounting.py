"""The outcome rule of issue #10 and the demo plan, on hand-made logs with known answers
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
