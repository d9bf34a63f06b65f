"""Marlin events: the core events (dataclasses under MarlinEvent), the event-log catalogue
(DESIGN.md section 6) and the mapping from one to the other.

trace_id = "message_id:producer" (message id as 8 hex digits, producer address as 0x-hex);
sizes in bytes, durations in ms; `peer`, `member` and producer names are 0x-hex addresses;
`cluster` is the cluster id as a decimal string; `channel` the channel name ("btc", "eth",
"raw", else the decimal id).

Core event -> event log (`records(ev)`; `emit_records(log, records)` writes them):

| core event | event | level | attrs |
|---|---|---|---|
| BlockProduced | marlin.producer.produced | info | channel, size, count (chunks) |
| ChunkSent | marlin.producer.chunk_sent | info | chunk, cluster, size, peer, attempt, offset |
| ChunkAcknowledged | marlin.producer.acknowledged | info | chunk, cluster, peer (member), duration_ms |
| AckMissing | marlin.producer.ack_missing | warning | chunk, cluster, peer, attempt, outcome ("retry"/"final") |
| ChunkRejected role=producer | marlin.producer.rejected | warning | reason, peer, size (+chunk) |
| ChunkWitnessed | marlin.cluster.witnessed | info | chunk, peer (producer link), size, cluster |
| AckSent | marlin.cluster.acknowledged | info | chunk, cluster |
| ChunkRelayed | marlin.cluster.relayed | info | chunk, peer, size, cluster |
| ChunkRejected role=cluster | marlin.cluster.rejected | warning | chunk, reason, peer, size |
| StakeEvidence | marlin.cluster.stake_evidence | warning | epoch, offset, chunk, earlier ("message id/chunk id" that used the offset first) |
| ChunkReceived | marlin.consumer.chunk_received | info | chunk, peer, size |
| ChunkRejected role=consumer | marlin.consumer.rejected | warning | chunk, reason, peer, size |
| BlockRebuilt | marlin.consumer.block_rebuilt | info | count, size, duration_ms, channel |
| Dispute | marlin.consumer.dispute | warning | reason, peer (one line per named producer), channel, count, duration_ms |

Duplicates are counted by the cores (`counters`), not logged: they are the normal case of
relaying. Rejections carry a short `reason` code (see REJECT_REASONS).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from daemon_runtime.eventlog import Catalogue, EventSpec, LogRecord

__all__ = [
    "MARLIN_EVENTS", "MarlinEvent", "BlockProduced", "ChunkSent", "ChunkAcknowledged", "AckMissing",
    "ChunkWitnessed", "AckSent", "ChunkRelayed", "ChunkRejected", "StakeEvidence", "ChunkReceived",
    "BlockRebuilt", "Dispute", "LogRecord", "records", "emit_records", "trace_id", "channel_name",
    "node_label", "REJECT_REASONS", "SERVICE_PRODUCER", "SERVICE_CLUSTER", "SERVICE_CONSUMER",
]

E = EventSpec

MARLIN_EVENTS = Catalogue("marlin", [
    E("marlin.producer.chunk_sent", "a producer sent an attested chunk",
      {"chunk": "long", "cluster": "string", "size": "long", "peer": "string", "attempt": "long",
       "offset": "long"}),
    E("marlin.producer.produced", "a producer erasure-coded and attested a block (before its chunks are sent)",
      {"channel": "string", "size": "long", "count": "long"}),
    E("marlin.producer.acknowledged", "a producer holds a verified acknowledgement for a chunk",
      {"chunk": "long", "cluster": "string", "peer": "string", "duration_ms": "double"}),
    E("marlin.producer.ack_missing", "no acknowledgement for a chunk within ack_timeout (outcome: retry = "
      "re-sent to the next candidate, final = given up)",
      {"chunk": "long", "cluster": "string", "peer": "string", "attempt": "long", "outcome": "string"}),
    E("marlin.producer.rejected", "a producer refused a frame (forged or unexpected acknowledgement)",
      {"chunk": "long", "reason": "string", "peer": "string", "size": "long"}),
    E("marlin.cluster.witnessed", "a cluster member witnessed a chunk and relayed it",
      {"chunk": "long", "peer": "string", "size": "long", "cluster": "string"}),
    E("marlin.cluster.acknowledged", "a cluster member acknowledged a chunk to its producer",
      {"chunk": "long", "cluster": "string"}),
    E("marlin.cluster.relayed", "a cluster member accepted a witnessed chunk from another member and relayed it",
      {"chunk": "long", "peer": "string", "size": "long", "cluster": "string"}),
    E("marlin.cluster.rejected", "a chunk was refused (forged, duplicate, late, stake reuse)",
      {"chunk": "long", "reason": "string", "peer": "string", "size": "long"}),
    E("marlin.cluster.stake_evidence", "a cluster member saw a producer reuse a stake offset within one "
      "refresh interval (slashing evidence recorded)",
      {"epoch": "long", "offset": "long", "chunk": "long", "earlier": "string"}),
    E("marlin.consumer.chunk_received", "a consumer received a chunk",
      {"chunk": "long", "peer": "string", "size": "long"}),
    E("marlin.consumer.rejected", "a consumer refused a chunk (forged attestation or witness, late, malformed)",
      {"chunk": "long", "reason": "string", "peer": "string", "size": "long"}),
    E("marlin.consumer.block_rebuilt", "a consumer rebuilt a block from MIN_CHUNKS chunks",
      {"count": "long", "size": "long", "duration_ms": "double", "channel": "string"}),
    E("marlin.consumer.dispute", "a consumer raised a dispute naming producers",
      {"reason": "string", "peer": "string", "channel": "string", "count": "long", "duration_ms": "double"}),
])

#: `service` of each Marlin role (DESIGN.md section 6).
SERVICE_PRODUCER = "marlin-producer"
SERVICE_CLUSTER = "marlin-cluster"
SERVICE_CONSUMER = "marlin-consumer"

#: Rejection reason codes (ChunkRejected.reason; counters "rejected.<reason>").
REJECT_REASONS = {
    "truncated": "frame shorter than its format",
    "oversized": "frame or chunk beyond the size limit",
    "unknown_kind": "frame kind this role does not take",
    "malformed": "fields out of range",
    "unknown_channel": "channel id not configured",
    "stale": "attestation timestamp older than TOLERABLE_LATENCY",
    "future": "attestation timestamp beyond max_clock_skew ahead",
    "bad_signature": "a signature that does not recover (bad recid, r/s out of range)",
    "attestation_mismatch": "the attestation does not verify as signed by the sending producer "
                            "(forged signature, or chunk / fields not what the producer signed)",
    "unknown_producer": "the attestation recovers to an address that is not a known producer "
                        "(unknown producer, or tampered data on a relayed chunk)",
    "not_producer": "an attested chunk from a peer that is not a producer",
    "bad_witness": "the witness does not recover to a member of an allowed cluster",
    "stake_reuse": "stake offset already used by another chunk in this refresh interval",
    "stake_exceeded": "stake offset + chunk cost beyond the producer's stake budget",
    "bad_ack": "acknowledgement not signed by a member of the cluster it names, or for no chunk we sent",
    "channel_mismatch": "chunks of one message on different channels",
    "memory": "dropped to stay within a memory bound",
}


def channel_name(channel: int) -> str:
    from .params import CHANNEL_NAMES
    return CHANNEL_NAMES.get(channel, str(channel))


def trace_id(message_id: int, producer: bytes) -> str:
    """DESIGN.md section 6: "message_id:producer" = 8 hex digits ":" 0x-hex address."""
    return f"{message_id:08x}:0x{producer.hex()}"


def node_label(address: bytes) -> str:
    """Event log `node` / `peer`: the 0x-hex address."""
    return "0x" + address.hex()


class MarlinEvent:
    """Base class of every Marlin core event (producer.py, cluster.py, consumer.py)."""

    __slots__ = ()


@dataclass
class BlockProduced(MarlinEvent):
    """ProducerCore.produce coded and attested a block."""
    message_id: int
    """first 4 bytes of the block hash (uint32)"""
    producer: bytes
    """the producer's 20-byte address"""
    channel: int
    """channel id (message type)"""
    size: int
    """block size, bytes"""
    chunks: int
    """NUM_CHUNKS for the channel"""
    stake: int
    """stake units the block consumed"""


@dataclass
class ChunkSent(MarlinEvent):
    """The producer queued an attested chunk for a cluster member."""
    message_id: int
    """uint32 message id"""
    producer: bytes
    """the producer's address"""
    chunk_id: int
    """chunk number"""
    cluster_id: int
    """the cluster chosen among the options"""
    peer: bytes
    """the member it goes to"""
    size: int
    """frame size, bytes"""
    stake_offset: int
    """the chunk's stake offset"""
    attempt: int
    """1 for the first send, 2.. for re-sends after an ack timeout"""


@dataclass
class ChunkAcknowledged(MarlinEvent):
    """The producer verified and now holds a member's acknowledgement of a chunk."""
    message_id: int
    """uint32 message id"""
    producer: bytes
    """the producer's address"""
    chunk_id: int
    """chunk number"""
    cluster_id: int
    """the acknowledging cluster"""
    member: bytes
    """the signing member's address"""
    duration_ms: float
    """from the chunk's first send to the ack, ms"""
    ack: bytes
    """the 97-byte signed acknowledgement"""


@dataclass
class AckMissing(MarlinEvent):
    """No acknowledgement for a chunk within ack_timeout of its last send."""
    message_id: int
    """uint32 message id"""
    producer: bytes
    """the producer's address"""
    chunk_id: int
    """chunk number"""
    cluster_id: int
    """the cluster the unacknowledged send went to"""
    peer: bytes
    """the member that did not acknowledge"""
    attempt: int
    """which send (1-based) timed out"""
    final: bool
    """True when no candidate is left (the chunk stays in missing_acks)"""


@dataclass
class ChunkWitnessed(MarlinEvent):
    """A cluster member received a chunk from its producer, verified it and witnessed it."""
    message_id: int
    """uint32 message id"""
    producer: bytes
    """the attesting producer's address"""
    chunk_id: int
    """chunk number"""
    cluster_id: int
    """this member's cluster"""
    peer: bytes
    """the link it came in on (the producer)"""
    size: int
    """chunk bytes"""


@dataclass
class AckSent(MarlinEvent):
    """A cluster member queued a signed acknowledgement to the producer."""
    message_id: int
    """uint32 message id"""
    producer: bytes
    """the producer's address"""
    chunk_id: int
    """chunk number"""
    cluster_id: int
    """this member's cluster"""


@dataclass
class ChunkRelayed(MarlinEvent):
    """A cluster member accepted a witnessed chunk from another member and relays it."""
    message_id: int
    """uint32 message id"""
    producer: bytes
    """the attesting producer's address"""
    chunk_id: int
    """chunk number"""
    cluster_id: int
    """this member's cluster"""
    peer: bytes
    """the member it came from"""
    size: int
    """chunk bytes"""


@dataclass
class ChunkRejected(MarlinEvent):
    """A core refused a frame. Counted in the core's counters as "rejected.<reason>"."""
    role: str
    """"producer" | "cluster" | "consumer\""""
    reason: str
    """a REJECT_REASONS code"""
    detail: str
    """the precise error text"""
    peer: bytes
    """the link it came in on"""
    size: int
    """frame bytes"""
    message_id: int | None = None
    """uint32 message id when the frame got that far"""
    producer: bytes | None = None
    """the attesting producer when known"""
    chunk_id: int | None = None
    """chunk number when known"""


@dataclass
class StakeEvidence(MarlinEvent):
    """A producer attached the same stake to two chunks within one refresh interval (their
    stake ranges [offset, offset + (chunk length + 81) x STAKE_PER_BYTE) overlap; seed: "the
    producer will be slashed"). Both attestations are kept so anyone can verify them."""
    producer: bytes
    """the producer's address"""
    epoch: int
    """attestation timestamp // refresh_interval"""
    stake_offset: int
    """the reusing chunk's stake offset"""
    first: tuple
    """(message id, chunk id, attestation wire 81 bytes, chunk length, chunk hash 32) seen first"""
    second: tuple
    """the same for the reusing chunk"""


@dataclass
class ChunkReceived(MarlinEvent):
    """A consumer accepted a chunk (attestation and witness verified)."""
    message_id: int
    """uint32 message id"""
    producer: bytes
    """the attesting producer's address"""
    chunk_id: int
    """chunk number"""
    peer: bytes
    """the member it came from"""
    size: int
    """chunk bytes"""


@dataclass
class BlockRebuilt(MarlinEvent):
    """A consumer rebuilt and validated a block: deliver `block`."""
    message_id: int
    """uint32 message id"""
    producer: bytes
    """the producer of the first chunk"""
    channel: int
    """channel id"""
    block: bytes
    """the block"""
    chunks: int
    """chunks used (MIN_CHUNKS)"""
    duration_ms: float
    """first chunk received -> rebuilt, ms"""


@dataclass
class Dispute(MarlinEvent):
    """A consumer raises a dispute (seed "Consumer::raiseDispute")."""
    message_id: int
    """uint32 message id"""
    producers: list
    """every producer that attested a chunk of the message (20-byte addresses)"""
    reason: str
    """"invalid_block" | "expired" | "undecodable" | "message_id_mismatch\""""
    detail: str
    """the precise reason (e.g. the validation error)"""
    channel: int
    """channel id"""
    chunks: int
    """chunks held"""
    duration_ms: float
    """first chunk received -> dispute, ms"""


def records(ev: MarlinEvent) -> list[LogRecord]:
    """Log records for one core event (see the module table). Raises TypeError for a
    non-Marlin event."""
    t = type(ev)
    if t is ChunkSent:
        return [LogRecord("marlin.producer.chunk_sent", trace_id(ev.message_id, ev.producer), "info",
                          {"chunk": ev.chunk_id, "cluster": str(ev.cluster_id), "size": ev.size,
                           "peer": node_label(ev.peer), "attempt": ev.attempt, "offset": ev.stake_offset})]
    if t is ChunkWitnessed:
        return [LogRecord("marlin.cluster.witnessed", trace_id(ev.message_id, ev.producer), "info",
                          {"chunk": ev.chunk_id, "peer": node_label(ev.peer), "size": ev.size,
                           "cluster": str(ev.cluster_id)})]
    if t is ChunkRelayed:
        return [LogRecord("marlin.cluster.relayed", trace_id(ev.message_id, ev.producer), "info",
                          {"chunk": ev.chunk_id, "peer": node_label(ev.peer), "size": ev.size,
                           "cluster": str(ev.cluster_id)})]
    if t is AckSent:
        return [LogRecord("marlin.cluster.acknowledged", trace_id(ev.message_id, ev.producer), "info",
                          {"chunk": ev.chunk_id, "cluster": str(ev.cluster_id)})]
    if t is ChunkReceived:
        return [LogRecord("marlin.consumer.chunk_received", trace_id(ev.message_id, ev.producer), "info",
                          {"chunk": ev.chunk_id, "peer": node_label(ev.peer), "size": ev.size})]
    if t is BlockRebuilt:
        return [LogRecord("marlin.consumer.block_rebuilt", trace_id(ev.message_id, ev.producer), "info",
                          {"count": ev.chunks, "size": len(ev.block), "duration_ms": ev.duration_ms,
                           "channel": channel_name(ev.channel)})]
    if t is Dispute:
        return [LogRecord("marlin.consumer.dispute", trace_id(ev.message_id, p), "warning",
                          {"reason": ev.reason, "peer": node_label(p), "channel": channel_name(ev.channel),
                           "count": ev.chunks, "duration_ms": ev.duration_ms}) for p in ev.producers]
    if t is ChunkAcknowledged:
        return [LogRecord("marlin.producer.acknowledged", trace_id(ev.message_id, ev.producer), "info",
                          {"chunk": ev.chunk_id, "cluster": str(ev.cluster_id), "peer": node_label(ev.member),
                           "duration_ms": ev.duration_ms})]
    if t is AckMissing:
        return [LogRecord("marlin.producer.ack_missing", trace_id(ev.message_id, ev.producer), "warning",
                          {"chunk": ev.chunk_id, "cluster": str(ev.cluster_id), "peer": node_label(ev.peer),
                           "attempt": ev.attempt, "outcome": "final" if ev.final else "retry"})]
    if t is BlockProduced:
        return [LogRecord("marlin.producer.produced", trace_id(ev.message_id, ev.producer), "info",
                          {"channel": channel_name(ev.channel), "size": ev.size, "count": ev.chunks})]
    if t is StakeEvidence:
        return [LogRecord("marlin.cluster.stake_evidence", trace_id(ev.second[0], ev.producer), "warning",
                          {"epoch": ev.epoch, "offset": ev.stake_offset, "chunk": ev.second[1],
                           "earlier": f"{ev.first[0]:08x}/{ev.first[1]}"})]
    if t is ChunkRejected:
        tid = trace_id(ev.message_id, ev.producer) if ev.message_id is not None and ev.producer else None
        attrs: dict = {"reason": ev.reason, "peer": node_label(ev.peer), "size": ev.size}
        if ev.chunk_id is not None:
            attrs["chunk"] = ev.chunk_id
        return [LogRecord(f"marlin.{ev.role}.rejected", tid, "warning", attrs)]
    raise TypeError(f"not a Marlin core event: {ev!r}")


def emit_records(log, recs: Iterable[LogRecord]) -> None:
    """Write records to a daemon_runtime.eventlog.EventLog (EventLogError for an undeclared
    event or attribute)."""
    for r in recs:
        log.emit_attrs(r.event, r.trace_id, r.level, r.attrs)
