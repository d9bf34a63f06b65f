"""asyncio UDP adapter for transport.TransportCore (thin: feed, drain events, flush, re-arm
one timer; the aioquic `asyncio/protocol.py` pattern of DESIGN.md section 2).

    core = TransportCore(key, {peer_public_key: ("127.0.0.1", port), ...})
    ep = await UdpEndpoint.create(core, ("127.0.0.1", 0), on_payload)
    ep.send(peer_key_id, payload)          # core.send + flush
    ep.send_many(peer_key_id, [p1, p2])    # core.send_many (bundles) + flush
    ...
    ep.close()

`on_payload(src_key_id, payload, now)` runs for every reassembled, authenticated payload;
`on_drop(event: DatagramDropped)` (optional) for every dropped datagram (the core counts
them all in `core.counters`; without on_drop the adapter logs them through `logging`,
at most one line per reason per 10 s). An exception in a callback is logged and never
stops the endpoint (the one boundary of this adapter).

Faults (test-only): loss / duplicate / reorder probabilities applied to datagrams leaving
this endpoint (and arriving, with `inbound=True`), seeded, so tests can run real sockets
under the issue's "20% loss, duplication and reordering at every adapter".
"""
from __future__ import annotations

import asyncio
import logging
import random
import socket
from dataclasses import dataclass
from typing import Callable

from daemon_runtime.ratelimit import LogLimiter

from .core import DatagramDropped, PayloadReceived, TransportCore

__all__ = ["UdpEndpoint", "Faults"]

log = logging.getLogger("remp_node.transport.udp")

#: Default SO_RCVBUF / SO_SNDBUF of an endpoint (bytes).
SOCKET_BUFFER = 4 << 20


@dataclass
class Faults:
    """Test-only fault injection at the adapter (probabilities in [0, 1], per datagram).

    loss: drop; duplicate: send a second copy; reorder: delay by uniform(0, reorder_delay)
    seconds so later datagrams overtake it; seed: the random.Random seed; inbound: also
    apply to datagrams arriving at this endpoint (default: only leaving ones)."""

    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    reorder_delay: float = 0.02
    seed: int = 0
    inbound: bool = False

    def __post_init__(self):
        for name in ("loss", "duplicate", "reorder"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"Faults.{name} = {v} not in [0, 1]")
        self.rng = random.Random(self.seed)
        self.stats = {"lost": 0, "duplicated": 0, "reordered": 0}

    def plan(self, addr=None) -> list[float]:
        """Delays (seconds) of the copies to deliver for one datagram ([] = lost); `addr`
        (its destination) is for per-destination models (daemon_runtime.linkmodel)."""
        if self.loss and self.rng.random() < self.loss:
            self.stats["lost"] += 1
            return []
        copies = 2 if self.duplicate and self.rng.random() < self.duplicate else 1
        if copies == 2:
            self.stats["duplicated"] += 1
        out = []
        for _ in range(copies):
            if self.reorder and self.rng.random() < self.reorder:
                self.stats["reordered"] += 1
                out.append(self.rng.uniform(0.0, self.reorder_delay))
            else:
                out.append(0.0)
        return out


class UdpEndpoint(asyncio.DatagramProtocol):
    """One UDP socket driving one TransportCore. Create with `await UdpEndpoint.create(...)`."""

    def __init__(self, core: TransportCore, on_payload: Callable[[bytes, bytes, float], None], *,
                 faults: Faults | None = None, on_drop: Callable[[DatagramDropped], None] | None = None,
                 loop: asyncio.AbstractEventLoop | None = None):
        self.core = core
        self.on_payload = on_payload
        self.on_drop = on_drop
        self.faults = faults
        self.loop = loop or asyncio.get_running_loop()
        self.transport: asyncio.DatagramTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._log_limit = LogLimiter(burst=1, window=10.0)   # one line per reason per 10 s
        self.closed = asyncio.Event()

    @classmethod
    async def create(cls, core: TransportCore, bind: tuple[str, int],
                     on_payload: Callable[[bytes, bytes, float], None], *, faults: Faults | None = None,
                     on_drop: Callable[[DatagramDropped], None] | None = None,
                     loop: asyncio.AbstractEventLoop | None = None,
                     socket_buffer: int | None = SOCKET_BUFFER) -> "UdpEndpoint":
        """Bind a UDP socket at `bind` (host, port; port 0 picks one) and return the endpoint.
        socket_buffer: SO_RCVBUF / SO_SNDBUF in bytes (best effort, the kernel caps it at
        net.core.rmem_max / wmem_max); None keeps the system default (~208 KiB), which a
        burst of 64 KiB messages in 1,232-byte parts overflows."""
        loop = loop or asyncio.get_running_loop()
        ep = cls(core, on_payload, faults=faults, on_drop=on_drop, loop=loop)
        await loop.create_datagram_endpoint(lambda: ep, local_addr=bind)
        sock = ep.transport.get_extra_info("socket")
        if socket_buffer and sock is not None:
            for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                try:
                    sock.setsockopt(socket.SOL_SOCKET, opt, socket_buffer)
                except OSError as exc:    # not fatal: the default buffer still works
                    log.warning("cannot set UDP socket buffer to %d bytes: %s", socket_buffer, exc)
        return ep

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) actually bound."""
        return self.transport.get_extra_info("sockname")[:2]

    # -- asyncio.DatagramProtocol --------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        f = self.faults
        if f is not None and f.inbound:
            for delay in f.plan():
                if delay:
                    self.loop.call_later(delay, self._receive, data, addr)
                else:
                    self._receive(data, addr)
            return
        self._receive(data, addr)

    def error_received(self, exc) -> None:   # e.g. ICMP port unreachable on Linux
        self._log_once("socket_error", f"UDP socket error: {exc}")

    def connection_lost(self, exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.closed.set()

    # -- driving the core ----------------------------------------------------------------------
    def _receive(self, data: bytes, addr) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        now = self.loop.time()
        self.core.receive_datagram(data, addr[:2], now)
        self._process(now)

    def send(self, dst: bytes, payload: bytes) -> None:
        """core.send(dst, payload, now) and flush. Raises transport.TransportError for an
        unknown dst or an oversized payload (local misuse)."""
        now = self.loop.time()
        self.core.send(dst, payload, now)
        self._flush(now)

    def send_many(self, dst: bytes, payloads: list[bytes]) -> None:
        """core.send_many(dst, payloads, now) (small ones share datagrams) and flush; same
        errors as send."""
        now = self.loop.time()
        self.core.send_many(dst, payloads, now)
        self._flush(now)

    def _process(self, now: float) -> None:
        core = self.core
        while True:
            ev = core.next_event()
            if ev is None:
                break
            try:
                if isinstance(ev, PayloadReceived):
                    self.on_payload(ev.src, ev.payload, now)
                elif isinstance(ev, DatagramDropped):
                    if self.on_drop is not None:
                        self.on_drop(ev)
                    else:
                        self._log_once(ev.reason, f"dropped datagram: {ev.reason} from {ev.addr} "
                                                  f"({ev.size} bytes); total {core.counters['dropped_' + ev.reason]}")
            except Exception:  # a callback bug must not stop the endpoint
                log.exception("UdpEndpoint callback failed on %s", type(ev).__name__)
        self._flush(now)

    def _flush(self, now: float) -> None:
        tr = self.transport
        if tr is None or tr.is_closing():
            return
        f = self.faults
        for data, addr in self.core.datagrams_to_send(now):
            if f is None:
                tr.sendto(data, addr)
                continue
            for delay in f.plan(addr):
                if delay:
                    self.loop.call_later(delay, self._sendto_late, data, addr)
                else:
                    tr.sendto(data, addr)
        self._arm()

    def _sendto_late(self, data: bytes, addr) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(data, addr)

    def _arm(self) -> None:
        at = self.core.get_timer()
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at is not None:
            self._timer = self.loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        now = self.loop.time()
        self.core.handle_timer(now)
        self._process(now)

    def _log_once(self, key: str, text: str) -> None:
        if self._log_limit.allow(key, self.loop.time())[0]:
            log.warning(text)

    def close(self) -> None:
        """Close the socket (idempotent)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
