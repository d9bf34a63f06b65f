"""A local Marlin network of real `marlin-node` processes.

`MarlinNet(workdir)`: runs `marlin-node init` into `workdir/marlin/net`, starts every node
as its own process (daemon_runtime.daemons.Daemon: READY line, stderr file), and gives tests
and the main job's Marlin segment (deploy/marlin_segment.py) what they need:
`produce(producer, block)` (HTTP POST /produce), `kill(name)` (SIGKILL), `restart(name)`,
`health(name)`, `rebuilt(consumer)` (the blocks a consumer wrote to its out-dir, by trace
id), `events(name)` (its JSON-lines event log).
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import aiohttp

from daemon_runtime.daemons import Daemon, LaunchError, script

CORRUPTED_NAME = "block413567_corrupted_btc2arc.raw"


def trace_of_file(name: str) -> str | None:
    """Consumer out-dir file "<mid 8 hex>_0x<producer>.<channel>" -> trace id "mid:0xproducer"."""
    stem = name.rsplit(".", 1)[0]
    mid, sep, prod = stem.partition("_")
    if not sep or len(mid) != 8 or not prod.startswith("0x"):
        return None
    return f"{mid}:{prod}"


class MarlinNet:
    """Real marlin-node processes on 127.0.0.1 (see the module docstring)."""

    def __init__(self, workdir: Path, *, clusters: int = 3, members: int = 2, producers: int = 2,
                 consumers: int = 2, params: list[str] | None = None, logdir: Path | None = None,
                 start_timeout: float = 30.0, extra_args: dict[str, list[str]] | None = None):
        self.root = Path(workdir) / "marlin"
        self.netdir = self.root / "net"
        self.logdir = Path(logdir) if logdir else Path(workdir) / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.shape = dict(clusters=clusters, members=members, producers=producers, consumers=consumers)
        self.params = list(params or [])
        self.start_timeout = start_timeout
        self.extra_args = dict(extra_args or {})   # node name -> more flags for its command line
        self.nodes: dict[str, dict] = {}
        self.procs: dict[str, Daemon] = {}
        self._session: aiohttp.ClientSession | None = None

    # -------------------------------------------------------------- set-up
    def init(self) -> dict:
        """`marlin-node init` (the real CLI) -> the network file's nodes by name."""
        argv = [script("marlin-node"), "init", "--dir", str(self.netdir)]
        for k, v in self.shape.items():
            argv += [f"--{k}", str(v)]
        for p in self.params:
            argv += ["--param", p]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise LaunchError(f"marlin-node init failed ({proc.returncode}): {proc.stderr.strip()}")
        doc = json.loads((self.netdir / "network.json").read_text())
        self.nodes = {n["name"]: n for n in doc["nodes"]}
        return self.nodes

    def names(self, role: str) -> list[str]:
        return [n for n, e in self.nodes.items() if e["role"] == role]

    def out_dir(self, consumer: str) -> Path:
        return self.root / "out" / consumer

    def log_path(self, name: str) -> Path:
        return self.logdir / f"marlin-{name}.jsonl"

    def _argv(self, name: str) -> list[str]:
        role = {"producer": "producer", "member": "cluster", "consumer": "consumer"}[self.nodes[name]["role"]]
        argv = [script("marlin-node"), role, "--network", str(self.netdir / "network.json"), "--name", name,
                "--status", "127.0.0.1:0", "--log", str(self.log_path(name)), "--grace", "2",
                "--data-dir", str(self.root / "data" / name)]
        if role == "consumer":
            argv += ["--out-dir", str(self.out_dir(name))]
        return argv + list(self.extra_args.get(name, []))

    async def start(self) -> None:
        """Init (once) and start every node: members and consumers first, then producers."""
        if not self.nodes:
            await asyncio.to_thread(self.init)
        order = self.names("member") + self.names("consumer") + self.names("producer")
        for name in order:
            self.procs[name] = Daemon(f"marlin-{name}", self._argv(name), self.logdir)
        await asyncio.gather(*(self.procs[n].start(self.start_timeout) for n in order
                               if self.nodes[n]["role"] != "producer"))
        await asyncio.gather(*(self.procs[n].start(self.start_timeout) for n in self.names("producer")))
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))

    async def stop(self, grace: float = 10.0) -> None:
        await asyncio.gather(*(d.stop(grace) for d in self.procs.values()), return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -------------------------------------------------------------- faults
    async def kill(self, name: str) -> None:
        """SIGKILL the node (no goodbye, no flush)."""
        d = self.procs[name]
        d.expected_exit = True
        if d.alive():
            d.proc.kill()
            await d.proc.wait()

    async def restart(self, name: str) -> dict:
        return await self.procs[name].start(self.start_timeout)

    # -------------------------------------------------------------- traffic and state
    def _url(self, name: str, path: str) -> str:
        return f"http://127.0.0.1:{self.procs[name].info['status_port']}{path}"

    async def produce(self, producer: str, block: bytes, channel: str = "auto") -> dict:
        """POST /produce; returns the producer's JSON ({"message_id", "trace_id", ...}).
        Raises LaunchError with the producer's error text on a non-200 answer."""
        async with self._session.post(self._url(producer, "/produce"), params={"channel": channel},
                                      data=block) as resp:
            body = await resp.json()
            if resp.status != 200:
                raise LaunchError(f"{producer} refused a block ({resp.status}): {body}")
            return body

    async def health(self, name: str) -> dict:
        async with self._session.get(self._url(name, "/health")) as resp:
            return await resp.json()

    async def metrics_text(self, name: str) -> str:
        async with self._session.get(self._url(name, "/metrics")) as resp:
            return await resp.text()

    def rebuilt(self, consumer: str) -> dict[str, bytes]:
        """trace id -> block bytes, as the consumer wrote them."""
        out: dict[str, bytes] = {}
        d = self.out_dir(consumer)
        if d.is_dir():
            for p in d.iterdir():
                tid = trace_of_file(p.name)
                if tid and not p.name.endswith(".tmp"):
                    out[tid] = p.read_bytes()
        return out

    def events(self, name: str, event: str | None = None) -> list[dict]:
        """The node's event log lines (every restart appends), optionally one event only."""
        out = []
        for path in sorted(self.logdir.glob(f"marlin-{name}.jsonl*")):
            for line in path.read_text(errors="replace").splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if event is None or rec.get("event") == event:
                    out.append(rec)
        return out

    def address(self, name: str) -> str:
        return self.nodes[name]["address"]


async def wait_for(pred, timeout: float, step: float = 0.1) -> bool:
    """Poll `pred()` (sync) until true or `timeout` s; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(step)
