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
(`rmb_peer/events.py`, `rmb_relay/events.py`, `remp_node/events.py`,
`marlin_cluster/events.py`); deploy/catalogues.py lists them once, and the Spark job builds
its read schema from that list (spark/schema.py).
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import IO, Iterable, Mapping

import orjson
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
_LEVEL_RANK = {name: i for i, name in enumerate(LEVELS)}
#: attribute type -> the exact classes accepted at once (None: an absent value)
_EXACT = {"string": {str, type(None)}, "long": {int, type(None)},
          "double": {int, float, type(None)}, "boolean": {bool, type(None)}}


@dataclass(slots=True)
class LogRecord:
    """One event log line a protocol's event map (or a core, as a command: the RMB relay's
    `Log`) produced, before it is written: catalogue event name, trace_id (the message's
    identity, or None), level ("debug" | "info" | "warning" | "error") and attrs (flat,
    types per the catalogue). `EventLog.emit_attrs(r.event, r.trace_id, r.level, r.attrs)`
    writes one. Slots, not frozen: built once per delivered envelope on the relay's hot
    path, where a frozen dataclass's __init__ (object.__setattr__ per field) costs more
    than plain stores; its fields are fixed (no other attribute can be set)."""

    event: str
    trace_id: str | None
    level: str
    attrs: dict = field(default_factory=dict)


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


class _Sink:
    """The byte stream under structlog's BytesLogger: a file rotated by size, or a stream.

    Lines are buffered and flushed every FLUSH_INTERVAL s by a background flusher thread
    (so an idle daemon's last lines reach the file promptly), when the 64 KiB buffer
    fills, and on close, instead of one flush per line: a flush per line cost more than
    the relay's own work per envelope (bench/bench_relay.py). Rotation (file sinks): when the
    file would exceed max_bytes it is renamed PATH.1 (PATH.1 -> PATH.2, ... up to
    `backups`) and a new file is opened: RotatingFileHandler's naming, so log tools and
    the Spark job's globs see the usual layout."""

    FLUSH_INTERVAL = 0.1

    def __init__(self, sink: IO[str] | str | None, max_bytes: int, backups: int,
                 segment_s: float | None = None):
        self.path = sink if isinstance(sink, str) and sink != "-" else None
        self.max_bytes = max_bytes
        self.backups = backups
        self.lock = threading.Lock()
        self.closed = False
        #: segment mode (file sinks only): seconds between segment closes, else None
        self.segment_s = segment_s if self.path and segment_s else None
        self.segment_opened = time.monotonic()
        if self.path:
            self.stream = open(self.path, "ab", buffering=1 << 16)
            self.size = self.stream.tell()
        else:
            text = sys.stdout if sink is None or sink == "-" else sink
            self.stream = getattr(text, "buffer", None) or _TextAdapter(text)
            self.size = 0
        _FLUSHER.add(self)

    def write(self, data: bytes) -> None:
        """Called by structlog's BytesLogger, under its per-file lock: no lock of our own on
        this path (one lock per line was measurable). The flusher thread's flush is safe
        beside it: CPython's BufferedWriter locks internally; a flush that races a rotation
        hits the closed old file and is skipped (ValueError)."""
        if self.segment_s:
            with self.lock:   # segment mode: the flusher thread may close the file too
                if self.closed:
                    return
                if self.size > 0 and self.size + len(data) > self.max_bytes:
                    self._close_segment(reopen=True)
                self.stream.write(data)
                self.size += len(data)
            return
        if self.closed:
            return
        if self.path and self.size > 0 and self.size + len(data) > self.max_bytes:
            with self.lock:
                self._rotate()
        self.stream.write(data)
        self.size += len(data)

    def flush(self) -> None:
        """Called by BytesLogger after every line: deliberately a no-op (see the class doc)."""

    def force_flush(self) -> None:
        with self.lock:
            if not self.closed:
                self.stream.flush()
                if (self.segment_s and self.size > 0
                        and time.monotonic() - self.segment_opened >= self.segment_s):
                    self._close_segment(reopen=True)

    def _close_segment(self, reopen: bool) -> None:
        """Segment mode, under self.lock: the current file (whole lines only: a write is
        whole lines) is flushed, closed and renamed into SEGMENTS_DIR beside it; with
        `reopen` a new current file is opened. An empty current file is left alone."""
        self.segment_opened = time.monotonic()
        if self.size == 0 and reopen:
            return
        self.stream.close()
        if self.size > 0:
            seal_file(self.path)
        if reopen:
            self.stream = open(self.path, "ab", buffering=1 << 16)
            self.size = 0

    def _rotate(self) -> None:
        self.stream.close()
        for i in range(self.backups - 1, 0, -1):
            if os.path.exists(f"{self.path}.{i}"):
                os.replace(f"{self.path}.{i}", f"{self.path}.{i + 1}")
        if self.backups > 0:
            os.replace(self.path, f"{self.path}.1")
        else:
            os.remove(self.path)
        self.stream = open(self.path, "ab", buffering=1 << 16)
        self.size = 0

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.stream.flush()
            if self.path:
                self.stream.close()
                if self.segment_s:
                    seal_file(self.path)   # an empty current file is removed
            self.closed = True
        _FLUSHER.discard(self)


#: segment mode: closed segments go to this directory beside the current file
SEGMENTS_DIR = "segments"
#: environment variable that turns segment mode on for every file sink of a process
#: (seconds between segment closes), e.g. RELAY_EVENTLOG_SEGMENT_S=2
SEGMENT_ENV = "RELAY_EVENTLOG_SEGMENT_S"


def segment_glob(logdir: str) -> str:
    """The glob of the closed segments of the event logs in `logdir`."""
    return os.path.join(logdir, SEGMENTS_DIR, "*.jsonl")


def seal_file(path: str) -> str | None:
    """Moves a closed event log file `DIR/NAME.jsonl` to `DIR/segments/NAME.<us>.jsonl`
    (<us>: 16-digit UTC microseconds at the move, bumped past an existing name) by one
    rename: a reader of `segments/` sees a file whole or not at all, and no line is in two
    files. Returns the new path, or None when `path` is missing or empty (it is removed
    when empty). The file must not be open for writing by anyone (a daemon that has
    stopped, or the sink under its lock)."""
    try:
        if os.path.getsize(path) == 0:
            os.remove(path)
            return None
    except FileNotFoundError:
        return None
    head, name = os.path.split(path)
    stem = name[:-len(".jsonl")] if name.endswith(".jsonl") else name
    seg_dir = os.path.join(head, SEGMENTS_DIR)
    os.makedirs(seg_dir, exist_ok=True)
    stamp = time.time_ns() // 1000
    while True:
        target = os.path.join(seg_dir, f"{stem}.{stamp:016d}.jsonl")
        if not os.path.exists(target):
            break
        stamp += 1
    os.replace(path, target)
    return target


def seal_dir(logdir: str) -> list[str]:
    """Seals every `*.jsonl` current file left in `logdir` (daemons that were killed, or
    logs written without segment mode) after every writer has stopped; returns the new
    segment paths. A torn last line stays torn (the report counts it as it would)."""
    out = []
    for name in sorted(os.listdir(logdir)):
        if name.endswith(".jsonl") and os.path.isfile(os.path.join(logdir, name)):
            seg = seal_file(os.path.join(logdir, name))
            if seg:
                out.append(seg)
    return out


class _TextAdapter:
    """Bytes onto a text stream that has no .buffer (e.g. io.StringIO in tests)."""

    def __init__(self, text: IO[str]):
        self.text = text

    def write(self, data: bytes) -> None:
        self.text.write(data.decode())

    def flush(self) -> None:
        self.text.flush()


class _Flusher:
    """One daemon thread flushing every open sink every FLUSH_INTERVAL s."""

    def __init__(self):
        self.sinks: "weakref.WeakSet[_Sink]" = weakref.WeakSet()
        self.thread: threading.Thread | None = None
        self.guard = threading.Lock()

    def add(self, sink: _Sink) -> None:
        with self.guard:
            self.sinks.add(sink)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="eventlog-flusher", daemon=True)
                self.thread.start()

    def discard(self, sink: _Sink) -> None:
        with self.guard:
            self.sinks.discard(sink)

    def _run(self) -> None:
        while True:
            time.sleep(_Sink.FLUSH_INTERVAL)
            with self.guard:
                sinks = list(self.sinks)
            for sink in sinks:
                try:
                    sink.force_flush()
                except (OSError, ValueError):
                    pass


_FLUSHER = _Flusher()
atexit.register(lambda: [sink.close() for sink in list(_FLUSHER.sinks)])


class _Stamp:
    """structlog processor: sets `ts` (UTC, RFC 3339, microseconds, `Z`) in an event dict
    whose keys are already in contract order (LINE_FIELDS). The `YYYY-MM-DDTHH:MM:SS`
    prefix is formatted once per second, so a stamp costs one clock read and one small
    f-string (about 0.4 us against 1.1 us for TimeStamper(fmt="iso", utc=True))."""

    __slots__ = ("second", "prefix")

    def __init__(self):
        self.second = -1
        self.prefix = ""

    def __call__(self, _logger, _method: str, event_dict: dict) -> dict:
        second, micros = divmod(time.time_ns() // 1000, 1_000_000)
        if second != self.second:
            self.prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self.second = second
        event_dict["ts"] = f"{self.prefix}.{micros:06d}Z"
        return event_dict


class EventLog:
    """JSON-lines event writer for one daemon instance.

    EventLog(service="rmb-relay", node="r1.local", catalogues=[RMB_EVENTS],
             sink="/var/log/rmb-relay.jsonl" | "-" (stdout) | a text stream | None (stdout),
             min_level="info", max_bytes=64 MiB, backups=5)

    `emit(event, trace_id=None, level="info", **attrs)` writes one line; raises
    EventLogError for an event not in the catalogues or an undeclared/mistyped attribute
    (a programming error, caught by tests). Rotation: by size (PATH.1 .. PATH.<backups>);
    lines are buffered and flushed every 0.1 s and on close.

    Segment mode (`segment_s` seconds, or the RELAY_EVENTLOG_SEGMENT_S environment
    variable; file sinks only): instead of size rotation, the current file PATH is closed
    and renamed into `DIR/segments/NAME.<us>.jsonl` (seal_file) by the 0.1 s flusher once
    it is `segment_s` seconds old and not empty, when it would exceed max_bytes, and on
    close; nothing is deleted. Writes take the sink's lock in this mode. A streaming reader
    (spark/follow.py) watches `segments/`, where every file is complete; a batch reader
    reads `segments/*.jsonl` and the current `*.jsonl`: every line is in exactly one file.

    Rendering is structlog's: a processor chain (our `_Stamp`, then structlog's
    JSONRenderer with orjson) onto structlog's BytesLogger. EventLog itself does what a
    filtering BoundLogger would (level filter) plus the catalogue checks, and calls the
    chain directly: the BoundLogger's kwargs and context handling, which EventLog does not
    use, cost 1.2 us a line, a third of the total (bench/bench_relay.py: the relay logs
    every envelope). Cost: about 2.5 us of CPU per event (one core, Python 3.11).
    """

    def __init__(self, service: str, node: str, catalogues: Iterable[Catalogue],
                 sink: IO[str] | str | None = None, min_level: str = "info",
                 max_bytes: int = 64 * 1024 * 1024, backups: int = 5,
                 segment_s: float | None = None):
        if min_level not in LEVELS:
            raise EventLogError(f"min_level must be one of {LEVELS}")
        self.service = service
        self.node = node
        self.specs: dict[str, EventSpec] = {}
        for cat in catalogues:
            self.specs.update(cat.specs)
        self._min = _LEVEL_RANK[min_level]
        self._checks = {name: {key: _EXACT[typ] for key, typ in spec.attrs.items()}
                        for name, spec in self.specs.items()}
        if segment_s is None and os.environ.get(SEGMENT_ENV):
            segment_s = float(os.environ[SEGMENT_ENV])
        self._sink = _Sink(sink, max_bytes, backups, segment_s)
        self._logger = structlog.BytesLogger(self._sink)
        self._stamp = _Stamp()
        self._render = structlog.processors.JSONRenderer(serializer=orjson.dumps)

    def emit(self, event: str, trace_id: str | None = None, level: str = "info", **attrs) -> None:
        self.emit_attrs(event, trace_id, level, attrs)

    def emit_attrs(self, event: str, trace_id: str | None, level: str, attrs: dict[str, object]) -> None:
        """emit() with the attributes as one dict: needed for attribute names that
        collide with emit's own parameters (REMP's `level`, the status level 0..4, seed:
        remp-protocol-b). Same checks and errors as emit()."""
        if not self.check(event, level, attrs):
            return
        logger = self._logger
        logger.msg(self._render(logger, level, self._stamp(logger, level, {
            "ts": None, "level": level, "service": self.service, "node": self.node,
            "event": event, "trace_id": trace_id, "attrs": attrs})))

    def emit_many(self, events: Iterable[tuple[str, str | None, str, dict[str, object]]]) -> None:
        """Several events that happened at ONE moment (e.g. frames that left in one socket
        write), each an (event, trace_id, level, attrs) tuple as emit_attrs takes: the same
        checks, errors and line format, one line each, in order; the lines share one
        timestamp (one clock read) and go to the sink in one write. An invalid event
        raises EventLogError before anything is written."""
        logger = self._logger
        render = self._render
        ts = None
        lines = []
        for event, trace_id, level, attrs in events:
            if not self.check(event, level, attrs):
                continue
            line = {"ts": ts, "level": level, "service": self.service, "node": self.node,
                    "event": event, "trace_id": trace_id, "attrs": attrs}
            if ts is None:
                ts = self._stamp(logger, level, line)["ts"]
            lines.append(line)
        if lines:
            logger.msg(b"\n".join([render(logger, line["level"], line) for line in lines]))

    def check(self, event: str, level: str, attrs: dict[str, object]) -> bool:
        """The catalogue checks of one line without writing it: raises EventLogError for an
        unknown event, an undeclared attribute or a wrong type; False when `level` is below
        min_level (the line would not be written), else True."""
        checks = self._checks.get(event)
        if checks is None:
            raise EventLogError(f"event {event!r} is not in this daemon's catalogues")
        for key, value in attrs.items():
            exact = checks.get(key)
            if exact is None:
                raise EventLogError(f"{event}: attr {key!r} is not declared")
            if value.__class__ not in exact:   # else a subclass (an IntEnum, say) or wrong
                typ = self.specs[event].attrs[key]
                if not isinstance(value, _PY_TYPES[typ]) or (typ != "boolean" and isinstance(value, bool)):
                    raise EventLogError(
                        f"{event}: attr {key!r} must be {typ}, got {type(value).__name__}")
        rank = _LEVEL_RANK.get(level)
        if rank is None:
            raise EventLogError(f"level {level!r} is not one of {LEVELS}")
        return rank >= self._min

    def flush(self) -> None:
        """Writes buffered lines out now (also done every 0.1 s and on close)."""
        self._sink.force_flush()

    def close(self) -> None:
        """Flushes and closes the sink (stdout is flushed, not closed)."""
        self._sink.close()
