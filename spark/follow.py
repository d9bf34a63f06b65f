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
foreachBatch sink that keeps per-message state in Parquet, versioned by batch id:

1. the micro-batch's lines, each with its `_source` file, go to
   `DIR/events/b-<batch id>.parquet` (overwritten when a restarted query replays that
   batch: the file source's offset log fixes which files a batch id holds);
2. per-message state (`DIR/state/*-<batch id>.parquet`, built from the newest version
   before the batch): `steps` is the batch report's step table (spark/report.py
   _step_table: one row per trace, protocol, step and branch; the ingest and plan rows as
   protocol `_meta`). The traces the micro-batch touches are recomputed from all their
   events (a later fact or branch of a trace applies to its earlier steps, as in the batch
   report); `_meta` rows are summed in; other traces are kept as they are. `branches` (per
   trace and branch: the outcome columns of spark/stages.py outcome_sql without a
   watermark, nodes, start, deadline) and `stages` (raw stage edges) are replaced for the
   touched traces only. `state/batches/<id>.json` (lines and segment files of the batch)
   is written last: it marks the version complete;
3. the live outputs, from the state: the watermark is the latest event time read; a
   (trace, branch) with no decision whose deadline (start + ttl) is behind it becomes
   `lost_or_stuck` (the timeout: spark/stages.py timed_out_sql, the rule the batch report
   applies at the end of its logs), else it stays `in_flight`, and a later line can still
   settle it; the plan's faults (planned or not) and the clock corrections (spark/clock.py)
   are applied as the report applies them.

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
`b-<id>.parquet` and the same state version, merged from the version before it, so no line
is counted twice and none is lost. Delete DIR to start over.
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
    """The streaming job: `Follower(spark, logdir, out, sla_path=None, trigger_s=2.0,
    refresh_s=5, full_rerun=False)`; `start()` returns the StreamingQuery, `finish()`
    writes the end-of-run report from the state. Output layout and state: module doc."""

    def __init__(self, spark, logdir: str, out: str, sla_path: str | None = None,
                 trigger_s: float = 2.0, refresh_s: int = 5, full_rerun: bool = False):
        self.spark = spark
        self.logdir = os.path.abspath(logdir)
        self.out = os.path.abspath(out)
        self.sla_path = sla_path
        self.trigger_s = trigger_s
        self.refresh_s = refresh_s
        self.full_rerun = full_rerun
        self.last_summary: dict | None = None
        self.seen_batch = -1
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

    def _state(self, name: str, batch_id: int) -> str:
        return os.path.join(self.out, "state", f"{name}-{batch_id:08d}.parquet")

    def _batch_info(self) -> dict[int, dict]:
        """batch id -> {lines, sources} of every batch whose state is complete."""
        out = {}
        for p in glob.glob(os.path.join(self.out, "state", "batches", "*.json")):
            with open(p) as fh:
                out[int(Path(p).stem)] = json.load(fh)
        return dict(sorted(out.items()))

    def _base(self, batch_id: int) -> int | None:
        """The newest state version before `batch_id` (a replayed batch merges into the
        state before it again, never into its own output)."""
        ids = [b for b in self._batch_info() if b < batch_id]
        return max(ids) if ids else None

    def _batch(self, df, batch_id: int) -> None:
        from spark.schema import SOURCE
        path = os.path.join(self.out, "events", f"b-{batch_id:08d}.parquet")
        df.write.mode("overwrite").parquet(path)
        per_file = self.spark.read.parquet(path).groupBy(SOURCE).count().collect()
        info = {"lines": sum(r["count"] for r in per_file),
                "sources": sorted(r[SOURCE] for r in per_file)}
        if self.full_rerun:
            self._record(batch_id, info)
            self.refresh(batch_id)
            return
        if info["lines"]:
            self._merge(batch_id, path)
        else:
            self._carry(batch_id)
        self._record(batch_id, info)
        self._live(batch_id)

    def _record(self, batch_id: int, info: dict) -> None:
        _write_atomic(os.path.join(self.out, "state", "batches", f"{batch_id:08d}.json"),
                      json.dumps(info))
        # versions older than the base of the next batch are no longer needed
        keep = {batch_id, self._base(batch_id)}
        import shutil
        for p in glob.glob(os.path.join(self.out, "state", "*-*.parquet")):
            b = int(p.rsplit("-", 1)[1].split(".")[0])
            if b < batch_id and b not in keep:
                shutil.rmtree(p, ignore_errors=True)

    def _carry(self, batch_id: int) -> None:
        """An empty batch: state `batch_id` = its base (hard links, no Spark job)."""
        import shutil
        base = self._base(batch_id)
        for name in ("steps", "branches", "stages"):
            dst = self._state(name, batch_id)
            shutil.rmtree(dst, ignore_errors=True)
            if base is not None:
                shutil.copytree(self._state(name, base), dst, copy_function=os.link)

    def _merge(self, batch_id: int, path: str) -> None:
        """Merges micro-batch `batch_id` (its events at `path`) into the per-message state:
        the step table rows of every trace it touches are recomputed from all that trace's
        events (the batch report's stage model, spark/report.py _step_table, so a fact or a
        branch logged later applies to earlier steps as in the batch report), the ingest and
        plan rows (`_meta`) are added, and the (trace, branch) records and stage rows of the
        touched traces replace their old ones. Other traces are not recomputed."""
        from pyspark.sql import Window, functions as F
        from spark.report import _step_table, branch_records
        spark = self.spark
        base = self._base(batch_id)
        tmp = os.path.join(self.out, "state", f"tmp-{batch_id:08d}")
        new = _step_table(spark, [path], peers=True)
        new_path = os.path.join(tmp, "new.parquet")
        new.write.mode("overwrite").parquet(new_path)
        new = spark.read.parquet(new_path)
        touched = new.filter("protocol <> '_meta'").select("trace_id").distinct()
        # every event of the touched traces, from all batches up to this one
        inputs = [p for p in committed_batches(self.out)
                  if int(p.rsplit("-", 1)[1].split(".")[0]) <= batch_id]
        ev = spark.read.parquet(*inputs).join(F.broadcast(touched), "trace_id", "left_semi")
        ev_path = os.path.join(tmp, "touched.parquet")
        ev.write.mode("overwrite").parquet(ev_path)
        fresh = _step_table(spark, [ev_path], peers=True).filter("protocol <> '_meta'")
        meta = new.filter("protocol = '_meta'")
        if base is not None:
            old = spark.read.parquet(self._state("steps", base))
            meta = meta.unionByName(old.filter("protocol = '_meta'"))
            kept = old.filter("protocol <> '_meta'").join(touched, "trace_id", "left_anti")
        else:
            kept = None
        # ingest/plan rows add up: the report's per-step aggregation over the union
        first = "struct(ts, node)"
        meta = (meta.groupBy("trace_id", "protocol", "step", "branch").agg(
            F.min("ts").alias("ts"), F.expr(f"min_by(node, {first})").alias("node"),
            F.sum("n").alias("n"), F.sum("dup").alias("dup"),
            F.expr(f"min_by(detail, {first})").alias("detail"), F.max("hop").alias("hop"),
            F.array_distinct(F.flatten(F.collect_list("peers"))).alias("peers")))
        w = Window.partitionBy("trace_id")
        meta = meta.withColumns({
            "branches": F.sort_array(F.collect_set(
                F.when(~F.col("branch").isin("", "?"), F.col("branch"))).over(w)),
            "peers": F.array_distinct(F.flatten(F.collect_list("peers").over(w)))})
        cols = fresh.columns
        steps = fresh.unionByName(meta.select(*cols))
        if kept is not None:
            steps = steps.unionByName(kept.select(*cols))
        steps.write.mode("overwrite").parquet(self._state("steps", batch_id))
        # the touched traces' (trace, branch) records: outcome without a watermark
        # (undecided = in_flight); the timeout is applied when the windows are read
        rec, _ = branch_records(spark, fresh, self.ttl_default, "CAST(NULL AS BIGINT)",
                                "false", peers=True, keep_nodes=True)
        rec_path = os.path.join(tmp, "records.parquet")
        rec.drop("planned").write.mode("overwrite").parquet(rec_path)
        rec = spark.read.parquet(rec_path)
        br = rec.drop("sa")
        sg = (rec.select("trace_id", "protocol", "branch", F.explode("sa").alias("s"))
              .filter("s IS NOT NULL").select("trace_id", "protocol", "branch", "s.*"))
        if base is not None:
            br = br.unionByName(spark.read.parquet(self._state("branches", base))
                                .join(touched, "trace_id", "left_anti"))
            sg = sg.unionByName(spark.read.parquet(self._state("stages", base))
                                .join(touched, "trace_id", "left_anti"))
        br.write.mode("overwrite").parquet(self._state("branches", batch_id))
        sg.write.mode("overwrite").parquet(self._state("stages", batch_id))
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)

    def _meta_rows(self, steps):
        """(per protocol {t0, t1, duplicates}, ingest rows, plan rows) from the step state."""
        from pyspark.sql import functions as F
        per_proto, meta = {}, []
        for r in steps.groupBy("protocol").agg(
                F.min("ts").alias("t0"), F.max("ts").alias("t1"),
                F.sum("dup").alias("duplicates"),
                F.collect_list(F.when(F.col("protocol") == "_meta", F.struct(
                    "step", "branch", "n"))).alias("meta")).collect():
            if r["protocol"] == "_meta":
                meta = [m.asDict() for m in r["meta"]]
            else:
                per_proto[r["protocol"]] = {"t0": r["t0"], "t1": r["t1"],
                                            "duplicates": r["duplicates"]}
        plan_rows = [json.loads(m["branch"]) for m in meta if m["step"] == "meta:plan"]
        return per_proto, meta, plan_rows

    def _live(self, batch_id: int) -> dict | None:
        """The live outputs from state `batch_id`: watermark = the latest event time read;
        undecided (trace, branch) rows past their deadline become lost_or_stuck; the
        planned faults, clock corrections and per-minute windows as the report makes them."""
        from pyspark.sql import functions as F
        from spark.clock import align
        from spark.plan import parse as parse_plan
        from spark.report import CLOCK_TOLERANCE_MS, OUTCOME_COLUMNS, _with_corr
        from spark.stages import timed_out_sql
        spark = self.spark
        if not os.path.exists(self._state("steps", batch_id)):
            return None
        steps = spark.read.parquet(self._state("steps", batch_id))
        per_proto, meta, plan_rows = self._meta_rows(steps)
        plan = parse_plan([r for r in plan_rows if r["event"].startswith("demo.plan.")])
        wm = max((r["t1"] for r in per_proto.values()), default=0) or 0
        br = spark.read.parquet(self._state("branches", batch_id)).withColumns({
            "outcome": F.expr(f"CASE WHEN outcome = 'in_flight' AND "
                              f"{timed_out_sql(wm, 'start_us', 'ttl_s')} THEN 'lost_or_stuck' "
                              f"ELSE outcome END"),
            "planned": F.expr(plan.planned_sql())})
        sg = spark.read.parquet(self._state("stages", batch_id))
        pairs = (sg.filter("clock AND from_node <> to_node").groupBy("from_node", "to_node")
                 .agg((F.min(F.col("to_ts") - F.col("from_ts")) / 1000.0).alias("d_ms")).collect())
        clock = align({(r["from_node"], r["to_node"]): r["d_ms"] for r in pairs},
                      CLOCK_TOLERANCE_MS, plan.hosts)
        st = _with_corr(spark, sg, clock.corrections, {"to_node": "c_to", "from_node": "c_from"})
        st = st.select("trace_id", "protocol", "branch", "stage", F.timestamp_micros(F.col("from_ts") + (
            F.col("c_from") * 1000).cast("long")).alias("from_ts"),
            ((F.col("to_ts") - F.col("from_ts")) / 1000.0 + F.col("c_to") - F.col("c_from"))
            .alias("duration_ms"))
        lat = (st.groupBy(F.window("from_ts", "1 minute").start.alias("minute"), "protocol", "stage")
               .agg(F.count("*").alias("count"),
                    F.percentile_approx("duration_ms", 0.5, 10000).alias("p50_ms"),
                    F.percentile_approx("duration_ms", 0.99, 10000).alias("p99_ms")))
        sent = br.filter("sent")
        dw = (sent.groupBy(F.window(F.timestamp_micros("start_us"), "1 minute").start.alias("minute"),
                           "protocol", "outcome").count())
        tot = sent.groupBy("protocol", "planned").agg(
            F.count(F.lit(1)).alias("sent"), F.count_if("delivered").alias("delivered"),
            *[F.count_if(F.col("outcome") == o).alias(o) for o in OUTCOME_COLUMNS],
            F.count_if("late").alias("late"))
        st = st.join(br.select("trace_id", "protocol", "branch", "planned"),
                     ["trace_id", "protocol", "branch"], "left")
        latency_idx = self._latency_index(st)
        lat_rows = sorted((r.asDict() for r in lat.collect()),
                          key=lambda r: (r["minute"], r["protocol"], r["stage"]))
        dl_rows = sorted((r.asDict() for r in dw.collect()),
                         key=lambda r: (r["minute"], r["protocol"], r["outcome"]))
        delivery: dict[str, dict] = {}
        keys = ("branches", "sent", "delivered", *OUTCOME_COLUMNS, "late")
        for r in tot.collect():
            d = delivery.setdefault(r["protocol"], {
                **dict.fromkeys(keys, 0), "planned": dict.fromkeys(keys, 0),
                "unplanned": dict.fromkeys(keys, 0)})
            part = d["planned" if r["planned"] else "unplanned"]
            for k in keys:
                v = r["sent" if k == "branches" else k]
                d[k] += v
                part[k] += v
        sla = self._objectives(latency_idx, delivery)
        info = {b: v for b, v in self._batch_info().items() if b <= batch_id}
        status = {"batch_id": batch_id, "batches": len(info),
                  "segments": sum(len(v["sources"]) for v in info.values()),
                  "lines": sum(v["lines"] for v in info.values()),
                  "watermark": _iso_us(wm),
                  "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "updated_unix": time.time(), "mode": "incremental",
                  "totals": {"delivery": dict(sorted(delivery.items())), "sla": sla}}
        self._write_live(status, lat_rows, dl_rows)
        self.seen_batch = batch_id
        return status

    def _latency_index(self, st) -> dict:
        """The report's latency index (spark/report.py evaluate_sla: scope -> (protocol,
        stage) -> count, quantiles, over, within) of the stage rows `st` (duration_ms,
        planned), for the live objectives."""
        from pyspark.sql import functions as F
        from spark.report import _nearest
        quant = [o for o in self.objectives if "quantile" in o]
        limits = sorted({float(o["max_ms"]) for o in quant})
        within = [(i, o) for i, o in enumerate(self.objectives) if "within_ms" in o]
        qs = sorted({0.5, 0.9, 0.99} | {float(o["quantile"]) for o in quant})
        aggs = []
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
        for r in st.groupBy("protocol", "stage").agg(*aggs).collect():
            for scope, pre in (("all", ""), ("unplanned", "u_")):
                idx[scope][(r["protocol"], r["stage"])] = {
                    "count": r[pre + "count"],
                    "quantiles": dict(zip(qs, (_nearest(v) for v in (r[pre + "pq"] or [None] * len(qs))))),
                    "over": {lim: r[f"{pre}over_{j}"] for j, lim in enumerate(limits)},
                    "within": {i: r[f"{pre}within_{i}"] for i, _ in within}}
        return idx

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
        steps_path = self._state("steps", last)
        if not os.path.exists(steps_path):
            return None
        from pyspark import StorageLevel
        from spark.report import _report
        report_dir = os.path.join(self.out, "report")
        tr = self.spark.read.parquet(steps_path).persist(StorageLevel.MEMORY_AND_DISK)
        cached = [tr]
        try:
            summary = _report(self.spark, tr, cached, committed_batches(self.out), report_dir,
                              self.objectives, self.ttl_over, False, {}, time.time(), True)
        finally:
            for df in cached:
                df.unpersist()
        self._full_live(last, summary, report_dir, info)
        return summary

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
        from urllib.parse import unquote, urlparse
        return {unquote(urlparse(s).path) for v in self._batch_info().values()
                for s in v["sources"]}


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
    ap.add_argument("--out", required=True, help="output directory (live/, report/, events/, checkpoint/)")
    ap.add_argument("--master", default=None, help="Spark master URL (default local[2])")
    ap.add_argument("--sla", default=None, help="SLA objectives TOML (default spark/sla.toml)")
    ap.add_argument("--trigger-s", type=float, default=2.0, help="seconds between micro-batches")
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
