"""A REMP network as real processes on 127.0.0.1.

LocalNet: `remp-node init` into a work directory, then one `remp-node validator` per
validator and one `remp-node fullnode` per full node (daemon_runtime.daemons.Daemon: READY
lines, SIGTERM with grace, SIGKILL for planned faults), each with its own data directory and
event log (`<workdir>/logs/<label>.jsonl`). Used by the integration tests, the benchmarks and
the main job's REMP segment (deploy/remp_segment.py).
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys
import time
from pathlib import Path

from daemon_runtime.daemons import Daemon, LaunchError, script

from ..daemon.netfiles import Network, load_network

__all__ = ["LocalNet", "load_jsonl"]


class LocalNet:
    """LocalNet(workdir, shards=2, validators_per_shard=4, fullnodes=1, ...). await init();
    await start(); kill(label); await restart(label); await stop(). `api` is the first full
    node's base URL, `apis` every full node's; fullnode_args: extra `remp-node fullnode`
    flags given to every full node (e.g. ["--max-pending", "10"])."""

    def __init__(self, workdir: str | Path, *, shards: int = 2, validators_per_shard: int = 4,
                 masterchain_validators: int | None = None, fullnodes: int = 1,
                 mc_catchain_lifetime: float = 10.0, block_interval: float = 0.2,
                 master_block_interval: float | None = 0.3, genesis_delay: float | None = None,
                 faults: str = "", redis_url: str | None = None, ext_messages: str | Path | None = None,
                 start_timeout: float = 60.0, grace: float = 5.0, log_level: str = "info",
                 resend_interval: float | None = None, fullnode_args: list[str] | None = None):
        self.workdir = Path(workdir)
        self.netdir = self.workdir / "network"
        self.logdir = self.workdir / "logs"
        self.datadir = self.workdir / "data"
        self.shards = shards
        self.vps = validators_per_shard
        self.mcv = masterchain_validators
        self.fullnodes = fullnodes
        self.lifetime = mc_catchain_lifetime
        self.block_interval = block_interval
        self.master_block_interval = master_block_interval
        self.genesis_delay = genesis_delay
        self.faults = faults
        self.redis_url = redis_url
        self.ext_messages = ext_messages
        self.start_timeout = start_timeout
        self.grace = grace
        self.log_level = log_level
        self.resend_interval = resend_interval
        self.fullnode_args = list(fullnode_args or [])
        self.daemons: dict[str, Daemon] = {}
        self.net: Network | None = None

    # -- set-up ---------------------------------------------------------------------------
    async def init(self) -> Network:
        for d in (self.netdir, self.logdir, self.datadir):
            d.mkdir(parents=True, exist_ok=True)
        n_proc = self.shards * self.vps + self.fullnodes
        delay = self.genesis_delay if self.genesis_delay is not None else 3.0 + 0.6 * n_proc
        argv = [script("remp-node"), "init", "--dir", str(self.netdir), "--shards", str(self.shards),
                "--validators-per-shard", str(self.vps), "--fullnodes", str(self.fullnodes),
                "--mc-catchain-lifetime", str(self.lifetime), "--block-interval", str(self.block_interval),
                "--genesis-delay", str(delay),
                "--ext-messages", str(self.ext_messages or "/nonexistent")]
        if self.mcv is not None:
            argv += ["--masterchain-validators", str(self.mcv)]
        if self.master_block_interval is not None:
            argv += ["--master-block-interval", str(self.master_block_interval)]
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise LaunchError(f"remp-node init failed ({proc.returncode}): {err.decode(errors='replace')}")
        self.net = load_network(self.netdir)
        for n in self.net.nodes:
            argv = [script("remp-node"), n.role, "--network", str(self.netdir), "--key",
                    str(self.netdir / n.key_file), "--data-dir", str(self.datadir / n.label),
                    "--log", str(self.logdir / f"{n.label}.jsonl"), "--log-level", self.log_level]
            if self.faults:
                argv += ["--faults", self.faults]
            if n.role == "fullnode":
                if self.redis_url:
                    argv += ["--redis", self.redis_url]
                if self.resend_interval:
                    argv += ["--resend-interval", str(self.resend_interval)]
                argv += self.fullnode_args
            self.daemons[n.label] = Daemon(n.label, argv, self.logdir)
        return self.net

    async def start(self) -> None:
        """Start every node concurrently; raises LaunchError naming the first that fails."""
        results = await asyncio.gather(*(d.start(self.start_timeout) for d in self.daemons.values()),
                                       return_exceptions=True)
        for d, r in zip(self.daemons.values(), results):
            if isinstance(r, BaseException):
                await self.stop()
                raise r if isinstance(r, LaunchError) else LaunchError(f"{d.name}: {r}")

    @property
    def api(self) -> str:
        fn = next(d for label, d in self.daemons.items() if label.startswith("fullnode"))
        return f"http://127.0.0.1:{fn.info['port']}"

    @property
    def apis(self) -> list[str]:
        """Every full node's base URL, in label order (fullnode1, fullnode2, ...): what a
        remp_node.api.submit.Submitter spreads messages over."""
        return [f"http://127.0.0.1:{d.info['port']}" for label, d in self.daemons.items()
                if label.startswith("fullnode")]

    def fullnode_labels(self) -> list[str]:
        return [label for label in self.daemons if label.startswith("fullnode")]

    def http(self, label: str) -> str:
        return f"http://127.0.0.1:{self.daemons[label].info['port']}"

    def validators(self) -> list[str]:
        return [n.label for n in self.net.validators()]

    # -- faults ---------------------------------------------------------------------------
    def kill(self, label: str) -> None:
        """SIGKILL (no goodbye, no flush): the planned crash."""
        d = self.daemons[label]
        d.expected_exit = True
        if d.alive():
            d.proc.send_signal(signal.SIGKILL)

    async def restart(self, label: str) -> dict:
        d = self.daemons[label]
        if d.proc is not None and d.proc.returncode is None:
            await d.proc.wait()
        return await d.start(self.start_timeout)

    async def stop(self) -> None:
        await asyncio.gather(*(d.stop(self.grace) for d in self.daemons.values() if d.proc is not None),
                             return_exceptions=True)

    # -- logs -------------------------------------------------------------------------------
    def events(self, label: str | None = None, event: str | None = None) -> list[dict]:
        """Parsed event log lines of one node (or all), optionally one event name."""
        out = []
        paths = [self.logdir / f"{label}.jsonl"] if label else sorted(self.logdir.glob("*.jsonl"))
        for p in paths:
            for suffix in ("", ".1", ".2"):
                q = Path(str(p) + suffix) if suffix else p
                if not q.exists():
                    continue
                for line in q.read_text(errors="replace").splitlines():
                    try:
                        d = json.loads(line)
                    except ValueError:
                        continue
                    if event is None or d.get("event") == event:
                        out.append(d)
        return out


def load_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
