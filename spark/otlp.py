"""The report's traces as OpenTelemetry OTLP JSON, so Jaeger or an
OpenTelemetry Collector (`otlpjsonfile` receiver) can load them.

Format: the OTLP file exporter's: one `TracesData` JSON object per line (here one line per
trace), protobuf JSON mapping with OTLP's rules: traceId / spanId as lowercase hex (16 and 8
bytes), times as decimal strings of Unix nanoseconds, enums as integers, attribute values
as AnyValue objects. Spec: opentelemetry-proto `opentelemetry/proto/trace/v1/trace.proto`
and the OTLP/JSON section of the OTLP specification.

One span per hop (a row of hops.parquet): name = the step (e.g. `relay.delivered.req`),
start = the hop's corrected ts, end = the next hop's ts (the time until the next step; the
last hop has end = start), parent = the previous hop's span (a chain in time order), kind
INTERNAL, attributes `relay_suite.protocol`, `relay_suite.node` (the plan label when
known), `relay_suite.branch`, `relay_suite.count`. traceId = md5(trace id) (a REMP message
id or an RMB uid is not 16 bytes), so `relay_suite.trace_id` keeps the original.
spanId = the first 8 bytes of md5(trace id, seq). Resource: service.name = "relay-suite".
"""
from __future__ import annotations


def otlp_lines(hops, labels: dict[str, str]):
    """DataFrame with one string column `value`: one TracesData JSON per trace. hops: the
    report's hops DataFrame (trace_id, protocol, step, branch, node, n, seq, spent_ms, ts)."""
    from pyspark.sql import functions as F
    if labels:
        args = []
        for k, v in labels.items():
            args += [F.lit(k), F.lit(v)]
        node = F.coalesce(F.element_at(F.create_map(*args), F.col("node")), F.col("node"))
    else:
        node = F.col("node")

    # one AnyValue type for every attribute (an array needs one element type); the unset
    # member is null, which to_json leaves out
    def attr(key, col):
        return F.struct(F.lit(key).alias("key"), F.struct(
            col.cast("string").alias("stringValue"),
            F.lit(None).cast("string").alias("intValue")).alias("value"))

    def int_attr(key, col):
        return F.struct(F.lit(key).alias("key"), F.struct(
            F.lit(None).cast("string").alias("stringValue"),
            col.cast("string").alias("intValue")).alias("value"))
    start_ns = (F.unix_micros("ts") * 1000)
    end_ns = start_ns + F.coalesce((F.col("spent_ms") * 1e6).cast("long"), F.lit(0))
    span_id = F.substring(F.md5(F.concat_ws(":", "trace_id", F.col("seq").cast("string"))), 1, 16)
    parent = F.when(F.col("seq") > 1, F.substring(F.md5(F.concat_ws(
        ":", "trace_id", (F.col("seq") - 1).cast("string"))), 1, 16)).otherwise(F.lit(""))
    span = F.struct(
        F.md5("trace_id").alias("traceId"), span_id.alias("spanId"),
        parent.alias("parentSpanId"), F.col("step").alias("name"), F.lit(1).alias("kind"),
        start_ns.cast("string").alias("startTimeUnixNano"),
        end_ns.cast("string").alias("endTimeUnixNano"),
        F.array(attr("relay_suite.trace_id", F.col("trace_id")),
                attr("relay_suite.protocol", F.col("protocol")),
                attr("relay_suite.node", node),
                attr("relay_suite.branch", F.col("branch")),
                int_attr("relay_suite.count", F.col("n"))).alias("attributes"))
    # in seq order (seq is unique in a trace: the span is never compared); sort_array is
    # compiled, array_sort's default comparator is a lambda Spark interprets
    per_trace = (hops.select("trace_id", "seq", span.alias("span"))
                 .groupBy("trace_id")
                 .agg(F.sort_array(F.collect_list(F.struct("seq", "span"))).alias("s")))
    resource = F.struct(F.array(attr("service.name", F.lit("relay-suite"))).alias("attributes"))
    scope = F.struct(F.lit("relay-trace-report").alias("name"))
    doc = F.struct(F.array(F.struct(
        resource.alias("resource"),
        F.array(F.struct(scope.alias("scope"), F.col("s.span").alias("spans"))).alias("scopeSpans")
    )).alias("resourceSpans"))
    return per_trace.select(F.to_json(doc).alias("value"))
