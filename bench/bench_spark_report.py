"""Benchmark: the Spark trace report vs a single-machine DuckDB baseline computing the same
tables (steps per trace, stage durations with clock correction, latency percentiles per
stage, delivery outcomes, ordered hops written as Parquet) in the same run.

    .venv/bin/python bench/bench_spark_report.py [--events 5000000] [--dir /tmp/relay-bench]
        [--driver-memory 3g] [--partitions 8] [--skip-json]
    .venv/bin/python bench/bench_spark_report.py --check LOGDIR    (equality check)
    .venv/bin/python bench/bench_spark_report.py --demo [LOGDIR]   (demo-size wall time, target 20 s)

Steps: generate logs once (bench/gen_eventlog.py, reused when the event count matches),
then each engine runs in its own child process while this process samples the child's
process tree (driver JVM + Python workers; DuckDB's Python) every 0.1 s for peak RSS:
1. DuckDB over the JSON logs (threads = 2, like local[2]).
2. Spark: `spark-submit --master local[2] --driver-memory M spark/report.py` over the JSON
   (session start included: wall time of the whole spark-submit).
3. spark/compact.py (JSON -> Parquet, what a rotation hook does once per rotated file;
   reported separately, not part of the report's time).
4. Spark: the same report over the compacted Parquet.
5. with --floor: the floor (bench/spark_floor.py, same spark-submit options): the session
   alone, and one query over the same Parquet (scan, one shuffle by trace_id, one aggregate,
   one write), what any Spark report here pays at least; with --jit-stats: -XX:+CITime and
   the JVM's CPU per thread group (tasks, C2, C1, GC, driver) for each Spark run.
Prints wall s, peak MB, and each Spark run's ratio to DuckDB. Not part of the test suite.

The DuckDB baseline is meant to be fair (what a competent DuckDB user writes, not a strawman):
read_json with explicit columns and format=newline_delimited, one pipeline from the JSON to
the per-step table, rules grouped by event name, no temp copies of the events. `--check
LOGDIR` runs Spark (in process, local[2]) and DuckDB over the same logs and compares
hops/stages/delivery row by row and the latency table (counts, max, and the percentiles
where Spark's are exact); it printed IDENTICAL at 300k events (gen_eventlog seed 1).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


# ----------------------------------------------------------------------------- measuring

#: JVM thread names (/proc/PID/task/TID/comm, 15 characters) -> group, for measure(threads=True)
JVM_THREAD_GROUPS = (("C2 CompilerThre", "jit_c2"), ("C1 CompilerThre", "jit_c1"),
                     ("Executor task", "tasks"), ("GC Thread", "gc"), ("VM Thread", "gc"))


def _jvm_threads(proc: psutil.Process, into: dict[int, tuple[str, float]]) -> None:
    """CPU seconds (user + system, psutil) per thread of `proc`, by thread id, with the
    thread's name (/proc/PID/task/TID/comm: psutil does not give thread names)."""
    for th in proc.threads():
        try:
            name = Path(f"/proc/{proc.pid}/task/{th.id}/comm").read_text().strip()
        except OSError:
            continue
        into[th.id] = (name, th.user_time + th.system_time)


def measure(cmd: list[str], env=None, log: Path | None = None, threads: bool = False) -> dict:
    """Run cmd; wall time, peak RSS (MB) and CPU time (user + system s, the last sample of
    each process; less sensitive to other load than wall time) of its whole process tree.
    threads: also the CPU of the JVM's threads by group (JVM_THREAD_GROUPS; `other` is the
    driver: py4j, planning, scheduling, Janino), sampled every 0.5 s, so up to 0.5 s of a
    thread's last work is missed."""
    start = time.time()
    out = open(log, "w") if log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=str(REPO))
    peak = 0
    cpu: dict[int, float] = {}
    per_thread: dict[int, tuple[str, float]] = {}
    ps = psutil.Process(proc.pid)
    i = 0
    while proc.poll() is None:
        try:
            rss = 0
            for p in [ps] + ps.children(recursive=True):
                with p.oneshot():
                    rss += p.memory_info().rss
                    cpu[p.pid] = sum(p.cpu_times()[:2])
                    if threads and i % 5 == 0 and p.name() == "java":
                        _jvm_threads(p, per_thread)
            peak = max(peak, rss)
        except (psutil.Error, OSError):
            pass
        i += 1
        time.sleep(0.1)
    if log:
        out.close()
    res = {"wall_s": round(time.time() - start, 2), "peak_mb": round(peak / 1e6),
           "cpu_s": round(sum(cpu.values()), 1), "rc": proc.returncode}
    if threads and per_thread:
        groups: dict[str, float] = {}
        for name, s in per_thread.values():
            g = next((g for prefix, g in JVM_THREAD_GROUPS if name.startswith(prefix)), "other")
            groups[g] = groups.get(g, 0.0) + s
        res["jvm_threads_cpu_s"] = {g: round(v, 1) for g, v in sorted(groups.items())}
    return res


def jit_times(log: Path) -> dict:
    """The JIT compile times a JVM run with -XX:+CITime printed at exit (seconds: total,
    C1, C2; the compiler threads' time, which on 2 cores competes with the tasks)."""
    import re
    out = {}
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return out
    for key, pat in (("total_s", r"Total compilation time\s*:\s*([\d.]+) s"),
                     ("c1_s", r"C1 Compile Time:\s*([\d.]+) s"),
                     ("c2_s", r"C2 Compile Time:\s*([\d.]+) s")):
        m = re.search(pat, text)
        if m:
            out[key] = float(m.group(1))
    m = re.search(r"C2 \{speed:.*?standard:\s*[\d.]+ s, \d+ bytes, (\d+) methods", text)
    if m:
        out["c2_methods"] = int(m.group(1))
    return out


# ----------------------------------------------------------------------------- DuckDB baseline

def duckdb_report(inputs: list[str], out: str, threads: int = 2, facts_by: str = "join") -> dict:
    """The report's tables with DuckDB, written the way a DuckDB user would: read_json with
    explicit columns (newline-delimited, only the columns the rules use are materialized),
    one pipeline from the JSON to the per-step table (derived columns, trace facts, rule
    matching grouped by event name, the two aggregations), materialized once because the
    stages, delivery and hops tables all read it; then the per-branch step records (read by
    stages and delivery), clock alignment (spark/clock.py) and the three Parquet outputs.
    threads = 2 (like local[2]). Same stage model (spark/stages.py) as the Spark job;
    `--check` compares the outputs table by table."""
    import duckdb

    from spark.clock import align
    from spark.schema import duckdb_columns, known_events
    from spark.stages import PROTOCOLS, derived, outcome_sql
    from spark.report import CLOCK_TOLERANCE_MS, load_sla
    ttl_over = load_sla(None).get("ttl_s", {})

    con = duckdb.connect()
    con.execute(f"SET threads={threads}")
    con.execute("SET preserve_insertion_order=false")
    files = "[" + ", ".join(f"'{p}'" for p in inputs) + "]"
    known = ", ".join(f"'{e}'" for e in sorted(known_events()))
    der = ", ".join(f"{sql} AS {name}" for name, sql in derived("duckdb").items())
    facts = {}
    for p in PROTOCOLS.values():
        facts.update(p.facts)
    # rules grouped by event: a row evaluates only its own event's rules (no lambda)
    by_event: dict[str, list[str]] = {}
    for p in PROTOCOLS.values():
        for r in p.rules:
            step = f"'{p.name}:' || ({r.step_sql})" if r.step_sql else f"'{p.name}:{r.step}'"
            branch = "''" if r.branch is None else f"coalesce(CAST(({r.branch}) AS VARCHAR), '?')"
            detail = f"CAST(({r.detail}) AS VARCHAR)" if r.detail else "NULL::VARCHAR"
            by_event.setdefault(r.event, []).append(
                f"CASE WHEN {r.when} THEN {{'step': {step}, 'branch': {branch}, "
                f"'detail': {detail}, 'hop': {str(r.hop).lower()}}} END")
    rules = "CASE event " + " ".join(
        f"WHEN '{e}' THEN [{', '.join(parts)}]" for e, parts in by_event.items()) + " END"
    if facts_by == "window":
        fact_cte = ""
        fact_cols = ", ".join(f"max({sql}) OVER (PARTITION BY trace_id) AS {n}"
                              for n, sql in facts.items())
        evf = f"SELECT *, {fact_cols} FROM ev"
    else:
        fact_cte = (", facts AS (SELECT trace_id, " + ", ".join(
            f"max({sql}) AS {n}" for n, sql in facts.items()) +
            " FROM ev WHERE event LIKE 'rmb.%' GROUP BY trace_id)")
        evf = "SELECT * FROM ev LEFT JOIN facts USING (trace_id)"
    con.execute(f"""
        CREATE TEMP TABLE steps AS
        WITH ev AS (
            SELECT trace_id, node, event, attrs,
                   epoch_us(TRY_CAST(ts AS TIMESTAMP)) AS ts_us, {der}
            FROM read_json({files}, format='newline_delimited', columns={duckdb_columns()},
                           ignore_errors=true)
            WHERE ts IS NOT NULL AND event IN ({known}) AND trace_id IS NOT NULL
                  AND trace_id <> ''){fact_cte},
        st AS (
            SELECT trace_id, protocol, node, ts_us, fact, s.step, s.branch, s.detail, s.hop
            FROM (SELECT trace_id, substr(event, 1, strpos(event, '.') - 1) AS protocol, node,
                         ts_us, hash(event, attrs) AS fact, unnest({rules}) AS s
                  FROM ({evf}))
            WHERE s IS NOT NULL),
        pp AS (SELECT trace_id, protocol, step, branch, node, fact, detail, min(ts_us) AS ts,
                      count(*) AS n, bool_or(hop) AS hop FROM st GROUP BY ALL)
        SELECT trace_id, protocol, step, branch, min(ts) AS ts,
               arg_min(node, {{'t': ts, 'n': node}}) AS node,
               sum(n) AS n, sum(CASE WHEN branch = '?' THEN 0 ELSE n - 1 END) AS dup,
               arg_min(detail, {{'t': ts, 'n': node}}) AS detail, bool_or(hop) AS hop
        FROM pp GROUP BY ALL""")
    # per (trace, branch) the step records: root steps, the branch's own, `?` of single-branch
    con.execute("""
        CREATE TEMP TABLE rs AS
        WITH br AS (SELECT trace_id, protocol,
                           coalesce(list_sort(list(DISTINCT branch) FILTER (
                               WHERE branch NOT IN ('', '?'))), []) AS bs
                    FROM steps GROUP BY ALL),
        tb AS (SELECT trace_id, protocol, unnest(CASE WHEN len(bs) = 0 THEN [''] ELSE bs END)
                      AS branch, len(bs) AS nb, coalesce(bs[1], '') AS fb FROM br)
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
    sr = """SELECT a.trace_id, a.protocol, a.branch, e.stage, e.e2e, e.clock, a.ts AS from_ts,
               b.ts AS to_ts, a.node AS from_node, b.node AS to_node
        FROM rs a JOIN edges e ON e.protocol = a.protocol AND e.f = a.step
        JOIN rs b ON b.trace_id = a.trace_id AND b.branch = a.branch AND b.step = e.t
        WHERE NOT e.rr OR a.branch = a.fb"""
    con.execute(f"CREATE TEMP TABLE sr AS {sr}")
    pairs = con.execute("""SELECT from_node, to_node, min(to_ts - from_ts) / 1000.0 FROM sr
                           WHERE clock AND from_node <> to_node GROUP BY ALL""").fetchall()
    # the report's tolerance: a few ms of negative delta is the order of log writes, not skew
    clock = align({(a, b): d for a, b, d in pairs}, CLOCK_TOLERANCE_MS)
    con.execute("CREATE TEMP TABLE corr (node VARCHAR, ms DOUBLE)")
    if clock.corrections:
        con.executemany("INSERT INTO corr VALUES (?, ?)", list(clock.corrections.items()))
    stages = """SELECT trace_id, protocol, branch, stage, e2e, from_node, to_node,
               make_timestamp(from_ts + CAST(coalesce(cf.ms, 0) * 1000 AS BIGINT)) AS from_ts,
               (to_ts - from_ts) / 1000.0 + coalesce(ct.ms, 0) - coalesce(cf.ms, 0) AS duration_ms
        FROM sr LEFT JOIN corr cf ON cf.node = sr.from_node LEFT JOIN corr ct ON ct.node = sr.to_node"""
    latency = con.execute("""
        SELECT protocol, stage, count(*), quantile_disc(duration_ms, [0.5, 0.9, 0.99]), max(duration_ms)
        FROM sr LEFT JOIN corr cf ON cf.node = sr.from_node LEFT JOIN corr ct ON ct.node = sr.to_node,
             LATERAL (SELECT (to_ts - from_ts) / 1000.0 + coalesce(ct.ms, 0) - coalesce(cf.ms, 0)
                      AS duration_ms)
        GROUP BY ALL ORDER BY ALL""").fetchall()
    # delivery outcomes per (trace, branch), for branches with a `sent` step
    log_end = con.execute("SELECT max(ts) FROM steps").fetchone()[0] or 0
    cols = {k: [] for k in ("sent", "delivered", "outcome", "late", "error_code", "ttl_s",
                            "start", "deadline")}
    for p in PROTOCOLS.values():
        def ts(st, p=p):
            return f"min(CASE WHEN step = '{p.name}:{st}' THEN ts END)"

        def detail(st, p=p):
            return f"min(CASE WHEN step = '{p.name}:{st}' THEN detail END)"
        ttl_default = float(ttl_over.get(p.name, p.outcomes.default_ttl_s))
        o = outcome_sql(p.outcomes, ts, detail, ttl_default, int(log_end), t0="min(ts)")
        vals = {"sent": o["sent"], "delivered": o["delivered"], "outcome": o["outcome"],
                "late": o["late"], "ttl_s": o["ttl_s"],
                "error_code": f"CASE WHEN ({o['outcome']}) = 'errored' THEN {o['error_code']} END",
                "start": f"make_timestamp({o['start_us']})",
                "deadline": f"make_timestamp({o['deadline_us']})"}
        for k, v in vals.items():
            cols[k].append(f"WHEN '{p.name}' THEN {v}")
    sel = ", ".join(f"CASE protocol {' '.join(v)} END AS {k}" for k, v in cols.items())
    delivery = f"""SELECT * FROM (SELECT trace_id, protocol, branch, {sel} FROM rs
                   GROUP BY trace_id, protocol, branch) WHERE sent"""
    # hops with corrected ts, ordered, time spent
    hops = """SELECT trace_id, protocol, step, branch, s.node, n, dup, detail, row_number() OVER w AS seq,
               (lead(ts_c) OVER w - ts_c) / 1000.0 AS spent_ms, make_timestamp(ts_c) AS ts
        FROM (SELECT *, ts + CAST(coalesce(c.ms, 0) * 1000 AS BIGINT) AS ts_c
              FROM steps s LEFT JOIN corr c ON c.node = s.node WHERE hop) s
        WINDOW w AS (PARTITION BY trace_id ORDER BY ts_c, step, branch)"""
    Path(out).mkdir(parents=True, exist_ok=True)
    for name, q in (("hops", hops), ("stages", stages), ("delivery", delivery)):
        con.execute(f"COPY ({q}) TO '{out}/{name}.parquet' (FORMAT parquet)")
    outcomes = con.execute(f"SELECT protocol, outcome, count(*) FROM ({delivery}) GROUP BY ALL "
                           "ORDER BY ALL").fetchall()
    return {"latency": [(p, s, n, q, m) for p, s, n, q, m in latency if s == "round_trip"],
            "delivery": outcomes, "clock_corrections": len(clock.corrections)}


# ----------------------------------------------------------------------------- equality check

#: columns compared per table (Spark's output vs DuckDB's), doubles rounded to 6 places
CHECK_COLUMNS = {
    "hops": "trace_id, protocol, step, branch, node, n, dup, detail, seq, "
            "round(spent_ms, 6) AS spent_ms, ts",
    "stages": "trace_id, protocol, branch, stage, e2e, from_node, to_node, from_ts, "
              "round(duration_ms, 6) AS duration_ms",
    "delivery": "trace_id, protocol, branch, sent, delivered, late, ttl_s, error_code, "
                "outcome, start, deadline",
}


def compare_outputs(spark_out: str, duck_out: str) -> dict[str, dict]:
    """Row-by-row comparison of hops/stages/delivery (multiset difference both ways) and
    the latency table (count and max per stage; p50/p90/p99 where Spark's percentile is
    exact, i.e. below 10000 samples). Returns table -> {rows, only_spark, only_duckdb}."""
    import duckdb
    con = duckdb.connect()
    res = {}
    for t, cols in CHECK_COLUMNS.items():
        a = f"SELECT {cols} FROM read_parquet('{spark_out}/{t}.parquet/*.parquet')"
        b = f"SELECT {cols} FROM read_parquet('{duck_out}/{t}.parquet')"
        res[t] = {"rows": con.execute(f"SELECT count(*) FROM ({a})").fetchone()[0],
                  "rows_duckdb": con.execute(f"SELECT count(*) FROM ({b})").fetchone()[0],
                  "only_spark": con.execute(f"SELECT count(*) FROM ({a} EXCEPT ALL {b})").fetchone()[0],
                  "only_duckdb": con.execute(f"SELECT count(*) FROM ({b} EXCEPT ALL {a})").fetchone()[0],
                  "sample": con.execute(f"({a} EXCEPT ALL {b}) LIMIT 3").fetchall()}
    lat_s = {(r[0], r[1]): r[2:] for r in con.execute(
        f"SELECT protocol, stage, count, p50_ms, p90_ms, p99_ms, max_ms FROM "
        f"read_parquet('{spark_out}/latency.parquet/*.parquet')").fetchall()}
    lat_d = {(r[0], r[1]): r[2:] for r in con.execute(
        f"SELECT protocol, stage, count(*), round(quantile_disc(duration_ms, 0.5), 3), "
        f"round(quantile_disc(duration_ms, 0.9), 3), round(quantile_disc(duration_ms, 0.99), 3), "
        f"round(max(duration_ms), 3) FROM read_parquet('{duck_out}/stages.parquet') "
        f"GROUP BY ALL").fetchall()}
    bad = []
    for k in sorted(set(lat_s) | set(lat_d)):
        s, d = lat_s.get(k), lat_d.get(k)
        if s is None or d is None or s[0] != d[0] or s[4] != d[4] or (
                s[0] < 10000 and tuple(s[1:4]) != tuple(d[1:4])):
            bad.append((k, s, d))
    res["latency"] = {"rows": len(lat_s), "mismatch": bad[:5], "mismatches": len(bad)}
    return res


def check(logdir: str, base: Path, partitions: int) -> int:
    """Spark (in this process, local[2]) and DuckDB over the same logs; 0 when every table
    is identical."""
    from spark.report import build_session, run
    inputs = sorted(str(p) for p in Path(logdir).glob("*.jsonl"))
    t = time.time()
    duckdb_report(inputs, str(base / "check-duckdb"))
    print(f"duckdb {time.time() - t:.1f} s", flush=True)
    from spark.report import SMALL_INPUT_MAX_BYTES, _small_input
    # the settings the console script uses for this input (interpreted expressions for
    # small input), so that the check covers the mode the demo runs in
    small = _small_input(inputs, SMALL_INPUT_MAX_BYTES)
    spark = build_session("local[2]", shuffle_partitions=None if small else partitions,
                          small_input=small)
    print(f"spark session: small_input={small}, shuffle partitions "
          f"{spark.conf.get('spark.sql.shuffle.partitions')}", flush=True)
    try:
        t = time.time()
        run(inputs, str(base / "check-spark"), spark=spark)
        print(f"spark {time.time() - t:.1f} s", flush=True)
    finally:
        spark.stop()
    res = compare_outputs(str(base / "check-spark"), str(base / "check-duckdb"))
    ok = True
    for t, r in res.items():
        print(t, json.dumps(r, default=str))
        ok &= not (r.get("only_spark") or r.get("only_duckdb") or r.get("mismatches")) and (
            r.get("rows_duckdb", r["rows"]) == r["rows"])
    print("IDENTICAL" if ok else "DIFFERENT")
    return 0 if ok else 1


# ----------------------------------------------------------------------------- driver

DEMO_TARGET_S = 20.0
LARGE_TARGET_RATIO = 4.0


def demo_size(logdir: str, base: Path, events: int = 3000) -> int:
    """(a) `relay-trace-report --master local[2]` over a demo-sized log set,
    wall time of the whole process (session start included), against DEMO_TARGET_S; the
    same tables by DuckDB in the same run for scale."""
    if logdir:
        logs = Path(logdir)
    else:
        logs = base / f"demo-logs-{events}"
        if not (logs / "DONE").exists():
            from gen_eventlog import generate
            (logs / "DONE").parent.mkdir(parents=True, exist_ok=True)
            n = generate(logs, events)
            (logs / "DONE").write_text(str(n))
    base.mkdir(parents=True, exist_ok=True)
    inputs = sorted(str(p) for p in logs.glob("*.jsonl"))
    n = sum(1 for p in inputs for _ in open(p))
    py = sys.executable
    env = {**os.environ, "PYSPARK_PYTHON": py}
    script = str(Path(py).parent / "relay-trace-report")
    duck = measure([py, __file__, "--child-duckdb", str(logs), str(base / "demo-out-duckdb")],
                   env, base / "demo-duckdb.log")
    r = measure([script, "--master", "local[2]", "--out", str(base / "demo-out-spark")] + inputs,
                env, base / "demo-spark.log")
    timings = {}
    try:
        timings = json.loads((base / "demo-out-spark" / "summary.json").read_text())["timings"]
    except (OSError, ValueError, KeyError):
        pass
    print(f"demo-size report: {n} events in {len(inputs)} files")
    print(f"  spark (relay-trace-report, local[2], session start included): {r['wall_s']} s "
          f"wall, CPU {r['cpu_s']} s, peak {r['peak_mb']} MB, rc {r['rc']}; target <= {DEMO_TARGET_S:g} s: "
          f"{'MET' if r['wall_s'] <= DEMO_TARGET_S else 'NOT MET'}")
    print(f"  phases (s since start): {timings}")
    if timings:
        # the same as durations: session start, then each step of the report (the console
        # script's own start, Python imports before the JVM, is wall minus total_s)
        prev, parts = 0.0, []
        for k, v in timings.items():
            parts.append(f"{k.removesuffix('_s')} {v - prev:.1f}")
            prev = v if k != "total_s" else prev
        parts[-1] = f"total {timings.get('total_s', 0):.1f}"
        print(f"  breakdown (s): python start {r['wall_s'] - timings.get('total_s', 0):.1f}, "
              + ", ".join(parts))
    from spark import cds
    print(f"  JVM class archive (spark/cds.py): "
          f"{'used' if cds.java_opts() else 'none (build: python -m spark.cds)'}")
    print(f"  duckdb, same tables: {duck['wall_s']} s wall; ratio {r['wall_s'] / duck['wall_s']:.1f}x")
    print(f"  load average while measuring: {os.getloadavg()}")
    from result_file import write_result
    write_result("spark_report", {"demo_events": n, "demo_wall_s": r["wall_s"], "demo_cpu_s": r["cpu_s"],
                                  "demo_peak_mb": r["peak_mb"], "demo_rc": r["rc"]},
                 {"duckdb_demo_wall_s": duck["wall_s"]}, {"demo_wall/duckdb": r["wall_s"] / duck["wall_s"]})
    return 0 if r["rc"] == 0 else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--dir", default="/tmp/relay-bench")
    ap.add_argument("--driver-memory", default="3g")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--skip-json", action="store_true", help="skip Spark over JSON")
    ap.add_argument("--reuse-parquet", action="store_true",
                    help="skip the compaction when DIR/cache/events.parquet is complete (a "
                         "previous run's; the compaction is not part of the report's time)")
    ap.add_argument("--floor", action="store_true",
                    help="also run the floor job (bench/spark_floor.py: the same Parquet, one "
                         "shuffle by trace_id, one aggregate, one write) and the session alone, "
                         "same spark-submit options: what any Spark report pays at least")
    ap.add_argument("--java-opts", default="", metavar="OPTS",
                    help="more JVM options for the Spark runs (experiments; appended to "
                         "spark/report.py's LARGE_JOB_JVM_OPTS)")
    ap.add_argument("--jit-stats", action="store_true",
                    help="add -XX:+CITime to the Spark JVMs and print their JIT compile time, and "
                         "the JVM's CPU per thread group (JIT, tasks, GC, driver)")
    ap.add_argument("--check", metavar="LOGDIR",
                    help="run Spark and DuckDB over LOGDIR/*.jsonl and compare every table")
    ap.add_argument("--child-duckdb", nargs=2, metavar=("LOGDIR", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--demo", nargs="?", const="", metavar="LOGDIR",
                    help="demo-size run only: the console script over LOGDIR/*.jsonl (default: "
                         "3,000 generated events), wall time with session start vs the 20 s target")
    args = ap.parse_args(argv)
    if args.demo is not None:
        return demo_size(args.demo, Path(args.dir))

    if args.child_duckdb:
        logdir, out = args.child_duckdb
        res = duckdb_report(sorted(str(p) for p in Path(logdir).glob("*.jsonl")), out)
        print(json.dumps(res, default=str))
        return 0

    base = Path(args.dir)
    if args.check:
        return check(args.check, base, args.partitions)
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
    from spark.report import LARGE_JOB_JVM_OPTS
    # the JVM options the console script gives large input (spark/report.py)
    jvm_opts = " ".join(o for o in (LARGE_JOB_JVM_OPTS, args.java_opts,
                                    "-XX:+CITime" if args.jit_stats else "") if o)
    print(f"spark-submit: {spark_submit}, report {REPO / 'spark' / 'report.py'}, "
          f"PYTHONPATH {REPO}, driver JVM options {jvm_opts!r}", flush=True)
    submit_base = [spark_submit, "--master", "local[2]", "--driver-memory", args.driver_memory,
                   "--driver-java-options", jvm_opts,
                   "--conf", f"spark.sql.shuffle.partitions={args.partitions}",
                   "--conf", "spark.ui.enabled=false"]
    submit = submit_base + [str(REPO / "spark" / "report.py")]
    results = {}

    results["duckdb_json"] = measure([py, __file__, "--child-duckdb", str(logs), str(base / "out-duckdb")],
                                     env, base / "duckdb.log")
    print("duckdb (JSON)        ", results["duckdb_json"], flush=True)
    if not args.skip_json:
        results["spark_json"] = measure(submit + ["--out", str(base / "out-spark-json")] + inputs,
                                        env, base / "spark-json.log")
        print("spark local[2] (JSON)", results["spark_json"], flush=True)
    cached = base / "cache" / "events.parquet" / "_SUCCESS"
    if args.reuse_parquet and cached.exists():
        print("compact JSON->Parquet: reused", cached.parent, flush=True)
    else:
        results["compact"] = measure(
            [spark_submit, "--master", "local[2]", "--driver-memory", args.driver_memory,
             "--conf", f"spark.sql.shuffle.partitions={args.partitions}",
             str(REPO / "spark" / "compact.py"), "--out", str(base / "cache")] + inputs,
            env, base / "compact.log")
        print("compact JSON->Parquet", results["compact"], "(once per rotated file, not per "
              "report)", flush=True)
    results["spark_parquet"] = measure(
        submit + ["--out", str(base / "out-spark-parquet"), str(base / "cache" / "events.parquet")],
        env, base / "spark-parquet.log", threads=args.jit_stats)
    print("spark local[2] (Parquet)", results["spark_parquet"], flush=True)
    if args.floor:
        floor = [*submit_base, str(REPO / "bench" / "spark_floor.py"),
                 str(base / "cache" / "events.parquet")]
        results["floor_session"] = measure(floor + ["--session-only", "--out", str(base / "out-floor")],
                                           env, base / "floor-session.log", threads=args.jit_stats)
        print("spark floor: session + one trivial action", results["floor_session"], flush=True)
        results["floor_job"] = measure(floor + ["--out", str(base / "out-floor")],
                                       env, base / "floor-job.log", threads=args.jit_stats)
        print("spark floor: scan, one shuffle by trace_id, one aggregate, one write",
              results["floor_job"], flush=True)
    if args.jit_stats:
        for key, log in (("spark_parquet", "spark-parquet.log"), ("floor_session", "floor-session.log"),
                         ("floor_job", "floor-job.log")):
            if key in results:
                results[key]["jit"] = jit_times(base / log)
                print(f"JIT (-XX:+CITime) {key}: {results[key]['jit']}")

    d = results["duckdb_json"]["wall_s"]
    for key in ("spark_json", "spark_parquet", "floor_session", "floor_job"):
        if key in results:
            r = results[key]
            ratio = r["wall_s"] / d
            if r["rc"] != 0:
                print(f"{key}: FAILED (rc {r['rc']}) after {r['wall_s']} s; see its log in {base}")
                continue
            print(f"{key}: {r['wall_s']} s = {ratio:.1f}x DuckDB ({d} s), CPU {r['cpu_s']} s = "
                  f"{r['cpu_s'] / results['duckdb_json']['cpu_s']:.1f}x DuckDB's; "
                  f"peak {r['peak_mb']} MB vs DuckDB {results['duckdb_json']['peak_mb']} MB"
                  + (f"; target <= {LARGE_TARGET_RATIO:g}x: "
                     f"{'MET' if ratio <= LARGE_TARGET_RATIO else 'NOT MET'}"
                     if key == "spark_parquet" else ""))
    if "floor_job" in results and results["floor_job"]["rc"] == 0:
        fj, fs = results["floor_job"], results.get("floor_session", {})
        print(f"floor: the {LARGE_TARGET_RATIO:g}x target is {LARGE_TARGET_RATIO * d:.1f} s of Spark "
              f"wall; session + trivial action {fs.get('wall_s')} s (CPU {fs.get('cpu_s')} s), "
              f"floor job {fj['wall_s']} s (CPU {fj['cpu_s']} s) = {fj['wall_s'] / d:.1f}x DuckDB; "
              f"the report above the floor job: {results['spark_parquet']['wall_s'] - fj['wall_s']:.1f} s")
    print(f"load average while measuring: {os.getloadavg()}")
    (base / "bench-results.json").write_text(json.dumps(results, indent=2))
    from result_file import write_result
    at = f"@{args.events / 1e6:g}M"
    write_result("spark_report",
                 {f"{k}_{m}{at}": r.get(m) for k, r in results.items() if k.startswith(("spark", "floor"))
                  for m in ("wall_s", "cpu_s", "peak_mb", "rc")},
                 {f"duckdb_{m}{at}": results["duckdb_json"].get(m) for m in ("wall_s", "cpu_s", "peak_mb")},
                 {f"{k}_wall{at}": r["wall_s"] / d for k, r in results.items()
                  if k.startswith(("spark", "floor")) and r.get("rc") == 0})
    return 0 if all(r["rc"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
