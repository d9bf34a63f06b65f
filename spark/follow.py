"""relay-trace-report --follow: the trace report kept current while the daemons still log.

    relay-trace-report --follow LOGDIR --out DIR [--master URL] [--sla FILE]
                       [--trigger-s 1] [--exit-on FILE]
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
foreachBatch sink that keeps per-message state in Parquet as one delta per batch id:

1. the micro-batch's lines are parsed once and kept in memory (persisted) for this batch
   and the next RECENT_BATCHES - 1, which gather a touched trace's earlier lines from
   them (older batches, and all of them after a restart: from their segment files, which
   the batch markers list); one aggregation gives the lines per file and the trace ids
   the batch touches;
2. per-message state deltas: `DIR/state/steps/b-<batch id>.parquet` holds the batch
   report's step table rows (spark/report.py _step_table: one row per trace, protocol,
   step and branch) of every trace the batch touches, recomputed from all that trace's
   events (the batch's lines and the trace's earlier `ok` lines, from the first batch the
   trace appeared in onwards: a later fact or branch of a trace applies
   to its earlier steps, as in the batch report), plus the `_meta` rows (ingest and plan)
   of the batch's own lines; `DIR/state/records/b-<batch id>.parquet` the (trace, branch)
   records of those traces (the outcome columns of spark/stages.py outcome_sql without a
   watermark, nodes, start, deadline, the stage edges). Every row carries `_b` = its batch
   id; a trace's current rows are those of the newest delta that holds it, and `_meta`
   rows add up. `state/batches/<id>.json` (lines, segment files, the traces first seen,
   the latest step time per protocol, the `_meta` rows) is written last: it marks the
   delta complete. Nothing older is rewritten: a batch costs what it touches;
3. the live outputs, from the current records: pieces (each batch's records delta, and
   now and then all of them merged into one, localCheckpoint) from which the rows of
   traces touched later are filtered out: the watermark is the latest step time read; a (trace, branch)
   with no decision whose deadline (start + ttl) is behind it becomes `lost_or_stuck` (the
   timeout: spark/stages.py timed_out_sql, the rule the batch report applies at the end
   of its logs), else it stays `in_flight`, and a later line can still settle it; the
   plan's faults (planned or not) and the clock corrections (spark/clock.py) are applied
   as the report applies them.

Outputs:

- `DIR/live/windows.parquet`: per minute (the start of the stage, UTC) and per
  protocol/stage: count, p50_ms, p99_ms; `DIR/live/delivery_windows.parquet`: per minute
  and protocol the delivery outcomes of the (trace, branch) rows that started in it;
- `DIR/live/index.html`: those windows and the delivery totals, with
  `<meta http-equiv="refresh">` so a browser follows the run; at the end, every
  objective's status too;
- `DIR/live/status.json`: batch id, segment files and lines read, watermark, when, totals;
- `DIR/report/`: at the end of the run (`--exit-on`, SIGTERM), the batch report's pipeline
  (spark/report.py, the same stage model, outcome rules and objectives of spark/sla.toml)
  over the per-message state `steps`, not over the events: its totals equal the batch
  report's over the same logs, row for row, when the state was merged right.

`--full-rerun` is the former mode kept as a baseline: each refresh runs the whole batch
report over every event read so far (cost grows with the run).

Restart: `DIR/checkpoint` holds the query's offsets and commits; a restarted job resumes
after the last committed batch and replays an uncommitted one into the same
`b-<id>.parquet` deltas, merged over the complete deltas before it (the
driver's view is rebuilt from them), so no line is counted twice and none is lost. Delete
DIR to start over.
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
    """The streaming job: `Follower(spark, logdir, out, sla_path=None, trigger_s=1.0,
    refresh_s=5, full_rerun=False)`; `start()` returns the StreamingQuery, `finish()`
    writes the end-of-run report from the state. Output layout and state: module doc."""

    def __init__(self, spark, logdir: str, out: str, sla_path: str | None = None,
                 trigger_s: float = 1.0, refresh_s: int = 5, full_rerun: bool = False):
        self.spark = spark
        self.logdir = os.path.abspath(logdir)
        self.out = os.path.abspath(out)
        self.sla_path = sla_path
        self.trigger_s = trigger_s
        self.refresh_s = refresh_s
        self.full_rerun = full_rerun
        self.last_summary: dict | None = None
        self.seen_batch = -1
        # the driver's view of the state (_load): markers, first batch per trace, the
        # cached current records and the batch id they reflect
        self._info: dict[int, dict] | None = None
        self._first: dict[str, int] = {}
        self._last: dict[str, int] = {}
        self._pieces: list[list] = []       # [first batch id, last batch id, DataFrame]
        self._recent: dict[int, object] = {}  # batch id -> its parsed lines (persisted)
        self._cur = None
        self._cur_b = -1
        from spark.report import PROTOCOLS, load_sla
        sla = load_sla(sla_path)
        self.objectives = sla.get("objective", [])
        self.ttl_over = sla.get("ttl_s", {})
        self.ttl_default = {n: float(self.ttl_over.get(n, p.outcomes.default_ttl_s))
                            for n, p in PROTOCOLS.items()}

    def start(self):
        from pyspark.sql import functions as F
        from spark.report import REPORT_SQL_CONF
        from spark.schema import CORRUPT, SOURCE, TS_FORMAT, event_schema
        for key, value in REPORT_SQL_CONF.items():
            self.spark.conf.set(key, value)
        seg = os.path.join(self.logdir, SEGMENTS_DIR)
        os.makedirs(seg, exist_ok=True)
        os.makedirs(os.path.join(self.out, "live"), exist_ok=True)
        os.makedirs(os.path.join(self.out, "state", "batches"), exist_ok=True)
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

    # ------------------------------------------------------------------ state on disk

    def _delta(self, name: str, batch_id: int) -> str:
        """The state delta `name` (steps, records) written by micro-batch `batch_id`."""
        return os.path.join(self.out, "state", name, f"b-{batch_id:08d}.parquet")

    def _events(self, batch_id: int) -> str:
        """--full-rerun: the lines of micro-batch `batch_id`, as Parquet."""
        return os.path.join(self.out, "events", f"b-{batch_id:08d}.parquet")

    def _batch_info(self) -> dict[int, dict]:
        """batch id -> marker ({lines, sources, traces, t1, meta}) of every batch whose
        state is complete, read from disk."""
        out = {}
        for p in glob.glob(os.path.join(self.out, "state", "batches", "*.json")):
            with open(p) as fh:
                out[int(Path(p).stem)] = json.load(fh)
        return dict(sorted(out.items()))

    def _batch(self, df, batch_id: int) -> None:
        sc = self.spark.sparkContext
        group = f"follow-{batch_id}-{time.monotonic_ns()}"
        sc.setJobGroup(group, f"micro-batch {batch_id}")
        self._t0 = self._tp = time.monotonic()
        self._phases = {}
        self._group = group
        try:
            self._batch_body(df, batch_id)
        finally:
            self._group = None
            sc.setJobGroup("", "")

    def _timing(self) -> dict:
        """The running micro-batch so far: seconds, Spark jobs, seconds per phase."""
        if getattr(self, "_group", None) is None:
            return {}
        tracker = self.spark.sparkContext.statusTracker()
        return {"seconds": round(time.monotonic() - self._t0, 3),
                "spark_jobs": len(tracker.getJobIdsForGroup(self._group)),
                "phases": dict(self._phases)}

    def _phase(self, name: str) -> None:
        now = time.monotonic()
        self._phases[name] = round(now - self._tp, 3)
        self._tp = now

    def _load(self, batch_id: int) -> None:
        """The driver's view of the state before `batch_id`, from disk: the markers of the
        complete batches before it, each trace's first batch, and the current (trace,
        branch) records (the newest delta of each trace), cached. Runs at the first batch
        of a process and whenever a batch id is seen again (a replay)."""
        from pyspark.sql import Window, functions as F
        self._info = {b: v for b, v in self._batch_info().items() if b < batch_id}
        self._first, self._last = {}, {}
        for b, v in self._info.items():
            for t in v.get("traces", []):
                self._first.setdefault(t, b)
        for _, _, df in self._pieces:
            _release(df)
        for df in self._recent.values():
            df.unpersist()
        self._pieces, self._recent, self._cur = [], {}, None
        paths = [self._delta("records", b) for b in self._info
                 if os.path.exists(self._delta("records", b))]
        if paths:
            d = self.spark.read.parquet(*paths)
            w = Window.partitionBy("trace_id")
            # one piece; a trace's place in it is unknown (_last empty): filtered when touched
            self._pieces = [[min(self._info), max(self._info),
                             d.withColumn("_last", F.max("_b").over(w)).filter("_b = _last")
                             .drop("_last").localCheckpoint(eager=True)]]
            self._cur = self._pieces[0][2]
        self._cur_b = batch_id - 1

    def _batch_body(self, df, batch_id: int) -> None:
        from pyspark import StorageLevel
        from spark.schema import SOURCE
        if self.full_rerun:
            path = self._events(batch_id)
            df.write.mode("overwrite").parquet(path)
            per_file = self.spark.read.parquet(path).groupBy(SOURCE).count().collect()
            info = {"lines": sum(r["count"] for r in per_file),
                    "sources": sorted(r[SOURCE] for r in per_file)}
            _write_atomic(os.path.join(self.out, "state", "batches", f"{batch_id:08d}.json"),
                          json.dumps(info))
            self.refresh(batch_id)
            return
        if batch_id <= self._cur_b or self._info is None:
            self._load(batch_id)
        self._phase("load")
        # the micro-batch's lines are parsed once: kept for the events file, the counts and
        # the step rows of the traces they touch
        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            lines: dict[str, int] = {}
            touched: set[str] = set()
            for r in df.groupBy(SOURCE, "trace_id").count().collect():
                lines[r[SOURCE]] = lines.get(r[SOURCE], 0) + r["count"]
                if r["trace_id"]:
                    touched.add(r["trace_id"])
            self._phase("events_count")
            marker = {"lines": sum(lines.values()), "sources": sorted(lines),
                      "traces": sorted(t for t in touched if t not in self._first),
                      "t1": {}, "meta": []}
            if marker["lines"]:
                self._merge(batch_id, df, touched, marker)
        except BaseException:
            df.unpersist()
            raise
        # the parsed lines of the last RECENT_BATCHES batches stay in memory: a trace
        # touched again soon is gathered from them, not from its segment files
        self._recent[batch_id] = df
        for b in sorted(self._recent)[:-RECENT_BATCHES]:
            self._recent.pop(b).unpersist()
        _write_atomic(os.path.join(self.out, "state", "batches", f"{batch_id:08d}.json"),
                      json.dumps(marker))
        self._info[batch_id] = marker
        for t in marker["traces"]:
            self._first[t] = batch_id
        self._cur_b = batch_id
        self._phase("record")
        self._live(batch_id)

    def _merge(self, batch_id: int, df, touched: set[str], marker: dict) -> None:
        """Merges micro-batch `batch_id` (its events `df`, the trace ids `touched`) into
        the per-message state. The step table rows of every touched trace are recomputed
        from all that trace's events (the batch report's stage model, spark/report.py
        _step_table, so a fact or a branch logged later applies to earlier steps as in the
        batch report): the batch's lines, and the `ok` lines of those traces in earlier
        batches, read only from the first batch any of them appeared in. Writes the deltas
        `state/steps/b-<id>` (those rows, and the `_meta` rows of the batch's own lines)
        and `state/records/b-<id>` (their (trace, branch) records), each row tagged `_b` =
        batch id: a trace's current rows are those of the newest delta that holds it.
        Updates the cached current records and fills `marker` (t1: the latest step time
        per protocol; meta: the `_meta` rows)."""
        from pyspark.sql import functions as F
        from spark.report import _step_table, branch_records, event_class_sql
        from spark.schema import read_events
        spark = self.spark
        known = sorted(t for t in touched if t in self._first)
        ev = df
        if known:
            since = min(self._first[t] for t in known)
            parts = [self._recent[b] for b in self._info if b >= since and b in self._recent]
            files = [_local(s) for b, v in self._info.items()
                     if b >= since and b not in self._recent for s in v["sources"]]
            if files:
                parts.append(read_events(spark, files).select(*df.columns))
            for part in parts:
                ev = ev.unionByName(part.filter(F.col("trace_id").isin(known))
                                    .filter(f"({event_class_sql()}) = 'ok'"))
        steps = _step_table(spark, [], peers=True, events=ev).withColumn("_b", F.lit(batch_id))
        steps.write.mode("overwrite").parquet(self._delta("steps", batch_id))
        steps = spark.read.parquet(self._delta("steps", batch_id))
        self._phase("merge_steps")
        for r in steps.groupBy("protocol").agg(
                F.max("ts").alias("t1"),
                F.collect_list(F.when(F.col("protocol") == "_meta", F.struct(
                    "step", "branch", "n"))).alias("meta")).collect():
            if r["protocol"] == "_meta":
                marker["meta"] = [m.asDict() for m in r["meta"]]
            else:
                marker["t1"][r["protocol"]] = r["t1"]
        self._phase("merge_meta")
        # the touched traces' (trace, branch) records: outcome without a watermark
        # (undecided = in_flight); the timeout is applied when the windows are read
        rec, _ = branch_records(spark, steps.filter("protocol <> '_meta'").drop("_b"),
                                self.ttl_default, "CAST(NULL AS BIGINT)", "false",
                                peers=True, keep_nodes=True)
        rec.drop("planned").withColumn("_b", F.lit(batch_id)).write.mode("overwrite") \
            .parquet(self._delta("records", batch_id))
        rec = spark.read.parquet(self._delta("records", batch_id))
        self._phase("merge_records")
        # the current records: pieces (one per recent batch, one merged) from which the
        # touched traces' older rows are filtered out; merged into one piece now and then
        for piece in self._pieces:
            lo, hi, _ = piece
            ids = [t for t in known if lo <= self._last.get(t, lo) <= hi]
            if ids:
                piece[2] = piece[2].filter(~F.col("trace_id").isin(ids))
        self._pieces.append([batch_id, batch_id, rec])
        for t in touched:
            self._last[t] = batch_id
        if len(self._pieces) > MAX_PIECES:
            old = self._pieces
            merged = _union([p[2] for p in old]).coalesce(2).localCheckpoint(eager=True)
            for p in old:
                _release(p[2])
            self._pieces = [[old[0][0], old[-1][1], merged]]
        dfs = [p[2] for p in self._pieces]
        self._cur = _union(dfs) if len(dfs) == 1 else _union(dfs).coalesce(2)
        self._phase("merge_current")

    def _plan_and_watermark(self, batch_id: int):
        """(plan rows, watermark us) from the markers of the batches up to `batch_id`."""
        wm = 0
        plan_rows = []
        for b, v in self._info.items():
            if b > batch_id:
                continue
            wm = max([wm, *(t or 0 for t in v.get("t1", {}).values())])
            plan_rows += [json.loads(m["branch"]) for m in v.get("meta", [])
                          if m["step"] == "meta:plan"]
        return plan_rows, wm

    def _live(self, batch_id: int) -> dict | None:
        """The live outputs from the current records: watermark = the latest step time
        read; undecided (trace, branch) rows past their deadline become lost_or_stuck; the
        planned faults, clock corrections and per-minute windows as the report makes them.
        Three Spark jobs over the cached records: the clock pairs, the latency windows and
        objective figures (one grouping-sets aggregation), the delivery outcomes."""
        from pyspark.sql import functions as F
        from spark.clock import align
        from spark.plan import parse as parse_plan
        from spark.report import CLOCK_TOLERANCE_MS, OUTCOME_COLUMNS, _with_corr
        from spark.stages import timed_out_sql
        if self._cur is None:
            return None
        plan_rows, wm = self._plan_and_watermark(batch_id)
        plan = parse_plan([r for r in plan_rows if r["event"].startswith("demo.plan.")])
        rec = self._cur.withColumns({
            "outcome": F.expr(f"CASE WHEN outcome = 'in_flight' AND "
                              f"{timed_out_sql(wm, 'start_us', 'ttl_s')} THEN 'lost_or_stuck' "
                              f"ELSE outcome END"),
            "planned": F.expr(plan.planned_sql())})
        sg = (rec.select("trace_id", "protocol", "branch", "planned", F.explode("sa").alias("s"))
              .filter("s IS NOT NULL").select("trace_id", "protocol", "branch", "planned", "s.*"))
        pairs = (sg.filter("clock AND from_node <> to_node").groupBy("from_node", "to_node")
                 .agg((F.min(F.col("to_ts") - F.col("from_ts")) / 1000.0).alias("d_ms")).collect())
        clock = align({(r["from_node"], r["to_node"]): r["d_ms"] for r in pairs},
                      CLOCK_TOLERANCE_MS, plan.hosts)
        self._phase("live_clock")
        st = _with_corr(self.spark, sg, clock.corrections, {"to_node": "c_to", "from_node": "c_from"})
        st = st.select("protocol", "stage", "planned", F.window(F.timestamp_micros(
            F.col("from_ts") + (F.col("c_from") * 1000).cast("long")), "1 minute").start
            .alias("minute"),
            ((F.col("to_ts") - F.col("from_ts")) / 1000.0 + F.col("c_to") - F.col("c_from"))
            .alias("duration_ms"))
        lat_rows, latency_idx = self._latency(st)
        self._phase("live_latency")
        dl_rows, delivery = self._delivery(rec.filter("sent"), OUTCOME_COLUMNS)
        sla = self._objectives(latency_idx, delivery)
        self._phase("live_delivery")
        info = {b: v for b, v in self._info.items() if b <= batch_id}
        status = {"batch_id": batch_id, "batches": len(info),
                  "segments": sum(len(v["sources"]) for v in info.values()),
                  "lines": sum(v["lines"] for v in info.values()),
                  "watermark": _iso_us(wm),
                  "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "updated_unix": time.time(), "mode": "incremental",
                  "micro_batch": self._timing(),
                  "totals": {"delivery": dict(sorted(delivery.items())), "sla": sla}}
        self._write_live(status, lat_rows, dl_rows)
        self.seen_batch = batch_id
        return status

    def _latency(self, st) -> tuple[list[dict], dict]:
        """(per-minute window rows, the report's latency index) of the stage rows `st`
        (protocol, stage, minute, planned, duration_ms) in one Spark job: grouping sets
        (protocol, stage, minute) and (protocol, stage). The index is spark/report.py
        evaluate_sla's: scope -> (protocol, stage) -> count, quantiles, over, within."""
        from pyspark.sql import functions as F
        from spark.report import _nearest
        quant = [o for o in self.objectives if "quantile" in o]
        limits = sorted({float(o["max_ms"]) for o in quant})
        within = [(i, o) for i, o in enumerate(self.objectives) if "within_ms" in o]
        qs = sorted({0.5, 0.9, 0.99} | {float(o["quantile"]) for o in quant})
        aggs = [F.count(F.lit(1)).alias("rows")]
        for pre, val in (("", "duration_ms"),
                         ("u_", "CASE WHEN NOT coalesce(planned, false) THEN duration_ms END")):
            aggs += [F.expr(f"count({val})").alias(pre + "count"),
                     F.expr(f"percentile_approx({val}, array({', '.join(map(str, qs))}), 10000)")
                     .alias(pre + "pq")]
            aggs += [F.expr(f"count_if({val} > {lim})").alias(f"{pre}over_{j}")
                     for j, lim in enumerate(limits)]
            aggs += [F.expr(f"count_if({val} <= {float(o['within_ms'])})").alias(f"{pre}within_{i}")
                     for i, o in within]
        idx: dict[str, dict] = {"all": {}, "unplanned": {}}
        lat_rows = []
        i50, i99 = qs.index(0.5), qs.index(0.99)
        for r in (st.groupingSets([["protocol", "stage", "minute"], ["protocol", "stage"]],
                                  "protocol", "stage", "minute")
                  .agg(*aggs, F.grouping_id().alias("_g")).collect()):
            if r["_g"] == 0:
                pq = r["pq"] or [None] * len(qs)
                lat_rows.append({"minute": r["minute"], "protocol": r["protocol"],
                                 "stage": r["stage"], "count": r["rows"],
                                 "p50_ms": pq[i50], "p99_ms": pq[i99]})
                continue
            for scope, pre in (("all", ""), ("unplanned", "u_")):
                idx[scope][(r["protocol"], r["stage"])] = {
                    "count": r[pre + "count"],
                    "quantiles": dict(zip(qs, (_nearest(v) for v in (r[pre + "pq"] or [None] * len(qs))))),
                    "over": {lim: r[f"{pre}over_{j}"] for j, lim in enumerate(limits)},
                    "within": {i: r[f"{pre}within_{i}"] for i, _ in within}}
        lat_rows.sort(key=lambda r: (r["minute"], r["protocol"], r["stage"]))
        return lat_rows, idx

    @staticmethod
    def _delivery(sent, outcome_columns) -> tuple[list[dict], dict]:
        """(per-minute delivery outcome rows, delivery totals per protocol with planned /
        unplanned parts) of the sent (trace, branch) records, in one Spark job."""
        from pyspark.sql import functions as F
        rows = (sent.groupBy(F.window(F.timestamp_micros("start_us"), "1 minute").start
                             .alias("minute"), "protocol", "outcome", "planned",
                             "delivered", "late").count().collect())
        per_min: dict[tuple, int] = {}
        delivery: dict[str, dict] = {}
        keys = ("branches", "sent", "delivered", *outcome_columns, "late")
        for r in rows:
            k = (r["minute"], r["protocol"], r["outcome"])
            per_min[k] = per_min.get(k, 0) + r["count"]
            d = delivery.setdefault(r["protocol"], {
                **dict.fromkeys(keys, 0), "planned": dict.fromkeys(keys, 0),
                "unplanned": dict.fromkeys(keys, 0)})
            part = d["planned" if r["planned"] else "unplanned"]
            add = {"branches": r["count"], "sent": r["count"],
                   "delivered": r["count"] if r["delivered"] else 0,
                   "late": r["count"] if r["late"] else 0,
                   **{o: (r["count"] if r["outcome"] == o else 0) for o in outcome_columns}}
            for k2, v in add.items():
                d[k2] += v
                part[k2] += v
        dl_rows = [{"minute": m, "protocol": p, "outcome": o, "count": n}
                   for (m, p, o), n in sorted(per_min.items())]
        return dl_rows, delivery

    def _objectives(self, latency_idx: dict, delivery: dict) -> list[dict]:
        """Every objective's status now (spark/report.py evaluate_sla over the live figures)."""
        from spark.report import evaluate_sla
        within = {"all": {}, "unplanned": {}}
        for scope in within:
            for i, o in enumerate(self.objectives):
                if "within_ms" not in o:
                    continue
                ok = latency_idx[scope].get((o["protocol"], o["stage"]), {}).get("within", {}).get(i, 0)
                d = delivery.get(o["protocol"])
                if d and scope == "unplanned":
                    d = d["unplanned"]
                within[scope][i] = (ok, (d["branches"] - d["in_flight"]) if d else 0)
        return evaluate_sla(self.objectives, latency_idx, {
            "all": delivery, "unplanned": {p: d["unplanned"] for p, d in delivery.items()}}, within)

    def _write_live(self, status: dict, lat_rows: list, dl_rows: list | None) -> None:
        live = os.path.join(self.out, "live")
        _write_rows(os.path.join(live, "windows.parquet"), lat_rows,
                    ["minute", "protocol", "stage", "count", "p50_ms", "p99_ms"])
        if dl_rows is not None:
            _write_rows(os.path.join(live, "delivery_windows.parquet"), dl_rows,
                        ["minute", "protocol", "outcome", "count"])
        _write_atomic(os.path.join(live, "index.html"),
                      _page(status, lat_rows, dl_rows, self.refresh_s))
        _write_atomic(os.path.join(live, "status.json"), json.dumps(status, indent=2, default=str))

    def finish(self) -> dict | None:
        """The end of the run: the report's pipeline (spark/report.py) over the per-message
        state, not over the events (full-rerun mode: over the events), into DIR/report, and
        the live outputs from it. Returns the summary."""
        if self.full_rerun:
            return self.last_summary
        info = self._batch_info()
        if not info:
            return None
        last = max(info)
        from pyspark import StorageLevel
        from spark.report import _report
        report_dir = os.path.join(self.out, "report")
        tr = self.steps(info)
        if tr is None:
            return None
        tr = tr.persist(StorageLevel.MEMORY_AND_DISK)
        cached = [tr]
        try:
            summary = _report(self.spark, tr, cached, sorted(self.sources()), report_dir,
                              self.objectives, self.ttl_over, False, {}, time.time(), True)
        finally:
            for df in cached:
                df.unpersist()
        self._full_live(last, summary, report_dir, info)
        return summary

    def steps(self, info: dict | None = None):
        """The per-message state as the batch report's step table (spark/report.py
        _step_table columns), from the steps deltas of the complete batches (`info`:
        batch id -> marker, default all on disk): each trace's rows from the newest delta
        that holds it; the `_meta` rows of every delta summed per (step, branch) as the
        report aggregates them. None before the first batch with lines."""
        from pyspark.sql import Window, functions as F
        info = self._batch_info() if info is None else info
        paths = [self._delta("steps", b) for b in info if os.path.exists(self._delta("steps", b))]
        if not paths:
            return None
        d = self.spark.read.parquet(*paths)
        w = Window.partitionBy("trace_id")
        traces = (d.filter("protocol <> '_meta'").withColumn("_last", F.max("_b").over(w))
                  .filter("_b = _last").drop("_last", "_b"))
        # ingest/plan rows add up: the report's per-step aggregation over the union
        first = "struct(ts, node)"
        meta = (d.filter("protocol = '_meta'").groupBy("trace_id", "protocol", "step", "branch").agg(
            F.min("ts").alias("ts"), F.expr(f"min_by(node, {first})").alias("node"),
            F.sum("n").alias("n"), F.sum("dup").alias("dup"),
            F.expr(f"min_by(detail, {first})").alias("detail"), F.max("hop").alias("hop"),
            F.array_distinct(F.flatten(F.collect_list("peers"))).alias("peers")))
        meta = meta.withColumns({
            "branches": F.sort_array(F.collect_set(
                F.when(~F.col("branch").isin("", "?"), F.col("branch"))).over(w)),
            "peers": F.array_distinct(F.flatten(F.collect_list("peers").over(w)))})
        return traces.unionByName(meta.select(*traces.columns))

    def _full_live(self, batch_id: int, summary: dict, report_dir: str, info: dict) -> dict:
        lat, dw = _windows(self.spark, report_dir)
        lat_rows = [r.asDict() for r in lat.collect()]
        dl_rows = [r.asDict() for r in dw.collect()] if dw is not None else None
        status = {"batch_id": batch_id, "batches": len(info),
                  "segments": sum(len(v["sources"]) for v in info.values()),
                  "lines": sum(v["lines"] for v in info.values()),
                  "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "updated_unix": time.time(),
                  "mode": "full-rerun" if self.full_rerun else "final",
                  "micro_batch": self._timing(),
                  "totals": totals(summary)}
        self._write_live(status, lat_rows, dl_rows)
        self.last_summary = summary
        self.seen_batch = batch_id
        return status

    def refresh(self, batch_id: int) -> dict | None:
        """Full-rerun mode: the batch report over every committed batch, then the live
        outputs from it (each refresh costs a whole report)."""
        from spark.report import run
        inputs = committed_batches(self.out)
        if not inputs:
            return None
        report_dir = os.path.join(self.out, "report")
        summary = run(inputs, report_dir, sla_path=self.sla_path, spark=self.spark)
        info = {b: v for b, v in self._batch_info().items() if b <= batch_id}
        return self._full_live(batch_id, summary, report_dir, info)

    def sources(self) -> set[str]:
        """Paths of every segment file in a batch whose state is complete."""
        return {_local(s) for v in self._batch_info().values() for s in v["sources"]}


#: batches whose parsed lines stay in memory for the next batches' gathering
RECENT_BATCHES = 3
#: pieces of the current records before they are merged into one (localCheckpoint)
MAX_PIECES = 16


def _local(uri: str) -> str:
    """The local path of a `_source` file URI (input_file_name)."""
    from urllib.parse import unquote, urlparse
    return unquote(urlparse(uri).path)


def _union(dfs: list):
    out = dfs[0]
    for df in dfs[1:]:
        out = out.unionByName(df)
    return out


def _release(df) -> None:
    """Frees the blocks of a DataFrame made by `localCheckpoint` (the checkpointed RDD under
    its plan) now rather than at the JVM's next garbage collection."""
    if df is None:
        return
    leaves = df._jdf.queryExecution().analyzed().collectLeaves().iterator()
    while leaves.hasNext():
        leaf = leaves.next()
        try:
            leaf.rdd().unpersist(False)
        except Exception:  # noqa: BLE001 - a file scan, not a checkpointed RDD: nothing held
            pass


def _iso_us(us: int) -> str | None:
    if not us:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(us / 1e6)) + f".{us % 1000000:06d}Z"


def _write_rows(path: str, rows: list[dict], cols: list[str]) -> None:
    """A few hundred rows as a Parquet directory with one part file (pyarrow, no Spark job),
    replaced whole."""
    import shutil
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.Table.from_pylist([{c: r.get(c) for c in cols} for r in rows]) if rows else \
        pa.table({c: pa.array([], pa.string()) for c in cols})
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    pq.write_table(table, os.path.join(tmp, "part-00000.parquet"))
    open(os.path.join(tmp, "_SUCCESS"), "w").close()
    old = path + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(path):
        os.rename(path, old)
    os.rename(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="relay-trace-report --follow",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("logdir", help="the daemons' log directory (reads LOGDIR/segments/*.jsonl)")
    ap.add_argument("--out", required=True, help="output directory (live/, report/, state/, checkpoint/)")
    ap.add_argument("--master", default=None, help="Spark master URL (default local[2])")
    ap.add_argument("--sla", default=None, help="SLA objectives TOML (default spark/sla.toml)")
    ap.add_argument("--trigger-s", type=float, default=1.0, help="seconds between micro-batches")
    ap.add_argument("--refresh-s", type=int, default=5, help="the live page's refresh interval")
    ap.add_argument("--exit-on", metavar="FILE", default=None,
                    help="stop once FILE exists and every segment present then is committed")
    ap.add_argument("--full-rerun", action="store_true",
                    help="each refresh reruns the whole batch report over every event read "
                         "(the slow mode the incremental state replaced; a baseline)")
    ap.add_argument("--spark-log-level", default=None, metavar="LEVEL")
    return ap


def main(argv: list[str] | None = None) -> int:
    from spark.report import build_session, job_jvm, quiet_jvm
    args = build_parser().parse_args(argv)
    quiet_jvm(args.spark_log_level, [])
    job_jvm(small=True)
    spark = build_session(args.master or "local[2]", small_input=True)
    follower = Follower(spark, args.logdir, args.out, args.sla, args.trigger_s, args.refresh_s,
                        full_rerun=args.full_rerun)
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
                if present <= follower.sources():
                    break
        if query.exception():
            print(f"relay-trace-report --follow: {query.exception()}", file=sys.stderr)
            return 1
        query.stop()
        follower.finish()
    finally:
        query.stop()
        spark.stop()
    if follower.last_summary is not None:
        print(json.dumps({"live": os.path.join(follower.out, "live", "index.html"),
                          "totals": totals(follower.last_summary)}, default=str))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
