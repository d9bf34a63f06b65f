"""The trace report's per-full-node REMP table: messages each full node accepted and its
refusals for load (remp.fullnode.refused lines, summed by reason), apart from failures."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.spark


def line(ts: str, node: str, event: str, trace_id: str | None, **attrs) -> str:
    d = {"ts": f"2026-11-22T12:00:{ts}Z", "level": "info", "service": "remp-fullnode", "node": node,
         "event": event, "attrs": attrs}
    if trace_id:
        d["trace_id"] = trace_id
    return json.dumps(d)


def test_refusals_per_full_node_apart_from_failures(spark, tmp_path):
    from spark.report import run
    m1, m2, m3 = "11" * 32, "22" * 32, "33" * 32
    (tmp_path / "fullnode1.jsonl").write_text("\n".join([
        line("00.000000", "fa", "remp.fullnode.received", m1, size=200, shard="0:8000000000000000"),
        line("00.100000", "fa", "remp.fullnode.received", m2, size=200, shard="0:8000000000000000"),
        line("00.200000", "fa", "remp.fullnode.refused", None, reason="pending_full", count=3, retry_after=2),
        line("01.300000", "fa", "remp.fullnode.refused", None, reason="pending_full", count=2, retry_after=1),
        line("02.000000", "fa", "remp.fullnode.final", m1, outcome="finalized", kind="Finalized", count=1,
             duration_ms=2000.0, shard="0:8000000000000000"),
        line("02.100000", "fa", "remp.fullnode.final", m2, outcome="finalized", kind="Finalized", count=1,
             duration_ms=2000.0, shard="0:8000000000000000"),
    ]) + "\n")
    (tmp_path / "fullnode2.jsonl").write_text("\n".join([
        line("00.050000", "fb", "remp.fullnode.received", m3, size=200, shard="0:8000000000000000"),
        line("00.500000", "fb", "remp.fullnode.refused", None, reason="client_rate", count=4, retry_after=1),
        line("02.050000", "fb", "remp.fullnode.final", m3, outcome="finalized", kind="Finalized", count=1,
             duration_ms=2000.0, shard="0:8000000000000000"),
    ]) + "\n")
    out = tmp_path / "out"
    summary = run([str(tmp_path / "fullnode1.jsonl"), str(tmp_path / "fullnode2.jsonl")], str(out),
                  spark=spark, strict=True)
    assert summary["remp_fullnodes"] == [
        {"full_node": "fa", "accepted": 2, "refused_for_load": 5, "refused_pending_full": 5,
         "refused_client_rate": 0},
        {"full_node": "fb", "accepted": 1, "refused_for_load": 4, "refused_pending_full": 0,
         "refused_client_rate": 4}]
    # refusals are no failures and no traces
    assert summary["remp"]["messages"] == 3 and summary["remp"]["outcomes"]["finalized"] == 3
    assert not [f for f in summary["failures"]["unplanned"] if f["protocol"] == "remp"]
    assert "remp.fullnode.refused" not in summary["ingest"]["untraced_events"]
    page = (out / "report.html").read_text()
    assert "REMP full nodes" in page and "refused_pending_full" in page
