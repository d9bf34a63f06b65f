"""The demo with Prometheus present (deploy/prometheus.py): the launcher starts Debian's
`prometheus`, writes file_sd targets for the nodes it starts, and records the alerts of the
run. Shown here on the RMB cluster (--only rmb --no-report, no Java needed):

- a run without faults: every daemon is a target that is up, the objectives' SLIs were
  computed from the daemons' histograms and counters, and no health alert and no
  delivery-rate burn alert fired. (Latency burn alerts depend on how fast a loaded machine
  answers, like the report's p99 verdicts: this test does not assert on them.)
- an unplanned fault: a peer SIGKILLed by the test, outside the demo's plan, while
  Prometheus's HTTP API shows every target up: the daemon-down alert fires for that peer.

Skips without the `prometheus` binary (scripts/test.sh installs Debian's package)."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
DEMO = Path(sys.executable).parent / "relay-suite-demo"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="prometheus not installed (Debian: apt-get install prometheus; scripts/test.sh "
           "installs it when run as root)")]

# one relay, a client and two serving twins: no planned fault (no offline twin, no relay
# restart, no expiring requests); the refused corrupted block is the only error reply
HEALTHY = """
relays = [{name = "relay1"}]
twins = [
  {name = "alice", key_type = "sr25519", relays = ["relay1"], role = "client"},
  {name = "bob", key_type = "ed25519", relays = ["relay1"], services = ["blocks"], role = "server"},
  {name = "carol", key_type = "sr25519", relays = ["relay1"], services = ["blocks"], role = "server"},
]
[traffic]
expiring = 0
"""
DAEMONS = {"rmb-registry", "rmb-relay-relay1", "rmb-peer-alice", "rmb-peer-bob", "rmb-peer-carol"}


def _start(tmp_path: Path, requests: int) -> tuple[subprocess.Popen, Path]:
    cfg = tmp_path / "healthy.toml"
    cfg.write_text(HEALTHY)
    run = tmp_path / "run"
    out = open(tmp_path / "demo.out", "w")
    proc = subprocess.Popen([str(DEMO), "--config", str(cfg), "--only", "rmb", "--no-report",
                             "--requests", str(requests), "--workdir", str(run)],
                            stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    out.close()
    return proc, run


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _wait_targets_up(proc: subprocess.Popen, run: Path, deadline: float) -> dict[str, str]:
    """Polls Prometheus's /api/v1/targets until every daemon is an active target that is
    up; returns node -> health."""
    health: dict[str, str] = {}
    while time.monotonic() < deadline and proc.poll() is None:
        url = run / "prometheus" / "url.txt"
        if url.exists():
            try:
                active = _get(url.read_text().strip() + "/api/v1/targets")["data"]["activeTargets"]
                health = {t["labels"].get("node"): t["health"] for t in active}
                if set(health) >= DAEMONS and all(health[n] == "up" for n in DAEMONS):
                    return health
            except OSError:
                pass
        time.sleep(0.5)
    return health


def _finish(proc: subprocess.Popen, tmp_path: Path, timeout: float = 600) -> str:
    try:
        proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return (tmp_path / "demo.out").read_text()


def test_healthy_run_targets_up_no_alert(tmp_path):
    proc, run = _start(tmp_path, 20)
    out = _finish(proc, tmp_path)
    assert proc.returncode == 0, out[-3000:]
    rec = json.loads((run / "prometheus" / "alerts.json").read_text())
    assert {t["node"]: t["health"] for t in rec["targets"]} == {n: "up" for n in DAEMONS}, rec
    jobs = {t["node"]: t["job"] for t in rec["targets"]}
    assert jobs["rmb-registry"] == "rmb-registry" and jobs["rmb-peer-bob"] == "rmb-peer"
    # the SLIs were computed: the peers' round-trip histogram and reply outcomes had samples
    for slo in ("rmb-round-trip-p99", "rmb-delivery-rate"):
        assert rec["sli_error_5m"].get(slo) not in (None, "NaN"), rec["sli_error_5m"]
    latency = {"RmbRoundTripP99BudgetBurnFast", "RmbRoundTripP99BudgetBurnSlow"}
    fired = [a["alertname"] for a in rec["fired"] if a["alertname"] not in latency]
    assert fired == [], (rec["fired"], out[-2000:])
    assert "prometheus: alerts fired during the run:" in out


def _peer_pid(run: Path, twin: str) -> int:
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "rmb-peer" in cmd and str(run) in cmd and f"rmb-peer-{twin}" in cmd:
            return p.pid
    raise AssertionError(f"no rmb-peer process for {twin} under {run}")


def test_unplanned_peer_kill_fires_daemon_down(tmp_path):
    proc, run = _start(tmp_path, 400)
    try:
        health = _wait_targets_up(proc, run, time.monotonic() + 300)
        assert set(health) >= DAEMONS and all(health[n] == "up" for n in DAEMONS), health
        pid = _peer_pid(run, "bob")
        psutil.Process(pid).send_signal(signal.SIGKILL)   # outside the plan
    except BaseException:
        proc.kill()
        raise
    out = _finish(proc, tmp_path)
    assert proc.returncode != 0          # the launcher reports the dead daemon
    rec = json.loads((run / "prometheus" / "alerts.json").read_text())
    down = [a for a in rec["fired"] if a["alertname"] == "RelaySuiteDaemonDown"]
    assert [(a["node"], a["job"]) for a in down] == [("rmb-peer-bob", "rmb-peer")], (rec, out[-3000:])
    assert "RelaySuiteDaemonDown(rmb-peer-bob)" in out
