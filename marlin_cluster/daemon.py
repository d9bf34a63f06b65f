"""`marlin-node`: the Marlin daemons (DESIGN.md section 5) and `init` for a local network.

    marlin-node init --dir D [--clusters 3] [--members 2] [--producers 1] [--consumers 2] [--base-port P]
    marlin-node producer --network D/network.json --name producer [--blocks-dir DIR] [--stdin] ...
    marlin-node cluster  --network D/network.json --name c1m1 ...
    marlin-node consumer --network D/network.json --name consumer1 [--out-dir DIR] [--redis URL] ...

Each role: typed config (`--config FILE` TOML < MARLIN_<ROLE>_<OPTION> env < flags), `--help`,
/metrics and /health on `--status HOST:PORT` (port 0: announced in the READY line),
SIGTERM/SIGINT graceful shutdown (stop accepting, flush send queues up to `--grace` s), one
READY line on stdout, the JSON-lines event log (marlin_cluster/events.py catalogue).

The adapter (`MarlinRunner`) is daemon_runtime.runner.CoreRunner (the loop every daemon
shares, and its clock rule: `now` = time.time(), the cores compare attestation timestamps,
unix seconds, across machines) with Marlin's transport boundary: every frame from the
transport goes to `core.receive_frame(frame, peer, now)`; then `frames_to_send` is flushed
to the transport, events are drained into the event log (events.records) and the metrics
(EVENT_METRICS), and one timer is re-armed at `core.get_timer()`. A consumer's blocks are
decoded and validated in a `RebuildPool` (`--validate-pool process|thread|inline`, `--validate-workers N`): the core
hands out RebuildJobs and gets their outcomes back on the loop, so chunks of other blocks
keep flowing while a block is validated.

Producer inputs: files in `--blocks-dir` (each file one block, produced once, new files
picked up every `--poll` s; write them elsewhere and rename in), LPF records on stdin
(`--stdin`: u64 big-endian length + block), and HTTP `POST /produce?channel=btc|eth|raw|auto`
with the block as the body on the status port (200 {"message_id", "trace_id", ...}; 400 bad
input or refused block, 409 stake exhausted, 429 too many messages in flight, 413 too large).
Consumer outputs: `--out-dir DIR` (one file `<message id>_<producer>.<channel>` per rebuilt
block, written atomically) and/or `--redis URL` (XADD to `--redis-stream`, fields trace_id,
channel, block; MAXLEN ~ `--redis-maxlen`).
/health of every role has "duplicates" ({reason: frames dropped as duplicates or replays});
/metrics has them as marlin_duplicates_total{reason} (docs/marlin-operations.md).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
from pathlib import Path
from typing import Callable

from daemon_runtime.ratelimit import LogLimiter
from daemon_runtime.runner import CoreRunner

from .events import (MARLIN_EVENTS, SERVICE_CLUSTER, SERVICE_CONSUMER, SERVICE_PRODUCER, AckMissing, AckSent,
                     BlockProduced, BlockRebuilt, ChunkAcknowledged, ChunkReceived, ChunkRejected,
                     ChunkRelayed, ChunkSent, ChunkWitnessed, Dispute, StakeEvidence, channel_name,
                     node_label, records, trace_id)
from .netfile import NetfileError, load_network, write_network
from .params import CHANNEL_BTC, CHANNEL_ETH, CHANNEL_NAMES, CHANNEL_RAW
from .transport import LPF_HEADER, Transport
from .wire import MarlinLocalError

ROLES = ("producer", "cluster", "consumer")
SERVICES = {"producer": SERVICE_PRODUCER, "cluster": SERVICE_CLUSTER, "consumer": SERVICE_CONSUMER}
EVENT_ROLE = {"producer": "producer", "cluster": "cluster", "consumer": "consumer"}


# ---------------------------------------------------------------------- helpers

def detect_channel(block: bytes) -> int:
    """Channel of a block from its bytes: an RLP list (first byte >= 0xc0) is Ethereum, 81+
    bytes that do not start with the synthetic magic are Bitcoin, else raw."""
    if block[:1] and block[0] >= 0xC0:
        return CHANNEL_ETH
    if len(block) >= 81 and not block.startswith(b"RSBLOCK1"):
        return CHANNEL_BTC
    return CHANNEL_RAW


def parse_channel(value: str | None, block: bytes) -> int:
    """"auto"/None -> detect_channel; a name (btc/eth/raw) or a decimal id. ValueError."""
    if value in (None, "", "auto"):
        return detect_channel(block)
    names = {v: k for k, v in CHANNEL_NAMES.items()}
    if value in names:
        return names[value]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"unknown channel {value!r}: btc, eth, raw, auto or a channel id") from None


#: Buckets (seconds) of marlin_consumer_rebuild_seconds: around the 1 s objective
#: marlin-rebuild-p99 (spark/sla.toml). The objective's threshold must stay a bucket bound
#: (tests/test_prom_rules.py).
REBUILD_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 30.0)
#: labelled counters exported at 0 before they first count (the alert rules' increase() of a
#: series that appears at 1 would miss that first one)
ZERO_LABELS = {"delivery_errors": ("dir", "redis")}


class Metrics:
    """Counters exported as Prometheus text (a custom collector over plain dicts, so the
    hot path is one dict increment). `inc(name, label=value)`; names get `marlin_` and
    `_total`. Transport counters are read at scrape time."""

    HELP = {
        "chunks_sent": "attested chunks a producer sent to cluster members",
        "chunks_witnessed": "chunks a member received from a producer, witnessed and relayed",
        "chunks_relayed": "witnessed chunks a member accepted from another member and relayed",
        "chunks_received": "chunks a consumer accepted",
        "acks": "verified acknowledgements a producer holds",
        "acks_sent": "acknowledgements a member signed and sent",
        "acks_missing": "chunk sends that got no acknowledgement in time (outcome retry/final)",
        "rejected": "frames refused, by reason",
        "blocks_produced": "blocks a producer coded and attested",
        "blocks_rebuilt": "blocks a consumer rebuilt and validated",
        "blocks_delivered": "rebuilt blocks written to the consumer's outputs",
        "disputes": "disputes raised, by reason",
        "stake_evidence": "stake offsets seen reused within a refresh interval",
        "input_errors": "blocks the producer could not take (bad input, stake exhausted), by reason",
        "bugs": "unexpected exceptions caught at the daemon boundary",
        "redeliveries_suppressed": "rebuilt blocks not delivered again (delivered before a restart)",
        "injected_drops": "chunk frames not transmitted by --inject-drop-chunks (fault injection)",
        "delivery_errors": "rebuilt blocks an output could not take (Redis down, out-dir not writable), by output",
    }
    TRANSPORT = {"frames_in": "LPF frames received", "frames_out": "LPF frames sent",
                 "bytes_in": "bytes received (with LPF headers)", "bytes_out": "bytes sent (with LPF headers)",
                 "connects": "outgoing connections established", "connect_failures": "failed dials",
                 "accepted": "incoming connections accepted"}

    def __init__(self):
        from prometheus_client import Histogram
        self.counts: collections.Counter = collections.Counter()
        self.transport: Transport | None = None
        self.core = None      # its duplicates() -> {reason: n} is read at scrape time
        self.rebuild = Histogram("marlin_consumer_rebuild_seconds",
                                 "a consumer's first chunk of a block received -> block rebuilt",
                                 buckets=REBUILD_BUCKETS, registry=None)

    def inc(self, name: str, label: str = "", n: int = 1) -> None:
        self.counts[(name, label)] += n

    def get(self, name: str, label: str | None = None) -> int:
        if label is not None:
            return self.counts[(name, label)]
        return sum(v for (k, _), v in self.counts.items() if k == name)

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily
        labelled = {"rejected": "reason", "disputes": "reason", "acks_missing": "outcome",
                    "input_errors": "reason", "delivery_errors": "output"}
        for name, doc in self.HELP.items():
            if name in labelled:
                fam = CounterMetricFamily(f"marlin_{name}", doc, labels=[labelled[name]])
                for label in ZERO_LABELS.get(name, ()):   # at 0 from the start (alert rules)
                    if (name, label) not in self.counts:
                        fam.add_metric([label], 0)
                for (k, label), v in sorted(self.counts.items()):
                    if k == name:
                        fam.add_metric([label], v)
            else:
                fam = CounterMetricFamily(f"marlin_{name}", doc, value=self.counts[(name, "")])
            yield fam
        dups = self.core.duplicates() if self.core is not None and hasattr(self.core, "duplicates") else {}
        fam = CounterMetricFamily("marlin_duplicates", "frames dropped as duplicates or replays (no second "
                                  "relay or rebuild), by reason", labels=["reason"])
        for reason, v in sorted(dups.items()):
            fam.add_metric([reason], v)
        yield fam
        t = self.transport
        if t is not None:
            for name, doc in self.TRANSPORT.items():
                yield CounterMetricFamily(f"marlin_transport_{name}", doc, value=t.counters[(name, "")])
            fam = CounterMetricFamily("marlin_transport_dropped", "frames not sent, by reason", labels=["reason"])
            for (k, reason), v in sorted(t.counters.items()):
                if k == "dropped":
                    fam.add_metric([reason], v)
            yield fam
        yield from self.rebuild.collect()


def redis_errors() -> type:
    import redis.exceptions
    return redis.exceptions.RedisError


#: at most one log line per key per LOG_PERIOD seconds (the rest are counted only)
LOG_PERIOD = 5.0


def _log_limiter() -> LogLimiter:
    return LogLimiter(burst=1, window=LOG_PERIOD)


# ---------------------------------------------------------------------- durable state

class Store:
    """The daemon's durable state in `<data dir>/marlin.sqlite3` (SQLite, WAL), so what
    users count on survives a restart:

    stake(producer state):   (epoch, used) of the producer's stake budget. A producer that
        restarts within a refresh interval continues at the stake offset where it stopped;
        starting again at 0 would reuse offsets, which clusters record as slashing evidence.
    taken(producer):         --blocks-dir files already produced (not produced again).
    delivered(consumer):     trace ids already delivered (kept `keep_s`), so chunks of a
        finished block arriving after a restart do not deliver it twice.
    evidence(cluster member): every stake-offset reuse seen (producer, epoch, offset and both
        attestations), the slashing evidence.
    Errors: sqlite3.Error propagates at open (the daemon refuses to start); later write
    errors are reported as bugs by the caller."""

    def __init__(self, directory: str):
        import sqlite3
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(Path(directory) / "marlin.sqlite3"), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS stake (id INTEGER PRIMARY KEY CHECK (id = 0), "
                        "epoch INTEGER NOT NULL, used INTEGER NOT NULL)")
        self.db.execute("CREATE TABLE IF NOT EXISTS delivered (trace TEXT PRIMARY KEY, at REAL NOT NULL)")
        self.db.execute("CREATE TABLE IF NOT EXISTS evidence (producer TEXT, epoch INTEGER, offset INTEGER, "
                        "first TEXT, second TEXT, at REAL)")
        self.db.execute("CREATE TABLE IF NOT EXISTS taken (name TEXT PRIMARY KEY, at REAL NOT NULL)")

    def load_stake(self) -> tuple[int, int] | None:
        row = self.db.execute("SELECT epoch, used FROM stake WHERE id = 0").fetchone()
        return (row[0], row[1]) if row else None

    def save_stake(self, epoch: int, used: int) -> None:
        self.db.execute("INSERT INTO stake (id, epoch, used) VALUES (0, ?, ?) "
                        "ON CONFLICT(id) DO UPDATE SET epoch = excluded.epoch, used = excluded.used", (epoch, used))

    def taken(self) -> set[str]:
        """Names of --blocks-dir files already produced (a restart does not send them again)."""
        return {r[0] for r in self.db.execute("SELECT name FROM taken")}

    def mark_taken(self, name: str, now: float) -> None:
        self.db.execute("INSERT OR REPLACE INTO taken (name, at) VALUES (?, ?)", (name, now))

    def delivered(self, trace: str) -> bool:
        return self.db.execute("SELECT 1 FROM delivered WHERE trace = ?", (trace,)).fetchone() is not None

    def mark_delivered(self, trace: str, now: float) -> None:
        self.db.execute("INSERT OR REPLACE INTO delivered (trace, at) VALUES (?, ?)", (trace, now))

    def prune_delivered(self, before: float) -> None:
        self.db.execute("DELETE FROM delivered WHERE at < ?", (before,))

    def add_evidence(self, ev: StakeEvidence, now: float) -> None:
        def rec(t):
            return json.dumps([x.hex() if isinstance(x, (bytes, bytearray)) else x for x in t])
        self.db.execute("INSERT INTO evidence VALUES (?, ?, ?, ?, ?, ?)",
                        ("0x" + ev.producer.hex(), ev.epoch, ev.stake_offset, rec(ev.first), rec(ev.second), now))

    def evidence_count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM evidence").fetchone()[0]

    def close(self) -> None:
        self.db.close()


def restore_stake(core, store: Store, now: float) -> bool:
    """Continue the producer's stake offsets of the current refresh interval after a
    restart. True when something was restored."""
    saved = store.load_stake()
    if saved is None:
        return False
    epoch, used = saved
    if epoch != int(int(now) // core.params.refresh_interval):
        return False
    # a stake budget lowered since: the interval's budget is spent (never reuse offsets)
    core.restore_stake(epoch, min(used, core.params.stake_budget))
    return True


def stake_state(core) -> tuple[int, int]:
    """The producer core's (epoch, stake units used) to save (ProducerCore.stake_state)."""
    return core.stake_state()


# ---------------------------------------------------------------------- the adapter

#: event type -> what it adds to the metrics (the metric half of the catalogue; the log
#: half is events.records)
EVENT_METRICS: dict[type, Callable[[Metrics, object], None]] = {
    ChunkSent: lambda m, ev: m.inc("chunks_sent"),
    ChunkWitnessed: lambda m, ev: m.inc("chunks_witnessed"),
    ChunkRelayed: lambda m, ev: m.inc("chunks_relayed"),
    ChunkReceived: lambda m, ev: m.inc("chunks_received"),
    ChunkAcknowledged: lambda m, ev: m.inc("acks"),
    AckMissing: lambda m, ev: m.inc("acks_missing", "final" if ev.final else "retry"),
    ChunkRejected: lambda m, ev: m.inc("rejected", ev.reason),
    BlockProduced: lambda m, ev: m.inc("blocks_produced"),
    BlockRebuilt: lambda m, ev: (m.inc("blocks_rebuilt"), m.rebuild.observe(ev.duration_ms / 1000.0)),
    Dispute: lambda m, ev: m.inc("disputes", ev.reason),
    StakeEvidence: lambda m, ev: m.inc("stake_evidence"),
    AckSent: lambda m, ev: m.inc("acks_sent"),
}


class MarlinRunner(CoreRunner):
    """daemon_runtime.runner.CoreRunner for one Marlin core on a Transport (module doc):
    frames from the transport are fed to `core.receive_frame`; the drain hooks flush
    `frames_to_send(now)` to the transport and, with `rebuilds` (a RebuildPool for a
    consumer core made with offload=True), hand `next_job()`s to the pool, whose outcomes
    come back through `rebuild_done`; every event is logged (events.records) and counted
    (EVENT_METRICS), then passed to the role hook `on_event(ev)`."""

    def __init__(self, role: str, core, transport: Transport, log, metrics: Metrics,
                 on_event: Callable | None = None, rebuilds: "RebuildPool | None" = None):
        self.role = role
        self.transport = transport
        self.metrics = metrics
        self.event_log = log
        self.role_hook = on_event
        self.rebuilds = rebuilds
        self._limit_io = _log_limiter()
        drain = [self._transmit] if rebuilds is None else [self._transmit, self._offload]
        super().__init__(core, on_event=self._event, bug_metric=lambda where, exc: metrics.inc("bugs"),
                         name="marlin-node", drain=drain, bug_window=LOG_PERIOD)
        transport.on_frame = self.receive
        transport.on_reject = self.transport_reject
        transport.on_drop = self.transport_drop
        transport.on_bug = self.bug

    # input
    def receive(self, peer: bytes, frame: bytes) -> None:
        """Transport callback. A MarlinWireError from the core propagates to the transport's
        boundary (counted there, reported through transport_reject)."""
        self.feed(self.core.receive_frame, frame, peer)

    def transport_reject(self, peer: bytes | None, reason: str, detail: str) -> None:
        self.metrics.inc("rejected", reason)
        if self._limit_io.allow(("reject", reason, peer), time.monotonic())[0]:
            attrs = {"reason": reason, "peer": node_label(peer) if peer else "unidentified", "size": 0}
            self.event_log.emit_attrs(f"marlin.{EVENT_ROLE[self.role]}.rejected", None, "warning", attrs)

    def transport_drop(self, peer: bytes, reason: str, n: int) -> None:
        if self._limit_io.allow(("drop", reason, peer), time.monotonic())[0]:
            print(json.dumps({"warning": "frames dropped", "peer": node_label(peer), "reason": reason,
                              "frames": n}), file=sys.stderr, flush=True)

    # output (drain hooks and the event hook)
    def _transmit(self, now: float) -> None:
        send = self.transport.send
        for peer, frame in self.core.frames_to_send(now):
            try:
                send(peer, frame)
            except MarlinLocalError as exc:
                self.bug(exc, "send")

    def _offload(self, now: float) -> None:
        core = self.core
        while (job := core.next_job()) is not None:
            self.rebuilds.submit(job, core.validate, self._rebuilt)

    def _rebuilt(self, job, outcome: tuple) -> None:
        """RebuildPool callback, on the loop: the outcome of rebuild_block for `job`."""
        try:
            self.feed(self.core.rebuild_done, job, outcome)
        except Exception as exc:
            self.bug(exc, "rebuild_done")

    def _event(self, ev) -> None:
        try:
            for r in records(ev):
                self.event_log.emit_attrs(r.event, r.trace_id, r.level, r.attrs)
        except Exception as exc:
            self.bug(exc, "records")
        count = EVENT_METRICS.get(type(ev))
        if count is not None:
            count(self.metrics, ev)
        if self.role_hook is not None:
            self.role_hook(ev)


def _warm_worker():
    from .consumer import warm_worker
    return warm_worker


class RebuildPool:
    """Where a consumer decodes and validates blocks, off its event loop.

    kind "process": a concurrent.futures.ProcessPoolExecutor of `workers` processes (spawn
        start method: a fresh interpreter, nothing inherited from the daemon's loop, Redis
        connection or sockets), each loading the validators once at start; the chunks go
        to the worker and the block comes back pickled (about 1 ms each way for 1 MB).
    kind "thread": a ThreadPoolExecutor of `workers` threads: no copies, but only the
        parts that release the GIL run beside the loop (libbitcoinkernel's CheckBlock
        through ctypes does; pyeclib's decode and the Python parts of validation do not).
    kind "inline": no pool; the core rebuilds inside receive_frame (the loop stalls for
        the block's decode and validation).
    Jobs run in submission order per worker. A worker that dies (BrokenProcessPool) or
    raises is a bug: counted, logged, and the job is rebuilt inline so the block is not
    lost; a broken process pool is replaced.
    Errors: MarlinLocalError for an unknown kind or workers < 1."""

    KINDS = ("process", "thread", "inline")

    def __init__(self, kind: str = "process", workers: int = 1, bug: Callable | None = None):
        if kind not in self.KINDS:
            raise MarlinLocalError(f"rebuild pool kind {kind!r}: one of {', '.join(self.KINDS)}")
        if workers < 1:
            raise MarlinLocalError(f"rebuild pool needs at least 1 worker, got {workers}")
        self.kind = kind
        self.workers = workers
        self.bug = bug or (lambda exc: None)
        self.executor = self._make() if kind != "inline" else None
        self.pending = 0

    @property
    def offload(self) -> bool:
        return self.executor is not None

    def _make(self):
        import concurrent.futures
        if self.kind == "thread":
            return concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="marlin-rebuild")
        import multiprocessing
        return concurrent.futures.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                                      initializer=_warm_worker())

    def warm(self) -> list:
        """Start every worker now (a process loads Python, the coder and libbitcoinkernel:
        0.3-1 s), so the first block does not pay for it. Returns the futures."""
        if self.executor is None:
            return []
        return [self.executor.submit(_warm_worker()) for _ in range(self.workers)]

    def submit(self, job, validate: Callable, done: Callable) -> None:
        """Run rebuild_block(*job.args(validate)) in the pool; done(job, outcome) is called
        on the running loop."""
        from .consumer import rebuild_block
        loop = asyncio.get_running_loop()
        self.pending += 1
        fut = loop.run_in_executor(self.executor, rebuild_block, *job.args(validate))

        def finished(f) -> None:
            self.pending -= 1
            try:
                outcome = f.result()
            except Exception as exc:      # the worker died or rebuild_block has a bug
                self.bug(exc)
                self._replace_if_broken()
                outcome = rebuild_block(*job.args(validate))
            done(job, outcome)
        fut.add_done_callback(finished)

    def _replace_if_broken(self) -> None:
        ex = self.executor
        if self.kind == "process" and ex is not None and getattr(ex, "_broken", False):  # no public accessor
            ex.shutdown(wait=False, cancel_futures=True)
            self.executor = self._make()

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)
            self.executor = None


# ---------------------------------------------------------------------- roles

def _make_core(role: str, net, key, name: str, offload: bool = False):
    params, membership = net.params, net.membership
    if role == "producer":
        from .producer import ProducerCore
        return ProducerCore(key, membership, params)
    if role == "cluster":
        from .cluster import ClusterMemberCore
        return ClusterMemberCore(key, membership, params, net.node(name).cluster)
    from .consumer import ConsumerCore
    return ConsumerCore(key, membership, params, offload=offload)


class Outputs:
    """A consumer's delivery of rebuilt blocks: a directory and/or a Redis stream. An XADD
    waits at most `redis_timeout` s (a Redis that hangs, e.g. SIGSTOPped, would otherwise
    hold every later block's task and its bytes without a word): past it the block counts as
    not delivered to Redis, like a refused XADD (delivery_errors{output="redis"}, one
    stderr line per 5 s)."""

    def __init__(self, out_dir: str | None, redis_url: str | None, stream: str, maxlen: int, metrics: Metrics,
                 bug: Callable, store: Store | None = None, redis_timeout: float = 5.0):
        self.store = store
        self.redis_timeout = redis_timeout
        self.dir = Path(out_dir) if out_dir else None
        if self.dir:
            self.dir.mkdir(parents=True, exist_ok=True)
        self.redis_url = redis_url
        self.stream = stream
        self.maxlen = maxlen
        self.metrics = metrics
        self.bug = bug
        self.redis = None
        self.pending: set[asyncio.Task] = set()
        self._limit = _log_limiter()

    async def start(self) -> None:
        """Raises RuntimeError (one line naming the URL and the flag) when Redis is unreachable."""
        if self.redis_url:
            import redis.asyncio as aioredis
            import redis.exceptions
            try:
                self.redis = aioredis.Redis.from_url(self.redis_url)
                await self.redis.ping()
            except (ValueError, OSError, redis.exceptions.RedisError) as exc:
                raise RuntimeError(f"cannot reach Redis at {self.redis_url} (--redis): {exc}") from None

    def _failed(self, output: str, where: str, exc: BaseException) -> None:
        """An output outage is not a bug: counted (delivery_errors{output}) and one stderr
        line per output every 5 s."""
        self.metrics.inc("delivery_errors", output)
        if self._limit.allow(output, time.monotonic())[0]:
            print(json.dumps({"warning": "rebuilt block not delivered", "output": output, "to": where,
                              "error": f"{type(exc).__name__}: {exc}"}), file=sys.stderr, flush=True)

    def deliver(self, ev: BlockRebuilt) -> None:
        tid = trace_id(ev.message_id, ev.producer)
        ch = channel_name(ev.channel)
        if self.store is not None:
            if self.store.delivered(tid):
                self.metrics.inc("redeliveries_suppressed")
                return
            self.store.mark_delivered(tid, time.time())
        if self.dir is not None:
            try:
                name = f"{ev.message_id:08x}_0x{ev.producer.hex()}.{ch}"
                tmp = self.dir / (name + ".tmp")
                tmp.write_bytes(ev.block)
                tmp.replace(self.dir / name)
            except OSError as exc:
                self._failed("dir", f"{self.dir} (--out-dir)", exc)
        if self.redis is not None:
            task = asyncio.get_running_loop().create_task(self._xadd(tid, ch, ev.block))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)
        else:
            self.metrics.inc("blocks_delivered")

    async def _xadd(self, tid: str, ch: str, block: bytes) -> None:
        try:
            async with asyncio.timeout(self.redis_timeout):
                await self.redis.xadd(self.stream, {"trace_id": tid, "channel": ch, "block": block},
                                      maxlen=self.maxlen, approximate=True)
            self.metrics.inc("blocks_delivered")
        except TimeoutError:                       # Redis hangs: counted like an outage
            self._failed("redis", f"{self.redis_url} (--redis)",
                         TimeoutError(f"no answer within {self.redis_timeout:g} s"))
        except (OSError, redis_errors()) as exc:   # Redis down: counted, one line, keeps rebuilding
            self._failed("redis", f"{self.redis_url} (--redis)", exc)
        except Exception as exc:
            self.bug(exc)

    async def close(self) -> None:
        if self.pending:
            await asyncio.wait(self.pending, timeout=5)
        if self.redis is not None:
            await self.redis.aclose()


class Producer:
    """The producer's block inputs around its MarlinRunner."""

    def __init__(self, runner: MarlinRunner, log, metrics: Metrics, default_channel: str,
                 store: Store | None = None):
        self.store = store
        self.runner = runner
        self.log = log
        self.metrics = metrics
        self.default_channel = default_channel
        self.produced: list[str] = []

    def produce(self, block: bytes, channel: str | None = None) -> dict:
        """Codes and sends one block. Raises ValueError (bad input) or MarlinLocalError
        (stake exhausted / channel not configured) with the reason."""
        if not block:
            raise ValueError("empty block")
        ch = parse_channel(channel or self.default_channel, block)
        core = self.runner.core
        try:
            mid = core.produce(block, ch, time.time())
            if self.store is not None:    # before the frames can leave (they go out after a yield)
                self.store.save_stake(*stake_state(core))
        finally:
            self.runner.pump()
        tid = trace_id(mid, self.runner.transport.key.address)
        self.produced.append(tid)
        return {"message_id": f"{mid:08x}", "trace_id": tid, "channel": channel_name(ch), "size": len(block)}

    def try_produce(self, block: bytes, channel: str | None, source: str) -> dict | None:
        try:
            return self.produce(block, channel)
        except (ValueError, MarlinLocalError) as exc:
            reason = type(exc).__name__
            self.metrics.inc("input_errors", reason)
            print(json.dumps({"warning": "block refused", "source": source, "reason": reason,
                              "detail": str(exc)}), file=sys.stderr, flush=True)
            return None

    async def watch_dir(self, directory: Path, poll: float, stop: asyncio.Event) -> None:
        seen: set[str] = self.store.taken() if self.store is not None else set()
        while not stop.is_set():
            try:
                names = sorted(p.name for p in directory.iterdir() if p.is_file()
                               and not p.name.startswith(".") and not p.name.endswith(".tmp"))
            except OSError:
                names = []
            for n in names:
                if n in seen:
                    continue
                seen.add(n)
                try:
                    data = (directory / n).read_bytes()
                except OSError as exc:
                    self.runner.bug(exc)
                    continue
                self.try_produce(data, None, f"file:{n}")
                if self.store is not None:
                    self.store.mark_taken(n, time.time())
                await asyncio.sleep(0)
            try:
                await asyncio.wait_for(stop.wait(), poll)
            except asyncio.TimeoutError:
                pass

    async def read_stdin(self, max_block: int) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=max_block + 16)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
        while True:
            try:
                head = await reader.readexactly(LPF_HEADER)
            except asyncio.IncompleteReadError:
                return
            n = int.from_bytes(head, "big")
            if n > max_block:
                self.metrics.inc("input_errors", "oversized")
                print(json.dumps({"warning": "stdin record too large; stdin closed", "size": n}),
                      file=sys.stderr, flush=True)
                return
            try:
                block = await reader.readexactly(n)
            except asyncio.IncompleteReadError:
                self.metrics.inc("input_errors", "truncated")
                return
            self.try_produce(block, None, "stdin")


def inject_chunk_drops(transport: Transport, params, n: int, metrics: Metrics) -> None:
    """Fault injection (--inject-drop-chunks): the transport silently skips attested-chunk
    frames whose chunk id is among the last `n` of their channel's NUM_CHUNKS (counted in
    metrics "injected_drops")."""
    from .wire import KIND_ATTESTED_CHUNK, peek_chunk_ids
    send = transport.send
    kind = bytes((KIND_ATTESTED_CHUNK,))

    def send_(peer: bytes, frame: bytes) -> bool:
        if frame[:1] == kind:
            _, channel, chunk = peek_chunk_ids(memoryview(frame)[1:])
            try:
                num = params.channel(channel).num_chunks
            except MarlinLocalError:
                num = 0
            if chunk >= num - n:
                metrics.inc("injected_drops")
                return True
        return send(peer, frame)

    transport.send = send_


# ---------------------------------------------------------------------- CLI

def _common(p: argparse.ArgumentParser, role: str) -> None:
    from daemon_runtime.config import add_common_args
    p.add_argument("--network", metavar="FILE", required=False,
                   help="the network file written by `marlin-node init` (network.json, or its directory); "
                        "required")
    p.add_argument("--name", metavar="NAME",
                   help=f"this node's name in the network file (e.g. {'producer' if role == 'producer' else 'c1m1' if role == 'cluster' else 'consumer1'}); required")
    p.add_argument("--key-file", metavar="FILE", default=None,
                   help="the node's key file (32-byte hex secret, mode 0600); default: the one the "
                        "network file names")
    p.add_argument("--listen", metavar="HOST:PORT", default=None,
                   help="address for the transport listener (LPF over TCP); default: the node's host:port "
                        "in the network file")
    p.add_argument("--status", metavar="HOST:PORT", default="127.0.0.1:0",
                   help="address for /metrics and /health" + (" and POST /produce" if role == "producer" else "")
                        + "; port 0 picks a free port, announced in the READY line (default: 127.0.0.1:0)")
    p.add_argument("--data-dir", metavar="DIR", default=None,
                   help="directory for the durable state (SQLite marlin.sqlite3): "
                        + {"producer": "the stake offsets used in the current refresh interval, so a restart "
                                       "does not reuse them",
                           "cluster": "the stake-reuse (slashing) evidence seen",
                           "consumer": "the blocks already delivered, so a restart does not deliver them twice"}[role]
                        + " (default: none, state is lost on restart)")
    p.add_argument("--queue-bytes", metavar="BYTES", type=int, default=64 * 1024 * 1024,
                   help="bound on bytes queued for one peer; frames beyond it are dropped and counted "
                        "(marlin_transport_dropped_total{reason=\"queue_full\"}) (default: 64 MiB)")
    p.add_argument("--grace", metavar="SECONDS", type=float, default=5.0,
                   help="on SIGTERM/SIGINT: how long queued frames may still be sent (default: 5)")
    add_common_args(p)


def build_parser(role: str) -> argparse.ArgumentParser:
    """The argparse parser of one role (producer / cluster / consumer)."""
    desc = {
        "producer": "Marlin producer: erasure-codes each block into NUM_CHUNKS chunks, attests every "
                    "chunk (secp256k1, stake offset), sends each to a member of a cluster among the "
                    "NO_OF_CLUSTER_OPTIONS closest to keccak256(messageId, chunkNo), and holds the "
                    "members' signed acknowledgements (re-sending after ack_timeout).",
        "cluster": "Marlin cluster member: verifies attested chunks from producers, witnesses and "
                   "acknowledges them, relays witnessed chunks to the other members of its cluster and "
                   "to consumers; suppresses duplicates, drops late chunks, records stake-offset reuse.",
        "consumer": "Marlin consumer: verifies attestation and witness of every chunk, rebuilds a block "
                    "from any MIN_CHUNKS chunks, validates it with its chain's rules (Bitcoin proof of "
                    "work + merkle root, Ethereum header hash + trie roots), delivers it, and raises a "
                    "dispute naming the producers for an invalid block or an expired chunk timer.",
    }[role]
    p = argparse.ArgumentParser(
        prog=f"marlin-node {role}",
        description=desc + f" Options may also come from --config FILE (TOML) or MARLIN_{role.upper()}_<OPTION> "
                           "env vars; flags win.")
    _common(p, role)
    if role == "producer":
        p.add_argument("--blocks-dir", metavar="DIR", default=None,
                       help="produce every file in DIR (one block per file, sorted by name) and then each "
                            "new file (write it elsewhere and rename it in; *.tmp and dot files are ignored)")
        p.add_argument("--poll", metavar="SECONDS", type=float, default=0.5,
                       help="how often --blocks-dir is scanned for new files (default: 0.5)")
        p.add_argument("--stdin", action="store_true", default=False,
                       help="also read blocks from stdin as LPF records (u64 big-endian length, then the block)")
        p.add_argument("--inject-drop-chunks", metavar="N", type=int, default=0,
                       help="FAULT INJECTION for tests and demos: never transmit the last N chunks "
                            "(chunk ids NUM_CHUNKS-N .. NUM_CHUNKS-1) of every block, re-sends included; "
                            "counted as marlin_injected_drops_total. N <= NUM_CHUNKS - MIN_CHUNKS keeps "
                            "blocks rebuildable (default: 0, off)")
        p.add_argument("--channel", default="auto",
                       help="channel of blocks from files and stdin: btc, eth, raw, a channel id, or auto "
                            "(detected from the bytes: RLP list = eth, else btc; default: auto)")
    if role == "consumer":
        p.add_argument("--out-dir", metavar="DIR", default=None,
                       help="write each rebuilt block to DIR/<message id>_<producer>.<channel> (atomically)")
        p.add_argument("--redis", metavar="URL", default=None,
                       help="also XADD each rebuilt block to a Redis stream at URL (fields trace_id, channel, block)")
        p.add_argument("--redis-stream", metavar="KEY", default="marlin:blocks",
                       help="the Redis stream key (default: marlin:blocks)")
        p.add_argument("--redis-maxlen", metavar="N", type=int, default=10000,
                       help="approximate bound on the stream's length (XADD MAXLEN ~) (default: 10000)")
        p.add_argument("--validate-pool", choices=RebuildPool.KINDS, default="process",
                       help="where blocks are erasure-decoded and validated: 'process' (worker processes, "
                            "the event loop never waits for a block), 'thread' (worker threads: only "
                            "libbitcoinkernel's check runs beside the loop, decoding holds the GIL), or "
                            "'inline' (in the event loop: chunks wait while a block is validated) "
                            "(default: process)")
        p.add_argument("--validate-workers", metavar="N", type=int, default=1,
                       help="workers of --validate-pool; blocks beyond N wait for a free worker while "
                            "chunks keep being taken (default: 1)")
    return p


def build_init_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="marlin-node init",
        description="Write a local Marlin network: DIR/network.json (producers, clusters and their members, "
                    "consumers, addresses, public keys, protocol params) and DIR/keys/<name>.key (mode 0600).")
    p.add_argument("--dir", required=True, metavar="DIR", help="where to write the network (created)")
    p.add_argument("--clusters", type=int, default=3, help="number of clusters (default: 3)")
    p.add_argument("--members", type=int, default=2, help="members per cluster (default: 2)")
    p.add_argument("--producers", type=int, default=1, help="number of producers (default: 1)")
    p.add_argument("--consumers", type=int, default=2, help="number of consumers (default: 2)")
    p.add_argument("--base-port", type=int, default=0,
                   help="node i listens on base-port + i; 0 picks free ports now (default: 0)")
    p.add_argument("--host", default="127.0.0.1", help="host of every node (default: 127.0.0.1)")
    p.add_argument("--host-prefix", default=None, metavar="PREFIX",
                   help="give each node the host PREFIX<name> instead of --host (one container or machine "
                        "per node, e.g. 'marlin-' for docker-compose services marlin-c1m1, ...)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a protocol parameter for the whole network (params.Params field, e.g. "
                        "tolerable_latency=10, ack_timeout=2, no_of_cluster_options=2; channel coding as "
                        "chunks.<channel>=NUM/MIN, e.g. chunks.1=12/8). Repeatable")
    p.add_argument("--exist-ok", action="store_true", default=False,
                   help="when DIR already holds a network file, keep it and exit 0 (default: refuse, exit 2)")
    return p


def params_from_flags(items: list[str]):
    """["name=value", "chunks.1=12/8", ...] -> Params. Raises MarlinLocalError (MarlinConfigError)
    naming the bad item."""
    from dataclasses import fields as dc_fields

    from .params import MarlinConfigError, Params
    base = Params()
    data = base.to_dict()
    types = {f.name: type(getattr(base, f.name)) for f in dc_fields(base) if f.name != "channels"}
    for item in items or []:
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep:
            raise MarlinConfigError(f"--param {item!r}: expected NAME=VALUE")
        try:
            if name.startswith("chunks."):
                ch = str(int(name.split(".", 1)[1]))
                num, _, k = value.partition("/")
                data["channels"].setdefault(ch, {"max_block": 4 * 1024 * 1024})
                data["channels"][ch].update(num_chunks=int(num), min_chunks=int(k))
            elif name in types:
                data[name] = types[name](value)
            else:
                raise MarlinConfigError(f"--param {item!r}: unknown parameter {name!r}")
        except ValueError as exc:
            raise MarlinConfigError(f"--param {item!r}: {exc}") from None
    return Params.from_dict(data)


ENV_PREFIX = {"producer": "MARLIN_PRODUCER_", "cluster": "MARLIN_CLUSTER_", "consumer": "MARLIN_CONSUMER_"}

TOP_HELP = """usage: marlin-node {init,producer,cluster,consumer} [options]

Marlin chunk relay nodes (seed: marlin-data.txt; DESIGN.md section 5).

subcommands:
  init       write a local network file and key files
  producer   run a producer (blocks from a directory, stdin or HTTP POST /produce)
  cluster    run a cluster member
  consumer   run a consumer (rebuilt blocks to a directory and/or a Redis stream)

`marlin-node <subcommand> --help` explains every option."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    """argv without the program name: [role, options...] -> namespace with .role.
    Exits 2 (argparse) for an unknown role or bad options."""
    from daemon_runtime.config import load_args
    if not argv or argv[0] in ("-h", "--help"):
        print(TOP_HELP)
        raise SystemExit(0 if argv else 2)
    role = argv[0]
    if role == "init":
        args = build_init_parser().parse_args(argv[1:])
    elif role in ROLES:
        parser = build_parser(role)
        args = load_args(parser, argv[1:], env_prefix=ENV_PREFIX[role])
        if not args.network or not args.name:
            parser.error("--network and --name are required")
        if role == "consumer" and args.validate_workers < 1:
            parser.error("--validate-workers must be >= 1")
        if args.queue_bytes <= 0 or args.grace < 0:
            parser.error("--queue-bytes must be positive and --grace >= 0")
        if role == "producer" and args.inject_drop_chunks < 0:
            parser.error("--inject-drop-chunks must be >= 0")
        if role == "producer":
            try:
                parse_channel(args.channel, b"")
            except ValueError as exc:
                parser.error(f"--channel: {exc}")
        from daemon_runtime.lifecycle import parse_hostport
        for flag in ("listen", "status"):
            value = getattr(args, flag, None)
            if value:
                try:
                    parse_hostport(value)
                except ValueError as exc:
                    parser.error(f"--{flag}: {exc} (want HOST:PORT, port 0..65535)")
    else:
        print(TOP_HELP, file=sys.stderr)
        print(f"marlin-node: unknown subcommand {role!r}", file=sys.stderr)
        raise SystemExit(2)
    args.role = role
    return args


def main(argv: list[str] | None = None) -> int:
    """Console script `marlin-node`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.role == "init":
        if args.exist_ok and (Path(args.dir) / "network.json").exists():
            print(json.dumps({"network": str(Path(args.dir) / "network.json"), "existing": True}))
            return 0
        try:
            params = params_from_flags(args.param)
            net = write_network(args.dir, params=params, clusters=args.clusters, members=args.members, producers=args.producers,
                                consumers=args.consumers, base_port=args.base_port, host=args.host,
                                host_prefix=args.host_prefix)
        except MarlinLocalError as exc:
            print(f"marlin-node init: {exc}", file=sys.stderr)
            return 2
        print(json.dumps({"network": str(net.path), "nodes": {n.name: {"role": n.role, "address": n.hex,
                                                                         "port": n.port, "cluster": n.cluster}
                                                                for n in net.nodes.values()}}))
        return 0
    from daemon_runtime.lifecycle import run_daemon
    try:
        net = load_network(args.network)
        entry = net.node(args.name)
        key = net.load_key(args.name, args.key_file)
    except NetfileError as exc:
        print(f"marlin-node {args.role}: {exc}", file=sys.stderr)
        return 2
    want = {"producer": "producer", "cluster": "member", "consumer": "consumer"}[args.role]
    if entry.role != want:
        print(f"marlin-node {args.role}: {args.name} is a {entry.role} in {net.path}", file=sys.stderr)
        return 2
    return run_daemon(lambda stop: run_node(args, net, key, stop))


async def run_node(args, net, key, stop: asyncio.Event) -> None:
    from aiohttp import web
    from prometheus_client import CollectorRegistry

    from daemon_runtime.eventlog import EventLog
    from daemon_runtime.lifecycle import Ready, add_status_routes, parse_hostport

    role = args.role
    entry = net.node(args.name)
    log = EventLog(SERVICES[role], entry.hex, [MARLIN_EVENTS], sink=args.log, min_level=args.log_level)
    metrics = Metrics()
    host, port = (entry.host, entry.port)
    if args.listen:
        host, port = parse_hostport(args.listen)
    # who may connect to us: producers and members send to members; members send to the
    # producers (acknowledgements) and to consumers; nobody else is accepted ("unknown_peer")
    senders = {"producer": ("member",), "cluster": ("producer", "member"), "consumer": ("member",)}[role]
    transport = Transport(key, net.directory(exclude=key.address), on_frame=lambda p, f: None,
                          known=[n.address for n in net.nodes.values()
                                 if n.address != key.address and n.role in senders],
                          max_frame=net.params.max_frame, queue_bytes=args.queue_bytes)
    metrics.transport = transport
    rebuilds: RebuildPool | None = None
    if role == "consumer":
        rebuilds = RebuildPool(args.validate_pool, args.validate_workers)
    core = _make_core(role, net, key, args.name, offload=rebuilds is not None and rebuilds.offload)
    metrics.core = core
    store = Store(args.data_dir) if args.data_dir else None
    restored = False
    if store is not None and role == "producer":
        restored = restore_stake(core, store, time.time())
    if store is not None and role == "consumer":
        store.prune_delivered(time.time() - 86400.0)
    outputs: Outputs | None = None
    producer: Producer | None = None
    started = time.time()

    def on_event(ev) -> None:
        if outputs is not None and type(ev) is BlockRebuilt:
            outputs.deliver(ev)
        elif store is not None and type(ev) is StakeEvidence:
            store.add_evidence(ev, time.time())

    runner = MarlinRunner(role, core, transport, log, metrics, on_event,
                        rebuilds if rebuilds is not None and rebuilds.offload else None)
    if rebuilds is not None:
        rebuilds.bug = runner.bug
        warm = rebuilds.warm()
        if warm:
            await asyncio.gather(*(asyncio.wrap_future(f) for f in warm))
    if role == "consumer":
        outputs = Outputs(args.out_dir, args.redis, args.redis_stream, args.redis_maxlen, metrics, runner.bug,
                          store)
        try:
            await outputs.start()
        except BaseException:
            rebuilds.close()
            raise
    if role == "producer":
        producer = Producer(runner, log, metrics, args.channel, store)
        if args.inject_drop_chunks > 0:
            inject_chunk_drops(transport, net.params, args.inject_drop_chunks, metrics)

    def health() -> dict:
        peers = net.directory(exclude=key.address)
        out = {"ok": True, "role": role, "name": args.name, "address": entry.hex,
               "uptime_s": round(time.time() - started, 1),
               "connected": sum(1 for a in peers if transport.connected(a)),
               "counts": {f"{k}{'.' + l if l else ''}": v for (k, l), v in sorted(metrics.counts.items())},
               "duplicates": core.duplicates()}
        if role == "cluster":
            out["cluster"] = entry.cluster
        if role == "producer":
            out["stake_restored"] = restored
            out["stake_left"] = core.stake_left(time.time())
            out["missing_acks"] = sum(len(core.missing_acks(mid)) for mid in core.messages())
        if role == "consumer":
            out["pending_messages"] = len(core.pending())
            out["rebuilding"] = core.rebuilding()
            out["validate_pool"] = {"kind": rebuilds.kind, "workers": rebuilds.workers}
        if store is not None and role == "cluster":
            out["evidence"] = store.evidence_count()
        return out

    registry = CollectorRegistry()
    registry.register(metrics)
    max_block = max(cp.max_block for cp in net.params.channels.values())
    # room for the largest block a channel takes (POST /produce answers anything larger itself)
    app = web.Application(client_max_size=max(net.params.max_frame * 2, max_block + 1))
    add_status_routes(app, registry, health)
    if producer is not None:

        def too_large(size: str) -> web.Response:
            metrics.inc("input_errors", "oversized")
            return web.json_response({"error": f"block of {size} bytes exceeds the largest channel "
                                               f"max_block {max_block}"}, status=413)

        async def produce(request: web.Request) -> web.Response:
            if request.content_length is not None and request.content_length > max_block:
                return too_large(str(request.content_length))      # refused before reading it
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:                   # a chunked body without a length
                return too_large(f"more than {max_block}")
            if len(body) > max_block:
                return too_large(str(len(body)))
            try:
                out = producer.produce(body, request.query.get("channel"))
            except ValueError as exc:
                metrics.inc("input_errors", "bad_input")
                return web.json_response({"error": str(exc)}, status=400)
            except MarlinLocalError as exc:
                kind = type(exc).__name__
                metrics.inc("input_errors", kind)
                status = {"StakeExhausted": 409, "Backpressure": 429}.get(kind, 400)
                return web.json_response({"error": str(exc), "kind": kind}, status=status)
            return web.json_response(out)

        app.router.add_post("/produce", produce)
    web_runner = web.AppRunner(app, access_log=None)
    await web_runner.setup()
    shost, sport = parse_hostport(args.status)
    site = web.TCPSite(web_runner, shost, sport)
    tasks: list[asyncio.Task] = []
    site_started = False
    try:
        try:
            await transport.start(host, port)
        except OSError as exc:
            raise RuntimeError(f"cannot listen on {host}:{port} for the transport: {exc}") from None
        try:
            await site.start()
        except OSError as exc:
            raise RuntimeError(f"cannot listen on {shost}:{sport} for /metrics and /health (--status): {exc}") from None
        site_started = True
        status_port = site._server.sockets[0].getsockname()[1]  # aiohttp has no public accessor
        # dial every peer this role sends to now, so the first block does not pay for it
        if role == "producer":
            transport.warm([n.address for n in net.by_role("member")])
        elif role == "cluster":
            transport.warm([n.address for n in net.by_role("member") if n.address != key.address]
                           + [n.address for n in net.by_role("consumer")]
                           + [n.address for n in net.by_role("producer")])
        Ready(service=SERVICES[role], name=args.name, address=entry.hex, port=transport.port,
              status_port=status_port).announce()
        if producer is not None and args.blocks_dir:
            tasks.append(asyncio.create_task(producer.watch_dir(Path(args.blocks_dir), args.poll, stop)))
        if producer is not None and args.stdin:
            tasks.append(asyncio.create_task(producer.read_stdin(max_block)))
        await stop.wait()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if site_started:
            await site.stop()
        await transport.close(grace=args.grace)
        runner.close()
        if rebuilds is not None:
            rebuilds.close()
        if outputs is not None:
            await outputs.close()
        if store is not None:
            store.close()
        await web_runner.cleanup()
        log.close()


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
