"""Receipt delivery from validators to full nodes: batched, signed, acknowledged, resent,
in order. Sans-I/O (no sockets, no clock: `now` in seconds from the caller).

Source: DESIGN.md section 4 (receipts reach users complete and in order).

The anchor we beat: ever-node (`src/network/remp.rs`, receipts worker) keeps only the LATEST
status per (full node, message), packs pending ones into an unsigned
`tonNode.rempCombinedReceipt` sent when it passes 768 bytes or 1 s after the previous packet,
and never resends, so intermediate statuses (e.g. IncludedIntoBlock between AcceptedByQueue
and IncludedIntoAcceptedBlock) are lost, a lost packet loses its statuses, and a full node
sees at best 1 s old news. Here EVERY status is kept and delivered, each still carrying its
own validator signature (any subscriber verifies it alone, receipts.verify_receipt_json),
the batching delay is at most `max_delay` (100 ms), each packet is signed once, and a packet
is resent with backoff until the full node acknowledges it or its messages are obsolete.

Validator side: `ReceiptSender` (one per validator, per-full-node state inside)
    add(dst, signed_receipt, now[, session]); set_session(current master session, now);
    receive_ack(src, payload, now); packets_to_send(now) -> [(dst key id, payload)];
    get_timer() / handle_timer(now).
  Batching (Nagle-like, bounded): a receipt for a full node with nothing sent in the last
  `max_delay` seconds leaves at once; otherwise it waits until `max_delay` after the
  previous packet to that node; a batch that reaches `max_batch_bytes` leaves at once, and
  so does the batch a message's first status at this validator (tonNode.rempNew,
  PutIntoQueue: the first receipt users wait for) joins; with `urgent_first` (the daemon's
  validators) only the first status of a message a full node sent to this validator itself
  does: the others of its group learned it from the RMQ, their PutIntoQueue is not the
  first receipt a user sees, and holding it for the batch cut receipt packets per message
  (bench figures in the README). So a status waits at most
  `max_delay` (the issue's 100 ms), the first status is never held back, and the later
  ones ride along with the next first status. (Batches were 990 bytes, one transport part,
  2-3 receipts of ~310 bytes: a packet signature at the validator and a verify at the
  full node per 2-3 statuses. Then up to 2,144 bytes, two parts; now up to 4,452 bytes,
  four parts, while nothing had to be resent, and 2,144 for `loss_memory` seconds after a
  resend: see ReceiptSender.)
  Resend: one retransmission timer per full node, as TCP's (RFC 6298): rto = srtt + 4 rttvar
  from the acks' round trips of packets sent once (Karn), within [`resend_initial`,
  `resend_max`] s; when it fires the oldest RESEND_WINDOW (4) unacknowledged packets go
  again and the timeout doubles (up to `resend_max`; it stays backed off until a packet
  sent once is acknowledged: a fresh sample); acknowledged progress restarts the timer, and
  when a prompt ack (within `resend_initial` of the last copy of a packet it acknowledges)
  reveals that the next unacknowledged packet is older than rto it goes at once; a late
  ack (a full node working through a backlog: the next packets wait in its queue) resends
  nothing before the timer. A resent packet is signed again only when its `base` (see TL) moved. (It was one
  timer per packet, 0.25 s doubling to 2 s, each resend signed again: behind a saturated
  full node every one of up to 4,096 unacknowledged packets per validator went again every
  2 s, 776 receipt packets per message in bench_remp_daemon at 40 msg/s.) Obsolete: a receipt added in
  master session S is abandoned once the current session is S + 2 (DESIGN.md: a message
  received in N is obsolete at N + 2; a Timeout produced at the switch to N + 2 therefore
  still has two sessions to arrive). Bounded memory: at most `max_unacked_per_dst` packets per
  full node; the oldest is abandoned beyond it (stats["abandoned_overflow"]).
  Flow control (bounded and acknowledged, as TCP's receive window, RFC 9293 3.8.6): every
  ack of a ReceiptReceiver carries its window, the packets it buffers per validator
  (remp.receiptBatchAckWindow); a sender never emits a packet with seqno above
  max(acknowledged through, base - 1) + window (INITIAL_WINDOW before the first ack): the
  receipts that do not fit wait in `pending` (stats["window_full"] counts the waits) and
  leave, in full-size packets, when an ack opens the window. A packet inside the window
  always finds room in the receiver's reorder buffer, so none is refused for space; a full
  node that falls behind acknowledges later and its validators send less, instead of it
  discarding their receipts (it refused packets with "buffer_full" past 512 buffered, and
  each validator resent only the oldest four per timeout, so a burst's receipts waited
  until they were obsolete). Receipts still waiting when their session is obsolete are
  abandoned like unacknowledged packets (stats["receipts_abandoned"] counts every receipt
  given up, for either reason).

Full-node side: `ReceiptReceiver`
    receive(src, payload, now) (raises DeliveryError for a bad packet; counted);
    next_event() -> ReceiptDelivered(source, signed, receipt) | None, in the order the
    source produced them; packets_to_send(now) -> acks; get_timer() / handle_timer(now).
  Checks: the packet signature against the validator's key (by its key id), `dst` is this
  full node, every inner receipt parses and names the packet's source as source_id (each
  inner ed25519 signature is kept as is, so each status still verifies alone; the daemon
  hands them to client.RempClient.receive_authenticated, which does not verify them again:
  the packet signature already covers them; pass verify_receipts=True to verify each here). Ordering: packets are released in seqno order per (source, stream);
  a later packet waits in a bounded buffer for the missing one, or until the sender's
  `base` says the missing one was abandoned. Duplicates (resent packets, duplicated
  datagrams, the same receipt in two packets) are dropped and acknowledged again.
  Acks are coalesced for `ack_delay` s and cumulative: `through` = the last seqno released
  in order (a buffered packet is not acknowledged, so a crash that loses the buffer loses
  nothing: the sender still holds it).

TL (our own objects, boxed like every REMP object; ids = CRC32 of the normalized line,
tl.tl_constructor_id; the signature covers the boxed object with an EMPTY signature field,
the TON convention for self-signed objects, as wire.py does for tonNode.rempMessage):

    remp.receiptBatch source_id:int256 dst:int256 stream:long seqno:long base:long
        receipts:(vector bytes) signature:bytes = remp.ReceiptBatch;
    remp.receiptBatchAck source_id:int256 stream:long through:long seqnos:(vector long)
        = remp.ReceiptBatchAck;
    remp.receiptBatchAckWindow source_id:int256 stream:long through:long window:int
        seqnos:(vector long) = remp.ReceiptBatchAck;

source_id: the validator's key id; dst: the full node's key id; stream: the sender's run
(grows across restarts: the caller passes one per run, the daemon its run epoch, microseconds
since the Unix epoch at start; the core reads no clock);
seqno: 1, 2, ... per (dst, stream); base: every seqno below it is acknowledged or
abandoned; receipts: boxed tonNode.rempSignedReceipt objects, in production order.
An ack names the validator (source_id) and stream it acknowledges; `through`: every seqno
<= through was received and released in order; seqnos: others received (the receiver
here always sends it empty; a sender honours it); window (the second form, which the
receiver here sends): packets beyond `through` it can hold, 1..MAX_WINDOW; a sender that
got the first form keeps the window it had. Acks are not signed: the transport
authenticates their sender, and a forged ack could only make a validator stop resending.

`classify(payload) -> kind` (remp_node/wire/node_tl.py, re-exported here) routes a transport
payload without guessing (KINDS).

Errors: DeliveryError (a ValueError) with `reason` for remote input; DeliveryMisuse (not a
ValueError) for local misuse.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

from ..errors import RempLocalError
from ..wire.keys import NodeKey, key_id as key_id_of, verify
from ..wire.receipts import MAX_RECEIPT_BYTES, Receipt, ReceiptError, SignedReceipt, new_status_message_id
from ..wire.batches import (MAX_ACK_SEQNOS, MAX_BATCH_RECEIPTS, MAX_PACKET_BYTES, MAX_WINDOW,  # noqa: F401
                            RECEIPT_BATCH, RECEIPT_BATCH_ACK, RECEIPT_BATCH_ACK_WINDOW, TL_LINES, Ack, Batch,
                            DeliveryError, decode_ack, decode_batch, encode_ack, encode_batch)
# classify / unwrap route a transport payload by its first bytes: codecs in wire/node_tl.py,
# re-exported here for existing importers
from ..wire.node_tl import KINDS, classify, unwrap  # noqa: F401

__all__ = ["ReceiptSender", "ReceiptReceiver", "OutboxChange", "ReceiptDelivered", "DeliveryEvent", "DeliveryError",
           "DeliveryMisuse", "classify", "KINDS", "TL_LINES", "RECEIPT_BATCH", "RECEIPT_BATCH_ACK",
           "encode_batch", "decode_batch", "encode_ack", "decode_ack", "Batch", "Ack"]


#: packets a sender may have beyond the receiver's cumulative ack before it heard the
#: receiver's window (TCP's initial window, RFC 5681, in packets); a receiver advertises at
#: least this many (the full node's --receipt-window minimum), so even the first packets of
#: a stream always find room
INITIAL_WINDOW = 2
#: the window (packets) a ReceiptReceiver advertises and buffers by default
DEFAULT_WINDOW = 32


class DeliveryMisuse(RempLocalError):
    """Local misuse of ReceiptSender / ReceiptReceiver (not a ValueError)."""


# --- validator side ----------------------------------------------------------------------------

@dataclass(frozen=True)
class OutboxChange:
    """One durable change of a ReceiptSender's outbox (journal=True).

    kind: "add" | "done"; dst: full node key id; digest: sha256 of the receipt bytes (the
    key a store deletes by); receipt: the serialized tonNode.rempSignedReceipt ("add" only);
    session: master session it belongs to ("add" only)."""

    kind: str
    dst: bytes
    digest: bytes
    receipt: bytes = b""
    session: int = 0

@dataclass
class _Out:
    seqno: int
    receipts: tuple            # serialized SignedReceipt bytes
    session: int               # oldest session among its receipts
    sent_at: float             # first send (RTT sample when acknowledged without a resend)
    last_sent: float = 0.0
    sends: int = 0
    wire: bytes | None = None  # the signed packet as last sent, reused while its base holds
    wire_base: int = 0


@dataclass
class _Dst:
    pending: deque = field(default_factory=deque)      # (bytes, session)
    pending_bytes: int = 0
    flush_at: float | None = None
    last_flush: float = -1e18
    seqno: int = 0
    unacked: "OrderedDict[int, _Out]" = field(default_factory=OrderedDict)
    rto: float = 0.25           # retransmission timeout (s), from the acks' round trips
    srtt: float | None = None
    rttvar: float = 0.0
    rtx_at: float | None = None  # when the oldest unacknowledged packets go again
    backoff: int = 0            # resends since the last acknowledged progress
    lossy_until: float = float("-inf")  # packets stay lossy_batch_bytes small until then (after a resend)
    window: int = INITIAL_WINDOW  # packets beyond acked_through the receiver can hold (its acks say)
    acked_through: int = 0       # the receiver's cumulative ack
    blocked: bool = False        # receipts wait in pending for the window to open


#: unacknowledged packets resent per full node when its retransmission timer fires (the
#: oldest ones: the receiver acknowledges cumulatively and buffers what follows a hole)
RESEND_WINDOW = 4


class ReceiptSender:
    """Validator side of receipt delivery (see module doc).

    key: the validator's NodeKey (signs packets). max_delay: seconds a status may wait for
    batching (0.1). max_batch_bytes: receipts bytes per packet while the path loses nothing
    (4,452 = four transport parts of 1,154 payload bytes - 164 bytes of packet header and
    signature); lossy_batch_bytes: the limit for loss_memory seconds after a packet had to
    be resent (the retransmission timer, or a prompt ack revealing a hole: 2,144 = two
    parts, so 20% datagram loss costs 36% of packets, not 59%; 990 keeps a packet in one
    datagram). At 100 msg/s a
    validator has ~25 statuses per 100 ms for the full node, so the packet size, not
    max_delay, sets the packet count: four parts halved the receipt packets per message
    (6.0 -> 3.1 in bench_remp_daemon), each a signature here and an ed25519 verify, a
    decode and an ack at the full node. resend_initial / resend_max: seconds. max_unacked_per_dst:
    packets kept per full node. stream: see module doc. session: current master session.
    urgent_first: None (every first status, tonNode.rempNew, flushes its batch at once) or
    a predicate on the 32-byte message id: a first status flushes at once only when it is
    true (the daemon passes ValidatorCore.received_directly: the validator a full node sent
    the message to answers at once; the group members that learned it from the RMQ let
    their PutIntoQueue ride in the next batch, at most max_delay later).
    stats: added, packets, resends, acked, receipts_acked, abandoned_obsolete,
    abandoned_overflow, acks_bad, restored, lossy_periods, window_full (waits for the
    receiver's window), receipts_abandoned (receipts given up: obsolete or overflow).
    initial_window: packets in flight before the first ack tells the window (INITIAL_WINDOW).

    Surviving a crash (journal=True): the unacknowledged receipts are the sender's state
    users count on (a SIGKILLed validator must not lose a status it already produced and
    logged). journal_updates() drains OutboxChange records: "add" (dst, receipt bytes,
    session, digest) for every receipt added, "done" (dst, digest) once it is acknowledged
    or abandoned. The daemon writes them to its store (fsync) before it sends the packets
    that carry those receipts, keeping the "add" order, and after a restart feeds the
    receipts still without "done" to restore(...) of the new sender (a new stream): they are
    sent again; the full node drops the ones it already had (ReceiptReceiver dedups by
    receipt digest)."""

    def __init__(self, key: NodeKey, *, max_delay: float = 0.1, max_batch_bytes: int = 4452,
                 lossy_batch_bytes: int = 2144, loss_memory: float = 5.0,
                 resend_initial: float = 0.25, resend_max: float = 2.0, max_unacked_per_dst: int = 4096,
                 stream: int, session: int = 0, journal: bool = False,
                 urgent_first: Callable[[bytes], bool] | None = None, initial_window: int = INITIAL_WINDOW):
        if max_delay < 0 or resend_initial <= 0 or resend_max < resend_initial or max_unacked_per_dst < 1 \
                or not 1 <= initial_window <= max_unacked_per_dst:
            raise DeliveryMisuse("bad ReceiptSender parameters")
        self.key = key
        self.max_delay = max_delay
        self.max_batch_bytes = max_batch_bytes
        self.lossy_batch_bytes = min(lossy_batch_bytes, max_batch_bytes)
        self.loss_memory = loss_memory
        self.resend_initial = resend_initial
        self.resend_max = resend_max
        self.max_unacked = max_unacked_per_dst
        self.stream = int(stream)
        self.session = session
        self._dsts: dict[bytes, _Dst] = {}
        self._out: list[tuple[bytes, bytes]] = []
        self.journal = journal
        self.urgent_first = urgent_first
        self.initial_window = initial_window
        self._now = 0.0
        self._journal: list[OutboxChange] = []
        self.stats = {k: 0 for k in ("added", "packets", "resends", "acked", "receipts_acked",
                                     "abandoned_obsolete", "abandoned_overflow", "acks_bad", "restored",
                                     "lossy_periods", "window_full", "receipts_abandoned")}

    def add(self, dst: bytes, signed: SignedReceipt | bytes, now: float, session: int | None = None) -> None:
        """Queue one signed receipt for full node `dst` (key id). signed: a SignedReceipt or
        its serialized bytes. session: master session it belongs to (default: current)."""
        self._add(dst, signed, now, session, True)

    def restore(self, entries: Iterable[tuple[bytes, bytes, int]], now: float) -> None:
        """After a restart: queue again the (dst, receipt bytes, session) a journal still
        holds without "done", in their original order (no new "add" records)."""
        for dst, data, session in entries:
            self._add(dst, data, now, session, False)
            self.stats["restored"] += 1

    def journal_updates(self) -> list["OutboxChange"]:
        """Drain the OutboxChange records since the last call (journal=True; else [])."""
        out, self._journal = self._journal, []
        return out

    def _done(self, dst: bytes, receipts: Iterable[bytes]) -> None:
        if self.journal:
            self._journal.extend(OutboxChange("done", dst, hashlib.sha256(r).digest()) for r in receipts)

    def _add(self, dst, signed, now: float, session: int | None, journal: bool) -> None:
        data = signed.serialize() if isinstance(signed, SignedReceipt) else bytes(signed)
        if len(data) > MAX_RECEIPT_BYTES + 80 or len(dst) != 32:
            raise DeliveryMisuse("receipt too large or bad destination key id")
        session = self.session if session is None else session
        if journal and self.journal:
            self._journal.append(OutboxChange("add", bytes(dst), hashlib.sha256(data).digest(), data, session))
        d = self._dsts.get(dst)
        if d is None:
            d = self._dsts[dst] = _Dst(rto=self.resend_initial, window=self.initial_window)
        limit = self.max_batch_bytes if now >= d.lossy_until else self.lossy_batch_bytes
        if d.pending_bytes and d.pending_bytes + len(data) > limit and not d.blocked:
            self._flush(dst, d, now)
        d.pending.append((data, session))
        d.pending_bytes += len(data) + 4
        self.stats["added"] += 1
        if d.blocked:
            return                      # the next ack that opens the window sends it
        if d.pending_bytes >= limit or self._urgent(data):
            self._flush(dst, d, now)
        elif d.flush_at is None:
            d.flush_at = max(now, d.last_flush + self.max_delay)
            if d.flush_at <= now:
                self._flush(dst, d, now)

    def _urgent(self, data: bytes) -> bool:
        mid = new_status_message_id(data)
        return mid is not None and (self.urgent_first is None or self.urgent_first(mid))

    def set_session(self, session: int, now: float) -> None:
        """The validator entered master session `session`: abandon obsolete packets and
        obsolete receipts waiting for the window."""
        if session > self.session:
            self.session = session
            self._now = now
            self._expire()

    def _expire(self) -> None:
        for dst, d in self._dsts.items():
            for seq in [s for s, o in d.unacked.items() if self.session >= o.session + 2]:
                o = d.unacked.pop(seq)
                self._done(dst, o.receipts)
                self.stats["abandoned_obsolete"] += 1
                self.stats["receipts_abandoned"] += len(o.receipts)
            if d.pending and d.pending[0][1] + 2 <= self.session:   # waiting for the window
                keep = deque(p for p in d.pending if p[1] + 2 > self.session)
                gone = [r for r, x in d.pending if x + 2 <= self.session]
                d.pending = keep
                d.pending_bytes = sum(len(r) + 4 for r, _ in keep)
                self._done(dst, gone)
                self.stats["receipts_abandoned"] += len(gone)
            if d.blocked and d.pending and self._open(d):
                self._flush(dst, d, self._now)

    def _base(self, d: _Dst) -> int:
        return next(iter(d.unacked)) if d.unacked else d.seqno + 1

    def _open(self, d: _Dst) -> bool:
        """True when the next packet fits the receiver's window: its seqno is at most the
        receiver's cumulative ack (or base - 1: it skips to base) plus its window, so it
        finds room in the receiver's reorder buffer whatever arrives before it."""
        return d.seqno + 1 <= max(d.acked_through, self._base(d) - 1) + d.window

    def _flush(self, dst: bytes, d: _Dst, now: float) -> None:
        """Pending receipts into packets while the window is open (each at most the batch
        limit); what does not fit waits in pending until an ack opens the window (flow
        control: a slow full node acknowledges late, so its validators send less)."""
        d.flush_at = None
        limit = self.max_batch_bytes if now >= d.lossy_until else self.lossy_batch_bytes
        while d.pending:
            if not self._open(d):
                if not d.blocked:
                    d.blocked = True
                    self.stats["window_full"] += 1
                return
            d.blocked = False
            take, size = [], 0
            while d.pending and (not take or size + len(d.pending[0][0]) + 4 <= limit) \
                    and len(take) < MAX_BATCH_RECEIPTS:
                r = d.pending.popleft()
                take.append(r)
                size += len(r[0]) + 4
            d.pending_bytes -= size
            d.seqno += 1
            o = _Out(d.seqno, tuple(r for r, _ in take), min(x for _, x in take), now)
            d.unacked[o.seqno] = o
            while len(d.unacked) > self.max_unacked:
                gone = d.unacked.popitem(last=False)[1].receipts
                self._done(dst, gone)
                self.stats["abandoned_overflow"] += 1
                self.stats["receipts_abandoned"] += len(gone)
            d.last_flush = now
            self._emit(dst, d, o, now)
            if d.rtx_at is None:
                d.rtx_at = now + d.rto
        d.pending_bytes = 0

    def _emit(self, dst: bytes, d: _Dst, o: _Out, now: float) -> None:
        base = self._base(d)
        if o.wire is None or o.wire_base != base:     # signed again only when base moved
            o.wire = encode_batch(self.key, dst, self.stream, o.seqno, base, o.receipts)
            o.wire_base = base
        o.sends += 1
        o.last_sent = now
        self._out.append((dst, o.wire))
        self.stats["packets" if o.sends == 1 else "resends"] += 1

    def _resend(self, dst: bytes, d: _Dst, now: float) -> None:
        """The oldest RESEND_WINDOW unacknowledged packets go again (those not sent within the
        last rto); the timer backs off. A resend means a packet or its ack was probably lost:
        packets stay lossy_batch_bytes small for loss_memory seconds."""
        if now >= d.lossy_until:
            self.stats["lossy_periods"] += 1
        d.lossy_until = now + self.loss_memory
        for o in list(d.unacked.values())[:RESEND_WINDOW]:
            if now - o.last_sent >= d.rto - 1e-9:
                self._emit(dst, d, o, now)
        d.backoff += 1
        # RFC 6298 5.5 / Karn: the timeout doubles and stays backed off until a packet sent
        # once is acknowledged (a fresh sample), so a slow full node is not flooded
        d.rto = min(self.resend_max, d.rto * 2)
        d.rtx_at = now + d.rto

    def receive_ack(self, src: bytes, payload: bytes, now: float) -> None:
        """An ack from full node `src` (key id, from the transport). Raises DeliveryError
        for a malformed one or one for another validator / stream (counted acks_bad)."""
        try:
            ack = decode_ack(unwrap(payload))
            if ack.source_id != self.key.key_id:
                raise DeliveryError("wrong_destination", "ack names another validator")
            if ack.stream != self.stream:
                raise DeliveryError("stale_stream", f"ack for stream {ack.stream}, ours is {self.stream}")
        except DeliveryError:
            self.stats["acks_bad"] += 1
            raise
        d = self._dsts.get(src)
        if d is None:
            return
        if ack.window is not None:
            d.window = min(ack.window, self.max_unacked)
        if ack.through > d.acked_through:
            d.acked_through = ack.through
        done = []
        while d.unacked and next(iter(d.unacked)) <= ack.through:   # seqno order
            done.append(d.unacked.popitem(last=False)[1])
        done.extend(d.unacked.pop(s) for s in ack.seqnos if s in d.unacked)
        for o in done:
            self.stats["acked"] += 1
            self.stats["receipts_acked"] += len(o.receipts)
            self._done(src, o.receipts)
            if o.sends == 1:            # Karn: only packets sent once time the round trip
                self._rtt(d, now - o.sent_at)
        if done:
            d.backoff = 0
            d.rtx_at = None
            if d.unacked:
                d.rtx_at = now + d.rto
                head = next(iter(d.unacked.values()))
                # the next hole goes at once when the head is older than rto and the full node
                # answers promptly (this ack came within resend_initial of the last copy of a
                # packet it acknowledges: e.g. back after an outage, taking the resent ones).
                # An ack that comes late is a full node working through a backlog, whose
                # queue still holds the packets after the acknowledged one: it resends
                # nothing before the timer. (Every ack through such a backlog resent
                # RESEND_WINDOW packets: 2-3 receipt packets per message on top of ~6 at 100
                # msg/s in bench_remp_daemon, all of them duplicates.)
                if (now - head.last_sent >= d.rto
                        and now - max(o.last_sent for o in done) < self.resend_initial):
                    self._resend(src, d, now)
        if d.pending and d.blocked and self._open(d):
            self._flush(src, d, now)        # the window opened: what waited for it leaves

    def _rtt(self, d: _Dst, sample: float) -> None:
        """Jacobson/Karels (RFC 6298): rto = srtt + 4 rttvar within [resend_initial, resend_max]."""
        sample = max(0.0, sample)
        if d.srtt is None:
            d.srtt, d.rttvar = sample, sample / 2
        else:
            d.rttvar = 0.75 * d.rttvar + 0.25 * abs(d.srtt - sample)
            d.srtt = 0.875 * d.srtt + 0.125 * sample
        d.rto = min(self.resend_max, max(self.resend_initial, d.srtt + 4 * d.rttvar))

    def packets_to_send(self, now: float) -> list[tuple[bytes, bytes]]:
        """Run due flushes and resends, then drain: [(full node key id, payload)]."""
        self.handle_timer(now)
        out, self._out = self._out, []
        return out

    def get_timer(self) -> float | None:
        """Earliest flush or retransmission deadline (seconds), or None. O(full nodes)."""
        t = None
        for d in self._dsts.values():
            if d.flush_at is not None and (t is None or d.flush_at < t):
                t = d.flush_at
            if d.unacked and d.rtx_at is not None and (t is None or d.rtx_at < t):
                t = d.rtx_at
        return t

    def handle_timer(self, now: float) -> None:
        for dst, d in self._dsts.items():
            if (d.flush_at is not None and d.flush_at <= now) or (d.blocked and self._open(d)):
                self._flush(dst, d, now)
            if not d.unacked:
                d.rtx_at, d.backoff = None, 0
            elif d.rtx_at is not None and d.rtx_at <= now:
                self._resend(dst, d, now)

    def unacked(self, dst: bytes | None = None) -> int:
        """Receipts not yet acknowledged (pending + in unacked packets), for dst or all."""
        ds = [self._dsts[dst]] if dst is not None and dst in self._dsts else (
            [] if dst is not None else list(self._dsts.values()))
        return sum(len(d.pending) + sum(len(o.receipts) for o in d.unacked.values()) for d in ds)


# --- full node side -----------------------------------------------------------------------------

class DeliveryEvent:
    """Base class of ReceiptReceiver events."""


@dataclass(frozen=True)
class ReceiptDelivered(DeliveryEvent):
    """One receipt, in its source's production order.

    source: the validator's key id (32 bytes); signed: the receipts.SignedReceipt exactly as
    the validator signed it (verifiable alone); receipt: signed.open(); digest:
    sha256(signed.receipt + signed.signature), the receipt's duplicate key (computed once
    here, reused by the client core's per-message duplicate check; b"" when not given)."""

    source: bytes
    signed: SignedReceipt
    receipt: Receipt
    digest: bytes = b""


@dataclass
class _Src:
    stream: int = -1
    next_seq: int = 0          # 0: not started (first packet sets it from base)
    buffer: dict = field(default_factory=dict)       # seqno -> parsed receipts
    ack_due: float | None = None


class ReceiptReceiver:
    """Full node side of receipt delivery (see module doc).

    key: the full node's NodeKey (its key id must be the packets' dst). sources: the
    validators' ed25519 public keys (iterable of 32 bytes, or a mapping key id -> public
    key); add_source adds more. ack_delay: seconds acks are coalesced. max_buffered: packets
    held per source while one before them is missing. dedup_memory: receipt digests kept to
    drop duplicates; also the window every ack advertises (flow control: a conforming sender
    never makes it refuse a packet for space). verify_receipts: also verify every inner
    receipt's signature here.
    stats: packets, receipts, duplicates_packets, duplicates_receipts, acks, skipped
    (seqnos the sender abandoned), and errors by reason ("error_<reason>")."""

    def __init__(self, key: NodeKey, sources: Iterable[bytes] | Mapping[bytes, bytes] = (), *,
                 ack_delay: float = 0.02, max_buffered: int = DEFAULT_WINDOW, dedup_memory: int = 65536,
                 verify_receipts: bool = False):
        self.key = key
        self.ack_delay = ack_delay
        self.max_buffered = max_buffered
        self.dedup_memory = dedup_memory
        self.verify_receipts = verify_receipts
        self._keys: dict[bytes, bytes] = {}
        for pk in (sources.values() if isinstance(sources, Mapping) else sources):
            self.add_source(pk)
        self._src: dict[bytes, _Src] = {}
        self._seen: set[bytes] = set()
        self._seen_order: deque[bytes] = deque()
        self._events: deque[DeliveryEvent] = deque()
        self._out: list[tuple[bytes, bytes]] = []
        self.stats = {k: 0 for k in ("packets", "receipts", "duplicates_packets", "duplicates_receipts",
                                     "acks", "skipped")}
        for r in ("malformed", "unknown_source", "bad_signature", "wrong_destination", "wrong_source",
                  "stale_stream", "buffer_full"):
            self.stats["error_" + r] = 0

    def add_source(self, public_key: bytes) -> None:
        """Accept packets signed by this validator key (32-byte ed25519 public key)."""
        if len(public_key) != 32:
            raise DeliveryMisuse("public key must be 32 bytes")
        self._keys[key_id_of(public_key)] = bytes(public_key)

    def _fail(self, reason: str, detail: str) -> DeliveryError:
        self.stats["error_" + reason] += 1
        return DeliveryError(reason, detail)

    def receive(self, src: bytes, payload: bytes, now: float) -> None:
        """One remp.receiptBatch from transport sender `src` (key id). Raises DeliveryError
        (counted in stats["error_<reason>"]) when it is malformed, from an unknown or
        different validator, badly signed, not for this full node, from an older stream,
        or the reorder buffer is full (not acknowledged then: the sender resends)."""
        try:
            b = decode_batch(unwrap(payload))
        except DeliveryError as exc:
            raise self._fail(exc.reason, exc.detail) from None
        if b.source_id != src:
            raise self._fail("wrong_source", "packet source_id is not the transport sender")
        pk = self._keys.get(b.source_id)
        if pk is None:
            raise self._fail("unknown_source", f"validator {b.source_id.hex()[:16]} is not known")
        if b.dst != self.key.key_id:
            raise self._fail("wrong_destination", "packet is for another full node")
        s = self._src.get(b.source_id)
        if s is not None and b.stream == s.stream and (b.seqno < s.next_seq or b.seqno in s.buffer):
            # a packet of this stream we already verified and hold (the sender resent it before
            # our ack arrived): nothing in it is used, so no ed25519 check; it is acknowledged
            # again (the transport authenticated the sender)
            self.stats["packets"] += 1
            self.stats["duplicates_packets"] += 1
            if s.ack_due is None:
                s.ack_due = now + self.ack_delay
            return
        if not verify(pk, b.signed_part(), b.signature):
            raise self._fail("bad_signature", "packet signature does not verify")
        if s is None:
            s = self._src[b.source_id] = _Src()
        if b.stream < s.stream:
            raise self._fail("stale_stream", f"stream {b.stream} older than {s.stream}")
        parsed = []
        for raw in b.receipts:
            try:
                sr = SignedReceipt.parse(raw)
                rc = sr.open()
                if rc.source_id != b.source_id:
                    raise ReceiptError("malformed", "receipt source_id is not the packet's source")
                if self.verify_receipts:
                    sr.verify([pk])
            except ReceiptError as exc:
                raise self._fail("malformed" if exc.reason == "malformed" else exc.reason,
                                 f"receipt in packet {b.seqno}: {exc}") from None
            parsed.append((sr, rc))
        if b.stream > s.stream:        # first packet of this source, or the validator restarted
            s.stream, s.next_seq, s.buffer = b.stream, b.base, {}
        self.stats["packets"] += 1
        if b.seqno < s.next_seq or b.seqno in s.buffer:
            self.stats["duplicates_packets"] += 1
        else:
            if b.seqno != s.next_seq and len(s.buffer) >= self.max_buffered:
                raise self._fail("buffer_full", f"{len(s.buffer)} packets wait for seqno {s.next_seq}")
            s.buffer[b.seqno] = parsed
        if b.base > s.next_seq:        # the sender abandoned the ones before base
            self.stats["skipped"] += sum(1 for q in range(s.next_seq, b.base) if q not in s.buffer)
            for q in [q for q in s.buffer if q < b.base]:
                self._release(b.source_id, s.buffer.pop(q))
            s.next_seq = b.base
        while s.next_seq in s.buffer:
            self._release(b.source_id, s.buffer.pop(s.next_seq))
            s.next_seq += 1
        if s.ack_due is None:
            s.ack_due = now + self.ack_delay

    def _release(self, source: bytes, parsed: list) -> None:
        for sr, rc in parsed:
            digest = hashlib.sha256(sr.receipt + sr.signature).digest()
            if digest in self._seen:
                self.stats["duplicates_receipts"] += 1
                continue
            self._seen.add(digest)
            self._seen_order.append(digest)
            if len(self._seen_order) > self.dedup_memory:
                self._seen.discard(self._seen_order.popleft())
            self.stats["receipts"] += 1
            self._events.append(ReceiptDelivered(source, sr, rc, digest))

    def next_event(self) -> DeliveryEvent | None:
        return self._events.popleft() if self._events else None

    def get_timer(self) -> float | None:
        ts = [s.ack_due for s in self._src.values() if s.ack_due is not None]
        return min(ts) if ts else None

    def handle_timer(self, now: float) -> None:
        for source, s in self._src.items():
            if s.ack_due is not None and s.ack_due <= now:
                s.ack_due = None
                # cumulative only: an ack means "released, in order, to the full node"; a
                # packet held in the reorder buffer is not acknowledged, so a crash of either
                # side (buffer gone) cannot lose it: the sender still has it
                self._out.append((source, encode_ack(source, s.stream, s.next_seq - 1, (),
                                                     window=self.max_buffered)))
                self.stats["acks"] += 1

    def packets_to_send(self, now: float) -> list[tuple[bytes, bytes]]:
        """Run due acks, then drain: [(validator key id, payload)]."""
        self.handle_timer(now)
        out, self._out = self._out, []
        return out
