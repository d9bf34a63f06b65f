"""An RMB cluster on 127.0.0.1 for tests and benchmarks: a twin registry, relays and peers
as real asyncio servers in this process (or peers/relays as subprocesses, for the
benchmark), over one real Redis. Each peer gets its own Redis database number
(redis://127.0.0.1:PORT/<n>, n = 1, 2, ...); registry and relays use the base database.

    async with RmbCluster(redis_url, tmp_path) as c:
        r1 = await c.start_relay()
        a = await c.new_twin([r1]); b = await c.new_twin([r1])
        pa = await c.start_peer(a, [r1]); pb = await c.start_peer(b, [r1])
        client = c.client(pa); service = c.service(pb, "calc")
"""
from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from daemon_runtime.eventlog import EventLog
from daemon_runtime.redis_server import free_port
from rmb_peer.client import RmbClient, RmbService
from rmb_peer.events import RMB_EVENTS
from rmb_relay.events import RELAY_EVENTS
from rmb_peer.identity import E2EKey, Identity
from rmb_peer.twins import TwinDirectory

REPO = Path(__file__).resolve().parent.parent


def redis_db(url: str, db: int) -> str:
    """The same Redis server, database `db`."""
    base, _, last = url.rstrip("/").rpartition("/")
    if not last.isdigit():
        base = url.rstrip("/")
    return f"{base}/{db}"


async def until(pred, timeout: float, what: str) -> None:
    """Wait until pred() is true, polling every 50 ms; AssertionError naming `what` after
    `timeout` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        assert loop.time() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.05)


def events_of(buf: io.StringIO | str | Path) -> list[dict]:
    """Parsed JSON lines of an event log (a StringIO sink or a file path)."""
    text = buf.getvalue() if isinstance(buf, io.StringIO) else Path(buf).read_text()
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@dataclass
class RelayHandle:
    port: int
    domain: str
    server: object = None          # rmb_relay.daemon.RelayServer (in-process)
    proc: subprocess.Popen | None = None
    log: io.StringIO | Path | None = None
    seen: list[bytes] = field(default_factory=list)   # frames the relay got from peers

    @property
    def url(self) -> str:
        return f"ws://{self.domain}"


@dataclass
class TwinInfo:
    id: int
    seed: str
    identity: Identity
    e2e: E2EKey | None
    key_type: str


@dataclass
class PeerHandle:
    twin: TwinInfo
    redis_url: str
    args: list[str]
    daemon: object = None          # rmb_peer.daemon.PeerDaemon (in-process)
    task: asyncio.Task | None = None
    stop: asyncio.Event | None = None
    proc: subprocess.Popen | None = None
    log: io.StringIO | Path | None = None
    ready: dict | None = None


class RmbCluster:
    def __init__(self, redis_url: str, tmp_path: Path | None = None, log_to_files: bool = False):
        self.redis_url = redis_db(redis_url, 0)
        self.tmp = Path(tmp_path) if tmp_path else None
        self.log_to_files = log_to_files
        self.registry = None
        self.registry_url = ""
        self.directory: TwinDirectory | None = None
        self.relays: list[RelayHandle] = []
        self.peers: list[PeerHandle] = []
        self._clients: list = []
        self._services: list[tuple[RmbService, asyncio.Event, asyncio.Task]] = []
        self._next_db = 1
        self._seed = 0

    async def __aenter__(self) -> "RmbCluster":
        from rmb_relay.registry import RegistryServer
        self.registry_log = io.StringIO()
        self.registry = RegistryServer("127.0.0.1", 0, self.redis_url,
                                       EventLog("rmb-registry", "registry", [RMB_EVENTS], sink=self.registry_log))
        port = await self.registry.start()
        self.registry_url = f"http://127.0.0.1:{port}"
        self.directory = TwinDirectory(self.registry_url, cache_ttl=0.0)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _log_sink(self, name: str):
        if self.log_to_files and self.tmp is not None:
            return self.tmp / f"{name}.jsonl"
        return io.StringIO()

    # ------------------------------------------------------------------ relays
    async def start_relay(self, subprocess_mode: bool = False, capture: bool = True,
                          redis_url: str | None = None, extra: list[str] = (), **kw) -> RelayHandle:
        """A relay on a free port whose domain is 127.0.0.1:<port>. In-process relays
        record every frame they receive from peers in `seen` (capture=True). redis_url:
        another Redis server for the relay (default: the cluster's). extra: more
        rmb_relay.daemon arguments (subprocess_mode only)."""
        redis_url = redis_url or self.redis_url
        port = free_port()
        domain = f"127.0.0.1:{port}"
        sink = self._log_sink(f"relay-{port}")
        handle = RelayHandle(port, domain, log=sink)
        if subprocess_mode:
            args = [sys.executable, "-m", "rmb_relay.daemon", "--domain", domain, "--listen", domain,
                    "--redis", redis_url, "--registry", self.registry_url,
                    "--log", str(sink) if isinstance(sink, Path) else os.devnull, *extra]
            handle.proc, _ = await _spawn_ready(args)
        else:
            from rmb_relay.daemon import RelayServer
            server = RelayServer(domains=[domain], host="127.0.0.1", port=port,
                                 redis_url=redis_url, registry_url=self.registry_url,
                                 events=EventLog("rmb-relay", domain, [RMB_EVENTS, RELAY_EVENTS],
                                                 sink=str(sink) if isinstance(sink, Path) else sink),
                                 directory=TwinDirectory(self.registry_url, cache_ttl=1.0), **kw)
            server._own_directory = True
            if capture:
                original = server._on_binary

                async def on_binary(peer, data, _orig=original, _seen=handle.seen):
                    _seen.append(bytes(data))
                    return await _orig(peer, data)
                server._on_binary = on_binary
            await server.start()
            handle.server = server
        self.relays.append(handle)
        return handle

    async def kill_relay(self, relay: RelayHandle) -> None:
        """Stop a relay abruptly (subprocess: SIGKILL; in-process: close without grace)."""
        if relay.proc is not None:
            relay.proc.kill()
            relay.proc.wait(5)
        elif relay.server is not None:
            await relay.server.close(grace=0)
        relay.server = None
        relay.proc = None

    # ------------------------------------------------------------------ twins
    async def new_twin(self, relays: list[RelayHandle], pk: bool = True,
                       key_type: str = "sr25519") -> TwinInfo:
        """Register a twin (fresh seed) with these relays' domains and (pk=True) its e2e pk."""
        self._seed += 1
        seed = (os.urandom(28) + self._seed.to_bytes(4, "big")).hex()
        ident = Identity.from_seed(seed, key_type)
        e2e = E2EKey.from_seed(seed)
        twin = await self.directory.create(ident, [r.domain for r in relays], e2e.pk if pk else None)
        return TwinInfo(twin.id, seed, ident, e2e if pk else None, key_type)

    # ------------------------------------------------------------------ peers
    def peer_args(self, twin: TwinInfo, relays: list[RelayHandle], redis_url: str,
                  update: bool = False, extra: list[str] = (), by_account: bool = False) -> list[str]:
        args = ["--seed", twin.seed, "--key-type", twin.key_type,
                *([] if by_account else ["--twin", str(twin.id)]),
                "--redis", redis_url, "--registry", self.registry_url,
                "--twin-cache-ttl", "2", "--ready-timeout", "5"]
        for r in relays:
            args += ["--relay", r.url]
        if not update:
            args.append("--no-update")
        return args + list(extra)

    async def start_peer(self, twin: TwinInfo, relays: list[RelayHandle], *, db: int | None = None,
                         update: bool = False, subprocess_mode: bool = False,
                         extra: list[str] = (), log_name: str | None = None,
                         clock=None, by_account: bool = False,
                         redis_url: str | None = None) -> PeerHandle:
        """Start rmb-peer for `twin` on its own Redis database (db: reuse one, e.g. to
        restart a peer). In-process by default; subprocess_mode runs `python -m
        rmb_peer.daemon`. clock: the in-process peer's unix-seconds source (e.g. a skewed
        one); by_account: omit --twin (the peer looks its twin up by account key);
        redis_url: another Redis server for this peer (default: the cluster's).
        Returns when the peer announced READY."""
        if db is None:
            db = self._next_db
            self._next_db += 1
        url = redis_db(redis_url or self.redis_url, db)
        sink = self._log_sink(log_name or f"peer-{twin.id}-{len(self.peers)}")
        args = self.peer_args(twin, relays, url, update, extra, by_account)
        if subprocess_mode:
            log_arg = str(sink) if isinstance(sink, Path) else os.devnull
            proc, info = await _spawn_ready([sys.executable, "-m", "rmb_peer.daemon", *args, "--log", log_arg])
            handle = PeerHandle(twin, url, args, proc=proc, log=sink, ready=info)
        else:
            from rmb_peer.daemon import PeerDaemon, parse_args
            ns = parse_args(args + ["--log", "-"])
            ns.log = str(sink) if isinstance(sink, Path) else sink
            daemon = PeerDaemon(ns, clock=clock or time.time)
            stop = asyncio.Event()
            ready: asyncio.Future = asyncio.get_running_loop().create_future()
            task = asyncio.get_running_loop().create_task(
                daemon.run(stop, announce=lambda info: ready.done() or ready.set_result(info)))
            done, _ = await asyncio.wait({task, ready}, timeout=20, return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                task.result()  # raises the startup error
            if ready not in done:
                raise RuntimeError("peer did not become ready within 20 s")
            handle = PeerHandle(twin, url, args, daemon=daemon, task=task, stop=stop, log=sink,
                                ready=ready.result())
        self.peers.append(handle)
        return handle

    async def stop_peer(self, peer: PeerHandle) -> None:
        if peer.proc is not None:
            if peer.proc.poll() is None:
                peer.proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.get_running_loop().run_in_executor(None, peer.proc.wait, 10)
                except subprocess.TimeoutExpired:
                    peer.proc.kill()
            peer.proc = None
        elif peer.task is not None:
            peer.stop.set()
            await asyncio.wait_for(peer.task, 15)
            peer.task = None

    # ------------------------------------------------------------------ apps
    def client(self, peer: PeerHandle, log=None) -> RmbClient:
        c = RmbClient(peer.redis_url, log=log)
        self._clients.append(c)
        return c

    def service(self, peer: PeerHandle, name: str, handlers: dict, log=None) -> RmbService:
        """Start an RmbService with `handlers` {cmd: async fn(bytes) -> bytes}."""
        svc = RmbService(peer.redis_url, name, log=log)
        for cmd, fn in handlers.items():
            svc.handler(cmd)(fn)
        stop = asyncio.Event()
        task = asyncio.get_running_loop().create_task(svc.run(stop))
        self._services.append((svc, stop, task))
        return svc

    async def pair(self, service: str, handlers: dict):
        """One relay, twins A and B on it, a peer for each, and B's service `service` with
        `handlers`: returns (relay, a, b, peer_a, peer_b)."""
        relay = await self.start_relay()
        a = await self.new_twin([relay])
        b = await self.new_twin([relay])
        pa = await self.start_peer(a, [relay])
        pb = await self.start_peer(b, [relay])
        self.service(pb, service, handlers)
        return relay, a, b, pa, pb

    async def close(self) -> None:
        for svc, stop, task in self._services:
            stop.set()
        for svc, stop, task in self._services:
            try:
                await asyncio.wait_for(task, 10)
            except Exception:
                pass
        for c in self._clients:
            await c.close()
        for p in self.peers:
            try:
                await self.stop_peer(p)
            except Exception:
                pass
        for r in self.relays:
            try:
                await self.kill_relay(r)
            except Exception:
                pass
        if self.directory is not None:
            await self.directory.close()
        if self.registry is not None:
            await self.registry.close()


async def _spawn_ready(argv: list[str], timeout: float = 30.0,
                       env: dict[str, str] | None = None) -> tuple[subprocess.Popen, dict]:
    """Start a daemon subprocess (env: its environment, default ours) and wait for its
    READY line."""
    from daemon_runtime.lifecycle import Ready
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, text=True,
                            env=env)
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = await loop.run_in_executor(None, proc.stdout.readline)
        if not line:
            err = proc.stderr.read()
            raise RuntimeError(f"{argv[2]} exited ({proc.wait()}): {err[-2000:]}")
        info = Ready.parse(line)
        if info is not None:
            return proc, info
    proc.kill()
    raise RuntimeError(f"{argv[2]} gave no READY line within {timeout} s")
