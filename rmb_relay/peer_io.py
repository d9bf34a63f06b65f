"""The relay's writes to peer WebSockets: one frame at once, bursts coalesced into one
transport write per loop pass, backpressure on slow readers, the half close of a
graceful shutdown, and offline replay writes (RelayCore's WriteFrame and ReplayFrames
commands). `PeerWriter(relay)` uses relay.runner (a write that fails goes back to the
core: write_failed), relay._spawn, relay._emit, relay.metrics and relay.events.
"""
from __future__ import annotations

import asyncio

from aiohttp import WSCloseCode, web
from websockets.frames import Frame, Opcode

from rmb_relay.core import ReplayFrames, Session, WriteFrame, session_str

__all__ = ["Peer", "PeerWriter", "COALESCE_MAX"]


class Peer:
    """One authenticated WebSocket connection."""

    __slots__ = ("ws", "session", "name", "replay_task", "transport", "out", "out_bytes",
                 "closed")

    def __init__(self, ws: web.WebSocketResponse, session: Session, transport=None):
        self.ws = ws
        self.session = session
        self.name = session_str(session)
        self.replay_task: asyncio.Task | None = None
        self.transport = transport     # for write coalescing (PeerWriter.write)
        #: None: no write yet in this loop pass; else the WriteFrames held back for the
        #: end of the pass (PeerWriter.flush), in order
        self.out: list[WriteFrame] | None = None
        self.out_bytes = 0             # their size
        #: the reason when the core closed it from its own read loop (CloseConnection)
        self.closed: str | None = None


#: Write coalescing: at most this many bytes of frames are held back for one peer within a
#: loop pass (then flushed at once), and the transport's buffer above this makes the
#: writer wait for the socket to drain (backpressure, as aiohttp's own writer does).
COALESCE_MAX = 1 << 18


def _binary_frame(data: bytes) -> bytes:
    """One unfragmented, unmasked (server to client) binary frame, framed by the websockets
    library (RFC 6455; the relay's WebSocketResponse negotiates no extension)."""
    return Frame(Opcode.BINARY, data).serialize(mask=False, extensions=[])


class PeerWriter:
    """See the module doc."""

    def __init__(self, relay) -> None:
        self.relay = relay

    async def send(self, peer: Peer, data: bytes) -> bool:
        """Writes one frame at once (frames held back for this peer go first, so the order
        on the wire is the order of the calls). False when the connection is closed."""
        if peer.out:
            self.flush(peer)
        if peer.ws.closed:
            return False
        try:
            await peer.ws.send_bytes(data)
            return True
        except (ConnectionError, RuntimeError):
            return False

    async def write(self, cmd: WriteFrame) -> bool:
        """Executes a WriteFrame, coalescing bursts: the first frame to a peer in a loop
        pass is written at once (no added latency); later ones in the same pass are held
        back and leave together at the end of the pass (`flush`, call_soon) in ONE
        transport write, instead of one write (a send syscall) each (measured: the
        per-frame write was the relay's largest cost per envelope). A frame's log line
        and live-delivery count follow its write, wherever it happens; a frame that
        cannot be written goes back to the core (write_failed: its offline queue); True
        then (the caller runs the core's new commands)."""
        peer = cmd.conn
        out = peer.out
        if out is None or peer.transport is None:
            if out is None and peer.transport is not None:
                if peer.transport.get_write_buffer_size() > COALESCE_MAX:
                    await self.drain(peer)     # a slow reader: wait before writing more
                peer.out = []
                peer.out_bytes = 0
                asyncio.get_running_loop().call_soon(self.flush, peer)
            if await self.send(peer, cmd.data):
                self.written(cmd)
            elif cmd.session is not None:
                self.relay.runner.feed(self.relay.core.write_failed, cmd)     # closed meanwhile: queue it
                return True
            return False
        out.append(cmd)
        peer.out_bytes += len(cmd.data)
        if peer.out_bytes > COALESCE_MAX or peer.transport.get_write_buffer_size() > COALESCE_MAX:
            self.flush(peer)
            await self.drain(peer)
        return False

    def written(self, cmd: WriteFrame) -> None:
        log = cmd.log
        if log is not None:
            self.relay.metrics.dl_live.inc()
            self.relay.events.emit_attrs(log.event, log.trace_id, log.level, log.attrs)

    def flush(self, peer: Peer) -> None:
        """Writes the frames held back for `peer` (see write) in one transport write and
        ends its loop pass; frames of a connection closed meanwhile go back to the core."""
        out, peer.out = peer.out, None
        if not out:
            return
        transport = peer.transport
        if peer.ws.closed or transport is None or transport.is_closing():
            requeue = False
            for cmd in out:
                if cmd.session is not None:
                    self.relay.runner.feed(self.relay.core.write_failed, cmd)
                    requeue = True
            if requeue:
                self.relay.runner.execute_soon()
            return
        transport.write(b"".join([_binary_frame(cmd.data) for cmd in out]))
        logs = [(log.event, log.trace_id, log.level, log.attrs) for log in
                [cmd.log for cmd in out] if log is not None]
        if logs:        # one moment, one write: one timestamp, one write of the lines
            self.relay.metrics.dl_live.inc(len(logs))
            self.relay.events.emit_many(logs)

    @staticmethod
    async def drain(peer: Peer) -> None:
        """Waits while the peer's socket does not take more (the protocol was paused by the
        transport's high-water mark): what aiohttp's writer does after 64 KiB of writes."""
        proto = peer.transport.get_protocol()
        drain = getattr(proto, "_drain_helper", None)
        if drain is not None and getattr(proto, "_paused", False):
            try:
                await drain()
            except (ConnectionError, RuntimeError):
                pass          # closed: the next write fails and is handled there

    async def going_away(self, peer: Peer) -> None:
        """Sends `peer` a Close frame (1001 going away) without ending our read loop: its
        _serve_peer keeps routing the frames that arrive until the peer's own Close. Our
        writes to it fail from now on (aiohttp: writer closing), so deliveries to this
        session go to its offline queue (write_failed). aiohttp has no public call for a
        half close: its writer is used; another aiohttp falls back to ws.close()."""
        ws = peer.ws
        self.flush(peer)
        if ws.closed:
            return
        writer = getattr(ws, "_writer", None)
        cancel_heartbeat = getattr(ws, "_cancel_heartbeat", None)
        if writer is None or cancel_heartbeat is None or not hasattr(writer, "close"):
            self.relay._spawn(ws.close(code=WSCloseCode.GOING_AWAY, message=b"relay shutting down"),
                        "close on shutdown")
            return
        cancel_heartbeat()       # no ping into a closing connection, no pong timeout
        try:
            await writer.close(WSCloseCode.GOING_AWAY, b"relay shutting down")
        except (ConnectionError, RuntimeError, OSError):
            pass                 # the connection is gone already: its read loop ends

    async def replay_frames(self, cmd: ReplayFrames) -> None:
        """ReplayFrames executor: writes in order, stops at the first failed write."""
        done = 0
        for _entry_id, data, log in cmd.items:
            if data is not None:
                if not await self.send(cmd.conn, data):
                    break
                self.relay.metrics.dl_replay.inc()
            if log is not None:
                self.relay._emit(log)
            done += 1
        self.relay.runner.feed(self.relay.core.replay_written, cmd.conn, done)
