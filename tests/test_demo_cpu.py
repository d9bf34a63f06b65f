"""The launcher's CPU sampler (deploy/cpu.py) on real processes, and demo-repeat's
background load (scripts/demo_repeat.py): no timing assertions, only conditions waited for
with generous deadlines (the machine may be loaded)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from daemon_runtime.eventlog import EventLog
from deploy.cpu import CpuSampler
from deploy.events import DEMO_EVENTS
from tests.script_module import load

REPO = Path(__file__).resolve().parent.parent

#: a child that burns 0.3 s of CPU, then idles until killed
BURNER = ("import time, sys\n"
          "while time.process_time() < 0.3: pass\n"
          "print('burnt', flush=True)\n"
          "time.sleep(600)\n")


def _wait(cond, deadline_s: float = 120.0, step: float = 0.2) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()


def test_sampler_counts_a_daemon_and_logs_it_by_name(tmp_path):
    sink = tmp_path / "demo-cpu.jsonl"
    child = subprocess.Popen([sys.executable, "-c", BURNER], stdout=subprocess.PIPE, text=True)
    try:
        sampler = CpuSampler(names=lambda: {child.pid: "burner"},
                             log=EventLog("relay-suite-demo", "launcher", [DEMO_EVENTS], sink=str(sink)),
                             interval=0.2).start()
        try:
            assert child.stdout.readline().strip() == "burnt"
            # the child's 0.3 s are counted once it was sampled after burning them
            assert _wait(lambda: sampler.usage().cpu_s >= 0.3)
            sampler.stop_logging()
        finally:
            usage = sampler.stop()
    finally:
        child.kill()
        child.wait()
    assert usage.cores == psutil.cpu_count() and usage.wall_s > 0
    assert usage.cpu_s >= 0.3
    lines = [json.loads(x) for x in sink.read_text().splitlines()]
    hosts = [e for e in lines if e["event"] == "demo.cpu.host"]
    assert hosts and all(e["attrs"]["cores"] == psutil.cpu_count() for e in hosts)
    assert all(0.0 <= e["attrs"]["cpu_pct"] <= 100.0 for e in hosts)
    procs = [e for e in lines if e["event"] == "demo.cpu.process"]
    # the child burnt its CPU in at most a few intervals: logged under its daemon name
    assert any(e["attrs"]["target"] == "burner" and e["attrs"]["kind"] == "demo"
               and e["attrs"]["pid"] == child.pid for e in procs), procs


def test_sampler_survives_a_process_that_exits_between_samples():
    sampler = CpuSampler(interval=0.1).start()
    for _ in range(3):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    sampler.sample()            # a direct sample after the children exited: no error
    usage = sampler.stop()
    assert usage.cpu_s >= 0.0 and usage.demo_pct >= 0.0


def _demo_repeat():
    return load("scripts/demo_repeat.py")


def test_demo_repeat_arguments():
    mod = _demo_repeat()
    assert mod.parse(["3", "--background-load", "0.5", "--no-marlin"]) == (3, 0.5, ["--no-marlin"])
    assert mod.parse(["2", "--only", "rmb", "--background-load=2"]) == (2, 2.0, ["--only", "rmb"])
    assert mod.parse(["1"]) == (1, 0.0, [])
    for bad in ([], ["x"], ["0"], ["2", "--background-load"], ["2", "--background-load", "lots"],
                ["2", "--background-load", "-1"]):
        with pytest.raises(ValueError):
            mod.parse(bad)


def test_background_load_runs_one_process_per_core_and_stops_them():
    mod = _demo_repeat()
    with mod.BackgroundLoad(1.5) as load:
        procs = [psutil.Process(p.pid) for p in load.procs]
        assert len(procs) == 2          # 1.5 cores: two processes at 75% each
        assert _wait(lambda: all(sum(p.cpu_times()[:2]) > 0.05 for p in procs))
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs)
    with mod.BackgroundLoad(0) as load:
        assert load.procs == []
