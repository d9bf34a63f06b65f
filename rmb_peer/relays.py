"""rmb-peer's relay connections: the executors of the core's relay commands (SendFrame,
SendPing, Connect, Disconnect) and each connection's reader and writer tasks, for
rmb_peer.daemon.PeerDaemon (whose runner, core, log and Redis writer they use). One aiohttp
client WebSocket per relay; the core decides which relay a frame takes, failover and
reconnects (DESIGN.md section 3; seed: rmb.md, "redundancy and failover").
"""
from __future__ import annotations

import asyncio
import socket
from collections import deque

import aiohttp
from aiohttp import WSMsgType
from yarl import URL

from daemon_runtime.linkmodel import delay_transport
from rmb_peer.core import Connect, Disconnect, SendFrame, SendPing
from rmb_peer.envelope import MAX_ENVELOPE_SIZE
from rmb_peer.token import make_token

__all__ = ["RelayLinks", "YIELD_EVERY", "TOKEN_TTL"]

#: Relay frames or queue messages handled in one pass of the event loop. After that many
#: the reading task yields once (asyncio.sleep(0)), so the frames and Redis writes they
#: produced leave (the writer tasks run) before the rest of the burst is handled. Without
#: it a burst was handled whole before any of its output left, and requests travelled
#: in one wave: peer A signed ~250 requests while peer B idled, then B worked while A
#: idled (bench/bench_roundtrip.py: the two peers never ran at once, ~1 core of 2 used).
#: 64: in that bench (256 in flight) 16 and 32 cost more CPU per round trip (smaller
#: batches downstream) for no more throughput; 64 and 128 about the same.
YIELD_EVERY = 64
#: Lifetime of the relay authentication token, seconds.
TOKEN_TTL = 60
#: seconds a shutting-down peer waits for each relay's Close after sending its own (the
#: frames the relay wrote before reading ours are still handled meanwhile)
CLOSE_WAIT = 2.0
#: seconds a connection attempt to a relay (TCP, WebSocket upgrade) may take before it
#: counts as failed and the core's reconnect backoff applies
CONNECT_TIMEOUT = 10.0
#: Linux TCP_CORK (None elsewhere): set while a batch of frames is written.
_TCP_CORK = getattr(socket, "TCP_CORK", None)


def _cork(sock, on: int) -> bool:
    """Set/clear TCP_CORK on a socket; False when not possible (no socket, closed)."""
    if sock is None or _TCP_CORK is None:
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_CORK, on)
        return True
    except OSError:
        return False


class _RelaySocket:
    """An open aiohttp client WebSocket to a relay, with the few operations the daemon
    uses bound once (no extra call per frame): send(bytes) writes a binary frame,
    receive() the next message, ping()/pong(), transport (TCP_CORK, abort)."""
    __slots__ = ("ws", "send", "receive", "ping", "pong", "transport")

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self.ws = ws
        self.send = ws.send_bytes
        self.receive = ws.receive
        self.ping = ws.ping
        self.pong = ws.pong
        self.transport = ws._conn.transport

    @property
    def close_code(self) -> int | None:
        return self.ws.close_code

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.ws.close(code=code, message=reason.encode())


class _Conn:
    """One open relay connection: the websocket, its attempt number and its outgoing
    frames (written in order by one writer task)."""
    __slots__ = ("ws", "attempt", "outq", "sending", "wake", "writer")

    def __init__(self, ws, attempt: int):
        self.ws = ws
        self.attempt = attempt
        self.outq: list[SendFrame] = []
        #: the batch the writer is writing (frames not yet handed to the socket): on a
        #: lost connection they are re-routed with outq, not lost with the writer task
        self.sending: deque[SendFrame] = deque()
        self.wake = asyncio.Event()
        self.writer: asyncio.Task | None = None

    def unsent(self) -> list[SendFrame]:
        """Frames not yet written, in order; empties the connection's queues."""
        frames = list(self.sending) + self.outq
        self.sending, self.outq = deque(), []
        return frames


class RelayLinks:
    """The open relay connections of one PeerDaemon (`conns`: relay URL -> _Conn) and
    the executors of the core's relay commands (module doc)."""

    def __init__(self, daemon):
        self.daemon = daemon
        self.conns: dict[str, _Conn] = {}
        self.http: aiohttp.ClientSession | None = None   # the relay connections' session

    async def close(self, wait: float = CLOSE_WAIT) -> None:
        """Graceful close of every relay connection: a Close frame (1001 going away) is
        sent without ending the connection's read loop, which keeps handing the frames the
        relay wrote before it read that Close to the core (a request goes to its service's
        Redis queue, whose reply the restarted peer sends; a response to its app) until
        the relay's own Close arrives (RFC 6455 section 5.5.1: the other side may send
        data until it has read our Close). aiohttp's ws.close() would read and drop those
        frames, and the relay does not queue them again (the peer may have served them).
        Connections still open after `wait` s are closed as before. aiohttp has no public
        half close: its writer is used; another aiohttp falls back to ws.close()."""
        conns = list(self.conns.items())
        for _relay, conn in conns:
            await self._half_close(conn)
        loop = asyncio.get_running_loop()
        until = loop.time() + wait
        while any(self.conns.get(relay) is conn for relay, conn in conns) \
                and loop.time() < until:
            await asyncio.sleep(0.02)
        for relay, conn in conns:
            if self.conns.get(relay) is conn:
                try:
                    await asyncio.wait_for(conn.ws.close(code=1001, reason="rmb-peer shutting down"), 2.0)
                except (asyncio.TimeoutError, OSError, aiohttp.ClientError):
                    pass

    async def _half_close(self, conn: "_Conn") -> None:
        raw = conn.ws.ws
        writer = getattr(raw, "_writer", None)
        if writer is None or not hasattr(writer, "close"):
            try:
                await asyncio.wait_for(conn.ws.close(code=1001, reason="rmb-peer shutting down"), 2.0)
            except (asyncio.TimeoutError, OSError, aiohttp.ClientError):
                pass
            return
        try:
            await writer.close(1001, b"rmb-peer shutting down")
        except (ConnectionError, RuntimeError, OSError, aiohttp.ClientError):
            pass                 # the connection is gone already: its read loop ends

    async def close_session(self) -> None:
        if self.http is not None:
            await self.http.close()

    def send(self, ev: SendFrame) -> None:
        """Executes SendFrame: queue the frame on its connection (in order), or, when that
        connection is gone, report it lost and hand the frame back to the core."""
        d = self.daemon
        conn = self.conns.get(ev.relay)
        if conn is None or conn.attempt != ev.attempt:
            now = d._now()
            d.core.relay_lost(ev.relay, ev.attempt, now, "connection gone before write")
            d.core.resend(ev, now)
            return
        conn.outq.append(ev)
        conn.wake.set()

    async def _writer(self, relay: str, conn: _Conn) -> None:
        """Writes the connection's frames in order; on a failed write the connection is
        reported lost and its unsent frames are re-routed through another relay. A batch of
        several frames is written with the socket corked (Linux TCP_CORK), so it leaves in
        full-size segments instead of one send per frame."""
        sock = conn.ws.transport.get_extra_info("socket") if _TCP_CORK is not None else None
        while True:
            await conn.wake.wait()
            conn.wake.clear()
            while conn.outq:
                conn.sending = sending = deque(conn.outq)
                conn.outq = []
                corked = len(sending) > 1 and _cork(sock, 1)
                try:
                    while sending:
                        try:
                            await conn.ws.send(sending[0].data)
                        except (OSError, aiohttp.ClientError, RuntimeError) as exc:
                            self._requeue(relay, conn, f"write failed: {exc!r}")
                            return
                        sending.popleft()
                finally:
                    if corked:
                        _cork(sock, 0)

    def _requeue(self, relay: str, conn: _Conn, reason: str) -> None:
        """The connection is lost: every frame not yet written (the writer's batch
        included, even when the writer task was cancelled mid-batch) is re-routed through
        another relay or held in the core's outbox until one connects."""
        d = self.daemon
        now = d._now()
        d.core.relay_lost(relay, conn.attempt, now, reason[:200])
        for ev in conn.unsent():
            d.core.resend(ev, now)
        d.runner.pump()

    def ping(self, ev: SendPing) -> None:
        """Executes SendPing (the pong is the reader's: relay activity)."""
        d = self.daemon
        conn = self.conns.get(ev.relay)
        if conn is None or conn.attempt != ev.attempt:
            return

        async def ping() -> None:
            try:
                await conn.ws.ping()     # the pong is the reader's (relay activity)
            except (OSError, aiohttp.ClientError, RuntimeError):
                pass  # the connection's reader reports the loss
        d.runner.spawn(ping())

    async def _connection(self, relay: str, attempt: int) -> None:
        """One relay connection: connect (token auth), then read frames until it closes;
        the core decides reconnects (Connect)."""
        d = self.daemon
        core = d.core
        token = make_token(d.args.identity, d.twin_id, None, int(d.clock()), ttl=TOKEN_TTL)
        if self.http is None:
            self.http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None))
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                # autoping off: the reader answers pings and sees pongs (relay activity)
                raw = await self.http.ws_connect(
                    URL(f"{relay}/?{token}", encoded=True), autoping=False, heartbeat=None,
                    compress=0, max_msg_size=2 * MAX_ENVELOPE_SIZE,
                    timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=2))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # handshake refused (401...), OSError, timeouts: retry later
            if isinstance(exc, aiohttp.WSServerHandshakeError):   # str() has the token
                why = f"server rejected WebSocket connection: HTTP {exc.status} {exc.message}"
            else:
                why = str(exc) or type(exc).__name__
            core.relay_failed(relay, attempt, d._now(), f"connect failed: {why}"[:200])
            d.runner.pump()
            return
        delay_transport(raw._conn.transport, URL(relay).host or "")   # test only: RELAY_SUITE_LINKS
        ws = _RelaySocket(raw)
        conn = _Conn(ws, attempt)
        conn.writer = d.runner.spawn(self._writer(relay, conn))
        self.conns[relay] = conn
        core.relay_connected(relay, attempt, d._now())
        if relay not in core.live_relays() or d._stopping:
            del self.conns[relay]
            conn.writer.cancel()
            await ws.close()
            d.runner.pump()
            return
        d._connected.set()
        d.runner.pump()
        reason = "closed"
        handled = 0
        receive = ws.receive
        pump_soon = d.runner.pump_soon
        BINARY = WSMsgType.BINARY
        writer = d.writer
        try:
            while True:
                if writer.full:       # Redis is behind: let TCP hold the relay's traffic
                    await writer.room()
                msg = await receive()
                kind = msg.type
                if kind is BINARY:
                    now = d._now()
                    try:
                        core.receive_frame(msg.data, relay, now)
                    except Exception as exc:  # the frame's guard: a bug drops only this frame
                        d._input_error("relay frame", relay, exc)
                    # once the reader yields: the slice's output is dispatched once
                    pump_soon()
                    handled += 1
                    if handled >= YIELD_EVERY:
                        # frames already queued are returned without a pass of the event
                        # loop: let what these produced leave first (see YIELD_EVERY)
                        handled = 0
                        await asyncio.sleep(0)
                elif kind is WSMsgType.PING:
                    core.relay_activity(relay, d._now(), attempt)
                    await ws.pong(msg.data)
                elif kind is WSMsgType.PONG:
                    core.relay_activity(relay, d._now(), attempt)
                    d.runner.pump()
                elif kind is WSMsgType.TEXT:
                    core.relay_activity(relay, d._now(), attempt)
                    if d.log is not None:
                        d.log.emit("rmb.peer.rejected", None, "warning", code=100,
                                   reason="text frame from relay", src=relay)
                elif kind is WSMsgType.CLOSE:
                    reason = f"closed by relay ({ws.close_code} {msg.extra or ''})"
                    break
                elif kind is WSMsgType.ERROR:
                    reason = f"closed: {msg.data!r} ({ws.close_code})"
                    break
                else:  # CLOSING (we close it), CLOSED (connection lost)
                    reason = f"closed ({ws.close_code})"
                    break
        except OSError as exc:
            reason = f"socket error: {exc!r}"
        finally:
            if self.conns.get(relay) is conn:
                del self.conns[relay]
            conn.writer.cancel()
            if not d._stopping:
                self._requeue(relay, conn, reason)

    def connect(self, ev: Connect):
        """Executes Connect: the connection's task (the runner spawns it), none once stopping."""
        d = self.daemon
        return None if d._stopping else self._connection(ev.relay, ev.attempt)

    def disconnect(self, ev: Disconnect) -> None:
        """Executes Disconnect: abort that attempt's socket (its reader reports the loss)."""
        conn = self.conns.get(ev.relay)
        if conn is not None and conn.attempt == ev.attempt:
            conn.ws.transport.abort()
