"""rmb-peer: one twin's gateway between local apps (JSON over Redis lists) and its 1..4
relays (protobuf envelopes over WebSocket). DESIGN.md section 3; seed: rmb.md, "Peer
implementation", "redundancy and failover"; flags mirror rmb-rs v1.5.1 `rmb-peer`.

The protocol logic is rmb_peer.core.PeerCore; this module is its thin asyncio adapter
(the relay connections' executors are rmb_peer.relays.RelayLinks):
- one aiohttp client WebSocket per `--relay` (all connected at once; frames go through
  the first live relay in flag order; failover when it dies; keepalive: a ping after
  --ping-interval (20 s) without a frame, dead when nothing came --ping-timeout (10 s)
  later, reconnect with backoff — decided by the core). aiohttp
  rather than `websockets`: receiving / sending a 229-byte frame costs 2.7 / 4.3 us
  instead of 8.1 / 11.7 us, ~26 us of CPU per round trip through two peers;
- `msgbus.system.local` (app requests) and `msgbus.system.reply` (service replies) read by
  rmb_peer.redisq.QueueReader (BRPOP + RPOP COUNT drains in one round trip); pushes
  (LPUSH + LTRIM 0 9999, one LPUSH per queue per pipeline), backlog SET EX / DEL pipelined
  by rmb_peer.redisq.RedisWriter; a batch of frames to a relay is written with the socket
  corked (TCP_CORK, Linux); a burst (relay frames, queue messages) is handled YIELD_EVERY
  at a time with one pass of the event loop in between, so each slice's output leaves
  while the rest is handled (the next hop starts on it meanwhile), in order;
- the twin table is the core's (TTL --twin-cache-ttl, refresh-ahead, stale-if-error up to
  --twin-max-stale, a negative cache): it asks for lookups (LookupTwin) and this adapter
  runs each as its own task through rmb_peer.twins.TwinDirectory, so a slow registry
  delays only the messages that need the twin being looked up; with --data-dir the records
  are kept in SQLite (rmb_peer.twinstore) and a peer restarted while the registry is down
  starts from them; a peer with no record of its own twin (new, or no --data-dir) starts
  anyway with its identity from its key: /health answers 503 (`registry_down`), apps'
  requests wait in Redis, and the registry is retried with jittered backoff (0.5 s
  doubling to 30 s) until it answers, then the peer starts as usual
  (PeerDaemon._wait_for_registry; docs/rmb-operations.md);
- the event lines of one loop pass (the core's and the adapter's) are checked when
  emitted and written together at the end of the pass (_PassLog: EventLog.emit_many, one
  timestamp and one sink write per pass);
- the loop is daemon_runtime.runner.CoreRunner: the core's commands go to the executors
  in PeerDaemon._executors (one per command type), one timer, and its clock rule (the
  core's `now` is wall-clock unix seconds from `clock`, time.time(); core.wall_offset
  stays 0);
- one guard (the runner's): at an input boundary (relay frame, queue item) an RMB remote
  error (rmb_peer.errors.RmbRemoteError) is a logged drop; anything else, there or in the
  timer, an executor or a task, is a logged bug (rmb.peer.rejected code 500, at most one
  line per entry point and exception type per 5 s) and the daemon goes on;
- at start (unless --no-update) the twin's relay domains and e2e pk are published to the
  registry (created when the account has no twin yet);
- `READY {"twin": .., "relays": [...], "status_port": ..}` on stdout once a relay is
  connected (or after --ready-timeout s with none; at once, with "registry_down": true,
  when the peer waits for the registry); /metrics and /health on
  --status-listen; SIGTERM/SIGINT: stop reading Redis, close relay connections (1001),
  flush pending Redis writes, exit 0.

In-process use (tests, launcher): `PeerDaemon(parse_args([...])).run(stop_event, announce)`.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from typing import Callable
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from redis.exceptions import RedisError

from daemon_runtime.eventlog import EventLog
from daemon_runtime.lifecycle import use_event_loop
from daemon_runtime.redis_server import reconnecting_redis
from daemon_runtime.runner import CoreRunner
from rmb_peer.core import (
    LOCAL_QUEUE, REPLY_QUEUE, Connect, Disconnect, LookupBacklog, LookupTwin, PeerCore,
    PushQueue, SendFrame, SendPing, StoreBacklog, DropBacklog, TWIN_MAX_STALE,
    PING_INTERVAL, PING_TIMEOUT,
)
from rmb_peer.envelope import MAX_ENVELOPE_SIZE
from rmb_peer.errors import RmbRemoteError
from rmb_peer.events import RMB_EVENTS
from rmb_peer.identity import E2EKey, Identity
from rmb_peer.redisq import MAX_PENDING, QueueReader, RedisWriter
from rmb_peer.relays import CLOSE_WAIT, YIELD_EVERY, RelayLinks
from rmb_peer.twins import DirectoryError, RegistryRefused, Twin, TwinDirectory, UnknownTwin
from rmb_peer.twinstore import TwinStore

__all__ = ["PeerDaemon", "build_parser", "parse_args", "relay_url", "relay_domain", "main"]

#: Messages taken from Redis per burst after a BRPOP returned (RPOP key COUNT).
DRAIN_COUNT = 256


def relay_url(value: str) -> str:
    """'ws://host:port', 'wss://host' or bare 'host:port' -> a ws(s):// URL without path."""
    value = value.strip().rstrip("/")
    if "://" not in value:
        value = "ws://" + value
    parts = urlsplit(value)
    if parts.scheme not in ("ws", "wss") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"bad relay URL {value!r} (expected ws://host:port)")
    return f"{parts.scheme}://{parts.netloc}"


def relay_domain(url: str) -> str:
    """The relay domain published in the twin record: 'host:port' of the URL."""
    return urlsplit(url).netloc


def build_parser() -> argparse.ArgumentParser:
    from daemon_runtime.config import add_common_args
    p = argparse.ArgumentParser(
        prog="rmb-peer",
        description="RMB peer gateway for one twin: connects to its relays over WebSocket and "
                    "serves local apps and services through Redis queues (msgbus.system.local, "
                    "msgbus.system.reply, msgbus.<cmd>). Environment variables RMB_PEER_<FLAG> "
                    "and a --config TOML file may set every flag; flags win.")
    key = p.add_argument_group("identity")
    key.add_argument("-m", "--mnemonic", metavar="WORDS",
                     help="BIP-39 mnemonic of the twin's account; the signing key and the "
                          "secp256k1 e2e key are both derived from it")
    key.add_argument("--seed", metavar="HEX",
                     help="32-byte hex seed (optional 0x) instead of --mnemonic")
    key.add_argument("--key-type", choices=("sr25519", "ed25519"), default="sr25519",
                     help="account key type (default: sr25519)")
    key.add_argument("--twin", type=int, metavar="ID",
                     help="twin id; default: looked up in the registry by the account key")
    net = p.add_argument_group("network")
    net.add_argument("--redis", metavar="URL", default="redis://127.0.0.1:6379/0",
                     help="Redis holding the msgbus.* queues (default: redis://127.0.0.1:6379/0); "
                          "one peer per Redis database")
    net.add_argument("--relay", action="append", type=relay_url, metavar="URL",
                     help="relay to connect to, ws://host:port (repeatable, 1..4; all are "
                          "connected, traffic goes through the first live one)")
    net.add_argument("--registry", metavar="URL", default="http://127.0.0.1:8100",
                     help="twin registry base URL (default: http://127.0.0.1:8100)")
    net.add_argument("--no-update", action="store_true",
                     help="do not publish this twin's relay domains and e2e pk to the registry at start")
    net.add_argument("--status-listen", metavar="HOST:PORT", default=None,
                     help="serve /metrics and /health here (port 0 = any free port, announced "
                          "in the READY line); default: not served")
    net.add_argument("--redis-stall-after", type=float, default=5.0, metavar="SECONDS",
                     help="a Redis write waiting this long is a stall: logged once "
                          "(rmb.peer.redis_stalled), /health not ok, metric "
                          "rmb_peer_redis_write_wait_seconds (default: 5)")
    net.add_argument("--redis-max-pending", type=int, default=MAX_PENDING, metavar="N",
                     help="Redis operations waiting to be written at which the peer stops "
                          f"reading relays and local queues until Redis catches up; nothing "
                          f"is dropped (default: {MAX_PENDING})")
    net.add_argument("--twin-cache-ttl", type=float, default=60.0, metavar="SECONDS",
                     help="how long a looked-up twin record is reused; it is refreshed in "
                          "the background after half of it (default: 60)")
    net.add_argument("--twin-max-stale", type=float, default=TWIN_MAX_STALE, metavar="SECONDS",
                     help="while the registry fails, keep using a twin record up to this long "
                          f"past its TTL, logged (default: {TWIN_MAX_STALE:.0f}; 0 = never)")
    net.add_argument("--ping-interval", type=float, default=PING_INTERVAL, metavar="SECONDS",
                     help="ping a relay connection that sent nothing for this long "
                          f"(default: {PING_INTERVAL:g}, the relay's --heartbeat)")
    net.add_argument("--ping-timeout", type=float, default=PING_TIMEOUT, metavar="SECONDS",
                     help="declare the connection dead and reconnect when nothing came this "
                          "long after the ping: a silent relay is noticed after interval + "
                          f"timeout (default: {PING_TIMEOUT:g}, the relay's pong wait)")
    net.add_argument("--max-size", metavar="BYTES", type=int, default=MAX_ENVELOPE_SIZE,
                     help="largest envelope the relays accept (their --max-size): bigger "
                          "requests and service replies are refused with error 101 instead "
                          f"of being sent (default: {MAX_ENVELOPE_SIZE})")
    net.add_argument("--data-dir", metavar="DIR", default=None,
                     help="directory for the peer's durable state (twins.sqlite3: the last "
                          "known twin records, so the peer starts and serves while the "
                          "registry is down); default: none kept")
    net.add_argument("--ready-timeout", type=float, default=10.0, metavar="SECONDS",
                     help="announce READY after this long even if no relay is connected yet (default: 10)")
    net.add_argument("--event-loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                     help="asyncio event loop implementation: uvloop (faster I/O), the standard "
                          "asyncio loop, or auto = uvloop when installed (default: auto)")
    p.add_argument("-d", "--debug", action="store_true",
                   help="debug: write debug-level events (same as --log-level debug)")
    add_common_args(p)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check flags (exit 2 with a message on misuse)."""
    from daemon_runtime.config import load_args
    parser = build_parser()
    args = load_args(parser, argv, env_prefix="RMB_PEER_")
    if bool(args.mnemonic) == bool(args.seed):
        parser.error("give exactly one of --mnemonic/-m and --seed")
    relays = list(dict.fromkeys(args.relay or []))
    if not 1 <= len(relays) <= 4:
        parser.error("give 1..4 distinct --relay URLs")
    args.relay = relays
    if args.twin is not None and not 0 < args.twin < 2**32:
        parser.error("--twin must be 1..2^32-1")
    try:
        if args.mnemonic:
            args.identity = Identity.from_mnemonic(args.mnemonic, args.key_type)
            args.e2e_key = E2EKey.from_mnemonic(args.mnemonic)
        else:
            args.identity = Identity.from_seed(args.seed, args.key_type)
            args.e2e_key = E2EKey.from_seed(args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    if not args.redis_stall_after > 0:
        parser.error("--redis-stall-after must be > 0 seconds")
    if not (args.ping_interval > 0 and args.ping_timeout > 0):
        parser.error("--ping-interval and --ping-timeout must be > 0 seconds")
    if args.redis_max_pending < 1:
        parser.error("--redis-max-pending must be >= 1")
    if args.status_listen is not None:
        from daemon_runtime.lifecycle import parse_hostport
        try:
            args.status_hostport = parse_hostport(args.status_listen)
        except ValueError as exc:
            parser.error(f"--status-listen: {exc}")
    if args.debug:
        args.log_level = "debug"
    return args


#: Buckets (seconds) of rmb_peer_app_round_trip_seconds: around the 2 s objective
#: rmb-round-trip-p99 (spark/sla.toml), up to the default TTL (300 s: an expiry lands there).
#: The objective's threshold must stay a bucket bound (tests/test_prom_rules.py).
ROUND_TRIP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 300.0)


#: rmb_peer_events_total kinds the alert rules read, exported at 0 before they first count
ZERO_KINDS = ("app_answered", "app_errored", "app_expired", "twin_stale")


class _StatsCollector:
    """Exposes PeerCore.stats and connection state as Prometheus metrics."""

    def __init__(self, daemon: "PeerDaemon"):
        self.daemon = daemon

    def describe(self):
        return []

    def collect(self):
        core = self.daemon.core
        c = CounterMetricFamily("rmb_peer_events", "rmb-peer counters by kind", labels=["kind"])
        g = GaugeMetricFamily("rmb_peer_relays_connected", "relay connections open")
        p = GaugeMetricFamily("rmb_peer_pending_requests", "requests waiting for replies")
        w = GaugeMetricFamily("rmb_peer_redis_pending_ops",
                              "Redis operations queued or in flight (not yet written)")
        ww = GaugeMetricFamily("rmb_peer_redis_write_wait_seconds",
                               "seconds the Redis write in flight has waited (0: none)")
        rp = GaugeMetricFamily("rmb_peer_reads_paused",
                               "1 while reading relays and local queues is paused for Redis")
        if core is not None:
            for kind, value in sorted(core.stats.items()):
                c.add_metric([kind], value)
            for kind in ZERO_KINDS:   # at 0 from the start: rate() of a new series misses its first
                if kind not in core.stats:
                    c.add_metric([kind], 0)
            g.add_metric([], len(core.live_relays()))
            p.add_metric([], core.pending_count)
        writer = self.daemon.writer
        if writer is not None:
            w.add_metric([], writer.pending)
            ww.add_metric([], writer.write_wait(self.daemon._loop.time()))
            rp.add_metric([], int(writer.full))
        yield from (c, g, p, w, ww, rp)


class _PassLog:
    """The peer's EventLog with the lines of one event-loop pass written together: emit()
    checks a line at once (catalogue, attributes, level: EventLogError at the caller, as
    EventLog.emit) and keeps it; the first kept line of a pass schedules one flush
    (call_soon), which hands them to EventLog.emit_many: one timestamp and one sink write
    for the pass instead of one each. The lines of a pass are the core's events of one
    slice (YIELD_EVERY messages), none of whose frames or Redis writes leave before the
    pass ends, so the shared timestamp is when they leave. Measured: ~2.5 us of CPU a
    line instead of ~5 (four lines per round trip in the two peers). close() flushes."""
    __slots__ = ("log", "loop", "lines")

    def __init__(self, log: EventLog, loop: asyncio.AbstractEventLoop):
        self.log = log
        self.loop = loop
        self.lines: list[tuple] = []

    def emit(self, event: str, trace_id: str | None = None, level: str = "info",
             **attrs) -> None:
        if self.log.check(event, level, attrs):
            if not self.lines:
                self.loop.call_soon(self.flush)
            self.lines.append((event, trace_id, level, attrs))

    def flush(self) -> None:
        lines, self.lines = self.lines, []
        if lines:
            self.log.emit_many(lines)

    def close(self) -> None:
        self.flush()
        self.log.close()


#: Backoff of the registry retries of a peer that started without any twin record: the
#: first retry after REGISTRY_RETRY_FIRST s, doubling up to REGISTRY_RETRY_MAX s, each
#: jittered by +-20% so peers restarted together do not retry together.
REGISTRY_RETRY_FIRST = 0.5
REGISTRY_RETRY_MAX = 30.0


class _RegistryDown(Exception):
    """The registry could not be reached and --data-dir holds no record of our twin."""


async def resolve_twin(directory: TwinDirectory, store: TwinStore | None, args: argparse.Namespace,
                       twin_id: int | None) -> tuple[Twin, str | None]:
    """Our twin record (registering or updating it, resolve_twin_online) and, when the
    registry was unreachable and the data dir held the last known record, the reason (the
    peer starts offline). _RegistryDown when it was unreachable and the store holds none;
    RuntimeError when the registry refused our record."""
    try:
        return await resolve_twin_online(directory, args, twin_id), None
    except DirectoryError as exc:
        known = store.by_account(args.identity.account) if store else None
        if isinstance(exc, RegistryRefused):
            raise RuntimeError(f"twin registry {args.registry} refused our twin "
                               f"record: {exc}") from None
        if known is None or (twin_id is not None and known[0].id != twin_id):
            raise _RegistryDown(str(exc)) from None
        return known[0], str(exc)


async def resolve_twin_online(directory: TwinDirectory, args: argparse.Namespace, twin_id: int | None) -> Twin:
    """Our twin record from the registry: looked up by account (created when there is
    none, unless --no-update) or by --twin, and updated when its relays or e2e pk differ.
    DirectoryError from the registry; RuntimeError for a twin of another account."""
    ident: Identity = args.identity
    domains = [relay_domain(u) for u in args.relay]
    pk = args.e2e_key.pk
    twin = None
    if twin_id is None:
        try:
            twin = await directory.get_by_account(ident.account)
        except UnknownTwin:
            if args.no_update:
                raise RuntimeError("no twin is registered for this account key "
                                   "(register it, pass --twin, or drop --no-update)") from None
            return await directory.create(ident, domains, pk)
    else:
        twin = await directory.get(twin_id)
        if twin.account != ident.account:
            raise RuntimeError(f"twin {twin_id} belongs to another account key")
    if not args.no_update and (twin.relays != domains or twin.pk != pk):
        twin = await directory.update(ident, twin.id, domains, pk)
    return twin


async def watch_redis(writer: RedisWriter, log, redis_url: str, after: float) -> None:
    """rmb-peer's Redis stall watch (a task): logs a stall once (rmb.peer.redis_stalled,
    when the write in flight has waited `after` s, --redis-stall-after) and its end (rmb.peer.redis_recovered, stalled_s from
    that write's start until this check saw it done: up to a check period late);
    checks four times per stall period, at least once a second."""
    stalled: float | None = None      # in_flight_since of the write logged as stalled
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(min(1.0, after / 4))
        now = loop.time()
        since = writer.in_flight_since
        if stalled is not None and since != stalled:
            log.emit("rmb.peer.redis_recovered", None, "warning", redis=redis_url,
                     stalled_s=round(now - stalled, 3), pending=writer.pending)
            stalled = None
        if stalled is None and since is not None and now - since >= after:
            stalled = since
            log.emit("rmb.peer.redis_stalled", None, "error", redis=redis_url,
                     waited_s=round(now - since, 3), pending=writer.pending, paused=writer.full)


class PeerDaemon:
    """The asyncio adapter around PeerCore (see the module docstring). `args` is the
    namespace of parse_args(); `clock` gives wall-clock unix seconds (time.time), the
    core's `now` (daemon_runtime.runner's clock rule)."""

    def __init__(self, args: argparse.Namespace, clock: Callable[[], float] = time.time):
        self.args = args
        self.clock = clock
        self.core: PeerCore | None = None
        self.log: _PassLog | None = None
        self.twin_id: int | None = args.twin
        # the core owns the twin table: the directory only does HTTP (no cache of its own)
        self.directory = TwinDirectory(args.registry, cache_ttl=0.0, max_stale=0.0)
        self.store: TwinStore | None = None
        self.redis: aioredis.Redis | None = None
        self.writer: RedisWriter | None = None
        self.links = RelayLinks(self)      # the relay connections (rmb_peer.relays)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.runner: CoreRunner | None = None
        self._stopping = False
        self._connected = asyncio.Event()
        self.metrics = CollectorRegistry()
        self.metrics.register(_StatsCollector(self))
        self.m_round_trip = Histogram(
            "rmb_peer_app_round_trip_seconds",
            "an app's request sent to its destinations -> its last reply (or expiry) pushed to the app",
            buckets=ROUND_TRIP_BUCKETS, registry=self.metrics)
        self.status_port: int | None = None
        self._status_runner = None
        self._announced = False
        #: None while the registry answered at start; else why our twin record is
        #: still unknown (the peer waits for the registry: /health is not ok)
        self.registry_down: str | None = None

    # ------------------------------------------------------------------ startup
    async def _wait_for_registry(self, stop: asyncio.Event, announce, reason: str):
        """Start without a twin record: the registry is unreachable and --data-dir holds no
        record of ours (a new peer). The peer's identity is its key; what needs no twin
        record runs now (the event log, /health and /metrics on --status-listen, the READY
        line with twin null), /health answers 503 with registry_down, and the registry is
        retried with jittered exponential backoff (REGISTRY_RETRY_FIRST doubling to
        REGISTRY_RETRY_MAX s). Returns our Twin once the registry answers, None if `stop`
        is set first. Apps' requests wait in Redis meanwhile (their TTL still applies).
        Raises what _resolve_twin raises other than _RegistryDown (a refusal is final)."""
        self.registry_down = reason
        node = str(self.twin_id) if self.twin_id is not None \
            else f"account:{self.args.identity.account.hex()[:16]}"
        self.log = _PassLog(EventLog("rmb-peer", node, [RMB_EVENTS], sink=self.args.log,
                                     min_level=self.args.log_level), self._loop)
        await self._start_status()
        started = self._loop.time()
        delay, tries = REGISTRY_RETRY_FIRST, 1
        self.log.emit("rmb.peer.registry_wait", None, "warning", reason=reason[:200],
                      count=tries, retry_s=delay)
        self._announce(announce)
        while True:
            try:
                await asyncio.wait_for(stop.wait(), delay * random.uniform(0.8, 1.2))
                return None
            except asyncio.TimeoutError:
                pass
            try:
                twin, _ = await resolve_twin(self.directory, self.store, self.args, self.twin_id)
            except _RegistryDown as exc:
                tries += 1
                delay = min(delay * 2, REGISTRY_RETRY_MAX)
                self.registry_down = str(exc)
                if tries % 10 == 0:
                    self.log.emit("rmb.peer.registry_wait", None, "warning",
                                  reason=str(exc)[:200], count=tries, retry_s=delay)
                continue
            self.log.log.node = str(twin.id)
            self.log.emit("rmb.peer.twin_recovered", None, "info", twin=twin.id,
                          stale_s=round(self._loop.time() - started, 3))
            self.registry_down = None
            return twin

    async def _start_status(self) -> None:
        if self.args.status_listen is not None and self._status_runner is None:
            from daemon_runtime.lifecycle import start_status_server
            host, port = self.args.status_hostport
            self._status_runner, self.status_port = await start_status_server(
                host, port, self.metrics, self.health)

    def _announce(self, announce, relays: list[str] | None = None) -> None:
        """The READY line (or announce(info)), once."""
        if self._announced:
            return
        self._announced = True
        info = {"service": "rmb-peer", "twin": self.twin_id, "relays": relays or [],
                "status_port": self.status_port}
        if self.registry_down is not None:
            info["registry_down"] = True
        if announce is not None:
            announce(info)
        else:
            from daemon_runtime.lifecycle import Ready
            Ready(**info).announce()

    async def run(self, stop: asyncio.Event,
                  announce: Callable[[dict], None] | None = None) -> None:
        """Run until `stop` is set; announce(info) once ready (default: the READY line)."""
        self._loop = asyncio.get_running_loop()
        if getattr(self.args, "data_dir", None):
            self.store = TwinStore(self.args.data_dir)
        try:
            await self._run(stop, announce)
        finally:
            # also when startup failed before _shutdown (registry or Redis unreachable):
            # the directory's HTTP session, else aiohttp prints "Unclosed client session"
            await self.directory.close()
            if self.store is not None:
                self.store.close()

    async def _run(self, stop: asyncio.Event, announce) -> None:
        try:
            twin, offline = await resolve_twin(self.directory, self.store, self.args, self.twin_id)
        except _RegistryDown as exc:
            try:
                twin = await self._wait_for_registry(stop, announce, str(exc))
            except BaseException:
                await self._close_early()
                raise
            if twin is None:                   # stopped while waiting for the registry
                await self._close_early()
                return
            offline = None
        self.twin_id = twin.id
        if self.log is None:
            self.log = _PassLog(EventLog("rmb-peer", str(self.twin_id), [RMB_EVENTS],
                                         sink=self.args.log, min_level=self.args.log_level),
                                self._loop)
        if offline is not None:
            self.log.emit("rmb.peer.started_offline", None, "warning", twin=twin.id,
                          reason=offline[:200])
        # e2e only when the registry publishes OUR pk: nobody could decrypt otherwise
        e2e_key = self.args.e2e_key if twin.pk == self.args.e2e_key.pk else None
        if e2e_key is None:
            self.log.emit("rmb.peer.rejected", None, "warning", code=105, src="registry",
                          reason="the twin record does not hold this peer's e2e pk: "
                                 "sending plain text (drop --no-update to publish it)")
        self.core = PeerCore(self.twin_id, self.args.identity, e2e_key,
                             list(self.args.relay), log=self.log,
                             debug=self.args.log_level == "debug",
                             max_envelope=self.args.max_size,
                             ping_interval=self.args.ping_interval,
                             ping_timeout=self.args.ping_timeout)
        self.runner = CoreRunner(self.core, executors=self._executors(), log=self._bug_line,
                                 name="rmb-peer", wall=self.clock)
        self.core.twin_ttl = self.args.twin_cache_ttl
        self.core.twin_max_stale = self.args.twin_max_stale
        now = self._now()
        if self.store is not None:
            if offline is None:
                self.store.put(twin, self.clock())
            self.core.load_twins(self.store.load(self.clock()), now)
        # retries a command across a Redis restart (daemon_runtime.redis_server)
        self.redis = reconnecting_redis(self.args.redis)
        try:
            await self.redis.ping()
        except (RedisError, OSError) as exc:
            await self.redis.aclose()
            raise RuntimeError(f"cannot reach Redis at {self.args.redis} (set it with "
                               f"--redis): {exc}") from None
        self.writer = RedisWriter(self.redis, on_error=self._redis_failed,
                                  max_pending=self.args.redis_max_pending)
        self.writer.start()
        self._spawn(watch_redis(self.writer, self.log, self.args.redis, self.args.redis_stall_after))
        await self._start_status()
        status_runner = self._status_runner
        self.core.start(self._now())
        self.runner.pump()
        local = asyncio.get_running_loop().create_task(self._local_loop())
        try:
            try:
                await asyncio.wait_for(self._connected.wait(), self.args.ready_timeout)
            except asyncio.TimeoutError:
                pass
            self._announce(announce, self.core.live_relays())
            stopper = asyncio.get_running_loop().create_task(stop.wait())
            await asyncio.wait({stopper, local}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if local.done() and local.exception() is not None:
                raise local.exception()
        finally:
            await self._shutdown(local, status_runner)

    async def _close_early(self) -> None:
        """Shutdown of a peer stopped (or failed) while waiting for the registry."""
        self._stopping = True
        if self._status_runner is not None:
            await self._status_runner.cleanup()
            self._status_runner = None
        if self.log is not None:
            self.log.close()

    async def _shutdown(self, local: asyncio.Task, status_runner) -> None:
        self._stopping = True
        local.cancel()
        await self.links.close()
        # frames read while closing whose source twin is being looked up (its signature
        # key) are handed on when the lookup answers: give them the close's time again
        loop = asyncio.get_running_loop()
        until = loop.time() + CLOSE_WAIT
        while self.core is not None and self.core.parked_count and loop.time() < until:
            await asyncio.sleep(0.02)
        self.runner.pump()      # the commands of the frames read while closing (Redis pushes)
        tasks = list(self.runner.tasks)
        self.runner.close()
        await asyncio.gather(local, *tasks, return_exceptions=True)
        await self.links.close_session()
        if self.writer is not None:
            await self.writer.close()
        if self.redis is not None:
            await self.redis.aclose()
        if status_runner is not None:
            await status_runner.cleanup()
        if self.log is not None:
            self.log.close()

    def health(self) -> dict:
        """/health: ok = a relay is up, Redis is not stalled, not stopping, our twin record
        known (`registry_down`: why not, else null); `redis`: pending
        operations, seconds the write in flight has waited, whether reads are paused."""
        core = self.core
        live = core.live_relays() if core else []
        writer = self.writer
        wait = writer.write_wait(self._loop.time()) if writer is not None else 0.0
        stalled = wait >= self.args.redis_stall_after
        return {"ok": bool(live) and not stalled and not self._stopping
                and self.registry_down is None, "service": "rmb-peer",
                "twin": self.twin_id, "registry_down": self.registry_down, "relays": {n: r.state for n, r in core.relays.items()} if core else {},
                "pending": core.pending_count if core else 0,
                "redis": {"url": self.args.redis, "stalled": stalled,
                          "pending_ops": writer.pending if writer is not None else 0,
                          "write_wait_s": round(wait, 3),
                          "reads_paused": bool(writer is not None and writer.full)}}

    def _redis_failed(self, exc: Exception, n: int) -> None:
        if self.log is not None:
            what = (f"redis write failed, {n} operations dropped" if n
                    else "redis read failed")
            self.log.emit("rmb.peer.rejected", None, "error", code=500,
                          reason=f"{what} ({self.args.redis}, --redis): {exc!r}"[:200],
                          src="redis")

    def _bug_line(self, what: str, exc: BaseException, src: str | None) -> None:
        """The runner's bug line: rmb.peer.rejected, code 100 for an RMB remote error that
        reached the guard (a drop), else code 500 (an internal error)."""
        if self.log is None:
            return
        if isinstance(exc, RmbRemoteError):
            self.log.emit("rmb.peer.rejected", None, "warning", code=100, src=src or what,
                          reason=f"{what}: {exc}"[:200])
        else:
            self.log.emit("rmb.peer.rejected", None, "error", code=500, src=src or what,
                          reason=f"internal error on {what}: {type(exc).__name__}: {exc}"[:200])

    def _spawn(self, coro) -> asyncio.Task:
        """A task the runner tracks (its exception goes to the guard)."""
        return self.runner.spawn(coro)

    def _now(self) -> float:
        """The core's `now`: wall-clock unix seconds (the runner's clock rule)."""
        return self.clock()

    def _input_error(self, what: str, src: str, exc: Exception) -> None:
        """An input boundary's guard: an RMB remote error is a logged drop, anything else
        a bug (the runner's guard); the daemon goes on either way."""
        if isinstance(exc, RmbRemoteError):
            if self.log is not None:
                self.log.emit("rmb.peer.rejected", None, "warning", code=100, src=src,
                              reason=f"{what}: {exc}"[:200])
        else:
            self.runner.bug(exc, what, src)

    def _executors(self) -> dict:
        """The core's commands -> what executes them (the runner dispatches by type)."""
        links = self.links
        return {PushQueue: self._push, SendFrame: links.send, StoreBacklog: self._store_backlog,
                DropBacklog: self._drop_backlog, LookupTwin: self._lookup_twin,
                LookupBacklog: self._lookup_backlog, Connect: links.connect,
                SendPing: links.ping, Disconnect: links.disconnect}

    def _push(self, ev: PushQueue) -> None:
        self.writer.push(ev.queue, ev.payload)

    def _store_backlog(self, ev: StoreBacklog) -> None:
        self.writer.set(ev.key, ev.record, ev.ttl)

    def _drop_backlog(self, ev: DropBacklog) -> None:
        self.writer.delete(ev.key)
        if ev.elapsed is not None:
            self.m_round_trip.observe(ev.elapsed)

    async def _lookup_twin(self, ev: LookupTwin) -> None:
        """Execute LookupTwin: ask the registry, hand the answer to the core, keep the
        record in the data dir."""
        try:
            twin = await self.directory.get(ev.twin)
        except UnknownTwin:
            twin = None
        except DirectoryError as exc:
            self.core.twin_lookup_failed(ev.twin, str(exc), self._now())
            self._after()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the task's guard: a bug fails this lookup only
            self.runner.bug(exc, "twin lookup", "registry")
            self.core.twin_lookup_failed(ev.twin, f"internal error: {exc!r}", self._now())
            self._after()
            return
        if self.store is not None:
            try:
                if twin is None:
                    self.store.delete(ev.twin)
                else:
                    self.store.put(twin, self.clock())
            except Exception as exc:  # sqlite3.Error, OSError: the table still works
                self.runner.bug(exc, "twin store write", str(self.args.data_dir))
        self.core.twin_resolved(ev.twin, twin, self._now())
        self._after()

    def _after(self) -> None:
        """Execute the core's commands, then re-arm the timer (a pass of the runner)."""
        self.runner.pump()

    async def _lookup_backlog(self, ev: LookupBacklog) -> None:
        try:
            record = await self.redis.get(ev.key)
        except (RedisError, OSError) as exc:
            self._redis_failed(exc, 1)
            return
        if record is not None:
            self.core.backlog_reply(record, ev)
        elif self.log is not None:
            self.log.emit("rmb.peer.rejected", ev.uid, "info", code=102,
                          reason="reply for an unknown or expired request", src=str(ev.src_twin))
        self._after()

    # ------------------------------------------------------------------ local queues
    async def _local_loop(self) -> None:
        """App requests and service replies through a QueueReader (BRPOP and RPOP COUNT
        drains in one round trip), handled in order, YIELD_EVERY at a time; the core's
        events are executed after each slice."""
        reader = QueueReader(self.redis, [LOCAL_QUEUE, REPLY_QUEUE], DRAIN_COUNT, timeout=1)
        local_b = LOCAL_QUEUE.encode()
        writer = self.writer
        try:
            while not self._stopping:
                if writer.full:       # Redis is behind: the queues keep the requests
                    await writer.room()
                try:
                    items = await reader.read()
                except (RedisError, OSError) as exc:
                    self._redis_failed(exc, 0)
                    await asyncio.sleep(1.0)
                    continue
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the task's guard: logged, the loop goes on
                    self._input_error("queue read", LOCAL_QUEUE, exc)
                    await asyncio.sleep(1.0)
                    continue
                while items:
                    batch, items = items[:YIELD_EVERY], items[YIELD_EVERY:]
                    self._local_batch(batch, local_b)
                    if items:
                        try:
                            await asyncio.sleep(0)   # what `batch` produced leaves now
                        except asyncio.CancelledError:
                            self._local_batch(items, local_b)  # popped: never dropped
                            raise
        finally:
            await reader.close()

    def _local_batch(self, items: list[tuple[bytes, bytes]], local_b: bytes) -> None:
        """Queue items in order, then the core's events."""
        now = self._now()
        for key, raw in items:
            self._local_message(key == local_b, raw, now)
        self._after()

    def _local_message(self, local: bool, raw: bytes, now: float) -> None:
        """One app request (local) or service reply, with the queue item's guard. Nothing
        is awaited: twins not in the core's table are looked up by separate tasks and only
        the messages that need them wait."""
        try:
            if local:
                self.core.receive_local(raw, now)
            else:
                self.core.receive_service_reply(raw, now)
        except Exception as exc:  # the queue item's guard: a bug drops only this item
            self._input_error("local message", LOCAL_QUEUE if local else REPLY_QUEUE, exc)


def main(argv: list[str] | None = None) -> int:
    """Console script `rmb-peer` (see --help). Exit 0 after SIGTERM/SIGINT."""
    from daemon_runtime.lifecycle import run_daemon
    args = parse_args(argv)
    use_event_loop(args.event_loop)

    async def run(stop: asyncio.Event) -> None:
        await PeerDaemon(args).run(stop)

    return run_daemon(run)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
