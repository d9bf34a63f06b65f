"""relay-trace-report --follow: the trace report kept current while the daemons still log.

    relay-trace-report --follow LOGDIR --out DIR [--master URL] [--sla FILE]
                       [--trigger-s 2] [--exit-on FILE]
    PYSPARK_PYTHON=$PWD/.venv/bin/python .venv/bin/spark-submit --master 'local[2]' \\
        spark/follow.py LOGDIR --out DIR

Input: the closed segments of the event logs, `LOGDIR/segments/*.jsonl`, which the daemons'
event-log writers produce in segment mode (daemon_runtime/eventlog.py: the current file
`NAME.jsonl` is renamed into `segments/` every RELAY_EVENTLOG_SEGMENT_S seconds and on
close, by one rename, so a segment is complete when it appears and no line is in two
files). Files still being written are never read; `daemon_runtime.eventlog.seal_dir`
moves what a killed daemon left behind once it has stopped.

Engine: a Structured Streaming file source over `segments/` with the batch report's
explicit schema (spark/schema.py), a micro-batch every `--trigger-s` seconds, and a
foreachBatch sink that (1) writes the micro-batch's lines, each with its `_source` file, to
`DIR/events/b-<batch id>.parquet` (overwritten when a restarted query replays that batch:
the file source's offset log fixes which files a batch id holds, so a replay writes the same
rows, never twice), then (2) runs the batch report (spark/report.py `run`) over every
committed batch into `DIR/report` (the same stage model, outcome rules and objectives,
spark/sla.toml: one definition, so at the end the totals equal the batch report's row
for row), then (3) writes the live outputs:

- `DIR/live/windows.parquet`: per minute (the start of the stage, UTC) and per
  protocol/stage: count, p50_ms, p99_ms (nearest-rank, exact), and per minute and protocol
  the delivery outcomes of the traces that started in it;
- `DIR/live/index.html`: those windows, the delivery totals and every objective's status,
  with `<meta http-equiv="refresh">` so a browser follows the run;
- `DIR/live/status.json`: batch id, segment files and lines read, when, the totals.

Per-message state and timeouts: each message's state is its steps in the events read so
far; its outcome is decided by the report's rules (spark/stages.py outcome_sql) with the
latest event time read as the watermark: a message with no decision whose deadline (send
time + ttl) is behind the watermark is `expired` / `lost_or_stuck`, else `in_flight`. A
later segment can still settle it (a reply logged by a node whose segment closed later).

Restart: `DIR/checkpoint` holds the query's offsets and commits; a restarted job resumes
after the last committed batch, replays an uncommitted one into the same
`b-<id>.parquet`, and reads each segment once. Delete DIR to start over.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import sys
import threading
import time
from html import escape
from pathlib import Path

from daemon_runtime.eventlog import SEGMENTS_DIR

#: summary.json sections that are the run's totals (what the two engines must agree on)
TOTAL_KEYS = ("traces", "delivery", "latency", "sla", "remp", "marlin", "remp_fullnodes")
#: ingest counts that are totals (the samples are not)
INGEST_KEYS = ("torn_lines", "bad_lines", "torn_files", "unknown_events", "untraced_events")


def totals(summary: dict) -> dict:
    """The totals of a report summary (batch or streaming), comparable with ==."""
    out = {k: summary.get(k) for k in TOTAL_KEYS}
    out["ingest"] = {k: summary.get("ingest", {}).get(k) for k in INGEST_KEYS}
    return json.loads(json.dumps(out, sort_keys=True, default=str))


def committed_batches(out: str) -> list[str]:
    """The event batches of `out` whose write finished (Spark's `_SUCCESS` marker), in order."""
    return sorted(p for p in glob.glob(os.path.join(out, "events", "b-*.parquet"))
                  if os.path.exists(os.path.join(p, "_SUCCESS")))


def _windows(spark, report_dir: str):
    """(latency rows, delivery rows) per minute from the report's stages/delivery tables."""
    from pyspark.sql import functions as F
    st = spark.read.parquet(os.path.join(report_dir, "stages.parquet"))
    lat = (st.groupBy(F.window("from_ts", "1 minute").start.alias("minute"), "protocol", "stage")
           .agg(F.count("*").alias("count"),
                F.percentile_approx("duration_ms", 0.5, 10000).alias("p50_ms"),
                F.percentile_approx("duration_ms", 0.99, 10000).alias("p99_ms"))
           .orderBy("minute", "protocol", "stage"))
    dl = spark.read.parquet(os.path.join(report_dir, "delivery.parquet"))
    if not {"outcome", "start_us", "protocol"} <= set(dl.columns):
        return lat, None
    dw = (dl.groupBy(F.window(F.timestamp_micros("start_us"), "1 minute").start.alias("minute"),
                     "protocol", "outcome")
          .count().orderBy("minute", "protocol", "outcome"))
    return lat, dw


def _page(status: dict, lat_rows: list, dl_rows: list | None, refresh_s: int) -> str:
    def table(rows, cols):
        head = "".join(f"<th>{escape(c)}</th>" for c in cols)
        body = "".join("<tr>" + "".join(f"<td>{escape(str(r[c]))}</td>" for c in cols) + "</tr>"
                       for r in rows)
        return f"<table><tr>{head}</tr>{body}</table>"
    t = status["totals"]
    sla = [{"objective": s.get("name"), "status": s.get("status"), "actual": s.get("actual"),
            "target": s.get("target_text"), "budget_used": s.get("budget_used")}
           for s in (t.get("sla") or [])]
    deliv = [{"protocol": p, **{k: v for k, v in d.items() if not isinstance(v, dict)}}
             for p, d in (t.get("delivery") or {}).items() if isinstance(d, dict)]
    dcols = sorted({k for r in deliv for k in r} - {"protocol"})
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<meta http-equiv='refresh' content='{refresh_s}'>",
        "<title>relay-suite live SLOs</title><style>body{font-family:sans-serif}"
        "table{border-collapse:collapse;margin:0 0 1em}td,th{border:1px solid #ccc;"
        "padding:2px 6px;font-size:13px}</style></head><body>",
        f"<h1>relay-suite: live</h1><p>batch {status['batch_id']}, "
        f"{status['segments']} segments, {status['lines']} lines, updated {status['updated']}"
        f" (refresh every {refresh_s} s)</p>",
        "<h2>Objectives (spark/sla.toml)</h2>",
        table(sla, ["objective", "status", "actual", "target", "budget_used"]),
        "<h2>Delivery</h2>", table(deliv, ["protocol"] + dcols),
        "<h2>Stage latency per minute</h2>",
        table(lat_rows, ["minute", "protocol", "stage", "count", "p50_ms", "p99_ms"]),
    ]
    if dl_rows is not None:
        cols = list(dl_rows[0].keys()) if dl_rows else ["minute", "protocol", "count"]
        parts += ["<h2>Delivery outcomes per minute</h2>", table(dl_rows, cols)]
    parts.append("</body></html>")
    return "\n".join(parts)


def _write_atomic(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


class Follower:
    """The streaming job: `Follower(spark, logdir, out, sla_path=None, trigger_s=2.0)`;
    `start()` returns the StreamingQuery. Output layout: module doc."""

    def __init__(self, spark, logdir: str, out: str, sla_path: str | None = None,
                 trigger_s: float = 2.0, refresh_s: int = 5):
        self.spark = spark
        self.logdir = os.path.abspath(logdir)
        self.out = os.path.abspath(out)
        self.sla_path = sla_path
        self.trigger_s = trigger_s
        self.refresh_s = refresh_s
        self.last_summary: dict | None = None
        self.seen_batch = -1

    def start(self):
        from pyspark.sql import functions as F
        from spark.report import REPORT_SQL_CONF
        from spark.schema import CORRUPT, SOURCE, TS_FORMAT, event_schema
        for key, value in REPORT_SQL_CONF.items():
            self.spark.conf.set(key, value)
        seg = os.path.join(self.logdir, SEGMENTS_DIR)
        os.makedirs(seg, exist_ok=True)
        os.makedirs(os.path.join(self.out, "live"), exist_ok=True)
        stream = (self.spark.readStream.schema(event_schema())
                  .option("mode", "PERMISSIVE")
                  .option("columnNameOfCorruptRecord", CORRUPT)
                  .option("timestampFormat", TS_FORMAT)
                  .option("pathGlobFilter", "*.jsonl")
                  .json(seg)
                  .withColumn(SOURCE, F.input_file_name()))
        return (stream.writeStream.foreachBatch(self._batch)
                .option("checkpointLocation", os.path.join(self.out, "checkpoint"))
                .trigger(processingTime=f"{self.trigger_s} seconds")
                .start())

    def _batch(self, df, batch_id: int) -> None:
        from spark.report import run
        path = os.path.join(self.out, "events", f"b-{batch_id:08d}.parquet")
        df.write.mode("overwrite").parquet(path)
        self.refresh(batch_id)

    def refresh(self, batch_id: int) -> dict | None:
        """Runs the report over every committed batch and rewrites the live outputs."""
        from spark.report import run
        inputs = committed_batches(self.out)
        if not inputs:
            return None
        report_dir = os.path.join(self.out, "report")
        summary = run(inputs, report_dir, sla_path=self.sla_path, spark=self.spark)
        events = self.spark.read.parquet(*inputs)
        from spark.schema import SOURCE
        lines = events.count()
        segments = events.select(SOURCE).distinct().count()
        status = {"batch_id": batch_id, "batches": len(inputs), "segments": segments,
                  "lines": lines,
                  "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "updated_unix": time.time(), "totals": totals(summary)}
        lat, dw = _windows(self.spark, report_dir)
        live = os.path.join(self.out, "live")
        (lat.coalesce(1).write.mode("overwrite")
         .parquet(os.path.join(live, "windows.parquet")))
        lat_rows = [r.asDict() for r in lat.collect()]
        dl_rows = None
        if dw is not None:
            dw.coalesce(1).write.mode("overwrite").parquet(os.path.join(live, "delivery_windows.parquet"))
            dl_rows = [r.asDict() for r in dw.collect()]
        _write_atomic(os.path.join(live, "index.html"),
                      _page(status, lat_rows, dl_rows, self.refresh_s))
        _write_atomic(os.path.join(live, "status.json"), json.dumps(status, indent=2, default=str))
        self.last_summary = summary
        self.seen_batch = batch_id
        return status


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="relay-trace-report --follow",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("logdir", help="the daemons' log directory (reads LOGDIR/segments/*.jsonl)")
    ap.add_argument("--out", required=True, help="output directory (live/, report/, events/, checkpoint/)")
    ap.add_argument("--master", default=None, help="Spark master URL (default local[2])")
    ap.add_argument("--sla", default=None, help="SLA objectives TOML (default spark/sla.toml)")
    ap.add_argument("--trigger-s", type=float, default=2.0, help="seconds between micro-batches")
    ap.add_argument("--refresh-s", type=int, default=5, help="the live page's refresh interval")
    ap.add_argument("--exit-on", metavar="FILE", default=None,
                    help="stop once FILE exists and every segment present then is committed")
    ap.add_argument("--spark-log-level", default=None, metavar="LEVEL")
    return ap


def main(argv: list[str] | None = None) -> int:
    from spark.report import build_session, job_jvm, quiet_jvm
    args = build_parser().parse_args(argv)
    quiet_jvm(args.spark_log_level, [])
    job_jvm(small=True)
    spark = build_session(args.master or "local[2]", small_input=True)
    follower = Follower(spark, args.logdir, args.out, args.sla, args.trigger_s, args.refresh_s)
    query = follower.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    seg = os.path.join(follower.logdir, SEGMENTS_DIR)
    try:
        while query.isActive and not stop.is_set():
            query.awaitTermination(1.0)
            if args.exit_on and os.path.exists(args.exit_on):
                # every segment present now is in a committed batch: stop
                query.processAllAvailable()
                present = {os.path.abspath(p) for p in glob.glob(os.path.join(seg, "*.jsonl"))}
                done = _read_sources(spark, follower.out)
                if present <= done:
                    break
        if query.exception():
            print(f"relay-trace-report --follow: {query.exception()}", file=sys.stderr)
            return 1
    finally:
        query.stop()
        spark.stop()
    if follower.last_summary is not None:
        print(json.dumps({"live": os.path.join(follower.out, "live", "index.html"),
                          "totals": totals(follower.last_summary)}, default=str))
    return 0


def _read_sources(spark, out: str) -> set[str]:
    from spark.schema import SOURCE
    inputs = committed_batches(out)
    if not inputs:
        return set()
    rows = spark.read.parquet(*inputs).select(SOURCE).distinct().collect()
    from urllib.parse import unquote, urlparse
    return {unquote(urlparse(r[0]).path) for r in rows}


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
