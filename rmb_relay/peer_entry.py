"""Peer connections: GET /?<jwt> (DESIGN.md section 3, "Peer -> relay authentication"):
HTTP answers before the upgrade (no query 400, bad or expired token 401, unknown twin
401, twin lookup failure 500, 503 while shutting down or near the fd limit, 426 for a
WebSocket version other than 13), then the WebSocket (heartbeat, close timeout) is served: each binary frame goes to
relay._on_binary (the core), a text frame closes with 1003. `PeerEntry(relay)` uses relay.lookups (twin records), relay.metrics,
relay._warn and relay.watch (fd capacity).
"""
from __future__ import annotations

import asyncio

from aiohttp import WSMsgType, web

from daemon_runtime.linkmodel import delay_transport
from rmb_peer.token import TokenError, token_claims_unverified, verify_token
from rmb_peer.twins import DirectoryError, UnknownTwin
from rmb_relay.core import CLOSE_REPLACED, CLOSE_UNSUPPORTED, Session
from rmb_relay.peer_io import Peer
from rmb_relay.serving import fd_limit, release_connection_cycles

__all__ = ["PeerEntry", "CLOSE_TIMEOUT", "WS_VERSION"]

#: seconds aiohttp waits for the peer's close frame after we close (its default is 10 s)
CLOSE_TIMEOUT = 2.0
#: The only WebSocket protocol version the relay speaks (RFC 6455 section 4.1: 13)
WS_VERSION = "13"


class PeerEntry:
    """See the module doc."""

    def __init__(self, relay) -> None:
        self.relay = relay

    def _refuse(self, status: int, reason: str) -> web.Response:
        self.relay.metrics.auth_failed.labels(str(status)).inc()
        self.relay._warn(f"auth {status} {reason[:40]}", "rmb.relay.auth_failed", None, status=status,
                   reason=reason)
        return web.Response(status=status, text=reason + "\n")

    async def handle_get(self, request: web.Request) -> web.StreamResponse:
        """Peer connections: the guard of this entry point (unexpected -> logged bug)."""
        try:
            return await self._entry(request)
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception as exc:  # noqa: BLE001 - one guard per entry point (DESIGN.md 2)
            self.relay.guard.bug(exc, "peer connection")
            return web.Response(status=500, text="internal error\n")

    async def _entry(self, request: web.Request) -> web.StreamResponse:
        if self.relay._closing:
            return web.Response(status=503, text="relay shutting down\n")
        if self.relay.watch._over_capacity():
            self.relay.metrics.capacity_refused.inc()
            self.relay._warn("at connection capacity", "rmb.relay.auth_failed", None, status=503,
                       reason=f"at connection capacity (fd limit {fd_limit()})")
            return web.Response(status=503, text="relay at connection capacity\n")
        version = request.headers.get("Sec-WebSocket-Version")
        if version is not None and version != WS_VERSION:
            # RFC 6455 4.2.2 / 4.4: a version the server does not speak is answered 426
            # with the version it does speak (aiohttp itself would also take 7 and 8)
            self.relay.metrics.auth_failed.labels("426").inc()
            self.relay._warn("auth 426 websocket version", "rmb.relay.auth_failed", None,
                       status=426, reason=f"unsupported Sec-WebSocket-Version "
                                          f"{version[:16]!r}: only {WS_VERSION} is spoken")
            return web.Response(status=426, text=f"Sec-WebSocket-Version {WS_VERSION} only\n",
                                headers={"Sec-WebSocket-Version": WS_VERSION})
        token = request.rel_url.raw_query_string
        if not token:
            return self._refuse(400, "missing token: connect to ws://host:port/?<jwt>")
        now = self.relay.clock()
        try:
            claims = token_claims_unverified(token)
            try:
                twin = await self.relay.lookups.get(claims["sub"])
            except UnknownTwin:
                raise TokenError(401, f"unknown twin {claims['sub']}") from None
            except DirectoryError as exc:
                raise TokenError(500, f"twin lookup failed: {exc}") from None
            twin_id, sid = verify_token(token, twin.account, int(now))
        except TokenError as exc:
            return self._refuse(exc.status, exc.reason)
        # heartbeat: a WS ping every HEARTBEAT s; no pong within half of it closes the
        # connection (a silently lost peer is detected instead of queueing into a dead socket)
        ws = web.WebSocketResponse(max_msg_size=self.relay.max_frame, autoping=True, compress=False,
                                   heartbeat=self.relay.heartbeat, timeout=CLOSE_TIMEOUT)
        if not ws.can_prepare(request).ok:
            return self._refuse(400, "expected a WebSocket upgrade")
        await ws.prepare(request)
        transport = request.transport
        delay_transport(transport, request.remote or "")   # test only: RELAY_SUITE_LINKS
        try:
            await self.serve(ws, (twin_id, sid), transport)
        finally:
            release_connection_cycles(request, ws, transport)
        return ws

    async def serve(self, ws: web.WebSocketResponse, session: Session,
                          transport: asyncio.BaseTransport | None = None) -> None:
        peer = Peer(ws, session, transport)
        self.relay.runner.feed(self.relay.core.peer_connected, peer, session)
        self.relay.metrics.connections.set(len(self.relay.table))
        await self.relay.runner.execute(peer)
        reason = "closed by peer"
        lost = False        # died without a close handshake (RelayCore.peer_disconnected)
        try:
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    try:
                        closed = await self.relay._on_binary(peer, msg.data)
                    except (asyncio.CancelledError, ConnectionError):
                        raise
                    except Exception as exc:  # noqa: BLE001 - the frame guard (DESIGN.md 2):
                        # remote errors were answered inside; anything else is our bug, the
                        # frame is dropped, the connection and the daemon live on
                        self.relay.guard.bug(exc, f"frame from {peer.name}")
                        continue
                    if closed:
                        reason = closed
                        break
                elif msg.type == WSMsgType.TEXT:
                    reason = "text frame: envelopes are binary protobuf"
                    self.relay.writer.flush(peer)
                    await ws.close(code=CLOSE_UNSUPPORTED, message=reason.encode())
                    break
                elif msg.type == WSMsgType.ERROR:
                    reason = f"websocket error: {ws.exception()}"
                    lost = True
                    break
            else:
                if ws.close_code == CLOSE_REPLACED:
                    reason = "replaced by a newer connection"
        finally:
            # the core's table is identity-checked: a replaced connection's cleanup leaves
            # the new one registered
            relay = self.relay
            # its log lines at once; commands of other inputs stay for their callers
            relay.runner.feed_now(lambda now: relay.core.peer_disconnected(peer, now, reason, lost))
            self.relay.metrics.connections.set(len(self.relay.table))
            if peer.replay_task is not None and not peer.replay_task.done():
                peer.replay_task.cancel()
            # a cancelled task keeps its CancelledError, whose traceback holds OfflineQueue.read's
            # frame and so this peer: peer -> task -> error -> frame -> peer is a cycle
            peer.replay_task = None
