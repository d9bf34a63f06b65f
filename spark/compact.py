"""Convert rotated JSON-lines event logs to Parquet, once, so reports read columns instead of
re-parsing JSON (DESIGN.md section 6: 70 s from JSON vs 40 s from Parquet at 5M events).

    relay-trace-report ... --parquet-cache DIR      (compact, then report from DIR)
    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit spark/compact.py --out DIR logs/*.jsonl
    .venv/bin/python -m spark.compact --out DIR [--master URL] logs/*.jsonl.1 ...

Intended to run on each rotated file (RotatingFileHandler's `name.N`): `--append` adds the
new files' rows to DIR/events.parquet. Same explicit schema as the report (spark/schema.py);
corrupt lines are kept with their `_corrupt_record` and every row keeps `_source` (the log
file), so the report counts torn/bad lines per file exactly as it does from JSON. Output
is sorted by trace_id within files (better compression, cheaper grouping later).
"""
from __future__ import annotations

import argparse
import sys

from spark.schema import read_events


def compact(spark, inputs: list[str], out_dir: str, append: bool = False,
            files: int | None = None) -> str:
    """Write inputs (JSON logs) as Parquet to out_dir/events.parquet; returns that path.
    files: number of output files (default: Spark's choice, at least one per core)."""
    df = read_events(spark, inputs)
    if files:
        df = df.repartition(files)
    path = out_dir.rstrip("/") + "/events.parquet"
    (df.sortWithinPartitions("trace_id", "ts")
     .write.mode("append" if append else "overwrite")
     .option("compression", "snappy").parquet(path))
    return path


def main(argv: list[str] | None = None) -> int:
    from spark.report import build_session
    ap = argparse.ArgumentParser(prog="relay-trace-compact", description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--out", required=True, help="directory; writes DIR/events.parquet")
    ap.add_argument("--master", default=None)
    ap.add_argument("--append", action="store_true")
    args = ap.parse_args(argv)
    spark = build_session(args.master)
    try:
        print(compact(spark, args.inputs, args.out, args.append))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
