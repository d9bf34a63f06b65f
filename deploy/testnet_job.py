"""The testnet job: the suite's protocols running in network namespaces (deploy/testnet.py),
with a region partitioned and healed while they carry traffic, every outcome accounted for.

    run_job(topology, ["remp", "marlin", "rmb"], workdir, partition_s=None) -> exit code
    (CLI: python -m deploy.testnet --topology wan --job remp,marlin,rmb)

What runs where (node names are placed by the topology's [placement]):
- REMP: the main job's REMP segment (deploy/remp_segment.py RempSegment: real wallet and
  recorded messages, collator rejects, a validator SIGKILLed and restarted) with its
  network file rewritten so validator i and the full node listen on their namespace's
  address; labels "v1".., "fullnode1".
- Marlin: the main job's Marlin segment (deploy/marlin_segment.py MarlinSegment: blocks
  from ../shared/data, a member SIGKILLed and restarted, a corrupted block that must be
  disputed), node hosts rewritten likewise; names "producer", "c<i>m<j>", "consumer<k>".
- RMB: registry, relay1, relay2 (federated), relay3 (joins in the rotation), twins alice
  (client), bob and carol (an echo service each, run in this process against the twin's own
  Redis); every Redis runs inside the namespace of the node that owns it. alice calls bob
  and carol `requests` times, one call each every `interval` s.

Fault plan (each logged with deploy.segments.Plan, for the fault and every node it hits,
before it is injected, as the main job does; times in s after traffic starts, cfg keys):
- `region_partition`: the last region of the topology cut off (both directions, blackhole
  rules in the router namespace) at `partition_at`, healed `partition_s` s later;
- `asymmetric_link` (faults.asymmetric: at, for, mbit, from, to): one inter-region path
  capped in one direction (htb on the router), the reverse path unchanged;
- `relay_unreachable` (faults.relay_unreachable: relay, at, for): a relay's host cut off
  (its bridge port down) while twins that list another relay keep receiving through it;
- `relay_rotation` (faults.relay_rotation: relay, new, at, window): rotating nodes, the
  relay stopped for good, a new relay on its own node joins, its twins' peers restart on
  the new relay and publish it in the registry;
- each segment's own: a validator and a cluster member SIGKILLed and restarted (REMP's
  validator set and Marlin's membership are fixed in their network files, so the same
  identity comes back).
A one-region topology gets no partition and no asymmetric link.

Accounting, the loopback job's rules: REMP: every submitted message reaches a final outcome
(finalized, rejected, timeout), none left without one ("none"), rejections as planned;
Marlin: every (block, consumer) pair rebuilt or disputed by the consumer (e.g. "expired"
when its chunks arrive after TOLERABLE_LATENCY, as after a long partition), the corrupted
block disputed by every consumer; RMB: every (request, destination) answered, errored or
expired (the peer told the app), none silently missing, answers carry the payload back;
while a relay is unreachable, every request to a twin that lists another relay answered;
after the rotation, every request to the moved twins answered. Figures (ms, from the daemons'
own logs and this process's clock; one machine, one clock): REMP first receipt (submit ->
first PutIntoQueue at the full node) and Finalized p50/p99, Marlin produce -> rebuilt p50/p99
per consumer, RMB round trip p50/p99 per destination. Written to WORKDIR/testnet.json with the
link model (Testnet.describe()).
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import datetime
from pathlib import Path

from daemon_runtime.daemons import Daemon, LaunchError, script
from deploy.segments import Plan
from deploy.testnet import RTO_MAX_MS, Testnet, TestnetError, Topology
from rmb_peer.core import BACKOFF_MAX, BACKOFF_MIN, DEAD_AFTER
from rmb_peer.relays import CONNECT_TIMEOUT

__all__ = ["run_job", "run_and_record", "job_nodes", "NsRmb", "DEFAULTS"]

SHARED_DATA = Path(os.environ.get("RELAYSUITE_SHARED_DATA",
                                  Path(__file__).resolve().parent.parent.parent / "shared" / "data"))

#: the job's defaults (tests shrink them)
DEFAULTS = {
    "remp": {"shards": 2, "validators_per_shard": 4, "wallet_messages": 20, "collator_rejects": 2,
             "mc_catchain_lifetime": 20.0, "block_interval": 0.2, "master_block_interval": 0.1,
             "kill": "v3", "kill_after": 6.0, "kill_for": 3.0, "deadline": 180.0, "rate": 10.0,
             "fullnodes": 1},
    "marlin": {"clusters": 3, "members": 2, "kill": "c2m1", "kill_at": 0.5, "kill_duration": 3.0,
               "deadline": 150.0, "interval": 0.5, "tolerable_latency": 30, "max_clock_skew": 2},
    "rmb": {"requests": 140, "ttl": 40, "interval": 0.5, "twin_cache_ttl": 5.0},
    "partition_at": 4.0, "partition_s": 30.0, "start_timeout": 90.0, "grace": 10.0,
    # the other planned faults, s after traffic starts (module doc); None / {} leaves one out
    "faults": {"asymmetric": {"at": 6.0, "for": 15.0, "mbit": 5},
               "relay_unreachable": {"relay": "relay2", "at": 36.0, "for": 8.0},
               "relay_rotation": {"relay": "relay2", "new": "relay3", "at": 46.0, "window": 12.0}},
}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(q * (len(v) - 1)))))]


def _stats(values: list[float]) -> dict:
    return {"n": len(values), "p50_ms": _pct(values, 0.50), "p99_ms": _pct(values, 0.99),
            "max_ms": max(values) if values else None}


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _events(paths, event: str | None = None) -> list[dict]:
    out = []
    for p in paths:
        try:
            lines = Path(p).read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if event is None or d.get("event") == event:
                out.append(d)
    return out


# --------------------------------------------------------------------------- REMP


def remp_labels(cfg: dict) -> list[str]:
    n = int(cfg["shards"]) * int(cfg["validators_per_shard"])
    return [f"v{i}" for i in range(1, n + 1)] + [f"fullnode{i}" for i in range(1, int(cfg.get("fullnodes", 1)) + 1)]


def _make_remp_segment(net: Testnet, cfg: dict, workdir: Path, plan: Plan, timeout: float, grace: float):
    from deploy.remp_segment import RempSegment
    from remp_node.testnet.localnet import LocalNet
    from remp_node.daemon.netfiles import load_network

    class NsLocalNet(LocalNet):
        """LocalNet whose nodes listen on their namespace's address and run inside it."""

        async def init(self):
            await super().init()
            path = self.netdir / "network.json"

            def move(n: dict) -> None:
                ip = net.address(n["label"])
                n["address"] = f"{ip}:{n['address'].rsplit(':', 1)[1]}"
                n["http"] = f"{ip}:{n['http'].rsplit(':', 1)[1]}"
            doc = json.loads(path.read_text())
            for n in doc["nodes"]:
                move(n)
            mode = path.stat().st_mode & 0o777
            path.write_text(json.dumps(doc, indent=1))
            os.chmod(path, mode)
            self.net = load_network(self.netdir)
            for label, d in self.daemons.items():
                d.argv = net.exec_argv(label, d.argv)
            return self.net

        @property
        def api(self) -> str:
            return self.http("fullnode1")

        @property
        def apis(self) -> list[str]:
            return [self.http(label) for label in self.fullnode_labels()]

        def http(self, label: str) -> str:
            return net.url(label, self.daemons[label].info["port"])

    seg = RempSegment(cfg, workdir, plan, SHARED_DATA if SHARED_DATA.is_dir() else None, [],
                      start_timeout=timeout, grace=grace)
    old = seg.local
    seg.local = NsLocalNet(old.workdir, shards=old.shards, validators_per_shard=old.vps,
                           masterchain_validators=old.mcv, fullnodes=old.fullnodes, mc_catchain_lifetime=old.lifetime,
                           block_interval=old.block_interval, master_block_interval=old.master_block_interval,
                           ext_messages=old.ext_messages, start_timeout=timeout, grace=grace,
                           genesis_delay=8.0 + 0.6 * len(remp_labels(cfg)))
    seg.local.logdir = seg.logdir
    return seg


def remp_figures(seg) -> dict:
    logs = sorted(seg.logdir.glob("fullnode1.jsonl*"))
    rec, first, final = {}, {}, {}
    for e in _events(logs):
        t, ev = e.get("trace_id"), e.get("event")
        if not t:
            continue
        if ev == "remp.fullnode.received":
            rec.setdefault(t, _ts(e["ts"]))
        elif ev == "remp.fullnode.status" and (e.get("attrs") or {}).get("kind") == "PutIntoQueue":
            first.setdefault(t, _ts(e["ts"]))
        elif ev == "remp.fullnode.final":
            final[t] = e.get("attrs") or {}
    fr = [(first[t] - rec[t]) * 1e3 for t in first if t in rec]
    fin = [a.get("duration_ms") for a in final.values() if a.get("outcome") == "finalized"
           and a.get("duration_ms") is not None]
    return {"first_receipt": _stats(fr), "finalized": _stats(fin)}


# --------------------------------------------------------------------------- Marlin


def marlin_names(cfg: dict) -> list[str]:
    names = ["producer", "producer2"]
    names += [f"c{i}m{j}" for i in range(1, int(cfg["clusters"]) + 1) for j in range(1, int(cfg["members"]) + 1)]
    return names + ["consumer1", "consumer2"]


def _make_marlin_segment(net: Testnet, cfg: dict, workdir: Path, plan: Plan, timeout: float, grace: float):
    from deploy.launcher import corrupted_block, default_blocks
    from deploy.marlin_segment import MarlinSegment
    from marlin_cluster.localnet import MarlinNet

    class NsMarlinNet(MarlinNet):
        """MarlinNet whose nodes listen on their namespace's address and run inside it."""

        def init(self) -> dict:
            super().init()
            path = self.netdir / "network.json"
            mode = path.stat().st_mode & 0o777
            doc = json.loads(path.read_text())
            for n in doc["nodes"]:
                n["host"] = net.address(n["name"])
            path.write_text(json.dumps(doc, indent=1))
            os.chmod(path, mode)
            self.nodes = {n["name"]: n for n in doc["nodes"]}
            return self.nodes

        def _argv(self, name: str) -> list[str]:
            argv = super()._argv(name)
            argv[argv.index("--status") + 1] = f"{net.address(name)}:0"
            return net.exec_argv(name, argv)

        def _url(self, name: str, path: str) -> str:
            return net.url(name, self.procs[name].info["status_port"]) + path

    class NsMarlinSegment(MarlinSegment):
        """Every (block, consumer) pair accounted for: rebuilt, or disputed by the consumer
        (e.g. "expired": its chunks arrived after TOLERABLE_LATENCY, as after a long
        partition). The segment waits for that; counters add `disputed` and `accounted`."""

        def _pairs(self) -> tuple[set, set]:
            rebuilt = {(c, t) for c in self.net.names("consumer") for t in self.net.rebuilt(c) if t in self.sent}
            disputed = {(c, r.get("trace_id")) for c in self.net.names("consumer")
                        for r in self.net.events(c, "marlin.consumer.dispute") if r.get("trace_id") in self.sent}
            return rebuilt, disputed - rebuilt

        def _rebuilt_pairs(self) -> int:
            rebuilt, disputed = self._pairs()
            return len(rebuilt) + len(disputed)

        async def _collect(self) -> dict:
            out = await super()._collect()
            rebuilt, disputed = self._pairs()
            out["rebuilt"] -= len(disputed)
            out["disputed"] = len(disputed)
            out["accounted"] = len(rebuilt) + len(disputed)
            return out

    blocks = default_blocks() + [corrupted_block()]
    seg = NsMarlinSegment(cfg, workdir, plan, SHARED_DATA if SHARED_DATA.is_dir() else None, blocks,
                        start_timeout=timeout, grace=grace)
    old = seg.net
    seg.net = NsMarlinNet(workdir, clusters=old.shape["clusters"], members=old.shape["members"],
                          producers=2, consumers=2, params=old.params, logdir=old.logdir,
                          start_timeout=timeout)
    return seg


def marlin_figures(seg) -> dict:
    produced = {}
    for e in seg.net.events("producer", "marlin.producer.produced"):
        produced.setdefault(e.get("trace_id"), _ts(e["ts"]))
    out = {}
    for c in seg.net.names("consumer"):
        lat = []
        for e in seg.net.events(c, "marlin.consumer.block_rebuilt"):
            t = e.get("trace_id")
            if t in produced and t in seg.sent:
                lat.append((_ts(e["ts"]) - produced[t]) * 1e3)
        out[c] = _stats(lat)
    # the largest block (the 1 MB Bitcoin block of ../shared/data) at each consumer
    big = max(seg.honest, key=lambda b: len(b.data), default=None)
    largest = {}
    if big is not None:
        traces = [t for t, name in seg.sent.items() if name == big.name]
        for c in seg.net.names("consumer"):
            for e in seg.net.events(c, "marlin.consumer.block_rebuilt"):
                if e.get("trace_id") in traces and e.get("trace_id") in produced:
                    largest[c] = (_ts(e["ts"]) - produced[e["trace_id"]]) * 1e3
    return {"produce_to_rebuilt": out, "largest_block": {"name": big.name if big else None,
                                                         "bytes": len(big.data) if big else 0, "ms": largest}}


# --------------------------------------------------------------------------- RMB


RMB_NODES = ["registry", "relay1", "relay2", "relay3", "alice", "bob", "carol"]
#: twin -> its relays in the order its peer uses them (frames leave through the first live
#: one): carol lists relay1 first so that an unreachable relay2 is one she can do without
TWINS = {"alice": ["relay1"], "bob": ["relay2"], "carol": ["relay1", "relay2"]}


class NsRmb:
    """RMB in namespaces: registry, two federated relays, three twins' peers, each with its
    own Redis in its namespace; echo services on bob and carol; alice's app is this process."""

    def __init__(self, net: Testnet, cfg: dict, workdir: Path, plan: Plan, timeout: float, grace: float):
        self.net, self.cfg, self.plan = net, cfg, plan
        self.workdir = Path(workdir) / "rmb"
        self.logdir = Path(workdir) / "logs"
        self.timeout, self.grace = timeout, grace
        self.daemons: dict[str, Daemon] = {}
        self.redis: dict[str, Daemon] = {}
        self.redis_url: dict[str, str] = {}
        self.twin_ids: dict[str, int] = {}
        self.domains: dict[str, str] = {}
        self.outcomes: dict[tuple[str, str], str] = {}
        self.rtt: dict[str, list[float]] = {"bob": [], "carol": []}
        self.stop_apps = asyncio.Event()
        self.app_tasks: list[asyncio.Task] = []
        self.app_logs: list = []
        self.relays_of: dict[str, list[str]] = {}
        self.retired: list[str] = []
        self.sent_at: dict[tuple[str, str], float] = {}
        self.state = "new"

    async def _redis(self, node: str, bind: str) -> str:
        from daemon_runtime.ports import free_ports
        from daemon_runtime.redis_server import redis_server_binary
        port = free_ports("127.0.0.1", 1)[0]
        d = self.workdir / "redis" / node
        d.mkdir(parents=True, exist_ok=True)
        argv = self.net.exec_argv(node, [redis_server_binary(), "--bind", bind, "--port", str(port),
                                         "--dir", str(d), "--save", "", "--appendonly", "yes"])
        proc = await asyncio.create_subprocess_exec(*argv, stdout=open(self.logdir / f"redis-{node}.log", "ab"),
                                                    stderr=asyncio.subprocess.STDOUT)
        self.redis[node] = Daemon(f"redis-{node}", argv, self.logdir, proc=proc)
        self.redis[node].expected_exit = False
        return f"redis://{bind}:{port}"

    async def _wait_redis(self, url: str) -> None:
        import redis.asyncio as aioredis
        deadline = time.monotonic() + self.timeout
        r = aioredis.Redis.from_url(url)
        try:
            while True:
                try:
                    await r.ping()
                    return
                except Exception:
                    if time.monotonic() > deadline:
                        raise LaunchError(f"redis {url} did not answer within {self.timeout:.0f} s")
                    await asyncio.sleep(0.1)
        finally:
            await r.aclose()

    def _wait_redis_in(self, node: str, url: str):
        # a relay's Redis listens on 127.0.0.1 inside its namespace: probe it from there
        async def probe():
            deadline = time.monotonic() + self.timeout
            host, port = url[len("redis://"):].split(":")
            while time.monotonic() < deadline:
                p = await asyncio.create_subprocess_exec(
                    "ip", "netns", "exec", self.net.nodes[node].ns, "python3", "-c",
                    f"import socket; socket.create_connection(('{host}', {port}), 1)",
                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
                if await p.wait() == 0:
                    return
                await asyncio.sleep(0.1)
            raise LaunchError(f"redis of {node} did not listen within {self.timeout:.0f} s")
        return probe()

    async def start(self) -> None:
        from rmb_peer.identity import Identity
        from rmb_peer.twins import TwinDirectory
        from deploy.launcher import seed_for
        self.state = "starting"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logdir.mkdir(parents=True, exist_ok=True)
        net = self.net
        reg = Daemon("rmb-registry", net.exec_argv("registry", [
            script("rmb-registry"), "--listen", f"{net.address('registry')}:0",
            "--data-dir", str(self.workdir / "registry"), "--log", str(self.logdir / "rmb-registry.jsonl")]),
            self.logdir)
        self.daemons["registry"] = reg
        info = await reg.start(self.timeout)
        self.registry_url = net.url("registry", info["port"])
        self.plan.node("registry", f"{net.address('registry')}:{info['port']}", "rmb-registry")
        for relay in ("relay1", "relay2"):
            await self._relay(relay)
        await asyncio.gather(*(self.daemons[r].start(self.timeout) for r in ("relay1", "relay2")))
        directory = TwinDirectory(self.registry_url, cache_ttl=0)
        try:
            for twin, relays in TWINS.items():
                ident = Identity.from_seed(seed_for(twin), "sr25519")
                rec = await directory.create(ident, [self.domains[r] for r in relays], None)
                self.twin_ids[twin] = rec.id
        finally:
            await directory.close()
        for twin, relays in TWINS.items():
            url = await self._redis(twin, net.address(twin))
            await self._wait_redis(url)
            self.redis_url[twin] = url + "/0"
            self._peer(twin, relays)
            self.plan.node(twin, str(self.twin_ids[twin]), "rmb-peer")
        await asyncio.gather(*(self.daemons[t].start(self.timeout) for t in TWINS))
        from rmb_peer.client import RmbService
        for twin in ("bob", "carol"):
            svc = RmbService(self.redis_url[twin], name=f"echo@{twin}", log=self.app_log("echo", twin))

            @svc.handler("testnet.echo")
            async def _echo(data: bytes) -> bytes:
                return data
            self.app_tasks.append(asyncio.ensure_future(svc.run(self.stop_apps)))
        self.state = "started"

    async def _relay(self, relay: str) -> None:
        """A relay daemon (not started) on node `relay` with its own Redis in its namespace."""
        from daemon_runtime.ports import free_ports
        net = self.net
        url = await self._redis(relay, "127.0.0.1")
        await self._wait_redis_in(relay, url)
        port = free_ports("127.0.0.1", 1)[0]
        domain = f"{net.address(relay)}:{port}"
        self.domains[relay] = domain
        self.daemons[relay] = Daemon(f"rmb-relay-{relay}", net.exec_argv(relay, [
            script("rmb-relay"), "--domain", domain, "--listen", domain, "--redis", url + "/0",
            "--registry", self.registry_url, "--event-loop", "asyncio",
            "--twin-cache-ttl", str(float(self.cfg.get("twin_cache_ttl", 5.0))),
            "--log", str(self.logdir / f"rmb-relay-{relay}.jsonl")]), self.logdir)
        self.plan.node(relay, domain, "rmb-relay")

    def _peer(self, twin: str, relays: list[str]) -> None:
        """The twin's rmb-peer daemon (not started) connected to `relays` in that order; at
        start it publishes these relays as its twin's record (rmb-peer without --no-update)."""
        from deploy.launcher import seed_for
        net = self.net
        argv = [script("rmb-peer"), "--seed", seed_for(twin), "--key-type", "sr25519",
                "--twin", str(self.twin_ids[twin]), "--redis", self.redis_url[twin], "--registry", self.registry_url,
                "--status-listen", f"{net.address(twin)}:0", "--event-loop", "asyncio",
                "--data-dir", str(self.workdir / f"peer-{twin}"),
                "--log", str(self.logdir / f"rmb-peer-{twin}.jsonl")]
        for r in relays:
            argv += ["--relay", f"ws://{self.domains[r]}"]
        self.daemons[twin] = Daemon(f"rmb-peer-{twin}", net.exec_argv(twin, argv), self.logdir)
        self.relays_of[twin] = list(relays)

    async def rotate_relay(self, old: str, new: str) -> list[str]:
        """Rotating nodes: relay `old` is stopped (SIGTERM) for good, a new relay `new` (its own
        namespace, address and Redis) starts, and every twin that used `old` restarts its
        peer (same identity, same data directory) with `new` in its place, which publishes
        the new relay list in the registry. Returns the twins moved."""
        await self.daemons[old].stop(self.grace)
        self.retired.append(old)
        await self._relay(new)
        await self.daemons[new].start(self.timeout)
        moved = [t for t, rs in self.relays_of.items() if old in rs]
        for twin in moved:
            await self.daemons[twin].stop(self.grace)
            self._peer(twin, [new if r == old else r for r in self.relays_of[twin]])
        await asyncio.gather(*(self.daemons[t].start(self.timeout) for t in moved))
        return moved

    def app_log(self, app: str, twin: str):
        """An app's own event log (rmb.app.*, as the main job's apps write them): service =
        the app's name, node = its twin id; the report's RMB round trip reads it."""
        from daemon_runtime.eventlog import EventLog
        from rmb_peer.events import RMB_EVENTS
        log = EventLog(app, str(self.twin_ids[twin]), [RMB_EVENTS],
                       sink=str(self.logdir / f"app-{app}-{twin}.jsonl"))
        self.app_logs.append(log)
        return log

    def all_daemons(self) -> list[Daemon]:
        return list(self.daemons.values()) + list(self.redis.values())

    async def drive(self) -> None:
        from rmb_peer.client import RmbClient
        from rmb_peer.envelope import new_uid
        self.state = "sending"
        n, ttl, gap = int(self.cfg["requests"]), int(self.cfg["ttl"]), float(self.cfg["interval"])
        client = RmbClient(self.redis_url["alice"], name="testnet-app", log=self.app_log("testnet-app", "alice"))
        ids = {self.twin_ids[t]: t for t in ("bob", "carol")}

        async def one(i: int, dst: str) -> None:
            """One request to one twin (one call each, so the round trip is per destination)."""
            payload = f"testnet request {i} to {dst} ".encode() * 8
            t0 = time.monotonic()
            self.sent_at[(str(i), dst)] = time.time()
            replies = await client.call([self.twin_ids[dst]], "testnet.echo", payload, ttl=ttl, ref=new_uid())
            for rep in replies[:1]:
                if rep.code is None:
                    ok = rep.data == payload
                    self.outcomes[(str(i), dst)] = "answered" if ok else "mismatched"
                    if ok:
                        self.rtt[dst].append((time.monotonic() - t0) * 1e3)
                else:
                    self.outcomes[(str(i), dst)] = "expired" if rep.code == 102 else f"errored {rep.code}"
            self.outcomes.setdefault((str(i), dst), "missing")

        try:
            tasks = []
            for i in range(n):
                for dst in ids.values():
                    tasks.append(asyncio.ensure_future(one(i, dst)))
                await asyncio.sleep(gap)
            await asyncio.gather(*tasks)
        finally:
            await client.close()
        self.state = "done"

    def progress(self) -> str:
        return f"rmb: {self.state}, {len(self.outcomes)} outcomes"

    async def stop(self) -> None:
        self.stop_apps.set()
        await asyncio.gather(*self.app_tasks, return_exceptions=True)
        order = [self.daemons[k] for k in ("alice", "bob", "carol", "relay1", "relay2", "relay3", "registry")
                 if k in self.daemons]
        await asyncio.gather(*(d.stop(self.grace) for d in order if d.proc is not None), return_exceptions=True)
        await asyncio.gather(*(d.stop(5) for d in self.redis.values()), return_exceptions=True)
        for log in self.app_logs:
            log.close()

    def counts(self) -> dict:
        c: dict[str, int] = {}
        for o in self.outcomes.values():
            c[o] = c.get(o, 0) + 1
        return c


# --------------------------------------------------------------------------- the job


def job_nodes(protocols: list[str], cfg: dict = DEFAULTS) -> list[str]:
    names = []
    if "rmb" in protocols:
        names += RMB_NODES
    if "remp" in protocols:
        names += remp_labels(cfg["remp"])
    if "marlin" in protocols:
        names += marlin_names(cfg["marlin"])
    return names


def _window(plan: Plan, fault: str, targets: list[str], duration: float) -> None:
    for target in targets:
        plan.fault(fault, target, duration)


def _healed(plan: Plan, fault: str, targets: list[str], recovery: bool = True,
            later_for: dict[str, float] | None = None) -> None:
    """Close the fault's planned window; after a heal the window stays open for the nodes'
    TCP retransmission ceiling (deploy.testnet.RTO_MAX_MS), the longest a connection that
    backed off during the cut waits before it resumes; a target in `later_for` (name -> unix
    s) stays planned until that time if it is later. Runs in the background."""
    async def close(target_list: list[str], until: float | None):
        if recovery:
            await asyncio.sleep(RTO_MAX_MS / 1e3)
        if until is not None:
            await asyncio.sleep(max(0.0, until - time.time()))
        for target in target_list:
            plan.recovered(fault, target)
    later_for = later_for or {}
    _PENDING.append(asyncio.ensure_future(close([t for t in targets if t not in later_for], None)))
    for target, until in later_for.items():
        if target in targets:
            _PENDING.append(asyncio.ensure_future(close([target], until)))


#: when a SYN is retransmitted, s after the connection attempt began (Linux: initial RTO
#: 1 s, doubling; all within CONNECT_TIMEOUT)
SYN_RETRIES_S = (0.0, 1.0, 3.0, 7.0)


def peer_reconnected_by(cut_at: float, healed: float | None = None) -> float:
    """When a twin's rmb-peer has replaced a relay connection that a cut silenced at `cut_at`
    (unix s), healed at `healed`: the peer pings a relay silent for its ping interval and
    declares it dead when no pong came its ping timeout later (DEAD_AFTER s after the last
    frame, at most `cut_at`), then reconnects BACKOFF_MIN s later (rmb_peer.core; DESIGN.md
    section 3, keepalive); the relay's close of its side need not reach the peer. A cut
    still in place then (longer than DEAD_AFTER) blackholes the reconnect attempts: each
    hangs CONNECT_TIMEOUT s (its SYNs at SYN_RETRIES_S) and the next waits the doubling
    backoff, so the peer is back at the first SYN sent at or after the heal."""
    dead = cut_at + DEAD_AFTER
    if healed is None or healed <= dead + BACKOFF_MIN:
        return dead + BACKOFF_MIN
    start, backoff = dead + BACKOFF_MIN, BACKOFF_MIN * 2
    while True:
        for syn in SYN_RETRIES_S:
            if start + syn >= healed:
                return start + syn
        start += CONNECT_TIMEOUT + backoff
        backoff = min(backoff * 2, BACKOFF_MAX)


_PENDING: list = []


async def _partition(net: Testnet, plan: Plan, region: str | None, at: float, duration: float,
                     log: list) -> None:
    if region is None or duration <= 0:
        return
    await asyncio.sleep(at)
    # the region, then every node in it: the report's planned-fault rule matches node labels
    cut = [region] + [n.name for n in net.nodes.values() if n.region == region]
    _window(plan, "region_partition", cut, duration)
    await asyncio.to_thread(net.partition, region)
    log.append({"fault": "region_partition", "target": region, "at": time.time(), "duration_s": duration,
                "planned_for": cut})
    print(f"testnet: region {region} partitioned for {duration:.0f} s", flush=True)
    await asyncio.sleep(duration)
    await asyncio.to_thread(net.heal, region)
    log[-1]["healed"] = time.time()
    # a twin in the cut region keeps its planned window until its peer has replaced the
    # relay connections the cut silenced (traffic to it before then meets the cut's effect)
    peers_back = peer_reconnected_by(log[-1]["at"], log[-1]["healed"])
    log[-1]["peers_back"] = peers_back
    _healed(plan, "region_partition", cut,
            later_for={t: peers_back for t in cut if t in TWINS})
    print(f"testnet: region {region} healed", flush=True)


async def _asymmetric(net: Testnet, plan: Plan, spec: dict, log: list) -> None:
    """One inter-region path capped in one direction only (the reverse keeps the topology's
    bandwidth); planned for the receiving region's nodes."""
    regions = list(net.topo.regions)
    if len(regions) < 2 or float(spec.get("for", 0)) <= 0:
        return
    src, dst = spec.get("from", regions[0]), spec.get("to", regions[1])
    bits, duration = int(float(spec.get("mbit", 5)) * 1e6), float(spec["for"])
    await asyncio.sleep(float(spec.get("at", 0)))
    hit = [f"{src}->{dst}"] + [n.name for n in net.nodes.values() if n.region == dst]
    _window(plan, "asymmetric_link", hit, duration)
    await asyncio.to_thread(net.cap, src, dst, bits)
    back = net.topo.paths[(dst, src)].bandwidth
    log.append({"fault": "asymmetric_link", "target": f"{src}->{dst}", "at": time.time(), "duration_s": duration,
                "mbit": bits / 1e6, "reverse_mbit": back / 1e6, "planned_for": hit})
    print(f"testnet: path {src} -> {dst} capped at {bits / 1e6:g} Mbit/s ({dst} -> {src} stays "
          f"{back / 1e6:g}) for {duration:.0f} s", flush=True)
    await asyncio.sleep(duration)
    await asyncio.to_thread(net.heal, None, None, (src, dst))
    log[-1]["healed"] = time.time()
    _healed(plan, "asymmetric_link", hit)
    print(f"testnet: path {src} -> {dst} back to {net.topo.paths[(src, dst)].bandwidth / 1e6:g} Mbit/s", flush=True)


async def _relay_unreachable(net: Testnet, plan: Plan, rmb: "NsRmb", spec: dict, log: list) -> None:
    """A relay's host unreachable (its bridge port down, the daemon still running) while the
    twins that list another relay too keep receiving through it. Planned for the relay and
    for every twin whose first relay it is (its peer sends through its first live relay)."""
    relay, duration = str(spec.get("relay", "relay2")), float(spec.get("for", 0))
    if duration <= 0 or relay not in rmb.daemons:
        return
    await asyncio.sleep(float(spec.get("at", 0)))
    hit = [relay] + [t for t, rs in rmb.relays_of.items() if rs and rs[0] == relay]
    _window(plan, "relay_unreachable", hit, duration)
    await asyncio.to_thread(net.isolate, relay)
    others = {t: [r for r in rs if r != relay] for t, rs in rmb.relays_of.items() if relay in rs}
    log.append({"fault": "relay_unreachable", "target": relay, "at": time.time(), "duration_s": duration,
                "planned_for": hit, "other_relays": others})
    print(f"testnet: relay {relay}'s host unreachable for {duration:.0f} s "
          f"(twins on it: {', '.join(f'{t} (also {rs})' if rs else t for t, rs in others.items())})", flush=True)
    await asyncio.sleep(duration)
    await asyncio.to_thread(net.heal, None, relay)
    log[-1]["healed"] = time.time()
    _healed(plan, "relay_unreachable", hit)
    print(f"testnet: relay {relay} reachable again", flush=True)


async def _relay_rotation(plan: Plan, rmb: "NsRmb", spec: dict, log: list) -> None:
    """Rotating nodes (RMB): relay `relay` leaves for good and relay `new` joins (module doc)."""
    old, new = str(spec.get("relay", "relay2")), str(spec.get("new", "relay3"))
    if spec.get("at") is None or old not in rmb.daemons or new not in rmb.net.nodes:
        return
    await asyncio.sleep(float(spec["at"]))
    window = float(spec.get("window", 10.0))
    hit = [old, new] + [t for t, rs in rmb.relays_of.items() if old in rs]
    _window(plan, "relay_rotation", hit, window)
    t0 = time.time()
    print(f"testnet: relay {old} stopped, relay {new} joining", flush=True)
    moved = await rmb.rotate_relay(old, new)
    log.append({"fault": "relay_rotation", "target": old, "new": new, "at": t0, "duration_s": window,
                "moved": moved, "planned_for": hit, "took_s": time.time() - t0})
    print(f"testnet: relay {new} serves {', '.join(moved)} ({time.time() - t0:.1f} s)", flush=True)
    await asyncio.sleep(max(0.0, window - (time.time() - t0)))
    _healed(plan, "relay_rotation", hit, recovery=False)


def _fault_tasks(net: Testnet, plan: Plan, cfg: dict, segs: dict, log: list) -> list:
    """The planned faults (cfg["faults"], times in s after traffic starts) as coroutines."""
    f = cfg.get("faults") or {}
    regions = list(net.topo.regions)
    out = [_partition(net, plan, regions[-1] if len(regions) > 1 else None, float(cfg["partition_at"]),
                      float(cfg["partition_s"]), log)]
    if f.get("asymmetric"):
        out.append(_asymmetric(net, plan, f["asymmetric"], log))
    if "rmb" in segs and f.get("relay_unreachable"):
        out.append(_relay_unreachable(net, plan, segs["rmb"], f["relay_unreachable"], log))
    if "rmb" in segs and f.get("relay_rotation"):
        out.append(_relay_rotation(plan, segs["rmb"], f["relay_rotation"], log))
    return out


async def run_async(topo: Topology, protocols: list[str], workdir: Path, cfg: dict) -> dict:
    """Build the testnet, run the protocols with the partition, tear everything down.
    Returns the result dict (module doc); raises TestnetError / LaunchError."""
    unknown = set(protocols) - {"remp", "marlin", "rmb"}
    if unknown or not protocols:
        raise TestnetError(f"--job: unknown protocols {sorted(unknown)} (choose from remp, marlin, rmb)")
    workdir = Path(workdir)
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    net = Testnet(topo, job_nodes(protocols, cfg))
    await asyncio.to_thread(net.up)
    plan = Plan(workdir / "logs")
    timeout, grace = float(cfg["start_timeout"]), float(cfg["grace"])
    segs: dict = {}
    result: dict = {"topology": net.describe(), "protocols": protocols, "faults": []}
    try:
        if "rmb" in protocols:
            segs["rmb"] = NsRmb(net, cfg["rmb"], workdir, plan, timeout, grace)
        if "remp" in protocols:
            segs["remp"] = _make_remp_segment(net, dict(cfg["remp"]), workdir, plan, timeout, grace)
        if "marlin" in protocols:
            segs["marlin"] = _make_marlin_segment(net, dict(cfg["marlin"]), workdir, plan, timeout, grace)
        for name, s in segs.items():
            print(f"testnet: starting {name}", flush=True)
            await s.start()
        t0 = time.monotonic()
        await asyncio.gather(*_fault_tasks(net, plan, cfg, segs, result["faults"]),
                             *(s.drive() for s in segs.values()))
        await asyncio.gather(*_PENDING)
        _PENDING.clear()
        result["drive_s"] = time.monotonic() - t0
    finally:
        for s in segs.values():
            try:
                await s.stop()
            except Exception as exc:    # noqa: BLE001 - tear-down goes on
                print(f"testnet: stopping {type(s).__name__}: {exc}", flush=True)
        for task in _PENDING:
            task.cancel()
        _PENDING.clear()
        plan.close()
        await asyncio.to_thread(net.down)
    from deploy.testnet import _lock_holder, leftovers
    # a testnet started by someone else once this one released the lock is theirs
    result["leftovers"] = leftovers() if not _lock_holder() else []
    if "remp" in segs:
        s = segs["remp"]
        result["remp"] = {"counts": s.counters(), "figures": remp_figures(s)}
    if "marlin" in segs:
        s = segs["marlin"]
        result["marlin"] = {"counts": s.counters(), "refused": s.refused, "figures": marlin_figures(s)}
    if "rmb" in segs:
        s = segs["rmb"]
        result["rmb"] = {"counts": s.counts(), "round_trip": {k: _stats(v) for k, v in s.rtt.items()},
                         "requests": int(cfg["rmb"]["requests"]), "destinations": 2}
        result["rmb"].update(_rmb_fault_outcomes(s, result["faults"]))
        result["rmb"]["expired"] = rmb_expiries(s.outcomes, s.sent_at, float(cfg["rmb"]["ttl"]),
                                                result["faults"])
    result["verdict"] = verdict(result)
    return result


def _rmb_fault_outcomes(rmb: "NsRmb", faults: list) -> dict:
    """What happened to the RMB requests sent during the relay faults: to the twins that
    list another relay while one was unreachable; to the moved twins after the new relay
    joined (sent once their peers were back)."""
    out = {}
    for f in faults:
        if f["fault"] == "relay_unreachable":
            twins = [t for t, rs in f["other_relays"].items() if rs]
            inside = [k for k, at in rmb.sent_at.items() if k[1] in twins and f["at"] <= at <= f["healed"]]
            out["other_relay"] = {"relay": f["target"], "twins": twins, "sent": len(inside),
                                  "answered": sum(1 for k in inside if rmb.outcomes.get(k) == "answered"),
                                  "outcomes": {k[0] + "->" + k[1]: rmb.outcomes.get(k) for k in inside}}
        elif f["fault"] == "relay_rotation":
            # once the peers are back and the senders' relay has dropped its cached record
            since = f["at"] + f["took_s"] + float(rmb.cfg.get("twin_cache_ttl", 5.0))
            after = [k for k, at in rmb.sent_at.items() if k[1] in f["moved"] and at >= since]
            out["rotation"] = {"old": f["target"], "new": f["new"], "moved": f["moved"], "sent_after": len(after),
                               "answered_after": sum(1 for k in after if rmb.outcomes.get(k) == "answered")}
    return out


def fault_windows(faults: list) -> list[tuple[str, float, float, set]]:
    """(fault, start, end, nodes it is planned for) per fault of the job's log (unix s): a
    window ends when its `demo.plan.recovered` is logged: the heal + the TCP retransmission
    ceiling (RTO_MAX_MS), or for the relay rotation at the end of its window."""
    out = []
    for f in faults:
        if f["fault"] == "relay_rotation":
            end = f["at"] + max(float(f["duration_s"]), float(f.get("took_s", 0.0)))
        else:
            end = f.get("healed", f["at"] + float(f["duration_s"])) + RTO_MAX_MS / 1e3
            end = max(end, float(f.get("peers_back", 0.0)))
        out.append((f["fault"], f["at"], end, set(f.get("planned_for") or [])))
    return out


def rmb_expiries(outcomes: dict, sent_at: dict, ttl: float, faults: list) -> dict:
    """Which expired RMB requests a planned fault explains. A request (i, destination twin)
    sent at s lived until s + ttl; it is `inside` when that span overlaps the window of a
    fault planned for its destination (fault_windows), counted under the one in force when
    it was sent (the latest to start by then), or else the first to start after; else
    `outside`. An inside request `outlived` its fault when
    its deadline lay past that window's end: the fault and the recovery time it is granted
    were over while the request could still have been answered, so the fault alone does
    not explain it (only a request whose whole remaining life lay inside a window was
    necessarily lost to it). Returns {"expired", "inside", "outside", "outlived",
    "by_fault": {fault: n}, "outside_requests", "outlived_requests"} (request number,
    destination, s after the first request)."""
    windows = fault_windows(faults)
    t0 = min(sent_at.values(), default=0.0)
    by_fault: dict[str, int] = {}
    outside, outlived = [], []
    expired = [k for k, o in outcomes.items() if o == "expired"]
    for k in sorted(expired, key=lambda k: sent_at.get(k, 0.0)):
        s = sent_at.get(k)
        row = {"request": k[0], "dst": k[1], "sent_s": None if s is None else round(s - t0, 1)}
        hits = [] if s is None else [(a, b, name) for name, a, b, nodes in windows
                                     if k[1] in nodes and s <= b and s + ttl >= a]
        if not hits:
            outside.append(row)
            continue
        before = [h for h in hits if h[0] <= s]      # (start, end, fault): by start
        _, end, name = max(before) if before else min(hits)
        by_fault[name] = by_fault.get(name, 0) + 1
        if s + ttl > end:
            outlived.append(dict(row, fault=name, past_end_s=round(s + ttl - end, 1)))
    return {"expired": len(expired), "inside": len(expired) - len(outside), "outside": len(outside),
            "outlived": len(outlived), "by_fault": by_fault, "outside_requests": outside,
            "outlived_requests": outlived}


def verdict(result: dict) -> dict:
    """{check: (ok, detail)}: every outcome accounted for (module doc)."""
    out = {}
    r = result.get("remp")
    if r:
        c = r["counts"]
        out["remp.every_message_final"] = (c.get("none", 0) == 0 and c.get("messages", 0) > 0,
                                           f"none={c.get('none')} of {c.get('messages')} messages")
        out["remp.no_timeout"] = (c.get("timeout", 0) == 0, f"timeout={c.get('timeout')}")
        out["remp.rejections_as_planned"] = (c.get("rejected", 0) >= c.get("expected_rejections", 0),
                                             f"rejected={c.get('rejected')} expected>={c.get('expected_rejections')}")
    m = result.get("marlin")
    if m:
        c = m["counts"]
        out["marlin.every_block_rebuilt_or_disputed"] = (
            c.get("expected_rebuilt", -1) > 0 and c.get("accounted", c.get("rebuilt", 0)) >= c.get("expected_rebuilt", 0),
            f"rebuilt={c.get('rebuilt')} disputed={c.get('disputed', 0)} expected={c.get('expected_rebuilt')}")
        out["marlin.corrupted_disputed"] = (c.get("disputes", 0) >= 2, f"disputes={c.get('disputes')}")
        out["marlin.none_refused"] = (not m["refused"], f"refused={m['refused']}")
    b = result.get("rmb")
    if b:
        c = b["counts"]
        total = b["requests"] * b["destinations"]
        told = sum(v for k, v in c.items() if k == "answered" or k == "expired" or k.startswith("errored"))
        out["rmb.every_request_accounted"] = (told == total and not c.get("missing") and not c.get("mismatched"),
                                              f"{c} of {total}")
        e = b.get("expired")
        if e is not None:
            # an expiry a planned fault does not explain (sent outside every window, or
            # still answerable after its window ended) is a defect, not the fault's doing
            out["rmb.expiries_explained_by_faults"] = (
                e["outside"] == 0 and e["outlived"] == 0,
                f"{e['expired']} expired: {e['outside']} outside planned fault windows, "
                f"{e['outlived']} outlived their window")
    if b and b.get("other_relay"):
        o = b["other_relay"]
        out["rmb.other_relay_kept_receiving"] = (o["answered"] == o["sent"],
                                                 f"{o['answered']} of {o['sent']} requests to {o['twins']} "
                                                 f"answered while {o['relay']} was unreachable")
    if b and b.get("rotation"):
        r = b["rotation"]
        out["rmb.rotated_relay_serves"] = (r["answered_after"] > 0 and r["answered_after"] == r["sent_after"],
                                           f"{r['answered_after']} of {r['sent_after']} requests to {r['moved']} "
                                           f"answered after {r['new']} joined")
    out["no_leftovers"] = (not result.get("leftovers"), f"leftovers={result.get('leftovers')}")
    return out


def run_job(topo: Topology, protocols: list[str], workdir: Path, partition_s: float | None = None,
            cfg: dict | None = None) -> int:
    """CLI entry: run the job, print the figures, write WORKDIR/testnet.json; 0 when every
    verdict row is ok."""
    result = run_and_record(topo, protocols, workdir, partition_s, cfg)
    return 0 if all(ok for ok, _ in result["verdict"].values()) else 1


def run_and_record(topo: Topology, protocols: list[str], workdir: Path, partition_s: float | None = None,
                   cfg: dict | None = None) -> dict:
    """Run the job, write WORKDIR/testnet.json, print the figures; the result dict."""
    cfg = json.loads(json.dumps(cfg or DEFAULTS))
    if partition_s is not None:
        cfg["partition_s"] = partition_s
    result = asyncio.run(run_async(topo, protocols, Path(workdir), cfg))
    Path(workdir).mkdir(parents=True, exist_ok=True)
    (Path(workdir) / "testnet.json").write_text(json.dumps(result, indent=1, default=str))
    print(report(result), flush=True)
    return result


def report(result: dict) -> str:
    lines = [f"testnet job on topology {result['topology']['topology']}: link model = "
             f"{result['topology']['link_model']}"]
    for p in result["topology"]["paths"]:
        lines.append(f"  path {p['from']} -> {p['to']}: {p['one_way_ms']:g} ms one way +- {p['jitter_ms']:g}, "
                     f"loss {p['loss']:g}, {p['mbit']:g} Mbit/s")
    for f in result.get("faults", []):
        lines.append(f"  fault (planned): {f['fault']} {f['target']} for {f['duration_s']:g} s"
                     + (f", {f['mbit']:g} Mbit/s one way ({f['reverse_mbit']:g} back)" if "mbit" in f else "")
                     + (f", moved {', '.join(f['moved'])} to {f['new']}" if "moved" in f else ""))

    def fmt(s):
        return (f"p50 {s['p50_ms']:.0f} ms, p99 {s['p99_ms']:.0f} ms (n={s['n']})" if s and s.get("n") else "no data")
    if "remp" in result:
        f = result["remp"]["figures"]
        lines.append(f"REMP: first receipt {fmt(f['first_receipt'])}; Finalized {fmt(f['finalized'])}; "
                     f"counts {result['remp']['counts']}")
    if "marlin" in result:
        for c, s in result["marlin"]["figures"]["produce_to_rebuilt"].items():
            lines.append(f"Marlin produce -> rebuilt at {c}: {fmt(s)}")
        lb = result["marlin"]["figures"]["largest_block"]
        if lb["name"]:
            lines.append(f"Marlin largest block {lb['name']} ({lb['bytes']} B) produce -> rebuilt: "
                         + ", ".join(f"{c} {v:.0f} ms" for c, v in lb["ms"].items()))
        lines.append(f"Marlin counts {result['marlin']['counts']}")
    if "rmb" in result:
        for d, s in result["rmb"]["round_trip"].items():
            lines.append(f"RMB round trip alice -> {d}: {fmt(s)}")
        lines.append(f"RMB outcomes {result['rmb']['counts']}")
        e = result["rmb"].get("expired")
        if e:
            lines.append(f"RMB expired: {e['expired']}, {e['inside']} inside planned fault windows "
                         f"({', '.join(f'{k} {v}' for k, v in e['by_fault'].items()) or 'none'}), "
                         f"{e['outside']} outside"
                         + (" (" + ", ".join(f"#{r['request']}->{r['dst']} at {r['sent_s']} s"
                                             for r in e["outside_requests"][:10]) + ")" if e["outside"] else "")
                         + f"; {e['outlived']} of the inside ones outlived their window (TTL past its end)")
    for k, (ok, detail) in result["verdict"].items():
        lines.append(f"  {'ok  ' if ok else 'FAIL'} {k}: {detail}")
    return "\n".join(lines)
