"""The REMP reliable message queue (RMQ) of one shard session, over a REMP catchain.

Protocol core: no I/O, no clock (`now` passed in). Sources:
- seeds/remp-overview.md, "Proposals for speeding up": validators do not retransmit
  messages received from the catchain; a message received from the full node and not yet
  seen in the catchain is put into it (2N..3N datagrams instead of N^2); forward messages:
  one forward per message, full bodies only for messages still being processed, digests
  (hashes) of processed ones for replay protection.
- seeds/remp-overview.md, "Reliable Message Queue Processing"; DESIGN.md section 4:
  members = current group + previous session's group; a message received in master
  session N is obsolete at N+2 and not forwarded.

Wire (our TL lines, modelled on ever-tl `remp.*`; constructor ids are CRC32 as usual; the
codecs are in remp_node/wire/rmq_tl.py):
- one catchain record (one `Catchain.submit` payload; the catchain packs the records of a
  block into its `catchain.block.data.vector`) = boxed `remp.catchainRecord.message` (id,
  uid, master_seqno, origin, BOC) or `remp.catchainRecord.digest` (id, uid, master_seqno,
  origin, finished flag, no body);
- direct datagrams between RMQ members (body fetch): `remp.messageQuery message_ids` and
  `remp.messageResponse messages:(vector bytes)` (BOCs; the receiver checks root hash = id).
RMQ datagrams carry one channel byte first: 0 = catchain, 1 = body query, 2 = body response.

Errors: malformed remote bytes raise RmqWireError (ValueError) inside the parsers; the RMQ
turns them into a `RecordDropped` event and keeps going (never crashes, never drops other
traffic). Local misuse raises RmqError.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable

from .cache import AddResult, CacheStatus, MessageCache
from ..errors import RempLocalError
from ..wire.keys import NodeKey, key_id
# the RMQ's wire objects (catchain records, body query / response, session id, channel bytes)
# are codecs in wire/rmq_tl.py; re-exported here for existing importers
from ..wire.rmq_tl import (CH_CATCHAIN, CH_QUERY, CH_RESPONSE, MAX_MESSAGE_BYTES, MAX_PAYLOAD_BYTES,  # noqa: F401
                           MAX_QUERY_IDS, MESSAGE_QUERY, MESSAGE_RESPONSE, REC_DIGEST, REC_MESSAGE, SESSION_ID,
                           Record, RmqWireError, decode_query, decode_record, decode_response, encode_query,
                           encode_response, rmq_session_id)

__all__ = [
    "ReliableMessageQueue", "RmqError", "RmqWireError", "RmqEvent", "MessageQueued",
    "MessageAcceptedByQueue", "MessageDuplicate", "MessageRejectedByQueue", "RecordDropped",
    "SourceBlamed", "Record", "QueuedMessage", "decode_record",
    "rmq_session_id", "CH_CATCHAIN", "CH_QUERY", "CH_RESPONSE",
]

#: body-fetch retry period (s)
FETCH_RETRY = 0.5


class RmqError(RempLocalError):
    """Local misuse of the RMQ API."""


# --- events --------------------------------------------------------------------------------

class RmqEvent:
    """Base class of RMQ events."""


@dataclass(frozen=True)
class MessageQueued(RmqEvent):
    """The message entered this node's queue for the first time in this RMQ.

    via: "client" (from a full node; this node put it into the catchain), "catchain" (a
    record delivered by the catchain) or "fetch" (body fetched after a digest).
    new_to_node: the node's message cache had never seen the id (New receipt is due)."""

    message_id: bytes
    uid: bytes
    origin: bytes
    master_seqno: int
    via: str
    new_to_node: bool


@dataclass(frozen=True)
class MessageAcceptedByQueue(RmqEvent):
    """The catchain delivered the message (it has its place in the agreed queue order)."""

    message_id: bytes
    origin: bytes


@dataclass(frozen=True)
class MessageDuplicate(RmqEvent):
    """A new id whose body (uid) is already known under `original_id`."""

    message_id: bytes
    original_id: bytes
    origin: bytes


@dataclass(frozen=True)
class MessageRejectedByQueue(RmqEvent):
    """A client message the queue refuses (reason: exact text)."""

    message_id: bytes
    origin: bytes
    reason: str


@dataclass(frozen=True)
class RecordDropped(RmqEvent):
    """Malformed or inconsistent remote RMQ input from `source` (key id), dropped."""

    source: bytes
    reason: str


@dataclass(frozen=True)
class SourceBlamed(RmqEvent):
    """The catchain proved that member `source` (key id) signed two blocks at one height."""

    source: bytes
    proof: object


@dataclass
class QueuedMessage:
    """A message in this RMQ: body (BOC), origin (full node key id), order (catchain
    delivery order; None until delivered), local (this node put it into the catchain)."""

    message_id: bytes
    uid: bytes
    master_seqno: int
    origin: bytes
    body: bytes | None
    order: int | None = None
    local: bool = False
    parsed: object = None


@dataclass
class _Fetch:
    message_id: bytes
    sources: list[bytes]
    next_at: float
    tries: int = 0


class ReliableMessageQueue:
    """One RMQ: a REMP catchain among `current` + `previous` group members.

    ReliableMessageQueue(workchain, shard, master_seqno, current, previous, local, cache,
    parse, catchain_factory, block_interval=0.1, bodies=None)
    - current/previous: public keys (32 bytes) of the session's group and the previous one;
    - local: this node's NodeKey; cache: the node's MessageCache (shared by its RMQs);
    - parse(boc) -> object with .id/.uid/.workchain/.account (messages.py's
      parse_external_message), raising ValueError for bad BOCs;
    - catchain_factory(session_id, members, local, block_interval) -> Catchain core;
    - bodies: node-wide dict message id -> BOC shared by the node's RMQs (bodies survive
      a session switch without refetching).
    Datagram API: receive_datagram(data, src_key_id, now), datagrams_to_send(now) ->
    [(dst_key_id, bytes)], get_timer(), handle_timer(now), next_event() -> RmqEvent|None."""

    def __init__(self, workchain: int, shard: int, master_seqno: int, current: list[bytes],
                 previous: list[bytes], local: NodeKey, cache: MessageCache,
                 parse: Callable[[bytes], object], catchain_factory: Callable[..., object],
                 block_interval: float = 0.1, bodies: dict[bytes, bytes] | None = None,
                 shard_check: Callable[[object], bool] | None = None):
        self.workchain, self.shard, self.master_seqno = workchain, shard, master_seqno
        self.current = list(current)
        self.previous = list(previous)
        members: list[bytes] = []
        for pk in self.current + self.previous:
            if pk not in members:
                members.append(pk)
        if local.public not in members:
            raise RmqError("local node is not a member of this RMQ")
        self.members = members
        self.member_ids = [key_id(pk) for pk in members]
        self.local = local
        self.local_is_current = local.public in self.current
        self.cache = cache
        self.parse = parse
        self.shard_check = shard_check
        self.block_interval = block_interval
        self.session_id = rmq_session_id(workchain, shard, master_seqno, members)
        self.catchain = catchain_factory(self.session_id, members, local, block_interval=block_interval)
        self.bodies = bodies if bodies is not None else {}
        self.queue: dict[bytes, QueuedMessage] = {}
        self._order = 0
        self._outbox: list[Record] = []
        self._direct: list[tuple[bytes, bytes]] = []
        self._events: deque[RmqEvent] = deque()
        self._fetches: dict[bytes, _Fetch] = {}
        self.blamed: set[bytes] = set()
        self.stats = {"records_submitted": 0, "bodies_fetched": 0, "forwarded_in": 0, "forwarded_out": 0}
        self._now = 0.0
        self.closed = False

    # -- input from the validator core ----------------------------------------------------
    def add_client_message(self, parsed: object, origin: bytes, now: float,
                           received_in: int | None = None) -> AddResult | None:
        """A full node sent `parsed` (messages.py ExternalMessage: id, uid, boc, account).
        Puts it into the catchain unless this node already has it (a copy seen first in
        the catchain is not re-broadcast). received_in: master session the node received it
        in (default: this RMQ's session; earlier for messages buffered before this RMQ
        existed) -- the message's lifetime starts there. Returns the cache's AddResult
        (None if refused with a MessageRejectedByQueue event)."""
        self._now = now
        received_in = self.master_seqno if received_in is None else received_in
        if self.cache.obsolete(received_in, self.master_seqno):
            self._events.append(MessageRejectedByQueue(parsed.id, origin, "message lifetime is over"))
            return None
        mid, uid = parsed.id, parsed.uid
        if self.shard_check is not None and not self.shard_check(parsed):
            self._events.append(MessageRejectedByQueue(mid, origin, f"message is not for shard {self.shard:016x}"))
            return None
        known = self.queue.get(mid)
        if known is not None and known.body is not None:
            return AddResult.KNOWN
        outcome = self.cache.add(mid, uid, received_in)
        if outcome.result is AddResult.DUPLICATE:
            self._events.append(MessageDuplicate(mid, outcome.original.message_id, origin))
            return AddResult.DUPLICATE
        entry = outcome.entry
        if outcome.result is AddResult.KNOWN:
            if entry.status in (CacheStatus.DUPLICATE, CacheStatus.ACCEPTED, CacheStatus.FINALIZED):
                return AddResult.KNOWN   # replay protection: never put into the queue again
            if self.cache.obsolete(entry.master_seqno, self.master_seqno):
                self._events.append(MessageRejectedByQueue(mid, origin, "message lifetime is over"))
                return None
        body = bytes(parsed.boc)
        self.bodies[mid] = body
        qm = QueuedMessage(mid, uid, entry.master_seqno, origin, body, local=True, parsed=parsed)
        self.queue[mid] = qm
        self._fetches.pop(mid, None)
        self._outbox.append(Record(mid, uid, entry.master_seqno, origin, body))
        self._events.append(MessageQueued(mid, uid, origin, entry.master_seqno, "client",
                                          outcome.result is AddResult.NEW))
        return outcome.result

    def add_forwarded(self, records: list[Record], now: float) -> None:
        """Records forwarded from the previous session's RMQ (`forward_records`)."""
        self._now = now
        for rec in records:
            if self.cache.obsolete(rec.master_seqno, self.master_seqno):
                continue
            self.stats["forwarded_in"] += 1
            if rec.body is not None:
                q = self.queue.get(rec.message_id)
                if q is None:
                    self.queue[rec.message_id] = QueuedMessage(rec.message_id, rec.uid, rec.master_seqno,
                                                               rec.origin, rec.body, local=True)
                else:
                    q.local = True
            self._outbox.append(rec)

    def forward_records(self, next_master_seqno: int) -> list[Record]:
        """What this node forwards into the next session's RMQ: every message of this queue
        still alive in `next_master_seqno` (received in N, obsolete at N+2): digests of
        finalized ones (replay protection), full bodies of unfinished ones this node put
        into the catchain itself, digests of the other unfinished ones (their bodies are
        fetched from members that have them). Source: seeds/remp-overview.md, forward
        messages."""
        out = []
        for q in sorted(self.queue.values(), key=lambda q: (q.order is None, q.order or 0)):
            if self.cache.obsolete(q.master_seqno, next_master_seqno):
                continue
            entry = self.cache.get(q.message_id)
            if entry is None or entry.status is CacheStatus.DUPLICATE:
                continue
            if entry.status is CacheStatus.FINALIZED:
                out.append(Record(q.message_id, q.uid, q.master_seqno, q.origin, None, True))
            elif q.local and q.body is not None:
                out.append(Record(q.message_id, q.uid, q.master_seqno, q.origin, q.body))
            else:
                out.append(Record(q.message_id, q.uid, q.master_seqno, q.origin, None, False))
        self.stats["forwarded_out"] += len(out)
        return out

    def pending(self, limit: int | None = None) -> list[QueuedMessage]:
        """Messages the collator may try, oldest first (catchain delivery order): delivered,
        body known, status PENDING/COLLATED in the cache, not obsolete."""
        out = []
        for q in sorted((q for q in self.queue.values() if q.order is not None and q.body is not None),
                        key=lambda q: q.order):
            e = self.cache.get(q.message_id)
            if e is None or e.status not in (CacheStatus.PENDING, CacheStatus.COLLATED):
                continue
            if self.cache.obsolete(q.master_seqno, self.master_seqno):
                continue
            out.append(q)
            if limit is not None and len(out) >= limit:
                break
        return out

    # -- datagram API -------------------------------------------------------------------------
    def receive_datagram(self, data: bytes, src: bytes, now: float) -> None:
        """RMQ channel datagram from member `src` (key id). Malformed -> RecordDropped."""
        self._now = now
        if self.closed or not data:
            return
        if src not in self.member_ids:
            self._events.append(RecordDropped(src, "datagram from a non-member"))
            return
        ch, body = data[0], data[1:]
        try:
            if ch == CH_CATCHAIN:
                self.catchain.receive_datagram(body, src, now)
            elif ch == CH_QUERY:
                self._answer_query(decode_query(body), src)
            elif ch == CH_RESPONSE:
                for boc in decode_response(body):
                    self._on_fetched(boc, src)
            else:
                raise RmqWireError(f"unknown RMQ channel {ch}")
        except ValueError as exc:
            self._events.append(RecordDropped(src, str(exc)))
        self._pump()

    def _flush_outbox(self, now: float) -> None:
        """Hand queued records to the catchain (it makes one block per block_interval)."""
        if not self._outbox or self.closed:
            return
        batch, self._outbox = self._outbox, []
        for rec in batch:
            self.catchain.submit(rec.pack(), now)
        self.stats["records_submitted"] += len(batch)

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, bytes]]:
        self._now = now
        self._flush_outbox(now)
        out = [(dst, bytes([CH_CATCHAIN]) + d) for dst, d in self.catchain.datagrams_to_send(now)]
        out.extend(self._direct)
        self._direct = []
        self._pump()
        return out

    def get_timer(self) -> float | None:
        # called for every RMQ twice per daemon step: no temporary list
        t = self.catchain.get_timer()
        if self._outbox and not self.closed and (t is None or self._now < t):
            t = self._now
        if self._fetches:
            f = min(f.next_at for f in self._fetches.values())
            if t is None or f < t:
                t = f
        return t

    def handle_timer(self, now: float) -> None:
        self._now = now
        t = self.catchain.get_timer()
        if t is not None and t <= now:
            self.catchain.handle_timer(now)
        self._flush_outbox(now)
        due = [f for f in self._fetches.values() if f.next_at <= now]
        for f in due:
            self._send_fetch(f, now)
        self._pump()

    def next_event(self) -> RmqEvent | None:
        self._pump()
        return self._events.popleft() if self._events else None

    def close(self) -> None:
        """Stop producing records and fetches (after the message lifetime ran out); the
        catchain keeps answering until the caller drops the object."""
        self.closed = True
        self._outbox.clear()
        self._fetches.clear()

    # -- internals --------------------------------------------------------------------------------
    def _pump(self) -> None:
        while True:
            ev = self.catchain.next_event()
            if ev is None:
                return
            name = type(ev).__name__
            if name == "BlockDelivered":
                src = self._source_id(ev.source)
                for raw in ev.records:
                    try:
                        rec = decode_record(raw)
                    except RmqWireError as exc:
                        self._events.append(RecordDropped(src, str(exc)))
                        continue
                    self._on_record(rec, src)
            elif name == "ForkDetected":
                src = self._source_id(ev.source)
                if src not in self.blamed:
                    self.blamed.add(src)
                    self._events.append(SourceBlamed(src, ev.proof))

    def _source_id(self, source) -> bytes:
        """Catchain `source` (member index, public key or key id) -> key id."""
        if isinstance(source, int):
            return self.member_ids[source]
        source = bytes(source)
        if source in self.member_ids:
            return source
        if source in self.members:
            return self.member_ids[self.members.index(source)]
        return source

    def _on_record(self, rec: Record, src: bytes) -> None:
        if self.cache.obsolete(rec.master_seqno, self.master_seqno) or rec.master_seqno > self.master_seqno:
            self._events.append(RecordDropped(src, f"record of master session {rec.master_seqno} "
                                              f"outside the lifetime in session {self.master_seqno}"))
            return
        q = self.queue.get(rec.message_id)
        if q is not None and q.order is not None:
            return  # later copies are ignored
        body = rec.body
        parsed = None
        if body is not None:
            parsed = self._check_body(body, rec.message_id, rec.uid, src)
            if parsed is None:
                return
        elif q is not None and q.body is not None:
            body = q.body
        elif rec.message_id in self.bodies:
            body = self.bodies[rec.message_id]
        if rec.body is None and rec.finished:
            # replay protection only: the forwarder saw it finalized
            outcome = self.cache.add(rec.message_id, rec.uid, rec.master_seqno)
            if q is None:
                self.queue[rec.message_id] = QueuedMessage(rec.message_id, rec.uid, rec.master_seqno,
                                                           rec.origin, body, order=self._next_order())
            else:
                q.order = self._next_order()
            _ = outcome
            return
        self._order_message(rec, src, body, parsed, q)

    def _next_order(self) -> int:
        self._order += 1
        return self._order

    def _order_message(self, rec: Record, src: bytes, body: bytes | None, parsed, q: QueuedMessage | None) -> None:
        if q is None:
            q = QueuedMessage(rec.message_id, rec.uid, rec.master_seqno, rec.origin, body, parsed=parsed)
            self.queue[rec.message_id] = q
        elif q.body is None and body is not None:
            q.body = body
        if parsed is not None:
            q.parsed = parsed
        q.order = self._next_order()
        if self._outbox:
            # already in the catchain: a local copy not submitted yet is not re-broadcast
            self._outbox = [r for r in self._outbox if r.message_id != rec.message_id or r.body is None]
        if q.body is not None:
            self.bodies[rec.message_id] = q.body
            self._fetches.pop(rec.message_id, None)
            self._admit(q, "catchain")
        else:
            srcs = [src] + [m for m in self.member_ids if m not in (src, self.local.key_id)]
            self._fetches[rec.message_id] = _Fetch(rec.message_id, srcs, self._now)

    def _admit(self, q: QueuedMessage, via: str) -> None:
        """A delivered message whose body we have: cache + events (New once per node)."""
        if q.local and via == "catchain":
            # our own record came back: the queue accepted it
            self._events.append(MessageAcceptedByQueue(q.message_id, q.origin))
            return
        outcome = self.cache.add(q.message_id, q.uid, q.master_seqno)
        if outcome.result is AddResult.DUPLICATE:
            self._events.append(MessageDuplicate(q.message_id, outcome.original.message_id, q.origin))
            return
        if outcome.entry.status in (CacheStatus.DUPLICATE, CacheStatus.FINALIZED):
            return
        self._events.append(MessageQueued(q.message_id, q.uid, q.origin, q.master_seqno, via,
                                          outcome.result is AddResult.NEW))
        self._events.append(MessageAcceptedByQueue(q.message_id, q.origin))

    def _check_body(self, body: bytes, mid: bytes, uid: bytes, src: bytes):
        try:
            parsed = self.parse(body)
        except ValueError as exc:
            self._events.append(RecordDropped(src, f"message {mid.hex()}: {exc}"))
            return None
        if parsed.id != mid or parsed.uid != uid:
            self._events.append(RecordDropped(src, f"message {mid.hex()}: id/uid do not match its BOC"))
            return None
        if self.shard_check is not None and not self.shard_check(parsed):
            self._events.append(RecordDropped(src, f"message {mid.hex()} is not for shard {self.shard:016x}"))
            return None
        return parsed

    def _send_fetch(self, f: _Fetch, now: float) -> None:
        if not f.sources:
            del self._fetches[f.message_id]
            return
        dst = f.sources[f.tries % len(f.sources)]
        f.tries += 1
        f.next_at = now + FETCH_RETRY
        self._direct.append((dst, encode_query([f.message_id])))

    def _answer_query(self, ids: list[bytes], src: bytes) -> None:
        bodies = [self.bodies[i] for i in ids if i in self.bodies]
        if bodies:
            self._direct.append((src, encode_response(bodies)))

    def _on_fetched(self, boc: bytes, src: bytes) -> None:
        try:
            parsed = self.parse(boc)
        except ValueError as exc:
            self._events.append(RecordDropped(src, f"fetched body: {exc}"))
            return
        q = self.queue.get(parsed.id)
        if q is None or q.body is not None or parsed.id not in self._fetches:
            return
        if parsed.uid != q.uid:
            self._events.append(RecordDropped(src, f"fetched body of {parsed.id.hex()} has another uid"))
            return
        del self._fetches[parsed.id]
        q.body = boc
        q.parsed = parsed
        self.bodies[parsed.id] = boc
        self.stats["bodies_fetched"] += 1
        self._admit(q, "fetch")
