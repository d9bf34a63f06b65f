"""The relay core's outputs: commands the adapter executes (no I/O here).

Drained with RelayCore.next_event(); each is a dataclass under `RelayCommand`, its fields
documented, and each names the input that answers it (DESIGN.md section 2), except
`LookupTwin` (twin: int, refresh: bool; answer with twin_resolved(twin, record | error)),
the one shape the relay and the peer cores share (rmb_peer.freshness).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

from daemon_runtime.eventlog import LogRecord
from rmb_peer.freshness import LookupTwin
from rmb_relay.core.routing import Session

__all__ = [
    "RelayCommand",
    "WriteFrame",
    "Enqueue",
    "ReadQueue",
    "ReplayFrames",
    "AckQueue",
    "ProbeQueue",
    "LookupTwin",
    "PostFederation",
    "CloseConnection",
    "Log",
    "FederationAnswer",
]

class RelayCommand(abc.ABC):
    """Base class of everything RelayCore.next_event() returns (`LookupTwin`, shared with
    the peer core, is registered as one)."""


@dataclass
class WriteFrame(RelayCommand):
    """Write `data` (a serialized envelope) to connection `conn` as one binary frame.
    `session`: the destination session when this is a delivery (None for a reply to the
    sender); `log`: the event to log once the write succeeded. A delivery whose write
    fails is handed back with write_failed(cmd, now) (it is queued instead)."""
    conn: Any
    data: bytes
    session: Session | None = None
    log: "Log | None" = None


@dataclass
class Enqueue(RelayCommand):
    """Append `data` to `session`'s offline queue, keeping it until `until` (unix s);
    answer with enqueued(token, "queued" | "full" | "share" | "failed", now) ("share":
    the sender `src` holds its whole share of that queue)."""
    token: int
    session: Session
    data: bytes
    until: float
    uid: str
    kind: str
    src: str


@dataclass
class ReadQueue(RelayCommand):
    """Read up to `count` entries, oldest first, of `session`'s offline stream; answer
    with queue_read(conn, entries, now), or queue_failed(conn, reason, now) when Redis
    fails. `conn`: the connection being replayed to (nothing to do once it closed);
    `late`: a replay resumed after a Redis failure (the session is live already)."""
    conn: Any
    session: Session
    late: bool = False
    count: int = 256


@dataclass
class ReplayFrames(RelayCommand):
    """Offline replay onto `conn`: `items` [(entry id, data | None, log | None)] in stream
    order. Write each `data` as one binary frame (stop at the first write that fails),
    then write its `log` (rmb.relay.delivered; counted as a replay delivery); an item
    without data is a drop whose log is written in its place. Answer with
    replay_written(conn, items done, now)."""
    conn: Any
    session: Session
    items: list


@dataclass
class AckQueue(RelayCommand):
    """Delete entries `ids` from `session`'s offline stream and take `senders` (sender
    twin -> entries) off its per-sender counts, in one transaction; answer with
    queue_acked(conn, more, now), or queue_failed(conn, reason, now)."""
    conn: Any
    session: Session
    ids: list
    senders: dict
    more: bool


@dataclass
class ProbeQueue(RelayCommand):
    """Check that Redis answers (PING, bounded); answer with queue_probed(ok, now)."""


@dataclass
class PostFederation(RelayCommand):
    """One federation attempt (FederationScheduler.attempts_due): POST `data` (the raw
    envelope) to http://`domain`/ within `timeout` s; answer with
    federation_result(job, "accepted" | "refused" | "failed", now, status, reason).
    job: the scheduler's job id; uid: envelope uid; attempt: 1-based attempt number."""
    job: int
    uid: str
    domain: str
    attempt: int
    data: bytes
    timeout: float


@dataclass
class CloseConnection(RelayCommand):
    """Close connection `conn` with WebSocket close `code` and `reason` (text)."""
    conn: Any
    code: int
    reason: str


#: One event-log line: the shared daemon_runtime.eventlog.LogRecord(event, trace_id, level,
#: attrs): catalogue `event` (rmb.relay.*), the envelope's uid as `trace_id`, `level`,
#: `attrs` (catalogue attributes); registered as a RelayCommand below.
Log = LogRecord


@dataclass
class FederationAnswer(RelayCommand):
    """Answer the federation POST `request` (the adapter's handle) with HTTP `status` and
    `text`. `uid`, `src`, `dst`, `origin` for the log line of a refusal (status >= 400)."""
    request: Any
    status: int
    text: str
    uid: str | None = None
    src: str = ""
    dst: str = ""
    origin: str = ""


RelayCommand.register(LookupTwin)
RelayCommand.register(LogRecord)
