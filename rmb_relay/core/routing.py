"""Sessions, per-envelope verdicts and routes of the relay core (no I/O, no clock).

seed: rmb.md "Connections", "Relay Domains"; rmb-rs v1.5.1 relay/api.rs Session::route;
DESIGN.md section 3. `ConnectionTable` (one connection per (twin, sid), identity-checked
unregister), `RelayRouter` (rate limit, source check, ping, expiry; local vs federation),
the verdicts (`Forward`, `Reply`, `Drop`) and routes (`Local`, `Federate`, `Refuse`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from rmb_peer.envelope import Envelope, message_kind, relay_error
from rmb_relay.core.errors import (
    ERR_EXPIRED, ERR_NO_RELAYS, ERR_RATE_LIMIT, ERR_WRONG_SOURCE, RelayCoreError,
)
from rmb_relay.core.limits import NoLimit

__all__ = [
    "Session",
    "ConnectionTable",
    "session_of",
    "session_str",
    "normalize_domain",
    "Verdict",
    "Forward",
    "FORWARD",
    "Reply",
    "Drop",
    "Route",
    "Local",
    "Federate",
    "Refuse",
    "RelayRouter",
    "pong_for",
]

Session = tuple[int, "str | None"]

class ConnectionTable:
    """Live peer connections keyed by session (twin id, sid or None).

    seed: rmb.md "Connections": for each (twin-id, session-id) combo there can be only one
    connection; a new connection with the same combo drops the older one.

    `register(session, conn)` returns the connection it replaced (the caller closes it).
    `unregister(session, conn)` removes the entry only if `conn` IS still the registered
    connection, so a replaced connection's cleanup, which runs after the replacement
    registered, leaves the new connection in place. `conn` is any object (compared by
    identity).
    """

    def __init__(self) -> None:
        self._conns: dict[Session, Any] = {}

    def register(self, session: Session, conn: Any) -> Any | None:
        old = self._conns.get(session)
        self._conns[session] = conn
        return old if old is not conn else None

    def unregister(self, session: Session, conn: Any) -> bool:
        """True if `conn` was the registered connection and is now removed."""
        if self._conns.get(session) is conn:
            del self._conns[session]
            return True
        return False

    def get(self, session: Session) -> Any | None:
        return self._conns.get(session)

    def __len__(self) -> int:
        return len(self._conns)

    def items(self) -> list[tuple[Session, Any]]:
        return list(self._conns.items())


def session_of(address) -> Session:
    """(twin, connection or None) of an rmb `Address` (rmb-rs: Address fields 1, 2)."""
    return (int(address.twin), address.connection if address.HasField("connection") else None)


def session_str(session: Session) -> str:
    twin, sid = session
    return f"{twin}:{sid}" if sid is not None else str(twin)


def normalize_domain(domain: str) -> str:
    """'wss://Relay.Example:443/' -> 'relay.example:443' (scheme and trailing '/' dropped,
    lower case), so a twin's relay entries compare with --domain values."""
    d = domain.strip().lower()
    for scheme in ("wss://", "ws://", "https://", "http://"):
        if d.startswith(scheme):
            d = d[len(scheme):]
            break
    return d.rstrip("/")


class Verdict:
    """Base class of RelayRouter.check_inbound results."""


@dataclass
class Forward(Verdict):
    """Route the envelope to its destination (twin lookup, then `route`)."""


#: the one Forward verdict (no fields: shared)
FORWARD = Forward()


@dataclass
class Reply(Verdict):
    """Answer the sender on its own connection with `envelope` (a relay error or a Pong);
    `reason` is the short text for the event log."""
    envelope: Envelope
    reason: str


@dataclass
class Drop(Verdict):
    """Drop the envelope (logged once with `reason`); nothing goes back."""
    reason: str


class Route:
    """Base class of RelayRouter.route results."""


@dataclass
class Local(Route):
    """The destination twin uses this relay: deliver on its connection or queue."""


@dataclass
class Federate(Route):
    """The destination twin uses other relays: federate to `domains` (twin order)."""
    domains: list[str]


@dataclass
class Refuse(Route):
    """No route: answer `text` (relay error for requests, drop otherwise)."""
    text: str


class RelayRouter:
    """Per-envelope decisions for envelopes from connected peers (rmb-rs relay/api.rs
    Session::route; DESIGN.md section 3).

    `check_inbound(session, env, size, now)` in order: rate limit (`exceeded rate limits,
    dropping message`), source == the token's (twin, sid) (`message wrong source`), Ping
    -> Reply(Pong), expired (timestamp + expiration <= now) -> Drop, else Forward.
    Error replies go to requests only (DESIGN.md: relay errors answer requests); for other
    kinds the verdict is Drop with the same reason.

    `route(relays)` given the destination twin's relay domains: Local if one of ours
    (`domains`, several allowed; seed: rmb.md "Relay Domains"), Federate otherwise,
    Refuse(ERR_NO_RELAYS) for an empty list.
    """

    def __init__(self, domains: Iterable[str], limiter: Any = None):
        self.domains = {normalize_domain(d) for d in domains}
        if not self.domains:
            raise RelayCoreError("the relay needs at least one --domain")
        self.limiter = limiter or NoLimit()

    @property
    def _limited(self) -> bool:
        return type(self.limiter) is not NoLimit

    def error(self, env: Envelope, text: str) -> Verdict:
        if message_kind(env) == "request":
            return Reply(relay_error(env, text), text)
        return Drop(text)

    def check_inbound(self, session: Session, env: Envelope, size: int, now: float) -> Verdict:
        # hot path (every envelope from a peer): protobuf attribute reads are the cost here,
        # so each field is read once and the Forward verdict is one shared object
        if self._limited and not self.limiter.allow(session[0], size, now):
            return self.error(env, ERR_RATE_LIMIT)
        if not env.HasField("source"):
            return self.error(env, ERR_WRONG_SOURCE)
        src = env.source
        sid = session[1]
        if src.twin != session[0] or (
                src.HasField("connection") if sid is None
                else (not src.HasField("connection") or src.connection != sid)):
            return self.error(env, ERR_WRONG_SOURCE)
        if env.WhichOneof("message") == "ping":
            return Reply(pong_for(env), "ping")
        if env.timestamp + env.expiration <= now:
            return Drop(ERR_EXPIRED)
        return FORWARD

    def is_local(self, relays: Iterable[str]) -> bool:
        return any(normalize_domain(r) in self.domains for r in relays)

    def route(self, relays: list[str]) -> Route:
        if not relays:
            return Refuse(ERR_NO_RELAYS)
        if self.is_local(relays):
            return Local()
        return Federate(list(relays))


def pong_for(ping: Envelope) -> Envelope:
    """The relay's answer to a Ping envelope (rmb-rs relay/api.rs): same uid, timestamp and
    expiration, message = Pong, source and destination swapped, no signature."""
    pong = Envelope()
    pong.uid = ping.uid
    pong.timestamp = ping.timestamp
    pong.expiration = ping.expiration
    pong.pong.SetInParent()
    if ping.HasField("destination") and ping.destination.twin != 0:
        pong.source.CopyFrom(ping.destination)
    pong.destination.CopyFrom(ping.source)
    return pong
