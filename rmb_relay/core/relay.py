"""The relay core: per-session state, routing, lookups and federation for envelopes from
connected peers, without I/O and without a clock (DESIGN.md section 2).

Inputs (aioquic style; `now` is float unix seconds from the caller, the daemon's wall
clock, because envelope expiry compares with the envelopes' unix timestamps; the daemon
turns `get_timer()` into a loop-time delay):

  peer_connected(conn, session, now)       an authenticated connection for (twin, sid)
  peer_disconnected(conn, now, reason, lost) that connection closed (lost: no close handshake)
  queue_read(conn, entries, now)           the answer to ReadQueue (offline replay)
  replay_written(conn, done, now)          the answer to ReplayFrames
  queue_acked(conn, more, now)             the answer to AckQueue
  queue_failed(conn, reason, now)          ReadQueue / AckQueue failed (Redis)
  queue_probed(ok, now)                    the answer to ProbeQueue
  receive_frame(conn, data, now)           one binary frame from a peer
  twin_resolved(twin, record | error, now) the answer to a LookupTwin command
  enqueued(token, outcome, now)            the answer to an Enqueue command
  federation_result(job, outcome, now, status, reason)  the answer to a PostFederation
  handle_timer(now)                        at or after get_timer()

Outputs, drained with next_event() (dataclasses under RelayCommand, fields documented):
WriteFrame, Enqueue, ReadQueue, ReplayFrames, AckQueue, ProbeQueue, LookupTwin,
PostFederation, CloseConnection, Log, FederationAnswer.

Per-session states (table `_TRANSITIONS`): replaying -replayed-> live; replaying|live
-closed|replaced-> closed. An impossible transition raises RelayStateError naming the
state and the input. Errors: remote errors (rmb_peer.errors.RmbRemoteError subclasses
such as EnvelopeError) never leave the core: garbage from a peer becomes a reply, a drop
or a close command; RelayStateError (a RelayCoreError, an RmbLocalError: local misuse)
does.

Twin records: the core keeps its own table (record, fetched at) under the shared rule
rmb_peer.twins.TwinFreshness(twin_ttl, twin_max_stale): a fresh record is used; a stale
one is used AND a refresh is asked for (stale-while-revalidate); otherwise the envelope waits in a per-twin
chain (in arrival order) for one LookupTwin, so a slow lookup delays only that twin.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

from rmb_peer.challenge import verify_envelope
from rmb_peer.envelope import (
    Envelope, EnvelopeError, address_str, deadline, is_expired, message_kind, parse_envelope,
    relay_error,
)
from rmb_peer.identity import SignatureError
from rmb_peer.freshness import TwinFreshness
from rmb_relay.core.commands import (
    AckQueue, CloseConnection, Enqueue, FederationAnswer, Log, LookupTwin, ProbeQueue, ReadQueue,
    RelayCommand, ReplayFrames, WriteFrame,
)
from rmb_relay.core.errors import (
    CLOSE_INVALID, CLOSE_REPLACED, ERR_BAD_SIGNATURE, ERR_EXPIRED, ERR_FEDERATION_FULL,
    ERR_FED_RATE, ERR_MISSING_DESTINATION, ERR_NOT_HERE, ERR_OFFLINE, ERR_QUEUE_FULL,
    ERR_RATE_LIMIT, ERR_SHARE_FULL, ERR_UNKNOWN_DESTINATION, ERR_UNKNOWN_SOURCE, ERR_UNSIGNED,
    TAG_FAIL_FAST, RelayStateError,
)
from rmb_relay.core.federation import (
    FederationAccepted, FederationAttemptFailed, FederationCircuit, FederationExpired,
    FederationRefused, FederationScheduler, Ranker,
)
from rmb_relay.core.limits import NoLimit
from rmb_relay.core.routing import (
    FORWARD, Drop, Federate, Forward, Local, RelayRouter, Refuse, Reply, Session, session_of,
    session_str,
)

@dataclass
class _FedRequest:
    request: Any
    env: Envelope
    data: bytes
    origin: str
    #: twin id -> record or exception, for the twins this request needed looked up
    resolved: dict


@dataclass
class _Conn:
    conn: Any
    session: Session
    name: str
    state: str = "replaying"
    #: Enqueues issued for this session since it connected, and that count when the
    #: running ReadQueue was issued (an XADD started meanwhile means: read again)
    enqueues: int = 0
    read_mark: int = 0
    #: a replay (ReadQueue .. its last AckQueue) runs; `late`: it drains what a Redis
    #: failure left while the session is already live; `waiting`: it found the stream
    #: empty while Enqueues were in flight and reads again when they are answered
    replaying: bool = False
    late: bool = False
    waiting: bool = False
    #: deliveries written to this connection that a lost connection may not have carried:
    #: (written at, envelope, bytes), oldest first, and their total size
    unconfirmed: collections.deque = None
    unconfirmed_bytes: int = 0


def _fail_fast(env: Envelope) -> bool:
    return env.HasField("tags") and TAG_FAIL_FAST in env.tags.replace(",", " ").split()


def _src(env: Envelope) -> str:
    return address_str(env.source) if env.HasField("source") else ""


def _lenient(data: bytes) -> Envelope | None:
    env = Envelope()
    try:
        env.ParseFromString(bytes(data))
    except Exception:  # noqa: BLE001 - any decode failure: not an envelope
        return None
    return env if env.uid else None


class RelayCore:
    """See the module docstring. domains: this relay's domains; limiter: a
    FixedWindowLimiter or NoLimit; max_size: largest envelope (bytes); queue_ttl: s an
    offline envelope is kept at most; twin_ttl / twin_max_stale: s (see module doc)."""

    _TRANSITIONS = {
        ("replaying", "replayed"): "live",
        ("replaying", "closed"): "closed",
        ("live", "closed"): "closed",
        ("replaying", "replaced"): "closed",
        ("live", "replaced"): "closed",
    }

    def __init__(self, domains, *, limiter=None, ranker: Ranker | None = None,
                 federation: FederationScheduler | None = None, max_size: int = 1 << 20,
                 queue_ttl: float = 3600.0, twin_ttl: float = 60.0,
                 twin_max_stale: float = 3600.0, max_twins: int = 100_000,
                 federation_limiter=None, verify_federation: bool = True,
                 unconfirmed_s: float = 0.0, max_unconfirmed: int = 4096,
                 max_unconfirmed_bytes: int = 8 << 20):
        self.router = RelayRouter(domains, limiter)
        # `is None`, not `or`: an empty scheduler has len() 0 and is falsy, and `or` silently
        # replaced the caller's scheduler with a new one (the daemon's metrics read the other)
        self.ranker = ranker if ranker is not None else Ranker()
        self.federation = federation if federation is not None else FederationScheduler(self.ranker)
        self.max_size = max_size
        self.queue_ttl = queue_ttl
        #: the twin table's rule (rmb_peer.twins.TwinFreshness, shared with the peer)
        self.freshness = TwinFreshness(twin_ttl, twin_max_stale)
        self.max_twins = max_twins
        self._sessions: dict[Session, _Conn] = {}
        self._conns: dict[Any, _Conn] = {}
        self._twins: collections.OrderedDict[int, tuple[Any, float]] = collections.OrderedDict()
        self._chains: dict[int, collections.deque] = {}
        self._refreshing: set[int] = set()
        self._pending: dict[int, tuple[Any, Envelope, Session]] = {}
        #: Enqueues in flight per destination session (offline replay waits for them)
        self._enqueuing: dict[Session, int] = {}
        #: connections whose replay a Redis failure stopped, and when to probe Redis again
        self._stalled: dict[Any, _Conn] = {}
        self._retry_at: float | None = None
        #: conn -> (session, [(entry id, sender)]) of the batch handed out with ReplayFrames
        #: (kept past a disconnect: what was written is still deleted)
        self._batches: dict[Any, tuple[Session, list]] = {}
        self._replaced: dict[Any, _Conn] = {}
        self._resolved: dict[int, Any] = {}
        #: federation-in: per source relay window, requests waiting for twin lookups
        self.fed_limiter = federation_limiter or NoLimit()
        self.verify_federation = verify_federation
        #: a lost connection's deliveries of the last `unconfirmed_s` s are queued again
        #: (0: never), at most `max_unconfirmed` frames / `max_unconfirmed_bytes` each
        self.unconfirmed_s = unconfirmed_s
        self.max_unconfirmed = max_unconfirmed
        self.max_unconfirmed_bytes = max_unconfirmed_bytes
        self._fed_waiting: dict[int, list[_FedRequest]] = {}
        #: background refreshes of stale twin records asked for (tests, metrics)
        self.refreshes = 0
        self._token = 0
        self._out: collections.deque[RelayCommand] = collections.deque()

    # ------------------------------------------------------------------ helpers
    @property
    def twin_ttl(self) -> float:
        return self.freshness.ttl

    @twin_ttl.setter
    def twin_ttl(self, value: float) -> None:
        self.freshness = TwinFreshness(value, self.freshness.max_stale)

    def _move(self, c: _Conn, inp: str) -> None:
        new = self._TRANSITIONS.get((c.state, inp))
        if new is None:
            raise RelayStateError(f"connection {c.name}: no transition from state "
                                  f"{c.state!r} on input {inp!r}")
        c.state = new

    def _log(self, event: str, uid, level: str = "info", **attrs) -> None:
        self._out.append(Log(event, uid, level, attrs))

    def _send_to_session(self, session: Session, reply: Envelope, now: float) -> None:
        """A relay error for a sender that may have reconnected or gone offline since:
        its live connection, else its offline queue."""
        target = self._sessions.get(session)
        data = reply.SerializeToString()
        if target is not None and target.state == "live":
            self._out.append(WriteFrame(target.conn, data, session))
            return
        self._enqueue(None, session, reply, data, "error", "", now)

    def _enqueue(self, sender, session: Session, env: Envelope, data: bytes, kind: str,
                 src: str, now: float) -> None:
        """One Enqueue command; counted in flight for `session` until enqueued() answers
        (offline replay goes live only when none is in flight: the order rule below)."""
        self._token += 1
        self._pending[self._token] = (sender, env, session)
        self._enqueuing[session] = self._enqueuing.get(session, 0) + 1
        c = self._sessions.get(session)
        if c is not None:
            c.enqueues += 1
        until = min(float(deadline(env)), now + self.queue_ttl)
        self._out.append(Enqueue(self._token, session, data, until, env.uid, kind, src))

    def _reply_to(self, session: Session, env: Envelope, text: str) -> None:
        """A relay error to a request's sender (drop for other kinds), logged."""
        self._log("rmb.relay.rejected", env.uid, "warning", reason=text, src=_src(env),
                  dst=address_str(env.destination) if env.HasField("destination") else "")
        if message_kind(env) != "request":
            return
        target = self._sessions.get(session)
        if target is not None and target.state != "closed":
            self._out.append(WriteFrame(target.conn, relay_error(env, text).SerializeToString()))

    def next_event(self) -> RelayCommand | None:
        return self._out.popleft() if self._out else None

    def get_timer(self) -> float | None:
        """Unix s of the next federation backoff or deadline, or of the next Redis probe
        while replays stopped by a Redis failure wait."""
        fed = self.federation.get_timer()
        retry = self._retry_at
        if retry is None:
            return fed
        return retry if fed is None or retry < fed else fed

    def handle_timer(self, now: float) -> None:
        self.federation.handle_timer(now)
        self._pump_federation(now)
        if self._retry_at is not None and now >= self._retry_at:
            self._retry_at = None
            self._stalled = {k: c for k, c in self._stalled.items() if self._conns.get(k) is c}
            if self._stalled:
                self._out.append(ProbeQueue())

    def state_of(self, session: Session) -> str | None:
        c = self._sessions.get(session)
        return c.state if c is not None else None

    # ------------------------------------------------------------------ sessions
    def peer_connected(self, conn: Any, session: Session, now: float) -> None:
        if conn in self._conns:
            raise RelayStateError(f"connection {session_str(session)}: no transition from "
                                  f"state {self._conns[conn].state!r} on input 'connected'")
        c = _Conn(conn, session, session_str(session))
        old = self._sessions.get(session)
        if old is not None:
            self._move(old, "replaced")
            del self._conns[old.conn]
            self._replaced[old.conn] = old     # its disconnect still gets logged
            self._out.append(CloseConnection(old.conn, CLOSE_REPLACED,
                                             "replaced by a newer connection"))
            del self._sessions[session]
            # the twin came back on a new connection: it gave the old one up (its own
            # keepalive found it silent), so what was written to it lately may be lost
            self._requeue(old, now, "replaced by a newer connection")
        self._sessions[session] = c
        self._conns[conn] = c
        self._log("rmb.relay.connected", None, src=c.name)
        self._read(c, False)

    def peer_disconnected(self, conn: Any, now: float, reason: str = "closed by peer",
                          lost: bool = False) -> None:
        """`lost`: the connection died without a close handshake (no pong to the heartbeat,
        a transport error): the deliveries written to it in the last `unconfirmed_s` s
        (whose TCP segments a cut link may have swallowed; a heartbeat notices a silent
        peer 1.5 heartbeats after it last heard from it) are queued again for the session,
        unexpired ones, in their order, and replayed when it reconnects. The receiving
        peer drops a request it already got (same source and uid), so a delivery that
        did arrive is not served twice. rmb-rs loses them (what a dead socket took)."""
        c = self._conns.pop(conn, None)
        if c is None:
            old = self._replaced.pop(conn, None)     # replaced: closed by our command
            if old is not None:
                self._log("rmb.relay.disconnected", None, src=old.name,
                          reason="replaced by a newer connection")
            return
        self._move(c, "closed")
        self._stalled.pop(conn, None)
        if self._sessions.get(c.session) is c:
            del self._sessions[c.session]
        self._log("rmb.relay.disconnected", None, src=c.name, reason=reason[:200])
        if lost:
            self._requeue(c, now, f"connection lost: {reason}")
        else:
            c.unconfirmed, c.unconfirmed_bytes = None, 0

    def _requeue(self, c: _Conn, now: float, reason: str) -> None:
        """Queues again for `c`'s session the unexpired deliveries written to `c` in the
        last `unconfirmed_s` s, in their order (offline stream, replayed on reconnect),
        and logs `rmb.relay.requeued`. For a connection lost without a close handshake and
        for one its twin replaced with a newer connection (the twin's keepalive gave the old
        one up before the relay's heartbeat did: a cut link either way)."""
        q, c.unconfirmed, c.unconfirmed_bytes = c.unconfirmed, None, 0
        if not q:
            return
        horizon = now - self.unconfirmed_s
        again = [(env, data) for t, env, data in q if t >= horizon and not is_expired(env, now)]
        for env, data in again:
            self._enqueue(None, c.session, env, data, message_kind(env), _src(env), now)
        if again:
            self._log("rmb.relay.requeued", None, src=c.name, count=len(again),
                      reason=reason[:200])

    # ------------------------------------------------------------------ offline replay
    # On (re)connect the session's offline stream is replayed in order: ReadQueue (a
    # batch) -> queue_read -> ReplayFrames (deliveries and drops, in stream order) ->
    # replay_written -> AckQueue (XDEL of what was written or dropped) -> queue_acked ->
    # the next ReadQueue. Envelopes for a session still replaying are queued behind the
    # stream (Enqueue), so order is kept; the session goes live when a read finds the
    # stream empty with no Enqueue for it in flight and none issued since the read began.
    # A Redis failure (queue_failed) lets the session go live at once; what the stream
    # still holds is drained by a late replay once a ProbeQueue finds Redis answering
    # (probed every RETRY_S s), older entries then arriving after the live ones.

    #: seconds between Redis probes while replays stopped by a Redis failure wait
    RETRY_S = 1.0
    #: entries read per ReadQueue
    BATCH = 256

    def _read(self, c: _Conn, late: bool) -> None:
        c.replaying, c.late, c.waiting = True, late, False
        c.read_mark = c.enqueues
        self._out.append(ReadQueue(c.conn, c.session, late, self.BATCH))

    def _replay_over(self, c: _Conn) -> None:
        c.replaying = c.waiting = False
        if c.state == "replaying":
            self._move(c, "replayed")

    def queue_replayed(self, conn: Any, now: float) -> None:
        """The adapter replayed the whole queue itself: the session goes live. Raises
        RelayStateError for a session that is live already."""
        c = self._conns.get(conn)
        if c is None:
            return      # closed meanwhile
        c.replaying = c.waiting = False
        self._move(c, "replayed")

    def queue_read(self, conn: Any, entries: list, now: float) -> None:
        """The answer to ReadQueue: `entries` [(entry id, {b"e": envelope, b"d": deadline,
        b"t": queued at, b"s": sender twin})] in stream order (at most the batch size).
        Decides each entry: expired (dropped, rmb.relay.expired), malformed (dropped,
        rmb.relay.bug), else delivered; hands them out as one ReplayFrames."""
        c = self._conns.get(conn)
        if c is None or not c.replaying:
            return      # closed meanwhile
        if not entries:
            if c.late:
                self._replay_over(c)
            elif self._enqueuing.get(c.session, 0):
                c.waiting = True                  # read again when enqueued() answers
            elif c.enqueues != c.read_mark:
                self._read(c, False)              # an XADD started and ended meanwhile
            else:
                self._replay_over(c)
            return
        items: list[tuple[bytes, bytes | None, Log | None]] = []
        batch: list[tuple[bytes, bytes | None]] = []
        for entry_id, fields in entries:
            batch.append((entry_id, fields.get(b"s")))
            try:                                   # the queue item guard
                data = fields[b"e"]
                until = float(fields[b"d"])
                queued_at = float(fields.get(b"t", now))
            except (KeyError, ValueError) as exc:   # malformed: dropped, logged as a bug
                items.append((entry_id, None, Log(
                    "rmb.relay.bug", None, "error",
                    {"src": f"offline queue entry {entry_id!r} of {c.name}",
                     "reason": f"{type(exc).__name__}: {exc}"[:300]})))
                continue
            queued = _lenient(data)                # it parsed when it was queued
            uid = queued.uid if queued is not None else None
            kind = message_kind(queued) if queued is not None else None
            src = _src(queued) if queued is not None else None
            if until <= now:
                items.append((entry_id, None, Log(
                    "rmb.relay.expired", uid, "info",
                    {"kind": kind, "src": src, "dst": c.name,
                     "reason": "expired in the offline queue"})))
                continue
            items.append((entry_id, data, Log(
                "rmb.relay.delivered", uid, "info",
                {"kind": kind, "src": src, "dst": c.name, "size": len(data),
                 "queued_ms": max(0.0, (now - queued_at) * 1000.0)})))
        self._batches[conn] = (c.session, batch)
        self._out.append(ReplayFrames(conn, c.session, items))

    def replay_written(self, conn: Any, done: int, now: float) -> None:
        """The answer to ReplayFrames: its first `done` items were written (or dropped);
        the rest were not (the connection closed). Asks to delete those entries."""
        session, batch = self._batches.pop(conn, (None, []))
        gone = batch[:done]
        senders: dict[bytes, int] = {}
        for _entry_id, sender in gone:
            if sender is not None:
                senders[sender] = senders.get(sender, 0) + 1
        if gone:
            self._out.append(AckQueue(conn, session, [e for e, _ in gone], senders,
                                      done == len(batch)))
            return
        c = self._conns.get(conn)
        if c is not None:
            c.replaying = False                    # nothing written: the connection closed

    def queue_acked(self, conn: Any, more: bool, now: float) -> None:
        """The answer to AckQueue: the entries are deleted; `more`: the whole batch went
        (the next batch is read), else the replay ends (the connection closed)."""
        c = self._conns.get(conn)
        if c is None or not c.replaying:
            return
        if more:
            self._read(c, c.late)
        else:
            c.replaying = False

    def queue_failed(self, conn: Any, reason: str, now: float) -> None:
        """A ReadQueue or AckQueue failed (Redis timeout or error; `reason` its repr):
        the session goes live at once (live traffic must not wait on a broken queue), the
        replay is resumed by a late replay once Redis answers."""
        c = self._conns.get(conn)
        if c is None:
            return
        late = c.late
        c.replaying = c.waiting = False
        self._batches.pop(conn, None)
        if not late and c.state == "replaying":
            self._move(c, "replayed")
        self._log("rmb.relay.queue_error", None, "error", dst=c.name,
                  reason=f"replay stopped: {reason}; resumed once Redis answers"[:200])
        self._stalled[conn] = c
        if self._retry_at is None:
            self._retry_at = now + self.RETRY_S

    def queue_probed(self, ok: bool, now: float) -> None:
        """The answer to ProbeQueue: Redis answered (`ok`) or not. On an answer every
        stopped replay whose connection is still its session's current one resumes late."""
        if not ok:
            if self._stalled and self._retry_at is None:
                self._retry_at = now + self.RETRY_S
            return
        stalled, self._stalled = self._stalled, {}
        for conn, c in stalled.items():
            if self._conns.get(conn) is c and not c.replaying:
                self._read(c, True)

    def stalled(self) -> int:
        """Connections whose replay waits for Redis to answer again."""
        return len(self._stalled)

    # ------------------------------------------------------------------ frames
    def receive_frame(self, conn: Any, data: bytes, now: float) -> None:
        c = self._conns.get(conn)
        if c is None:
            raise RelayStateError(f"connection {conn!r}: no transition from state 'closed' "
                                  "on input 'frame'")
        try:
            env = parse_envelope(data, self.max_size, allow_ping_without_destination=True)
        except EnvelopeError as exc:
            self._bad_frame(c, data, exc)
            return
        # The hot path: a request/response/error from a correctly sourced, unexpired
        # envelope with no rate limit configured is what RelayRouter.check_inbound calls
        # Forward; each protobuf field is read once here (field reads are most of the
        # core's cost per envelope). Anything else (a rate limiter, a ping, a wrong source,
        # expired, no message) takes check_inbound for the verdict: this test only ever
        # short-cuts to the same Forward (tests/test_relay_core_fastpath.py checks they
        # agree). A router whose check_inbound is not RelayRouter's own (a subclass, or
        # one replaced on the instance, e.g. a test's injected fault) always decides.
        kind = env.WhichOneof("message")
        router = self.router
        if (kind is not None and kind != "ping" and type(router.limiter) is NoLimit
                and type(router) is RelayRouter and "check_inbound" not in router.__dict__
                and env.HasField("source")):
            src = env.source
            sid = c.session[1]
            fast = src.twin == c.session[0] and (
                not src.HasField("connection") if sid is None
                else src.HasField("connection") and src.connection == sid) and (
                env.timestamp + env.expiration > now)
        else:
            fast = False
        verdict = FORWARD if fast else router.check_inbound(c.session, env, len(data), now)
        if type(verdict) is Forward:
            d = env.destination
            dst = (d.twin, d.connection if d.HasField("connection") else None)
            target = self._sessions.get(dst)
            if target is not None and target.state == "live":
                # the live local route, one `forwarded` event (received and delivered in
                # one loop pass; DESIGN.md section 6)
                self._written(target, env, data, now)
                self._out.append(WriteFrame(target.conn, data, dst, Log(
                    "rmb.relay.forwarded", env.uid, "info",
                    {"kind": kind or "none", "src": c.name, "dst": target.name,
                     "size": len(data)})))
                return
            self._log("rmb.relay.received", env.uid, kind=message_kind(env), src=c.name,
                      dst=address_str(env.destination), size=len(data))
            self._forward(c.session, env, bytes(data), now)
        elif type(verdict) is Reply:
            if verdict.reason == "ping":
                self._log("rmb.relay.answered", env.uid, kind="pong", dst=c.name)
            elif verdict.reason == ERR_RATE_LIMIT:
                self._log("rmb.relay.rate_limited", env.uid, "warning", src=c.name,
                          size=len(data))
            else:
                self._log("rmb.relay.rejected", env.uid, "warning", reason=verdict.reason,
                          src=_src(env), dst=address_str(env.destination))
            self._out.append(WriteFrame(conn, verdict.envelope.SerializeToString()))
        elif type(verdict) is Drop:
            if verdict.reason == ERR_EXPIRED:
                self._log("rmb.relay.expired", env.uid, kind=message_kind(env), src=_src(env),
                          dst=address_str(env.destination), reason="expired on arrival")
            else:
                self._log("rmb.relay.rejected", env.uid, "warning", reason=verdict.reason,
                          src=_src(env), dst=address_str(env.destination))

    def _bad_frame(self, c: _Conn, data: bytes, exc: EnvelopeError) -> None:
        env = _lenient(data)
        text = str(exc)
        if env is None:         # not an envelope at all: rmb-rs closes, so do we
            self._log("rmb.relay.rejected", None, "warning", reason=text[:200], src=c.name,
                      dst="")
            self._out.append(CloseConnection(c.conn, CLOSE_INVALID, text[:120]))
            return
        if len(data) <= self.max_size and (not env.HasField("destination")
                                           or env.destination.twin == 0):
            text = ERR_MISSING_DESTINATION
        self._reply_to(c.session, env, text)

    def _forward(self, sender: Session, env: Envelope, data: bytes, now: float) -> None:
        dst = session_of(env.destination)
        target = self._sessions.get(dst)
        if target is not None:
            self._deliver(sender, dst, env, data, now, target)
            return
        chain = self._chains.get(dst[0])
        if chain is not None:
            chain.append((sender, env, data))
            return
        hit = self._twins.get(dst[0])
        if hit is not None:
            record, at = hit
            age = now - at
            if self.freshness.servable(age):
                if not self.freshness.fresh(age) and dst[0] not in self._refreshing:
                    self._refreshing.add(dst[0])
                    self.refreshes += 1
                    self._out.append(LookupTwin(dst[0]))
                self._route(sender, env, data, now, record)
                return
        self._chains[dst[0]] = collections.deque([(sender, env, data)])
        self._out.append(LookupTwin(dst[0]))

    def _written(self, c: _Conn, env: Envelope, data: bytes, now: float) -> None:
        """Remember a delivery written to `c` for `unconfirmed_s` s (see peer_disconnected)."""
        if self.unconfirmed_s <= 0:
            return
        q = c.unconfirmed
        if q is None:
            q = c.unconfirmed = collections.deque()
        q.append((now, env, data))
        c.unconfirmed_bytes += len(data)
        horizon = now - self.unconfirmed_s
        while q and (q[0][0] < horizon or len(q) > self.max_unconfirmed
                     or c.unconfirmed_bytes > self.max_unconfirmed_bytes):
            c.unconfirmed_bytes -= len(q.popleft()[2])

    def _deliver(self, sender: Session | None, dst: Session, env: Envelope, data: bytes, now: float,
                 target: _Conn | None) -> None:
        if target is not None and target.state == "live":
            self._written(target, env, data, now)
            self._out.append(WriteFrame(target.conn, data, dst, Log(
                "rmb.relay.delivered", env.uid, "info",
                {"kind": message_kind(env), "src": _src(env), "dst": target.name,
                 "size": len(data), "queued_ms": 0.0})))
            return
        self._enqueue(sender, dst, env, data, message_kind(env), _src(env), now)

    def write_failed(self, cmd: WriteFrame, now: float) -> None:
        """A delivery WriteFrame whose connection closed meanwhile: queue it instead."""
        if cmd.session is None:
            return                      # a reply to a sender that is gone: nothing to do
        env = _lenient(cmd.data)
        if env is None:
            return
        self._enqueue(None, cmd.session, env, cmd.data, message_kind(env), _src(env), now)

    def receive_federation(self, request: Any, data: bytes, origin: str, now: float) -> None:
        """POST / from another relay (authenticated and bounded);
        answered with one FederationAnswer(request, status, text), possibly after
        LookupTwin commands. In order: per-source-relay window (`federation_limiter`, key
        = `origin`, the remote address: 429), parse (400), expired (400), source present
        (401: unsigned relay errors are never federated), destination twin known (404,
        nothing queued for unknown twins) and served here (421), source twin known and the
        signature valid for its account key (401: spoofed sources refused; rmb-rs verifies
        nothing here), fail-fast offline (404), queue full (429), else 202."""
        if not self.fed_limiter.allow(origin, len(data), now):
            self._answer(request, 429, ERR_FED_RATE, None, origin)
            return
        try:
            env = parse_envelope(data, self.max_size)
        except EnvelopeError as exc:
            self._answer(request, 400, str(exc), None, origin)
            return
        self._log("rmb.relay.federation_received", env.uid, kind=message_kind(env),
                  src=_src(env), dst=address_str(env.destination), size=len(data))
        if is_expired(env, now):
            self._log("rmb.relay.expired", env.uid, kind=message_kind(env), src=_src(env),
                      dst=address_str(env.destination), reason="expired on federation arrival")
            self._out.append(FederationAnswer(request, 400, ERR_EXPIRED))
            return
        if not env.HasField("source") or env.source.twin == 0:
            self._answer(request, 401, ERR_UNSIGNED, env, origin)
            return
        self._federation_step(_FedRequest(request, env, bytes(data), origin, {}), now)

    def _record_for(self, req: _FedRequest, twin: int, now: float):
        """The record (or lookup error) for `twin`, or None after asking for a lookup."""
        if twin in req.resolved:
            return req.resolved[twin]
        hit = self._twins.get(twin)
        if hit is not None and self.freshness.servable(now - hit[1]):
            if not self.freshness.fresh(now - hit[1]) and twin not in self._refreshing:
                self._refreshing.add(twin)
                self.refreshes += 1
                self._out.append(LookupTwin(twin))
            return hit[0]
        waiting = self._fed_waiting.setdefault(twin, [])
        if not waiting and twin not in self._chains and twin not in self._refreshing:
            self._refreshing.add(twin)
            self._out.append(LookupTwin(twin))
        waiting.append(req)
        return None

    def _federation_step(self, req: _FedRequest, now: float) -> None:
        env, origin = req.env, req.origin
        dst = session_of(env.destination)
        if self.verify_federation:
            record = self._record_for(req, dst[0], now)
            if record is None:
                return
            if isinstance(record, BaseException):
                if type(record).__name__ == "UnknownTwin":
                    self._answer(req.request, 404, ERR_UNKNOWN_DESTINATION, env, origin)
                else:
                    self._answer(req.request, 503, f"failed to get twin details: {record}"[:300],
                                 env, origin)
                return
            if not self.router.is_local(record.relays):
                self._answer(req.request, 421, ERR_NOT_HERE, env, origin)
                return
            source = self._record_for(req, env.source.twin, now)
            if source is None:
                return
            if isinstance(source, BaseException):
                if type(source).__name__ == "UnknownTwin":
                    self._answer(req.request, 401, ERR_UNKNOWN_SOURCE, env, origin)
                else:
                    self._answer(req.request, 503, f"failed to get twin details: {source}"[:300],
                                 env, origin)
                return
            try:
                verify_envelope(env, source.account)
            except SignatureError as exc:
                self._answer(req.request, 401, f"{ERR_BAD_SIGNATURE}: {exc}"[:300], env, origin)
                return
        target = self._sessions.get(dst)
        if target is None and _fail_fast(env):
            self._log("rmb.relay.rejected", env.uid, "info", reason=ERR_OFFLINE, src=_src(env),
                      dst=session_str(dst))
            self._out.append(FederationAnswer(req.request, 404, ERR_OFFLINE))
            return
        if target is not None and target.state == "live":
            self._written(target, env, req.data, now)
            self._out.append(WriteFrame(target.conn, req.data, dst, Log(
                "rmb.relay.delivered", env.uid, "info",
                {"kind": message_kind(env), "src": _src(env), "dst": target.name,
                 "size": len(req.data), "queued_ms": 0.0})))
            self._out.append(FederationAnswer(req.request, 202, ""))
            return
        self._enqueue(("federation", req.request, origin), dst, env, req.data,
                      message_kind(env), _src(env), now)

    def _answer(self, request: Any, status: int, text: str, env: Envelope | None,
                origin: str) -> None:
        self._out.append(FederationAnswer(
            request, status, text, env.uid if env is not None and env.uid else None,
            _src(env) if env is not None else "",
            address_str(env.destination) if env is not None and env.HasField("destination")
            else "", origin))

    def connected(self, session: Session) -> bool:
        """True while `session` has a connection (replaying or live)."""
        return session in self._sessions

    def enqueued(self, token: int, outcome: str, now: float) -> None:
        pending = self._pending.pop(token, None)
        if pending is None:
            raise RelayStateError(f"enqueue {token}: no transition from state 'done' on "
                                  f"input {outcome!r}")
        sender, env, session = pending
        left = self._enqueuing.get(session, 1) - 1
        if left > 0:
            self._enqueuing[session] = left
        else:
            self._enqueuing.pop(session, None)
            c = self._sessions.get(session)
            if c is not None and c.waiting:        # its replay waited for this XADD
                c.waiting = False
                self._read(c, c.late)
        if isinstance(sender, tuple) and sender[0] == "federation":
            _, request, origin = sender
            if outcome == "queued":
                self._log("rmb.relay.queued", env.uid, kind=message_kind(env), src=_src(env),
                          dst=address_str(env.destination), size=env.ByteSize())
                self._out.append(FederationAnswer(request, 202, ""))
            elif outcome == "full":
                self._answer(request, 429, ERR_QUEUE_FULL, env, origin)
            elif outcome == "share":
                self._answer(request, 429, ERR_SHARE_FULL, env, origin)
            else:
                self._answer(request, 503, "offline queue unavailable", env, origin)
            return
        if sender is None and outcome != "queued":
            self._log("rmb.relay.rejected", env.uid, "warning",
                      reason=ERR_QUEUE_FULL if outcome == "full" else ERR_SHARE_FULL
                      if outcome == "share" else "failed to queue message for offline twin",
                      src=_src(env), dst=address_str(env.destination))
            return
        if outcome == "queued":
            self._log("rmb.relay.queued", env.uid, kind=message_kind(env), src=_src(env),
                      dst=address_str(env.destination), size=env.ByteSize())
        elif outcome == "full":
            self._reply_to(sender, env, ERR_QUEUE_FULL)
        elif outcome == "share":
            self._reply_to(sender, env, ERR_SHARE_FULL)
        elif outcome == "failed":
            self._reply_to(sender, env, "failed to queue message for offline twin")
        else:
            raise RelayStateError(f"enqueue {token}: unknown outcome {outcome!r}")

    # ------------------------------------------------------------------ lookups
    def twin_resolved(self, twin: int, record: Any, now: float) -> None:
        """`record`: an object with `.relays` (list of domains), or an exception: an
        UnknownTwin-like error (`unknown=True` attribute or class name UnknownTwin) forgets
        the twin; any other error keeps a known record (stale-if-error)."""
        self._refreshing.discard(twin)
        is_error = isinstance(record, BaseException)
        unknown = is_error and type(record).__name__ == "UnknownTwin"
        if not is_error:
            self._twins[twin] = (record, now)
            self._twins.move_to_end(twin)
            while len(self._twins) > self.max_twins:
                self._twins.popitem(last=False)
            self._follow_twin(twin, record, now)
        elif unknown:
            self._twins.pop(twin, None)
        else:
            hit = self._twins.get(twin)
            if hit is not None and self.freshness.servable(now - hit[1]):
                self._log("rmb.relay.twin_stale", None, "warning", twin=twin,
                          stale_s=now - hit[1], reason=str(record)[:200])
                record, is_error = hit[0], False
        for req in self._fed_waiting.pop(twin, []):
            req.resolved[twin] = record
            self._federation_step(req, now)
        chain = self._chains.get(twin)
        if chain is None:
            return
        self._resolved[twin] = record
        while chain:
            sender, env, data = chain.popleft()
            self._route(sender, env, data, now, record)
        # the chain stays open (new envelopes for this twin keep queueing behind the ones
        # just routed) until the adapter has executed their commands: chain_done()

    def chain_done(self, twin: int, now: float) -> bool:
        """The adapter executed the commands of the envelopes routed for `twin` after its
        lookup. Routes envelopes that arrived meanwhile (their commands follow) and returns
        False, or closes the chain and returns True. Keeps per-twin order across the
        lookup (an envelope arriving while earlier ones are still being queued waits)."""
        chain = self._chains.get(twin)
        if chain is None:
            return True
        if not chain:
            del self._chains[twin]
            self._resolved.pop(twin, None)
            return True
        record = self._resolved.get(twin)
        while chain:
            sender, env, data = chain.popleft()
            self._route(sender, env, data, now, record)
        return False

    def _route(self, sender: Session, env: Envelope, data: bytes, now: float, record) -> None:
        dst = session_of(env.destination)
        if isinstance(record, BaseException):
            if type(record).__name__ == "UnknownTwin":
                self._reply_to(sender, env, ERR_UNKNOWN_DESTINATION)
            else:
                self._reply_to(sender, env, f"failed to get twin details: {record}"[:300])
            return
        route = self.router.route(list(record.relays))
        if isinstance(route, Local):
            target = self._sessions.get(dst)
            if target is None and _fail_fast(env):
                self._reply_to(sender, env, ERR_OFFLINE)
                return
            self._deliver(sender, dst, env, data, now, target)
        elif isinstance(route, Federate):
            job = self.federation.submit(env, data, route.domains, now, context=sender)
            if job is None:
                self._reply_to(sender, env, self.federation.refusal or ERR_FEDERATION_FULL)
                return
            self._pump_federation(now)
        elif isinstance(route, Refuse):
            self._reply_to(sender, env, route.text)

    # ------------------------------------------------------------------ federation
    #: a failed federation attempt asks for a fresh record of its destination twin when
    #: the one it used is at least this old (s): the twin may have moved to another relay
    FAILED_REFRESH_S = 2.0

    def _follow_twin(self, twin: int, record, now: float) -> None:
        """A fresh record of `twin`: its pending federation jobs follow its relays (a
        twin that moved, e.g. off a retired relay, is reached where it is now, instead
        of the old relay being retried until the TTL runs out); jobs for a twin that
        is now served here are delivered here (those not in flight)."""
        jobs = self.federation.jobs_for(twin)
        if not jobs:
            return
        route = self.router.route(list(record.relays))
        if isinstance(route, Federate):
            moved = [j for j in jobs if self.federation.retarget(j, route.domains, now)]
            if moved:
                self._log("rmb.relay.retargeted", None, twin=twin, count=len(moved),
                          domain=",".join(route.domains)[:200])
                self._pump_federation(now)
        elif isinstance(route, Local):
            taken = [job for j in jobs if (job := self.federation.withdraw(j)) is not None]
            for job in taken:
                dst = session_of(job.env.destination)
                self._deliver(job.context, dst, job.env, job.data, now, self._sessions.get(dst))
            if taken:
                self._log("rmb.relay.retargeted", None, twin=twin, count=len(taken),
                          domain="local")

    def drain_federation(self, now: float) -> int:
        """The relay is shutting down (its drain, DESIGN.md section 2): every pending
        federation job is tried now instead of after its backoff, and the record of each
        destination twin is looked up afresh (LookupTwin with fresh=True) so a twin that
        moved off a dead or retired relay is retargeted (rmb.relay.retargeted) before the
        leftovers are saved to the outbox, which only this relay's next start resumes.
        Returns the number of twins looked up."""
        self.federation.hurry(now)
        twins = [t for t in sorted(self.federation.twins())
                 if t not in self._refreshing and t not in self._chains]
        for twin in twins:
            self._refreshing.add(twin)
            self.refreshes += 1
            self._out.append(LookupTwin(twin, fresh=True))
        self.federation.handle_timer(now)
        self._pump_federation(now)
        return len(twins)

    def _refresh_after_failure(self, job: int, now: float) -> None:
        twin = self.federation.twin_of(job)
        if twin is None or twin in self._refreshing or twin in self._chains:
            return
        hit = self._twins.get(twin)
        if hit is not None and now - hit[1] < self.FAILED_REFRESH_S:
            return
        self._refreshing.add(twin)
        self.refreshes += 1
        self._out.append(LookupTwin(twin))

    def take(self) -> list[RelayCommand]:
        """Every pending command at once (what draining next_event() gives, as a list)."""
        out = list(self._out)
        self._out.clear()
        return out

    def _pump_federation(self, now: float) -> None:
        self._out.extend(self.federation.attempts_due(now))
        while (ev := self.federation.next_event()) is not None:
            if isinstance(ev, FederationAccepted):
                self._log("rmb.relay.federated", ev.uid, domain=ev.domain, attempt=ev.attempt,
                          duration_ms=ev.duration * 1000.0)
            elif isinstance(ev, FederationAttemptFailed):
                self._log("rmb.relay.federation_failed", ev.uid, "warning", domain=ev.domain,
                          attempt=ev.attempt, status=ev.status, reason=ev.reason)
                self._refresh_after_failure(ev.job, now)
            elif isinstance(ev, FederationCircuit):
                self._log("rmb.relay.circuit", None,
                          "warning" if ev.state == "open" else "info", domain=ev.domain,
                          count=ev.failures,
                          reason=(f"open: {ev.failures} consecutive failures, attempts "
                                  f"paused {ev.cooldown:.0f} s" if ev.state == "open"
                                  else "closed: the relay answered"))
            elif isinstance(ev, (FederationRefused, FederationExpired)):
                if isinstance(ev, FederationExpired):
                    self._log("rmb.relay.expired", ev.uid, "warning",
                              dst=session_str(ev.context) if ev.context else "",
                              reason=f"federation failed after {ev.attempts} attempts")
                else:
                    self._log("rmb.relay.federation_failed", ev.uid, "warning",
                              domain=ev.domain, attempt=ev.attempt, status=ev.status,
                              reason=ev.reason or "refused")
                if ev.reply is not None and ev.context is not None:
                    self._send_to_session(ev.context, ev.reply, now)

    def federation_result(self, job: int, outcome: str, now: float, status: int = 0,
                          reason: str = "") -> None:
        self.federation.report(job, outcome, now, status=status, reason=reason)
        self._pump_federation(now)
