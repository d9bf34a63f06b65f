"""The event log: one JSON object per line, the contract between daemons and the Spark job.

Schema (DESIGN.md section 6; docs/event-log.md), every line:

    ts        str   UTC RFC 3339 with microseconds, e.g. "2026-11-20T22:51:03.123456Z"
    level     str   "debug" | "info" | "warning" | "error"
    service   str   e.g. "rmb-relay", "rmb-peer", "remp-validator"
    node      str   the instance (twin id[:sid], relay domain, validator key id prefix, ...)
    event     str   dotted "protocol.component.verb" from a Catalogue
    trace_id  str|null  the message's identity across processes
    attrs     obj   event-specific flat fields declared by the event's EventSpec

Lines are rendered by structlog (never by hand). Each `EventLog` owns its own logger so
several daemons can share one process (tests, the launcher) without sharing a sink.

Every event a daemon emits is declared once in its protocol's catalogue
(`rmb_peer/events.py`, `remp_node/events.py`, `marlin_cluster/events.py`); the Spark job
builds its read schema from the same catalogues (`spark_schema_fields`).
"""
from __future__ import annotations

import logging
import logging.handlers
import sys
from dataclasses import dataclass, field
from typing import IO, Iterable, Mapping

import structlog

#: Top-level fields of every line, in order, with their JSON types.
LINE_FIELDS: tuple[tuple[str, str], ...] = (
    ("ts", "string"),
    ("level", "string"),
    ("service", "string"),
    ("node", "string"),
    ("event", "string"),
    ("trace_id", "string"),
    ("attrs", "object"),
)

#: Attribute types an EventSpec may declare (they map 1:1 onto Spark SQL types).
ATTR_TYPES = ("string", "long", "double", "boolean")

LEVELS = ("debug", "info", "warning", "error")


class EventLogError(ValueError):
    """A local misuse of the event log: unknown event name, undeclared or mistyped attribute."""


@dataclass(frozen=True)
class EventSpec:
    """One catalogued event.

    name:  dotted `protocol.component.verb`, e.g. "rmb.relay.federated".
    doc:   when it is emitted and what the trace learns from it.
    attrs: attribute name -> one of ATTR_TYPES. Sizes are bytes, durations ms.
    """

    name: str
    doc: str
    attrs: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name.count(".") < 2:
            raise EventLogError(f"event name {self.name!r} is not protocol.component.verb")
        for key, typ in self.attrs.items():
            if typ not in ATTR_TYPES:
                raise EventLogError(f"{self.name}: attr {key!r} has unknown type {typ!r}")
            if "." in key:
                raise EventLogError(f"{self.name}: attr {key!r} must be flat (no dots)")


class Catalogue:
    """The events of one protocol. `Catalogue("rmb", [EventSpec(...), ...])`."""

    def __init__(self, protocol: str, specs: Iterable[EventSpec]):
        self.protocol = protocol
        self.specs: dict[str, EventSpec] = {}
        for spec in specs:
            if not spec.name.startswith(protocol + "."):
                raise EventLogError(f"{spec.name} is not in protocol {protocol!r}")
            if spec.name in self.specs:
                raise EventLogError(f"{spec.name} declared twice")
            self.specs[spec.name] = spec

    def __contains__(self, name: str) -> bool:
        return name in self.specs

    def __getitem__(self, name: str) -> EventSpec:
        return self.specs[name]

    def __iter__(self):
        return iter(self.specs.values())


_PY_TYPES = {"string": (str,), "long": (int,), "double": (int, float), "boolean": (bool,)}


def attr_types(catalogues: Iterable[Catalogue]) -> dict[str, str]:
    """Union of every attribute across catalogues: name -> type.

    Raises EventLogError when two events declare one attribute name with different types
    (the Spark schema has one column per attribute name)."""
    merged: dict[str, str] = {}
    for cat in catalogues:
        for spec in cat:
            for key, typ in spec.attrs.items():
                if merged.setdefault(key, typ) != typ:
                    raise EventLogError(
                        f"attr {key!r} is {merged[key]} elsewhere but {typ} in {spec.name}")
    return merged


def _stream_logger(name: str, sink: IO[str] | str | None, max_bytes: int, backups: int) -> logging.Logger:
    logger = logging.Logger(name)  # private: not registered globally, no propagation
    logger.propagate = False
    if sink is None or sink == "-":
        handler: logging.Handler = logging.StreamHandler(sys.stdout)
    elif isinstance(sink, str):
        handler = logging.handlers.RotatingFileHandler(
            sink, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
    else:
        handler = logging.StreamHandler(sink)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    return logger


def _order_fields(_logger, _method, event_dict):
    ordered = {k: event_dict.pop(k, None) for k, _ in LINE_FIELDS}
    if ordered["attrs"] is None:
        ordered["attrs"] = {}
    return ordered


class EventLog:
    """JSON-lines event writer for one daemon instance.

    EventLog(service="rmb-relay", node="r1.local", catalogues=[RMB_EVENTS],
             sink="/var/log/rmb-relay.jsonl" | "-" (stdout) | a text stream | None (stdout),
             min_level="info", max_bytes=64 MiB, backups=5)

    `emit(event, trace_id=None, level="info", **attrs)` writes one line; raises
    EventLogError for an event not in the catalogues or an undeclared/mistyped attribute
    (a programming error, caught by tests). Rotation: by size (RotatingFileHandler).
    """

    def __init__(self, service: str, node: str, catalogues: Iterable[Catalogue],
                 sink: IO[str] | str | None = None, min_level: str = "info",
                 max_bytes: int = 64 * 1024 * 1024, backups: int = 5):
        if min_level not in LEVELS:
            raise EventLogError(f"min_level must be one of {LEVELS}")
        self.service = service
        self.node = node
        self.specs: dict[str, EventSpec] = {}
        for cat in catalogues:
            self.specs.update(cat.specs)
        self._min = LEVELS.index(min_level)
        self._std = _stream_logger(f"eventlog.{service}.{node}.{id(self)}", sink, max_bytes, backups)
        self._log = structlog.wrap_logger(
            self._std,
            processors=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
                _order_fields,
                structlog.processors.JSONRenderer(separators=(",", ":")),
            ],
            context_class=dict,
        )

    def emit(self, event: str, trace_id: str | None = None, level: str = "info", **attrs) -> None:
        spec = self.specs.get(event)
        if spec is None:
            raise EventLogError(f"event {event!r} is not in this daemon's catalogues")
        for key, value in attrs.items():
            typ = spec.attrs.get(key)
            if typ is None:
                raise EventLogError(f"{event}: attr {key!r} is not declared")
            if value is not None and (not isinstance(value, _PY_TYPES[typ])
                                      or (typ != "boolean" and isinstance(value, bool))):
                raise EventLogError(f"{event}: attr {key!r} must be {typ}, got {type(value).__name__}")
        if LEVELS.index(level) < self._min:
            return
        getattr(self._log, level)(event=event, service=self.service, node=self.node,
                                  trace_id=trace_id, attrs=attrs)

    def close(self) -> None:
        for handler in list(self._std.handlers):
            handler.close()
            self._std.removeHandler(handler)
