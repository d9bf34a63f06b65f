"""The floor of a Spark job over the report's compacted Parquet: what any
Spark report over these events pays at least, for the bench to print next to the report
(bench_spark_report.py --floor).

    spark-submit ... bench/spark_floor.py --out DIR [--session-only] EVENTS.parquet

Reads the columns the report reads (trace_id, node, ts, and event + the whole attrs struct,
hashed per event as the report's `fact`), moves every event through ONE shuffle by trace_id
(the report shuffles its step rows, ~1.4 per event), ONE fixed-width hash aggregate per trace
(count, first and last ts, max node, xor of the facts) and ONE Parquet write; AQE off, like
the report for large input. No rules, no caches, no second query. With
--session-only: the JVM and the SparkSession, then one trivial action (the fixed cost of
any job). Prints one JSON line: session_s, job_s (seconds since the script started).
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    t0 = time.time()
    ap = argparse.ArgumentParser()
    ap.add_argument("input")
    ap.add_argument("--out", required=True)
    ap.add_argument("--session-only", action="store_true")
    args = ap.parse_args(argv)
    from pyspark.sql import SparkSession, functions as F
    spark = (SparkSession.builder.appName("relay-trace-floor")
             .config("spark.sql.adaptive.enabled", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    t1 = time.time()
    try:
        if args.session_only:
            spark.range(1).count()
        else:
            ev = (spark.read.parquet(args.input)
                  .select("trace_id", "node", "ts", F.hash("event", "attrs").alias("fact")))
            (ev.repartition("trace_id").groupBy("trace_id").agg(
                F.count(F.lit(1)).alias("n"), F.min("ts").alias("t0"), F.max("ts").alias("t1"),
                F.max("node").alias("node"), F.bit_xor("fact").alias("facts"))
             .write.mode("overwrite").parquet(args.out))
        t2 = time.time()
    finally:
        spark.stop()
    print(json.dumps({"session_s": round(t1 - t0, 2), "job_s": round(t2 - t1, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
