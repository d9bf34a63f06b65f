"""The relay core's outputs: commands the adapter executes (no I/O here).

Drained with RelayCore.next_event(); each is a dataclass under `RelayCommand`, its fields
documented, and each names the input that answers it (DESIGN.md section 2).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rmb_relay.core.routing import Session

__all__ = [
    "RelayCommand",
    "WriteFrame",
    "Enqueue",
    "ReplayQueue",
    "LookupTwin",
    "PostFederation",
    "CloseConnection",
    "Log",
    "FederationAnswer",
]

class RelayCommand:
    """Base class of everything RelayCore.next_event() returns."""


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
class ReplayQueue(RelayCommand):
    """Replay `session`'s offline queue, in order, onto `conn`; then queue_replayed(conn)."""
    conn: Any
    session: Session


@dataclass
class LookupTwin(RelayCommand):
    """Ask the registry for twin `twin`; answer with twin_resolved(twin, record | error)."""
    twin: int


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


@dataclass
class Log(RelayCommand):
    """One event-log line: catalogue `event` (rmb.relay.*), `uid` as trace_id, `level`,
    `attrs` (catalogue attributes)."""
    event: str
    uid: str | None
    level: str
    attrs: dict


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


