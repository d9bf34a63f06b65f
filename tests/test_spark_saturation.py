"""The report on a saturated host: the launcher's CPU samples (deploy/events.py demo.cpu.*)
become a CPU timeline on the page, and an objective missed while the host was saturated is
reported as "missed, host saturated" with the busiest processes named, on the page, in
summary.json and in the launcher's one console line; an objective missed on a host that was
not saturated is plainly "missed", and the run still fails (the verdict explains, it
excuses nothing).

Logs generated here with known answers: 40 RMB requests from alice to bob, one a second.
The first 20 take 50 ms with the host 30% busy; the last 20 take 3,000 ms while the host is
97% busy, marlin-consumer1 (the demo's) at 150% of a core and stress[999] (not the demo) at
60%. Objectives: round trip p99 <= 2000 ms (missed: its breach is the slow requests, all
inside the saturated span: "missed, host saturated"), round trip p50 <= 10 ms (missed: its
breach is every request, on a host 65% busy on average: "missed"), answered >= 0.99 (met).
"""
from __future__ import annotations

import datetime as dt
import json
import struct
from pathlib import Path

import pytest
from tests.script_module import load

REPO = Path(__file__).resolve().parent.parent
BASE = dt.datetime(2026, 11, 22, 9, 0, 0, tzinfo=dt.timezone.utc)
SLA = """
[[objective]]
name = "rt-p99"
protocol = "rmb"
stage = "round_trip"
quantile = 0.99
max_ms = 2000

[[objective]]
name = "rt-p50-tight"
protocol = "rmb"
stage = "round_trip"
quantile = 0.5
max_ms = 10

[[objective]]
name = "rmb-delivery-rate"
protocol = "rmb"
rate = "answered"
min = 0.99
"""


def make_logs(d: Path) -> list[str]:
    files: dict[str, list] = {}

    def ev(name, ms, service, node, event, trace, **attrs):
        t = BASE + dt.timedelta(milliseconds=ms)
        files.setdefault(name, []).append((t, json.dumps(
            {"ts": t.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "level": "info", "service": service,
             "node": node, "event": event, "trace_id": trace, "attrs": attrs})))

    def plan(ms, event, **a):
        ev("demo-plan.jsonl", ms, "relay-suite-demo", "launcher", event, None, **a)

    for label, raw in (("alice", "1"), ("bob", "2")):
        plan(0, "demo.plan.node", target=label, peer=raw, kind="rmb-peer", host="h1")
    for i in range(40):
        t0 = 1000 + i * 1000
        took = 50 if i < 20 else 3000
        uid = f"R{i:02d}"
        ev("alice.jsonl", t0, "demo-client", "1", "rmb.app.requested", uid, cmd="block.verify",
           dst="2", count=1, size=100, ttl=30)
        ev("alice.jsonl", t0 + 1, "rmb-peer", "1", "rmb.peer.sent", uid, kind="request", dst="2",
           size=300, encrypted=False, relay="r1")
        ev("alice.jsonl", t0 + took - 1, "rmb-peer", "1", "rmb.peer.answered", uid, src="2", code=0)
        ev("alice.jsonl", t0 + took, "demo-client", "1", "rmb.app.replied", uid, src="2", code=0,
           size=10, duration_ms=float(took))
    # CPU samples, one a second from 0 to 46 s: idle-ish until 21 s, saturated after
    for s in range(1, 47):
        ms = s * 1000
        busy = s > 21
        if busy:
            ev("demo-cpu.jsonl", ms - 2, "relay-suite-demo", "launcher", "demo.cpu.process", None,
               target="marlin-consumer1", kind="demo", pid=41, core_pct=150.0)
            ev("demo-cpu.jsonl", ms - 1, "relay-suite-demo", "launcher", "demo.cpu.process", None,
               target="stress[999]", kind="other", pid=999, core_pct=60.0)
        ev("demo-cpu.jsonl", ms - 1, "relay-suite-demo", "launcher", "demo.cpu.process", None,
           target="launcher", kind="demo", pid=40, core_pct=20.0)
        ev("demo-cpu.jsonl", ms, "relay-suite-demo", "launcher", "demo.cpu.host", None,
           cpu_pct=97.0 if busy else 30.0, cores=2, demo_pct=85.0 if busy else 10.0,
           interval_ms=1000.0)
    for name, rows in files.items():
        rows.sort(key=lambda r: r[0])
        (d / name).write_text("".join(r[1] + "\n" for r in rows))
    return sorted(str(p) for p in d.glob("*.jsonl"))


@pytest.fixture(scope="module")
def report(spark, tmp_path_factory):
    from spark.report import run
    logs = tmp_path_factory.mktemp("sat-logs")
    sla = logs / "sla.toml"
    sla.write_text(SLA)
    out = tmp_path_factory.mktemp("sat-report")
    return run(make_logs(logs), str(out), spark=spark, sla_path=str(sla), strict=True), out


@pytest.mark.spark
def test_missed_while_saturated_names_the_busiest_processes(report):
    summary, out = report
    by = {s["objective"]: s for s in summary["sla"]}
    assert {k: (v["ok"], v["verdict"]) for k, v in by.items()} == {
        "rt-p99": (False, "missed, host saturated"),
        "rt-p50-tight": (False, "missed"),
        "rmb-delivery-rate": (True, "met")}
    sat = by["rt-p99"]["saturation"]
    assert sat["saturated"] and sat["host_pct"] >= 90
    assert [b["name"] for b in sat["busiest"][:3]] == ["marlin-consumer1", "stress[999]", "launcher"]
    assert sat["busiest"][1]["kind"] == "other"
    # the not-saturated miss: its breach spans the whole run, idle half included
    assert 50 < by["rt-p50-tight"]["saturation"]["host_pct"] < 90
    assert not by["rt-p50-tight"]["saturation"]["saturated"]
    # the samples are kept in summary.json for the timeline, not counted as ingest problems
    assert summary["cpu"]["cores"] == 2 and len(summary["cpu"]["samples"]) == 46
    assert summary["ingest"]["unknown_events"] == {} and summary["ingest"]["untraced_events"] == {}
    assert summary["timeline"] and {r["stage"] for r in summary["timeline"]} == {"round_trip"}

    page = (out / "report.html").read_text()
    line = ("rt-p99: missed, host saturated (host 97% of its cores busy during the breach; "
            "busiest, in % of one core: marlin-consumer1 150%, stress[999] (not the demo) 60%, "
            "launcher 20%)")
    assert line in page
    assert "Latency and CPU over time" in page and "host: all processes" in page
    assert "missed (host 65% busy during the breach: not saturated)" in page

    from deploy.launcher import saturation_line, sla_results
    assert saturation_line(summary) == (
        "missed, host saturated: rt-p99 (host 97% of its cores busy during the breach; busiest, "
        "in % of one core: marlin-consumer1 150%, stress[999] (not the demo) 60%, launcher 20%)"
        " - still a failure")
    # still failures: the launcher's exit code follows ok, which the verdict does not change
    assert dict(sla_results(summary, {"rmb"}))["rt-p99"] is False


def _shot_module():
    return load("scripts/report_screenshot.py")


@pytest.mark.spark
def test_screenshot_shows_the_cpu_timeline(report, tmp_path):
    """The page in headless Chromium: the CPU panel is drawn (the demo's share, #1f77b4 at
    70% over the host's grey, covers a real area of the screenshot's pixels)."""
    _, out = report
    mod = _shot_module()
    if mod.find_chromium() is None:
        pytest.skip("chromium not installed (Debian: apt-get install -y chromium)")
    png = mod.screenshot(out / "report.html", tmp_path / "shot.png", 1200, 1800)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1200, 1800)
    from PIL import Image
    img = Image.open(png).convert("RGB")
    demo_fill = (round(0.7 * 31 + 0.3 * 187), round(0.7 * 119 + 0.3 * 187), round(0.7 * 180 + 0.3 * 187))
    near = sum(n for n, c in img.getcolors(1200 * 1800)
               if all(abs(a - b) <= 6 for a, b in zip(c, demo_fill)))
    assert near > 2000, near
