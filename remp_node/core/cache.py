"""The REMP message cache: replay protection and per-message status on one validator.

Pure data structure, no clock and no I/O (DESIGN.md section 2). Sources:
- seeds/remp-overview.md, "Data Structures": "The Hashmap for all messages from the message
  queue (Message Cache) keeps the statuses for each queue message ... garbage-collected at
  each shard session switch. All messages older than two masterchain catchain seq numbers
  are removed."
- seeds/remp-protocol-b.txt, "Replay protection in more detail": the collator asks the cache
  for each message proposed for collation and refuses messages already included into an
  accepted block.
- DESIGN.md section 4: duplicates are found by body-cell hash (uid), not only by id.

Indexes: message id (32 bytes, root hash of the message BOC) -> CacheEntry, and uid
(32 bytes, hash of the message body cell) -> the id first seen with that body. A second id
with a known uid is a Duplicate of the first one.

Lifetime: an entry created in master session N is obsolete at N+2 (`gc(N + 2)` drops it).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from ..errors import RempLocalError

__all__ = ["CacheStatus", "CacheEntry", "AddOutcome", "AddResult", "MessageCache",
           "CacheTransitionError", "LIFETIME_SESSIONS"]

#: a message received in master session N is obsolete in session N + LIFETIME_SESSIONS
#: (seeds/remp-protocol-b.txt, "Message life cycle").
LIFETIME_SESSIONS = 2


class CacheStatus(enum.Enum):
    """Where a message stands on this validator (not a receipt: receipts are receipts.py's)."""

    PENDING = "pending"          # in the queue, waiting for collation
    COLLATED = "collated"        # included into a block candidate, not accepted yet
    ACCEPTED = "accepted"        # in a shard block accepted by >= 2/3 of the group
    FINALIZED = "finalized"      # that shard block is committed by the masterchain
    REJECTED = "rejected"        # this validator's collator refused it (final for this node)
    DUPLICATE = "duplicate"      # same body (uid) as an earlier message id


class CacheTransitionError(RempLocalError):
    """Local misuse: a status change the cache's table does not allow (names state and input)."""

    def __init__(self, message_id: bytes, state: CacheStatus, to: CacheStatus):
        super().__init__(f"message {message_id.hex()[:16]}: no transition {state.name} -> {to.name}")
        self.state = state
        self.to = to


S = CacheStatus
#: allowed status changes. ACCEPTED -> PENDING is the masterchain orphaning a shard block
#: ("downgrades the status of all accepted messages from that block", seeds/remp-overview.md);
#: COLLATED -> PENDING is an Ignored candidate; REJECTED -> ACCEPTED: another validator's
#: collator included a message this node refused (seeds: "may be successfully included into
#: a block by another node later").
_TRANSITIONS: dict[CacheStatus, frozenset[CacheStatus]] = {
    S.PENDING: frozenset({S.COLLATED, S.ACCEPTED, S.REJECTED, S.FINALIZED}),
    S.COLLATED: frozenset({S.PENDING, S.COLLATED, S.ACCEPTED, S.REJECTED, S.FINALIZED}),
    S.ACCEPTED: frozenset({S.FINALIZED, S.PENDING}),
    S.FINALIZED: frozenset(),
    S.REJECTED: frozenset({S.ACCEPTED, S.FINALIZED, S.COLLATED}),
    S.DUPLICATE: frozenset(),
}


@dataclass
class CacheEntry:
    """One message known to this validator.

    message_id, uid: 32 bytes each; master_seqno: master session the message was first
    received in (lifetime origin); status: CacheStatus; block_id: the shard block
    (opaque object, e.g. remp_node.wire.tl.BlockIdExt) that holds it once ACCEPTED/FINALIZED;
    duplicate_of: for DUPLICATE entries, the id first seen with the same uid."""

    message_id: bytes
    uid: bytes
    master_seqno: int
    status: CacheStatus = CacheStatus.PENDING
    block_id: object | None = None
    master_block_id: object | None = None
    duplicate_of: bytes | None = None
    history: list[CacheStatus] = field(default_factory=list)

    @property
    def in_accepted_block(self) -> bool:
        return self.status in (CacheStatus.ACCEPTED, CacheStatus.FINALIZED)


class AddResult(enum.Enum):
    NEW = "new"              # first time this id and this body are seen
    KNOWN = "known"          # this id is already in the cache (a later copy: ignore it)
    DUPLICATE = "duplicate"  # new id, but its body (uid) is known under another id


@dataclass(frozen=True)
class AddOutcome:
    result: AddResult
    entry: CacheEntry
    #: for DUPLICATE: the entry of the id first seen with the same uid
    original: CacheEntry | None = None


class MessageCache:
    """Message id -> CacheEntry, body hash (uid) -> first message id; see module docstring."""

    def __init__(self) -> None:
        self._by_id: dict[bytes, CacheEntry] = {}
        self._by_uid: dict[bytes, bytes] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, message_id: bytes) -> bool:
        return message_id in self._by_id

    def get(self, message_id: bytes) -> CacheEntry | None:
        return self._by_id.get(message_id)

    def by_uid(self, uid: bytes) -> CacheEntry | None:
        mid = self._by_uid.get(uid)
        return None if mid is None else self._by_id.get(mid)

    def entries(self) -> list[CacheEntry]:
        return list(self._by_id.values())

    def add(self, message_id: bytes, uid: bytes, master_seqno: int) -> AddOutcome:
        """Record a message seen in master session `master_seqno`.

        Returns KNOWN (same id seen before: nothing changes), DUPLICATE (new id, known uid:
        the new id is stored with status DUPLICATE so later copies are KNOWN), or NEW."""
        if len(message_id) != 32 or len(uid) != 32:
            raise ValueError("message id and uid must be 32 bytes")
        old = self._by_id.get(message_id)
        if old is not None:
            return AddOutcome(AddResult.KNOWN, old)
        first = self.by_uid(uid)
        if first is not None:
            entry = CacheEntry(message_id, uid, master_seqno, CacheStatus.DUPLICATE,
                               block_id=first.block_id, duplicate_of=first.message_id)
            entry.history.append(CacheStatus.DUPLICATE)
            self._by_id[message_id] = entry
            return AddOutcome(AddResult.DUPLICATE, entry, first)
        entry = CacheEntry(message_id, uid, master_seqno)
        entry.history.append(CacheStatus.PENDING)
        self._by_id[message_id] = entry
        self._by_uid[uid] = message_id
        return AddOutcome(AddResult.NEW, entry)

    def set_status(self, message_id: bytes, status: CacheStatus, *, block_id: object | None = None,
                   master_block_id: object | None = None) -> CacheEntry:
        """Move a message to `status` (table above). Raises KeyError for an unknown id and
        CacheTransitionError for a change the table does not allow."""
        entry = self._by_id[message_id]
        if status is not entry.status or status is CacheStatus.COLLATED:
            if status not in _TRANSITIONS[entry.status]:
                raise CacheTransitionError(message_id, entry.status, status)
        entry.status = status
        entry.history.append(status)
        if status in (CacheStatus.ACCEPTED, CacheStatus.COLLATED, CacheStatus.FINALIZED) and block_id is not None:
            entry.block_id = block_id
        if status is CacheStatus.PENDING:
            entry.block_id = None
        if master_block_id is not None:
            entry.master_block_id = master_block_id
        return entry

    def collation_refusal(self, message_id: bytes, uid: bytes) -> str | None:
        """Why the collator must not include this message, or None if it may.

        Refused: the id or the body (uid) is already in an accepted/finalized block
        (replay protection), or the id is a Duplicate of another id."""
        entry = self._by_id.get(message_id)
        if entry is not None:
            if entry.in_accepted_block:
                return f"message {message_id.hex()} is already in accepted block"
            if entry.status is CacheStatus.DUPLICATE:
                return f"message {message_id.hex()} duplicates {entry.duplicate_of.hex()}"
        first = self.by_uid(uid)
        if first is not None and first.message_id != message_id:
            if first.in_accepted_block:
                return (f"message {message_id.hex()} has the body of {first.message_id.hex()}, "
                        "already in accepted block")
            return f"message {message_id.hex()} duplicates {first.message_id.hex()}"
        return None

    def block_refusal(self, messages: list[tuple[bytes, bytes]]) -> str | None:
        """Validator-side check of a candidate: `messages` = [(id, uid)] in block order.
        Returns the reason the candidate is invalid or None. Invalid: a message (by id or
        uid) is already in an accepted block, or two entries of the block share an id/uid."""
        seen_ids: set[bytes] = set()
        seen_uids: set[bytes] = set()
        for mid, uid in messages:
            if mid in seen_ids or uid in seen_uids:
                return f"message {mid.hex()} appears twice in the block"
            seen_ids.add(mid)
            seen_uids.add(uid)
            entry = self._by_id.get(mid)
            if entry is not None and entry.in_accepted_block:
                return f"message {mid.hex()} is already in accepted block"
            first = self.by_uid(uid)
            if first is not None and first.in_accepted_block:
                return f"message {mid.hex()} has the body of {first.message_id.hex()}, already in accepted block"
        return None

    def gc(self, current_master_seqno: int, hold=None) -> list[CacheEntry]:
        """Drop entries obsolete in master session `current_master_seqno` (created in
        N <= current - 2). Returns the dropped entries (the caller sends Timeout for the
        unfinished ones it had announced).

        hold(entry) -> bool (optional): obsolete entries it answers True for stay (the
        validator holds a message whose fate is still decided by a block: a candidate that
        may yet be accepted, or an accepted shard block that the masterchain may yet commit;
        timing it out now would contradict the chain: seeds/remp-protocol-b.txt, a Timeout
        is final). The caller drops them later with `drop` once the block is decided."""
        limit = current_master_seqno - LIFETIME_SESSIONS
        dropped = [e for e in self._by_id.values()
                   if e.master_seqno <= limit and not (hold is not None and hold(e))]
        for e in dropped:
            self.drop(e.message_id)
        return dropped

    def drop(self, message_id: bytes) -> CacheEntry | None:
        """Forget one entry (both indexes); returns it, or None when it is not cached."""
        e = self._by_id.pop(message_id, None)
        if e is not None and self._by_uid.get(e.uid) == message_id:
            del self._by_uid[e.uid]
        return e

    def obsolete(self, master_seqno: int, current_master_seqno: int) -> bool:
        """True iff a message received in `master_seqno` is obsolete in the current session."""
        return master_seqno + LIFETIME_SESSIONS <= current_master_seqno
