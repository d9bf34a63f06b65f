"""Benchmark: the Spark trace report vs a single-machine DuckDB baseline computing the same
tables (steps per trace, stage durations with clock correction, latency percentiles per
stage, delivery outcomes, ordered hops written as Parquet) in the same run.

    .venv/bin/python bench/bench_spark_report.py [--events 5000000] [--dir /tmp/relay-bench]
        [--driver-memory 3g] [--partitions 8] [--skip-json]

Steps: generate logs once (bench/gen_eventlog.py, reused when the event count matches),
then each engine runs in its own child process while this process samples the child's
process tree (driver JVM + Python workers; DuckDB's Python) every 0.1 s for peak RSS:
1. DuckDB over the JSON logs (threads = 2, like local[2]).
2. Spark: `spark-submit --master local[2] --driver-memory M spark/report.py` over the JSON
   (session start included: wall time of the whole spark-submit).
3. spark/compact.py (JSON -> Parquet, what a rotation hook does once per rotated file;
   reported separately, not part of the report's time).
4. Spark: the same report over the compacted Parquet.
Prints wall s, peak MB, and each Spark run's ratio to DuckDB. Not part of the test suite.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


# ----------------------------------------------------------------------------- measuring

def measure(cmd: list[str], env=None, log: Path | None = None) -> dict:
    """Run cmd; wall time and peak RSS (MB) of its whole process tree."""
    start = time.time()
    out = open(log, "w") if log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=str(REPO))
    peak = 0
    ps = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            rss = ps.memory_info().rss + sum(c.memory_info().rss for c in ps.children(recursive=True))
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(0.1)
    if log:
        out.close()
    return {"wall_s": round(time.time() - start, 2), "peak_mb": round(peak / 1e6),
            "rc": proc.returncode}


# ----------------------------------------------------------------------------- DuckDB baseline

def duckdb_report(inputs: list[str], out: str, threads: int = 2) -> dict:
    """The report's tables with DuckDB (same stage model, spark/stages.py, same clock rule)."""
    import duckdb

    from spark.clock import align
    from spark.schema import duckdb_columns, known_events
    from spark.stages import PROTOCOLS, derived

    con = duckdb.connect()
    con.execute(f"SET threads={threads}")
    files = "[" + ", ".join(f"'{p}'" for p in inputs) + "]"
    known = ", ".join(f"'{e}'" for e in sorted(known_events()))
    der = ", ".join(f"{sql} AS {name}" for name, sql in derived("duckdb").items())
    con.execute(f"""
        CREATE TEMP TABLE ev0 AS SELECT *, epoch_us(TRY_CAST(ts AS TIMESTAMPTZ)) AS ts_us
        FROM read_json({files}, format='newline_delimited', columns={duckdb_columns()},
                       ignore_errors=true)
        WHERE ts IS NOT NULL AND event IN ({known}) AND trace_id IS NOT NULL""")
    con.execute(f"CREATE TEMP TABLE ev1 AS SELECT *, {der} FROM ev0")
    facts = {}
    for p in PROTOCOLS.values():
        facts.update(p.facts)
    fsql = ", ".join(f"max({sql}) OVER (PARTITION BY trace_id) AS {n}" for n, sql in facts.items())
    con.execute(f"CREATE TEMP TABLE ev AS SELECT *, {fsql} FROM ev1")

    parts = []
    for p in PROTOCOLS.values():
        for r in p.rules:
            step = f"'{p.name}:' || ({r.step_sql})" if r.step_sql else f"'{p.name}:{r.step}'"
            branch = "''" if r.branch is None else f"coalesce(CAST(({r.branch}) AS VARCHAR), '?')"
            detail = f"CAST(({r.detail}) AS VARCHAR)" if r.detail else "NULL::VARCHAR"
            parts.append(f"CASE WHEN event = '{r.event}' AND ({r.when}) THEN "
                         f"{{'step': {step}, 'branch': {branch}, 'detail': {detail}, "
                         f"'hop': {str(r.hop).lower()}}} END")
    con.execute(f"""
        CREATE TEMP TABLE st AS SELECT trace_id, substr(event, 1, strpos(event, '.') - 1) AS protocol,
            node, ts_us, hash(event, attrs) AS fact, s.step, s.branch, s.detail, s.hop
        FROM (SELECT *, unnest(list_filter([{', '.join(parts)}], lambda x: x IS NOT NULL)) AS s FROM ev)""")
    con.execute("""
        CREATE TEMP TABLE steps AS
        WITH pp AS (SELECT trace_id, protocol, step, branch, node, fact, detail, min(ts_us) AS ts,
                           count(*) AS n, bool_or(hop) AS hop FROM st GROUP BY ALL)
        SELECT trace_id, protocol, step, branch, min(ts) AS ts, arg_min(node, ts) AS node,
               sum(n) AS n, sum(CASE WHEN branch = '?' THEN 0 ELSE n - 1 END) AS dup,
               arg_min(detail, ts) AS detail, bool_or(hop) AS hop FROM pp GROUP BY ALL""")
    con.execute("""
        CREATE TEMP TABLE tb AS
        WITH br AS (SELECT trace_id, protocol,
                           coalesce(list_sort(list(DISTINCT branch) FILTER (
                               WHERE branch NOT IN ('', '?'))), []) AS bs
                    FROM steps GROUP BY ALL)
        SELECT trace_id, protocol, unnest(CASE WHEN len(bs) = 0 THEN [''] ELSE bs END) AS branch,
               len(bs) AS nb, coalesce(bs[1], '') AS fb FROM br""")
    con.execute("""
        CREATE TEMP TABLE rs AS
        SELECT tb.trace_id, tb.protocol, tb.branch, tb.fb, s.step, s.ts, s.node, s.detail
        FROM tb JOIN steps s ON s.trace_id = tb.trace_id AND
             (s.branch IN ('', tb.branch) OR (s.branch = '?' AND tb.nb <= 1))
        QUALIFY row_number() OVER (PARTITION BY tb.trace_id, tb.branch, s.step
                                   ORDER BY s.branch = '?') = 1""")
    edges = []
    for p in PROTOCOLS.values():
        roots = p.root_steps()
        for e in p.stages:
            edges.append((p.name, e.name, f"{p.name}:{e.from_step}", f"{p.name}:{e.to_step}",
                          e.e2e, e.clock, e.from_step in roots and e.to_step in roots))
    con.execute("CREATE TEMP TABLE edges (protocol VARCHAR, stage VARCHAR, f VARCHAR, t VARCHAR,"
                " e2e BOOLEAN, clock BOOLEAN, rr BOOLEAN)")
    con.executemany("INSERT INTO edges VALUES (?, ?, ?, ?, ?, ?, ?)", edges)
    con.execute("""
        CREATE TEMP TABLE sr AS
        SELECT a.trace_id, a.protocol, a.branch, e.stage, e.e2e, e.clock, a.ts AS from_ts,
               b.ts AS to_ts, a.node AS from_node, b.node AS to_node
        FROM rs a JOIN edges e ON e.protocol = a.protocol AND e.f = a.step
        JOIN rs b ON b.trace_id = a.trace_id AND b.branch = a.branch AND b.step = e.t
        WHERE NOT e.rr OR a.branch = a.fb""")
    pairs = con.execute("""SELECT from_node, to_node, min(to_ts - from_ts) / 1000.0 FROM sr
                           WHERE clock AND from_node <> to_node GROUP BY ALL""").fetchall()
    clock = align({(a, b): d for a, b, d in pairs})
    con.execute("CREATE TEMP TABLE corr (node VARCHAR, ms DOUBLE)")
    if clock.corrections:
        con.executemany("INSERT INTO corr VALUES (?, ?)", list(clock.corrections.items()))
    con.execute("""
        CREATE TEMP TABLE stages AS
        SELECT sr.*, (to_ts - from_ts) / 1000.0 + coalesce(ct.ms, 0) - coalesce(cf.ms, 0) AS duration_ms
        FROM sr LEFT JOIN corr cf ON cf.node = sr.from_node LEFT JOIN corr ct ON ct.node = sr.to_node""")
    latency = con.execute("""
        SELECT protocol, stage, count(*), quantile_disc(duration_ms, [0.5, 0.9, 0.99]), max(duration_ms)
        FROM stages GROUP BY ALL ORDER BY ALL""").fetchall()
    # delivery outcomes per (trace, branch)
    log_end = con.execute("SELECT max(ts) FROM steps").fetchone()[0] or 0
    case = []
    for p in PROTOCOLS.values():
        o = p.outcomes

        def has(steps, p=p):
            return ("bool_or(step IN (" + ", ".join(f"'{p.name}:{s}'" for s in steps) + "))"
                    if steps else "false")
        ttl = (f"coalesce(TRY_CAST(max(CASE WHEN step = '{p.name}:{o.ttl_step}' THEN detail END)"
               f" AS DOUBLE), {o.default_ttl_s})" if o.ttl_step else str(o.default_ttl_s))
        start = ("coalesce(" + ", ".join(f"min(CASE WHEN step = '{p.name}:{s}' THEN ts END)"
                                         for s in o.start) + ", min(ts))")
        case.append(f"""WHEN protocol = '{p.name}' THEN CASE WHEN {has(o.answered)} THEN 'answered'
            WHEN {has(o.errored)} THEN 'errored' WHEN {has(o.expired)} THEN 'expired'
            WHEN {log_end} - {start} > {ttl} * 1000000 THEN 'lost_or_stuck' ELSE 'in_flight' END""")
    con.execute(f"""CREATE TEMP TABLE delivery AS SELECT trace_id, protocol, branch,
                    CASE {' '.join(case)} END AS outcome FROM rs GROUP BY trace_id, protocol, branch""")
    delivery = con.execute("SELECT protocol, outcome, count(*) FROM delivery GROUP BY ALL "
                           "ORDER BY ALL").fetchall()
    # hops with corrected ts, ordered, time spent
    con.execute("""
        CREATE TEMP TABLE hops AS
        SELECT trace_id, protocol, step, branch, s.node, n, dup,
               ts + CAST(coalesce(c.ms, 0) * 1000 AS BIGINT) AS ts_c,
               row_number() OVER w AS seq, (lead(ts_c) OVER w - ts_c) / 1000.0 AS spent_ms
        FROM steps s LEFT JOIN corr c ON c.node = s.node WHERE hop
        WINDOW w AS (PARTITION BY trace_id ORDER BY ts_c, step, branch)""")
    Path(out).mkdir(parents=True, exist_ok=True)
    for t in ("hops", "stages", "delivery"):
        con.execute(f"COPY {t} TO '{out}/{t}.parquet' (FORMAT parquet)")
    return {"latency": [(p, s, n, q, m) for p, s, n, q, m in latency if s == "round_trip"],
            "delivery": delivery, "clock_corrections": len(clock.corrections)}


# ----------------------------------------------------------------------------- driver

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--dir", default="/tmp/relay-bench")
    ap.add_argument("--driver-memory", default="3g")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--skip-json", action="store_true", help="skip Spark over JSON")
    ap.add_argument("--child-duckdb", nargs=2, metavar=("LOGDIR", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child_duckdb:
        logdir, out = args.child_duckdb
        res = duckdb_report(sorted(str(p) for p in Path(logdir).glob("*.jsonl")), out)
        print(json.dumps(res, default=str))
        return 0

    base = Path(args.dir)
    logs = base / f"logs-{args.events}"
    if not (logs / "DONE").exists():
        from gen_eventlog import generate
        t = time.time()
        n = generate(logs, args.events)
        (logs / "DONE").write_text(str(n))
        print(f"generated {n} events in {time.time() - t:.1f} s")
    size = sum(p.stat().st_size for p in logs.glob("*.jsonl"))
    inputs = sorted(str(p) for p in logs.glob("*.jsonl"))
    print(f"input: {args.events} events, {size / 1e6:.0f} MB JSON, {len(inputs)} files")

    py = sys.executable
    env = {**os.environ, "PYSPARK_PYTHON": py, "PYTHONPATH": str(REPO)}
    spark_submit = str(Path(py).parent / "spark-submit")
    submit = [spark_submit, "--master", "local[2]", "--driver-memory", args.driver_memory,
              "--conf", f"spark.sql.shuffle.partitions={args.partitions}",
              "--conf", "spark.ui.enabled=false", str(REPO / "spark" / "report.py")]
    results = {}

    results["duckdb_json"] = measure([py, __file__, "--child-duckdb", str(logs), str(base / "out-duckdb")],
                                     env, base / "duckdb.log")
    print("duckdb (JSON)        ", results["duckdb_json"], flush=True)
    if not args.skip_json:
        results["spark_json"] = measure(submit + ["--out", str(base / "out-spark-json")] + inputs,
                                        env, base / "spark-json.log")
        print("spark local[2] (JSON)", results["spark_json"], flush=True)
    results["compact"] = measure(
        [spark_submit, "--master", "local[2]", "--driver-memory", args.driver_memory,
         "--conf", f"spark.sql.shuffle.partitions={args.partitions}",
         str(REPO / "spark" / "compact.py"), "--out", str(base / "cache")] + inputs,
        env, base / "compact.log")
    print("compact JSON->Parquet", results["compact"], "(once per rotated file, not per report)",
          flush=True)
    results["spark_parquet"] = measure(
        submit + ["--out", str(base / "out-spark-parquet"), str(base / "cache" / "events.parquet")],
        env, base / "spark-parquet.log")
    print("spark local[2] (Parquet)", results["spark_parquet"], flush=True)

    d = results["duckdb_json"]["wall_s"]
    for key in ("spark_json", "spark_parquet"):
        if key in results:
            r = results[key]
            print(f"{key}: {r['wall_s']} s = {r['wall_s'] / d:.1f}x DuckDB ({d} s); "
                  f"peak {r['peak_mb']} MB vs DuckDB {results['duckdb_json']['peak_mb']} MB")
    (base / "bench-results.json").write_text(json.dumps(results, indent=2))
    return 0 if all(r["rc"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
