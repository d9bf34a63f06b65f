"""relay-trace-report: message traces, latency per stage, delivery and SLA from the event logs.

Run (plain spark-submit; PYSPARK_PYTHON must name the venv's python, DESIGN.md section 6):

    PYSPARK_PYTHON=$PWD/.venv/bin/python \\
    .venv/bin/spark-submit --master 'local[*]' --driver-memory 2g \\
        spark/report.py --out /tmp/trace-report logs/*.jsonl

or the console script `relay-trace-report --out DIR [--master URL] [--sla FILE]
[--parquet-cache DIR] [--strict] INPUT...`; `relay-trace-report --follow LOGDIR --out DIR`
is the streaming mode over logs still being written (spark/follow.py, docs/slo.md). INPUTs are JSON-lines event logs or Parquet
written by spark/compact.py, local paths or any Hadoop-compatible URI. Without `--master`
(and outside spark-submit) the master is `local[*]`. Small local input (the demo's logs)
runs as a short job: C1-only JIT and the serial collector for the driver JVM when the
report starts it (SHORT_JOB_JVM_OPTS, plus the class-data-sharing archive of spark/cds.py
when one was built), interpreted expressions, 2 shuffle partitions, AQE off
(SMALL_INPUT_CONF); the page's charts are drawn in a thread while Spark writes. Any other
input gets LARGE_INPUT_CONF (AQE off) and, when the report starts the JVM, the parallel
collector (LARGE_JOB_JVM_OPTS; with spark-submit pass `--driver-java-options
-XX:+UseParallelGC` for large logs). Settings given to spark-submit win. Spark actions: 4 collects (the first two fill the caches of the step table
and the per-branch table) and 4 writes; stages.parquet is written first and read back for
the latency table and the slowest traces; the hops are cached by their write and the OTLP
output is built from that cache, a sort aggregate over the order of its window (no shuffle,
no second window; see _report)
(docs/report-performance.md has the measurements).

Python API: `run(inputs, out, master=None, sla_path=None, spark=None, strict=False,
parquet_cache=None) -> dict` (the summary, also written as summary.json).

Pipeline (one shuffle of the events: everything is keyed by trace_id):
1. read with the explicit schema from the catalogues (spark/schema.py), PERMISSIVE with a
   corrupt-record column. Corrupt lines are `torn` (the line does not end in `}`: a write cut
   short, expected only as the last line of a file) or `bad` (a complete line that violates
   the schema, e.g. a `ts` that is not RFC 3339). Unknown events (not in any catalogue) and
   events without trace_id are counted by name. None of this is fatal, except with
   `strict=True` (tests): any `bad` line, or more than one torn line in one file, raises
   ValueError naming the file and showing the line.
2. every event becomes zero or more steps of its trace through the data-driven stage model
   (spark/stages.py), before the shuffle; facts of a trace (RMB requester twin, origin
   relay) come from a small per-trace table of the events stating them (max per trace),
   joined back by broadcast. The rules are a few CASE expressions over disjoint sets of
   event names (steps_exprs), each exploded by a generator of its own, so that whole-stage
   codegen gives each its own method below HotSpot's 8,000-byte JIT limit (one CASE with
   every rule made a 14 KB method that ran interpreted). The step rows (not the events) are
   then repartitioned by trace_id: the job's one large shuffle.
3. per (trace, step, branch): first timestamp, node, count, duplicates (the same event with
   the same attrs logged more than once by one process), detail; cached. Per (trace,
   branch): a map step -> record holding the root steps, the branch's own steps and the
   unattributed (`?`) steps of single-branch traces; stage edges and outcome flags are read
   from it (cached too). The nodes a trace's steps were sent to or came from (attrs.peer, for
   the plan's faults) are a column of the step table for small input only; other input gets
   them from a second pass over the input when, and only when, the plan has faults
   (PEERS_IN_STEP_TABLE_MAX_BYTES, _trace_peers). No Python UDFs and no SQL lambdas on the per-event path: executors
   need no Python, and everything is compiled by whole-stage codegen.
4. clock alignment (spark/clock.py): stage edges marked `clock` between two nodes give the
   minimum delta per ordered node pair; a node's timestamps are corrected only when a pair
   proves skew (a receive logged before its send), by the midpoint of the proven interval
   when both directions were seen, else by the bound; evidence that contradicts itself
   leaves every clock uncorrected and is reported. Corrections are applied by a broadcast
   join with the (node, ms) table.
5. outputs in DIR: hops.parquet (per trace the ordered steps with corrected ts and the time
   spent until the next step), stages.parquet (per trace/branch/stage duration_ms),
   latency.parquet (per protocol/stage count, p50, p90, p99, max ms: nearest-rank
   percentiles, `percentile_approx` with accuracy 10000, exact below 10000 samples),
   delivery.parquet and delivery_errors.parquet, clock.parquet, sla.parquet,
   summary.json, report.html (self-contained, inline SVG charts), traces.otlp/ (the traces
   as OTLP JSON, one TracesData per line: spark/otlp.py; for Jaeger or an OpenTelemetry
   Collector's otlpjsonfile receiver with `include: [DIR/traces.otlp/part-*]`).

Outcomes (spark/stages.py Outcomes, outcome_sql): per (trace, branch) decided once. RMB:
the first reply or expiry notice before the deadline (the peer's send time + the request's
ttl) decides answered / errored <code> / expired; anything after it (a reply, rmb-peer's
102 "already completed or expired") is `late` and changes nothing. summary.json
`delivery.<protocol>` = {sent, answered, expired, errored, errored_by_code (every code,
string keys), late, lost_or_stuck, in_flight, planned: {...}, unplanned: {...}}.

The demo plan (spark/plan.py, deploy/events.py demo.plan.*): node labels, and which
failures were planned (expected trace, or hit a planned fault's target inside its window);
summary.json `plan`, `failures.planned` / `failures.unplanned` (trace ids). `remp` and
`marlin` sections when those logs are present (_remp_marlin_summary); with `remp`,
`remp_fullnodes`: per full node the messages it accepted and its refusals for load
(_remp_fullnodes).

SLA (spark/sla.toml, TOML): `[[objective]]` entries of three kinds, evaluated only when the
stage has samples (else status "no data"); `count = "unplanned"` (default) or `"all"`;
each result carries objective, ok, value, target, unit, counts, budget_used, budget_unit:
- quantile: `stage`, `quantile`, `max_ms`: pass when the quantile <= max_ms; error budget
  = 1 - quantile, used = (fraction of samples > max_ms) / budget.
- within: `stage`, `within_ms`, `min`: fraction of finished (non in-flight) traces whose
  stage took <= within_ms must be >= min; budget = 1 - min, used = (1 - fraction) / budget.
- rate: `rate` = an outcome ("answered", "delivered"), `min`: outcome count / finished
  traces >= min; budget and used as for within.
`[ttl_s]` overrides the default TTL per protocol (RMB uses the request's own ttl attr).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import tomllib
from pathlib import Path

from spark.clock import align
from spark.cpu import judge as judge_cpu, timeline as cpu_timeline, verdict as cpu_verdict
from spark.plan import parse as parse_plan
from spark.schema import CORRUPT, SOURCE, known_events, read_events
from spark.stages import DERIVED, PROTOCOLS, Protocol, outcome_sql

DEFAULT_SLA = Path(__file__).with_name("sla.toml")
#: negative causal deltas down to this are the order of log writes, not clock skew
#: (spark/clock.py align; measured on one host: -0.4 to -3.9 ms between a relay's
#: `delivered` and the peer's next line)
CLOCK_TOLERANCE_MS = 5.0
#: events without a trace that travel whole to the driver with the plan's (few lines each:
#: remp.fullnode.refused is at most one line per reason per second per full node)
DRIVER_EVENTS = ("remp.fullnode.refused",)


def _ddl(spec: str) -> tuple[str, list[str]]:
    return spec, [c.split()[0] for c in spec.split(", ")]


#: the small result tables: Spark DDL schema and column order
_SMALL_SCHEMAS = {
    "latency": _ddl("protocol string, stage string, e2e boolean, count long, p50_ms double, "
                    "p90_ms double, p99_ms double, max_ms double"),
    "delivery_errors": _ddl("protocol string, code string, count long"),
    "sla": _ddl("name string, protocol string, stage string, target_text string, "
                "target double, unit string, counts string, actual double, "
                "samples long, status string, passed boolean, budget_used double"),
    "clock": _ddl("node string, correction_ms double"),
    "delivery_summary": _ddl("protocol string, branches long, sent long, delivered long, "
                             "answered long, errored long, expired long, lost_or_stuck long, "
                             "in_flight long, late long, duplicates long"),
}
OUTCOME_COLUMNS = ("answered", "errored", "expired", "lost_or_stuck", "in_flight")


# ----------------------------------------------------------------------------- session

#: SQL settings for small input (local inputs <= SMALL_INPUT_MAX_BYTES, e.g. the demo's 8k
#: events), where compiling code costs more than running it: no
#: whole-stage codegen and interpreted expressions (no Janino compile per query), two
#: shuffle partitions and no adaptive re-planning per query stage, file listing on the
#: driver (no Spark job to list > 32 files)
SMALL_INPUT_CONF = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
}


#: SQL settings for large input (every input that is not small; settings given to
#: spark-submit win): whole-stage codegen on, adaptive execution off. AQE re-plans (and
#: compiles again) every query stage, and has nothing to gain here: the one large shuffle
#: is by trace_id into `spark.sql.shuffle.partitions` even partitions, and the two joins
#: are explicit broadcasts (with LARGE_JOB_JVM_OPTS, in process at 1M
#: events: JVM CPU 172.7 -> 135.7 s, docs/report-performance.md). Tried and not kept:
#: object-hash aggregates falling back to a sort at 200k groups per task instead of 128,
#: and an uncompressed cache (at 5M events the OTLP collect_list then held every span of a
#: task's traces in the hash map and the driver (3 GB) ran out of heap);
#: `spark.sql.codegen.hugeMethodLimit=8000` (first collect -4 s executor CPU, the JVM's
#: total unchanged); whole-stage codegen off (JVM CPU +30 s).
LARGE_INPUT_CONF: dict[str, str] = {"spark.sql.adaptive.enabled": "false"}


#: SQL settings the report sets on its session (its own or the caller's), whatever the input:
#: the last value of a repeated map key wins; no nested schema pruning: the rules are
#: exploded by a chain of generators (_step_rows), for which Spark 4.3's optimizer (nested
#: column aliasing through Generate) otherwise builds an invalid plan
#: (INTERNAL_ERROR_ATTRIBUTE_NOT_FOUND for an `_extract_` alias of an attrs field); it would
#: prune nothing here, as `fact` hashes the whole attrs struct
REPORT_SQL_CONF = {
    "spark.sql.mapKeyDedupPolicy": "LAST_WIN",
    "spark.sql.optimizer.nestedSchemaPruning.enabled": "false",
}


def build_session(master: str | None = None, shuffle_partitions: int | None = None,
                  ui: bool = False, small_input: bool = False):
    """SparkSession with the settings that matter on small machines (DESIGN.md section 6):
    UTC, shuffle partitions 2x cores, UI and console progress off; with `small_input`
    also SMALL_INPUT_CONF, else LARGE_INPUT_CONF (both turn AQE off; it stays on only when
    spark-submit says so). Settings given to
    spark-submit (`--conf`, `--master`) win over these defaults; `master` and
    `shuffle_partitions` given here win over both. Driver memory must come from spark-submit `--driver-memory` (a builder
    setting is too late once the JVM runs)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession
    SparkContext._ensure_initialized()   # JVM up (or spark-submit's): SparkConf sees its conf
    given = SparkConf()
    builder = SparkSession.builder.appName("relay-trace-report")
    if master:
        builder = builder.master(master)
    elif not given.contains("spark.master"):
        builder = builder.master("local[*]")
    defaults = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(2 * (os.cpu_count() or 2)),
        "spark.ui.enabled": "true" if ui else "false",
    }
    defaults.update(SMALL_INPUT_CONF if small_input else LARGE_INPUT_CONF)
    for key, value in defaults.items():
        if not given.contains(key):
            builder = builder.config(key, value)
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    return builder.getOrCreate()


# ----------------------------------------------------------------------------- SQL pieces

def _q(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


#: rules per generator in _step_rows (steps_exprs)
RULES_PER_GENERATOR = 24


def _rule_struct(p: Protocol, rule) -> str:
    step = rule.step_sql if rule.step_sql else _q(rule.step)
    if rule.branch is None:
        branch = "''"
    else:
        branch = f"coalesce(CAST(({rule.branch}) AS STRING), '?')"
    detail = f"CAST(({rule.detail}) AS STRING)" if rule.detail else "CAST(NULL AS STRING)"
    return (f"CASE WHEN {rule.when} THEN "
            f"named_struct('step', concat({_q(p.name + ':')}, {step}), 'branch', {branch}, "
            f"'detail', {detail}, 'hop', {str(rule.hop).lower()}) END")


def steps_exprs(max_rules: int = RULES_PER_GENERATOR) -> list[str]:
    """SQL: the rules as a few CASE expressions over disjoint sets of event names, each an
    array of the step records one `ok` event row matches (NULL elements for rules whose
    condition fails; dropped after the explode) or NULL when the row's event is not one of
    its set. Grouped by event name so each row evaluates only its own event's rules, and no
    lambda (Spark interprets higher-order functions instead of compiling them). At most
    `max_rules` rules per expression: _step_rows explodes each in a generator of its own, and
    whole-stage codegen puts each generator's code in a method of its own; one expression
    with every rule made one method over HotSpot's 8,000-byte limit, never JIT-compiled."""
    by_event: dict[str, list[str]] = {}
    for p in PROTOCOLS.values():
        for r in p.rules:
            by_event.setdefault(r.event, []).append(_rule_struct(p, r))
    groups: list[list[tuple[str, list[str]]]] = [[]]
    for e, parts in by_event.items():
        if groups[-1] and sum(len(x) for _, x in groups[-1]) + len(parts) > max_rules:
            groups.append([])
        groups[-1].append((e, parts))
    return ["CASE event " + " ".join(f"WHEN {_q(e)} THEN array({', '.join(parts)})"
                                     for e, parts in g) + " END" for g in groups]


def _ref(p: Protocol, step: str) -> str:
    """Column holding the record of `step` in a (trace, branch) row (see _step_columns)."""
    return "r_" + "".join(c if c.isalnum() else "_" for c in f"{p.name}_{step}")


def _referenced_steps() -> dict[str, tuple[Protocol, str]]:
    refs = {}
    for p in PROTOCOLS.values():
        o = p.outcomes
        steps = [s for st in p.stages for s in (st.from_step, st.to_step)]
        steps += list(o.steps())
        for s in steps:
            refs[_ref(p, s)] = (p, s)
    return refs


def _step_columns():
    """One map lookup per referenced step and row (Spark looks map keys up linearly, and the
    stage/outcome expressions read each record several times)."""
    from pyspark.sql import functions as F
    return [F.expr(f"try_element_at(mb, {_q(p.name + ':' + s)})").alias(col)
            for col, (p, s) in _referenced_steps().items()]


def _lookup(p: Protocol, step: str) -> str:
    return _ref(p, step)


def _stages_array(p: Protocol) -> str:
    roots = p.root_steps()
    items = []
    for st in p.stages:
        f, t = _lookup(p, st.from_step), _lookup(p, st.to_step)
        cond = f"{f} IS NOT NULL AND {t} IS NOT NULL"
        if st.from_step in roots and st.to_step in roots:
            cond += " AND branch = coalesce(try_element_at(branches, 1), '')"
        items.append(
            f"CASE WHEN {cond} THEN named_struct('stage', {_q(st.name)}, 'e2e', {str(st.e2e).lower()}, "
            f"'clock', {str(st.clock).lower()}, 'from_ts', {f}.ts, 'to_ts', {t}.ts, "
            f"'from_node', {f}.node, 'to_node', {t}.node) END")
    return f"array({', '.join(items)})"


def _any(p: Protocol, steps) -> str:
    if not steps:
        return "false"
    return "(" + " OR ".join(f"{_lookup(p, s)} IS NOT NULL" for s in steps) + ")"


def _outcome_cols(p: Protocol, ttl_default: float, log_end: int) -> dict[str, str]:
    """The shared outcome rule (spark/stages.py outcome_sql) over the record columns."""
    return outcome_sql(p.outcomes, lambda st: f"{_lookup(p, st)}.ts",
                       lambda st: f"{_lookup(p, st)}.detail", ttl_default, log_end)


def _by_protocol(exprs: dict[str, str]) -> str:
    return "CASE " + " ".join(f"WHEN protocol = {_q(k)} THEN {v}" for k, v in exprs.items()) + " END"


# ----------------------------------------------------------------------------- pipeline

def event_class_sql() -> str:
    """SQL over an event row (spark/schema.py columns): its ingest class, one of 'torn',
    'bad' (corrupt or without ts/event), 'plan' (the launcher's demo.* and driver events),
    'unknown' (not in any catalogue), 'untraced' (no trace_id) or 'ok' (the only class that
    makes step rows; the others are counted as `_meta` rows)."""
    known = sorted(known_events())
    return (f"CASE WHEN {CORRUPT} IS NOT NULL THEN "
            f"  CASE WHEN rtrim({CORRUPT}) LIKE '%}}' THEN 'bad' ELSE 'torn' END "
            f"WHEN ts IS NULL OR event IS NULL THEN 'bad' "
            f"WHEN event LIKE 'demo.%' OR event IN ({', '.join(_q(e) for e in DRIVER_EVENTS)}) THEN 'plan' "
            f"WHEN NOT event IN ({', '.join(_q(e) for e in known)}) THEN 'unknown' "
            f"WHEN trace_id IS NULL OR trace_id = '' THEN 'untraced' ELSE 'ok' END")


def _step_rows(spark, inputs: list[str], events=None):
    """The step rows before the shuffle: per event row (zero or more) step records with
    trace_id, protocol, node, service, ts_us, fact (hash of event and attrs), peer
    (attrs.peer), step, branch, detail, hop. Ingest problems are rows of protocol `_meta`
    (step `meta:<class>[:event]`, branch = file for corrupt lines). `events`: a DataFrame
    of events (read_events' columns) to use instead of reading `inputs`."""
    from pyspark.sql import functions as F
    df = events if events is not None else read_events(spark, inputs)
    # one projection per layer (withColumns: one analysis each, not one per column)
    ev = df.withColumn("cls", F.expr(event_class_sql()))
    ev = ev.withColumns({
        # a plan event (deploy/events.py) travels whole, as JSON, to the driver
        "plan_json": F.expr(
            "CASE WHEN cls = 'plan' THEN to_json(named_struct('ts_us', unix_micros(ts), "
            "'event', event, 'trace_id', trace_id, 'node', node, 'attrs', attrs)) END"),
        "trace_id": F.expr("CASE WHEN cls = 'ok' THEN trace_id ELSE '' END"),
        "ts_us": F.expr("coalesce(unix_micros(ts), 0L)"),
        # one process logging the same event with the same attrs twice = a duplicate
        "fact": F.expr("hash(event, attrs)"),
        **{name: F.expr(sql) for name, sql in DERIVED.items()}})
    facts = {}
    for p in PROTOCOLS.values():
        facts.update(p.facts)
    # the trace facts as a small per-trace table (the events that state them), joined back by
    # broadcast: the events are not shuffled and sorted for them (a window over trace_id
    # carried every event, all attrs, through a sort). max, like the DuckDB baseline: one
    # value per trace in valid logs, and deterministic when a log is not
    if facts:
        ft = (ev.filter("cls = 'ok'")
              .select("trace_id", *[F.expr(sql).alias(n) for n, sql in facts.items()])
              .filter(" OR ".join(f"{n} IS NOT NULL" for n in facts))
              .groupBy("trace_id").agg(*[F.max(n).alias(n) for n in facts]))
        ev = ev.join(F.broadcast(ft), "trace_id", "left")
    meta = ("array(named_struct('step', concat('meta:', cls, CASE WHEN cls IN ('unknown', "
            "'untraced') THEN concat(':', event) ELSE '' END), 'branch', "
            f"CASE WHEN cls IN ('torn', 'bad') THEN {SOURCE} WHEN cls = 'plan' THEN plan_json "
            f"ELSE '' END, 'detail', "
            f"substring({CORRUPT}, 1, 300), 'hop', false))")
    ev = ev.withColumns({
        "protocol": F.expr(
            "CASE WHEN cls = 'ok' THEN substring_index(event, '.', 1) ELSE '_meta' END"),
        # the node a step was sent to or came from (attrs.peer), for the plan: a message
        # sent to a node the plan had killed was hit by that fault
        "peer": F.col("attrs.peer")})
    # one generator per group of rules (steps_exprs: disjoint event sets, so for each row at
    # most one group's array is not NULL and the others add one NULL element each), the
    # `_meta` record with the first group; explode_outer + filter: plain explode would make
    # Spark evaluate the rules twice
    groups = steps_exprs()
    names = [f"_s{i}" for i in range(len(groups))]
    for i, (name, expr) in enumerate(zip(names, groups)):
        arr = f"CASE WHEN cls = 'ok' THEN {expr} ELSE {meta} END" if i == 0 else \
            f"CASE WHEN cls = 'ok' THEN {expr} END"
        ev = ev.select("*", F.explode_outer(F.expr(arr)).alias(name))
    st = ev.select("trace_id", "protocol", "node", "service", "ts_us", "fact", "peer",
                   F.coalesce(*names).alias("s")).filter("s IS NOT NULL")
    return st.select("trace_id", "protocol", "node", "service", "ts_us", "fact", "peer",
                     F.col("s.step").alias("step"), F.col("s.branch").alias("branch"),
                     F.col("s.detail").alias("detail"), F.col("s.hop").alias("hop"))


def _trace_peers(spark, inputs: list[str]):
    """Per trace (trace_id, peers): every distinct non-null `peer` any step of the trace
    named (spark/plan.py: a planned fault's target), from a second pass over the inputs.
    Traces without one have no row. The report calls it only when the step table was built
    without its `peers` column (_step_table peers=False) and the plan has faults."""
    from pyspark.sql import functions as F
    return (_step_rows(spark, inputs).filter("protocol <> '_meta' AND peer IS NOT NULL")
            .groupBy("trace_id").agg(F.collect_set("peer").alias("peers")))


def _step_table(spark, inputs: list[str], peers: bool = True, events=None):
    """One row per (trace, protocol, step, branch): first ts (us, raw clock), its node, count
    n, duplicates dup, detail, hop flag, the trace's sorted `branches` and, with `peers`,
    the trace's `peers` (array of the distinct attrs.peer its steps named, any order; only
    the plan's faults need it: without `peers` the report computes it, when the plan has
    faults, with _trace_peers). Ingest problems are rows of protocol `_meta` (step
    `meta:<class>[:event]`, branch = file for corrupt lines). `events`: a DataFrame of
    events to use instead of reading `inputs`."""
    from pyspark.sql import Window, functions as F
    st = _step_rows(spark, inputs, events)
    if not peers:
        st = st.drop("peer")
    # THE shuffle of the job: narrow step rows (rules applied before it), by trace; every
    # aggregation and window below is keyed by trace_id and needs no other
    st = st.repartition("trace_id")
    # detail and hop follow from (event, attrs): as grouping keys they keep this a hash
    # aggregation (string aggregation buffers would force a sort-based one)
    # (peer is part of attrs, so of fact: as a key it splits no group)
    per_proc = st.groupBy("trace_id", "protocol", "step", "branch", "node", "service",
                          "fact", "detail", "hop", *(["peer"] if peers else [])).agg(
        F.min("ts_us").alias("ts"), F.count(F.lit(1)).alias("n"))
    per_step = per_proc.groupBy("trace_id", "protocol", "step", "branch").agg(
        # node and detail of the first occurrence; ties on ts go to the smallest node, so
        # the result does not depend on the order rows arrive in
        F.min("ts").alias("ts"), F.expr("min_by(node, struct(ts, node))").alias("node"),
        F.sum("n").alias("n"),
        # a step logged twice by one process; unattributed (`?`) steps are not counted
        # (alias steps, hop = false, are second names of a hop's event: not counted again)
        F.sum(F.expr("CASE WHEN branch = '?' OR NOT hop THEN 0 ELSE n - 1 END")).alias("dup"),
        F.expr("min_by(detail, struct(ts, node))").alias("detail"), F.max("hop").alias("hop"),
        *([F.collect_set("peer").alias("peers")] if peers else []))
    # the trace's branches (sorted), for attributing root and `?` steps; per_step comes out
    # sorted by trace_id, so this window needs no further shuffle or sort
    w = Window.partitionBy("trace_id")
    # sort_array, not array_sort: the same ascending order here (a set has no nulls), and
    # compiled code instead of a comparator lambda interpreted per row
    cols = {"branches": F.sort_array(F.collect_set(
        F.when(~F.col("branch").isin("", "?"), F.col("branch"))).over(w))}
    if peers:
        # every peer any step of the trace named (spark/plan.py: a planned fault's target)
        cols["peers"] = F.array_distinct(F.flatten(F.collect_list("peers").over(w)))
    return per_step.withColumns(cols)


def _with_corr(spark, df, corrections: dict[str, float], cols: dict[str, str]):
    """df with a column per `cols` item (node column -> new column): the clock correction
    (ms) of that node, 0.0 when it has none. A broadcast join with the (small) corrections
    table, not a literal map in the expression (Spark looks map keys up linearly: with
    hundreds of corrected nodes that was a scan per row and lookup)."""
    from pyspark.sql import functions as F
    if not corrections:
        return df.withColumns({new: F.lit(0.0) for new in cols.values()})
    table = spark.createDataFrame([(k, float(v)) for k, v in corrections.items()],
                                  "cn string, cms double")
    for node_col, new in cols.items():
        c = F.broadcast(table.withColumnsRenamed({"cn": "_cn", "cms": new}))
        df = (df.join(c, df[node_col] == c["_cn"], "left").drop("_cn")
              .withColumn(new, F.coalesce(F.col(new), F.lit(0.0))))
    return df


BRANCH_COLUMNS = ("sa", "sent", "delivered", "outcome", "late", "start_us", "deadline_us",
                  "end_us", "ttl_s", "error_code")


def branch_records(spark, ok_events, ttl_default: dict, log_end, planned_sql: str,
                   peers: bool = True, peer_inputs: list[str] | None = None,
                   keep_nodes: bool = False):
    """Per (trace, branch) of the step table's protocol rows `ok_events`: trace_id, protocol,
    branch, first (the trace's first branch), the stage array `sa`, the outcome columns
    (spark/stages.py outcome_sql; `log_end`: us, or SQL of it, against which an undecided
    row's deadline is judged) and `planned` (SQL `planned_sql` over trace_id, branch,
    nodes, start_us, end_us). peer_inputs: the event inputs to compute the traces' peers
    from when the step table has none. keep_nodes: keep the `nodes` column (every node of
    the row's steps and the peers they named). Returns (DataFrame, BRANCH_COLUMNS)."""
    from pyspark.sql import functions as F
    target = F.expr(
        "CASE WHEN branch = '' THEN (CASE WHEN size(branches) = 0 THEN array('') ELSE branches END) "
        "WHEN branch = '?' THEN (CASE WHEN size(branches) = 0 THEN array('') "
        "WHEN size(branches) = 1 THEN branches ELSE CAST(array() AS array<string>) END) "
        "ELSE array(branch) END")
    tb = (ok_events.withColumn("tbranch", F.explode(target))
          .groupBy("trace_id", "protocol", "tbranch").agg(
              F.map_from_entries(F.collect_list(F.struct(
                  "step", F.struct("ts", "node", "n", "detail")))).alias("mb"),
              F.first("branches").alias("branches"), F.min("ts").alias("t0"),
              (F.array_union(F.collect_set("node"), F.first("peers")) if peers
               else F.collect_set("node")).alias("nodes"))
          .withColumnRenamed("tbranch", "branch"))
    if not peers and peer_inputs:
        # the step table has no peers (input not small): only a plan with faults reads them
        tb = (tb.join(_trace_peers(spark, peer_inputs), "trace_id", "left")
              .withColumn("nodes", F.array_union("nodes", F.coalesce(
                  "peers", F.expr("CAST(array() AS array<string>)")))).drop("peers"))
    cols = {"sa": _by_protocol({n: _stages_array(p) for n, p in PROTOCOLS.items()})}
    for key in BRANCH_COLUMNS[1:]:
        cols[key] = _by_protocol({n: _outcome_cols(p, ttl_default[n], log_end)[key]
                                  for n, p in PROTOCOLS.items()})
    tb = tb.select("trace_id", "protocol", "branch", "branches", "t0", "nodes", *_step_columns())
    tb = tb.select("trace_id", "protocol", "branch", "nodes",
                   F.expr("branch = coalesce(try_element_at(branches, 1), '')").alias("first"),
                   *[F.expr(v).alias(k) for k, v in cols.items()])
    tb = tb.withColumn("planned", F.expr(planned_sql))
    return (tb if keep_nodes else tb.drop("nodes")), BRANCH_COLUMNS



def _stage_rows(tb):
    from pyspark.sql import functions as F
    arr = _by_protocol({name: _stages_array(p) for name, p in PROTOCOLS.items()})
    return (tb.select("trace_id", "protocol", "branch", F.explode(F.expr(arr)).alias("s"))
            .select("trace_id", "protocol", "branch", "s.*"))


def load_sla(path: str | os.PathLike | None) -> dict:
    with open(path or DEFAULT_SLA, "rb") as f:
        return tomllib.load(f)


def _nearest(x):
    return None if x is None else round(float(x), 3)


#: what a rate objective's outcome counts, per protocol (the "counts" column)
_UNITS = {"rmb": "requests (per destination)", "remp": "messages", "marlin": "blocks (per consumer)"}


def evaluate_sla(objectives: list[dict], latency: dict, delivery: dict, within: dict) -> list[dict]:
    """Pure evaluation of the SLA objectives (see module doc). Each argument is keyed by
    scope first ("all", "unplanned"; an objective's `count`, default "unplanned"):
    latency[scope]: (protocol, stage) -> {count, quantiles, over, within};
    delivery[scope]: protocol -> row; within[scope]: i -> (ok, finished).

    Each result: objective (= name), ok (= passed: True/False/None for no data), value
    (= actual), target (number), unit ("ms" or "ratio"), counts (what the samples are),
    samples, status, target_text, budget_used (the error budget spent, as a fraction of
    the budget: 1.0 = all of it) and budget_unit."""
    out = []
    for i, ob in enumerate(objectives):
        proto = ob["protocol"]
        scope = ob.get("count", "unplanned")
        if scope not in ("all", "unplanned"):
            raise ValueError(f"objective {ob.get('name')}: count must be 'all' or 'unplanned'")
        what = "unplanned " if scope == "unplanned" else "all "
        res = {"name": ob.get("name", f"objective-{i}"), "protocol": proto,
               "stage": ob.get("stage"), "target": None, "unit": None, "counts": None,
               "target_text": None, "actual": None, "samples": 0, "status": "no data",
               "passed": None, "budget_used": None,
               "budget_unit": "fraction of the error budget spent (1 = all of it)"}
        if "quantile" in ob:
            row = latency[scope].get((proto, ob["stage"]))
            q, limit = float(ob["quantile"]), float(ob["max_ms"])
            res.update(target=limit, unit="ms",
                       counts=f"{what}{_UNITS.get(proto, 'traces')}: stage {ob['stage']}",
                       target_text=f"p{q * 100:g} <= {limit:g} ms")
            if row and row["count"]:
                actual = row["quantiles"].get(q)
                over = row["over"].get(limit, 0)
                res.update(samples=row["count"], actual=actual,
                           passed=actual is not None and actual <= limit,
                           budget_used=(over / row["count"]) / (1.0 - q))
        elif "within_ms" in ob:
            ok, finished = within[scope].get(i, (0, 0))
            target = float(ob["min"])
            res.update(target=target, unit="ratio",
                       counts=f"finished {what}{_UNITS.get(proto, 'traces')} with stage "
                              f"{ob['stage']} <= {float(ob['within_ms']):g} ms",
                       target_text=f">= {target:g} within {float(ob['within_ms']):g} ms")
            if finished:
                frac = ok / finished
                res.update(samples=finished, actual=frac, passed=frac >= target,
                           budget_used=(1.0 - frac) / (1.0 - target) if target < 1 else
                           (0.0 if frac >= 1 else math.inf))
        elif "rate" in ob:
            row = delivery[scope].get(proto)
            target = float(ob["min"])
            res.update(target=target, unit="ratio",
                       counts=f"finished {what}{_UNITS.get(proto, 'traces')} {ob['rate']}",
                       target_text=f"{ob['rate']} >= {target:g}")
            finished = (row["branches"] - row["in_flight"]) if row else 0
            if finished:
                frac = row[ob["rate"]] / finished
                res.update(samples=finished, actual=frac, passed=frac >= target,
                           budget_used=(1.0 - frac) / (1.0 - target) if target < 1 else
                           (0.0 if frac >= 1 else math.inf))
        if res["passed"] is not None:
            res["status"] = "pass" if res["passed"] else "fail"
        if res["budget_used"] is not None:
            res["budget_used"] = round(res["budget_used"], 6)
        if isinstance(res["actual"], float):
            res["actual"] = round(res["actual"], 6)
        res["objective"], res["ok"], res["value"] = res["name"], res["passed"], res["actual"]
        out.append(res)
    return out


def _write_text(spark, uri: str, text: str) -> None:
    """Write a small text file to a local path or any Hadoop-compatible URI."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    stream = fs.create(path, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def _is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


_ARROW = {"string": "string", "long": "int64", "double": "float64", "boolean": "bool_"}


def _write_small_local(path: str, ddl: str, rows: list[dict]) -> None:
    """A small table as `path/part-00000.parquet` with the DDL's column types (pyarrow)."""
    import shutil
    import pyarrow as pa
    import pyarrow.parquet as pq
    fields = [(c.split()[0], getattr(pa, _ARROW[c.split()[1]])()) for c in ddl.split(", ")]
    schema = pa.schema(fields)
    table = pa.Table.from_pylist([{k: r.get(k) for k, _ in fields} for r in rows], schema=schema)
    local = Path(path.removeprefix("file://"))
    if local.exists():
        shutil.rmtree(local)
    local.mkdir(parents=True)
    pq.write_table(table, local / "part-00000.parquet")
    (local / "_SUCCESS").write_text("")


def _collect_parts(parts: dict) -> dict[str, list[dict]]:
    """Several small queries as ONE Spark action: each DataFrame's rows become JSON strings
    tagged with the part's name, the parts are unioned and collected once (each collect is
    a job with its own planning and scheduling; on the demo's logs that overhead, not the
    data, is the cost). Returns name -> list of row dicts (JSON types: long -> int, double
    -> float, array -> list; nulls kept)."""
    from pyspark.sql import functions as F
    union = None
    for name, df in parts.items():
        part = df.select(F.lit(name).alias("k"), F.to_json(
            F.struct(*df.columns), {"ignoreNullFields": "false"}).alias("j"))
        union = part if union is None else union.unionAll(part)
    out: dict[str, list[dict]] = {name: [] for name in parts}
    for r in union.collect():
        out[r["k"]].append(json.loads(r["j"]))
    return out


def _join(out: str, name: str) -> str:
    return out.rstrip("/") + "/" + name


def run(inputs: list[str], out: str, master: str | None = None, sla_path: str | None = None,
        spark=None, strict: bool = False, parquet_cache: str | None = None) -> dict:
    """Compute the report over `inputs` (JSON logs or compacted Parquet) into `out`.

    spark: an existing SparkSession (tests, launcher) or None (one is built with `master`).
    strict: raise ValueError on schema-violating lines or >1 torn line per file.
    parquet_cache: convert JSON inputs to Parquet there first (spark/compact.py) and read that.
    Returns the summary dict (also written to out/summary.json)."""
    from pyspark import StorageLevel

    t_start = time.time()
    timings: dict[str, float] = {}
    own = spark is None
    _preload_page()
    if own:
        job_jvm(small=_small_input(inputs))
        spark = build_session(master, small_input=_small_input(inputs, SMALL_INPUT_MAX_BYTES))
    timings["session_s"] = round(time.time() - t_start, 3)
    sla = load_sla(sla_path)
    objectives = sla.get("objective", [])
    ttl_over = sla.get("ttl_s", {})
    try:
        if parquet_cache:
            from spark.compact import compact
            compact(spark, inputs, parquet_cache)
            inputs = [parquet_cache.rstrip("/") + "/events.parquet"]
            timings["compact_s"] = round(time.time() - t_start, 3)
        for key, value in REPORT_SQL_CONF.items():
            spark.conf.set(key, value)
        # the per-trace peers only matter when the plan has faults; small input (the demo)
        # keeps them in the step table, other input computes them apart when needed
        peers = _small_input(inputs, PEERS_IN_STEP_TABLE_MAX_BYTES)
        tr = _step_table(spark, inputs, peers=peers).persist(StorageLevel.MEMORY_AND_DISK)
        cached = [tr]
        try:
            return _report(spark, tr, cached, inputs, out, objectives, ttl_over, strict,
                           timings, t_start, peers)
        finally:
            for df in cached:
                df.unpersist()
    finally:
        if own:
            spark.stop()


def _report(spark, tr, cached, inputs, out, objectives, ttl_over, strict, timings, t_start,
            peers=True):
    from pyspark import StorageLevel
    from pyspark.sql import Window, functions as F

    # the first action (it fills the step table's cache; one action alone, so that no two
    # jobs compute the table at once): per protocol span and duplicates, and the ingest
    # problems and plan events (the `_meta` rows) as a list on the `_meta` row
    per_proto = {}
    for r in tr.groupBy("protocol").agg(
            F.min("ts").alias("t0"), F.max("ts").alias("t1"), F.sum("dup").alias("duplicates"),
            F.collect_list(F.when(F.col("protocol") == "_meta", F.struct(
                "step", "branch", "n", "detail"))).alias("meta")).collect():
        per_proto[r["protocol"]] = r.asDict()
    per_proto = dict(sorted(per_proto.items()))
    timings["read_and_group_s"] = round(time.time() - t_start, 3)
    meta = per_proto.pop("_meta", None)
    for r in per_proto.values():
        r.pop("meta")
    ingest = {"torn": 0, "bad": 0, "unknown": {}, "untraced": {}, "torn_files": {},
              "bad_samples": []}
    plan_rows: list[dict] = []
    if meta:
        for v in sorted(meta["meta"], key=lambda v: (v["step"], v["branch"])):
            step, branch = v["step"], v["branch"]
            kind = step.split(":")[1]
            if kind in ("torn", "bad"):
                ingest[kind] += v["n"]
                if kind == "torn":
                    ingest["torn_files"][branch] = v["n"]
                else:
                    ingest["bad_samples"].append({"file": branch, "line": v["detail"]})
            elif kind == "plan":
                plan_rows.append(json.loads(branch))
            else:
                name = step.split(":", 2)[2]
                ingest[kind][name] = ingest[kind].get(name, 0) + v["n"]
    if strict:
        if ingest["bad"]:
            s = ingest["bad_samples"][0]
            raise ValueError(f"{ingest['bad']} line(s) violate the event-log schema (e.g. a ts "
                             f"that is not RFC 3339 UTC); first in {s['file']}: {s['line']!r}")
        many = {f: n for f, n in ingest["torn_files"].items() if n > 1}
        if many:
            raise ValueError(f"more than one torn line in one file (only the last line of a "
                             f"file may be torn): {many}")

    cpu = cpu_timeline(plan_rows)       # demo.cpu.*: the launcher's CPU samples
    plan = parse_plan([r for r in plan_rows if r["event"].startswith("demo.plan.")])
    log_end = max((r["t1"] for r in per_proto.values()), default=0) or 0
    ok_events = tr.filter("protocol <> '_meta'")
    ttl_default = {n: float(ttl_over.get(n, p.outcomes.default_ttl_s))
                   for n, p in PROTOCOLS.items()}
    # per (trace, branch): a map step -> record of the root steps, the branch's own steps and
    # unattributed `?` steps of single-branch traces; then stage edges (raw ts) and outcome
    # flags, computed once and cached
    tb, cols = branch_records(spark, ok_events, ttl_default, log_end, plan.planned_sql(),
                              peers, inputs if (not peers and plan.faults) else None)
    tb = tb.persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(tb)

    # clock: min delta per node pair over causal edges
    stages_raw = (tb.select("trace_id", "protocol", "branch", "planned",
                            F.explode_outer("sa").alias("s"))
                  .filter("s IS NOT NULL").select("trace_id", "protocol", "branch", "planned", "s.*"))
    # delivery per (trace, branch)
    dl = tb.select("trace_id", "protocol", "branch", "first", "planned", *list(cols)[1:])
    dl = dl.withColumns({
        "error_code": F.expr("CASE WHEN outcome = 'errored' THEN error_code END"),
        **{o: F.col("outcome") == o for o in OUTCOME_COLUMNS},
        "start": F.expr("timestamp_micros(start_us)"),
        "deadline": F.expr("timestamp_micros(deadline_us)")}).drop("start_us", "deadline_us", "end_us")

    # delivery per protocol split planned / unplanned with the error codes: alone, as it
    # fills the cache of tb
    dl_rows = [r.asDict() for r in dl.groupBy(
        "protocol", F.col("sent").alias("is_sent"), "planned", "error_code").agg(
            F.count(F.lit(1)).alias("branches"), F.count_if("first").alias("traces"),
            F.count(F.lit(1)).alias("sent"), F.count_if("delivered").alias("delivered"),
            *[F.count_if(F.col("outcome") == o).alias(o) for o in OUTCOME_COLUMNS],
            F.count_if("late").alias("late")).collect()]
    # one action over the two caches: the clock pairs, the failures themselves (trace ids,
    # for the page and --trace), the REMP and Marlin summary aggregates
    second = _collect_parts({
        **_remp_marlin_queries(tr),
        "pairs": stages_raw.filter("clock AND from_node <> to_node")
        .groupBy("from_node", "to_node").agg(
            (F.min(F.col("to_ts") - F.col("from_ts")) / 1000.0).alias("d_ms"),
            F.count(F.lit(1)).alias("n")),
        "failures": dl.filter("sent AND outcome IN ('errored', 'expired', 'lost_or_stuck')")
        .select("trace_id", "protocol", "branch", "outcome", "error_code", "planned", "late",
                # the failure's life, for the CPU during a rate objective's breach
                F.expr("unix_micros(start)").alias("_start_us"),
                F.expr("unix_micros(deadline)").alias("_end_us"))
        .orderBy("protocol", "trace_id", "branch").limit(2000)})
    pairs = second["pairs"]
    pair_min = {(r["from_node"], r["to_node"]): r["d_ms"] for r in pairs}
    clock = align(pair_min, CLOCK_TOLERANCE_MS, plan.hosts)
    timings["clock_s"] = round(time.time() - t_start, 3)

    stages = _with_corr(spark, stages_raw, clock.corrections,
                        {"to_node": "c_to", "from_node": "c_from"})
    stages = (stages.withColumn("duration_ms", (
        (F.col("to_ts") - F.col("from_ts")) / 1000.0 + F.col("c_to") - F.col("c_from")))
        .select("trace_id", "protocol", "branch", "stage", "e2e", "from_node", "to_node",
                F.timestamp_micros(F.col("from_ts") + (
                    F.col("c_from") * 1000).cast("long")).alias("from_ts"),
                "duration_ms", "planned"))
    # written once, then read back for the latency table and the slowest traces (instead
    # of computing the stages again for each, or caching them)
    outputs = {}
    path = _join(out, "stages.parquet")
    stages.write.mode("overwrite").parquet(path)
    outputs["stages"] = path
    stages = spark.read.parquet(path)

    # latency + SLA thresholds in one aggregation
    quant_objs = [o for o in objectives if "quantile" in o]
    limits = sorted({float(o["max_ms"]) for o in quant_objs})
    within_objs = [(i, o) for i, o in enumerate(objectives) if "within_ms" in o]
    extra_q = sorted({float(o["quantile"]) for o in quant_objs} - {0.5, 0.9, 0.99})
    aggs = []
    # every figure twice: over all samples and over unplanned traffic only (`u_`), which the
    # SLA objectives judge by default (spark/plan.py); when no (trace, branch) is planned
    # (the delivery rows above cover every one) the two are the same: computed once
    any_planned = any(r["planned"] is not False for r in dl_rows)
    scopes = [("", "duration_ms")]
    if any_planned:
        scopes.append(("u_", "CASE WHEN NOT planned THEN duration_ms END"))
    for pre, val in scopes:
        aggs += [F.expr(f"count({val})").alias(pre + "count"),
                 F.expr(f"percentile_approx({val}, array(0.5, 0.9, 0.99), 10000)").alias(pre + "pq"),
                 F.expr(f"max({val})").alias(pre + "max_ms")]
        if extra_q:
            aggs.append(F.expr(f"percentile_approx({val}, array({', '.join(map(str, extra_q))}), "
                               "10000)").alias(pre + "pq_extra"))
        for j, lim in enumerate(limits):
            aggs.append(F.expr(f"count_if({val} > {lim})").alias(f"{pre}over_{j}"))
        for i, o in within_objs:
            aggs.append(F.expr(f"count_if({val} <= {float(o['within_ms'])})").alias(f"{pre}within_{i}"))
    # one action: the latency table and the slowest traces with their hops (for the page)
    top_q, top_hops_q = _slowest_queries(ok_events, stages)
    third = _collect_parts({"latency": stages.groupBy("protocol", "stage", "e2e").agg(*aggs),
                            "top": top_q, "top_hops": top_hops_q,
                            **_timeline_queries(stages, objectives, any_planned)})
    lat_rows = third["latency"]
    latency_tbl = []
    latency_idx: dict[str, dict] = {"all": {}, "unplanned": {}}
    for r in sorted(lat_rows, key=lambda r: (r["protocol"], not r["e2e"], r["stage"])):
        for scope, pre in (("all", ""), ("unplanned", "u_" if any_planned else "")):
            pq = r[pre + "pq"] or [None, None, None]
            qs = {0.5: pq[0], 0.9: pq[1], 0.99: pq[2]}
            if extra_q:
                qs.update(zip(extra_q, r[pre + "pq_extra"] or [None] * len(extra_q)))
            latency_idx[scope][(r["protocol"], r["stage"])] = {
                "count": r[pre + "count"], "quantiles": {k: _nearest(v) for k, v in qs.items()},
                "over": {lim: r[f"{pre}over_{j}"] for j, lim in enumerate(limits)},
                "within": {i: r[f"{pre}within_{i}"] for i, _ in within_objs}}
            if scope == "all":
                latency_tbl.append({
                    "protocol": r["protocol"], "stage": r["stage"], "e2e": r["e2e"],
                    "count": r["count"], "p50_ms": _nearest(qs[0.5]), "p90_ms": _nearest(qs[0.9]),
                    "p99_ms": _nearest(qs[0.99]), "max_ms": _nearest(r["max_ms"])})

    # delivery per protocol, split planned / unplanned, and the error codes
    dl_rows = sorted(dl_rows, key=lambda r: (
        r["protocol"], bool(r["is_sent"]), bool(r["planned"]), r["error_code"] or ""))
    count_keys = ("branches", "traces", "sent", "delivered") + OUTCOME_COLUMNS + ("late",)
    delivery, scoped = {}, {"all": {}, "unplanned": {}, "planned": {}}
    errors_by: dict[tuple, int] = {}
    for r in dl_rows:
        proto = r["protocol"]
        for scope in ("all", "planned" if r["planned"] else "unplanned"):
            d = scoped[scope].setdefault(proto, dict.fromkeys(count_keys, 0))
            d["traces"] += r["traces"]    # every trace, sent or not (e.g. an app's own ref)
            if r["is_sent"]:
                for key in count_keys[2:] + ("branches",):
                    d[key] += r[key]
        if not r["is_sent"]:
            continue
        if r["error_code"] is not None and r["errored"]:
            key = (proto, r["error_code"])
            errors_by[key] = errors_by.get(key, 0) + r["errored"]
            for scope in ("planned" if r["planned"] else "unplanned",):
                codes = scoped[scope][proto].setdefault("errored_by_code", {})
                codes[r["error_code"]] = codes.get(r["error_code"], 0) + r["errored"]
    for proto, d in scoped["all"].items():
        d["protocol"] = proto
        per_proto.setdefault(proto, {})["traces"] = d.pop("traces")
        d["duplicates"] = int(per_proto.get(proto, {}).get("duplicates") or 0)
        for scope in ("planned", "unplanned"):
            part = scoped[scope].get(proto, dict.fromkeys(count_keys, 0))
            part.pop("traces", None)
            part.setdefault("errored_by_code", {})
            d[scope] = part
        delivery[proto] = d
    errors = [{"protocol": p_, "code": c, "count": n} for (p_, c), n in
              sorted(errors_by.items(), key=lambda kv: (kv[0][0], -kv[1], kv[0][1]))]
    for proto, d in delivery.items():
        d["errored_by_code"] = {e["code"]: e["count"] for e in errors if e["protocol"] == proto}

    protocol_summary = _remp_marlin_summary(second, delivery, per_proto)
    if "remp" in protocol_summary:
        protocol_summary["remp_fullnodes"] = _remp_fullnodes(second["remp_nodes"], plan_rows, plan.label)

    # the failures themselves (trace ids), planned and unplanned (second action)
    failures = sorted(second["failures"],
                      key=lambda r: (r["protocol"], r["trace_id"], r["branch"]))

    within = {"all": {}, "unplanned": {}}
    for scope in within:
        for i, o in within_objs:
            ok = latency_idx[scope].get((o["protocol"], o["stage"]), {}).get("within", {}).get(i, 0)
            d = delivery.get(o["protocol"])
            if d and scope == "unplanned":
                d = d["unplanned"]
            finished = (d["branches"] - d["in_flight"]) if d else 0
            within[scope][i] = (ok, finished)
    unplanned_delivery = {p_: d["unplanned"] for p_, d in delivery.items()}
    sla_results = evaluate_sla(objectives, latency_idx, {"all": delivery,
                                                         "unplanned": unplanned_delivery}, within)
    _judge_saturation(sla_results, objectives, cpu, third["breach"], failures)
    for f in failures:
        f.pop("_start_us", None)
        f.pop("_end_us", None)
    timings["aggregates_s"] = round(time.time() - t_start, 3)

    # the page's charts (matplotlib: ~2 s of Python CPU on the demo's logs) in a thread
    # while the JVM writes the outputs below (the driver only waits on py4j meanwhile)
    from concurrent.futures import ThreadPoolExecutor
    sample = _slowest_traces(third["top"], third["top_hops"], clock.corrections)
    pool = ThreadPoolExecutor(1, thread_name_prefix="report-charts")
    timeline = _latency_timeline(third["timeline"])
    charts = pool.submit(_charts, {"delivery": delivery, "latency": latency_tbl,
                                   "plan": {"labels": plan.labels}, "timeline": timeline,
                                   "cpu": cpu.as_dict(), "sla": sla_results}, sample)
    pool.shutdown(wait=False)

    # hops: ordered steps per trace with corrected ts
    hops = _with_corr(spark, ok_events.filter("hop").select(
        "trace_id", "protocol", "step", "branch", "node", "n", "dup", "detail", "ts"),
        clock.corrections, {"node": "c_node"})
    hops = hops.select("trace_id", "protocol", "step", "branch", "node", "n", "dup", "detail",
                       (F.col("ts") + (F.col("c_node") * 1000).cast("long")).alias("ts_us"))
    wo = Window.partitionBy("trace_id").orderBy("ts_us", "step", "branch")
    hops = hops.withColumns({
        "seq": F.row_number().over(wo),
        "spent_ms": (F.lead("ts_us").over(wo) - F.col("ts_us")) / 1000.0,
        "ts": F.expr("timestamp_micros(ts_us)")}).drop("ts_us")
    # cached: the window runs once, for hops.parquet (which fills the cache) and the OTLP
    # output below (the cached scan keeps the window's partitioning and order)
    hops = hops.persist(StorageLevel.MEMORY_AND_DISK)
    cached.append(hops)

    for name, df in (("hops", hops), ("delivery", dl.filter("sent").drop("first"))):
        path = _join(out, f"{name}.parquet")
        df.write.mode("overwrite").parquet(path)
        outputs[name] = path
    # the traces as OTLP JSON (spark/otlp.py): DIR/traces.otlp/part-*.txt, one TracesData a
    # line; from the hops' cache (partitioned by trace_id, and the window sorted each
    # partition by trace_id): with the object-hash aggregate off
    # for this one query, collect_list per trace is a streaming sort aggregate over that
    # order, with no shuffle and no sort (reading hops.parquet back shuffled every span)
    from spark.otlp import otlp_lines
    path = _join(out, "traces.otlp")
    key = "spark.sql.execution.useObjectHashAggregateExec"
    was = spark.conf.get(key)
    spark.conf.set(key, "false")
    try:
        otlp_lines(hops, plan.labels).write.mode("overwrite").text(path)
    finally:
        spark.conf.set(key, was)
    outputs["otlp"] = path
    timings["parquet_s"] = round(time.time() - t_start, 3)

    clock_rows = ([{"node": a, "peer": b, "d_ms": dd, "d_back_ms": back,
                    "correction_ms": clock.domain_corrections.get(b, 0.0)}
                   for a, b, dd, back in clock.proofs])
    small = {
        "latency": latency_tbl,
        "delivery_errors": errors,
        "sla": [{k: s[k] for k in _SMALL_SCHEMAS["sla"][1]} for s in sla_results],
        "clock": [{"node": n, "correction_ms": v} for n, v in clock.corrections.items()],
        "delivery_summary": [{k: d.get(k) for k in _SMALL_SCHEMAS["delivery_summary"][1]}
                             for d in delivery.values()],
    }
    for name, rows in small.items():
        ddl, cols = _SMALL_SCHEMAS[name]
        path = _join(out, f"{name}.parquet")
        if _is_local(out):
            # a handful of rows: written by pyarrow on the driver (no Spark job), as a
            # directory holding one part file like Spark's
            _write_small_local(path, ddl, rows)
        else:
            (spark.createDataFrame([tuple(r[c] for c in cols) for r in rows], ddl)
             .coalesce(1).write.mode("overwrite").parquet(path))
        outputs[name] = path

    order = ("hops", "stages", "delivery", "otlp")
    outputs = {**{k: outputs[k] for k in order}, **{k: v for k, v in outputs.items() if k not in order}}
    summary = {
        "inputs": list(inputs),
        "generated_by": "spark/report.py",
        "log_span": {p: {"first": _iso(r["t0"]), "last": _iso(r["t1"])} for p, r in per_proto.items()},
        "traces": {p: r.get("traces", 0) for p, r in per_proto.items()},
        "ingest": {"torn_lines": ingest["torn"], "bad_lines": ingest["bad"],
                   "torn_files": ingest["torn_files"], "bad_samples": ingest["bad_samples"][:5],
                   "unknown_events": ingest["unknown"], "untraced_events": ingest["untraced"]},
        "clock": {"consistent": clock.consistent, "corrections_ms": clock.corrections,
                  "tolerance_ms": CLOCK_TOLERANCE_MS,
                  "shared_hosts": clock.shared_hosts, "cross_pairs": clock.cross_pairs,
                  "log_order": (None if clock.log_order is None else dict(zip(
                      ("from", "to", "min_delta_ms"), clock.log_order))),
                  "proofs": clock_rows,
                  "pairs": [{"from": a, "to": b, "min_delta_ms": v} for (a, b), v in
                            sorted(pair_min.items())]},
        "latency": latency_tbl,
        "delivery": delivery,
        **protocol_summary,
        "plan": {"labels": plan.labels, "expected": len(plan.expected),
                 "faults": [f.as_dict() | {"start": _iso(f.start_us), "end": _iso(f.end_us)}
                            for f in plan.faults]},
        "failures": {
            "planned": [f for f in failures if f["planned"]][:200],
            "unplanned": [f for f in failures if not f["planned"]][:200]},
        "sla": sla_results,
        "cpu": cpu.as_dict(),
        "timeline": timeline,
        "outputs": outputs,
        "spark": {"version": spark.version, "master": spark.sparkContext.master,
                  "app_id": spark.sparkContext.applicationId,
                  "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions")},
    }
    from spark.page import render
    html = render(summary, sample, charts.result())
    _write_text(spark, _join(out, "report.html"), html)
    outputs["html"] = _join(out, "report.html")
    outputs["summary"] = _join(out, "summary.json")
    timings["total_s"] = round(time.time() - t_start, 3)
    summary["timings"] = timings
    _write_text(spark, _join(out, "summary.json"), json.dumps(summary, indent=2, default=str))
    return summary


#: breach samples collected per objective (the CPU judgement needs their times only)
BREACH_ROWS_MAX = 5000


def _timeline_queries(stages, objectives: list[dict], any_planned: bool) -> dict:
    """The Spark side of the latency timeline and of the breach windows (collected with the
    latency table): `timeline` = per end-to-end (protocol, stage) and second of its start,
    the slowest duration and the count; `breach` = per quantile / within objective (its
    index `i`) the samples over its limit in its scope (start us, duration ms), at most
    BREACH_ROWS_MAX each."""
    from pyspark.sql import functions as F
    parts = {"timeline": stages.filter("e2e").groupBy(
        "protocol", "stage", F.expr("floor(unix_micros(from_ts) / 1000000)").alias("sec")).agg(
        F.max("duration_ms").alias("max_ms"), F.count(F.lit(1)).alias("n"))}
    breach = None
    for i, ob in enumerate(objectives):
        limit = ob.get("max_ms", ob.get("within_ms"))
        if "stage" not in ob or limit is None:
            continue
        cond = (f"protocol = {_q(ob['protocol'])} AND stage = {_q(ob['stage'])} "
                f"AND duration_ms > {float(limit)}")
        if ob.get("count", "unplanned") == "unplanned" and any_planned:
            cond += " AND NOT planned"
        part = (stages.filter(cond).select(F.lit(i).alias("i"),
                                           F.expr("unix_micros(from_ts)").alias("start_us"),
                                           "duration_ms")
                .limit(BREACH_ROWS_MAX))
        breach = part if breach is None else breach.unionAll(part)
    if breach is None:
        breach = stages.limit(0).select(F.lit(0).alias("i"), F.lit(0).cast("long").alias("start_us"),
                                        "duration_ms")
    parts["breach"] = breach
    return parts


def _latency_timeline(rows: list[dict]) -> list[dict]:
    """The page's latency timeline: per second and end-to-end stage, the slowest sample."""
    return sorted(({"protocol": r["protocol"], "stage": r["stage"], "t_us": int(r["sec"]) * 1_000_000,
                    "max_ms": r["max_ms"], "n": r["n"]} for r in rows),
                  key=lambda r: (r["protocol"], r["stage"], r["t_us"]))


def _judge_saturation(results: list[dict], objectives: list[dict], cpu, breach_rows: list[dict],
                      failures: list[dict]) -> None:
    """Adds `verdict` and `saturation` (spark/cpu.py judge) to every SLA result: a missed
    objective's breach is when its samples over the limit ran (quantile, within), or the
    unplanned failures of its protocol lived (rate); without CPU samples `saturation` is
    None and a miss is plain "missed"."""
    windows: dict[int, list[tuple[int, int]]] = {}
    for r in breach_rows:
        s = int(r["start_us"])
        windows.setdefault(int(r["i"]), []).append((s, s + int(float(r["duration_ms"]) * 1000)))
    for i, (res, ob) in enumerate(zip(results, objectives)):
        sat = None
        if res["passed"] is False and cpu:
            win = windows.get(i, [])
            if "rate" in ob:
                win = [(f["_start_us"], f["_end_us"] or f["_start_us"]) for f in failures
                       if f["protocol"] == ob["protocol"] and f.get("_start_us") is not None
                       and (not f["planned"] or ob.get("count") == "all")]
            sat = judge_cpu(cpu, win) if win else None
        res["saturation"] = sat
        res["verdict"] = cpu_verdict(res["passed"], sat)


def _charts(summary: dict, sample: list[dict]) -> dict[str, str]:
    from spark.page import render_charts
    return render_charts(summary, sample)


def _preload_page() -> None:
    """Import spark.page (matplotlib, ~1 s) in a thread while the JVM starts."""
    import threading

    def load():
        try:
            import spark.page  # noqa: F401
        except Exception:   # noqa: BLE001 - the render step imports it again and reports
            pass
    threading.Thread(target=load, name="report-preload", daemon=True).start()


def _remp_marlin_queries(tr) -> dict:
    """The Spark side of _remp_marlin_summary: two one-row aggregates over the cached step
    table, collected in one action with the clock pairs (_collect_parts)."""
    from pyspark.sql import functions as F
    remp = (tr.filter("protocol = 'remp' AND (step LIKE 'remp:produced:%' "
                      "OR step LIKE 'remp:delivered:%')")
            .select("trace_id", F.expr("substring_index(step, ':', 2) = 'remp:produced'").alias("p"),
                    F.expr("substring(step, length(substring_index(step, ':', 2)) + 2)").alias("key"))
            .groupBy("trace_id", "key").agg(F.max("p").alias("p"), F.min("p").alias("notp"))
            .agg(F.count_if("p").alias("produced"),
                 F.count_if(F.col("p") & ~F.col("notp")).alias("delivered")))
    m = tr.filter("protocol = 'marlin'")
    # chunks lost: per (block, consumer) that neither rebuilt nor disputed the block, the
    # distinct chunks sent that it never received; a consumer that rebuilt drops later chunks
    # as surplus (marlin_cluster/consumer.py counts them as duplicates), so they are not lost
    per_consumer = (m.filter("branch != '?'").groupBy("trace_id", "branch").agg(
        F.count_if(F.expr("step LIKE 'marlin:c.recv:%'")).alias("recv_b"),
        F.max(F.expr("step IN ('marlin:block_rebuilt', 'marlin:dispute')")).alias("done_b")))
    per_trace = m.groupBy("trace_id").agg(
        F.sum(F.expr("CASE WHEN step = 'marlin:chunk_sent' THEN n ELSE 0 END")).alias("sent_n"),
        F.sum(F.expr("CASE WHEN step = 'marlin:chunk_received' THEN n ELSE 0 END")).alias("recv_n"),
        F.sum(F.expr("CASE WHEN step = 'marlin:acknowledged' THEN n ELSE 0 END")).alias("ack_n"),
        F.sum(F.expr("CASE WHEN step = 'marlin:dispute' THEN n ELSE 0 END")).alias("disputes"),
        F.count_if(F.expr("step = 'marlin:block_rebuilt'")).alias("rebuilt"),
        F.count_if(F.expr("step LIKE 'marlin:c.sent:%'")).alias("sent_d"),
        F.count_if(F.expr("step LIKE 'marlin:c.ack:%'")).alias("ack_d"),
        F.max("branches").alias("branches"))
    lost = (per_trace.select("trace_id", "sent_d", F.explode_outer("branches").alias("branch"))
            .join(per_consumer, ["trace_id", "branch"], "left")
            .groupBy("trace_id").agg(F.sum(F.expr(
                "CASE WHEN branch IS NULL OR coalesce(done_b, false) THEN 0 "
                "ELSE greatest(0, sent_d - coalesce(recv_b, 0)) END")).alias("lost")))
    marlin = (per_trace.join(lost, "trace_id", "left")
              .agg(*[F.sum(c).alias(c) for c in ("sent_n", "recv_n", "ack_n", "disputes", "rebuilt", "lost")],
                   F.sum(F.greatest(F.lit(0), F.col("sent_d") - F.col("ack_d"))).alias("missing")))
    remp_nodes = (tr.filter("protocol = 'remp' AND step = 'remp:fullnode.received'")
                  .groupBy("node").agg(F.countDistinct("trace_id").alias("accepted")))
    return {"remp": remp, "marlin": marlin, "remp_nodes": remp_nodes}


def _remp_fullnodes(accepted: list[dict], plan_rows: list[dict], label) -> list[dict]:
    """summary.json `remp_fullnodes`: per full node (its label), messages it accepted
    (distinct traces with its remp.fullnode.received) and the refusals for load it logged
    (remp.fullnode.refused counts: 503 with Retry-After / GraphQL BACKPRESSURE, by reason),
    apart from the failures (a refused message was never accepted, so it is no trace)."""
    rows: dict[str, dict] = {}
    for a in accepted:
        if a.get("node"):
            rows.setdefault(a["node"], {"accepted": 0, "refused": {}})["accepted"] += int(a["accepted"] or 0)
    for r in plan_rows:
        if r.get("event") == "remp.fullnode.refused" and r.get("node"):
            at = r.get("attrs") or {}
            ref = rows.setdefault(r["node"], {"accepted": 0, "refused": {}})["refused"]
            reason = at.get("reason") or "?"
            ref[reason] = ref.get(reason, 0) + int(at.get("count") or 0)
    return [{"full_node": label(n), "accepted": v["accepted"],
             "refused_for_load": sum(v["refused"].values()),
             "refused_pending_full": v["refused"].get("pending_full", 0),
             "refused_client_rate": v["refused"].get("client_rate", 0)}
            for n, v in sorted(rows.items(), key=lambda kv: label(kv[0]) or "")]


def _remp_marlin_summary(parts: dict, delivery: dict, per_proto: dict) -> dict:
    """summary.json's `remp` and `marlin` sections, each only when the logs
    hold that protocol; parts: the rows of _remp_marlin_queries (one each).

    remp: messages; outcomes = the final outcome per message (finalized, rejected, timeout;
    none = no final status: lost_or_stuck + in_flight, also given apart); receipts_produced
    = distinct (message, validator, kind) statuses validators logged; receipts_delivered =
    those the full node logged with peer = that validator; duplicates = statuses logged
    twice by one process.
    marlin: blocks (traces); rebuilt = distinct (trace, consumer) with a rebuilt block;
    disputes; chunks_sent / chunks_received / acks (events); chunks_lost = per (block,
    consumer seen) that neither rebuilt nor disputed the block, the distinct chunks sent that
    it never received (chunks arriving after a rebuild are surplus, not lost); missing_acks = distinct chunks
    sent without an acknowledgement."""
    out = {}
    if "remp" in delivery:
        d = delivery["remp"]
        r = parts["remp"][0]
        out["remp"] = {
            "messages": per_proto.get("remp", {}).get("traces", 0),
            "outcomes": {"finalized": d["answered"], "rejected": d["errored"],
                         "timeout": d["expired"], "none": d["lost_or_stuck"] + d["in_flight"]},
            "lost_or_stuck": d["lost_or_stuck"], "in_flight": d["in_flight"],
            "receipts_produced": int(r["produced"] or 0),
            "receipts_delivered": int(r["delivered"] or 0),
            "duplicates": d["duplicates"]}
    if "marlin" in delivery:
        d = delivery["marlin"]
        per = parts["marlin"][0]
        out["marlin"] = {
            "blocks": per_proto.get("marlin", {}).get("traces", 0),
            "rebuilt": int(per["rebuilt"] or 0), "disputes": int(per["disputes"] or 0),
            "chunks_sent": int(per["sent_n"] or 0), "chunks_received": int(per["recv_n"] or 0),
            "acks": int(per["ack_n"] or 0), "chunks_lost": int(per["lost"] or 0),
            "missing_acks": int(per["missing"] or 0), "lost_or_stuck": d["lost_or_stuck"]}
    return out


def _slowest_queries(tr, stages, per_protocol: int = 5):
    """The Spark side of _slowest_traces: per protocol the `per_protocol` slowest traces by
    their slowest end-to-end stage (top), and their hop steps from the cached step table
    (hops); collected with the latency table (_collect_parts)."""
    from pyspark.sql import Window, functions as F
    w = Window.partitionBy("protocol").orderBy(F.desc("duration_ms"), "trace_id")
    top = (stages.filter("e2e").groupBy("protocol", "trace_id").agg(
        F.max_by("stage", "duration_ms").alias("stage"), F.max("duration_ms").alias("duration_ms"))
        .withColumn("rank", F.row_number().over(w)).filter(f"rank <= {per_protocol}"))
    hops = (tr.filter("hop").join(F.broadcast(top.select("trace_id")), "trace_id", "left_semi")
            .select("trace_id", "step", "branch", "node", "ts"))
    return top, hops


def _slowest_traces(top, recs, corrections: dict[str, float]):
    """Per protocol the slowest traces (rows of _slowest_queries' top, any order) with their
    hops (its hops rows), for the page (table, anchors; a waterfall chart for the slowest of
    each protocol)."""
    top = sorted(top, key=lambda r: (r["protocol"], r["rank"]))
    if not top:
        return []
    by_trace: dict[str, list] = {}
    for v in recs:
        by_trace.setdefault(v["trace_id"], []).append(v)
    import datetime as dt
    out = []
    for t in top:
        hops = sorted((v["ts"] + int(corrections.get(v["node"], 0.0) * 1000), v["step"],
                       v["branch"], v["node"]) for v in by_trace.get(t["trace_id"], []))
        rows = []
        for i, (us, step, branch, node) in enumerate(hops):
            nxt = hops[i + 1][0] if i + 1 < len(hops) else None
            rows.append({"seq": i + 1, "step": step, "branch": branch, "node": node,
                         "ts": (dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=us)).isoformat() + "Z",
                         "spent_ms": None if nxt is None else (nxt - us) / 1000.0})
        out.append({"trace_id": t["trace_id"], "protocol": t["protocol"], "stage": t["stage"],
                    "duration_ms": t["duration_ms"], "hops": rows, "chart": t["rank"] == 1})
    return out


def _iso(us):
    if us is None:
        return None
    import datetime as dt
    return (dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=int(us))).isoformat() + "Z"


LOG4J2 = Path(__file__).with_name("log4j2.properties")


# JVM options for a short job on small input: C1 only (no C2 compile
# threads competing for the 2 cores) and the serial collector (no parallel GC threads, a
# smaller heap footprint). Measured on the demo's 3,005 events, bench_spark_report --demo,
# back to back at load 0.8-1.9: 26.96 s -> 23.46 s wall, peak 1796 -> 801 MB. Not used for
# large input, where C2-compiled code and a parallel collector pay off.
SHORT_JOB_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

#: JVM options for large input: the throughput collector instead of G1
#: (no concurrent marking threads on 2 cores; a batch job has no pause target). The console
#: script and run() add them when they start the JVM for input that is not small; with
#: spark-submit give them as `--driver-java-options` (README, bench_spark_report.py).
LARGE_JOB_JVM_OPTS = "-XX:+UseParallelGC"


def _short_job_opts() -> str:
    """SHORT_JOB_JVM_OPTS plus the class-data-sharing archive when one was built for this
    JDK and Spark (spark/cds.py: JVM CPU on the demo's logs 28-33 s -> 19-23 s)."""
    from spark import cds
    return " ".join(o for o in (SHORT_JOB_JVM_OPTS, cds.java_opts()) if o)


SHORT_JOB_MAX_BYTES = 64 * 1024 * 1024
#: the step table carries each trace's `peers` (for the plan's faults) only for local input
#: up to this many bytes (the demo's logs: its plan has faults, and a second pass over the
#: input would cost more than the column); any other input gets them from a second pass
#: over the input (_trace_peers) when, and only when, the plan has faults. Measured at 1M
#: events (bench_spark_report.py, no faults): see README / docs/report-performance.md
PEERS_IN_STEP_TABLE_MAX_BYTES = 16 * 1024 * 1024
#: SMALL_INPUT_CONF (interpreted expressions) only up to this: the demo's logs are ~3 MB
SMALL_INPUT_MAX_BYTES = 16 * 1024 * 1024


def _local_input_bytes(inputs: list[str]) -> int | None:
    """Total size in bytes of local inputs (globs expanded, directories summed), None when
    any input is a URI or matches nothing (size unknown)."""
    import glob
    total = 0
    for spec in inputs:
        if "://" in spec and not spec.startswith("file:"):
            return None
        paths = glob.glob(spec.removeprefix("file:")) or []
        if not paths:
            return None
        for path in paths:
            if os.path.isdir(path):
                total += sum(os.path.getsize(os.path.join(d, f))
                             for d, _, fs in os.walk(path) for f in fs)
            else:
                total += os.path.getsize(path)
    return total


def _small_input(inputs: list[str], limit: int = SHORT_JOB_MAX_BYTES) -> bool:
    """Local inputs of at most `limit` bytes of JSON lines (a tenth of it for compacted
    Parquet, which holds ~10x the events per byte)."""
    from spark.schema import is_parquet
    size = _local_input_bytes(inputs) if inputs else None
    limit //= 10 if any(is_parquet(p) for p in inputs) else 1
    return size is not None and size <= limit


def job_jvm(small: bool = True) -> None:
    """Give the driver JVM SHORT_JOB_JVM_OPTS (small input) or LARGE_JOB_JVM_OPTS (small =
    False), when it is not running yet and its launch arguments are ours: PYSPARK_SUBMIT_ARGS
    unset or as quiet_jvm set it (run() calls this, so the launcher's report gets them too)."""
    from pyspark import SparkContext
    if SparkContext._gateway is not None or os.environ.get("PYSPARK_GATEWAY_PORT"):
        return
    opts = _short_job_opts() if small else LARGE_JOB_JVM_OPTS
    args = os.environ.get("PYSPARK_SUBMIT_ARGS")
    if args is None:
        os.environ["PYSPARK_SUBMIT_ARGS"] = f'--driver-java-options "{opts}" pyspark-shell'
    elif (args == _QUIET_ARGS.get("set") and SHORT_JOB_JVM_OPTS not in args
          and LARGE_JOB_JVM_OPTS not in args):
        os.environ["PYSPARK_SUBMIT_ARGS"] = _QUIET_ARGS["set"] = args.replace(
            '" pyspark-shell', f' {opts}" pyspark-shell', 1)


#: the PYSPARK_SUBMIT_ARGS quiet_jvm set (job_jvm adds to them only)
_QUIET_ARGS: dict[str, str] = {}


def quiet_jvm(level: str | None = None, inputs: list[str] | None = None) -> None:
    """Before the JVM starts (console script, not spark-submit): point log4j2 at
    spark/log4j2.properties (ERROR only) unless PYSPARK_SUBMIT_ARGS is already set by the
    user. level: a log4j level to use instead of the file (e.g. "INFO"). inputs: the
    report's inputs; when they are local and at most SHORT_JOB_MAX_BYTES in all, the JVM
    also gets SHORT_JOB_JVM_OPTS (a short job: JIT and GC threads cost more than they save),
    else LARGE_JOB_JVM_OPTS."""
    if os.environ.get("PYSPARK_GATEWAY_PORT") or os.environ.get("PYSPARK_SUBMIT_ARGS"):
        return
    opt = (f"-Dlog4j2.level={level}" if level else
           f"-Dlog4j2.configurationFile=file:{LOG4J2}")
    if inputs:
        opt += " " + (_short_job_opts() if _small_input(inputs) else LARGE_JOB_JVM_OPTS)
    os.environ["PYSPARK_SUBMIT_ARGS"] = _QUIET_ARGS["set"] = \
        f'--driver-java-options "{opt}" pyspark-shell'


def trace_lookup(out: str, trace_id: str) -> str:
    """One message's hops (RMB, REMP, Marlin) with times, from a finished report's
    hops.parquet and delivery.parquet in `out` (a local directory; pyarrow, no Spark).
    Nodes are named by the demo plan's labels (summary.json). Raises KeyError when the
    trace is not in the report."""
    import pyarrow.parquet as pq
    import pyarrow.compute as pc
    base = Path(out)
    labels = {}
    summ = base / "summary.json"
    if summ.exists():
        labels = json.loads(summ.read_text()).get("plan", {}).get("labels", {})
    hops = pq.read_table(base / "hops.parquet")
    hops = hops.filter(pc.equal(hops["trace_id"], trace_id)).to_pylist()
    if not hops:
        raise KeyError(f"trace {trace_id!r} is not in {base / 'hops.parquet'}")
    hops.sort(key=lambda h: h["seq"])
    dl = pq.read_table(base / "delivery.parquet")
    dl = dl.filter(pc.equal(dl["trace_id"], trace_id)).to_pylist()
    t0 = hops[0]["ts"]
    lines = [f"trace {trace_id} ({hops[0]['protocol']})"]
    for d in sorted(dl, key=lambda d: d["branch"]):
        extra = f" code {d['error_code']}" if d.get("error_code") else ""
        lines.append(f"  branch {labels.get(d['branch'], d['branch']) or '-'}: {d['outcome']}{extra}"
                     f"{' (late reply seen)' if d.get('late') else ''}"
                     f"{' [planned]' if d.get('planned') else ''}")
    lines.append(f"  {'#':>3} {'time (UTC)':<26} {'+ms':>10} {'step':<28} {'branch':<10} "
                 f"{'node':<14} {'next in ms':>10}")
    for h in hops:
        rel = (h["ts"] - t0).total_seconds() * 1000.0
        spent = "" if h["spent_ms"] is None else f"{h['spent_ms']:.3f}"
        node = labels.get(h["node"], h["node"])
        branch = labels.get(h["branch"], h["branch"]) if h["branch"] else ""
        lines.append(f"  {h['seq']:>3} {h['ts'].isoformat():<26} {rel:>10.3f} {h['step']:<28} "
                     f"{branch:<10} {node:<14} {spent:>10}"
                     + (f"  x{h['n']}" if h["n"] > 1 else ""))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The relay-trace-report command line (also checked against deploy/ by the tests)."""
    ap = argparse.ArgumentParser(prog="relay-trace-report", description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="*", help="JSON-lines event logs or compacted Parquet "
                    "(paths/URIs, globs accepted); none with --trace: read the report in --out")
    ap.add_argument("--out", required=True, help="output directory (path or URI)")
    ap.add_argument("--master", default=None, help="Spark master URL (default local[*])")
    ap.add_argument("--sla", default=None, help=f"SLA objectives TOML (default {DEFAULT_SLA})")
    ap.add_argument("--parquet-cache", default=None,
                    help="convert JSON inputs to Parquet in this directory first, then read that")
    ap.add_argument("--strict", action="store_true",
                    help="fail on schema-violating lines (tests)")
    ap.add_argument("--trace", metavar="ID", default=None,
                    help="print one message's hops with times (RMB uid, REMP message id, Marlin "
                         "message_id:producer); without INPUTs from the report already in --out")
    ap.add_argument("--spark-log-level", default=None, metavar="LEVEL",
                    help="Spark/JVM console log level (default: ERROR only, spark/log4j2.properties)")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--follow" in argv:   # the streaming mode: spark/follow.py (its own options)
        from spark.follow import main as follow_main
        argv.remove("--follow")
        return follow_main(argv)
    ap = build_parser()
    args = ap.parse_args(argv)
    if not args.inputs:
        if not args.trace:
            ap.error("INPUT is required (unless --trace reads an existing report in --out)")
        try:
            print(trace_lookup(args.out, args.trace))
        except (KeyError, FileNotFoundError) as e:
            print(f"relay-trace-report: {e}", file=sys.stderr)
            return 1
        return 0
    quiet_jvm(args.spark_log_level, args.inputs)
    summary = run(args.inputs, args.out, args.master, args.sla, strict=args.strict,
                  parquet_cache=args.parquet_cache)
    print(json.dumps({"outputs": summary["outputs"], "sla": [
        {k: s[k] for k in ("name", "status", "actual", "budget_used")} for s in summary["sla"]],
        "timings": summary["timings"]}, indent=2, default=str))
    if args.trace:
        print(trace_lookup(args.out, args.trace))
    return 0


if __name__ == "__main__":
    sys.exit(main())
