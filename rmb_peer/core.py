"""The rmb-peer protocol core: no I/O, no clock (DESIGN.md sections 2-3; rmb-rs v1.5.1
`src/peer`). The daemon (rmb_peer/daemon.py) feeds it relay frames, app JSON from Redis and
twin records, passes `now` (unix seconds, float) and executes the events it emits.

What it does:
- app requests (`msgbus.system.local` JSON) -> one envelope per destination, all with ONE
  uid; the request is tracked until N replies came or its TTL ran out (then every missing
  reply becomes error 102 on the app's `ret` queue). ttl = remaining TTL of the request
  (`now` + `exp` - clock), 300 s when `exp` is 0, capped at 1800 s (DESIGN.md section 3).
- incoming envelopes: expired ones refused first (102), then the sender twin's account key
  verifies the signature (104), the cipher is opened with the sender's pk (105/106);
  requests go to `msgbus.<cmd>`, responses/errors to the app's `ret` queue with the app's
  `ref`; `rmb.version` is answered by the peer itself; relay errors (source twin 0,
  unsigned) become `err` replies for the app. A refused request is answered with a signed
  error envelope carrying the code (rmb-rs `Downstream::start`).
- service replies (`msgbus.system.reply` JSON) -> response/error envelopes.
- e2e: payloads are encrypted only when the destination twin has a pk (seed: rmb.md,
  "End2End Encryption").
- relay connections: connect to all configured relays, send through the first live one in
  configured order, fail over when it dies; keepalive ping every 20 s; a connection silent
  for 40 s is declared dead and reconnected with exponential backoff (1 s .. 30 s).

Trace id: the envelope uid. When the app's `ref` is a UUID not in flight, it is used as the
uid so the app's own events (rmb.app.*) share the trace id; otherwise a new UUIDv4 is made.

Twins: the core owns the twin table (TTL, refresh-ahead, stale-if-error with bounded
staleness, a bounded negative cache) and asks for lookups with LookupTwin; work that needs
a twin without a usable record is parked on that twin only (see "twins" in the class).

Clock rule (DESIGN.md section 2; daemon_runtime.runner): `now` is unix seconds
(time.time() in the daemon); wire timestamps and envelope expiry use now + `wall_offset`,
0 unless a caller runs the core on another clock.

Errors: `AppMessageError` (a local app pushed unacceptable JSON; `.code` is one of the
codes below) and `EnvelopeError` (a relay sent garbage) are the remote-input errors
(rmb_peer.errors.RmbRemoteError); they are handled inside the core (logged once, answered
when possible) and never escape the public methods (tests/test_rmb_fuzz.py).
`PeerStateError` (rmb_peer.errors.RmbLocalError) is local misuse (an impossible
relay-connection transition or an unknown relay name).
"""
from __future__ import annotations

import base64
import binascii
import heapq
import json
import math
from collections import Counter, OrderedDict, deque

import orjson
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from rmb_peer.challenge import sign_envelope, verify_envelope
from rmb_peer.e2e import E2EError, decrypt, encrypt
from rmb_peer.envelope import (
    MAX_ENVELOPE_SIZE, MAX_UID_LEN, Backlog, Envelope, EnvelopeError, address_str,
    is_expired, is_uuid, message_kind, new_uid, parse_envelope,
)
from rmb_peer.errors import RmbLocalError, RmbRemoteError
from rmb_peer.freshness import LookupTwin, TwinFreshness
from rmb_peer.identity import E2EKey, Identity, SignatureError

__all__ = [
    "PeerCore", "PeerEvent", "SendFrame", "PushQueue", "StoreBacklog", "DropBacklog",
    "LookupBacklog", "Connect", "SendPing", "Disconnect", "AppRequest", "ServiceReply",
    "AppMessageError", "PeerStateError", "LOCAL_QUEUE", "REPLY_QUEUE", "BACKLOG_PREFIX",
    "QUEUE_MAX_LEN", "VERSION", "ERR_INVALID_MESSAGE", "ERR_BAD_PAYLOAD", "ERR_EXPIRED",
    "ERR_UNKNOWN_TWIN", "ERR_BAD_SIGNATURE", "ERR_NO_PUBLIC_KEY", "ERR_E2E", "ERR_OTHER",
    "DEFAULT_TTL", "MAX_TTL", "RESPONSE_TTL", "PING_INTERVAL", "PING_TIMEOUT", "DEAD_AFTER",
    "parse_address", "b64", "unb64", "SharedKeyCache", "LookupTwin", "TwinLookupFailed",
    "TWIN_TTL", "TWIN_MAX_STALE", "TWIN_NEGATIVE_TTL", "TWIN_RETRY", "LOOKUP_TIMEOUT",
    "MAX_TWINS", "MAX_PARKED",
]

#: rmb-peer queue names (DESIGN.md section 3).
LOCAL_QUEUE = "msgbus.system.local"
REPLY_QUEUE = "msgbus.system.reply"
BACKLOG_PREFIX = "msgbus.backlog."
#: Every push is LPUSH then LTRIM 0 QUEUE_MAX_LEN-1.
QUEUE_MAX_LEN = 10000

#: Error codes of the rmb-peer JSON protocol (DESIGN.md section 3; rmb-rs ProtocolError).
ERR_INVALID_MESSAGE = 100
ERR_BAD_PAYLOAD = 101
ERR_EXPIRED = 102
ERR_UNKNOWN_TWIN = 103
ERR_BAD_SIGNATURE = 104
ERR_NO_PUBLIC_KEY = 105
ERR_E2E = 106
ERR_OTHER = 500

#: TTL rules, seconds (DESIGN.md section 3).
DEFAULT_TTL = 300
MAX_TTL = 1800
#: Expiration of response envelopes, seconds (rmb-rs: "a response has a fixed timeout").
RESPONSE_TTL = 3600
#: Expiration of error envelopes the peer sends itself, seconds (rmb-rs Downstream).
ERROR_TTL = 300

#: Keepalive, seconds (DESIGN.md section 3; rmb-peer --ping-interval / --ping-timeout): a
#: relay connection without a frame (pong included) for PING_INTERVAL s is pinged, and
#: declared dead PING_TIMEOUT s later if still nothing came: a silent relay is noticed
#: after PING_INTERVAL + PING_TIMEOUT = 30 s, as the relay notices a silent peer (its
#: heartbeat: a ping after 20 s, the pong awaited 10 s). rmb-rs's peer pings after 20 s
#: without a write and reconnects when its last pong is over 40 s old (40-60 s).
PING_INTERVAL = 20.0
PING_TIMEOUT = 10.0
DEAD_AFTER = PING_INTERVAL + PING_TIMEOUT
#: Reconnect backoff, seconds: 1, 2, 4, ... capped.
BACKOFF_MIN = 1.0
BACKOFF_MAX = 30.0

#: Answer of the built-in `rmb.version` command (JSON string, schema application/json).
VERSION = "relay-suite-rmb-peer/0.1.0"

#: Input limits.
MAX_DESTINATIONS = 1024
MAX_CMD_LEN = 256
MAX_APP_MESSAGE = 2 * 1024 * 1024  # bytes of JSON from the app (base64 of a 1 MiB payload fits)
MAX_OUTBOX = 10000  # frames held while no relay is connected
MAX_DONE = 200_000  # finished request uids remembered (late/duplicate reply filter)

_MAX_TWIN = 2**32 - 1

#: The twin table (PeerCore owns it; DESIGN.md section 3, "Twin lookup"), seconds:
#: a record is used TWIN_TTL s after it was fetched and refreshed ahead (in the background)
#: once half of that passed; while lookups of it fail it is served up to TWIN_MAX_STALE s
#: past its TTL (stale-if-error, logged), a failing lookup retried every TWIN_RETRY s;
#: a twin the registry does not know is remembered TWIN_NEGATIVE_TTL s; a lookup not
#: answered in LOOKUP_TIMEOUT s counts as failed.
TWIN_TTL = 60.0
TWIN_MAX_STALE = 3600.0
TWIN_NEGATIVE_TTL = 10.0
TWIN_RETRY = 5.0
LOOKUP_TIMEOUT = 15.0
#: Records held (oldest fetched dropped first); unknown twins remembered.
MAX_TWINS = 100_000
MAX_UNKNOWN = 10_000
#: Messages waiting for twin lookups, all twins together (more are refused with 500).
MAX_PARKED = 10_000


class AppMessageError(RmbRemoteError):
    """A local app/service pushed JSON the peer cannot accept. `code`: 100 (invalid
    message), 101 (bad payload), 102 (expired); `reason`: precise text."""

    def __init__(self, code: int, reason: str):
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason


class PeerStateError(RmbLocalError):
    """Local misuse of the core: an impossible relay-connection transition (names the
    state and the input) or an unknown relay."""


# ---------------------------------------------------------------------------- events

class PeerEvent:
    """Base class of everything the core asks its adapter to do (drain with next_event())."""


@dataclass
class SendFrame(PeerEvent):
    """Write `data` (a serialized Envelope, bytes) as one binary frame on relay
    connection `relay` (attempt `attempt`). If the write fails, call
    `relay_lost(relay, attempt, ...)` then `resend(event, now)`."""
    relay: str
    attempt: int
    data: bytes
    uid: str
    kind: str
    dst: int


@dataclass
class PushQueue(PeerEvent):
    """LPUSH `payload` (JSON bytes) on Redis list `queue`, then LTRIM 0 QUEUE_MAX_LEN-1."""
    queue: str
    payload: bytes
    uid: str


@dataclass
class StoreBacklog(PeerEvent):
    """SET `key` `record` (serialized rmb.Backlog) EX `ttl` (seconds)."""
    key: str
    record: bytes
    ttl: int
    uid: str


@dataclass
class DropBacklog(PeerEvent):
    """DEL `key`: the request is finished (every reply given to the app, or expired), so
    its backlog record has no further use; deleting it now spares Redis the memory until
    the TTL and a burst of expirations later (a 10 ms active-expire stall was seen in
    bench/bench_roundtrip.py when a throughput run's records all expired at once)."""
    key: str
    uid: str
    elapsed: float | None = None
    """seconds from the app's request to this end (its last reply or its expiry)"""


@dataclass
class LookupBacklog(PeerEvent):
    """A reply came for a uid this core does not track (e.g. the peer restarted): GET
    `key`; if present call `backlog_reply(record, event)`. `reply` is the app reply JSON
    object without its `ref`."""
    key: str
    uid: str
    src_twin: int
    reply: dict


@dataclass
class Connect(PeerEvent):
    """Open a websocket to `relay`; report relay_connected / relay_failed with `attempt`."""
    relay: str
    attempt: int


@dataclass
class SendPing(PeerEvent):
    """Send a keepalive ping on `relay`; call relay_activity when anything comes back."""
    relay: str
    attempt: int


@dataclass
class Disconnect(PeerEvent):
    """The core declared `relay` dead (silent for DEAD_AFTER s): close that connection."""
    relay: str
    attempt: int
    reason: str


# ---------------------------------------------------------------------------- records

class TwinLookupFailed(Exception):
    """Marker handed to accept/send_request/send_response for a twin whose lookup failed
    with no record young enough to serve stale (never raised by the core)."""


@dataclass
class _TwinEntry:
    record: Any
    fetched: float                       # timer clock
    failed_since: float | None = None    # the last lookup of it failed (stale-if-error)
    retry_at: float = 0.0
    stale_logged: bool = False


@dataclass(eq=False)
class _Job:
    """Work parked until the twins it needs are resolved: kind "accept" (an incoming
    envelope; item = Envelope), "request" (item = AppRequest), "response" (ServiceReply)."""
    kind: str
    item: Any
    waiting: set
    results: dict = field(default_factory=dict)

@dataclass
class AppRequest:
    """A validated app request from `msgbus.system.local` (DESIGN.md section 3).
    data: payload bytes; dst: destination twin ids; ttl: seconds (rules above);
    timestamp: unix s stamped on the envelopes."""
    ref: str | None
    cmd: str
    data: bytes
    tags: str | None
    dst: list[int]
    ret: str
    schema: str | None
    ttl: int
    timestamp: int


@dataclass
class ServiceReply:
    """A validated service reply from `msgbus.system.reply`: uid (the `ref` the service
    echoes = the incoming envelope uid), destination twin and optional session id."""
    uid: str
    dst_twin: int
    dst_sid: str | None
    data: bytes
    schema: str | None
    err: tuple[int, str] | None


@dataclass
class _Pending:
    uid: str
    ref: str | None
    ret: str
    cmd: str
    deadline: float
    outstanding: Counter
    left: int
    started: float


@dataclass
class _Relay:
    name: str
    state: str = "down"          # down | connecting | up
    attempt: int = 0
    backoff: float = BACKOFF_MIN
    connect_at: float | None = None
    last_rx: float = 0.0
    next_ping: float = 0.0     # last frame (or ping) + the ping interval


# Relay connection state table: (state, input) -> next state. Anything else is impossible.
_RELAY_TABLE: dict[tuple[str, str], str] = {
    ("down", "connect_due"): "connecting",
    ("connecting", "connected"): "up",
    ("connecting", "failed"): "down",
    ("connecting", "lost"): "down",
    ("up", "lost"): "down",
    ("up", "silent"): "down",
}


# ---------------------------------------------------------------------------- helpers

def b64(data: bytes) -> str:
    """Standard base64 text of `data` (the `dat` field)."""
    return base64.b64encode(data).decode("ascii")


def unb64(text: Any, what: str = "dat") -> bytes:
    """Decode a standard-base64 `dat` field. Raises AppMessageError(101)."""
    if text is None or text == "":
        return b""
    if not isinstance(text, str):
        raise AppMessageError(ERR_BAD_PAYLOAD, f"{what} must be a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise AppMessageError(ERR_BAD_PAYLOAD, f"{what} is not valid base64") from None


def parse_address(text: Any) -> tuple[int, str | None]:
    """"twin" or "twin:sid" -> (twin, sid|None). Raises AppMessageError(100)."""
    if not isinstance(text, str) or not text:
        raise AppMessageError(ERR_INVALID_MESSAGE, "dst must be a 'twin[:sid]' string")
    twin_s, sep, sid = text.partition(":")
    try:
        twin = int(twin_s)
    except ValueError:
        raise AppMessageError(ERR_INVALID_MESSAGE, f"bad twin in address {text[:64]!r}") from None
    if not 0 < twin <= _MAX_TWIN:
        raise AppMessageError(ERR_INVALID_MESSAGE, f"twin out of range in address {text[:64]!r}")
    if sep and not sid:
        raise AppMessageError(ERR_INVALID_MESSAGE, "empty session id in address")
    if len(sid) > MAX_UID_LEN:
        raise AppMessageError(ERR_INVALID_MESSAGE, f"session id longer than {MAX_UID_LEN} chars")
    return twin, (sid if sep else None)


class SharedKeyCache:
    """An E2EKey whose ECDH shared key, and the AES-256-GCM object keyed with it, are
    memoized per peer pk in one table (the ECDH point multiplication dominates e2e cost;
    the derived key per (own key, peer pk) is deterministic, so caching is exact; the
    AES-GCM format stays rmb_peer.e2e's). Duck-types E2EKey for rmb_peer.e2e.encrypt/
    decrypt: `pk`, `shared_key(peer_pk)`, plus `aead(peer_pk)`. size: peer keys
    remembered (the table is cleared when full)."""

    def __init__(self, key: E2EKey, size: int = 4096):
        self.key = key
        self.pk = key.pk
        self.size = size
        self._cache: dict[bytes, tuple[bytes, AESGCM]] = {}

    def _entry(self, peer_pk: bytes) -> tuple[bytes, AESGCM]:
        peer_pk = bytes(peer_pk)
        hit = self._cache.get(peer_pk)
        if hit is None:
            shared = self.key.shared_key(peer_pk)  # raises ValueError for a malformed pk
            hit = (shared, AESGCM(shared))
            if len(self._cache) >= self.size:
                self._cache.clear()
            self._cache[peer_pk] = hit
        return hit

    def shared_key(self, peer_pk: bytes) -> bytes:
        """The 32-byte e2e key with this peer, cached. Raises ValueError for a malformed pk."""
        return self._entry(peer_pk)[0]

    def aead(self, peer_pk: bytes) -> AESGCM:
        """AESGCM(shared_key(peer_pk)), cached. Raises ValueError for a malformed pk."""
        return self._entry(peer_pk)[1]


def _dumps(obj: dict) -> bytes:
    """Compact JSON bytes (orjson; the stdlib for what orjson refuses, e.g. ints > 64 bits)."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        return json.dumps(obj, separators=(",", ":")).encode()


def _loads_object(raw: bytes | str) -> dict:
    if len(raw) > MAX_APP_MESSAGE:
        raise AppMessageError(ERR_INVALID_MESSAGE, f"message too large: {len(raw)} bytes > {MAX_APP_MESSAGE}")
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        # orjson is the fast path; the stdlib decides what it refused (ints > 64 bits,
        # NaN) so the accepted input and the error texts stay the stdlib's
        if "depth limit" in str(exc):
            raise AppMessageError(ERR_INVALID_MESSAGE, "message JSON is nested too deeply") from None
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise AppMessageError(ERR_INVALID_MESSAGE, "message is not JSON") from None
        except RecursionError:
            raise AppMessageError(ERR_INVALID_MESSAGE, "message JSON is nested too deeply") from None
    if not isinstance(obj, dict):
        raise AppMessageError(ERR_INVALID_MESSAGE, "message is not a JSON object")
    return obj


def _opt_str(obj: dict, key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise AppMessageError(ERR_INVALID_MESSAGE, f"{key} must be a string or null")
    return value


def _int(obj: dict, key: str, default: int | None = None) -> int:
    value = obj.get(key, default)
    if value is None or isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AppMessageError(ERR_INVALID_MESSAGE, f"{key} must be a non-negative integer")
    return value


def _is_uuid(text: str | None) -> bool:
    return is_uuid(text)


# ---------------------------------------------------------------------------- the core

class PeerCore:
    """One twin's peer (rmb-rs `peer`), without I/O.

    twin_id: our twin; identity: account key (signs envelopes); e2e_key: secp256k1 key
    (decrypts incoming ciphers, encrypts to twins with a pk) or None for a peer without e2e
    (it publishes no pk and sends plain text only); relays: relay names in
    preference order (the daemon uses the ws:// URLs); log: an EventLog (rmb.peer.*) or None;
    debug: also emit per-frame debug events (rmb.peer.received).

    Inputs (all take `now`: unix seconds; wire time = now + wall_offset, see the module doc):
    start, relay_connected/relay_failed/relay_lost/relay_activity; end to end, with the
    core's own twin table: receive_frame (relay frames), receive_local (app requests),
    receive_service_reply (service replies), twin_resolved/twin_lookup_failed (answers to
    LookupTwin), load_twins (last known state); the same steps with records handed in:
    receive + accept, app_message + send_request, service_message + send_response;
    backlog_reply, resend, handle_timer. Outputs: next_event() -> PeerEvent | None;
    get_timer() -> deadline | None (timer clock). max_envelope: the relays' envelope
    limit, bytes (bigger requests/replies are refused with 101 instead of being sent).
    """

    def __init__(self, twin_id: int, identity: Identity, e2e_key: E2EKey | None,
                 relays: list[str], log=None, version: str = VERSION, debug: bool = False,
                 max_envelope: int = MAX_ENVELOPE_SIZE, ping_interval: float = PING_INTERVAL,
                 ping_timeout: float = PING_TIMEOUT):
        if not 0 < int(twin_id) <= _MAX_TWIN:
            raise PeerStateError(f"bad twin id {twin_id}")
        if not 1 <= len(relays) <= 4 or len(set(relays)) != len(relays):
            raise PeerStateError(f"need 1..4 distinct relays, got {relays!r}")
        self.twin_id = int(twin_id)
        self.identity = identity
        self.e2e_key = SharedKeyCache(e2e_key) if isinstance(e2e_key, E2EKey) else e2e_key
        self.log = log
        self._debug = log is not None and debug
        self.version = version
        #: largest envelope the relays accept, bytes (their --max-size): bigger requests
        #: and replies are refused here with an error instead of being sent
        self.max_envelope = max_envelope
        self.relays: dict[str, _Relay] = {name: _Relay(name) for name in relays}
        if not (ping_interval > 0 and ping_timeout > 0):
            raise PeerStateError(f"ping interval and timeout must be > 0, got "
                                 f"{ping_interval!r} and {ping_timeout!r}")
        #: keepalive (s): ping a relay connection silent for ping_interval, dead when
        #: still silent ping_timeout later
        self.ping_interval = float(ping_interval)
        self.ping_timeout = float(ping_timeout)
        self.dead_after = self.ping_interval + self.ping_timeout
        self._order = list(relays)
        self._events: deque[PeerEvent] = deque()
        self._pending: dict[str, _Pending] = {}
        self._deadlines: list[tuple[float, str]] = []  # heap, lazy deletion
        self._outbox: deque[tuple[float, Envelope, str, int]] = deque()
        self._done: dict[str, float] = {}  # finished uid -> its deadline
        #: (deadline, uid) of _done in completion order: pruned from the left. Not the
        #: dict's own order: deleting a dict's first keys one by one leaves dummy slots
        #: that every next(iter(dict)) scans again (quadratic; it blocked the bench's
        #: peer 30-80 ms when a second of finished requests expired at once).
        self._done_order: deque[tuple[float, str]] = deque()
        #: incoming requests already pushed to a service: (source twin, uid, timestamp) ->
        #: deadline,
        #: with their (deadline, key) in arrival order, pruned from the left as they expire
        #: (a relay re-delivers what a lost connection may have swallowed)
        self._served: dict[tuple[int, str, int], float] = {}
        self._served_order: deque[tuple[float, tuple[int, str, int]]] = deque()
        #: counters for /metrics and tests
        self.stats: Counter = Counter()
        #: the clock rule (DESIGN.md section 2): every `now` is unix seconds (the daemon's
        #: runner passes time.time()); wire timestamps and envelope expiry use wall time
        #: = now + wall_offset: 0 unless a caller runs the core on another clock.
        self.wall_offset = 0.0
        # the twin table (see "twins" below)
        #: the table's rule (rmb_peer.freshness, shared with the relay): refreshed ahead
        #: once half the TTL passed
        self.freshness = TwinFreshness(TWIN_TTL, TWIN_MAX_STALE, refresh_ahead=0.5)
        self.twin_negative_ttl = TWIN_NEGATIVE_TTL
        self._twins: OrderedDict[int, _TwinEntry] = OrderedDict()
        self._unknown: OrderedDict[int, float] = OrderedDict()  # twin -> unknown until
        self._lookups: dict[int, float] = {}                     # twin -> asked at
        self._parked: dict[int, list[_Job]] = {}                 # twin -> jobs waiting
        self._parked_count = 0

    # ------------------------------------------------------------------ plumbing
    def wall(self, now: float) -> float:
        """Wall-clock unix seconds at timer-clock `now` (the clock rule, see wall_offset)."""
        return now + self.wall_offset

    def _stamp(self, now: float) -> int:
        """The wire timestamp (unix s, integer) at timer-clock `now`."""
        return int(now + self.wall_offset)

    def next_event(self) -> PeerEvent | None:
        """The next thing to do, or None."""
        return self._events.popleft() if self._events else None

    def _emit(self, event: str, trace_id: str | None, level: str = "info", **attrs) -> None:
        if self.log is not None:
            self.log.emit(event, trace_id, level, **attrs)

    def _reject(self, code: int, reason: str, src: str, trace_id: str | None,
                level: str = "warning") -> None:
        self.stats[f"rejected_{code}"] += 1
        self._emit("rmb.peer.rejected", trace_id, level, code=code, reason=reason[:200], src=src)

    @property
    def pending_count(self) -> int:
        """Requests waiting for replies."""
        return len(self._pending)

    def live_relays(self) -> list[str]:
        """Relays with an open connection, in preference order."""
        return [n for n in self._order if self.relays[n].state == "up"]

    # ------------------------------------------------------------------ relays
    def _relay(self, name: str) -> _Relay:
        relay = self.relays.get(name)
        if relay is None:
            raise PeerStateError(f"unknown relay {name!r}")
        return relay

    def _transition(self, relay: _Relay, inp: str) -> None:
        nxt = _RELAY_TABLE.get((relay.state, inp))
        if nxt is None:
            raise PeerStateError(f"relay {relay.name}: impossible input {inp!r} in state {relay.state!r}")
        relay.state = nxt

    def start(self, now: float) -> None:
        """Connect to every relay now."""
        for relay in self.relays.values():
            if relay.state == "down":
                relay.connect_at = now

    def _current(self, relay: _Relay, attempt: int) -> bool:
        return attempt == relay.attempt

    def relay_connected(self, name: str, attempt: int, now: float) -> None:
        """The websocket of `attempt` to `name` is open: it becomes usable, queued frames
        are flushed."""
        relay = self._relay(name)
        if not self._current(relay, attempt) or relay.state != "connecting":
            return  # a stale attempt; the adapter closes it
        self._transition(relay, "connected")
        relay.backoff = BACKOFF_MIN
        relay.last_rx = now
        relay.next_ping = now + self.ping_interval
        self.stats["relay_connects"] += 1
        self._emit("rmb.peer.connected", None, relay=name)
        self._flush_outbox(now)

    def relay_failed(self, name: str, attempt: int, now: float, reason: str) -> None:
        """Connecting (attempt) failed: retry after the backoff."""
        relay = self._relay(name)
        if not self._current(relay, attempt) or relay.state != "connecting":
            return
        self._transition(relay, "failed")
        self._schedule_reconnect(relay, now)
        self._emit("rmb.peer.disconnected", None, "warning", relay=name, reason=reason[:200])

    def relay_lost(self, name: str, attempt: int, now: float, reason: str) -> None:
        """The connection of `attempt` closed (or a write failed). Stale attempts and
        connections already declared dead are ignored."""
        relay = self._relay(name)
        if not self._current(relay, attempt) or relay.state == "down":
            return
        self._transition(relay, "lost")
        self._schedule_reconnect(relay, now)
        self._emit("rmb.peer.disconnected", None, "warning", relay=name, reason=reason[:200])

    def relay_activity(self, name: str, now: float, attempt: int | None = None) -> None:
        """Something (a frame, a pong) arrived on `name`: it is alive."""
        relay = self._relay(name)
        if relay.state == "up" and (attempt is None or attempt == relay.attempt):
            relay.last_rx = now
            relay.next_ping = now + self.ping_interval

    def _schedule_reconnect(self, relay: _Relay, now: float) -> None:
        relay.connect_at = now + relay.backoff
        relay.backoff = min(relay.backoff * 2, BACKOFF_MAX)

    def _primary(self) -> _Relay | None:
        for name in self._order:
            relay = self.relays[name]
            if relay.state == "up":
                return relay
        return None

    # ------------------------------------------------------------------ timers
    def get_timer(self) -> float | None:
        """The earliest deadline (unix s) at which handle_timer must run, or None."""
        best: float | None = None
        while self._deadlines and self._deadlines[0][1] not in self._pending:
            heapq.heappop(self._deadlines)
        if self._deadlines:
            best = self._deadlines[0][0]
        for relay in self.relays.values():
            if relay.state == "down" and relay.connect_at is not None:
                t = relay.connect_at
            elif relay.state == "up":
                t = min(relay.next_ping, relay.last_rx + self.dead_after)
            else:
                continue
            if best is None or t < best:
                best = t
        if self._outbox:
            t = self._outbox[0][0]
            if best is None or t < best:
                best = t
        if self._lookups:
            t = self._lookup_timer()
            if best is None or t < best:
                best = t
        return best

    def handle_timer(self, now: float) -> None:
        """Expire requests (102 to the app per missing reply), keepalive pings, dead
        connections, reconnects, expired frames in the outbox."""
        while self._deadlines and self._deadlines[0][0] <= now:
            _, uid = heapq.heappop(self._deadlines)
            pending = self._pending.get(uid)
            if pending is not None and pending.deadline <= now:
                self._expire(pending, now)
        for relay in self.relays.values():
            if relay.state == "up":
                if now - relay.last_rx >= self.dead_after:
                    why = (f"silent for {now - relay.last_rx:.0f} s (no pong "
                           f"{self.ping_timeout:g} s after a ping)")
                    self._transition(relay, "silent")
                    self._schedule_reconnect(relay, now)
                    self._events.append(Disconnect(relay.name, relay.attempt, why))
                    self._emit("rmb.peer.disconnected", None, "warning", relay=relay.name,
                               reason=why)
                elif now >= relay.next_ping:
                    relay.next_ping = now + self.ping_interval
                    self._events.append(SendPing(relay.name, relay.attempt))
            elif relay.state == "down" and relay.connect_at is not None and relay.connect_at <= now:
                self._transition(relay, "connect_due")
                relay.connect_at = None
                relay.attempt += 1
                self._events.append(Connect(relay.name, relay.attempt))
        while self._outbox and self._outbox[0][0] <= now:
            _, env, kind, dst = self._outbox.popleft()
            self._reject(ERR_EXPIRED, "no relay connected before the envelope expired",
                         str(dst), env.uid)
        if self._lookups:
            self._expire_lookups(now)

    def _expire(self, pending: _Pending, now: float) -> None:
        del self._pending[pending.uid]
        srcs = list(pending.outstanding.elements())
        for i in range(pending.left):
            src = str(srcs[i]) if i < len(srcs) else "0"
            self._answer_app(pending, src, b"", None, self._stamp(now), (ERR_EXPIRED, "request expired"))
            self._emit("rmb.peer.expired", pending.uid, "warning", dst=src, code=ERR_EXPIRED)
        self.stats["expired"] += 1
        self._completed(pending, now)

    # ------------------------------------------------------------------ sending
    def _stamp_sign(self, env: Envelope, now: float) -> None:
        env.source.twin = self.twin_id
        env.timestamp = self._stamp(now)
        sign_envelope(env, self.identity)

    def _send(self, env: Envelope, kind: str, dst: int, now: float, encrypted: bool) -> None:
        relay = self._primary()
        if relay is None:
            if len(self._outbox) >= MAX_OUTBOX:
                self._reject(ERR_OTHER, "outbox full: no relay connected", str(dst), env.uid)
                return
            # wire deadline (wall) -> loop time: timers run on `now`
            self._outbox.append((now + (env.timestamp + env.expiration) - self.wall(now),
                                 env, kind, dst))
            self.stats["outboxed"] += 1
            return
        data = env.SerializeToString()
        self._events.append(SendFrame(relay.name, relay.attempt, data, env.uid, kind, dst))
        self.stats["sent_" + kind] += 1
        self._emit("rmb.peer.sent", env.uid, kind=kind, dst=str(dst), size=len(data),
                   encrypted=encrypted, relay=relay.name)

    def _flush_outbox(self, now: float) -> None:
        while self._outbox and self._primary() is not None:
            expires, env, kind, dst = self._outbox.popleft()
            if expires <= now:
                self._reject(ERR_EXPIRED, "no relay connected before the envelope expired",
                             str(dst), env.uid)
                continue
            self._send(env, kind, dst, now, env.WhichOneof("payload") == "cipher")

    def resend(self, event: SendFrame, now: float) -> None:
        """Re-route a frame whose write failed (after relay_lost) through another relay."""
        env = Envelope()
        env.ParseFromString(event.data)
        self._send(env, event.kind, event.dst, now, env.WhichOneof("payload") == "cipher")

    def _set_payload(self, env: Envelope, data: bytes, twin) -> bool:
        """plain, or cipher when the twin has a pk. Raises E2EError. Returns encrypted."""
        pk = getattr(twin, "pk", None) if twin is not None else None
        if pk and self.e2e_key is not None:
            env.cipher = encrypt(self.e2e_key, pk, data)
            return True
        env.plain = data
        return False

    # ------------------------------------------------------------------ app requests
    def app_message(self, raw: bytes | str, now: float) -> AppRequest | None:
        """Validate one JSON app request popped from `msgbus.system.local`
        {ver, ref?, cmd, exp, dat, tag?, dst:[twin], ret, shm?, now}.

        Returns the AppRequest to resolve twins for (then call send_request), or None when
        it was refused: the app gets an `err` reply (100/101/102) on its `ret` queue when
        `ret` is readable, otherwise the refusal is only logged."""
        ret: str | None = None
        ref: str | None = None
        try:
            obj = _loads_object(raw)
            ret = obj.get("ret") if isinstance(obj.get("ret"), str) and obj.get("ret") else None
            ref = obj.get("ref") if isinstance(obj.get("ref"), str) else None
            if ret is None:
                raise AppMessageError(ERR_INVALID_MESSAGE, "ret must be a non-empty string")
            ref = _opt_str(obj, "ref")
            cmd = obj.get("cmd")
            if not isinstance(cmd, str) or not cmd or len(cmd) > MAX_CMD_LEN:
                raise AppMessageError(ERR_INVALID_MESSAGE, f"cmd must be a string of 1..{MAX_CMD_LEN} chars")
            exp = _int(obj, "exp", 0)
            stamp = _int(obj, "now", 0)
            dst = obj.get("dst")
            if not isinstance(dst, list) or not dst:
                raise AppMessageError(ERR_INVALID_MESSAGE, "dst must be a non-empty list of twin ids")
            if len(dst) > MAX_DESTINATIONS:
                raise AppMessageError(ERR_INVALID_MESSAGE, f"too many destinations: {len(dst)} > {MAX_DESTINATIONS}")
            for d in dst:
                if isinstance(d, bool) or not isinstance(d, int) or not 0 < d <= _MAX_TWIN:
                    raise AppMessageError(ERR_INVALID_MESSAGE, f"bad destination twin {d!r}")
            tags = _opt_str(obj, "tag")
            schema = _opt_str(obj, "shm")
            data = unb64(obj.get("dat"))
            if exp == 0:
                ttl = DEFAULT_TTL
            else:
                wall = self.wall(now)
                remaining = (stamp or wall) + exp - wall
                if remaining <= 0:
                    raise AppMessageError(ERR_EXPIRED, "request expired before it was sent")
                ttl = min(int(math.ceil(remaining)), MAX_TTL)
        except AppMessageError as exc:
            self._reject(exc.code, exc.reason, "local", None)
            if ret is not None:
                self._events.append(PushQueue(ret, _dumps({
                    "ver": 1, "ref": ref, "dat": "", "src": str(self.twin_id), "shm": None,
                    "now": self._stamp(now), "err": {"code": exc.code, "message": exc.reason}}), ""))
            return None
        return AppRequest(ref, cmd, data, tags, list(dst), ret, schema, ttl, self._stamp(now))

    def send_request(self, req: AppRequest, twins: Mapping[int, Any], now: float) -> str:
        """Send `req` to all its destinations with ONE uid and track it.

        twins: destination twin id -> Twin (has .pk), None (unknown: 103 for that
        destination) or an Exception (lookup failed: 500). Returns the uid."""
        uid = req.ref if _is_uuid(req.ref) and req.ref not in self._pending else new_uid()
        deadline = now + req.ttl
        pending = _Pending(uid, req.ref, req.ret, req.cmd, deadline, Counter(req.dst),
                           len(req.dst), now)
        self._pending[uid] = pending
        heapq.heappush(self._deadlines, (deadline, uid))
        record = Backlog(uid=uid, reply_to=req.ret, module=req.cmd, ttl=req.ttl)
        if req.ref is not None:
            record.reference = req.ref
        self._events.append(StoreBacklog(BACKLOG_PREFIX + uid, record.SerializeToString(),
                                         req.ttl, uid))
        self.stats["app_requests"] += 1
        for dst in req.dst:
            twin = twins.get(dst)
            if twin is None or isinstance(twin, BaseException):
                code, text = ((ERR_UNKNOWN_TWIN, f"unknown twin {dst}") if twin is None
                              else (ERR_OTHER, f"twin {dst} lookup failed: {twin}"))
                self._reject(code, text, str(dst), uid)
                self._reply_to_pending(pending, dst, b"", None, self._stamp(now), (code, text), now)
                continue
            env = Envelope(uid=uid, expiration=req.ttl)
            env.request.command = req.cmd
            env.destination.twin = dst
            if req.tags is not None:
                env.tags = req.tags
            if req.schema is not None:
                env.schema = req.schema
            try:
                encrypted = self._set_payload(env, req.data, twin)
            except E2EError as exc:
                self._reject(ERR_E2E, f"e2e error: {exc}", str(dst), uid)
                self._reply_to_pending(pending, dst, b"", None, self._stamp(now),
                                       (ERR_E2E, f"e2e error: {exc}"), now)
                continue
            self._stamp_sign(env, now)
            size = env.ByteSize()
            if size > self.max_envelope:   # the relay would close the connection on it
                text = f"request too large: {size} bytes > envelope limit {self.max_envelope}"
                self._reject(ERR_BAD_PAYLOAD, text, str(dst), uid)
                self._reply_to_pending(pending, dst, b"", None, self._stamp(now),
                                       (ERR_BAD_PAYLOAD, text), now)
                continue
            self._send(env, "request", dst, now, encrypted)
        return uid

    # ------------------------------------------------------------------ replies to the app
    def _answer_app(self, pending_or_ret, src: str, data: bytes, schema: str | None,
                    stamp: int, err: tuple[int, str] | None, uid: str | None = None) -> None:
        if isinstance(pending_or_ret, _Pending):
            ret, ref, uid = pending_or_ret.ret, pending_or_ret.ref, pending_or_ret.uid
            # outcome per (request, destination), the trace report's rule (spark/stages.py):
            # no code or 0 = answered, 102 = expired, any other code = errored
            self.stats["app_answered" if err is None or err[0] == 0 else
                       "app_expired" if err[0] == ERR_EXPIRED else "app_errored"] += 1
        else:
            ret, ref = pending_or_ret
        msg = {"ver": 1, "ref": ref, "dat": b64(data), "src": src, "shm": schema, "now": stamp}
        if err is not None:
            msg["err"] = {"code": err[0], "message": err[1]}
        self._events.append(PushQueue(ret, _dumps(msg), uid or ""))
        self.stats["answered"] += 1
        self._emit("rmb.peer.answered", uid, src=src, code=err[0] if err else 0)

    def _reply_to_pending(self, pending: _Pending, src_twin: int, data: bytes,
                          schema: str | None, stamp: int, err: tuple[int, str] | None,
                          now: float, src: str | None = None) -> None:
        if pending.outstanding[src_twin] > 0:
            pending.outstanding[src_twin] -= 1
            if pending.outstanding[src_twin] == 0:
                del pending.outstanding[src_twin]
        pending.left -= 1
        self._answer_app(pending, src or str(src_twin), data, schema, stamp, err)
        if pending.left <= 0:
            self._pending.pop(pending.uid, None)
            self._completed(pending, now)

    def _seen_request(self, env: Envelope, now: float) -> bool:
        """True when this request (same source twin, uid and timestamp: the same signed
        envelope) was already pushed to a service before its deadline; else remembers it
        until then (at most MAX_DONE). A relay re-delivers the frames a lost connection may
        have swallowed, so a request can arrive twice; the service must see it once. An
        app's retry under the same reference (same uid) is signed anew with a new
        timestamp and is served again."""
        served, order = self._served, self._served_order
        while order and (order[0][0] <= now or len(order) > MAX_DONE):
            when, old = order.popleft()
            if served.get(old) == when:
                del served[old]
        key = (env.source.twin, env.uid, int(env.timestamp))
        if key in served:
            return True
        until = float(env.timestamp) + float(env.expiration)
        served[key] = until
        order.append((until, key))
        return False

    def _completed(self, pending: _Pending, now: float) -> None:
        """Remember a finished request until its TTL is over, so late or duplicated
        replies are dropped without a backlog lookup, and delete its Redis backlog record
        (DropBacklog: the DEL rides in the writer's next pipeline with the reply push)."""
        self._events.append(DropBacklog(BACKLOG_PREFIX + pending.uid, pending.uid,
                                        now - pending.started))
        done, order = self._done, self._done_order
        done[pending.uid] = pending.deadline
        order.append((pending.deadline, pending.uid))
        while order and (order[0][0] <= now or len(order) > MAX_DONE):
            deadline, uid = order.popleft()
            if done.get(uid) == deadline:   # not re-recorded since (a reused uid)
                del done[uid]

    def backlog_reply(self, record: bytes, event: LookupBacklog) -> None:
        """The Backlog record found for an untracked reply: push the reply to its
        `reply_to` with its reference. Garbage records are logged and dropped."""
        bl = Backlog()
        try:
            bl.ParseFromString(record)
        except Exception:  # protobuf DecodeError and friends
            self._reject(ERR_OTHER, "unreadable backlog record", str(event.src_twin), event.uid)
            return
        if not bl.reply_to:
            self._reject(ERR_OTHER, "backlog record without reply_to", str(event.src_twin), event.uid)
            return
        reply = dict(event.reply)
        reply["ref"] = bl.reference if bl.HasField("reference") else None
        self._events.append(PushQueue(bl.reply_to, _dumps(reply), event.uid))
        self._emit("rmb.peer.answered", event.uid, src=reply["src"],
                   code=reply["err"]["code"] if "err" in reply else 0)

    # ------------------------------------------------------------------ incoming frames
    def receive(self, frame: bytes, relay: str, now: float) -> Envelope | None:
        """One binary frame from `relay`. Handles what needs no twin record (garbage,
        pongs, relay errors, expired envelopes) and returns the envelope whose sender
        twin (env.source.twin) the adapter must look up before calling accept()."""
        self.relay_activity(relay, now)
        try:
            env = parse_envelope(frame)
        except EnvelopeError as exc:
            self._reject(ERR_INVALID_MESSAGE, f"invalid envelope: {exc}", relay, None)
            return None
        kind = message_kind(env)
        src_twin = env.source.twin if env.HasField("source") else 0
        self.stats["received_" + kind] += 1
        if self._debug:  # hot path: delivered/answered/rejected carry the trace at info
            self._emit("rmb.peer.received", env.uid, "debug", kind=kind,
                       src=address_str(env.source), size=len(frame), relay=relay)
        if kind in ("ping", "pong"):
            return None
        if env.destination.twin != self.twin_id:
            self._reject(ERR_INVALID_MESSAGE, f"envelope for twin {env.destination.twin}, not us",
                         str(src_twin), env.uid)
            return None
        if src_twin == 0:
            self._relay_error(env, now)
            return None
        if kind == "none":
            self._reject(ERR_INVALID_MESSAGE, "envelope carries no message", str(src_twin), env.uid)
            return None
        if is_expired(env, self.wall(now)):
            self._reject(ERR_EXPIRED, "envelope expired", address_str(env.source), env.uid)
            if kind == "request":
                self._send_error(env, ERR_EXPIRED, "envelope expired", now)
            return None
        return env

    def _relay_error(self, env: Envelope, now: float) -> None:
        if message_kind(env) != "error":
            self._reject(ERR_INVALID_MESSAGE, "envelope without source that is not an error",
                         "0", env.uid)
            return
        pending = self._pending.get(env.uid)
        text = env.error.message or "relay error"
        if pending is None:
            self._reject(ERR_OTHER, f"relay error for an unknown request: {text}", "0", env.uid, "info")
            return
        # A relay error names no twin: attribute it when only one destination is left.
        code = ERR_EXPIRED if "expired" in text else (env.error.code or ERR_OTHER)
        distinct = list(pending.outstanding)
        src_twin = distinct[0] if len(distinct) == 1 else 0
        self.stats["relay_errors"] += 1
        self._reply_to_pending(pending, src_twin, b"", None, self._stamp(now),
                               (code, f"relay: {text}"), now, src=str(src_twin))

    def _send_error(self, env: Envelope, code: int, text: str, now: float) -> None:
        """A signed error envelope answering a refused request (rmb-rs Downstream)."""
        reply = Envelope(uid=env.uid, expiration=ERROR_TTL)
        reply.destination.CopyFrom(env.source)
        reply.error.code = code
        reply.error.message = text
        self._stamp_sign(reply, now)
        self._send(reply, "error", env.source.twin, now, False)

    def accept(self, env: Envelope, sender: Any, now: float) -> None:
        """Finish an envelope returned by receive(). sender: the source twin's record
        (has .account and .pk), None when the twin is unknown, or an Exception when the
        lookup failed. Verifies (104/103/500), decrypts (105/106), dispatches."""
        src = address_str(env.source)
        kind = message_kind(env)
        refusal: tuple[int, str] | None = None
        if sender is None:
            refusal = (ERR_UNKNOWN_TWIN, f"unknown twin {env.source.twin}")
        elif isinstance(sender, BaseException):
            refusal = (ERR_OTHER, f"twin lookup failed: {sender}")
        else:
            try:
                verify_envelope(env, sender.account)
            except SignatureError as exc:
                refusal = (ERR_BAD_SIGNATURE, f"invalid signature: {exc}")
        data = b""
        if refusal is None:
            if env.WhichOneof("payload") == "cipher":
                if not sender.pk:
                    refusal = (ERR_NO_PUBLIC_KEY, "sender twin has no public key")
                elif self.e2e_key is None:
                    refusal = (ERR_E2E, "e2e error: this peer has no e2e key")
                else:
                    try:
                        data = decrypt(self.e2e_key, sender.pk, env.cipher)
                    except E2EError as exc:
                        refusal = (ERR_E2E, f"e2e error: {exc}")
            else:
                data = env.plain
        if refusal is not None:
            self._reject(refusal[0], refusal[1], src, env.uid)
            if kind == "request":
                self._send_error(env, refusal[0], refusal[1], now)
            return
        if kind == "request":
            self._incoming_request(env, data, sender, now, src)
        else:
            self._incoming_reply(env, data, now, src, kind)

    def _incoming_request(self, env: Envelope, data: bytes, sender, now: float,
                          src: str) -> None:
        cmd = env.request.command
        if cmd == "rmb.version":
            reply = Envelope(uid=env.uid, expiration=ERROR_TTL, schema="application/json")
            reply.destination.CopyFrom(env.source)
            reply.response.SetInParent()
            try:
                encrypted = self._set_payload(reply, json.dumps(self.version).encode(), sender)
            except E2EError as exc:
                self._reject(ERR_E2E, f"e2e error: {exc}", src, env.uid)
                return
            self._stamp_sign(reply, now)
            self._send(reply, "response", env.source.twin, now, encrypted)
            return
        if not cmd or len(cmd) > MAX_CMD_LEN:
            self._reject(ERR_INVALID_MESSAGE, "bad command", src, env.uid)
            self._send_error(env, ERR_INVALID_MESSAGE, "bad command", now)
            return
        if self._seen_request(env, now):
            self.stats["duplicate_requests"] += 1
            self._reject(ERR_INVALID_MESSAGE, "duplicate request (already delivered)", src,
                         env.uid, "info")
            return
        msg = {"ver": 1, "ref": env.uid, "src": src, "cmd": cmd, "exp": env.expiration,
               "dat": b64(data), "tag": env.tags if env.HasField("tags") else None,
               "ret": REPLY_QUEUE, "shm": env.schema if env.HasField("schema") else None,
               "now": env.timestamp}
        self._events.append(PushQueue("msgbus." + cmd, _dumps(msg), env.uid))
        self.stats["delivered"] += 1
        self._emit("rmb.peer.delivered", env.uid, cmd=cmd, src=src)

    def _incoming_reply(self, env: Envelope, data: bytes, now: float, src: str,
                        kind: str) -> None:
        if kind == "error":
            error = env.error
            err = (error.code, error.message)
        else:
            err = None
        schema = env.schema if env.HasField("schema") else None
        uid = env.uid
        pending = self._pending.get(uid)
        if pending is None and uid in self._done:
            self.stats["late_replies"] += 1
            self._reject(ERR_EXPIRED, "reply for a request that already completed or expired",
                         src, env.uid, "info")
            return
        if pending is None:
            reply = {"ver": 1, "dat": b64(data), "src": src, "shm": schema, "now": env.timestamp}
            if err is not None:
                reply["err"] = {"code": err[0], "message": err[1]}
            self._events.append(LookupBacklog(BACKLOG_PREFIX + env.uid, env.uid,
                                              env.source.twin, reply))
            return
        if pending.outstanding[env.source.twin] <= 0:  # Counter: no key is inserted
            self._reject(ERR_INVALID_MESSAGE, "reply from a twin the request was not sent to",
                         src, env.uid)
            return
        self._reply_to_pending(pending, env.source.twin, data, schema, env.timestamp, err, now,
                               src=src)

    # ------------------------------------------------------------------ service replies
    def service_message(self, raw: bytes | str, now: float) -> ServiceReply | None:
        """Validate one JSON service reply popped from `msgbus.system.reply`
        {ver, ref, dat, dst, shm?, now, err?}. Returns the ServiceReply to resolve the
        destination twin for (then call send_response), or None when refused (logged; a
        reply with a readable ref and dst but a bad payload answers the requester 101)."""
        uid = None
        try:
            obj = _loads_object(raw)
            uid = obj.get("ref")
            if not isinstance(uid, str) or not uid:
                raise AppMessageError(ERR_INVALID_MESSAGE, "ref must be the request's uid")
            if len(uid) > MAX_UID_LEN:
                bad, uid = uid, None
                raise AppMessageError(ERR_INVALID_MESSAGE,
                                      f"ref of {len(bad)} chars is no envelope uid (at most "
                                      f"{MAX_UID_LEN}): the reply cannot be sent")
            twin, sid = parse_address(obj.get("dst"))
            schema = _opt_str(obj, "shm")
            err = obj.get("err")
            if err is not None:
                if (not isinstance(err, dict) or isinstance(err.get("code"), bool)
                        or not isinstance(err.get("code"), int) or not 0 <= err["code"] <= _MAX_TWIN):
                    raise AppMessageError(ERR_INVALID_MESSAGE, "err must be {code: uint32, message}")
                err = (err["code"], str(err.get("message") or ""))
            try:
                data = unb64(obj.get("dat"))
            except AppMessageError as exc:
                self._reject(exc.code, exc.reason, "local", uid)
                return ServiceReply(uid, twin, sid, b"", None, (exc.code, exc.reason))
        except AppMessageError as exc:
            self._reject(exc.code, exc.reason, "local", uid if isinstance(uid, str) else None)
            return None
        return ServiceReply(uid, twin, sid, data, schema, err)

    def send_response(self, rep: ServiceReply, twin: Any, now: float) -> None:
        """Send the response (or error) envelope for `rep`. twin: the destination twin's
        record (.pk), None (unknown twin: refused with 103, logged) or an
        Exception (lookup failed, logged)."""
        if twin is None or isinstance(twin, BaseException):
            code = ERR_UNKNOWN_TWIN if twin is None else ERR_OTHER
            self._reject(code, f"cannot answer twin {rep.dst_twin}: "
                         + ("unknown twin" if twin is None else f"lookup failed: {twin}"),
                         str(rep.dst_twin), rep.uid)
            return
        env = Envelope(uid=rep.uid, expiration=RESPONSE_TTL)
        env.destination.twin = rep.dst_twin
        if rep.dst_sid is not None:
            env.destination.connection = rep.dst_sid
        if rep.schema is not None:
            env.schema = rep.schema
        encrypted = False
        if rep.err is not None:
            env.error.code = rep.err[0]
            env.error.message = rep.err[1]
            kind = "error"
        else:
            env.response.SetInParent()
            kind = "response"
            try:
                encrypted = self._set_payload(env, rep.data, twin)
            except E2EError as exc:
                env.ClearField("response")
                env.error.code = ERR_E2E
                env.error.message = f"e2e error: {exc}"
                kind = "error"
        self._stamp_sign(env, now)
        size = env.ByteSize()
        if size > self.max_envelope:
            # the relay would refuse it by closing our connection (frames in flight lost):
            # the requester gets a precise error instead, the service's reply is logged
            text = f"reply too large: {size} bytes > envelope limit {self.max_envelope}"
            self._reject(ERR_BAD_PAYLOAD, text, "local", rep.uid)
            env = Envelope(uid=rep.uid, expiration=RESPONSE_TTL)
            env.destination.twin = rep.dst_twin
            if rep.dst_sid is not None:
                env.destination.connection = rep.dst_sid
            env.error.code = ERR_BAD_PAYLOAD
            env.error.message = text
            self._stamp_sign(env, now)
            kind, encrypted = "error", False
        self._send(env, kind, rep.dst_twin, now, encrypted)

    # ------------------------------------------------------------------ twins
    @property
    def twin_ttl(self) -> float:
        """Seconds a record is fresh (the table's TwinFreshness.ttl)."""
        return self.freshness.ttl

    @twin_ttl.setter
    def twin_ttl(self, value: float) -> None:
        self.freshness = replace(self.freshness, ttl=value)

    @property
    def twin_max_stale(self) -> float:
        """Seconds past its TTL a record is served while lookups of it fail."""
        return self.freshness.max_stale

    @twin_max_stale.setter
    def twin_max_stale(self, value: float) -> None:
        self.freshness = replace(self.freshness, max_stale=value)

    # The twin table: the core decides when a record is fresh, needs a refresh, may be
    # served stale, or must be looked up; the adapter only executes LookupTwin. Work that
    # needs a twin without a usable record is parked per twin: a slow or hung lookup
    # delays only the messages that need that twin (nothing awaits inside the core).

    def receive_frame(self, frame: bytes, relay: str, now: float) -> None:
        """One binary frame from `relay`, end to end: receive(), then accept() once the
        sender's record is at hand (at once when the twin table has it)."""
        env = self.receive(frame, relay, now)
        if env is not None:
            twin = env.source.twin
            record = self._fresh(twin, now)
            if record is not None:
                self.accept(env, record, now)
            else:
                self._need((twin,), _Job("accept", env, set()), now)

    def receive_local(self, raw: bytes | str, now: float) -> None:
        """One app request popped from `msgbus.system.local`, end to end: app_message(),
        then send_request() once every destination twin is resolved."""
        req = self.app_message(raw, now)
        if req is not None:
            dst = req.dst
            if len(dst) == 1:
                record = self._fresh(dst[0], now)
                if record is not None:
                    self.send_request(req, {dst[0]: record}, now)
                    return
            self._need(dict.fromkeys(dst), _Job("request", req, set()), now)

    def receive_service_reply(self, raw: bytes | str, now: float) -> None:
        """One service reply popped from `msgbus.system.reply`, end to end:
        service_message(), then send_response() once the destination twin is resolved."""
        rep = self.service_message(raw, now)
        if rep is not None:
            record = self._fresh(rep.dst_twin, now)
            if record is not None:
                self.send_response(rep, record, now)
            else:
                self._need((rep.dst_twin,), _Job("response", rep, set()), now)

    def _fresh(self, twin_id: int, now: float) -> Any:
        """The twin's record when the table holds it fresh with no refresh due (usable
        as it is), else None: the caller takes the general path (_need, _usable). The hot
        path of every message: no _Job, no parking bookkeeping for a twin that needs none."""
        entry = self._twins.get(twin_id)
        if entry is not None and not self.freshness.refresh_due(now - entry.fetched):
            return entry.record
        return None

    def load_twins(self, records: list[tuple[Any, float]], now: float) -> None:
        """Seed the table from the last known state (the daemon's data dir): (record, age
        in seconds) pairs. They are used like records fetched `age` s ago: fresh within
        the TTL, else looked up first and served stale if that fails."""
        for record, age in records:
            self._put_twin(record.id, _TwinEntry(record, now - max(0.0, float(age))))

    def twin_record(self, twin_id: int) -> Any:
        """The record the table holds for `twin_id` (any age) or None. For tests/metrics."""
        entry = self._twins.get(twin_id)
        return entry.record if entry is not None else None

    @property
    def parked_count(self) -> int:
        """Messages waiting for twin lookups."""
        return self._parked_count

    def _put_twin(self, twin_id: int, entry: _TwinEntry) -> None:
        self._twins[twin_id] = entry
        self._twins.move_to_end(twin_id)
        while len(self._twins) > MAX_TWINS:
            self._twins.popitem(last=False)

    def _ask(self, twin_id: int, now: float, refresh: bool) -> None:
        if twin_id in self._lookups:
            return
        self._lookups[twin_id] = now
        self.stats["twin_lookups"] += 1
        self._events.append(LookupTwin(twin_id, refresh))

    def _usable(self, twin_id: int, now: float) -> tuple[str, Any]:
        """("ok", record) | ("unknown", None) | ("failed", reason) | ("wait", None).
        Asks for a lookup when the record is missing, old, or due for refresh."""
        record = self._fresh(twin_id, now)
        if record is not None:
            return "ok", record
        entry = self._twins.get(twin_id)
        if entry is not None:
            rule = self.freshness
            age = now - entry.fetched
            if rule.fresh(age):
                if now >= entry.retry_at:       # refresh due (else _fresh answered)
                    self._ask(twin_id, now, True)
                return "ok", entry.record
            if twin_id in self._lookups and rule.servable(age, within=LOOKUP_TIMEOUT):
                # refresh-ahead in flight past the TTL: use the record until it answers
                self.stats["twin_refresh_grace"] += 1
                return "ok", entry.record
            if entry.failed_since is not None and rule.servable(age):
                if now >= entry.retry_at:
                    self._ask(twin_id, now, True)
                if not entry.stale_logged:
                    entry.stale_logged = True
                    self.stats["twin_stale"] += 1
                    self._emit("rmb.peer.twin_stale", None, "warning", twin=twin_id,
                               stale_s=round(age - rule.ttl, 3))
                return "ok", entry.record
        until = self._unknown.get(twin_id)
        if until is not None:
            if until > now:
                return "unknown", None
            del self._unknown[twin_id]
        self._ask(twin_id, now, False)
        return "wait", None

    def _need(self, twins, job: _Job, now: float) -> None:
        for twin_id in twins:
            status, value = self._usable(twin_id, now)
            if status == "wait":
                job.waiting.add(twin_id)
            else:
                job.results[twin_id] = (value if status == "ok" else None)
        if not job.waiting:
            self._run(job, now)
            return
        if self._parked_count >= MAX_PARKED:
            for twin_id in job.waiting:
                job.results[twin_id] = TwinLookupFailed(
                    f"{MAX_PARKED} messages already wait for twin lookups")
            job.waiting.clear()
            self._run(job, now)
            return
        self._parked_count += 1
        self.stats["parked"] += 1
        for twin_id in job.waiting:
            self._parked.setdefault(twin_id, []).append(job)

    def _run(self, job: _Job, now: float) -> None:
        if job.kind == "accept":
            env = job.item
            self.accept(env, job.results.get(env.source.twin), now)
        elif job.kind == "request":
            self.send_request(job.item, job.results, now)
        else:
            self.send_response(job.item, job.results.get(job.item.dst_twin), now)

    def _unpark(self, twin_id: int, value: Any, now: float) -> None:
        jobs = self._parked.pop(twin_id, ())
        for job in jobs:
            job.waiting.discard(twin_id)
            job.results[twin_id] = value
            if not job.waiting:
                self._parked_count -= 1
                self._run(job, now)

    def twin_resolved(self, twin_id: int, record: Any, now: float) -> None:
        """The registry answered for `twin_id`: its record (has .id, .account, .pk), or
        None when it does not know the twin (103 to whoever waits; remembered
        twin_negative_ttl s). Runs the work parked on it."""
        self._lookups.pop(twin_id, None)
        if record is None:
            self._twins.pop(twin_id, None)
            if self.twin_negative_ttl > 0:
                self._unknown[twin_id] = now + self.twin_negative_ttl
                self._unknown.move_to_end(twin_id)
                while len(self._unknown) > MAX_UNKNOWN:
                    self._unknown.popitem(last=False)
            self._unpark(twin_id, None, now)
            return
        old = self._twins.get(twin_id)
        if old is not None and old.failed_since is not None:
            self._emit("rmb.peer.twin_recovered", None, "info", twin=twin_id,
                       stale_s=round(now - old.failed_since, 3))
        self._unknown.pop(twin_id, None)
        self._put_twin(twin_id, _TwinEntry(record, now))
        self._unpark(twin_id, record, now)

    def twin_lookup_failed(self, twin_id: int, reason: str, now: float) -> None:
        """The lookup of `twin_id` failed (registry unreachable, 5xx, timeout). The last
        known record keeps being served up to twin_max_stale s past its TTL (logged once
        per failure streak); without one, the waiting work fails (500)."""
        self._lookups.pop(twin_id, None)
        self.stats["twin_lookup_failures"] += 1
        entry = self._twins.get(twin_id)
        usable = None
        if entry is not None:
            first = entry.failed_since is None
            if first:
                entry.failed_since = now
                self._emit("rmb.peer.twin_lookup_failed", None, "warning", twin=twin_id,
                           reason=str(reason)[:200])
            entry.retry_at = now + TWIN_RETRY
            age = now - entry.fetched
            if self.freshness.servable(age):
                usable = entry.record
                if not self.freshness.fresh(age) and not entry.stale_logged:
                    entry.stale_logged = True
                    self.stats["twin_stale"] += 1
                    self._emit("rmb.peer.twin_stale", None, "warning", twin=twin_id,
                               stale_s=round(age - self.twin_ttl, 3))
        elif twin_id in self._parked:
            self._emit("rmb.peer.twin_lookup_failed", None, "warning", twin=twin_id,
                       reason=str(reason)[:200])
        self._unpark(twin_id, usable if usable is not None else TwinLookupFailed(str(reason)),
                     now)

    def _lookup_timer(self) -> float | None:
        return min(self._lookups.values()) + LOOKUP_TIMEOUT if self._lookups else None

    def _expire_lookups(self, now: float) -> None:
        late = [t for t, asked in self._lookups.items() if asked + LOOKUP_TIMEOUT <= now]
        for twin_id in late:
            self.twin_lookup_failed(twin_id, f"no answer in {LOOKUP_TIMEOUT:.0f} s", now)
