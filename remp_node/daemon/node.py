"""The REMP daemons: `remp-node validator` and `remp-node fullnode` (thin asyncio adapters
around the sans-I/O cores; DESIGN.md section 2).

Both roles: typed config (daemon_runtime.config: --config TOML < env REMP_NODE_* < flags),
--help, one HTTP port for /metrics, /health (and the full node's API, remp_node/api/server.py),
SIGTERM/SIGINT graceful shutdown, a READY line, the JSON event log through eventmap.py, the
datagram endpoint of remp_node/transport/endpoint.py with the test-only --faults flag.

The loop is daemon_runtime.runner.CoreRunner with the daemon as its core: a pass runs the
role's step (every sub-core's due timers and output, the journal or status write, the
events through the role's tables, each sub-core drained by the runner's dispatch) and sends the step's datagrams; one timer at the
earliest sub-core deadline (at least every second); datagrams read within STEP_COALESCE s
share one pass. Clock (the runner's rule): the cores' `now` is time.time(), the Unix time
base the zerostate's genesis_time and the wallets' valid_until use, so every process
agrees on master sessions; the timer is armed on the loop's clock as `deadline - now`.

Validator: ValidatorCore with its ValidatorStore (store.py) journal: after every step the
adapter takes datagrams_to_send(now), writes journal_updates() to SQLite (fsync), and only
then sends the datagrams. A validator restarted with its data dir replays the journal
(master commit certificates), catches up from peers (getCommits, getDifference) and signs
again (validator.py, "restarts").

Full node: RempClient (client.py) + ChainFollower (follower.py: the full node applies
accepted master and shard blocks to its own state, which the client's pre-checks use); its
statuses go to FullnodeStore, the API's subscribers and the Redis stream (api.py).

The one error boundary (the runner's guard): remote garbage is a counted, logged drop (the
cores do that); anything else raised by a core call is counted (remp_errors{where}) and
logged as remp.node.error at most once per entry point and kind per 5 s, and the daemon
keeps running.
"""
from __future__ import annotations

import argparse
import asyncio
import time
import traceback
from typing import Callable
from collections import Counter
from pathlib import Path

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter as PCounter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from daemon_runtime.config import add_common_args, load_args
from daemon_runtime.eventlog import EventLog
from daemon_runtime.lifecycle import Ready, add_status_routes, parse_hostport, run_daemon, use_event_loop
from daemon_runtime.ratelimit import LogLimiter
from daemon_runtime.runner import CoreRunner

from ..api.server import DEFAULT_MAX_PENDING, DEFAULT_PENDING_FLOOR, DEFAULT_PENDING_SECONDS
from ..core.client import LATE_MEMORY
from ..core.delivery import DEFAULT_WINDOW, INITIAL_WINDOW, MAX_WINDOW, DeliveryError, ReceiptDelivered, ReceiptReceiver, ReceiptSender
from ..transport.endpoint import open_endpoint, parse_faults
from ..core.eventmap import (SERVICE_FULLNODE, SERVICE_MASTERCHAIN, SERVICE_VALIDATOR, client_records, emit_records,
                       fullnode_dropped_record, peer_label, validator_records)
from ..events import REMP_EVENTS
from .netfiles import NetFilesError, load_key, load_network
from ..wire.receipts import ReceiptError
from ..core.schedule import master_session_at
from .store import StoreError
from ..core.validator import Dropped, MasterBlockAccepted, ReceiptSent, ShardBlockAccepted, ValidatorCore
from ..wire.node_tl import CH_CLIENT, CH_MASTER, CHANNEL_NAMES, ZERO32, classify, mux, unwrap
from ..wire.packets import WireError

#: seconds between a received datagram and the step that flushes its consequences (module
#: doc of _Daemon._on_payload); added once per hop
STEP_COALESCE = 0.002


def _compact_json(d: dict) -> str:
    """dict -> compact JSON text (orjson: no spaces, UTF-8 kept as is; ~10x faster than the
    stdlib encoder, which was ~6 us of every status the full node stores)."""
    return orjson.dumps(d).decode()


#: seconds between two log lines about store write failures (the metric counts every one)
STORE_ERROR_LOG_INTERVAL = 10.0
#: most datagrams a validator holds while its journal cannot be written (oldest dropped)
MAX_HELD = 4096
#: seconds a full node keeps a final message (--final-retention default): a day
FINAL_RETENTION = 86400.0
#: --final-retention must cover this many master sessions: the validators' replay window
#: (a message received in session N is in their message cache until N + 2 ends: 2 to 3
#: sessions, DESIGN.md section 4), plus one
REPLAY_SESSIONS = 3
#: seconds between two purges of final messages past their retention
PURGE_INTERVAL = 60.0

__all__ = ["run_role", "build_validator_parser", "build_fullnode_parser", "ValidatorDaemon", "FullnodeDaemon"]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--network", metavar="D", help="REQUIRED: network directory written by `remp-node init`")
    p.add_argument("--key", metavar="FILE", help="REQUIRED: this node's key file (D/keys/<label>.key)")
    p.add_argument("--data-dir", metavar="DIR",
                   help="REQUIRED: durable state (SQLite, WAL, fsync); keep it across restarts")
    p.add_argument("--listen", default=None, metavar="HOST:PORT",
                   help="UDP address to bind (default: this node's address in network.json)")
    p.add_argument("--http", default=None, metavar="HOST:PORT",
                   help="HTTP address for /metrics and /health (default: network.json's; port 0 = any)")
    p.add_argument("--faults", default="", metavar="SPEC",
                   help="TEST ONLY: inject faults at the datagram adapter, e.g. loss=0.2,dup=0.1,reorder=0.1"
                        "[,delay=0.05][,seed=N]")
    p.add_argument("--grace", type=float, default=2.0, metavar="S", help="seconds to drain on SIGTERM (default 2)")
    p.add_argument("--event-loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                   help="asyncio event loop implementation: uvloop (libuv: less CPU per datagram and "
                        "timer), the standard asyncio loop, or auto = uvloop when installed (default: auto)")
    add_common_args(p)


def build_validator_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="remp-node validator",
                                description="A REMP validator: RMQs, shard and masterchain consensus, signed receipts.")
    _common(p)
    return p


def build_fullnode_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="remp-node fullnode",
                                description="A REMP full node: the REMP client, the chain follower and the user API "
                                            "(POST /messages, GET /messages/{id}, WebSocket, GraphQL, Redis stream).")
    _common(p)
    p.add_argument("--redis", default=None, metavar="URL",
                   help="Redis URL for the status stream (e.g. redis://127.0.0.1:6379/0); unset: no stream")
    p.add_argument("--redis-stream", default="remp.receipts", metavar="KEY",
                   help="stream key; each entry is {key: message id hex, value: one status JSON} (default remp.receipts)")
    p.add_argument("--redis-maxlen", type=int, default=1_000_000, metavar="N",
                   help="approximate stream bound (XADD MAXLEN ~ N; default 1000000)")
    p.add_argument("--resend-interval", type=float, default=None, metavar="S",
                   help="seconds between the client's waves to more validators (default: network.json's)")
    p.add_argument("--max-body", type=int, default=128 * 1024, metavar="BYTES",
                   help="largest POST /messages body (raw or base64 BOC; default 131072)")
    p.add_argument("--max-pending", type=int, default=DEFAULT_MAX_PENDING, metavar="N",
                   help="messages held not final yet past which POST /messages answers 503 with Retry-After "
                        f"(postRequests: BACKPRESSURE); accepted ones are never dropped (default {DEFAULT_MAX_PENDING})")
    p.add_argument("--pending-seconds", type=float, default=DEFAULT_PENDING_SECONDS, metavar="S",
                   help="the pending bound follows capacity: at most max(--pending-floor, finals per s over the "
                        "last 10 s x S) messages not final yet (and never more than --max-pending), so accepted "
                        f"ones wait about S s behind the others under overload; 0 = off (default {DEFAULT_PENDING_SECONDS:g})")
    p.add_argument("--pending-floor", type=int, default=DEFAULT_PENDING_FLOOR, metavar="N",
                   help=f"the lowest pending bound --pending-seconds derives (default {DEFAULT_PENDING_FLOOR})")
    p.add_argument("--client-rate", type=float, default=0.0, metavar="PER_S",
                   help="messages per second per client address (token bucket; beyond: 503 with Retry-After); "
                        "0 = no per-client limit (default 0)")
    p.add_argument("--client-burst", type=float, default=0.0, metavar="N",
                   help="the token bucket's size: messages a client may send at once (default: max(1, rate))")
    p.add_argument("--receipt-window", type=int, default=DEFAULT_WINDOW, metavar="PACKETS",
                   help="receipt packets per validator the full node buffers and advertises in its acks "
                        "(flow control: a validator never has more in flight, so no receipt is refused "
                        f"for buffer space; default {DEFAULT_WINDOW})")
    p.add_argument("--subscription-grace", type=float, default=LATE_MEMORY, metavar="S",
                   help="seconds after a message's final decision its subscriptions stay open for the "
                        "statuses of validators that have not sent their own final status yet (they end "
                        f"earlier once every one has; default {LATE_MEMORY:g})")
    p.add_argument("--final-retention", type=float, default=FINAL_RETENTION, metavar="S",
                   help="seconds a final message is kept in the data dir after its final outcome (its "
                        "statuses for GET /messages/{id}; a POST of it meanwhile answers 409 and is never "
                        "sent to the validators again); at least REPLAY_SESSIONS master sessions "
                        f"(default {FINAL_RETENTION:g})")
    return p


def _kind(payload: bytes) -> str:
    """Metric label of a payload: client_message, receipt, receipt_batch, receipt_ack
    (node_tl.classify) or the validator mux channel (rmq, shard, master, announce)."""
    k = classify(payload)
    if k == "validator_mux":
        return CHANNEL_NAMES.get(payload[0], "other")
    return k


def _sibling_log(log: str | None, tag: str) -> str | None:
    """v1.jsonl -> v1.<tag>.jsonl (stdout stays stdout)."""
    if log in (None, "-"):
        return log
    p = Path(log)
    return str(p.with_name(f"{p.stem}.{tag}{p.suffix or '.jsonl'}"))


class _Transport:
    """What a daemon exports about its endpoint on /metrics."""

    def __init__(self, daemon):
        self.daemon = daemon

    def collect(self):
        g = GaugeMetricFamily("remp_transport", "datagram endpoint counters (by name)", labels=["name"])
        ep = self.daemon.endpoint
        for k, v in sorted((ep.counters if ep is not None else {}).items()):
            g.add_metric([k], float(v))
        yield g


class _Traffic:
    """remp_datagrams_total / remp_datagram_bytes_total {direction, channel}: transport
    payloads and their bytes by direction ("in", "out") and channel (_kind), from the
    daemon's plain counters."""

    def __init__(self, daemon):
        self.daemon = daemon

    def collect(self):
        n = CounterMetricFamily("remp_datagrams", "datagrams by direction and channel",
                                labels=["direction", "channel"])
        b = CounterMetricFamily("remp_datagram_bytes", "datagram payload bytes by direction and channel",
                                labels=["direction", "channel"])
        for (direction, channel), (count, size) in sorted(self.daemon.traffic.items()):
            n.add_metric([direction, channel], float(count))
            b.add_metric([direction, channel], float(size))
        yield n
        yield b


#: Buckets (seconds) of remp_fullnode_first_receipt_seconds: around the 1 s objective
#: remp-first-receipt-p99 (spark/sla.toml; validators acknowledge in 100-200 ms, DESIGN.md
#: section 4). The objective's threshold must stay a bucket bound (tests/test_prom_rules.py).
FIRST_RECEIPT_BUCKETS = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
#: Buckets (seconds) of remp_fullnode_finalized_seconds: around the 25 s objective
#: remp-finalized-p99 (REMP docs: Finalized after 5-25 s; Timeout after 4 min).
FINALIZED_BUCKETS = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 60.0, 120.0, 240.0)


class _Daemon:
    """The role's sub-cores as one core of daemon_runtime.runner.CoreRunner (module doc):
    receive -> sub-cores, a pass = step -> store -> send, one timer."""

    service = "remp"

    def __init__(self, args, role: str):
        self.args = args
        self.role = role
        self.net = load_network(args.network)
        self.key = load_key(args.key)
        me = [n for n in self.net.nodes if n.public_key == self.key.public]
        if not me or me[0].role != role:
            raise NetFilesError(f"key {args.key} is not a {role} of {args.network}")
        self.entry = me[0]
        self.label = self.entry.label
        self.node_id = peer_label(self.key.key_id)
        self.faults = parse_faults(args.faults)
        self.endpoint = None
        self.errors: Counter[str] = Counter()
        self.core_runner = CoreRunner(self, drain=[self._flush], log=self._bug_line,
                                      bug_metric=self._count_bug, name=f"remp-{role}")
        self.registry = CollectorRegistry()
        self.registry.register(_Transport(self))
        self.m_errors = PCounter("remp_errors", "unexpected exceptions caught at the daemon boundary",
                                 ["where"], registry=self.registry)
        self.m_errors.labels("store")   # exported at 0 from the start: increase() sees the first
        # payloads and their bytes by (direction, channel): plain counters bumped per payload,
        # exported as remp_datagrams_total / remp_datagram_bytes_total by _Traffic at scrape
        self.traffic: dict[tuple[str, str], list[int]] = {}
        self.registry.register(_Traffic(self))
        self._children: dict[tuple, object] = {}
        self.stopping = False
        self.store_failures = 0                 # store writes refused (_store_failed)
        self._store_log_limit = LogLimiter(burst=1, window=STORE_ERROR_LOG_INTERVAL)
        self.event_loop = "asyncio"        # run_role: what use_event_loop installed
        self.epoch: int | None = None      # this run's transport epoch (the role's store sets it)
        self.peers = {n.key_id: (n.public_key, parse_hostport(n.address)) for n in self.net.nodes
                      if n.key_id != self.key.key_id}

    def _metric(self, direction: str, channel: str) -> list[int]:
        """The [payloads, bytes] counters of one label pair (a prometheus_client counter per
        payload, labels() then two locked inc(), was ~3-5% of a validator's CPU)."""
        m = self.traffic.get((direction, channel))
        if m is None:
            m = self.traffic[(direction, channel)] = [0, 0]
        return m

    def _child(self, counter, *labels):
        """counter.labels(*labels), cached: labels() costs ~20 us, and the validators' receipt
        counter and the full node's status counter were bumped once per status."""
        key = (counter, labels)
        m = self._children.get(key)
        if m is None:
            m = self._children[key] = counter.labels(*labels)
        return m

    # -- clock ---------------------------------------------------------------------------
    def now(self) -> float:
        """The cores' `now`: Unix seconds (the runner's clock rule)."""
        return self.core_runner.now()

    # -- the runner's core ---------------------------------------------------------------
    def next_event(self):
        """None: each step drains its sub-cores' events (they feed each other and are
        written in one batch), each through the runner's dispatch."""
        return None

    def get_timer(self) -> float | None:
        """The earliest sub-core deadline, at least 1 ms ahead; a second ahead when none
        (a pass every second retries held journal entries and datagrams). None once
        stopping."""
        if self.stopping:
            return None
        now = self.now()
        try:
            t = self.next_timer()
        except Exception as exc:
            self.core_runner.bug(exc, "timer")
            t = None
        if t is None:
            t = now + 1.0
        return max(t, now + 0.001)

    def handle_timer(self, now: float) -> None:
        """Nothing: the pass that follows runs the step, which fires every due sub-core
        timer."""

    # -- boundary ------------------------------------------------------------------------
    def _count_bug(self, where: str, exc: BaseException) -> None:
        self.m_errors.labels(where).inc()
        self.errors[f"{where}:{type(exc).__name__}"] += 1

    def _bug_line(self, where: str, exc: BaseException, src: str | None) -> None:
        self.log_error(f"{where}: {type(exc).__name__}: {exc} | "
                       + " / ".join(traceback.format_exception(exc)[-3:]).replace("\n", " "))

    def log_error(self, text: str) -> None:
        raise NotImplementedError

    def _store_failed(self, exc: Exception, waiting: str) -> None:
        """Count a store write failure (remp_errors{where="store"}, /health store_failures)
        and log it as remp.node.store_failed at most once per STORE_ERROR_LOG_INTERVAL
        seconds, with how many failed so far and what waits for the store (`waiting`)."""
        self.m_errors.labels("store").inc()
        self.store_failures += 1
        if self._store_log_limit.allow("store", time.monotonic())[0]:
            self.log.emit("remp.node.store_failed", None, "error", count=self.store_failures,
                          reason=f"{exc} ({waiting})"[:2000])

    # -- loop ------------------------------------------------------------------------------
    async def start_io(self, http_app: web.Application) -> dict:
        bind = parse_hostport(self.args.listen or self.entry.address)
        self.endpoint = await open_endpoint(self.key, self.peers, bind, self._on_payload, self.faults,
                                            epoch=self.epoch)
        add_status_routes(http_app, self.registry, self.health)
        self.runner = web.AppRunner(http_app, access_log=None)
        await self.runner.setup()
        host, port = parse_hostport(self.args.http or self.entry.http)
        site = web.TCPSite(self.runner, host, port)
        await site.start()
        self.http_port = site._server.sockets[0].getsockname()[1]
        self.core_runner.pump()
        return {"port": self.http_port, "udp": self.endpoint.address[1], "label": self.label,
                "node": self.node_id, "role": self.role}

    def _on_payload(self, src: bytes, payload: bytes, _t: float) -> None:
        m = self._metric("in", _kind(payload))
        m[0] += 1
        m[1] += len(payload)
        try:
            self.receive(src, payload, self.now())
        except Exception as exc:  # the boundary: a core bug must not kill the daemon
            self.core_runner.bug(exc, "receive")
        if not self.stopping:
            # not at once: asyncio reads ONE datagram per event-loop iteration, so that made
            # a step (every sub-core's timers and output, the journal write, the events) per
            # datagram; a pass STEP_COALESCE later covers every datagram read meanwhile
            self.core_runner.pump_soon(STEP_COALESCE)

    def _flush(self, now: float) -> None:
        """The runner's drain hook: one step, its datagrams sent."""
        if self.stopping:
            return
        try:
            out = self.step(now)
        except Exception as exc:
            self.core_runner.bug(exc, "step")
            out = []
        by_dst: dict[bytes, list[bytes]] = {}
        for dst, data in out:
            m = self._metric("out", _kind(data))
            m[0] += 1
            m[1] += len(data)
            q = by_dst.get(dst)
            if q is None:
                by_dst[dst] = [data]
            else:
                q.append(data)
        # one step's payloads per peer, in order: small ones share datagrams (transport.py,
        # "Bundles"; ~1.5 per destination per step at 100 msg/s)
        for dst, datas in by_dst.items():
            if len(datas) == 1:
                self.endpoint.send(dst, datas[0])
            else:
                self.endpoint.send_many(dst, datas)

    async def close_io(self) -> None:
        self.stopping = True
        self.core_runner.close()
        if self.endpoint is not None:
            self.endpoint.close()
        await self.runner.cleanup()


class ValidatorDaemon(_Daemon):
    def __init__(self, args):
        super().__init__(args, "validator")
        from ..core.catchain import Catchain
        from .store import ValidatorStore
        self.store = ValidatorStore(args.data_dir)
        # transport epoch = delivery stream: max(previous + 1, now) from the data dir, so a
        # clock set back cannot make peers refuse this run as stale
        self.epoch = self.store.run_epoch(time.time_ns() // 1000)
        journal = self.store.load()
        self.restored_blocks = len(journal.master_commits)
        # while the store refuses writes (step): journal entries not yet written, the
        # datagrams that wait for them, and how many of those were dropped over MAX_HELD
        self._unwritten: list = []
        self._held: list = []
        self.held_dropped = 0
        tm = self.net.timing

        def catchain_factory(session_id, members, local, block_interval=0.05):
            return Catchain(session_id, members, local, block_interval=block_interval, sync_interval=0.5)
        self.core = ValidatorCore(
            self.key, self.net.config, self.net.zerostate(), catchain_factory=catchain_factory,
            full_nodes={n.key_id: n.public_key for n in self.net.fullnodes()},
            rmq_block_interval=tm["rmq_block_interval"], shard_round_timeout=tm["shard_round_timeout"],
            master_round_timeout=tm["master_round_timeout"], master_block_interval=tm["master_block_interval"],
            journal=journal)
        # every receipt for a full node goes through delivery.ReceiptSender: batched <= 100 ms,
        # one packet signature, resent until acknowledged or obsolete (delivery.py)
        self.fullnode_ids = {n.key_id for n in self.net.fullnodes()}
        # journal=True: the outbox goes to the store with the validator journal (fsynced before
        # the packets leave) and what no full node acknowledged is sent again after a restart
        # a first status (PutIntoQueue) leaves at once only from the validator the full node
        # sent the message to; the RMQ-informed members' ride in their next batch (<= 100 ms)
        self.sender = ReceiptSender(self.key, journal=True, stream=self.epoch,
                                    urgent_first=self.core.received_directly)
        outbox = self.store.outbox()
        self.sender.restore(outbox, time.time())
        self.restored_receipts = len(outbox)
        self.log = EventLog(SERVICE_VALIDATOR, self.node_id, [REMP_EVENTS], sink=args.log, min_level=args.log_level)
        self.mlog = EventLog(SERVICE_MASTERCHAIN, self.node_id, [REMP_EVENTS],
                             sink=_sibling_log(args.log, "masterchain"),
                             min_level=args.log_level)
        r = self.registry
        self.m_receipts = PCounter("remp_receipts", "signed receipts produced, by kind", ["kind"], registry=r)
        self.m_blocks = PCounter("remp_blocks", "accepted blocks, by chain", ["chain"], registry=r)
        self.m_dropped = PCounter("remp_dropped", "remote input dropped by the core, by channel", ["channel"],
                                  registry=r)
        self.m_journal = PCounter("remp_journal_entries", "journal entries written (fsynced) before sending",
                                  registry=r)
        # read at scrape time (Gauge.set_function; a Gauge.set per step took a lock twice per step)
        Gauge("remp_master_height", "next master block seqno", registry=r).set_function(
            lambda: self.core.master.height if self.core.master is not None else 0)
        Gauge("remp_session", "current master session", registry=r).set_function(lambda: self.core.session)
        #: event type -> what it adds to the metrics (the log half is eventmap.validator_records)
        self._event_metrics: dict[type, Callable] = {
            MasterBlockAccepted: lambda ev: self._child(self.m_blocks, "master").inc(),
            ReceiptSent: lambda ev: self._child(self.m_receipts, ev.kind).inc(),
            ShardBlockAccepted: lambda ev: self._child(self.m_blocks, "shard").inc(),
            Dropped: lambda ev: self.m_dropped.labels(ev.channel).inc(),
        }
        self._event_table: dict[type, Callable | None] = {}   # the runner's dispatch table
        self._step_lines: list | None = None      # the step's log records (step, _event_handler)
        self._step_mlines: list | None = None     # ... of the masterchain log

    def log_error(self, text: str) -> None:
        self.log.emit("remp.node.error", None, "error", reason=text[:2000])

    def health(self) -> dict:
        c = self.core
        shard_signed = {f"{s.shard & 0xFFFFFFFFFFFFFFFF:016x}/{n}": s.consensus.signed_height
                        for (_, n), s in c.shard_sessions.items()}
        return {"ok": not self.stopping, "role": "validator", "label": self.label, "session": c.session,
                "event_loop": self.event_loop,
                "master_height": c.master.height if c.master else 0, "restored_master_blocks": self.restored_blocks,
                "restored_receipts": self.restored_receipts, "epoch": self.epoch,
                "master_signed_height": c.master.signed_height if c.master else 0,
                "master_muted_through": c.master.muted_through if c.master else 0,
                "shard_signed_heights": shard_signed,
                "muted_catchains": sum(1 for q in c.rmqs.values() if getattr(q.catchain, "muted", False)),
                "delivery": dict(self.sender.stats), "unacked": self.sender.unacked(),
                "stats": dict(c.stats), "errors": sum(self.errors.values()),
                "store_failures": self.store_failures, "journal_unwritten": len(self._unwritten),
                "held_datagrams": len(self._held), "held_dropped": self.held_dropped}

    def receive(self, src: bytes, payload: bytes, now: float) -> None:
        if src in self.fullnode_ids and classify(payload) == "receipt_ack":
            self.sender.receive_ack(src, unwrap(payload), now)
            return
        self.core.receive_datagram(payload, src, now)

    def next_timer(self):
        ts = [t for t in (self.core.get_timer(), self.sender.get_timer()) if t is not None]
        return min(ts) if ts else None

    def step(self, now: float) -> list:
        c = self.core
        t = c.get_timer()
        if t is not None and t <= now:
            c.handle_timer(now)
        out = []
        self.sender.set_session(max(c.session, 0), now)
        for dst, data in c.datagrams_to_send(now):
            if dst in self.fullnode_ids and classify(data) == "receipt":
                self.sender.add(dst, unwrap(data), now)
            else:
                out.append((dst, data))
        t = self.sender.get_timer()
        if t is not None and t <= now:
            self.sender.handle_timer(now)
        out += self.sender.packets_to_send(now)
        entries = self._unwritten + c.journal_updates() + self.sender.journal_updates()
        if entries:
            try:
                self.store.write(entries)    # fsynced before the datagrams that depend on it
            except StoreError as exc:
                # nothing that depends on them may leave: the entries are written first at
                # the next step and this step's datagrams wait behind them, in order (the
                # oldest beyond MAX_HELD are dropped and counted: the protocols resend)
                self._unwritten = entries
                held = self._held + out
                if len(held) > MAX_HELD:
                    self.held_dropped += len(held) - MAX_HELD
                    held = held[-MAX_HELD:]
                self._held, out = held, []
                self._store_failed(exc, f"{len(entries)} journal entries and {len(held)} datagrams "
                                        f"wait for it, {self.held_dropped} datagrams dropped so far")
            else:
                self.m_journal.inc(len(entries))
                self._unwritten = []
                if self._held:
                    out, self._held = self._held + out, []
        lines, mlines = self._step_lines, self._step_mlines = [], []
        try:
            self.core_runner.dispatch(c.next_event, self._event_table, self._event_handler, where="event")
        finally:
            self._step_lines = self._step_mlines = None
            # the step's lines in one write per log (one timestamp: they are events of one
            # step), not one per event: ~5 status lines per message at every validator
            for log, records in ((self.log, lines), (self.mlog, mlines)):
                if records:
                    try:
                        emit_records(log, records)
                    except Exception as exc:
                        self.core_runner.bug(exc, "event")
        return out

    def _event_handler(self, t: type) -> Callable:
        """The validator core's event type -> its handler for the runner's dispatch: the
        log records (eventmap.validator_records; master blocks to the masterchain log),
        written once per step, then the metrics (_event_metrics)."""
        master = t is MasterBlockAccepted
        count = self._event_metrics.get(t)

        def handle(ev) -> None:
            records = validator_records(ev)
            into = self._step_mlines if master else self._step_lines
            if into is None:        # outside a step (not expected): at once
                emit_records(self.mlog if master else self.log, records)
            else:
                into += records
            if count is not None:
                count(ev)
        return handle

    def close_logs(self) -> None:
        self.log.close()
        self.mlog.close()
        self.store.close()


class FullnodeDaemon(_Daemon):
    def __init__(self, args):
        super().__init__(args, "fullnode")
        from ..api.server import StatusHub
        from ..core.client import RempClient
        from ..core.follower import ChainFollower
        from .store import FullnodeStore
        self.store = FullnodeStore(args.data_dir)
        self.epoch = self.store.run_epoch(time.time_ns() // 1000)
        self.resubmitted = 0
        tm = self.net.timing
        self.follower = ChainFollower(self.key, self.net.config, self.net.zerostate(),
                                      round_timeout=min(1.0, tm["master_round_timeout"]))
        vkeys = [v.public_key for v in self.net.config.validators]
        cfg = self.net.config
        # lifetime=None: a message ends as Timeout only from what the chain says (client.py,
        # chain_session: past the validators' replay window and not in the chain) or from
        # every validator's Timeout, never because its receipts are late
        self.client = RempClient(self.key, self.follower.state, self.follower.client_groups,
                                 resend_interval=args.resend_interval or tm["resend_interval"],
                                 extra_keys=lambda: vkeys, late_memory=args.subscription_grace,
                                 lifetime=None, session_at=lambda now: master_session_at(cfg, now))
        self._chain_session = -1
        # the window it advertises is its reorder buffer: a validator never sends a packet
        # that would not fit (delivery.py, flow control), so none is refused for space
        self.receiver = ReceiptReceiver(self.key, {v.key_id: v.public_key for v in self.net.config.validators},
                                        max_buffered=args.receipt_window)
        self.log = EventLog(SERVICE_FULLNODE, self.node_id, [REMP_EVENTS], sink=args.log, min_level=args.log_level)
        self.hub = StatusHub(self, redis_url=args.redis, stream=args.redis_stream, maxlen=args.redis_maxlen)
        r = self.registry
        self.m_statuses = PCounter("remp_statuses", "statuses the full node produced or received, by kind",
                                   ["kind", "origin"], registry=r)
        self.m_dropped = PCounter("remp_fullnode_dropped", "datagrams the full node dropped, by reason",
                                  ["reason"], registry=r)
        self.m_final = PCounter("remp_final", "final outcomes", ["outcome"], registry=r)
        # a final message is never sent to the validators again while it is retained
        self.retention = float(args.final_retention)
        window = REPLAY_SESSIONS * self.net.config.mc_catchain_lifetime
        if self.retention < window:
            raise NetFilesError(f"--final-retention {self.retention:g} s is shorter than {REPLAY_SESSIONS} master "
                                f"sessions ({window:g} s), the validators' replay window plus one session")
        self.resent_refused = 0
        self.purged = 0
        self._purge_at = 0.0
        for outcome in ("finalized", "rejected", "timeout"):   # at 0 from the start (rate() of
            self.m_final.labels(outcome)                        # a new series misses its first)
        Gauge("remp_followed_master_height", "next master block seqno the follower expects",
              registry=r).set_function(lambda: self.follower.master.height)
        self.m_first_receipt = Histogram(
            "remp_fullnode_first_receipt_seconds",
            "message received by the full node -> its first status from a validator",
            buckets=FIRST_RECEIPT_BUCKETS, registry=r)
        self.m_finalized = Histogram(
            "remp_fullnode_finalized_seconds", "message received by the full node -> Finalized",
            buckets=FINALIZED_BUCKETS, registry=r)
        self._first_wait: dict[bytes, float] = {}    # message id -> received (monotonic s), until answered
        self._client_handler_table: dict[type, Callable] | None = None
        # the runner's dispatch tables of the sub-cores (type -> handler, None: skipped),
        # and what the handlers of the drain in progress use
        self._client_table: dict[type, Callable | None] = {}
        self._receiver_table: dict[type, Callable | None] = {}
        self._follow_table: dict[type, Callable | None] = {}
        self._drain_rows: list = []
        self._drain_lines: list = []
        self._receiver_now = 0.0
        self._follow_now = 0.0
        self._status_counts: dict[tuple[str, str], int] = {}    # remp_statuses of the drain

    def log_error(self, text: str) -> None:
        self.log.emit("remp.node.error", None, "error", reason=text[:2000])

    def health(self) -> dict:
        return {"ok": not self.stopping, "role": "fullnode", "label": self.label, "event_loop": self.event_loop,
                "followed_master_height": self.follower.master.height, "pending": len(self.client.pending()),
                "resubmitted": self.resubmitted, "epoch": self.epoch,
                "final_retention": self.retention, "resent_refused": self.resent_refused, "purged": self.purged,
                "client": dict(self.client.stats), "follower": dict(self.follower.stats),
                "delivery": dict(self.receiver.stats),
                "redis": self.hub.redis_state(),
                "errors": sum(self.errors.values()), "store_failures": self.store_failures}

    def receive(self, src: bytes, payload: bytes, now: float) -> None:
        if not payload:
            self._drop(src, "empty datagram", 0)
            return
        kind = classify(payload)
        if kind == "receipt_batch":
            try:
                self.receiver.receive(src, payload, now)
            except DeliveryError as exc:
                self._drop(src, f"receipt batch refused: {exc}", len(payload))
            self._drain_receiver(now)
            return
        if payload[0] == CH_MASTER:
            self.follower.receive_datagram(payload, src, now)
            return
        if payload[0] != CH_CLIENT or len(payload) < 33:
            self._drop(src, f"channel {payload[0]} is not for a full node", len(payload))
            return
        try:
            self.client.receive_datagram(payload[33:], src, now)
        except (WireError, ReceiptError, ValueError) as exc:
            self._drop(src, f"{type(exc).__name__}: {exc}", len(payload))

    def _drain_receiver(self, now: float) -> None:
        """The receipt receiver's events through the runner's dispatch: each delivered
        receipt to the client core (other events skipped); an exception other than a
        remote error propagates to the caller's guard."""
        self._receiver_now = now
        self.core_runner.dispatch(self.receiver.next_event, self._receiver_table, self._receiver_handler,
                                  guard=False)

    def _receiver_handler(self, t: type) -> Callable | None:
        return self._on_delivered if issubclass(t, ReceiptDelivered) else None

    def _on_delivered(self, ev: ReceiptDelivered) -> None:
        try:
            # the packet signature (checked by the receiver against this validator's
            # key) covers the receipt: no second ed25519 verify per receipt
            # tick=False: the step that follows (pump_soon) runs the client's due
            # timers once for everything this datagram brought
            self.client.receive_authenticated(ev.signed, ev.receipt, ev.source, self._receiver_now, ev.digest,
                                              tick=False)
        except (WireError, ReceiptError, ValueError) as exc:
            self._drop(ev.source, f"{type(exc).__name__}: {exc}", 0)

    def _drop(self, src: bytes, reason: str, size: int) -> None:
        self.m_dropped.labels(reason.split(":")[0][:40]).inc()
        emit_records(self.log, [fullnode_dropped_record(src, reason, size)])

    def held_final(self, mid: bytes) -> dict | None:
        """The final outcome the full node holds for `mid` (32 bytes) when that outcome came
        from the validators or the chain (finalized, rejected by the queue / collator /
        chain, timeout): {"final": True, "outcome", "kind", "reason", "final_at" (Unix s),
        "retained_until" (Unix s)}; else None (unknown, in flight, refused by this full
        node's own checks, which are run again). This step's outcomes (the hub's) first,
        then the store. Raises store.StoreError."""
        f = self.hub.finals.get(mid)
        if f is None:
            k = self.store.known(mid)
            if k is None and mid in self.follower.finalized:
                # sent through another full node and already in the chain this one follows:
                # past the validators' replay window nothing else would stop a second execution
                f = {"final": True, "outcome": "finalized", "kind": "Finalized",
                     "reason": "in the chain (sent through another full node)", "final_at": time.time()}
            elif k is None or not k["outcome"]:
                return None
            else:
                f = {"final": True, "outcome": k["outcome"], "kind": k["kind"], "reason": k["reason"],
                     "final_at": k["final_at"]}
        if f["kind"] == "RejectedByFullnode":
            return None
        return dict(f, retained_until=f.get("final_at", time.time()) + self.retention)

    def submit(self, boc: bytes, parsed=None) -> bytes:
        """Record a BOC in the store, then hand it to the client core (the API calls this;
        parsed: its messages.parse_external_message result when the caller has it); flushes
        at once. Returns the 32-byte message id. A message the full node holds as final
        (held_final: retained --final-retention seconds, across restarts) is not handed to
        the client core again: nothing is sent (the API answers 409 with the outcome); one
        in flight is a no-op of the core. Raises store.StoreError when the store cannot
        record it: then nothing was handed to the client core or sent (the API answers 503;
        a message the full node could not resubmit after a crash is never accepted)."""
        from ..core.client import submitted_message_id
        now = self.now()
        mid = submitted_message_id(boc, parsed)
        if self.held_final(mid) is not None:
            self.resent_refused += 1
            return mid
        self.store.add_message(mid, boc, time.time())
        self.client.submit(boc, now, parsed)
        if parsed is not None and parsed.boc == boc:
            self.follower.remember(parsed)
        self.core_runner.pump_soon()
        self._drain_client()
        return mid

    async def start_io(self, http_app: web.Application) -> dict:
        info = await super().start_io(http_app)
        self.resubmit_pending()
        return info

    def resubmit_pending(self) -> int:
        """After a restart: hand every message the store holds without a final outcome
        (accepted by POST /messages before a crash) to the client core again, oldest first,
        so each still reaches a final outcome. Returns how many were resubmitted."""
        n = 0
        now = self.now()
        for mid, boc in self.store.pending():
            try:
                self.client.submit(boc, now)
                n += 1
            except Exception as exc:
                self.core_runner.bug(exc, "resubmit")
        self.resubmitted = n
        self._drain_client()
        self.core_runner.pump_soon()
        return n

    def next_timer(self):
        ts = [t for t in (self.client.get_timer(), self.follower.get_timer(), self.receiver.get_timer())
              if t is not None]
        return min(ts) if ts else None

    def step(self, now: float) -> list:
        t = self.client.get_timer()
        if t is not None and t <= now:
            self.client.handle_timer(now)
        t = self.follower.get_timer()
        if t is not None and t <= now:
            self.follower.handle_timer(now)
        t = self.receiver.get_timer()
        if t is not None and t <= now:
            self.receiver.handle_timer(now)
            self._drain_receiver(now)
        out = [(dst, mux(CH_CLIENT, ZERO32, d)) for dst, d in self.client.datagrams_to_send(now)]
        out += self.follower.datagrams_to_send(now)
        acks = self.receiver.packets_to_send(now)
        self._follow_chain(now)
        self._drain_client()
        if now >= self._purge_at:
            self._purge_at = now + min(PURGE_INTERVAL, self.retention / 10)
            self._purge()
        # the step's statuses and outcomes (and those drained by submit() since the last step)
        # in one transaction, before this step's datagrams (the receipt acks) leave
        try:
            self.store.commit()
        except StoreError as exc:
            # not a bug: a local failure (disk full, I/O). The rows stay queued for the next
            # commit; this step's receipt acks are held back (the validators resend those
            # receipts until acknowledged, delivery.py), the rest still leaves.
            self._store_failed(exc, "statuses kept in memory, receipt acks held back until it can write")
            return out
        return out + acks

    def _follow_chain(self, now: float) -> None:
        """What the chain says about the tracked messages (client.chain_finalized /
        chain_session), from the follower's applied master blocks."""
        self._follow_now = now
        self.core_runner.dispatch(self.follower.next_event, self._follow_table, self._follow_handler, guard=False)

    def _follow_handler(self, t: type) -> Callable | None:
        from ..core.follower import ChainBlockApplied
        return self._on_chain_block if issubclass(t, ChainBlockApplied) else None

    def _on_chain_block(self, ev) -> None:
        now = self._follow_now
        for mid, _shard in ev.messages:
            ids = self.follower.finalized.get(mid)
            if ids is not None:
                self.client.chain_finalized(mid, ids[0], ids[1], now)
        if ev.session > self._chain_session:
            self._chain_session = ev.session
            self.client.chain_session(ev.session, now)

    def _purge(self) -> None:
        """Forget final messages older than the retention (store, then the hub's memory)."""
        try:
            ids = self.store.purge_final(time.time() - self.retention)
        except StoreError as exc:
            self._store_failed(exc, "final messages past their retention are kept until it can write")
            return
        if ids:
            self.purged += len(ids)
            self.hub.forget(ids)

    def _client_handlers(self) -> dict[type, Callable]:
        """Client event type -> what the full node does with it besides logging it
        (eventmap.client_records): metrics, the store, the API's status hub."""
        from ..core.client import FinalStatus, MessageReceived, MessageSettled, ReceiptEvent
        return {ReceiptEvent: self._on_receipt, MessageReceived: self._on_received,
                FinalStatus: self._on_final, MessageSettled: lambda ev, rows: self.hub.settled(ev.message_id, ev.reason)}

    def _client_handler(self, t: type) -> Callable:
        """The client core's event type -> its handler for the runner's dispatch: the log
        lines (eventmap.client_records, written once per drain), then the type's entry of
        _client_handlers with the drain's status rows."""
        handlers = self._client_handler_table
        if handlers is None:
            handlers = self._client_handler_table = self._client_handlers()
        handler = handlers.get(t)

        def handle(ev) -> None:
            self._drain_lines += client_records(ev)
            if handler is not None:
                handler(ev, self._drain_rows)
        return handle

    def _on_receipt(self, ev, rows: list) -> None:
        if ev.origin == "validator" and self._first_wait:
            t0 = self._first_wait.pop(ev.message_id, None)
            if t0 is not None:
                self.m_first_receipt.observe(time.monotonic() - t0)
        key = (ev.kind, ev.origin)
        self._status_counts[key] = self._status_counts.get(key, 0) + 1
        d = ev.to_json()
        text = _compact_json(d)         # once: for the store and the Redis stream
        rows.append((ev.message_id, text))
        self.hub.status(ev.message_id, d, text)

    def _on_received(self, ev, rows: list) -> None:
        self._first_wait[ev.message_id] = time.monotonic()

    def _on_final(self, ev, rows: list) -> None:
        self._first_wait.pop(ev.message_id, None)
        if ev.outcome == "finalized":
            self.m_finalized.observe(ev.elapsed)
        self._child(self.m_final, ev.outcome).inc()
        self.store.set_outcome(ev.message_id, ev.outcome, ev.kind, ev.reason, time.time())
        self.hub.final(ev.message_id, ev)

    def _drain_client(self) -> None:
        """The client core's events: log lines (one write for the drain), the handlers'
        table, the statuses' rows (one store call)."""
        outer = self._drain_rows, self._drain_lines          # a drain from inside a handler
        self._drain_rows = rows = []
        self._drain_lines = lines = []
        try:
            self.core_runner.dispatch(self.client.next_event, self._client_table, self._client_handler,
                                      where="event")
        finally:
            self._drain_rows, self._drain_lines = outer
        try:
            # one timestamp and one write for the drain's lines (~1.4 us less per status)
            emit_records(self.log, lines)
        except Exception as exc:
            self.core_runner.bug(exc, "event")
        if rows:
            self.store.add_statuses(rows)
        if self._status_counts:
            # remp_statuses once per (kind, origin) of the drain, not per status (a locked
            # prometheus inc() is ~1.5 us)
            for (kind, origin), n in self._status_counts.items():
                self._child(self.m_statuses, kind, origin).inc(n)
            self._status_counts.clear()

    def close_logs(self) -> None:
        self.log.close()
        self.store.close()


def parse_role_args(role: str, argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """Parse a role's flags (file < env REMP_NODE_* < flags); exits 2 with the reason for a
    missing required option or a bad value (what deploy/ files are checked against)."""
    parser = build_validator_parser() if role == "validator" else build_fullnode_parser()
    args = load_args(parser, argv, env_prefix="REMP_NODE_")
    for name in ("network", "key", "data_dir"):
        if not getattr(args, name):
            parser.error(f"--{name.replace('_', '-')} is required (flag, --config key or REMP_NODE_{name.upper()})")
    try:
        parse_faults(args.faults)
    except ValueError as exc:
        parser.error(f"--faults: {exc}")
    for flag in ("listen", "http"):
        v = getattr(args, flag)
        if v is not None:
            try:
                parse_hostport(v)
            except ValueError as exc:
                parser.error(f"--{flag}: {exc}")
    if args.grace < 0:
        parser.error("--grace must be >= 0")
    if role == "fullnode":
        if not INITIAL_WINDOW <= args.receipt_window <= MAX_WINDOW:
            parser.error(f"--receipt-window must be {INITIAL_WINDOW}..{MAX_WINDOW} packets")
        if args.subscription_grace <= 0:
            parser.error("--subscription-grace must be > 0")
        if args.max_pending < 1 or args.client_rate < 0 or args.client_burst < 0:
            parser.error("--max-pending must be >= 1, --client-rate and --client-burst >= 0")
        if args.pending_seconds < 0 or args.pending_floor < 1:
            parser.error("--pending-seconds must be >= 0, --pending-floor >= 1")
        if args.client_rate > 0 and args.client_burst == 0:
            args.client_burst = max(1.0, args.client_rate)
    return parser, args


def run_role(role: str, argv: list[str]) -> int:
    parser, args = parse_role_args(role, argv)
    try:
        daemon = (ValidatorDaemon if role == "validator" else FullnodeDaemon)(args)
    except (NetFilesError, OSError) as exc:
        parser.error(str(exc))

    async def run(stop: asyncio.Event) -> None:
        app = web.Application(client_max_size=getattr(args, "max_body", 1 << 20))
        if role == "fullnode":
            from ..api.server import add_api_routes
            add_api_routes(app, daemon)
        try:
            info = await daemon.start_io(app)
            if role == "fullnode":
                await daemon.hub.start()
            Ready(service=f"remp-{role}", **info).announce()
            await stop.wait()
        finally:
            if role == "fullnode":
                await daemon.hub.close()
            await daemon.close_io()
            daemon.close_logs()

    daemon.event_loop = use_event_loop(getattr(args, "event_loop", "auto"))
    return run_daemon(run)
