"""The report page rendered in headless Chromium (scripts/report_screenshot.py), from a
summary built by hand (no Spark): the PNG exists and is a real page-sized image. Skips when
Chromium is not installed (Debian: apt-get install -y chromium)."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest
from tests.script_module import load

REPO = Path(__file__).resolve().parent.parent


def _script():
    return load("scripts/report_screenshot.py")


def _summary():
    sla = [{"name": "rmb-round-trip-p99", "protocol": "rmb", "stage": "round_trip",
            "counts": "unplanned requests (per destination): stage round_trip",
            "target_text": "p99 <= 2000 ms", "target": 2000.0, "unit": "ms", "actual": 12.5,
            "samples": 3, "status": "pass", "passed": True, "budget_used": 0.0}]
    d = {"sent": 3, "delivered": 3, "answered": 2, "errored": 0, "expired": 1,
         "lost_or_stuck": 0, "in_flight": 0, "late": 1}
    return {
        "inputs": ["a.jsonl"], "traces": {"rmb": 3}, "sla": sla,
        "delivery": {"rmb": {**d, "planned": {**d, "answered": 0, "sent": 1},
                             "unplanned": {**d, "expired": 0}}},
        "failures": {"planned": [{"protocol": "rmb", "trace_id": "uid-1", "branch": "2",
                                  "outcome": "expired", "error_code": None, "late": True}],
                     "unplanned": []},
        "plan": {"labels": {"2": "bob"}, "faults": []},
        "latency": [{"protocol": "rmb", "stage": "round_trip", "e2e": True, "count": 3,
                     "p50_ms": 10.0, "p90_ms": 12.0, "p99_ms": 12.5, "max_ms": 12.5},
                    {"protocol": "rmb", "stage": "relay_transit", "e2e": False, "count": 3,
                     "p50_ms": 0.0, "p90_ms": 0.0, "p99_ms": 0.1, "max_ms": 0.1}],
        "clock": {"consistent": True, "corrections_ms": {}, "proofs": [], "tolerance_ms": 5.0},
        "ingest": {"torn_lines": 0, "bad_lines": 0, "unknown_events": {}, "untraced_events": {}},
    }


def test_page_reads_right_and_screenshots(tmp_path):
    from spark.page import render
    page = render(_summary(), [])
    assert "<details><summary>Inputs" in page                # inputs collapsed
    assert "All 1 SLA objectives with data pass" in page      # no false alarm
    assert "No clock skew proven" in page and "consistent:" not in page
    assert "bob" in page                                      # plan label, not "2"
    # the latency table covers every message, planned faults included, and says so
    assert "planned faults included" in page.split("<h2>Latency</h2>", 1)[1].split("<h2>", 1)[0]
    mod = _script()
    if mod.find_chromium() is None:
        pytest.skip("chromium not installed (Debian: apt-get install -y chromium)")
    html = tmp_path / "report.html"
    html.write_text(page)
    png = mod.screenshot(html, tmp_path / "shot.png", 1000, 1200)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1000, 1200)
    assert len(data) > 20_000        # a rendered page, not a blank image
