"""Lag of the streaming trace report (spark/follow.py): an event written -> its message
counted in the live window (live/status.json says its line was read and the report over it
written), p50/p99, at the demo's event rate and at 5,000 events/s, on local[2].

    flock <lock> .venv/bin/python bench/bench_spark_follow.py [--seconds 60] [--rates demo,5000]
                                                              [--modes incremental,full]

A writer thread replays the recorded demo logs (tests/data/recorded/rmb-demo) through the
real event-log writers in segment mode (0.5 s segments), cycling with a fresh trace id
suffix per cycle, at the given rate; the job runs as `relay-trace-report --follow` with a
1 s trigger. Lag of line k = the first live refresh whose line count covers k, minus the
time k was written. Targets: p99 <= 10 s at the demo rate, <= 30 s at 5,000 events/s.
Modes: `incremental` (the default job: per-message state, spark/follow.py) and `full`
(`--full-rerun`: each refresh reruns the batch report over every event read, the former
mode), each measured in the same run; the ratio full/incremental of the lag p99 is printed.
`before` (`--before REF`, default HEAD~1): the default job of an earlier commit, exported
with `git archive` and run the same way, for a before/after in one run.
Per mode it also prints the micro-batches' mean and max seconds to a live refresh, their
Spark jobs and the mean seconds per phase (live/status.json `micro_batch`; `before`
commits that do not report it print None).
Also: the batch report over the same segments once the run is over.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from daemon_runtime.eventlog import EventLog, EventLogError  # noqa: E402
from deploy.catalogues import CATALOGUES  # noqa: E402
from tests.eventlog_replay import load  # noqa: E402

RECORDED = ROOT / "tests" / "data" / "recorded" / "rmb-demo"
TARGET_P99_S = {"demo": 10.0, "5000": 30.0}


def demo_rate() -> float:
    rows = load(str(RECORDED))
    return len(rows) / max(rows[-1][0] - rows[0][0], 1.0)


def write(logdir: Path, rate: float, seconds: float, marks: list, stop: threading.Event) -> int:
    rows = load(str(RECORDED))
    logs: dict[str, EventLog] = {}
    n, t0, cycle = 0, time.monotonic(), 0
    while time.monotonic() - t0 < seconds and not stop.is_set():
        for _, name, rec in rows:
            due = t0 + n / rate
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            log = logs.get(name)
            if log is None:
                log = logs[name] = EventLog(rec["service"], rec["node"], CATALOGUES,
                                            sink=str(logdir / name), min_level="debug",
                                            segment_s=0.5)
            tid = rec.get("trace_id")
            try:
                log.emit_attrs(rec["event"], f"{tid}-{cycle}" if tid else None, rec["level"],
                               rec.get("attrs") or {})
            except EventLogError:
                continue
            n += 1
            if n % 50 == 0:
                marks.append((n, time.time()))
            if time.monotonic() - t0 >= seconds:
                break
        cycle += 1
    for log in logs.values():
        log.close()
    marks.append((n, time.time()))
    return n


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, max(0, int(q * len(xs) + 0.999999) - 1))], 3)


def tree_of(ref: str, dest: Path) -> Path:
    """The repository's files at git `ref`, exported to `dest` (the job of an earlier
    commit, run beside the current one in the same bench run)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def run(rate_name: str, rate: float, seconds: float, full: bool = False,
        tree: Path | None = None) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="follow-bench-"))
    logdir, out, done = tmp / "logs", tmp / "out", tmp / "done"
    logdir.mkdir()
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONPATH=str(ROOT))
    job_env = dict(env, PYTHONPATH=str(tree or ROOT))
    job = subprocess.Popen([sys.executable, "-m", "spark.report", "--follow", str(logdir),
                            "--out", str(out), "--master", "local[2]", "--trigger-s", "1",
                            "--exit-on", str(done), *(["--full-rerun"] if full else [])],
                           cwd=tree or ROOT, env=job_env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        status = out / "live" / "status.json"
        limit = time.monotonic() + 600
        while not (out / "checkpoint").exists() and time.monotonic() < limit:
            time.sleep(0.2)            # the query is up: the JVM's start is not the lag
        marks: list = []
        stop = threading.Event()
        refreshes: list[tuple[int, float]] = []
        batches: list[dict] = []        # status.json "micro_batch": seconds, jobs, phases
        writer = threading.Thread(target=lambda: marks.append(("n", write(logdir, rate, seconds, marks, stop))))
        writer.start()
        last = None
        def written() -> int:          # lines written so far (marks end with ("n", total))
            return max((n for n, _ in marks if n != "n"), default=0)
        while writer.is_alive() or not refreshes or refreshes[-1][0] < written():
            try:
                st = json.loads(status.read_text())
                if st["updated_unix"] != last:
                    last = st["updated_unix"]
                    refreshes.append((st["lines"], st["updated_unix"]))
                    if st.get("micro_batch"):
                        batches.append(st["micro_batch"])
            except (FileNotFoundError, ValueError, KeyError):
                pass
            if not writer.is_alive():
                done.touch()
                if job.poll() is not None or time.monotonic() > limit + seconds + 600:
                    break
            time.sleep(0.1)
        job.wait(600)
        total = next(v for k, v in marks if k == "n")
        lags = []
        for n, t in marks:
            if n == "n":
                continue
            hit = next((u for lines, u in refreshes if lines >= n), None)
            if hit is not None:
                lags.append(max(0.0, hit - t))
        t_b = time.time()
        segs = sorted(str(p) for p in (logdir / "segments").glob("*.jsonl"))
        subprocess.run([sys.executable, "-m", "spark.report", "--out", str(tmp / "batch"),
                        "--master", "local[2]", *segs], cwd=ROOT, env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        batch_s = time.time() - t_b
        phases: dict[str, float] = {}
        for b in batches:
            for k, v in b.get("phases", {}).items():
                phases[k] = phases.get(k, 0.0) + v / len(batches)
        return {"rate": rate, "events": total, "p50_s": pct(lags, 0.5), "p99_s": pct(lags, 0.99),
                "batch_s_mean": round(sum(b["seconds"] for b in batches) / len(batches), 2)
                if batches else None,
                "batch_s_max": max((b["seconds"] for b in batches), default=None),
                "jobs_per_batch": round(sum(b["spark_jobs"] for b in batches) / len(batches), 1)
                if batches else None,
                "phases": {k: round(v, 2) for k, v in phases.items()},
                "refreshes": len(refreshes), "batch_s": round(batch_s, 2),
                "covered": len(lags), "marks": len(marks) - 1}
    finally:
        # the streaming job ends at --exit-on; on any error before that it is stopped here
        if job.poll() is None:
            job.terminate()
            try:
                job.wait(30)
            except subprocess.TimeoutExpired:
                job.kill()
                job.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rates", default="demo,5000")
    ap.add_argument("--modes", default="incremental,full",
                    help="incremental (the job's default), full (--full-rerun baseline), "
                         "before (the default job of git ref --before)")
    ap.add_argument("--before", default="HEAD~1", metavar="REF",
                    help="for mode `before`: the commit whose job is measured beside this one")
    args = ap.parse_args(argv)
    figures, baseline = {}, {}
    modes = args.modes.split(",")
    before_tree = None
    if "before" in modes:
        before_tree = tree_of(args.before, Path(tempfile.mkdtemp(prefix="follow-before-")) / "tree")
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.before],
                             capture_output=True, text=True).stdout.strip()
        baseline["before_commit"] = rev
    for name in args.rates.split(","):
        rate = demo_rate() if name == "demo" else float(name)
        target = TARGET_P99_S.get(name)
        p99 = {}
        for mode in modes:
            r = run(name, rate, args.seconds, full=(mode == "full"),
                    tree=before_tree if mode == "before" else None)
            p99[mode] = r["p99_s"]
            print(f"rate {name} ({r['rate']:.1f} events/s, {r['events']} events), {mode}: "
                  f"{r['refreshes']} refreshes, lag p50 {r['p50_s']} s, p99 {r['p99_s']} s "
                  f"(target p99 <= {target} s: {'met' if r['p99_s'] is not None and r['p99_s'] <= target else 'MISSED'})"
                  f"; batch report over the same events {r['batch_s']} s", flush=True)
            print(f"  micro-batch to live refresh: mean {r['batch_s_mean']} s, max "
                  f"{r['batch_s_max']} s, {r['jobs_per_batch']} Spark jobs; mean s per phase "
                  f"{r['phases']}", flush=True)
            key = name if mode == "incremental" else \
                f"{name}_full_rerun" if mode == "full" else f"{name}_before"
            dest = figures if mode == "incremental" else baseline
            dest[f"lag_p50_s@{key}"] = r["p50_s"]
            dest[f"lag_p99_s@{key}"] = r["p99_s"]
            dest[f"micro_batch_s_mean@{key}"] = r["batch_s_mean"]
            dest[f"spark_jobs_per_batch@{key}"] = r["jobs_per_batch"]
            if mode == "incremental":
                figures[f"events_per_s@{name}"] = round(r["rate"], 1)
                figures[f"target_p99_s@{name}"] = target
                baseline[f"batch_report_s@{name}"] = r["batch_s"]
        for other, label in (("full", "full rerun"), ("before", "before")):
            if p99.get(other) and p99.get("incremental"):
                ratio = round(p99[other] / p99["incremental"], 1)
                figures[f"lag_p99_{other}_over_incremental@{name}"] = ratio
                print(f"rate {name}: lag p99 {label} / incremental = {ratio}x", flush=True)
    if before_tree is not None:
        shutil.rmtree(before_tree.parent, ignore_errors=True)
    from result_file import write_result
    write_result("spark_follow", figures, baseline=baseline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
