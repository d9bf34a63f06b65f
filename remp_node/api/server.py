"""The full node's user API (DESIGN.md section 4), on the daemon's one HTTP port (aiohttp):

- ``POST /messages``: body = a message BOC, raw or base64 text (decode_body).
  202 ``{"message_id": hex}`` when accepted for processing; 400 ``{"error": ...}`` for a body
  that is not a BOC (no message id exists: counted as remp_api_refused{reason="undecodable"});
  413 when the body is larger than --max-body; 422 ``{"message_id", "kind":
  "RejectedByFullnode", "reason"}`` when the full node's checks refuse it (size, depth, not
  an inbound external message, wrong workchain, unknown account, failed pre-execution);
  503 ``{"error"}`` when the full node's store cannot record it (disk full, read-only):
  not accepted and not sent, the user may retry (remp_api_refused{reason="store_unavailable"}).
  A message already in flight is answered 202 again (idempotent: nothing more is sent). A
  message the full node holds as final from the validators or the chain (finalized,
  rejected by the queue / collator / chain, timeout) is answered **409 Conflict**
  ``{"message_id", "error", "outcome": {as GET's}, "retained_until": Unix s}`` and never
  sent to the validators again (remp_api_refused{reason="already_final"}), for
  ``--final-retention`` seconds after its final outcome (a day by default; kept in the data
  dir, so a restart does not reopen the window). 409, not 200: a retrying client must not
  read "accepted for processing" (202) or "done now" (200) into a POST that did nothing; the
  body says what happened to the first one. A message this full node refused itself (422)
  was never sent, so it is checked again.
  Admission control (Admission): past the pending bound (``--max-pending``, lowered to what
  the full node finalizes in ``--pending-seconds`` at its recent rate, never below
  ``--pending-floor``) messages not final yet, or past a
  client address's ``--client-rate`` / ``--client-burst`` token bucket, a new message is
  answered **503** with ``Retry-After`` (RFC 9110 section 10.2.3, seconds) and ``{"message_id",
  "error", "reason": "pending_full" | "client_rate", "retry_after"}``: not accepted, not
  stored, not sent; counted as remp_api_refused{reason}. A message in flight is not refused.
- ``GET /messages/{id}``: ``{"message_id", "receipts": [seed JSON, in arrival order],
  "outcome": {"final": bool, "outcome": "finalized"|"rejected"|"timeout"|"pending", "kind",
  "reason"}}``; final only when the client core says so (Finalized, RejectedByFullnode, or
  every validator that said New rejected or timed out). 404 for an unknown id, 400 for an id
  that is not 64 hex digits.
- ``GET /messages/{id}/ws``: a WebSocket sending every status of the message as one JSON
  text frame each (those so far, then new ones: the seed's status objects, each with a
  ``source_id``), and one frame ``{"final": true, "message_id", "outcome", "kind",
  "reason", "final_at"}`` right after the status that made the full node's final decision
  (a client may stop there). It stays open after the decision for the statuses of the
  group's other validators and closes (1000, reason "complete") once every expected
  validator sent its own final status (client.MessageSettled), or (1000, "grace") after
  ``--subscription-grace`` seconds (60) from the decision, or when the client leaves. A
  subscriber sees exactly the statuses ``GET /messages/{id}`` lists when it ends.
- ``/graphql``: ever-q-server's REMP API shape (remp_node/api/graphql.py) when strawberry-graphql
  is installed: mutation ``postRequests(requests: [Request])`` and subscription
  ``rempReceipts(messageId)`` over graphql-transport-ws.
- Every status is appended to a Redis stream (the reference's Kafka topic keyed by message
  id): ``XADD <stream> MAXLEN ~ <n> * key <message id hex> value <status JSON>`` (run by
  XADD_SCRIPT, one EVAL per batch of statuses); consumer
  groups work as usual (XGROUP CREATE / XREADGROUP). When Redis is unreachable the full node
  keeps serving HTTP, logs which URL and flag once per outage, and counts every status not
  appended (remp_redis_not_appended).

Sources: seeds/remp-protocol-b.txt (status JSON), DESIGN.md section 4 (status subscribers).
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
import re
import time
from collections import OrderedDict, deque
from typing import TYPE_CHECKING

from aiohttp import WSMsgType, web
from prometheus_client import Counter as PCounter, Gauge

from ..errors import RempRemoteError
from ..wire.messages import MessageRejected, message_id_of, parse_external_message
from ..daemon.store import StoreError

if TYPE_CHECKING:  # pragma: no cover
    from ..daemon.node import FullnodeDaemon

__all__ = ["StatusHub", "add_api_routes", "decode_body", "parse_message_id"]

MID_RE = re.compile(r"^[0-9a-fA-F]{64}$")
#: messages whose statuses are kept in memory (older ones are read from the store)
MAX_MEMORY_MESSAGES = 100_000
#: messages held not final yet past which new ones are refused (503; --max-pending default)
DEFAULT_MAX_PENDING = 20_000
#: seconds of finalizing the pending bound stands for (--pending-seconds default): past
#: `finals per s over the last Admission.RATE_WINDOW s x this` messages not final yet a new one
#: is refused, so an accepted message waits about this long behind the others (Little's law);
#: 0 (the default) keeps only --max-pending; 1.5 held accepted messages' Finalized p99 under
#: 3 s at 3x the sustained rate (bench/bench_remp_daemon.py --overload 3, docs/remp-scaling.md)
DEFAULT_PENDING_SECONDS = 0.0
#: the derived bound never goes below this (--pending-floor default): a full node that has
#: finalized nothing yet (just started, or idle for RATE_WINDOW s) still takes a burst of it
#: (users post a few hundred messages at once to a fresh full node); below capacity x
#: pending_seconds it holds latency, above it a slow network queues floor / capacity seconds
DEFAULT_PENDING_FLOOR = 256
#: statuses waiting for Redis at most (beyond: counted as not appended)
MAX_REDIS_BACKLOG = 200_000
#: appends a batch of statuses to the stream, one entry each, in order: KEYS[1] the stream,
#: ARGV[1] MAXLEN (approximate), then (message id hex, status JSON) pairs. Returns {n}, or
#: {n, error text} when the (n+1)-th XADD was refused (the rest of the batch is not tried).
XADD_SCRIPT = """local n = 0
for i = 2, #ARGV - 1, 2 do
  local r = redis.pcall('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'key', ARGV[i], 'value', ARGV[i + 1])
  if type(r) == 'table' and r.err then return {n, r.err} end
  n = n + 1
end
return {n}"""


class ApiError(RempRemoteError):
    """A request the API refuses: status code + message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def parse_message_id(text: str) -> bytes:
    """64 hex digits -> 32 bytes; ApiError(400) otherwise."""
    if not isinstance(text, str) or not MID_RE.match(text):
        raise ApiError(400, f"message id must be 64 hex digits, got {text[:80]!r}")
    return bytes.fromhex(text)


#: the serialized-BOC magics (TON crypto/vm/boc.cpp: generic, indexed, indexed with crc32c)
BOC_MAGICS = (b"\xb5\xee\x9c\x72", b"\x68\xff\x65\xf3", b"\xac\xc3\xa7\x28")


def decode_body(body: bytes, content_type: str = "") -> bytes:
    """The BOC of a POST body: the body itself when it starts with a BOC magic (a raw BOC,
    whatever the content type), else the base64 decoding of the stripped text when it is
    valid base64, else the raw body (which then fails as "Can't deserialize message").
    Raises ApiError(400) for an empty body."""
    if not body:
        raise ApiError(400, "empty body: send a message BOC, raw or base64")
    if bytes(body[:4]) in BOC_MAGICS:
        return bytes(body)
    try:
        return base64.b64decode(body.strip(), validate=True)
    except (binascii.Error, ValueError):
        return bytes(body)


class Admission:
    """Admission control of POST /messages and postRequests (no I/O, no clock: `now` in
    seconds from the caller). Two bounds, checked before a message is accepted (a message
    accepted is never dropped for load; anchor: CometBFT refuses a transaction with "mempool
    is full" instead of queueing it):

    - the pending bound: messages held not final yet (the client core's tracked ones); past
      it a new message is refused, reason "pending_full", retry after the time the full node
      needs to finalize the excess at its recent rate (finals in the last RATE_WINDOW s),
      within [1, MAX_RETRY_AFTER] s. The bound is max_pending, or, when pending_seconds > 0,
      the lower of max_pending and max(pending_floor, that recent finalize rate x
      pending_seconds): the full node takes what it can finalize within about pending_seconds
      (Little's law: time in the system = messages in it / their throughput) and refuses the
      rest at once, so accepted messages keep their latency under overload instead of
      queueing (a fixed max_pending of thousands let Finalized grow to tens of seconds).
      Without a finalize rate yet the retry is pending_seconds past the floor and
      MAX_RETRY_AFTER past max_pending;
    - rate / burst: a token bucket per client address (RFC 2697's single-rate form: `rate`
      tokens per second, at most `burst` kept); a message takes one token; without one it is
      refused, reason "client_rate", retry after the time until the next token. rate 0: off.
      At most max_clients buckets are kept (least recently used out: a new client starts
      with a full bucket).

    check(client, pending, now) -> None (admit; the token is taken) or (reason, retry_after
    seconds, an int >= 1). final(now) records one final outcome (the finalize rate).
    bound(now) -> the pending bound in force (messages). Raises ValueError for max_pending or
    pending_floor < 1, or a negative rate, burst or pending_seconds."""

    RATE_WINDOW = 10.0
    MAX_RETRY_AFTER = 60

    def __init__(self, max_pending: int, rate: float = 0.0, burst: float = 0.0, max_clients: int = 10_000,
                 pending_seconds: float = 0.0, pending_floor: int = DEFAULT_PENDING_FLOOR):
        if max_pending < 1 or rate < 0 or burst < 0 or pending_seconds < 0 or pending_floor < 1:
            raise ValueError("max_pending and pending_floor must be >= 1, rate, burst and pending_seconds >= 0")
        self.max_pending = max_pending
        self.pending_seconds = pending_seconds
        self.pending_floor = pending_floor
        self.rate = rate
        self.burst = max(burst, 1.0) if rate > 0 else 0.0
        self.max_clients = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()   # client -> (tokens, at)
        self._finals: deque[float] = deque()

    def final(self, now: float) -> None:
        self._finals.append(now)
        if len(self._finals) > 100_000:
            self._finals.popleft()

    def _final_rate(self, now: float) -> float:
        while self._finals and self._finals[0] < now - self.RATE_WINDOW:
            self._finals.popleft()
        return len(self._finals) / self.RATE_WINDOW

    def bound(self, now: float) -> int:
        if self.pending_seconds <= 0:
            return self.max_pending
        derived = max(self.pending_floor, math.ceil(self._final_rate(now) * self.pending_seconds))
        return min(self.max_pending, derived)

    def check(self, client: str, pending: int, now: float) -> tuple[str, int] | None:
        bound = self.bound(now) if pending >= self.pending_floor else self.max_pending
        if pending >= bound:
            excess = pending - bound + 1
            rate = self._final_rate(now)
            if rate > 0:
                wait = excess / rate
            elif bound < self.max_pending:
                # the floor of a full node that finalized nothing in RATE_WINDOW s (just
                # started): its first messages finalize within about pending_seconds
                wait = self.pending_seconds
            else:
                wait = float(self.MAX_RETRY_AFTER)
            return "pending_full", int(min(self.MAX_RETRY_AFTER, max(1, math.ceil(wait))))
        if self.rate <= 0:
            return None
        tokens, at = self._buckets.pop(client, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if tokens < 1.0:
            self._buckets[client] = (tokens, now)
            return "client_rate", int(min(self.MAX_RETRY_AFTER, max(1, math.ceil((1.0 - tokens) / self.rate))))
        self._buckets[client] = (tokens - 1.0, now)
        while len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)
        return None


class RefusalLog:
    """The `remp.fullnode.refused` lines of the refusals for load (503 / BACKPRESSURE): at
    most one line per reason per INTERVAL seconds (a refusal storm must not cost a log line
    each), count = refusals of that reason since the previous line, retry_after = the last
    delay given (s). The first refusal after a quiet INTERVAL is logged at once; the rest
    within INTERVAL s (a timer on the running loop). remp_api_refused_total counts each."""

    INTERVAL = 1.0

    def __init__(self, emit):
        self._emit = emit                       # emit(reason, count, retry_after)
        self._pending: dict[str, list] = {}     # reason -> [count, retry_after]
        self._last: dict[str, float] = {}
        self._timer = None

    def note(self, reason: str, retry_after: int, now: float) -> None:
        p = self._pending.setdefault(reason, [0, retry_after])
        p[0] += 1
        p[1] = retry_after
        if now - self._last.get(reason, -1e18) >= self.INTERVAL:
            self._flush_one(reason, now)
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.INTERVAL, self.flush)

    def _flush_one(self, reason: str, now: float) -> None:
        count, retry = self._pending.pop(reason)
        self._last[reason] = now
        self._emit(reason, count, retry)

    def flush(self) -> None:
        self._timer = None
        now = time.monotonic()
        for reason in list(self._pending):
            self._flush_one(reason, now)


class Subscription:
    """One subscriber's items, in order: ("status", seed JSON dict), ("final", outcome dict as
    GET's), ("end", "complete" | "grace"). Unbounded: a message has a bounded number of
    statuses (its validators' and the full node's)."""

    def __init__(self):
        self._items: deque = deque()
        self._ready = asyncio.Event()

    def put(self, item: tuple) -> None:
        self._items.append(item)
        self._ready.set()

    async def get(self) -> tuple:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()

    def next_is_final(self) -> dict | None:
        """The outcome when the next item is the final decision (the status just taken made
        it), else None; does not take it."""
        if self._items and self._items[0][0] == "final":
            return self._items[0][1]
        return None


class StatusHub:
    """Statuses of messages for HTTP, WebSocket and GraphQL subscribers and the Redis stream."""

    def __init__(self, daemon: "FullnodeDaemon", *, redis_url: str | None, stream: str, maxlen: int):
        self.daemon = daemon
        self.redis_url = redis_url
        self.stream = stream
        self.maxlen = maxlen
        self.memory: OrderedDict[bytes, list[dict]] = OrderedDict()
        self.finals: dict[bytes, dict] = {}
        self.subs: dict[bytes, set[asyncio.Queue]] = {}
        #: (message id hex, status JSON text) waiting for the Redis writer: a deque and one
        #: wake-up per step, not an asyncio.Queue put and get per status (~4 us per status)
        self._backlog: deque | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._redis = None
        self._link = None
        self._redis_ok = False
        r = daemon.registry
        self.m_appended = PCounter("remp_redis_appended", "statuses appended to the Redis stream", registry=r)
        self.m_not_appended = PCounter("remp_redis_not_appended",
                                       "statuses not appended to the Redis stream (Redis unreachable or backlog full)",
                                       registry=r)
        self.m_refused = PCounter("remp_api_refused", "API requests refused, by reason", ["reason"], registry=r)
        self.m_accepted = PCounter("remp_api_accepted", "messages accepted by POST /messages / postRequests",
                                   registry=r)
        self.g_subs = Gauge("remp_api_subscribers", "open status subscriptions", registry=r)
        a = getattr(daemon, "args", None)
        self.refusal_log = RefusalLog(lambda reason, count, retry: daemon.log.emit(
            "remp.fullnode.refused", None, "warning", reason=reason, count=count, retry_after=retry))
        self.admission = Admission(getattr(a, "max_pending", DEFAULT_MAX_PENDING) or DEFAULT_MAX_PENDING,
                                   getattr(a, "client_rate", 0.0) or 0.0, getattr(a, "client_burst", 0.0) or 0.0,
                                   pending_seconds=getattr(a, "pending_seconds", 0.0) or 0.0,
                                   pending_floor=getattr(a, "pending_floor", DEFAULT_PENDING_FLOOR)
                                   or DEFAULT_PENDING_FLOOR)

    # -- statuses ---------------------------------------------------------------------------
    def status(self, mid: bytes, d: dict, text: str) -> None:
        """One status of message `mid` (32 bytes): `d` the seed's JSON object, `text` the
        same as compact JSON text (encoded once by the caller, also for the store): kept in
        memory, handed to the message's subscribers and queued for the Redis stream."""
        lst = self.memory.get(mid)
        if lst is None:
            lst = self.memory[mid] = []
            while len(self.memory) > MAX_MEMORY_MESSAGES:
                old, _ = self.memory.popitem(last=False)
                self.finals.pop(old, None)
        lst.append(d)
        for q in self.subs.get(mid, ()):
            q.put(("status", d))
        if self.redis_url:
            b = self._backlog
            if b is None or len(b) >= MAX_REDIS_BACKLOG:
                self.m_not_appended.inc()
            else:
                b.append((mid.hex(), text))
                if not self._wake.is_set():
                    self._wake.set()

    def final(self, mid: bytes, ev) -> None:
        """The final decision about `mid` (client.FinalStatus), right after the status that
        made it; subscribers get it as ("final", outcome) and stay subscribed."""
        self.finals[mid] = {"final": True, "outcome": ev.outcome, "kind": ev.kind, "reason": ev.reason,
                            "final_at": time.time(), "at": len(self.memory.get(mid, ()))}
        self.admission.final(time.monotonic())
        for q in self.subs.get(mid, ()):
            q.put(("final", self._public(self.finals[mid])))

    @staticmethod
    def _public(f: dict) -> dict:
        return {k: v for k, v in f.items() if k != "at"}

    def forget(self, ids) -> None:
        """Messages the store purged (past the full node's retention): out of memory too."""
        for mid in ids:
            self.memory.pop(mid, None)
            self.finals.pop(mid, None)

    def receipts(self, mid: bytes) -> list[dict] | None:
        lst = self.memory.get(mid)
        if lst is not None:
            return list(lst)
        if self.daemon.store.message(mid) is None:
            return None
        return self.daemon.store.statuses(mid)

    def outcome(self, mid: bytes) -> dict:
        f = self.finals.get(mid)
        if f is not None:
            return self._public(f)
        m = self.daemon.store.message(mid)
        if m is not None and m["outcome"]:
            k = self.daemon.store.known(mid) or {}
            return {"final": True, "outcome": m["outcome"], "kind": m["kind"], "reason": m["reason"] or "",
                    "final_at": k.get("final_at")}
        return {"final": False, "outcome": "pending", "kind": "", "reason": ""}

    def settled(self, mid: bytes, reason: str) -> None:
        """No more statuses of `mid` will come (client.MessageSettled): its subscriptions end."""
        for q in self.subs.get(mid, ()):
            q.put(("end", reason))

    def subscribe(self, mid: bytes) -> "Subscription":
        """A subscription to `mid`: the statuses so far, the final decision right after the
        status that made it, then new statuses, then ("end", reason) once the client core
        settled the message (at once when it already has: e.g. after a restart)."""
        q = Subscription()
        rs = self.receipts(mid) or []
        out = self.outcome(mid)
        if out["final"]:
            at = self.finals.get(mid, {}).get("at")
            if at is None:      # from the store: after the full node's own final status
                own = self.daemon.key.key_id.hex()
                at = next((i + 1 for i in range(len(rs) - 1, -1, -1) if rs[i].get("source_id") == own
                           and rs[i].get("kind") in ("Finalized", "Timeout", "RejectedByFullnode")), len(rs))
            items = [("status", d) for d in rs]
            items.insert(min(at, len(items)), ("final", out))
        else:
            items = [("status", d) for d in rs]
        for it in items:
            q.put(it)
        client = getattr(self.daemon, "client", None)
        if out["final"] and client is not None and not client.settling(mid):
            q.put(("end", "complete"))
        self.subs.setdefault(mid, set()).add(q)
        self.g_subs.inc()
        return q

    def unsubscribe(self, mid: bytes, q: "Subscription") -> None:
        s = self.subs.get(mid)
        if s is not None and q in s:
            s.discard(q)
            self.g_subs.dec()
            if not s:
                del self.subs[mid]

    # -- submit -----------------------------------------------------------------------------
    def submit(self, boc: bytes, peer: str = "") -> tuple[int, dict]:
        """(HTTP status, JSON body) for one BOC (POST /messages and postRequests). peer: the
        client's address (the per-client rate limit's key). A refusal for load is 503 with
        "retry_after" (seconds) in the body, which the caller turns into Retry-After."""
        # parsed once here and handed to the client core (a decodability check through
        # message_id_of parsed the BOC a second time per message)
        client = getattr(self.daemon, "client", None)
        wcs = getattr(getattr(client, "states", None), "workchains", (0, -1))
        try:
            parsed = parse_external_message(boc, wcs)
        except MessageRejected:
            parsed = None
        if parsed is None and message_id_of(boc) is None:
            try:
                parse_external_message(boc, (0, -1))
                reason = "Can't deserialize message"
            except MessageRejected as exc:
                reason = exc.text
            self.m_refused.labels("undecodable").inc()
            return 400, {"error": reason}
        try:
            from ..core.client import submitted_message_id
            mid = submitted_message_id(boc, parsed)
            held = self.daemon.held_final(mid)
            if held is not None:
                # final (module doc, 409): never sent to the validators again
                self.m_refused.labels("already_final").inc()
                self.daemon.resent_refused += 1
                return 409, {"message_id": mid.hex(),
                             "error": f"message {mid.hex()} is already final ({held['outcome']}, {held['kind']}): "
                                      "it is not sent to the validators again",
                             "outcome": {k: held[k] for k in ("final", "outcome", "kind", "reason", "final_at")},
                             "retained_until": held["retained_until"]}
            if client is not None and not client.tracking(mid):
                refused = self.admission.check(peer, client.n_pending(), time.monotonic())
                if refused is not None:
                    reason, retry = refused
                    self.m_refused.labels(reason).inc()
                    self.refusal_log.note(reason, retry, time.monotonic())
                    return 503, {"message_id": mid.hex(), "error": (
                        f"the full node is at its bound ({'messages not final yet' if reason == 'pending_full' else 'messages per second from this client'}): "
                        f"not accepted, retry after {retry} s"), "reason": reason, "retry_after": retry}
            mid = self.daemon.submit(boc, parsed) if parsed is not None else self.daemon.submit(boc)
        except StoreError as exc:
            # not recorded, so not sent either (FullnodeDaemon.submit): the user may retry
            self.m_refused.labels("store_unavailable").inc()
            return 503, {"error": f"the full node cannot store the message now, it was not accepted: {exc}"}
        f = self.finals.get(mid)
        if f is not None and f["kind"] == "RejectedByFullnode":
            self.m_refused.labels("rejected_by_fullnode").inc()
            return 422, {"message_id": mid.hex(), "kind": "RejectedByFullnode", "reason": f["reason"]}
        self.m_accepted.inc()
        return 202, {"message_id": mid.hex()}

    # -- Redis --------------------------------------------------------------------------------
    def redis_state(self) -> dict:
        if not self.redis_url:
            return {"enabled": False}
        return {"enabled": True, "url": self.redis_url, "connected": self._redis_ok,
                "backlog": len(self._backlog) if self._backlog else 0}

    async def start(self) -> None:
        if not self.redis_url:
            return
        import redis.asyncio as aioredis
        from daemon_runtime.redislink import RedisLink
        self._redis = aioredis.from_url(self.redis_url, socket_connect_timeout=2, socket_timeout=5)
        self._link = RedisLink(self._redis)
        self._backlog = deque()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._writer())

    async def _writer(self) -> None:
        import redis.exceptions as rexc
        warned = False
        while True:
            backlog = self._backlog
            if not backlog:
                self._wake.clear()
                await self._wake.wait()
                continue
            popleft = backlog.popleft
            batch = [popleft() for _ in range(min(512, len(backlog)))]
            try:
                # one EVAL of XADD_SCRIPT per batch through RedisLink (hiredis-packed, one
                # reply): an XADD command per status through redis-py's Pipeline object was
                # ~1/5 of the full node's CPU per status, one reply read per status another
                # ~6 us (bench/bench_remp_fullnode.py)
                try:
                    (reply,) = await self._link.run([("EVAL", XADD_SCRIPT, 1, self.stream, self.maxlen,
                                                      *[x for kv in batch for x in kv])])
                    if isinstance(reply, rexc.ResponseError):
                        raise reply
                    appended = int(reply[0])
                    error = reply[1].decode(errors="replace") if len(reply) > 1 else None
                except (rexc.RedisError, OSError) as exc:
                    appended, error = 0, f"{type(exc).__name__}: {exc}"
                self.m_appended.inc(appended)
                self._redis_ok = error is None
                if error is None:
                    warned = False
                    continue
                self.m_not_appended.inc(len(batch) - appended)
                if not warned:
                    warned = True
                    self.daemon.log_error(f"Redis at {self.redis_url} (flag --redis) is unreachable: "
                                          f"{error}; statuses are counted in "
                                          "remp_redis_not_appended and HTTP keeps serving")
                await asyncio.sleep(1.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug: count and go on
                self.m_not_appended.inc(len(batch))
                self.daemon.core_runner.bug(exc, "redis")

    async def close(self) -> None:
        if self._task is not None:
            # drain what is queued (bounded by the daemon's grace)
            try:
                for _ in range(int(self.daemon.args.grace * 20)):
                    if not self._backlog:
                        break
                    await asyncio.sleep(0.05)
            finally:
                self._task.cancel()
                try:
                    await self._task
                except (asyncio.CancelledError, Exception):
                    pass
        if self._redis is not None:
            await self._link.close()
            await self._redis.aclose()


def add_api_routes(app: web.Application, daemon: "FullnodeDaemon") -> None:
    """POST /messages, GET /messages/{id}, GET /messages/{id}/ws, /graphql (module doc)."""

    async def post_message(request: web.Request) -> web.Response:
        hub = daemon.hub
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            hub.m_refused.labels("too_large").inc()
            return web.json_response({"error": f"body larger than {daemon.args.max_body} bytes"}, status=413)
        try:
            boc = decode_body(body, request.content_type)
        except ApiError as exc:
            hub.m_refused.labels("empty").inc()
            return web.json_response({"error": str(exc)}, status=exc.status)
        status, doc = hub.submit(boc, request.remote or "")
        headers = {"Retry-After": str(doc["retry_after"])} if "retry_after" in doc else None
        return web.json_response(doc, status=status, headers=headers)

    def message_id(request: web.Request) -> bytes | web.Response:
        """The path's message id, or the 400 response for a malformed one (counted bad_id)."""
        try:
            return parse_message_id(request.match_info["id"])
        except ApiError as exc:
            daemon.hub.m_refused.labels("bad_id").inc()
            return web.json_response({"error": str(exc)}, status=exc.status)

    async def get_message(request: web.Request) -> web.Response:
        hub = daemon.hub
        mid = message_id(request)
        if isinstance(mid, web.Response):
            return mid
        rs = hub.receipts(mid)
        if rs is None:
            return web.json_response({"error": f"unknown message {mid.hex()}"}, status=404)
        return web.json_response({"message_id": mid.hex(), "receipts": rs, "outcome": hub.outcome(mid)})

    async def ws_message(request: web.Request) -> web.StreamResponse:
        hub = daemon.hub
        mid = message_id(request)
        if isinstance(mid, web.Response):
            return mid
        ws = web.WebSocketResponse(heartbeat=20)
        await ws.prepare(request)
        q = hub.subscribe(mid)
        getter = None
        reader = asyncio.ensure_future(ws.receive())
        try:
            while True:
                if getter is None:
                    getter = asyncio.ensure_future(q.get())
                done, _ = await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:          # an item taken is always sent, even if the client spoke too
                    kind, d = getter.result()
                    getter = None
                    if kind == "status":
                        await ws.send_str(json.dumps(d))
                    elif kind == "final":
                        await ws.send_str(json.dumps({"final": True, "message_id": mid.hex(), **d}))
                    else:
                        await ws.close(code=1000, message=d.encode())
                        break
                if reader in done:
                    msg = reader.result()
                    if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.ERROR):
                        break
                    reader = asyncio.ensure_future(ws.receive())
        finally:
            for t in (getter, reader):
                if t is not None and not t.done():
                    t.cancel()
            hub.unsubscribe(mid, q)
        return ws

    app.router.add_post("/messages", post_message)
    app.router.add_get("/messages/{id}", get_message)
    app.router.add_get("/messages/{id}/ws", ws_message)
    try:
        from .graphql import add_graphql_route
    except ImportError:
        return
    add_graphql_route(app, daemon)
