"""The REMP client core (the full node side): no I/O, no clock, datagram-shaped.

Sources: DESIGN.md sections 2 and 4; seeds/remp-overview.md ("REMP Client protocol",
"Proposals for speeding up"); seeds/remp-protocol-b.txt ("Message statuses", "Rejection
sequences"); reference timings: client resend 2 s, Timeout after 4 min.

What it does, per submitted message:

1. `submit(boc, now)`: parse (messages.parse_external_message) and pre-execute against the
   full node's shard state (state.ShardState.precheck). On failure: a RejectedByFullnode
   receipt signed by the full node's key and a final `FinalStatus("rejected")`.
2. Validator selection: send a `tonNode.rempMessage` datagram (wire.py) to ONE validator of
   the destination shard's current group; every `resend_interval` seconds (2 s) add one more
   validator, until more than 1/3 of the group has answered (any verified receipt counts as
   an answer; 1/3 + 1 guarantees one honest relayer). Near a session switch `groups` returns
   a non-empty next group: the same rule then runs for that group too. When every member
   of a group has been sent to and too few answered, the unanswered ones get the message
   again (datagram loss), after 2, 4, 8, then every 16 s (RESEND_BACKOFF_MAX). When the
   validators answer slower than `resend_interval` (first receipts measured as an RTO,
   ANSWER_GAIN), waves wait that long instead (wave_interval(), at most 16 s). Each wave that reaches a new validator produces a
   SentToValidators status (sent_to = distinct validators reached, total_validators = size
   of current + next group), signed by the full node.
3. Receipts in (`receive_datagram`): a `tonNode.rempSignedReceipt` is verified against the
   validator keys of every group the message was offered to, the shard's groups at `now`,
   and `extra_keys()` (a validator may learn the message from the RMQ); each new verified receipt
   becomes a `ReceiptEvent(origin="validator")`.
4. Final status: an Accepted/Masterchain ("Finalized") receipt -> the full node issues its
   own signed Finalized (same block ids) and `FinalStatus("finalized")`. A message is finally
   rejected only when every validator that reported it (New or later) has ended it with
   RejectedBy*/Timeout -> `FinalStatus("rejected")` (or "timeout" if all were Timeout).
   Each validator's state for the message is its NEWEST receipt by (timestamp, level):
   a non-final receipt with a later timestamp takes the message up again (New after a
   session switch), a reordered older one (an AcceptedByQueue overtaken by the
   RejectedByCollator) neither reopens nor ends anything; Duplicate never changes it.
   After `lifetime` seconds (240 s default; None: never) without a final status: a
   full-node Timeout receipt and `FinalStatus("timeout")`.
5. What the chain says (the daemon feeds its ChainFollower's view): `chain_finalized(id,
   block_id, master_id, now)`, the message is in a shard block committed by an accepted
   master block: the full node's own Finalized (those block ids) and FinalStatus
   ("finalized"), even when no validator's Finalized receipt reached it; `chain_session(n,
   now)`, the chain reached master session n: a message last sent to validators in session
   s <= n - REPLAY_WINDOW_SESSIONS - 1 and not in the chain is past every validator's replay
   window (a message received in session s is obsolete at s + 2: DESIGN.md section 4) and
   can no longer be included: a full-node Timeout. The daemon runs with lifetime=None, so
   it declares Timeout only from the chain (or every validator's Timeout), never because
   receipts are late.

Time: `now` is the caller's clock in seconds (loop.time() in daemons). Receipt timestamps and
wallet `valid_until` checks need Unix time: `wall_clock(now)` maps `now` to Unix seconds
(identity by default, so fake clocks in tests start at a Unix epoch value).

Errors: malformed datagrams raise wire.WireError or receipts.ReceiptError (ValueErrors, remote
errors: the adapter logs once and drops); misuse of the API raises ClientError.
"""
from __future__ import annotations

import hashlib
import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from ..errors import RempLocalError
from ..wire.keys import NodeKey, key_id
from ..wire.messages import ExternalMessage, MessageRejected, message_id_of, parse_external_message
from ..wire.shards import shard_hex
from ..wire.receipts import (
    Accepted, Level, Receipt, ReceiptError, Rejected, SentToValidators, SignedReceipt, Timeout,
    is_source_final, kind_of, sign_receipt, to_json,
)
from ..wire.tl import ZERO_BLOCK_ID
from ..wire.packets import RempMessageDatagram, decode_datagram, encode_remp_message

#: Seconds between adding validators / resending (reference: client resend 2 s).
RESEND_INTERVAL = 2.0
#: A wave that reaches no new validator (every member of its groups was tried: the client
#: resends to the unanswered ones) waits resend_interval * 2**k before the next, k = such
#: waves so far, at most RESEND_BACKOFF_MAX doublings (2, 4, 8, 16 s). Without it, past
#: saturation (receipts queued behind an overloaded full node, so nobody seems to answer)
#: every tracked message went again to up to 12 validators every 2 s: 412 datagrams per
#: message in bench_remp_daemon at 40 msg/s, which kept the network saturated.
RESEND_BACKOFF_MAX = 3
#: The wave interval follows the network's answer time: srtt + 4 rttvar (RFC 6298, gains
#: 1/8 and 1/4) of the delays from a message's first wave to its first receipt (from any
#: validator: not Karn's rule, which would never learn a delay longer than the interval),
#: when that is longer than resend_interval, up to resend_interval * 2**RESEND_BACKOFF_MAX. Past
#: saturation a first receipt took 1-40 s (bench_remp_daemon, 40-100 msg/s): a fixed 2 s
#: sent every message to one more validator every 2 s (client_message 24-37 datagrams per
#: message at 80-100 msg/s against 1.2 at 40), each of which queued it again in its RMQ
#: (rmq 118 per message at 100 msg/s), feeding the overload it reacted to.
ANSWER_GAIN, ANSWER_VAR_GAIN = 0.125, 0.25
#: Seconds between scans of the unanswered messages for early waves (silent_after). The scan
#: is O(unanswered); it ran on every submit, every receipt and every get_timer (35 receipts
#: per message), quadratic past saturation (py-spy, full node at 40 msg/s: _tick, _silent_at
#: and get_timer ~12% of its samples). An early wave is now due within SILENT_SCAN of its time.
SILENT_SCAN = 0.05
#: Seconds a full node tracks a message before its own Timeout (docs: Timeout after 4 min).
MESSAGE_LIFETIME = 240.0
#: master sessions a validator keeps a message (received in s: obsolete at s + 2); a full
#: node declares Timeout when the chain is one session past that (chain_session)
REPLAY_WINDOW_SESSIONS = 2
#: Seconds a finished message id is remembered to drop late receipts quietly.
FINISHED_MEMORY = 600.0
#: Seconds after its final status a message's late receipts are still verified and reported
#: (ReceiptEvent with late=True), so every status a validator produced reaches subscribers:
#: the grace period of a subscription (MessageSettled). It ends earlier when every expected
#: validator (see MessageSettled) has sent its own final status.
LATE_MEMORY = 60.0

#: groups(shard, now) -> (current group public keys, next group public keys or []).
GroupsFn = Callable[[int, float], "tuple[Sequence[bytes], Sequence[bytes]]"]


class ClientError(RempLocalError):
    """Local misuse of RempClient (e.g. an account of an unknown workchain state)."""


class RempClientEvent:
    """Base class of the events `RempClient.next_event()` returns."""


@dataclass(frozen=True)
class MessageReceived(RempClientEvent):
    """A user submitted a message (first event of every submit, also of refused ones).
    message_id: 32 bytes; size: BOC bytes; shard: destination shard ident (0 if unknown)."""

    message_id: bytes
    size: int
    shard: int = 0


@dataclass(frozen=True)
class MessageSent(RempClientEvent):
    """One tonNode.rempMessage datagram for the message went to validator `peer` (key id,
    32 bytes); size: datagram bytes; count: distinct validators reached so far; datagram:
    this datagram's number (1-based) among the message's rempMessage datagrams."""

    message_id: bytes
    peer: bytes
    shard: int
    size: int
    count: int
    datagram: int = 1


@dataclass(frozen=True)
class ReceiptEvent(RempClientEvent):
    """A status of a message: produced by this full node (origin "fullnode":
    SentToValidators, RejectedByFullnode, Finalized, Timeout) or received from a validator
    and verified (origin "validator").

    message_id: 32 bytes; receipt: the Receipt; signature: its 64-byte ed25519 signature;
    origin: "fullnode" | "validator"; shard: destination shard ident (0 if unknown)."""

    message_id: bytes
    receipt: Receipt
    signature: bytes
    origin: str
    shard: int = 0
    late: bool = False
    """True for a validator's receipt that arrived after the message's final status (it is
    reported to subscribers, never changes the outcome)."""

    @property
    def kind(self) -> str:
        """JSON kind of the status."""
        return kind_of(self.receipt.status)

    def to_json(self) -> dict[str, Any]:
        """The seed's JSON object for this status (receipts.to_json)."""
        return to_json(self.receipt, self.signature)

    def signed(self) -> SignedReceipt:
        """The status as a SignedReceipt (for a Redis stream / WebSocket subscriber)."""
        return SignedReceipt(self.receipt.serialize(), self.signature)


@dataclass(frozen=True)
class FinalStatus(RempClientEvent):
    """The message's processing is over (emitted once per message).

    message_id: 32 bytes; outcome: "finalized" | "rejected" | "timeout"; kind: the JSON kind
    that decided it ("Finalized", "RejectedByFullnode", "RejectedByCollator", ..., "Timeout");
    reason: error text(s) for rejections ("" otherwise); elapsed: seconds since submit;
    datagrams: rempMessage datagrams this full node sent for it."""

    message_id: bytes
    outcome: str
    kind: str
    reason: str
    elapsed: float
    datagrams: int


@dataclass(frozen=True)
class MessageSettled(RempClientEvent):
    """A message's subscriptions end here (emitted once, after its FinalStatus): every
    expected validator's final status is in, or the grace period passed. (A status that
    still arrives within late_memory of the decision is reported, late=True, for the
    store; none after.)

    reason: "complete" when every expected validator sent its own final status (Finalized,
    RejectedBy*, Timeout; expected = the members of the group the message was first sent to
    plus every validator that reported it; none for a message this full node refused
    itself), or "grace" when `late_memory` seconds passed after the final decision first."""

    message_id: bytes
    reason: str


@dataclass
class _Late:
    until: float
    keys: dict
    seen: set
    shard: int
    expected: set
    ended: set
    settled: bool = False
    reported: set = field(default_factory=set)   # (source, status) already reported


@dataclass
class _Tracked:
    msg: ExternalMessage
    shard: int
    submitted: float
    deadline: float
    next_send: float
    sent: dict[bytes, float] = field(default_factory=dict)        # key id -> last send time
    keys: dict[bytes, bytes] = field(default_factory=dict)        # key id -> public key
    answered: set[bytes] = field(default_factory=set)             # key ids with >= 1 receipt
    ended: dict[bytes, str] = field(default_factory=dict)         # key id -> source-final kind
    latest: dict[bytes, tuple[int, int, int]] = field(default_factory=dict)  # key id -> _order_key
    errors: dict[bytes, str] = field(default_factory=dict)
    seen: set[bytes] = field(default_factory=set)                 # sha256(receipt bytes + signature)
    #: (key id, status) already reported: a validator restarted after a SIGKILL learns the
    #: messages of its queue again from the RMQ and signs the same statuses anew (new
    #: timestamp, new digest); the repeat is counted, not reported a second time
    reported: set = field(default_factory=set)
    datagrams: int = 0
    reported_sent: int = 0
    early: bool = False            # its one early wave (silent_after) is used up
    last_session: int = -1         # master session of its last datagram (session_at)
    group0: frozenset = frozenset()  # key ids of the group its first wave went to (MessageSettled)
    finalized_by: set = field(default_factory=set)  # validators that sent their Finalized
    rewaves: int = 0               # waves that reached no new validator (backoff exponent)


class RempClient:
    """REMP client core of one full node. See the module doc for the protocol.

    key: the full node's NodeKey (signs its statuses and rempMessage datagrams).
    states: the full node's view of the shard states: an object with `workchain`,
        `shard_of(dst) -> shard ident` and `state_for(dst) -> state.ShardState`
        (state.ZeroState fits; keep it updated from accepted blocks).
    groups: groups(shard, now) -> (current, next) lists of validator public keys (32 bytes);
        `next` non-empty only near a master session switch (the caller's schedule decides).
    resend_interval, lifetime: seconds (RESEND_INTERVAL, MESSAGE_LIFETIME).
    wall_clock: now -> Unix seconds (receipt timestamps in ms, valid_until checks).
    extra_keys: () -> more validator public keys whose receipts are accepted (e.g. the
        previous session's group, which also serves the RMQ).
    silent_after: seconds (0.5; None: off). A validator the client sent a message to more
        than this long ago and has heard nothing from since is "silent" (crashed, cut off,
        overloaded): a wave picks the next validator of the message's order that is not
        silent, when there is one (a killed validator otherwise took every message whose
        order started with it, and each waited a whole resend interval for its first
        receipt). Hearing any receipt from it ends its silence. A message not answered yet
        whose validators all fell silent or left it unanswered that long (its datagram or
        their receipts lost while they answer other messages: with 1% datagram loss the
        first receipt's p99 was the 2 s resend interval plus a round trip), while some
        validator answered within the resend interval, gets one early wave (to the next
        non-silent one) instead of waiting.
    """

    def __init__(self, key: NodeKey, states: Any, groups: GroupsFn, *,
                 resend_interval: float = RESEND_INTERVAL, lifetime: float = MESSAGE_LIFETIME,
                 wall_clock: Callable[[float], float] = lambda now: now,
                 extra_keys: Callable[[], Iterable[bytes]] = lambda: (),
                 silent_after: float | None = 0.5, late_memory: float = LATE_MEMORY,
                 session_at: Callable[[float], int] | None = None):
        if resend_interval <= 0 or (lifetime is not None and lifetime <= 0):
            raise ClientError("resend_interval and lifetime must be > 0")
        self.session_at = session_at
        self.key = key
        self.states = states
        self.groups = groups
        self.resend_interval = resend_interval
        self.lifetime = lifetime
        self.wall_clock = wall_clock
        self.extra_keys = extra_keys
        self.silent_after = silent_after
        self.late_memory = late_memory
        self._unheard_since: dict[bytes, float] = {}   # key id -> first send not answered yet
        self._heard_at = -1e18                          # last receipt from any validator
        self._srtt: float | None = None                  # first-receipt delay (ANSWER_GAIN)
        self._rttvar = 0.0
        self._tracked: dict[bytes, _Tracked] = {}
        #: (min(next_send, deadline), id) of tracked messages; an entry whose time no longer
        #: matches its message is stale and skipped (timers cost O(due * log n), not O(n) per
        #: step: at 300 messages/s ~1,000 are tracked at once)
        self._heap: list[tuple[float, bytes]] = []
        #: tracked ids not answered yet (the only ones an early wave can concern)
        self._unanswered: set[bytes] = set()
        self._scan_at = -1e18                  # last early-wave scan (SILENT_SCAN)
        self._silent_next: float | None = None  # earliest early wave found by that scan
        self._kid: dict[bytes, bytes] = {}     # public key -> key id (sha256 once per key)
        #: _finished and _late expire in insertion order (now + a constant; an id is popped
        #: before it is set again), so their first item is the next to expire
        self._finished: dict[bytes, float] = {}
        self._late: dict[bytes, _Late] = {}
        self._out: list[tuple[bytes, bytes]] = []
        self._events: deque[RempClientEvent] = deque()
        #: Counters: "submitted", "rejected_by_fullnode", "datagrams_sent", "receipts",
        #: "receipts_dropped" (unknown/finished message or duplicate), "finalized",
        #: "rejected", "timeout", "late_receipts", "receipts_preverified" (accepted through
        #: receive_authenticated without a second ed25519 verify), "silent_skipped" (a wave
        #: passed over a silent validator), "early_waves" (a message whose validators all
        #: fell silent while others answered went to the next one before its resend interval),
        #: "receipts_repeated" (a status a validator had already sent, signed again: not
        #: reported twice, see _Tracked.reported).
        self.stats: dict[str, int] = {k: 0 for k in (
            "submitted", "rejected_by_fullnode", "datagrams_sent", "receipts", "receipts_dropped",
            "finalized", "rejected", "timeout", "late_receipts", "receipts_preverified", "silent_skipped", "early_waves",
            "chain_finalized", "receipts_repeated")}

    # -- public API ---------------------------------------------------------------------

    def submit(self, boc: bytes, now: float, parsed: ExternalMessage | None = None) -> bytes:
        """Accept a message BOC from a user; returns its 32-byte message id (root cell hash;
        sha256 of the bytes when the BOC does not decode). Produces the first datagram (to
        one validator) or, when the message is refused, a RejectedByFullnode ReceiptEvent
        and FinalStatus("rejected"). Re-submitting a tracked message is a no-op. parsed: the
        caller's parse_external_message(boc, ...) result, if it has one (not parsed again; its
        workchain is still checked against the states')."""
        self.stats["submitted"] += 1
        wall = self.wall_clock(now)
        wcs = getattr(self.states, "workchains", (self.states.workchain,))
        try:
            if parsed is not None and parsed.boc == boc and parsed.workchain in wcs:
                msg = parsed
            else:
                msg = parse_external_message(boc, wcs)
        except MessageRejected as exc:
            mid = submitted_message_id(boc, parsed)
            self._events.append(MessageReceived(mid, len(boc), 0))
            self._reject_locally(mid, exc.text, 0, now)
            return mid
        if msg.id in self._tracked:
            return msg.id
        try:
            shard = self.states.shard_of(msg.dst)
        except ValueError:
            shard = 0
        self._events.append(MessageReceived(msg.id, len(boc), shard))
        try:
            self.states.state_for(msg.dst).precheck(msg, wall)
        except MessageRejected as exc:
            self._reject_locally(msg.id, exc.text, shard, now)
            return msg.id
        self._finished.pop(msg.id, None)
        self._tracked[msg.id] = _Tracked(msg, shard, now, now + self.lifetime if self.lifetime else float("inf"),
                                         now)
        heapq.heappush(self._heap, (now, msg.id))
        self._unanswered.add(msg.id)
        self._tick(now, scan=False)
        return msg.id

    def receive_datagram(self, data: bytes, src_key_id: bytes, now: float) -> None:
        """Feed one datagram from a validator (src_key_id: its 32-byte key id, from the
        transport). Verified receipts become events. Raises WireError / ReceiptError for
        malformed or unverifiable input (remote errors); receipts for unknown or finished
        messages and duplicates are dropped silently (stats["receipts_dropped"])."""
        dg = decode_datagram(data)
        if isinstance(dg, RempMessageDatagram):
            raise ReceiptError("malformed", "a full node does not accept tonNode.rempMessage datagrams")
        self._receipt(dg, dg.open(), now, False)

    def receive_authenticated(self, signed: SignedReceipt, receipt: Receipt, source: bytes, now: float,
                              digest: bytes = b"", tick: bool = True) -> None:
        """Feed one receipt whose bytes the caller already authenticated as validator
        `source`'s (32-byte key id): delivery.ReceiptReceiver checked the packet's ed25519
        signature against that validator's key and that receipt.source_id is the packet's
        source. The receipt's own signature is then not verified again (one ed25519 verify,
        ~80-95 us, saved per receipt); it is kept unchanged in the ReceiptEvent, so a
        subscriber can still verify each status alone. receipt: signed.open(). Raises
        ClientError when receipt.source_id is not `source` (not a remote error: the caller
        vouched for it). digest: sha256(signed.receipt + signed.signature) when the caller has
        it (delivery.ReceiptDelivered.digest; computed here otherwise). tick=False: the due
        waves and expiries are left to the caller's next datagrams_to_send / handle_timer at
        the same `now` (a caller feeding a packet's receipts one by one runs them once for the
        packet, not once per receipt)."""
        if receipt.source_id != source:
            raise ClientError("receive_authenticated: receipt source_id is not the authenticated source")
        self._receipt(signed, receipt, now, True, digest, tick)

    def _receipt(self, dg: SignedReceipt, receipt: Receipt, now: float, authenticated: bool,
                 digest: bytes = b"", tick: bool = True) -> None:
        t = self._tracked.get(receipt.message_id)
        if t is None:
            self._late_receipt(dg, receipt, now, authenticated, digest)
            return
        digest = digest or hashlib.sha256(dg.receipt + dg.signature).digest()
        if digest in t.seen:
            self.stats["receipts_dropped"] += 1
            return
        if authenticated:
            self.stats["receipts_preverified"] += 1
        else:
            current, nxt = self.groups(t.shard, now)  # members may answer via the RMQ
            keys = list(t.keys.values()) + list(current) + list(nxt) + list(self.extra_keys())
            dg.verify(keys)  # raises ReceiptError unknown_source / bad_signature
        t.seen.add(digest)
        self.stats["receipts"] += 1
        if not t.answered:
            self._answer_sample(now - t.submitted)
        src = receipt.source_id
        self._unheard_since.pop(src, None)
        self._heard_at = now
        t.answered.add(src)
        if (src, receipt.status) in t.reported and src not in t.ended:
            self.stats["receipts_repeated"] += 1
        else:
            t.reported.add((src, receipt.status))
            self._events.append(ReceiptEvent(receipt.message_id, receipt, dg.signature, "validator", t.shard))
        kind = kind_of(receipt.status)
        st = receipt.status
        if isinstance(st, Accepted) and st.level == Level.MASTERCHAIN:
            t.finalized_by.add(src)
            own = self._own_receipt(t.msg.id, Accepted(Level.MASTERCHAIN, st.block_id, st.master_id), now)
            self._events.append(ReceiptEvent(t.msg.id, own.open(), own.signature, "fullnode", t.shard))
            self._finish(t, "finalized", "Finalized", "", now)
            return
        if kind not in ("Duplicate",):
            # a validator's state is its newest receipt (timestamp, then level): a stale
            # receipt overtaken in the network neither reopens nor ends anything
            order = _order_key(receipt)
            if order > t.latest.get(src, (-1, -1, -1)):
                t.latest[src] = order
                if is_source_final(kind):
                    t.ended[src] = kind
                    if isinstance(st, Rejected):
                        t.errors[src] = st.error
                    else:
                        t.errors.pop(src, None)
                else:  # the validator has (or took up again, e.g. after a session switch) the message
                    t.ended.pop(src, None)
                    t.errors.pop(src, None)
        if t.answered and all(s in t.ended for s in t.answered):
            kinds = [t.ended[s] for s in sorted(t.answered)]
            if all(k == "Timeout" for k in kinds):
                self._finish(t, "timeout", "Timeout", "", now)
            else:
                decisive = (t.ended[src] if t.ended.get(src, "Timeout") != "Timeout"
                            else next(k for k in kinds if k != "Timeout"))
                reasons = "; ".join(sorted({e for e in t.errors.values() if e}))
                self._finish(t, "rejected", decisive, reasons, now)
        if tick:
            self._tick(now, scan=False)

    def _late_receipt(self, dg: SignedReceipt, receipt: Receipt, now: float, authenticated: bool = False,
                      digest: bytes = b"") -> None:
        late = self._late.get(receipt.message_id)
        if late is None or late.until < now:
            self.stats["receipts_dropped"] += 1
            return
        keys, seen, shard = late.keys, late.seen, late.shard
        digest = digest or hashlib.sha256(dg.receipt + dg.signature).digest()
        if digest in seen:
            self.stats["receipts_dropped"] += 1
            return
        if not authenticated:
            current, nxt = self.groups(shard, now)
            dg.verify(list(keys.values()) + list(current) + list(nxt) + list(self.extra_keys()))
        seen.add(digest)
        self._unheard_since.pop(receipt.source_id, None)
        self.stats["late_receipts"] += 1
        if (receipt.source_id, receipt.status) in late.reported and receipt.source_id not in late.ended:
            self.stats["receipts_repeated"] += 1
        else:
            late.reported.add((receipt.source_id, receipt.status))
            self._events.append(ReceiptEvent(receipt.message_id, receipt, dg.signature, "validator", shard,
                                             late=True))
        st = receipt.status
        if (isinstance(st, Accepted) and st.level == Level.MASTERCHAIN) or is_source_final(kind_of(st)):
            late.ended.add(receipt.source_id)
            if not late.settled and late.expected <= late.ended:
                # subscriptions end here; later statuses (a Duplicate answering a resubmission)
                # are still reported for GET / the store until late_memory passes
                late.settled = True
                self._events.append(MessageSettled(receipt.message_id, "complete"))

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, bytes]]:
        """Run due timers, then drain the outbox: [(validator key id, datagram bytes)]."""
        self._tick(now)
        out, self._out = self._out, []
        return out

    def get_timer(self) -> float | None:
        """Earliest deadline (seconds, caller's clock) at which handle_timer must run."""
        times = []
        while self._heap and self._stale(*self._heap[0]):
            heapq.heappop(self._heap)
        if self._heap:
            times.append(self._heap[0][0])
        if self._unanswered and self.silent_after is not None:
            # the last scan's earliest early wave, and the next scan (what changed since)
            if self._silent_next is not None:
                times.append(self._silent_next)
            # an early wave needs a receipt heard within resend_interval before it (_silent_at);
            # a new receipt comes with a step, which asks again
            wake = self._scan_at + SILENT_SCAN
            if self._heard_at > -1e17 and wake - self._heard_at <= self.wave_interval():
                times.append(wake)
        if self._finished:
            times.append(next(iter(self._finished.values())))
        if self._late:
            times.append(next(iter(self._late.values())).until)
        return min(times) if times else None

    def _stale(self, when: float, mid: bytes) -> bool:
        t = self._tracked.get(mid)
        return t is None or min(t.next_send, t.deadline) != when

    def handle_timer(self, now: float) -> None:
        """Send due waves, expire messages, forget old finished ids."""
        self._tick(now)

    def next_event(self) -> RempClientEvent | None:
        """The next MessageReceived / MessageSent / ReceiptEvent / FinalStatus, or None."""
        return self._events.popleft() if self._events else None

    def pending(self) -> list[bytes]:
        """Ids of messages still being tracked (no final status yet)."""
        return list(self._tracked)

    def n_pending(self) -> int:
        """How many messages are tracked (no final status yet); O(1)."""
        return len(self._tracked)

    def tracking(self, message_id: bytes) -> bool:
        """True while the message is tracked (submitted, no final status yet)."""
        return message_id in self._tracked

    def sent_to(self, message_id: bytes) -> list[bytes]:
        """Key ids of the validators a tracked message was sent to (in order)."""
        t = self._tracked.get(message_id)
        return list(t.sent) if t else []

    # -- internals ------------------------------------------------------------------------

    def _ms(self, now: float) -> int:
        """Unix time in ms for receipt and rempMessage timestamps."""
        return int(round(self.wall_clock(now) * 1000))

    def _own_receipt(self, message_id: bytes, status, now: float) -> SignedReceipt:
        return sign_receipt(Receipt(message_id, status, self._ms(now), self.key.key_id), self.key)

    def _reject_locally(self, message_id: bytes, reason: str, shard: int, now: float) -> None:
        self.stats["rejected_by_fullnode"] += 1
        signed = self._own_receipt(message_id, Rejected(Level.FULLNODE, ZERO_BLOCK_ID, reason), now)
        self._events.append(ReceiptEvent(message_id, signed.open(), signed.signature, "fullnode", shard))
        self._events.append(FinalStatus(message_id, "rejected", "RejectedByFullnode", reason, 0.0, 0))
        self._events.append(MessageSettled(message_id, "complete"))
        self._finished.pop(message_id, None)
        self._finished[message_id] = now + FINISHED_MEMORY

    def _finish(self, t: _Tracked, outcome: str, kind: str, reason: str, now: float) -> None:
        self._tracked.pop(t.msg.id, None)
        self._unanswered.discard(t.msg.id)
        self._finished.pop(t.msg.id, None)
        self._finished[t.msg.id] = now + FINISHED_MEMORY
        self._late.pop(t.msg.id, None)
        self.stats[outcome] += 1
        self._events.append(FinalStatus(t.msg.id, outcome, kind, reason, now - t.submitted, t.datagrams))
        expected = set(t.group0) | t.answered
        ended = set(t.ended) | t.finalized_by
        done = expected <= ended
        self._late[t.msg.id] = _Late(now + self.late_memory, t.keys, t.seen, t.shard, expected, ended, done,
                                      t.reported)
        if done:
            self._events.append(MessageSettled(t.msg.id, "complete"))

    def chain_finalized(self, message_id: bytes, block_id, master_id, now: float) -> bool:
        """The chain holds the message: its shard block `block_id` (tl.BlockIdExt) was
        committed by accepted master block `master_id`. A tracked message gets the full
        node's own Finalized with those ids and FinalStatus("finalized"); True when it did."""
        t = self._tracked.get(message_id)
        if t is None:
            return False
        own = self._own_receipt(message_id, Accepted(Level.MASTERCHAIN, block_id, master_id), now)
        self._events.append(ReceiptEvent(message_id, own.open(), own.signature, "fullnode", t.shard))
        self.stats["chain_finalized"] += 1
        self._finish(t, "finalized", "Finalized", "", now)
        return True

    def chain_session(self, session: int, now: float) -> int:
        """The chain (accepted master blocks) reached master session `session`: every tracked
        message last sent in a session <= session - REPLAY_WINDOW_SESSIONS - 1 is past every
        validator's replay window and not in the chain: a full-node Timeout (module doc).
        O(tracked); called once per new session. Returns how many timed out."""
        n = 0
        for t in [t for t in self._tracked.values()
                  if 0 <= t.last_session <= session - REPLAY_WINDOW_SESSIONS - 1]:
            signed = self._own_receipt(t.msg.id, Timeout(), now)
            self._events.append(ReceiptEvent(t.msg.id, signed.open(), signed.signature, "fullnode", t.shard))
            self._finish(t, "timeout", "Timeout",
                         f"not in the chain at master session {session}: last sent in session {t.last_session}, "
                         f"past the validators' replay window", now)
            n += 1
        return n

    def settling(self, message_id: bytes) -> bool:
        """True while statuses of the message may still be reported: tracked, or final and
        not settled yet (MessageSettled not emitted)."""
        late = self._late.get(message_id)
        return message_id in self._tracked or (late is not None and not late.settled)

    def _send(self, t: _Tracked, kid: bytes, now: float) -> None:
        data = encode_remp_message(t.msg.boc, t.msg.id, self._ms(now), self.key)
        self._out.append((kid, data))
        t.sent[kid] = now
        if self.session_at is not None:
            t.last_session = self.session_at(now)
        self._unheard_since.setdefault(kid, now)
        t.datagrams += 1
        self._events.append(MessageSent(t.msg.id, kid, t.shard, len(data), len(t.sent), t.datagrams))
        self.stats["datagrams_sent"] += 1

    def _wave(self, t: _Tracked, now: float) -> bool:
        """Send one wave; True when it only resent to validators already tried (backoff)."""
        current, nxt = self.groups(t.shard, now)
        total: set[bytes] = set()
        first = not t.group0
        resent = False
        fresh_any = False
        for group in (current, nxt):
            ids = [self._kid.get(pk) or self._kid.setdefault(pk, key_id(pk)) for pk in group]
            for pk, kid in zip(group, ids):
                t.keys[kid] = pk
            total.update(ids)
            if first and group is current:
                t.group0 = frozenset(ids)
            if not ids or sum(1 for k in ids if k in t.answered) * 3 > len(ids):
                continue
            start = int.from_bytes(t.msg.id[:4], "big") % len(ids)
            order = ids[start:] + ids[:start]
            fresh = [k for k in order if k not in t.sent]
            if fresh:
                fresh_any = True
                if self.silent_after is not None:
                    quiet = self._silent_limit()
                    awake = [k for k in fresh if now - self._unheard_since.get(k, now) <= quiet]
                    if awake and awake[0] != fresh[0]:
                        self.stats["silent_skipped"] += 1
                    fresh = awake or fresh
                self._send(t, fresh[0], now)
            else:  # everyone was tried: the datagrams or answers may have been lost
                resent = True
                for k in order:
                    if k not in t.answered and t.sent[k] <= now - self.resend_interval:
                        self._send(t, k, now)
        reached = len(t.sent)
        if reached > t.reported_sent:
            t.reported_sent = reached
            signed = self._own_receipt(t.msg.id, SentToValidators(reached, len(total)), now)
            self._events.append(ReceiptEvent(t.msg.id, signed.open(), signed.signature, "fullnode", t.shard))
        return resent and not fresh_any

    def _answer_sample(self, delay: float) -> None:
        if self._srtt is None:
            self._srtt, self._rttvar = delay, delay / 2
        else:
            self._rttvar += ANSWER_VAR_GAIN * (abs(self._srtt - delay) - self._rttvar)
            self._srtt += ANSWER_GAIN * (delay - self._srtt)

    def _answer_time(self) -> float:
        """The observed answer time srtt + 4 rttvar (0 before the first sample), at most
        resend_interval * 2**RESEND_BACKOFF_MAX."""
        if self._srtt is None:
            return 0.0
        return min(self._srtt + 4 * self._rttvar, self.resend_interval * (1 << RESEND_BACKOFF_MAX))

    def _silent_limit(self) -> float:
        """silent_after, or the observed answer time when longer (a validator answering as
        slowly as every other one is not silent)."""
        return max(self.silent_after, self._answer_time())

    def wave_interval(self) -> float:
        """Seconds before a message's next wave (module doc, ANSWER_GAIN): resend_interval,
        or the observed answer time when longer (at most resend_interval *
        2**RESEND_BACKOFF_MAX)."""
        return max(self.resend_interval, self._answer_time())

    def _next_wave(self, t: _Tracked, resent: bool, now: float) -> float:
        """When the next wave of `t` is due (module constant RESEND_BACKOFF_MAX)."""
        if resent:
            t.rewaves += 1
        return now + max(self.resend_interval * (1 << min(t.rewaves, RESEND_BACKOFF_MAX)), self.wave_interval())

    def _scan(self, now: float) -> None:
        """Early waves (silent_after) of unanswered messages that are due; remembers the
        earliest one not due yet."""
        self._scan_at = now
        nxt = None
        # the same for every message of one scan (it was computed per message: at 100/s past
        # saturation, ~700 unanswered messages x 12 scans/s made _scan 29% of the full node's CPU)
        limits = (self._silent_limit(), self.wave_interval()) if self.silent_after is not None else None
        for mid in list(self._unanswered):
            t = self._tracked.get(mid)
            if t is None or t.answered:
                self._unanswered.discard(mid)
                continue
            if now >= t.next_send or (e := self._silent_at(t, limits)) is None:
                continue
            if now >= e:
                # every validator it went to fell silent while others answer: one early wave
                t.early = True
                self.stats["early_waves"] += 1
                t.next_send = self._next_wave(t, self._wave(t, now), now)
                heapq.heappush(self._heap, (min(t.next_send, t.deadline), mid))
            elif nxt is None or e < nxt:
                nxt = e
        self._silent_next = nxt

    def _silent_at(self, t: _Tracked, limits: tuple[float, float] | None = None) -> float | None:
        """When every validator an unanswered message went to is silent (silent_after) or
        has left it unanswered that long since its send to it (the observed answer time when
        longer: _silent_limit), if
        its early wave is not used up and some validator answered within the resend
        interval before that moment; else None. limits: (_silent_limit(), wave_interval())
        when the caller has them (computed here otherwise)."""
        if self.silent_after is None or t.early or t.answered or not t.sent:
            return None
        unheard = self._unheard_since
        last = -1e18
        for k, sent_at in t.sent.items():
            # a silent validator: since its first unanswered send; one that answers other
            # messages and not this one: since this message's send to it (the datagram or
            # its receipts were lost)
            u = unheard.get(k, sent_at)
            if u > last:
                last = u
        quiet, wave = limits if limits is not None else (self._silent_limit(), self.wave_interval())
        at = last + quiet + 1e-6
        return at if at - self._heard_at <= wave else None

    def _tick(self, now: float, scan: bool = True) -> None:
        """Due waves and deadlines (heap); with `scan`, the early-wave scan when SILENT_SCAN
        passed since the last one or its earliest early wave is due; expiries."""
        while self._heap and self._heap[0][0] <= now:
            when, mid = heapq.heappop(self._heap)
            if self._stale(when, mid):
                continue
            t = self._tracked[mid]
            if now >= t.deadline:
                signed = self._own_receipt(t.msg.id, Timeout(), now)
                self._events.append(ReceiptEvent(t.msg.id, signed.open(), signed.signature, "fullnode", t.shard))
                self._finish(t, "timeout", "Timeout", f"no final status within {self.lifetime:g} s", now)
                continue
            t.next_send = self._next_wave(t, self._wave(t, now), now)
            if t.msg.id in self._tracked:
                heapq.heappush(self._heap, (min(t.next_send, t.deadline), mid))
        if scan and (now >= self._scan_at + SILENT_SCAN
                     or (self._silent_next is not None and now >= self._silent_next)):
            self._scan(now)
        while self._finished:
            mid, until = next(iter(self._finished.items()))
            if until > now:
                break
            del self._finished[mid]
        while self._late:
            mid, late = next(iter(self._late.items()))
            if late.until > now:
                break
            del self._late[mid]
            if not late.settled:
                self._events.append(MessageSettled(mid, "grace"))


def submitted_message_id(boc: bytes, parsed: ExternalMessage | None = None) -> bytes:
    """The 32-byte id RempClient.submit gives `boc`: its root cell hash (`parsed.id` when the
    caller parsed it, messages.message_id_of otherwise), or the sha256 of the bytes when the
    BOC does not decode (a RejectedByFullnode receipt still names it)."""
    if parsed is not None and parsed.boc == boc:
        return parsed.id
    return message_id_of(boc) or hashlib.sha256(bytes(boc)).digest()


def _order_key(receipt: Receipt) -> tuple[int, int, int]:
    """Order of ONE validator's receipts for one message: (timestamp ms, 1 for a
    source-final kind else 0, level). A validator's statuses only move forward in its own
    time; within one millisecond an end (RejectedBy*/Timeout, e.g. a Timeout right after an
    IgnoredByMasterchain at a session switch) comes after any non-final status, and higher
    levels come after lower ones (seed: remp-protocol-b, "Message statuses")."""
    st = receipt.status
    return (receipt.timestamp, 1 if is_source_final(kind_of(st)) else 0, int(st.level))


#: Shard ident as 16 hex digits (event log attribute `shard`): shards.shard_hex.
shard_label = shard_hex
