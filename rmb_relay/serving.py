"""What the relay's HTTP server needs besides the protocol: aiohttp's log turned into
event lines, the reference cycles a closed WebSocket leaves, and the file-descriptor
watch (fd exhaustion reported, a listener the event loop closed re-opened).

Used by rmb_relay.daemon.RelayServer (`ListenerWatch(relay)`, `HttpServerLog(relay)`).
"""
from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import sys
import traceback

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["ListenerWatch", "HttpServerLog", "release_connection_cycles", "fd_limit",
           "raise_fd_limit"]


def fd_limit() -> int:
    try:
        import resource
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        return 0


def raise_fd_limit() -> int:
    """Raises the soft RLIMIT_NOFILE to the hard limit (10,000 peers need 10,000 fds);
    returns the new soft limit."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def release_connection_cycles(request: web.Request, ws: web.WebSocketResponse,
                               transport: asyncio.BaseTransport | None) -> None:
    """Breaks the two reference cycles a closed WebSocket connection is left in, so that
    reference counting frees it (response, RequestHandler, transport, buffers) when its
    handler returns instead of a generation-2 pass of the cyclic GC, which on a daemon's
    heap comes tens of seconds later (2,000 closed connections: all alive 1 s after close,
    none after 70 s).

    1. aiohttp (3.14): WebSocketResponse(heartbeat=...) hands the RequestHandler
       `ws._on_data_received` (a bound method) and nothing clears it, not even
       connection_lost: RequestHandler -> callback -> WebSocketResponse -> Request /
       writers / data queue -> RequestHandler. The WebSocket is closed here (aiohttp's
       close cancelled its heartbeat timers), so the callback has nothing left to do.
    2. aiohttp keeps the error that ended a connection (a reset: ClientConnectionResetError)
       as `ws.exception()`; its traceback holds the frames of the response's own close()
       and receive(), whose locals hold the response. Those frames have returned: their
       locals are cleared (traceback.clear_frames), the error itself is kept.
    3. asyncio (CPython 3.11 selector_events): a socket transport stores its own bound
       `_read_ready__data_received` as `_read_ready_cb`. Only dropped for a transport
       that is closing: close() has removed its reader, so the callback is never called
       again.

    1 and 3 are private attributes of those libraries: each is touched only if present with
    the shape described, so a version without the cycle is left alone."""
    protocol = request.protocol
    if getattr(protocol, "_data_received_cb", None) is not None:
        protocol._data_received_cb = None
    exc, depth = ws.exception(), 0
    while exc is not None and depth < 8:         # the error, its context and cause chain
        traceback.clear_frames(exc.__traceback__)
        exc, depth = exc.__cause__ or exc.__context__, depth + 1
    if transport is not None and transport.is_closing():
        cb = getattr(transport, "_read_ready_cb", None)
        if getattr(cb, "__self__", None) is transport:
            transport._read_ready_cb = None


class HttpServerLog(logging.Logger):
    """The logger handed to aiohttp's HTTP server (its RequestHandler `logger`): what aiohttp
    would print on stderr with a traceback becomes one event line.

    A request aiohttp cannot parse (a request line or header over its 8190-byte limit,
    non-ASCII or malformed request line, bad method: aiohttp.http_exceptions
    HttpProcessingError, logged by aiohttp at debug level for a bad method, else as an
    error) is answered 400 by aiohttp itself; here it is logged as rmb.relay.bad_request
    with the reason and the client address, rate-limited per reason (RelayServer._warn)
    and counted in rmb_relay_bad_requests_total. Anything else aiohttp reports at
    warning level or above ("Unhandled exception" out of a handler) is a bug:
    rmb.relay.bug. Other debug and info messages are dropped."""

    def __init__(self, relay: "RelayServer"):
        super().__init__("rmb.relay.http", logging.DEBUG)
        self.relay = relay

    def isEnabledFor(self, level: int) -> bool:     # noqa: N802 - logging's name
        return True        # aiohttp logs a bad method at debug: _log sorts them out

    def _log(self, level, msg, args, exc_info=None, extra=None, stack_info=False,
             stacklevel=1):
        exc = exc_info if isinstance(exc_info, BaseException) else None
        if exc is None and exc_info:
            exc = sys.exc_info()[1]
        if level < logging.WARNING and not isinstance(exc, HttpProcessingError):
            return
        try:
            text = (msg % args) if args else str(msg)
        except (TypeError, ValueError):
            text = str(msg)
        relay = self.relay
        if isinstance(exc, HttpProcessingError):
            code = getattr(exc, "code", 400) or 400
            detail = getattr(exc, "message", "") or str(exc)
            reason = f"{type(exc).__name__}: {detail}"[:200]
            relay.metrics.bad_requests.labels(type(exc).__name__).inc()
            relay._warn(f"bad request {type(exc).__name__}", "rmb.relay.bad_request", None,
                        status=int(code), reason=reason, src=text.rsplit(" ", 1)[-1][:64])
        else:
            relay.guard.bug(exc if exc is not None else RuntimeError(text[:200]), "HTTP server")




class ListenerWatch:
    """The relay's fd watch: ListenerWatch(relay) uses relay.metrics, relay.events,
    relay.log_limiter, relay._site / _runner / _listen (the listener) and relay.guard."""

    def __init__(self, relay) -> None:
        self.relay = relay
        self.failures = 0          # accept failures since the last accept_failed line

    def _loop_exception(self, loop, context: dict) -> None:
        """asyncio reports accept() failing with EMFILE/ENFILE here (and retries after 1 s);
        count it and log it rate-limited instead of leaving it to the default handler."""
        message = str(context.get("message", ""))
        exc = context.get("exception")
        if "accept" in message and isinstance(exc, OSError):
            self._accept_failed(f"{message}: {exc.strerror or exc}")
            return
        if self.relay._prev_handler is not None:
            self.relay._prev_handler(loop, context)
        else:
            loop.default_exception_handler(context)

    def _accept_failed(self, reason: str) -> None:
        label = "EMFILE" if "Too many open files" in reason or "EMFILE" in reason else "other"
        self.relay.metrics.accept_failed.labels(label).inc()
        self.failures += 1
        emit, _ = self.relay.log_limiter.allow("accept_failed", asyncio.get_running_loop().time())
        if emit:
            self.relay.events.emit("rmb.relay.accept_failed", None, level="error",
                             reason=reason[:200], count=self.failures)
            self.failures = 0

    def _listening(self) -> bool:
        """Is the listening socket still accepting? uvloop closes a server whose accept
        failed (EMFILE) without a word (uvloop streamserver: _fatal_error on an OSError)."""
        server = self.relay._site._server if self.relay._site is not None else None
        if server is None:
            return False
        try:
            socks = server.sockets
            if not socks:
                return False
            return socks[0].getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        except (OSError, AttributeError, ValueError):
            return False

    async def _watch(self) -> None:
        """Every second: re-open the listener if the event loop closed it (fd exhaustion
        under uvloop), flush rate-limited warning summaries."""
        while not self.relay._closing:
            await asyncio.sleep(1.0)
            try:
                now = asyncio.get_running_loop().time()
                for key, count in self.relay.log_limiter.flush(now):
                    self.relay.events.emit("rmb.relay.suppressed", None, level="warning",
                                     reason=key[:200], count=count)
                self._check_fds()
                if not self.relay._closing and not self._listening():
                    self._accept_failed("listener closed by the event loop (fd limit?); "
                                        "re-opening it")
                    try:
                        if self.relay._site is not None:
                            await self.relay._site.stop()
                    except Exception:  # noqa: BLE001 - the old site is already broken
                        pass
                    try:
                        await self.relay._listen()
                    except OSError as exc:
                        self._accept_failed(f"re-opening the listener failed: {exc}")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the guard of this timer entry point
                self.relay.guard.bug(exc, "watchdog")

    def _check_fds(self) -> None:
        """At the fd limit accept() fails: asyncio reports it to _loop_exception, but
        libuv (uvloop) accepts and closes the waiting connections itself without a word
        (uv__emfile_trick). So the open fds are counted here and the limit reported."""
        limit = fd_limit()
        try:
            used = len(os.listdir("/proc/self/fd"))
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):   # not even one fd left to look
                self._accept_failed(f"EMFILE: fd limit {limit} reached; new connections "
                                    "are refused")
            return
        self.relay.metrics.open_fds.set(used)
        if limit > 0 and used >= limit - 2:
            self._accept_failed(f"EMFILE: fd limit reached ({used} open of {limit}); "
                                "new connections are refused")

    def _over_capacity(self) -> bool:
        """True when accepting one more peer would leave fewer than fd_reserve fds."""
        limit = fd_limit()
        server = self.relay._runner.server if self.relay._runner is not None else None
        used = len(server.connections) if server is not None else 0
        return limit > 0 and used + self.relay.fd_reserve >= limit

