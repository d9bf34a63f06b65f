"""The report runs on a real Spark standalone cluster: the test starts a master and one worker
(pyspark's bundled bin/spark-class) on 127.0.0.1, submits spark/report.py with plain
`spark-submit --master spark://...`, checks the output, and always tears the cluster down.
Waits are bounded; the worker gets 1 core and 1 GB."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daemon_runtime.redis_server import free_port

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "eventlogs"


def _wait_port(port: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before port {port} opened")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"port {port} not open after {timeout} s")


def _wait_text(path: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}; log:\n{path.read_text()[-3000:]}")
        time.sleep(0.3)
    raise TimeoutError(f"{text!r} not in {path} after {timeout} s:\n{path.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def test_spark_submit_to_standalone_master_and_worker(tmp_path):
    import shutil
    if shutil.which("java") is None:
        pytest.skip("java not found on PATH: PySpark 4 needs a system JDK 17 or 21")
    import pyspark
    home = Path(pyspark.__file__).parent
    env = {**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": "256m",
           "SPARK_NO_DAEMONIZE": "1"}
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    master_log, worker_log = tmp_path / "master.log", tmp_path / "worker.log"
    master = worker = None
    try:
        with open(master_log, "w") as log:
            master = subprocess.Popen(
                [str(home / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master",
                 "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        _wait_port(port, master, 90)
        with open(worker_log, "w") as log:
            worker = subprocess.Popen(
                [str(home / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker", url,
                 "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                 "--webui-port", str(free_port()), "--work-dir", str(tmp_path / "work")],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        _wait_text(master_log, "Registering worker", master, 90)

        out = tmp_path / "report"
        logs = sorted(str(p) for p in DATA.glob("*.jsonl"))
        submit = subprocess.run(
            [str(home / "bin" / "spark-submit"), "--master", url,
             "--driver-memory", "768m", "--executor-memory", "512m",
             "--total-executor-cores", "1", "--conf", "spark.sql.shuffle.partitions=2",
             "--conf", f"spark.pyspark.python={sys.executable}",
             str(REPO / "spark" / "report.py"), "--out", str(out), "--strict", *logs],
            env=env, cwd=str(REPO), capture_output=True, text=True, timeout=240)
        assert submit.returncode == 0, submit.stderr[-4000:]

        summary = json.loads((out / "summary.json").read_text())
        assert summary["spark"]["master"] == url
        assert summary["spark"]["shuffle_partitions"] == "2"     # spark-submit --conf wins
        app = summary["spark"]["app_id"]
        # the worker launched an executor for this application
        assert (tmp_path / "work" / app).is_dir()
        assert summary["delivery"]["rmb"]["answered"] == 7
        assert summary["delivery"]["rmb"]["lost_or_stuck"] == 1
        assert summary["clock"]["corrections_ms"] == {"22": 500.0}
        assert summary["ingest"]["torn_lines"] == 1
        assert list((out / "hops.parquet").glob("*.parquet"))
        assert (out / "report.html").read_text().count("<svg") >= 3
    finally:
        _stop(worker)
        _stop(master)
