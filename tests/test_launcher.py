"""The main job end to end: the README's demo command (relay-suite-demo) starts the
registry, two relays, four peers and the app services as real processes, drives the mixed
traffic with real block payloads, stops everything with SIGTERM, runs the Spark report, and
the report's counts equal the launcher's."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SMALL = """
[traffic]
requests = 6
concurrency = 4
ttl = 15
expiring = 1
expiring_ttl = 1
"""


def run_demo(tmp_path: Path, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess:
    cfg = tmp_path / "small.toml"
    cfg.write_text(SMALL)
    demo = Path(sys.executable).parent / "relay-suite-demo"
    return subprocess.run([str(demo), "--config", str(cfg), "--workdir", str(tmp_path / "run"), *extra],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.skipif(not shutil.which("java"), reason="Java is not installed: the report needs a JDK 17/21")
def test_demo_runs_the_cluster_on_real_blocks_and_the_report_matches(tmp_path, shared_data):
    proc = run_demo(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "payloads: 10 blocks from ../shared/data (eth, btc)" in out
    counted = json.loads(out.split("launcher counted:", 1)[1].splitlines()[0])
    # phases: 6 single + 1 multi(3) + 1 offline + 6 during the relay restart + 1 expiring + 1 refused
    assert counted["requests"] == 16 and counted["envelopes"] == 18
    assert counted["expired"] >= 1 and counted["errored"] == {"101": 1}
    assert counted["mismatched"] == 0 and counted["answered"] >= 15
    assert "MISMATCH" not in out and out.count(" ok") >= 5
    report = tmp_path / "run" / "report"
    summary = json.loads((report / "summary.json").read_text())
    assert summary["delivery"]["rmb"]["lost_or_stuck"] == 0
    assert (report / "report.html").stat().st_size > 1000
    logs = {p.name for p in (tmp_path / "run" / "logs").glob("*.jsonl")}
    assert {"rmb-registry.jsonl", "rmb-relay-relay1.jsonl", "rmb-relay-relay2.jsonl",
            "rmb-peer-alice.jsonl", "rmb-peer-dave.jsonl", "app-demo-client-alice.jsonl"} <= logs


def test_a_taken_port_is_reported_plainly(tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        cfg = tmp_path / "taken.toml"
        cfg.write_text(f'[[relays]]\nname = "relay1"\nport = {port}\n\n[[relays]]\nname = "relay2"\n')
        demo = Path(sys.executable).parent / "relay-suite-demo"
        proc = subprocess.run([str(demo), "--config", str(cfg), "--no-report", "--workdir", str(tmp_path / "r")],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert f"port {port} for relay1 is already taken" in proc.stderr


def test_missing_java_is_reported_before_anything_starts(tmp_path):
    import os
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(Path(sys.executable).parent)  # the venv's scripts, no java
    demo = Path(sys.executable).parent / "relay-suite-demo"
    proc = subprocess.run([str(demo), "--workdir", str(tmp_path / "r")], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 1 and "Java is missing" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_a_daemon_that_dies_is_reported_with_its_exit_code_and_stderr(tmp_path):
    cfg = tmp_path / "dies.toml"
    cfg.write_text('[[relays]]\nname = "relay1"\nflags = {queue-maxlen = "many"}\n\n'
                   '[[relays]]\nname = "relay2"\n')
    demo = Path(sys.executable).parent / "relay-suite-demo"
    proc = subprocess.run([str(demo), "--config", str(cfg), "--no-report", "--workdir", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "rmb-relay-relay1 exited with code 2 before READY" in proc.stderr
    assert "invalid int value: 'many'" in proc.stderr  # the tail of the daemon's own stderr
