"""Read schema of the event logs, built from the catalogues (DESIGN.md section 6).

`event_schema()` is LINE_FIELDS (daemon_runtime.eventlog) with `attrs` = a struct of every
attribute declared by the catalogues listed in deploy/catalogues.py (`attr_types`, one type
per name), plus the corrupt-record column. Nothing is inferred. `ts` is a TimestampType parsed
with TS_FORMAT (RFC 3339 UTC with optional microseconds, as structlog's ISO stamper writes
it): Python logging's default time format or epoch strings do not parse, so such a line
becomes a corrupt record instead of a silent NULL.

`read_events(spark, paths)` reads JSON lines (any Hadoop-compatible URI) or Parquet written by
spark/compact.py (a path ending in `.parquet`, or a directory holding `_SUCCESS` and
`*.parquet` files) into that schema.
"""
from __future__ import annotations

from functools import lru_cache

from daemon_runtime.eventlog import LINE_FIELDS, attr_types
from deploy.catalogues import CATALOGUES  # the one list (demo.plan.*: the launcher's plan, read as facts, not trace steps)

CORRUPT = "_corrupt_record"
#: the file a line came from (kept through spark/compact.py)
SOURCE = "_source"
#: java.time pattern for `ts`; `XXX` accepts `Z` and `+00:00`
TS_FORMAT = "yyyy-MM-dd'T'HH:mm:ss[.SSSSSS]XXX"

_SPARK_TYPES = {"string": "StringType", "long": "LongType", "double": "DoubleType",
                "boolean": "BooleanType"}
_DUCK_TYPES = {"string": "VARCHAR", "long": "BIGINT", "double": "DOUBLE", "boolean": "BOOLEAN"}


def known_events() -> frozenset[str]:
    """Every catalogued event name."""
    return frozenset(s.name for c in CATALOGUES for s in c)


@lru_cache(maxsize=1)
def attrs_declared() -> dict[str, str]:
    """attribute name -> catalogue type (raises EventLogError on a type conflict)."""
    return dict(sorted(attr_types(CATALOGUES).items()))


def event_schema(corrupt_column: bool = True):
    """pyspark StructType of one log line; `ts` TimestampType, `attrs` struct of all attrs."""
    from pyspark.sql import types as T
    fields = []
    for name, typ in LINE_FIELDS:
        if name == "attrs":
            attrs = T.StructType([T.StructField(k, getattr(T, _SPARK_TYPES[t])())
                                  for k, t in attrs_declared().items()])
            fields.append(T.StructField("attrs", attrs))
        elif name == "ts":
            fields.append(T.StructField("ts", T.TimestampType()))
        else:
            fields.append(T.StructField(name, T.StringType()))
    if corrupt_column:
        fields.append(T.StructField(CORRUPT, T.StringType()))
    return T.StructType(fields)


def duckdb_columns() -> str:
    """The same schema as a DuckDB read_json `columns={...}` literal (ts as VARCHAR)."""
    # names quoted: `offset` is a reserved word (DuckDB 2.0 rejects the type unquoted)
    attrs = ", ".join(f'"{k}" {_DUCK_TYPES[t]}' for k, t in attrs_declared().items())
    cols = []
    for name, _ in LINE_FIELDS:
        typ = f"STRUCT({attrs})" if name == "attrs" else "VARCHAR"
        cols.append(f"'{name}': '{typ}'")
    return "{" + ", ".join(cols) + "}"


def is_parquet(path: str) -> bool:
    return path.rstrip("/").endswith(".parquet")


def read_events(spark, paths: list[str]):
    """DataFrame of events (schema `event_schema()`); JSON paths read PERMISSIVE with the
    corrupt-record column, Parquet paths (spark/compact.py output) read as is; both get
    `_source` (the log file a line came from). Raises
    ValueError for an empty path list or a mix of JSON and Parquet."""
    from pyspark.sql import functions as F
    if not paths:
        raise ValueError("no input paths")
    kinds = {is_parquet(p) for p in paths}
    if len(kinds) > 1:
        raise ValueError("inputs mix JSON logs and Parquet; compact the logs first")
    schema = event_schema()
    if kinds == {True}:
        from pyspark.sql import types as T
        pq_schema = T.StructType(schema.fields + [T.StructField(SOURCE, T.StringType())])
        df = spark.read.schema(pq_schema).parquet(*paths)
        return df.withColumn(SOURCE, F.coalesce(F.col(SOURCE), F.input_file_name()))
    return (spark.read.schema(schema)
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT)
            .option("timestampFormat", TS_FORMAT)
            .json(paths)
            .withColumn(SOURCE, F.input_file_name()))
