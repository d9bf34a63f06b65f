"""REMP core events -> event log records (the REMP catalogue, remp_node/events.py).

Pure functions: no I/O, no clock. `validator_records(ev)` maps one validator core event
(validator.py), `client_records(ev, local_key_id)` one RempClient event (client.py) to a
list of `LogRecord`s; `emit_records(log, records)` writes them with EventLog.emit_many
(attributes as a dict: the REMP `level` attribute, the status level 0..4, collides with
emit()'s log-level parameter). Sources: DESIGN.md section 6 ("every REMP status and where it was produced";
trace_id = REMP message id as 64 hex digits; node = validator key id hex prefix) and
section 4 (kinds, levels, shard as 16 hex digits).

| core event | event | trace_id | attrs |
|---|---|---|---|
| validator ReceiptSent | remp.validator.status | message id | kind, level, shard, block_seqno, block_id, reason |
| validator ForkBlamed | remp.validator.blamed (warning) | - | peer, shard, session |
| validator Dropped | remp.validator.dropped (warning) | - | peer, channel, reason |
| validator SessionStarted | remp.validator.session | - | session, count, roles |
| validator ShardBlockAccepted | remp.shardchain.accepted | - | shard, block_seqno, session, count |
| validator MasterBlockAccepted | remp.masterchain.committed | - | block_seqno, count (shard blocks) |
| client MessageReceived | remp.fullnode.received | message id | size, shard |
| client MessageSent | remp.fullnode.sent | message id | peer, shard, size, count, datagram |
| client ReceiptEvent | remp.fullnode.status | message id | kind, level, peer, shard, block_seqno, block_id, reason, count |
| client FinalStatus | remp.fullnode.final | message id | outcome, kind, reason, count, duration_ms |
| full node drop (adapter) | remp.fullnode.dropped (warning) | - | peer, reason, size |

Log levels: RejectedBy*/Timeout statuses, rejected/timeout finals, blames and drops are
"warning", everything else "info". block_seqno is the shard block's seqno (for Finalized
too; the master block is in remp.masterchain.committed) and block_id its root hash (64 hex
digits, the receipt JSON's `block_id`); both are left out when the status carries no block
(zero block id). Two candidates of one seqno (rounds of the shard consensus) that both hold
a message give two IncludedIntoBlock statuses that differ only in block_id. Peers and nodes are `peer_label(key_id)`: the first 8 hex
digits of the 32-byte key id.
"""
from __future__ import annotations

from typing import Iterable

from daemon_runtime.eventlog import EventLogError, LogRecord

from .client import FinalStatus, MessageReceived, MessageSent, ReceiptEvent
from ..wire.receipts import SentToValidators, is_source_final, kind_of
from ..wire.shards import shard_hex
from ..wire.tl import ZERO_BLOCK_ID
from .validator import (Dropped, ForkBlamed, MasterBlockAccepted, ReceiptSent, SessionStarted,
                        ShardBlockAccepted, ValidatorEvent)

__all__ = ["LogRecord", "validator_records", "client_records", "fullnode_dropped_record",
           "emit_records", "peer_label", "SERVICE_VALIDATOR", "SERVICE_FULLNODE", "SERVICE_MASTERCHAIN"]

#: `service` of each REMP daemon role (DESIGN.md section 6).
SERVICE_VALIDATOR = "remp-validator"
SERVICE_FULLNODE = "remp-fullnode"
SERVICE_MASTERCHAIN = "remp-masterchain"


def peer_label(key_id: bytes) -> str:
    """Key id (32 bytes) -> its first 8 hex digits (event log `node` and `peer`)."""
    return key_id[:4].hex()


def _status_attrs(status, receipt_error: str = "") -> tuple[dict, str]:
    kind = kind_of(status)
    attrs: dict = {"kind": kind, "level": int(status.level)}
    block = getattr(status, "block_id", None)
    if block is not None and block != ZERO_BLOCK_ID:
        attrs["block_seqno"] = block.seqno
        attrs["block_id"] = block.root_hash.hex()
    error = getattr(status, "error", "") or receipt_error
    if error:
        attrs["reason"] = error
    return attrs, ("warning" if is_source_final(kind) or kind.startswith("Rejected") else "info")


def validator_records(ev) -> list[LogRecord]:
    """Log records for one validator core event (validator.ValidatorEvent); [] for an
    event the catalogue has no line for. Raises TypeError for a non-event."""
    if isinstance(ev, ReceiptSent):
        attrs, level = _status_attrs(ev.status if ev.status is not None else ev.signed.open().status, ev.reason)
        attrs["shard"] = shard_hex(ev.shard)
        return [LogRecord("remp.validator.status", ev.message_id.hex(), level, attrs)]
    if isinstance(ev, ForkBlamed):
        return [LogRecord("remp.validator.blamed", None, "warning",
                          {"peer": peer_label(ev.source), "shard": shard_hex(ev.shard), "session": ev.session})]
    if isinstance(ev, Dropped):
        return [LogRecord("remp.validator.dropped", None, "warning",
                          {"peer": peer_label(ev.src), "channel": ev.channel, "reason": ev.reason})]
    if isinstance(ev, SessionStarted):
        roles = ",".join(f"{shard_hex(s)}:{r}" for s, r in sorted(ev.roles.items()))
        return [LogRecord("remp.validator.session", None, "info",
                          {"session": ev.session, "count": len(ev.roles), "roles": roles})]
    if isinstance(ev, ShardBlockAccepted):
        return [LogRecord("remp.shardchain.accepted", None, "info",
                          {"shard": shard_hex(ev.block_id.shard), "block_seqno": ev.block_id.seqno,
                           "session": ev.session, "count": len(ev.messages)})]
    if isinstance(ev, MasterBlockAccepted):
        return [LogRecord("remp.masterchain.committed", None, "info",
                          {"block_seqno": ev.block_id.seqno, "count": len(ev.shard_blocks)})]
    if not isinstance(ev, ValidatorEvent):
        raise TypeError(f"not a validator core event: {ev!r}")
    return []


def client_records(ev) -> list[LogRecord]:
    """Log records for one RempClient event (client.RempClientEvent). Raises TypeError for
    anything else."""
    if isinstance(ev, ReceiptEvent):
        st = ev.receipt.status
        attrs, level = _status_attrs(st)
        attrs["peer"] = peer_label(ev.receipt.source_id)
        attrs["shard"] = shard_hex(ev.shard)
        if isinstance(st, SentToValidators):
            attrs["count"] = st.sent_to
        return [LogRecord("remp.fullnode.status", ev.message_id.hex(), level, attrs)]
    if isinstance(ev, MessageReceived):
        return [LogRecord("remp.fullnode.received", ev.message_id.hex(), "info",
                          {"size": ev.size, "shard": shard_hex(ev.shard)})]
    if isinstance(ev, MessageSent):
        return [LogRecord("remp.fullnode.sent", ev.message_id.hex(), "info",
                          {"peer": peer_label(ev.peer), "shard": shard_hex(ev.shard), "size": ev.size,
                           "count": ev.count, "datagram": ev.datagram})]
    if isinstance(ev, FinalStatus):
        return [LogRecord("remp.fullnode.final", ev.message_id.hex(),
                          "info" if ev.outcome == "finalized" else "warning",
                          {"outcome": ev.outcome, "kind": ev.kind, "reason": ev.reason, "count": ev.datagrams,
                           "duration_ms": ev.elapsed * 1000.0})]
    if type(ev).__name__ == "MessageSettled":
        return []       # the end of a message's subscriptions: nothing for the trace
    raise TypeError(f"not a REMP client event: {ev!r}")


def fullnode_dropped_record(src_key_id: bytes, reason: str, size: int) -> LogRecord:
    """The full node's adapter dropped a datagram from `src_key_id` (reason: exact error
    text; size: datagram bytes)."""
    return LogRecord("remp.fullnode.dropped", None, "warning",
                     {"peer": peer_label(src_key_id), "reason": reason, "size": size})


def emit_records(log, records: Iterable[LogRecord]) -> None:
    """Write records to a daemon_runtime.eventlog.EventLog as events of one moment
    (EventLog.emit_many: one timestamp, one write, in order). A record its catalogues do not
    declare (a bug) does not take the others with it: they are written one by one and the
    first EventLogError is raised after them."""
    lines = [(r.event, r.trace_id, r.level, r.attrs) for r in records]
    try:
        log.emit_many(lines)
    except EventLogError:
        first = None
        for event, trace_id, level, attrs in lines:
            try:
                log.emit_attrs(event, trace_id, level, attrs)
            except EventLogError as exc:
                first = first or exc
        raise first
