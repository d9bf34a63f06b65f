"""rmb-relay: the RMB relay daemon (asyncio adapter around rmb_relay.core).

ONE aiohttp server port serves everything, like rmb-rs v1.5.1 (relay/api.rs):

  GET  /?<jwt>   WebSocket upgrade for peers; the JWT is the whole query string.
                 HTTP answers before the upgrade: no query 400, bad or expired token 401,
                 unknown twin 401, twin lookup failure 500 (DESIGN.md section 3).
  POST /         federation from other relays: body = the raw envelope bytes.
                 Authenticated and bounded: the envelope signature is verified
                 with the source twin's account key before anything is queued.
                 202 accepted (delivered or queued), 400 unparsable / expired,
                 401 unsigned, unknown source twin or bad signature, 404 unknown
                 destination twin (nothing queued) or `destination offline` for a
                 `fail-fast` envelope, 413 oversized, 421 destination not served here,
                 429 source relay over --federation-limit or destination queue full,
                 503 shutting down, registry or offline queue failed (the sender retries).
  GET  /metrics  Prometheus text (own CollectorRegistry);  GET /health  JSON.

Why aiohttp on the server side and not the websockets library: rmb-rs serves the WS
upgrade AND the federation POST on the same port and path, and the websockets library's
server cannot answer a POST. Test clients and the benchmark baseline use websockets.

Per envelope from a peer (binary frame; a text frame closes with 1003, bytes that are not
an envelope close with 1007, frames above 2 x --max-size close with 1009):
  parse (rmb_peer.envelope.parse_envelope, --max-size bytes; an oversized or
  destination-less envelope whose uid decodes gets a relay error instead of a close) ->
  RelayRouter.check_inbound (rate limit, source == token's (twin, sid), Ping -> Pong,
  expired -> drop) -> destination connected here -> written to its WebSocket at once (no
  Redis round trip on the hot path; the first frame to a peer in an event-loop pass is
  written at once, the rest of a burst within that pass leaves in one transport write at
  the end of the pass); else twin lookup (rmb_peer.twins.TwinDirectory,
  --registry): relays include one of our --domain values -> queued in Redis, else
  federated (FederationScheduler + aiohttp client POST http://<domain>/).

Offline queue (seed: rmb.md "Peer"; DESIGN.md: "queue for ~1 h, replay on reconnect"):
a Redis stream per (twin, sid), key `rmb.relay.<first domain>.queue.<twin>[:<sid>]`,
at most --queue-maxlen entries: a full queue refuses the NEW envelope (the sender gets
`destination offline queue is full, dropping message`, metric rmb_relay_queue_full;
nothing queued is ever evicted), key EXPIRE --queue-ttl (s), each entry carries its deadline
min(envelope deadline, enqueue + queue-ttl). On (re)connect the stream is replayed in
order; an entry is XDEL'd only after its WebSocket write succeeded; live envelopes for a
connection still replaying go through the stream too, so order is kept.
Tag `fail-fast`: an offline destination gives the relay error `destination offline`.

Relay errors answer requests only (rmb_peer.envelope.relay_error). Events: rmb.relay.*
(rmb_peer/events.py), trace_id = envelope uid; payloads are never logged. Every envelope
from a peer logs at info either `rmb.relay.forwarded` (the live local route: written to the
destination's connection in the same loop pass, one event read as received + delivered by
the trace report) or `rmb.relay.received` and then `delivered` / `queued` / `federated` / an
error (the peer_to_relay and relay_transit stages need both). Event loop: uvloop
when installed (--event-loop).

Robustness: twin records are served stale-while-revalidate up to
--twin-max-stale past their TTL (rmb_relay/lookups.py) and a lookup that must reach the
registry delays only envelopes for that twin; federation out is bounded per domain
(circuit, in-flight cap, job cap: rmb_relay/core/federation.py FederationScheduler); warnings are
rate-limited per reason (rmb.relay.suppressed + rmb_relay_log_suppressed); fd exhaustion
is reported (rmb.relay.accept_failed, rmb_relay_accept_failed, rmb_relay_open_fds); each
entry point (frame, queue item, timer, task, HTTP handler) has one guard that turns an
unexpected exception into rmb.relay.bug without killing the daemon. Extra events:
rmb_relay/events.py.

Structure (DESIGN.md section 2): the decisions live in the sans-I/O RelayCore
(rmb_relay/core/relay.py: per-session state table, routing, twin table, federation plan,
federation-in checks). This module is its asyncio adapter: it feeds the core's inputs
(peer_connected, receive_frame, twin_resolved, enqueued, queue_read, replay_written,
queue_acked, queue_failed, queue_probed, federation_result, receive_federation) through
daemon_runtime's CoreRunner in ordered mode (one pass per input, one timer, one guard;
the task that fed an input executes its commands in order through the runner's executor
table, awaiting the ones that do I/O, so unrelated connections never wait for them)
(WriteFrame / ReplayFrames on aiohttp WebSockets: rmb_relay/peer_io.py; Enqueue,
ReadQueue, AckQueue, ProbeQueue on Redis streams: rmb_relay/offline_queue.py; LookupTwin on
the registry client, PostFederation with aiohttp, CloseConnection, Log to the event log
and metrics through rmb_relay.core.eventmap). Clock: the runner's rule (the core gets
wall-clock unix seconds: envelope expiry compares with wire timestamps; its timer is armed
on the loop clock). Token auth (GET)
stays here: it uses rmb_relay.lookups.TwinLookups (stale-while-revalidate).
"""
from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Callable

import aiohttp
import redis.asyncio as aioredis
from aiohttp import WSCloseCode, web
from prometheus_client import Gauge

from daemon_runtime.eventlog import EventLog
from daemon_runtime.guard import Guard
from daemon_runtime.ratelimit import LogLimiter
from daemon_runtime.redis_server import reconnecting_redis
from daemon_runtime.runner import CoreRunner
from rmb_peer.envelope import MAX_ENVELOPE_SIZE
from rmb_peer.events import RMB_EVENTS
from rmb_peer.twins import DirectoryError, TwinDirectory, UnknownTwin
from rmb_relay.core import (
    AckQueue, CloseConnection, Enqueue,
    FederationAnswer, FederationScheduler, FixedWindowLimiter, Log, LookupTwin, NoLimit,
    PostFederation, ProbeQueue, Ranker, ReadQueue, RelayCore, ReplayFrames, Session,
    WriteFrame,
)
from rmb_relay.core.eventmap import effects_of, reason_label, refusal_of
from rmb_relay.events import RELAY_EVENTS
from rmb_relay.federation_http import FederationHttp
from rmb_relay.lookups import TwinLookups
from rmb_relay.metrics import RelayMetrics
from rmb_relay.offline_queue import OfflineQueue
from rmb_relay.peer_entry import PeerEntry
from rmb_relay.peer_io import COALESCE_MAX, Peer, PeerWriter
from rmb_relay.serving import HttpServerLog, ListenerWatch, fd_limit, raise_fd_limit

__all__ = ["RelayServer", "build_parser", "main", "DEFAULT_PORT"]

DEFAULT_PORT = 8101
#: seconds between the relay's WebSocket pings to each peer (rmb-peer itself pings every 20 s);
#: a peer that does not answer within half of it is closed, so a vanished peer (no FIN) is
#: freed within 1.5 x HEARTBEAT (was 60 s: ~90 s per dead socket)
HEARTBEAT = 20.0
#: a connection lost to the heartbeat (a ping after HEARTBEAT s without input, no pong
#: within half of it) went silent up to 1.5 heartbeats before: the deliveries written to
#: it in that time (+ 2 s) are queued again for its session (RelayCore.peer_disconnected)
UNCONFIRMED_HEARTBEATS = 1.5
#: frames up to this multiple of --max-size are read and answered with a relay error when
#: too large; only larger frames close the connection with 1009
FRAME_FACTOR = 4
#: per source relay: envelopes and bytes per 60 s window on POST / (--federation-limit)
DEFAULT_FEDERATION_LIMIT = (120_000, 512 * 1024 * 1024)
class RelayStartError(RuntimeError):
    """The relay cannot start (Redis unreachable); the text names the URL and the flag."""


class _SessionView:
    """Read-only view of the core's sessions: session -> its Peer (tests, health, close)."""

    def __init__(self, core):
        self._core = core

    def get(self, session: Session):
        c = self._core._sessions.get(session)
        return c.conn if c is not None else None

    def __len__(self) -> int:
        return len(self._core._sessions)

    def items(self):
        return [(sess, c.conn) for sess, c in self._core._sessions.items()]


class RelayServer:
    """The relay bound to host:port (0 = any free port).

        relay = RelayServer(domains=["127.0.0.1:8101"], host="127.0.0.1", port=0,
                            redis_url=..., registry_url=..., events=EventLog(...))
        port = await relay.start()
        ...; await relay.close(grace=5.0)

    domains: this relay's domains (a twin whose relays include one is local);
    limit: (count, size bytes) per 60 s window per twin, or None; ranker_period: s;
    max_size: largest envelope, bytes; queue_ttl: s an offline envelope is kept at most;
    queue_maxlen: approximate entries per offline stream; directory: a TwinDirectory to use
    (else one on registry_url); clock: unix-seconds source (time.time).
    start() raises OSError when the port is taken and redis errors when Redis is down.
    """

    def __init__(self, *, domains: list[str], host: str, port: int, redis_url: str,
                 registry_url: str, events: EventLog, limit: tuple[int, int] | None = None,
                 ranker_period: float = 3600.0, max_size: int = MAX_ENVELOPE_SIZE,
                 queue_ttl: float = 3600.0, queue_maxlen: int = 10000,
                 queue_per_source: int | None = None,
                 directory: TwinDirectory | None = None, clock: Callable[[], float] = time.time,
                 federation_timeout: float = 10.0, rng: random.Random | None = None,
                 heartbeat: float = HEARTBEAT, max_frame: int | None = None,
                 fd_reserve: int = 64,
                 federation_limit: tuple[int, int] | None = DEFAULT_FEDERATION_LIMIT,
                 verify_federation: bool = True, twin_max_stale: float = 3600.0,
                 redis_timeout: float = 5.0):
        self.domains = list(domains)
        self.host, self.port = host, port
        self.events = events
        #: the shared guard (daemon_runtime.guard): every bug an entry point catches is one
        #: rmb.relay.bug line, in full (window=None: lines are not rate-limited here)
        self.guard = Guard(self._bug_line, window=None)
        self.clock = clock
        self.max_size = max_size
        self.queue_ttl = queue_ttl
        self.queue_maxlen = queue_maxlen
        #: entries one sender twin may hold in one twin's offline queue (default: half)
        self.queue_per_source = queue_per_source or max(1, queue_maxlen // 2)
        self.heartbeat = heartbeat
        self.max_frame = max_frame or FRAME_FACTOR * max_size
        self.fd_reserve = fd_reserve
        self.log_limiter = LogLimiter()
        self.verify_federation = verify_federation
        #: per source relay (remote address) fixed 60 s windows on federation POSTs
        self.fed_limiter = FixedWindowLimiter(*federation_limit) if federation_limit else NoLimit()
        self.watch = ListenerWatch(self)
        self._watchdog: asyncio.Task | None = None
        limiter = FixedWindowLimiter(*limit) if limit else NoLimit()
        rng = rng or random.Random()
        self.ranker = Ranker(ranker_period, rng)
        self.federation = FederationScheduler(self.ranker, rng, attempt_timeout=federation_timeout,
                                              max_job_ttl=queue_ttl)
        self.redis_url = redis_url
        #: reconnects and retries after a Redis restart (the queues survive it: AOF)
        self.redis = reconnecting_redis(redis_url)
        #: s an offline-queue command may wait for Redis (--redis-timeout)
        self.redis_timeout = redis_timeout
        #: loop time Redis first did not answer within redis_timeout (None: answering);
        #: meanwhile envelopes for offline twins fail at once and a probe PINGs it
        self.directory = directory or TwinDirectory(registry_url, negative_ttl=10.0,
                                                    on_stale=self._on_stale)
        self._own_directory = directory is None
        #: stale-while-revalidate twin records (rmb_relay.lookups); lookups that must go to
        #: the registry run per destination twin (_chains) so they never block a connection
        self.lookups = TwinLookups(self.directory, max_stale=twin_max_stale,
                                   on_stale=self._on_stale,
                                   on_bug=lambda where, exc: self.guard.bug(exc, where))
        #: the sans-I/O relay core: per-session state, routing, lookups, federation plan;
        #: this class executes its commands (aiohttp, Redis, HTTP federation)
        self.core = RelayCore(self.domains, limiter=limiter, ranker=self.ranker,
                              federation=self.federation, max_size=max_size,
                              queue_ttl=queue_ttl, twin_ttl=self.directory.cache_ttl,
                              twin_max_stale=twin_max_stale,
                              federation_limiter=self.fed_limiter,
                              verify_federation=verify_federation,
                              unconfirmed_s=UNCONFIRMED_HEARTBEATS * heartbeat + 2.0 if heartbeat else 0.0)
        self.router = self.core.router
        self.table = _SessionView(self.core)
        self.metrics = RelayMetrics()
        self.metrics.fed_jobs.set_function(lambda: len(self.federation))
        Gauge("rmb_relay_redis_down_seconds", "seconds since Redis first did not answer within "
              "--redis-timeout (0 while it answers; /health redis.down_s)",
              registry=self.metrics.registry).set_function(
            lambda: 0.0 if self.queues.down_since is None
            else asyncio.get_running_loop().time() - self.queues.down_since)
        self._http: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._fed_tasks: set[asyncio.Task] = set()
        self._tasks: set[asyncio.Task] = set()
        #: the shared core runner (built in start(), on the running loop), ordered mode:
        #: one pass per input, its commands executed in order by the input's own task
        #: (execute), one timer, one guard, the clock rule
        self.runner: CoreRunner | None = None
        self._closing = False
        #: set when close() saved the pending federation jobs: no POST starts after it
        self._outbox_saved = False
        self._prev_handler = None
        #: GET /?<jwt> (peer auth and upgrade) and federation HTTP (POST out and in)
        self.entry = PeerEntry(self)
        self.fed_http = FederationHttp(self)
        #: writes to peer WebSockets (coalescing, replay writes, half close)
        self.writer = PeerWriter(self)
        #: the offline queue and the federation outbox (Redis streams)
        self.queues = OfflineQueue(self)
        self.app = web.Application(client_max_size=max_size)
        self.app.router.add_route("GET", "/", self.entry.handle_get)
        self.app.router.add_route("POST", "/", self.fed_http.handle_post)
        from daemon_runtime.lifecycle import add_status_routes
        add_status_routes(self.app, self.metrics.registry, self.health)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> int:
        """Check Redis, bind and serve; returns the bound port. Raises RelayStartError
        naming the Redis URL and its flag when Redis cannot be reached."""
        try:
            await self.redis.ping()
        except (aioredis.RedisError, OSError) as exc:
            raise RelayStartError(f"cannot reach Redis at {self.redis_url} (set it with "
                                  f"--redis URL): {exc}") from None
        self._http = aiohttp.ClientSession()
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False,
                                     logger=HttpServerLog(self))
        await self._runner.setup()
        self.core.twin_ttl = self.directory.cache_ttl
        self.runner = CoreRunner(self.core, executors=self._executors(), ordered=True,
                                 log=self._bug_line,
                                 name="rmb-relay", wall=lambda: self.clock())
        await self._listen()
        loop = asyncio.get_running_loop()
        self._prev_handler = loop.get_exception_handler()
        loop.set_exception_handler(self.watch._loop_exception)
        self.metrics.fd_limit.set(fd_limit())
        self._watchdog = loop.create_task(self.watch._watch())
        await self.queues.restore_federation()
        return self.port

    async def _listen(self) -> None:
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self._site = site
        self.port = site._server.sockets[0].getsockname()[1]  # aiohttp has no public accessor

    def _on_stale(self, twin, age: float, exc: Exception) -> None:
        """TwinDirectory served a record past its TTL because the registry failed
        (stale-if-error, bounded by --twin-max-stale): one rate-limited line per twin."""
        self.metrics.stale_served.inc()
        self._warn(f"stale twin {twin.id}", "rmb.relay.twin_stale", None, twin=twin.id,
                   stale_s=float(age), reason=str(exc)[:200])

    def _bug_line(self, where: str, exc: BaseException, src: str | None = None) -> None:
        """The log line of the relay's guard (`self.guard`, daemon_runtime.guard.Guard): one
        rmb.relay.bug line per bug, in full (window=None); the runner's guard rate-limits
        its own before they get here."""
        self.events.emit("rmb.relay.bug", None, level="error", src=where,
                         reason=f"{type(exc).__name__}: {exc}"[:300])

    def _warn(self, key: str, event: str, uid: str | None, level: str = "warning",
              **attrs) -> None:
        """A warning line, rate-limited per `key` (reason): at most LogLimiter.burst lines
        per window, then one rmb.relay.suppressed line with the count."""
        emit, suppressed = self.log_limiter.allow(key, asyncio.get_running_loop().time())
        if suppressed:
            self.events.emit("rmb.relay.suppressed", None, level="warning", reason=key[:200],
                             count=suppressed)
        if emit:
            self.events.emit(event, uid, level=level, **attrs)
        else:
            self.metrics.suppressed.labels(reason_label(key)).inc()

    def health(self) -> dict:
        """/health: ok = not closing and Redis answering; `redis.down_s`: seconds since it
        first did not answer within --redis-timeout (0 while it answers)."""
        down = self.queues.down_since
        down_s = 0.0 if down is None else asyncio.get_running_loop().time() - down
        return {"ok": not self._closing and down is None, "service": "rmb-relay",
                "domains": self.domains, "connections": len(self.table),
                "federation_jobs": len(self.federation),
                "redis": {"url": self.redis_url, "answering": down is None,
                          "down_s": round(down_s, 3)}}

    async def close(self, grace: float = 5.0) -> None:
        """Graceful shutdown, a drain bounded by `grace` s (--grace; DESIGN.md section 2):

        1. stop listening; new connections and federation POSTs get 503;
        2. send every peer a Close frame (1001 going away) but keep reading its frames:
           RFC 6455 section 5.5.1 lets a peer send data until it has read our Close, and
           aiohttp's ws.close() would read and DROP those frames (a relay restart lost
           responses that way), so each frame received before the peer's own Close is
           routed as usual: to its destination's session when it can still be written,
           else (the destination was told to go away) to the Redis offline queue;
        3. wait, up to the deadline, until every session answered its Close and every
           routing task it started (twin lookups, offline-queue writes, replays) is done,
           then give federation POSTs in flight the rest of the grace;
        4. federation jobs still pending (backoff, circuit open, or no time left) are saved
           to the Redis federation outbox `rmb.relay.<domain>.federation` and resumed by
           the next start() (OfflineQueue.restore_federation): not expired, not dropped;
        5. sessions that did not answer in time are closed (1001) and cancelled, then
           Redis, the registry client and the HTTP server are released.

        Logs rmb.relay.drained (reason says what was left at the deadline) and
        rmb.relay.federation_outbox. A job whose POST was cancelled at the deadline is
        saved too, so the remote may get it twice (a duplicate is visible by uid; a loss
        is not)."""
        if self._closing:
            return
        self._closing = True
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + max(0.0, grace)
        if self._site is not None:
            self._site._server.close()   # stop listening; aiohttp has no public "pause"
        sessions = len(self.table)
        if self.runner is not None and len(self.federation):
            self.runner.feed(self.core.drain_federation)   # send now, follow moved twins
            await self.runner.execute()
        for _session, peer in self.table.items():
            await self.writer.going_away(peer)
        drained = await self._wait_drained(deadline)
        while len(self.federation) and loop.time() < deadline:
            await asyncio.sleep(0.05)       # attempts, backoffs and retargets keep running
        if self._fed_tasks:
            await asyncio.wait(set(self._fed_tasks), timeout=max(0.0, deadline - loop.time()))
        self._outbox_saved = True
        if self.runner is not None:
            self.runner.close(tasks=False)      # its tasks are cancelled below, with ours
        if self._watchdog is not None:
            self._watchdog.cancel()
        left = [peer for _session, peer in self.table.items()]
        if left:
            for peer in left:
                self.writer.flush(peer)
            closers = [loop.create_task(peer.ws.close(code=WSCloseCode.GOING_AWAY,
                                                      message=b"relay shutting down"))
                       for peer in left]
            await asyncio.wait(closers, timeout=0.5)
        for task in list(self._fed_tasks) + self._routing():
            task.cancel()
        saved = await self.queues.save_federation()
        busy = sum(1 for t in self._routing() if not t.done())
        self.events.emit(
            "rmb.relay.drained", None, level="info" if drained else "warning",
            count=sessions, duration_ms=(loop.time() - started) * 1000.0,
            reason=("drained" if drained else
                    f"drain timeout after {grace:g} s: {len(left)} sessions had not answered "
                    f"their close, {busy} routing tasks cancelled")
            + f"; {saved} federation jobs saved to the outbox")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._http is not None:
            await self._http.close()
        self.lookups.close()
        if self._own_directory:
            await self.directory.close()
        await self.redis.aclose()
        if loop.get_exception_handler() == self.watch._loop_exception:
            loop.set_exception_handler(self._prev_handler)

    async def _wait_drained(self, deadline: float) -> bool:
        """Polls until no session is left (each answered its Close and the frames before it
        were routed) and no routing task (lookup, queue write, replay) runs; False at the
        deadline."""
        loop = asyncio.get_running_loop()
        while True:
            if len(self.table) == 0 and all(t.done() for t in self._routing()):
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.01)

    def _routing(self) -> list[asyncio.Task]:
        """Routing tasks: ours and the runner's (commands of passes nobody executed)."""
        return list(self._tasks) + (list(self.runner.tasks) if self.runner is not None else [])

    def _spawn(self, coro, where: str = "task") -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._task_done(t, where))
        return task

    def _task_done(self, task: asyncio.Task, where: str) -> None:
        """The guard of every background task: an exception escaping one is a logged bug
        (rmb.relay.bug), never an unretrieved-exception warning or a dead daemon."""
        self._tasks.discard(task)
        self._fed_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.guard.bug(task.exception(), where)

    # ------------------------------------------------------------------ HTTP entry
    async def _on_binary(self, peer: Peer, data: bytes) -> str | None:
        """Handles one frame through the core; returns a close reason when the core closed
        this connection (bytes that are not an envelope)."""
        self.metrics.rx_peer.inc()
        self.runner.feed(self.core.receive_frame, peer, data)
        await self.runner.execute(peer)
        return peer.closed

    # ------------------------------------------------------------------ executors
    def _executors(self) -> dict:
        """The runner's executor table (ordered mode: an executor's awaitable is awaited
        before the next command of the same input; see daemon_runtime.runner)."""
        return {WriteFrame: self._write, Log: self._emit, Enqueue: self._enqueue,
                LookupTwin: self._lookup_twin,
                PostFederation: self._post, ReadQueue: self._read, ReplayFrames: self.writer.replay_frames,
                AckQueue: self.queues.ack, ProbeQueue: self._probe,
                FederationAnswer: self._answer, CloseConnection: self._close}

    def _write(self, cmd: WriteFrame):
        out = cmd.conn.out
        if out is not None and cmd.conn.out_bytes <= COALESCE_MAX:
            out.append(cmd)      # PeerWriter.write's held-back case, without a coroutine
            cmd.conn.out_bytes += len(cmd.data)
            return None
        return self.writer.write(cmd)

    async def _enqueue(self, cmd: Enqueue) -> None:
        self.runner.feed(self.core.enqueued, cmd.token, await self.queues.enqueue(cmd))

    def _post(self, cmd: PostFederation) -> None:
        if not self._outbox_saved:
            task = asyncio.get_running_loop().create_task(self.fed_http.post(cmd))
            self._fed_tasks.add(task)
            task.add_done_callback(lambda t: self._task_done(t, "federation POST out"))

    def _read(self, cmd: ReadQueue) -> None:
        cmd.conn.replay_task = self._spawn(self.queues.read(cmd), "offline replay")

    def _probe(self, cmd: ProbeQueue) -> None:
        task = asyncio.get_running_loop().create_task(self.queues.probe())
        task.add_done_callback(lambda t: self._task_done(t, "offline replay retry"))

    def _answer(self, cmd: FederationAnswer) -> None:
        fx = refusal_of(cmd.status, cmd.text)
        if fx is not None:
            self.metrics.fed_refused.labels(fx.label).inc()
            self._warn(fx.limit_key, "rmb.relay.rejected", cmd.uid, reason=cmd.text[:200],
                       src=f"federation {cmd.origin} {cmd.src}".strip(), dst=cmd.dst)
        if not cmd.request.done():
            cmd.request.set_result((cmd.status, cmd.text))

    def _close(self, cmd: CloseConnection):
        """The connection whose read loop executes this (runner.current) is closed in line
        and its loop ends (Peer.closed); another one (replaced) by a task."""
        self.writer.flush(cmd.conn)      # frames held back leave before the Close
        message = cmd.reason.encode()[:120]
        if cmd.conn is self.runner.current:
            cmd.conn.closed = cmd.reason
            return cmd.conn.ws.close(code=cmd.code, message=message)
        self._spawn(cmd.conn.ws.close(code=cmd.code, message=message), "close replaced connection")
        return None

    def _emit(self, cmd: Log) -> None:
        """A core Log command -> its counter and one event line, rate-limited as
        rmb_relay.eventmap says."""
        a = cmd.attrs
        metric, label, key = effects_of(cmd.event, a, cmd.level)
        if metric is not None:
            counter = getattr(self.metrics, metric)
            (counter.labels(label) if label is not None else counter).inc()
        if key is not None:
            self._warn(key, cmd.event, cmd.trace_id, level=cmd.level, **a)
        else:
            self.events.emit(cmd.event, cmd.trace_id, level=cmd.level, **a)

    def _lookup_twin(self, cmd: LookupTwin) -> None:
        self._spawn(self._lookup(cmd.twin, cmd.fresh), "twin lookup")

    async def _lookup(self, twin: int, fresh: bool = False) -> None:
        """LookupTwin's task (only envelopes for this twin wait for it)."""
        try:
            record: object = await self.directory.get(twin, fresh=fresh)
        except (UnknownTwin, DirectoryError) as exc:
            record = exc
        self.runner.feed(self.core.twin_resolved, twin, record)
        done = False
        while not done:
            await self.runner.execute()
            done = self.runner.feed(self.core.chain_done, twin)        # arrivals while queueing

    # ------------------------------------------------------------------ federation out
# ---------------------------------------------------------------------- CLI

def _limit_pair(values: list[int]) -> tuple[int, int]:
    if len(values) != 2 or values[0] <= 0 or values[1] <= 0:
        raise ValueError("--limit takes COUNT SIZE, both positive")
    return values[0], values[1]


def build_parser() -> argparse.ArgumentParser:
    from daemon_runtime.config import add_common_args

    p = argparse.ArgumentParser(
        prog="rmb-relay",
        description="RMB relay (wire-compatible with threefoldtech/rmb-rs v1.5.1): peers connect "
                    "over WebSocket at ws://HOST:PORT/?<jwt>; other relays federate with POST / "
                    "(raw envelope bytes); /metrics and /health on the same port. Options may also "
                    "come from --config FILE (TOML) or RMB_RELAY_<OPTION> env vars; flags win.")
    p.add_argument("-m", "--domain", action="extend", nargs="+", metavar="DOMAIN", default=None,
                   help="this relay's domain(s), e.g. r1.example.com or 127.0.0.1:8101; a twin whose "
                        "relays include one of them is delivered locally, other twins are reached "
                        "by federation. Repeatable, several values allowed (required)")
    p.add_argument("--listen", metavar="HOST:PORT", default=f"127.0.0.1:{DEFAULT_PORT}",
                   help="address to serve on (WebSocket, federation, /metrics, /health); port 0 "
                        "picks a free port, announced as 'READY {\"port\": N, ...}' on stdout "
                        f"(default: 127.0.0.1:{DEFAULT_PORT})")
    p.add_argument("--redis", metavar="URL", default="redis://127.0.0.1:6379/0",
                   help="Redis URL for the offline queues (default: redis://127.0.0.1:6379/0)")
    p.add_argument("--registry", metavar="URL", default="http://127.0.0.1:8100",
                   help="twin registry base URL used to look twins up (default: http://127.0.0.1:8100)")
    p.add_argument("--limit", nargs=2, type=int, metavar=("COUNT", "SIZE"), default=None,
                   help="rate limit per twin: at most COUNT envelopes and SIZE bytes per fixed 60 s "
                        "window; over it the envelope is dropped and the sender gets 'exceeded rate "
                        "limits, dropping message' (default: no limit)")
    p.add_argument("--federation-limit", nargs=2, type=int, metavar=("COUNT", "SIZE"),
                   default=list(DEFAULT_FEDERATION_LIMIT),
                   help="per source relay (remote address): at most COUNT federated envelopes "
                        "and SIZE bytes per fixed 60 s window on POST /; over it the POST gets "
                        "429 (default: %(default)s)")
    p.add_argument("--ranker-period", metavar="SECONDS", type=float, default=3600.0,
                   help="window in which relay failures count against a relay's rank; ranks heal "
                        "after it (default: 3600)")
    p.add_argument("--max-size", metavar="BYTES", type=int, default=MAX_ENVELOPE_SIZE,
                   help=f"largest envelope accepted, bytes; larger ones get a relay error, frames over "
                        f"twice this close the connection with 1009 (default: {MAX_ENVELOPE_SIZE})")
    p.add_argument("--queue-ttl", metavar="SECONDS", type=float, default=3600.0,
                   help="longest time an envelope for an offline twin is kept, and the longest a "
                        "federation retry plan runs (default: 3600)")
    p.add_argument("--queue-maxlen", metavar="N", type=int, default=10000,
                   help="bound on queued envelopes per offline (twin, session); a full queue refuses new envelopes with an error to the sender, nothing is evicted (default: 10000)")
    p.add_argument("--redis-timeout", metavar="SECONDS", type=float, default=5.0,
                   help="longest wait for Redis on an offline-queue command; past it the "
                        "envelope is refused with an error to the sender, Redis is reported "
                        "down (/health, rmb.relay.queue_error) and queue commands fail at once "
                        "until it answers a PING again (default: 5)")
    p.add_argument("--queue-per-source", metavar="N", type=int, default=0,
                   help="entries one sender twin may hold in one twin's offline queue, so a "
                        "sender cannot crowd others out (default: half of --queue-maxlen)")
    p.add_argument("--twin-cache-ttl", metavar="SECONDS", type=float, default=60.0,
                   help="how long a looked-up twin is reused before asking the registry again (default: 60)")
    p.add_argument("--twin-max-stale", metavar="SECONDS", type=float, default=3600.0,
                   help="while the registry cannot be reached, a twin record is still served "
                        "up to this long past its cache TTL (logged as rmb.relay.twin_stale); "
                        "0 = never (default: 3600)")
    p.add_argument("--heartbeat", metavar="SECONDS", type=float, default=HEARTBEAT,
                   help="seconds between the relay's WebSocket pings to each peer; a peer that "
                        "does not answer within half of it is closed and freed "
                        f"(default: {HEARTBEAT:g})")
    p.add_argument("--grace", metavar="SECONDS", type=float, default=10.0,
                   help="drain timeout on SIGTERM/SIGINT: the relay stops accepting, routes "
                        "every frame it already received (to its session or the offline "
                        "queue), closes sessions with 1001 and lets federation attempts in "
                        "flight finish, for at most this long; pending federation jobs are "
                        "saved in Redis and resumed at the next start (default: 10)")
    p.add_argument("--event-loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                   help="asyncio event loop implementation: uvloop (faster I/O; writes to one "
                        "connection within a loop iteration leave in one writev), the standard "
                        "asyncio loop, or auto = uvloop when installed (default: auto)")
    add_common_args(p)
    return p


def _flatten(values) -> list[str]:
    out: list[str] = []
    for v in values or []:
        if isinstance(v, (list, tuple)):
            out.extend(_flatten(v))
        else:
            out.extend(x for x in str(v).replace(",", " ").split() if x)
    return out


def main(argv: list[str] | None = None) -> int:
    """Console script `rmb-relay` (see --help). Exit 0 after SIGTERM/SIGINT."""
    from daemon_runtime.config import load_args
    from daemon_runtime.lifecycle import Ready, parse_hostport, run_daemon, use_event_loop

    parser = build_parser()
    args = load_args(parser, argv, env_prefix="RMB_RELAY_")
    domains = list(dict.fromkeys(_flatten(args.domain)))
    if not domains:
        parser.error("--domain is required (this relay's domain, e.g. 127.0.0.1:8101)")
    try:
        host, port = parse_hostport(args.listen)
    except ValueError as exc:
        parser.error(f"--listen: {exc}")
    limit = None
    if args.limit is not None:
        try:
            limit = _limit_pair(list(args.limit))
        except ValueError as exc:
            parser.error(str(exc))
    for name in ("ranker_period", "max_size", "queue_ttl", "queue_maxlen", "twin_cache_ttl",
                 "heartbeat"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    try:
        _limit_pair(list(args.federation_limit))
    except ValueError as exc:
        parser.error(f"--federation-limit: {exc}")
    if args.twin_max_stale < 0:
        parser.error("--twin-max-stale must be >= 0")
    if args.grace < 0:
        parser.error("--grace must be >= 0")
    if not args.redis_timeout > 0:
        parser.error("--redis-timeout must be > 0 seconds")
    use_event_loop(args.event_loop)
    raise_fd_limit()

    async def run(stop: asyncio.Event) -> None:
        events = EventLog("rmb-relay", domains[0], [RMB_EVENTS, RELAY_EVENTS], sink=args.log,
                          min_level=args.log_level)
        relay = RelayServer(domains=domains, host=host, port=port, redis_url=args.redis,
                            registry_url=args.registry, events=events, limit=limit,
                            ranker_period=args.ranker_period, max_size=args.max_size,
                            queue_ttl=args.queue_ttl, queue_maxlen=args.queue_maxlen,
                            queue_per_source=args.queue_per_source or None,
                            federation_limit=_limit_pair(list(args.federation_limit)),
                            twin_max_stale=args.twin_max_stale, heartbeat=args.heartbeat,
                            redis_timeout=args.redis_timeout,
                            directory=TwinDirectory(args.registry, cache_ttl=args.twin_cache_ttl,
                                                    max_stale=args.twin_max_stale,
                                                    negative_ttl=10.0))
        relay.directory.on_stale = relay._on_stale
        relay._own_directory = True
        try:
            bound = await relay.start()
            Ready(port=bound, service="rmb-relay", domains=domains).announce()
            await stop.wait()
        finally:
            await relay.close(grace=args.grace)
            events.close()

    return run_daemon(run)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

