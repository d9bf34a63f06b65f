"""The streaming trace report (spark/follow.py) over logs written by the real event-log
writers in segment mode: killed (SIGKILL) mid-run, restarted from its checkpoint, its
totals at the end equal the batch report's over the same files. Bounded waits only."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark.follow import totals

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "tests" / "data" / "recorded" / "rmb-demo"
pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]


def _env():
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONPATH=str(ROOT))
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    return env


def _follow(logdir: Path, out: Path, done: Path) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    log = open(out.parent / f"follow-{time.monotonic_ns()}.log", "w")
    return subprocess.Popen(
        [sys.executable, "-m", "spark.report", "--follow", str(logdir), "--out", str(out),
         "--master", "local[2]", "--trigger-s", "1", "--exit-on", str(done)],
        cwd=ROOT, env=_env(), start_new_session=True, stdout=log, stderr=subprocess.STDOUT)


def _wait(pred, limit_s: float, what: str, proc: subprocess.Popen | None = None) -> None:
    limit = time.monotonic() + limit_s
    while not pred():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the job exited {proc.returncode}")
        if time.monotonic() > limit:
            raise AssertionError(f"{what}: not within {limit_s:.0f} s")
        time.sleep(0.5)


def test_follow_killed_and_restarted_equals_the_batch_report(tmp_path):
    logdir, out, done, resume = tmp_path / "logs", tmp_path / "live", tmp_path / "done", tmp_path / "resume"
    writer = subprocess.Popen(
        [sys.executable, "-m", "tests.eventlog_replay", str(RECORDED), str(logdir),
         "--speed", "20", "--segment-s", "0.3", "--pause-at", "0.5",
         "--resume-on", str(resume), "--done", str(done)],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, text=True)
    job = _follow(logdir, out, done)
    try:
        status = out / "live" / "status.json"
        _wait(status.exists, 600, "first live refresh", job)
        first = json.loads(status.read_text())
        assert first["lines"] > 0
        os.killpg(job.pid, signal.SIGKILL)          # mid-run: the writer is paused half-way
        job.wait(30)
        resume.touch()
        job = _follow(logdir, out, done)
        assert job.wait(900) == 0
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
        resume.touch()
        writer.wait(120)
    written = int(writer.stdout.read().strip())
    assert not list(logdir.glob("*.jsonl")), "every log was sealed into segments/"
    segments = sorted(str(p) for p in (logdir / "segments").glob("*.jsonl"))
    assert sum(len(Path(p).read_text().splitlines()) for p in segments) == written

    live = json.loads((out / "live" / "status.json").read_text())
    assert live["lines"] == written            # each line once: no loss, no double count
    assert live["segments"] == len(segments)
    assert (out / "live" / "index.html").read_text().count("http-equiv='refresh'") == 1
    assert (out / "live" / "windows.parquet").is_dir()

    batch = subprocess.run(
        [sys.executable, "-m", "spark.report", "--out", str(tmp_path / "batch"),
         "--master", "local[2]", *segments],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    assert batch.returncode == 0, batch.stderr[-3000:]
    want = totals(json.loads((tmp_path / "batch" / "summary.json").read_text()))
    got = totals(json.loads((out / "report" / "summary.json").read_text()))
    assert got == want
    assert want["delivery"]["rmb"]["sent"] > 0
