"""relay-suite-testnet: a multi-host testnet on one Linux machine, from a topology file.

    python -m deploy.testnet [--topology lan|wan|thin|FILE] [--check | --job remp,marlin,rmb | --hold]
                             [--nodes a,b,...] [--workdir DIR]
    python -m deploy.testnet --cleanup     # remove what an interrupted run left behind
    (a console script `relay-suite-testnet = "deploy.testnet:main"` can be added to pyproject.toml)

Every node runs in its own network namespace with its own IPv4 address; nodes of a region
share one bridge, regions meet in one router namespace. Layout (objects named with the
prefix `rstn-`, which nothing else on the machine uses, so --cleanup touches only these):

    root ns ── rstn-ctl ═ ctl ── rstn-router (ip_forward) ── r<i> ═ uplink ── rstn-r-<region>: br0
                                                                         ├─ n<j> ═ eth0  rstn-n-<node>
                                                                         └─ ...

- A region namespace `rstn-r-<region>` holds the bridge `br0` (pure layer 2, no address).
- The router namespace `rstn-router` has one veth into each region's bridge carrying that
  region's gateway (the first host of its subnet) and forwards between regions.
- A node namespace `rstn-n-<node>` has `lo` and `eth0` (its address, default route via the
  region gateway); the other end `n<j>` is a port of the region bridge.
- The control link `rstn-ctl` (root ns, 198.19.255.253/30) to the router (198.19.255.254)
  lets this process reach the nodes' HTTP APIs; the root ns gets one route per region
  subnet through it and nothing else changes in the root ns.

Addresses and links come from the topology file (deploy/topologies/*.toml, format in
docs/testnet.md), inside 198.18.0.0/15 (RFC 2544 section C.2.2, the range for benchmark
networks). Bandwidth: `tbf` on both ends of every node link (its eth0 and its bridge port)
and an `htb` class per source region on each router interface (the inter-region path's cap).
Delay, jitter, loss and duplication: this kernel has no `netem`, so every daemon applies them
itself from the link model the testnet hands it (RELAY_SUITE_LINKS, daemon_runtime/linkmodel.py:
one rule per destination region, built from the topology). Partitions: blackhole policy
rules in the router namespace (`partition`, also one way), so the control link keeps
working; an unreachable host: its bridge port down (`isolate`); an asymmetric link: one
direction's htb class lowered (`cap`); `heal` undoes them (all, or one region / node / path).

Lifecycle: `Testnet.up()` creates everything (any failure removes what was made and raises
TestnetError), `down()` kills every process still inside its namespaces and deletes them;
the CLI does it on exit, on failure and on SIGINT/SIGTERM. One testnet at a time per machine
(a lock file; its addresses and root routes are fixed by the topology). Root is needed:
without it, or without `ip`/`tc`/network namespaces, it exits 2 saying so.
"""
from __future__ import annotations

import argparse
import fcntl
import fnmatch
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from daemon_runtime.linkmodel import ENV as LINKS_ENV, Link, format_spec

__all__ = ["Topology", "Testnet", "TestnetError", "load_topology", "cleanup", "unavailable",
           "PREFIX", "TOPOLOGIES"]

PREFIX = "rstn-"
ROUTER_NS = PREFIX + "router"
CTL_IF = PREFIX + "ctl"
CTL_ROOT = "198.19.255.253"
CTL_ROUTER = "198.19.255.254"
CTL_NET = ipaddress.ip_network("198.19.255.252/30")
BENCH_NET = ipaddress.ip_network("198.18.0.0/15")
TOPOLOGIES = Path(__file__).with_name("topologies")
#: TCP's retransmission timeout ceiling in every node (net.ipv4.tcp_rto_max_ms, ms): a
#: connection that backed off during a partition resumes at most this long after the heal
#: (the default ceiling, 120 s, would leave it silent for as long again as the cut lasted)
RTO_MAX_MS = 5000
LOCK_PATH = Path(os.environ.get("RELAY_SUITE_TESTNET_LOCK", "/run/relay-suite-testnet.lock"))


class TestnetError(RuntimeError):
    """The testnet cannot be built, used or removed; the message says what and why."""

    __test__ = False


# --------------------------------------------------------------------------- topology


def _rate_bits(text: str) -> int:
    """'100mbit' / '1gbit' / '10mbit' / '512kbit' -> bits per second."""
    t = str(text).strip().lower()
    for suffix, mult in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3), ("bit", 1)):
        if t.endswith(suffix):
            try:
                return int(float(t[: -len(suffix)]) * mult)
            except ValueError:
                break
    raise TestnetError(f"bandwidth {text!r} is not like '100mbit', '1gbit' or '512kbit'")


@dataclass(frozen=True)
class Region:
    name: str
    subnet: ipaddress.IPv4Network
    link: Link                    # between two nodes of the region (one way)
    bandwidth: int                # bits/s of each node link

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)


@dataclass(frozen=True)
class Path_:
    src: str
    dst: str
    link: Link
    bandwidth: int


@dataclass
class Topology:
    """A loaded topology file (docs/testnet.md): regions, directed inter-region paths,
    node placement (glob -> regions, round-robin), per-node bandwidth overrides (glob ->
    bits/s) and explicit nodes {name: (region, address or None)}."""

    name: str
    description: str
    seed: int
    regions: dict[str, Region]
    paths: dict[tuple[str, str], Path_]
    placement: list[tuple[str, list[str]]]
    edges: list[tuple[str, int]]
    nodes: dict[str, tuple[str, str | None]]
    example: list[str] = field(default_factory=list)

    def region_of(self, name: str, counters: dict[str, int]) -> str:
        if name in self.nodes:
            return self.nodes[name][0]
        for pattern, regions in self.placement:
            if fnmatch.fnmatchcase(name, pattern):
                i = counters.get(pattern, 0)
                counters[pattern] = i + 1
                return regions[i % len(regions)]
        raise TestnetError(f"topology {self.name}: no region for node {name!r} "
                           f"(add a [placement] pattern or a [[nodes]] entry)")

    def bandwidth_of(self, name: str, region: str) -> int:
        for pattern, bits in self.edges:
            if fnmatch.fnmatchcase(name, pattern):
                return bits
        return self.regions[region].bandwidth

    def link(self, src_region: str, dst_region: str) -> Link:
        """The one-way link model from a node of src_region to a node of dst_region."""
        if src_region == dst_region:
            return self.regions[src_region].link
        return self.paths[(src_region, dst_region)].link


def _link(d: dict, where: str) -> Link:
    try:
        return Link(delay=float(d.get("delay_ms", 0)) / 1e3, jitter=float(d.get("jitter_ms", 0)) / 1e3,
                    loss=float(d.get("loss", 0)), dup=float(d.get("dup", 0)),
                    reorder=float(d.get("reorder", 0)), reorder_delay=float(d.get("reorder_ms", 20)) / 1e3)
    except ValueError as exc:
        raise TestnetError(f"{where}: {exc}") from None


def load_topology(which: str | Path) -> Topology:
    """A topology by name (deploy/topologies/<name>.toml) or path. Raises TestnetError naming
    the file and the problem."""
    path = Path(which)
    if not path.suffix and not path.exists():
        path = TOPOLOGIES / f"{which}.toml"
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except OSError as exc:
        known = ", ".join(sorted(p.stem for p in TOPOLOGIES.glob("*.toml")))
        raise TestnetError(f"topology {which!r}: cannot read {path}: {exc.strerror} (known: {known})") from None
    except tomllib.TOMLDecodeError as exc:
        raise TestnetError(f"topology {path}: not valid TOML: {exc}") from None
    where = str(path)
    default_bw = _rate_bits(doc.get("bandwidth", "1gbit"))
    regions: dict[str, Region] = {}
    for r in doc.get("regions", []):
        name = str(r["name"])
        try:
            subnet = ipaddress.ip_network(r["subnet"])
        except (KeyError, ValueError) as exc:
            raise TestnetError(f"{where}: region {name}: bad subnet: {exc}") from None
        if not subnet.subnet_of(BENCH_NET) or subnet.overlaps(CTL_NET):
            raise TestnetError(f"{where}: region {name}: subnet {subnet} must lie inside {BENCH_NET} "
                               f"(RFC 2544) and outside the control link {CTL_NET}")
        for other in regions.values():
            if subnet.overlaps(other.subnet):
                raise TestnetError(f"{where}: regions {name} and {other.name} overlap")
        if len(name) > 8 or not name.isalnum():
            raise TestnetError(f"{where}: region name {name!r}: 1-8 letters or digits")
        regions[name] = Region(name, subnet, _link(r, f"{where}: region {name}"),
                               _rate_bits(r.get("bandwidth", default_bw)) if "bandwidth" in r else default_bw)
    if not regions:
        raise TestnetError(f"{where}: no [[regions]]")
    paths: dict[tuple[str, str], Path_] = {}
    for p in doc.get("paths", []):
        if "between" in p:
            pairs = [tuple(p["between"]), tuple(reversed(p["between"]))]
        else:
            pairs = [(p["from"], p["to"])]
        for a, b in pairs:
            if a not in regions or b not in regions or a == b:
                raise TestnetError(f"{where}: path {a} -> {b}: unknown or equal regions")
            paths[(a, b)] = Path_(a, b, _link(p, f"{where}: path {a} -> {b}"),
                                  _rate_bits(p.get("bandwidth", doc.get("bandwidth", "1gbit"))))
    for a in regions:
        for b in regions:
            if a != b and (a, b) not in paths:
                raise TestnetError(f"{where}: no [[paths]] entry from {a} to {b}")
    placement = [(str(k), [str(x) for x in (v if isinstance(v, list) else [v])])
                 for k, v in doc.get("placement", {}).items()]
    for pattern, rs in placement:
        bad = [x for x in rs if x not in regions]
        if bad:
            raise TestnetError(f"{where}: placement {pattern!r} names unknown regions {bad}")
    edges = [(str(e["match"]), _rate_bits(e["bandwidth"])) for e in doc.get("edges", [])]
    nodes = {}
    for n in doc.get("nodes", []):
        if n.get("region") not in regions:
            raise TestnetError(f"{where}: node {n.get('name')}: unknown region {n.get('region')!r}")
        nodes[str(n["name"])] = (str(n["region"]), n.get("address"))
    return Topology(str(doc.get("name", path.stem)), str(doc.get("description", "")), int(doc.get("seed", 1)),
                    regions, paths, placement, edges, nodes, [str(x) for x in doc.get("example", [])])


# --------------------------------------------------------------------------- commands


def unavailable() -> str | None:
    """Why a testnet cannot run here (not root, no ip/tc, no network namespaces), or None."""
    if os.name != "posix" or not sys.platform.startswith("linux"):
        return "the testnet needs Linux network namespaces"
    if os.geteuid() != 0:
        return ("the testnet needs root (it creates network namespaces, veth pairs, bridges and tc "
                "qdiscs): run it as root, e.g. `sudo .venv/bin/python -m deploy.testnet ...`")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the testnet needs `{tool}` (iproute2) on PATH"
    if not Path("/proc/self/ns/net").exists():
        return "this kernel has no network namespaces (/proc/self/ns/net is missing)"
    return None


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise TestnetError(f"`{' '.join(argv)}` failed ({proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()}")
    return proc


def _ours_ns() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0].startswith(PREFIX)]


def _kill_ns_procs(ns: str, sig: int = signal.SIGKILL) -> int:
    pids = [int(x) for x in _run(["ip", "netns", "pids", ns], check=False).stdout.split() if x.isdigit()]
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return len(pids)


def cleanup(verbose: bool = False) -> list[str]:
    """Kill every process inside a `rstn-` namespace, delete those namespaces and the root
    control link. Returns what it removed (names)."""
    removed = []
    names = _ours_ns()
    for ns in names:
        _kill_ns_procs(ns)
    if names:
        time.sleep(0.2)
    for ns in names:
        for _ in range(20):
            if not _kill_ns_procs(ns):
                break
            time.sleep(0.1)
        _run(["ip", "netns", "delete", ns], check=False)
        removed.append(ns)
    if _run(["ip", "link", "show", CTL_IF], check=False).returncode == 0:
        _run(["ip", "link", "delete", CTL_IF], check=False)
        removed.append(CTL_IF)
    if verbose:
        print(f"testnet cleanup: removed {', '.join(removed) or 'nothing (no rstn- objects)'}")
    return removed


def leftovers() -> list[str]:
    """Testnet objects present now: rstn- namespaces, the control link and any rstn- link
    in the root namespace."""
    out = _ours_ns()
    links = _run(["ip", "-o", "link", "show"], check=False).stdout
    for line in links.splitlines():
        parts = line.split(":", 2)
        if len(parts) > 1 and parts[1].strip().split("@")[0].startswith(PREFIX):
            out.append(parts[1].strip().split("@")[0])
    return out


# --------------------------------------------------------------------------- the testnet


@dataclass
class Node:
    name: str
    region: str
    address: str
    ns: str
    port_if: str                  # its port on the region bridge
    bandwidth: int


class Testnet:
    """Testnet(topology, node_names). up() builds it, down() removes it (idempotent); use as
    a context manager. exec_argv(node, argv) runs a command inside a node's namespace with
    its link model; url(node, port) the node's HTTP address; partition / isolate / cap
    change reachability and bandwidth (router policy rules, bridge port, htb class), heal
    undoes them."""

    __test__ = False

    def __init__(self, topology: Topology, names: list[str], *, lock_timeout: float = 900.0):
        self.topo = topology
        self.lock_timeout = lock_timeout
        self.nodes: dict[str, Node] = {}
        self._lock_fh = None
        self._up = False
        self._rules: set[tuple[str, str, str]] = set()
        self._isolated: set[str] = set()
        self._caps: dict[tuple[str, str], int] = {}
        counters: dict[str, int] = {}
        used: dict[str, set[str]] = {r: set() for r in topology.regions}
        for name, (region, addr) in topology.nodes.items():
            if addr:
                used[region].add(addr)
        next_host: dict[str, int] = {r: 10 for r in topology.regions}
        for i, name in enumerate(dict.fromkeys(names)):
            region = topology.region_of(name, counters)
            reg = topology.regions[region]
            addr = topology.nodes.get(name, (None, None))[1]
            if addr is None:
                while True:
                    cand = str(reg.subnet.network_address + next_host[region])
                    next_host[region] += 1
                    if cand not in used[region]:
                        break
                if ipaddress.ip_address(cand) not in reg.subnet or cand == str(reg.subnet.broadcast_address):
                    raise TestnetError(f"region {region}: subnet {reg.subnet} is full")
                addr = cand
            elif ipaddress.ip_address(addr) not in reg.subnet:
                raise TestnetError(f"node {name}: address {addr} outside region {region}'s {reg.subnet}")
            used[region].add(addr)
            safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
            self.nodes[name] = Node(name, region, addr, f"{PREFIX}n-{safe}", f"n{i}",
                                    topology.bandwidth_of(name, region))

    # -- queries ---------------------------------------------------------------------
    def region_ns(self, region: str) -> str:
        return f"{PREFIX}r-{region}"

    def address(self, name: str) -> str:
        return self.nodes[name].address

    def url(self, name: str, port: int, scheme: str = "http") -> str:
        return f"{scheme}://{self.nodes[name].address}:{port}"

    def link_spec(self, name: str) -> str:
        """The node's link model: one rule per destination region (its own included)."""
        src = self.nodes[name].region
        rules = [(str(r.subnet), self.topo.link(src, r.name)) for r in self.topo.regions.values()]
        return format_spec(rules, seed=self.topo.seed * 1000 + list(self.nodes).index(name))

    def exec_argv(self, name: str, argv: list[str], env: dict | None = None) -> list[str]:
        """argv run inside node `name`'s namespace with RELAY_SUITE_LINKS set to its model."""
        envs = [f"{LINKS_ENV}={self.link_spec(name)}"] + [f"{k}={v}" for k, v in (env or {}).items()]
        return ["ip", "netns", "exec", self.nodes[name].ns, "env", *envs, *argv]

    def rtt(self, a: str, b: str) -> float:
        """The modelled round trip a -> b -> a in seconds (delays only, no jitter)."""
        ra, rb = self.nodes[a].region, self.nodes[b].region
        return self.topo.link(ra, rb).delay + self.topo.link(rb, ra).delay

    def describe(self) -> dict:
        """Nodes, regions and links as a JSON-able dict (what the report shows as the link model)."""
        t = self.topo
        return {"topology": t.name, "description": t.description,
                "regions": {r.name: {"subnet": str(r.subnet), "one_way_ms": r.link.delay * 1e3,
                                     "jitter_ms": r.link.jitter * 1e3, "loss": r.link.loss,
                                     "node_link_mbit": r.bandwidth / 1e6} for r in t.regions.values()},
                "paths": [{"from": p.src, "to": p.dst, "one_way_ms": p.link.delay * 1e3,
                           "jitter_ms": p.link.jitter * 1e3, "loss": p.link.loss, "dup": p.link.dup,
                           "mbit": p.bandwidth / 1e6} for p in t.paths.values()],
                "nodes": {n.name: {"region": n.region, "address": n.address, "mbit": n.bandwidth / 1e6}
                          for n in self.nodes.values()},
                "link_model": "tbf/htb bandwidth in the kernel; delay, jitter, loss, duplication "
                              "in each daemon's transport adapter (RELAY_SUITE_LINKS)"}

    # -- building ----------------------------------------------------------------------
    def _lock(self) -> None:
        LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
        fh = open(LOCK_PATH, "a+")
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    fh.close()
                    raise TestnetError(f"another testnet holds {LOCK_PATH} (one testnet per machine: "
                                       f"its addresses and routes are fixed); waited {self.lock_timeout:.0f} s")
                time.sleep(0.5)
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._lock_fh = fh

    def _unlock(self) -> None:
        if self._lock_fh is not None:
            fcntl.flock(self._lock_fh, fcntl.LOCK_UN)
            self._lock_fh.close()
            self._lock_fh = None

    @staticmethod
    def _tbf(ns: str, dev: str, bits: int) -> list[str]:
        # burst: 4 ms at the rate (at least 64 KiB; rate / HZ is 4 ms at HZ=250); queue: 100 ms
        burst = max(65536, bits // 8 // 250)
        return ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf",
                "rate", f"{bits}bit", "burst", str(burst), "latency", "100ms"]

    def up(self) -> "Testnet":
        why = unavailable()
        if why:
            raise TestnetError(why)
        self._lock()
        try:
            if leftovers():
                print(f"testnet: removing leftovers of an earlier run: {', '.join(leftovers())}", file=sys.stderr)
                cleanup()
            self._up = True
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        t = self.topo
        run = _run
        run(["ip", "netns", "add", ROUTER_NS])
        run(["ip", "-n", ROUTER_NS, "link", "set", "lo", "up"])
        run(["ip", "netns", "exec", ROUTER_NS, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        # control link: this process -> router -> nodes
        run(["ip", "link", "add", CTL_IF, "type", "veth", "peer", "name", "ctl", "netns", ROUTER_NS])
        run(["ip", "addr", "add", f"{CTL_ROOT}/30", "dev", CTL_IF])
        run(["ip", "link", "set", CTL_IF, "up"])
        run(["ip", "-n", ROUTER_NS, "addr", "add", f"{CTL_ROUTER}/30", "dev", "ctl"])
        run(["ip", "-n", ROUTER_NS, "link", "set", "ctl", "up"])
        for i, reg in enumerate(t.regions.values()):
            rns = self.region_ns(reg.name)
            run(["ip", "netns", "add", rns])
            run(["ip", "-n", rns, "link", "set", "lo", "up"])
            run(["ip", "-n", rns, "link", "add", "br0", "type", "bridge"])
            run(["ip", "-n", rns, "link", "set", "br0", "up"])
            rif = f"r{i}"
            run(["ip", "-n", ROUTER_NS, "link", "add", rif, "type", "veth", "peer", "name", "uplink", "netns", rns])
            run(["ip", "-n", rns, "link", "set", "uplink", "master", "br0", "up"])
            run(["ip", "-n", ROUTER_NS, "addr", "add", f"{reg.gateway}/{reg.subnet.prefixlen}", "dev", rif])
            run(["ip", "-n", ROUTER_NS, "link", "set", rif, "up"])
            self._router_htb(rif, reg)
            run(["ip", "route", "replace", str(reg.subnet), "via", CTL_ROUTER, "dev", CTL_IF])
        for n in self.nodes.values():
            reg = t.regions[n.region]
            rns = self.region_ns(n.region)
            run(["ip", "netns", "add", n.ns])
            run(["ip", "-n", n.ns, "link", "set", "lo", "up"])
            run(["ip", "-n", n.ns, "link", "add", "eth0", "type", "veth", "peer", "name", n.port_if, "netns", rns])
            run(["ip", "-n", rns, "link", "set", n.port_if, "master", "br0", "up"])
            run(["ip", "-n", n.ns, "addr", "add", f"{n.address}/{reg.subnet.prefixlen}", "dev", "eth0"])
            run(["ip", "-n", n.ns, "link", "set", "eth0", "up"])
            run(["ip", "-n", n.ns, "route", "add", "default", "via", reg.gateway])
            # after a heal, TCP retransmits within RTO_MAX_MS instead of the default 120 s
            # backoff ceiling (kernels from 6.11; ignored where the sysctl does not exist)
            _run(["ip", "netns", "exec", n.ns, "sysctl", "-qw", f"net.ipv4.tcp_rto_max_ms={RTO_MAX_MS}"],
                 check=False)
            run(self._tbf(n.ns, "eth0", n.bandwidth))
            run(self._tbf(rns, n.port_if, n.bandwidth))

    def _router_htb(self, rif: str, reg: Region) -> None:
        """htb on the router's interface into `reg`: one class per source region at that
        path's bandwidth (filter on the source subnet), everything else (the control link)
        in an uncapped default class."""
        ns = ROUTER_NS
        _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", rif, "root", "handle", "1:", "htb",
              "default", "99"])
        _run(["ip", "netns", "exec", ns, "tc", "class", "add", "dev", rif, "parent", "1:", "classid", "1:99",
              "htb", "rate", "10gbit"])
        for j, src in enumerate(self.topo.regions.values()):
            if src.name == reg.name:
                continue
            p = self.topo.paths[(src.name, reg.name)]
            cid = f"1:{10 + j}"
            _run(["ip", "netns", "exec", ns, "tc", "class", "add", "dev", rif, "parent", "1:", "classid", cid,
                  "htb", "rate", f"{p.bandwidth}bit", "ceil", f"{p.bandwidth}bit"])
            _run(["ip", "netns", "exec", ns, "tc", "filter", "add", "dev", rif, "parent", "1:", "protocol", "ip",
                  "prio", "1", "u32", "match", "ip", "src", str(src.subnet), "flowid", cid])

    def down(self) -> list[str]:
        """Kill every process in this testnet's namespaces and delete them (and the control
        link with its routes). Idempotent. Returns what was removed."""
        removed: list[str] = []
        try:
            if self._up:
                removed = cleanup()
                self._up = False
        finally:
            self._unlock()
        return removed

    def __enter__(self) -> "Testnet":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # -- faults ------------------------------------------------------------------------
    def _rule(self, op: str, src: str, dst: str) -> None:
        _run(["ip", "-n", ROUTER_NS, "rule", op, "from", src, "to", dst, "blackhole", "priority", "100"],
             check=(op == "add"))

    def partition(self, region: str, one_way: str | None = None) -> None:
        """Cut `region` off from every other region (both directions; one_way="out" or "in"
        for one direction only: an asymmetric link). The control link is untouched."""
        sub = str(self.topo.regions[region].subnet)
        for other in self.topo.regions.values():
            if other.name == region:
                continue
            if one_way in (None, "out"):
                self._add(sub, str(other.subnet))
            if one_way in (None, "in"):
                self._add(str(other.subnet), sub)

    def isolate(self, node: str) -> None:
        """Make one node's host unreachable from everywhere (its own region and the control
        link included): its bridge port goes down, its processes keep running."""
        n = self.nodes[node]
        _run(["ip", "-n", self.region_ns(n.region), "link", "set", n.port_if, "down"])
        self._isolated.add(node)

    def _htb_class(self, src_region: str, dst_region: str) -> tuple[str, str]:
        """(router interface into dst_region, htb class id of traffic from src_region)."""
        names = list(self.topo.regions)
        return f"r{names.index(dst_region)}", f"1:{10 + names.index(src_region)}"

    def _set_path_rate(self, src_region: str, dst_region: str, bits: int) -> None:
        rif, cid = self._htb_class(src_region, dst_region)
        _run(["ip", "netns", "exec", ROUTER_NS, "tc", "class", "change", "dev", rif, "parent", "1:",
              "classid", cid, "htb", "rate", f"{bits}bit", "ceil", f"{bits}bit"])

    def cap(self, src_region: str, dst_region: str, bits: int) -> None:
        """Cap the inter-region path src_region -> dst_region at `bits` bits/s (its htb class
        on the router), the opposite direction unchanged: an asymmetric link. heal() puts
        the topology's bandwidth back. Raises TestnetError for equal or unknown regions."""
        if src_region == dst_region or (src_region, dst_region) not in self.topo.paths:
            raise TestnetError(f"cap: no inter-region path {src_region} -> {dst_region}")
        self._set_path_rate(src_region, dst_region, int(bits))
        self._caps[(src_region, dst_region)] = int(bits)

    def _add(self, src: str, dst: str) -> None:
        if (src, dst, "bh") not in self._rules:
            self._rule("add", src, dst)
            self._rules.add((src, dst, "bh"))

    def heal(self, region: str | None = None, node: str | None = None,
             path: tuple[str, str] | None = None) -> None:
        """Undo faults: with no argument every one (partition rules, isolated hosts, capped
        paths); else only `region`'s partition rules, `node`'s isolation or `path`'s cap."""
        everything = region is None and node is None and path is None
        for src, dst in list(self._caps):
            if everything or path == (src, dst):
                self._set_path_rate(src, dst, self.topo.paths[(src, dst)].bandwidth)
                del self._caps[(src, dst)]
        sub = str(self.topo.regions[region].subnet) if region else None
        for src, dst, tag in list(self._rules):
            if everything or sub in (src, dst):
                self._rule("del", src, dst)
                self._rules.discard((src, dst, tag))
        for name in list(self._isolated):
            if everything or name == node:
                n = self.nodes[name]
                _run(["ip", "-n", self.region_ns(n.region), "link", "set", n.port_if, "up"])
                self._isolated.discard(name)
        # a blackholed flow's cached route would outlive the rule
        _run(["ip", "-n", ROUTER_NS, "route", "flush", "cache"], check=False)

    # -- checks ------------------------------------------------------------------------
    def probe(self, pairs: list[tuple[str, str]] | None = None, timeout: float = 3.0) -> dict:
        """TCP connect + one echo from node a to node b through the kernel path (no link
        model), for every pair (default: every ordered pair). Returns {(a, b): seconds or
        None when it failed}. An echo server runs in each target node meanwhile (port 0)."""
        pairs = pairs if pairs is not None else [(a, b) for a in self.nodes for b in self.nodes if a != b]
        servers, ports = {}, {}
        try:
            for b in {b for _, b in pairs}:
                p = subprocess.Popen(["ip", "netns", "exec", self.nodes[b].ns, sys.executable, "-c", _ECHO_SERVER,
                                      self.nodes[b].address], stdout=subprocess.PIPE, text=True)
                servers[b] = p
            for b, p in servers.items():
                ports[b] = int(p.stdout.readline())
            out = {}
            for a, b in pairs:
                r = _run(["ip", "netns", "exec", self.nodes[a].ns, sys.executable, "-c", _ECHO_CLIENT,
                          self.nodes[b].address, str(ports[b]), str(timeout)], check=False)
                out[(a, b)] = float(r.stdout) if r.returncode == 0 and r.stdout.strip() else None
            return out
        finally:
            for p in servers.values():
                p.kill()
                p.wait()


    def throughput(self, a: str, b: str, nbytes: int = 8 << 20, timeout: float = 60.0) -> float | None:
        """Bits per second of one TCP transfer of `nbytes` from node a to node b through the
        kernel path (the tbf / htb caps, no link model); None when it failed."""
        srv = subprocess.Popen(["ip", "netns", "exec", self.nodes[b].ns, sys.executable, "-c", _SINK_SERVER,
                                self.nodes[b].address], stdout=subprocess.PIPE, text=True)
        try:
            port = int(srv.stdout.readline())
            r = _run(["ip", "netns", "exec", self.nodes[a].ns, sys.executable, "-c", _SINK_CLIENT,
                      self.nodes[b].address, str(port), str(nbytes), str(timeout)], check=False)
            return nbytes * 8 / float(r.stdout) if r.returncode == 0 and r.stdout.strip() else None
        finally:
            srv.kill()
            srv.wait()


_SINK_SERVER = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(4)
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    n = int.from_bytes(c.recv(8, socket.MSG_WAITALL), "big")
    while n > 0:
        d = c.recv(1 << 20)
        if not d:
            break
        n -= len(d)
    c.sendall(b"k"); c.close()
"""
_SINK_CLIENT = """
import socket, sys, time
n = int(sys.argv[3])
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[4]))
t = time.monotonic()
c.sendall(n.to_bytes(8, "big")); c.sendall(b"\\0" * n); assert c.recv(1) == b"k"
print(time.monotonic() - t)
"""
_ECHO_SERVER = """
import socket, sys, threading
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(64)
print(s.getsockname()[1], flush=True)
def serve(c):
    with c:
        while (d := c.recv(65536)):
            c.sendall(d)
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"""
_ECHO_CLIENT = """
import socket, sys, time
t = time.monotonic()
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
c.sendall(b"x"); assert c.recv(1) == b"x"
print(time.monotonic() - t)
"""


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m deploy.testnet",
        description="Build a multi-region testnet of network namespaces on this machine (root only) "
                    "from a topology file, run the suite's daemons in it, and remove it all on exit. "
                    "See docs/testnet.md.")
    p.add_argument("--topology", default="wan",
                   help="topology name in deploy/topologies (lan, wan, thin) or a TOML file (default wan)")
    p.add_argument("--nodes", default=None,
                   help="comma-separated node names for --check / --hold (default: the topology's example)")
    act = p.add_mutually_exclusive_group()
    act.add_argument("--cleanup", action="store_true",
                     help="remove every rstn- namespace, link and the processes inside them, then exit")
    act.add_argument("--check", action="store_true",
                     help="build the testnet, ping every node pair through the kernel path, print the "
                          "link table, remove it (the default action)")
    act.add_argument("--hold", action="store_true", help="build it and keep it until SIGINT / SIGTERM")
    act.add_argument("--job", metavar="PROTOCOLS", default=None,
                     help="run the testnet job (deploy/testnet_job.py) for these protocols: any of "
                          "remp,marlin,rmb (comma-separated), with a partition and a heal; prints "
                          "the measured figures and writes WORKDIR/testnet.json")
    p.add_argument("--workdir", default="out/testnet", help="run directory for --job (default out/testnet)")
    p.add_argument("--partition", type=float, default=None, metavar="S",
                   help="--job: seconds a region stays partitioned (default: the job's, 30)")
    return p


def _install_signals() -> None:
    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)


def guarded(prog: str, run, errors: tuple[type[BaseException], ...]):
    """run() for a command line: SIGINT/SIGTERM -> 130 ("interrupted; testnet removed"), one of
    `errors` -> 1 with its text on stderr, else run()'s value; afterwards the leftovers of a
    testnet nobody holds are removed."""
    try:
        return run()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; testnet removed", file=sys.stderr)
        return 130
    except errors as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    finally:
        if leftovers() and not _lock_holder():
            cleanup(verbose=True)


def _lock_holder() -> str | None:
    """The pid text in the lock file when another process holds the lock, else None."""
    try:
        fh = open(LOCK_PATH, "a+")
    except OSError:
        return None
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        return fh.read().strip() or "?"
    else:
        fcntl.flock(fh, fcntl.LOCK_UN)
        return None
    finally:
        fh.close()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    why = unavailable()
    if why:
        print(f"relay-suite-testnet: {why}", file=sys.stderr)
        return 2
    if args.cleanup:
        holder = _lock_holder()
        if holder:
            print(f"relay-suite-testnet: a testnet is running (pid {holder} holds {LOCK_PATH}); "
                  f"stop it (SIGINT) instead of --cleanup", file=sys.stderr)
            return 1
        cleanup(verbose=True)
        return 0
    try:
        topo = load_topology(args.topology)
    except TestnetError as exc:
        print(f"relay-suite-testnet: {exc}", file=sys.stderr)
        return 2
    _install_signals()
    if args.job:
        from daemon_runtime.daemons import LaunchError
        from deploy.testnet_job import run_job
        return guarded("relay-suite-testnet", lambda: run_job(
            topo, [x.strip() for x in args.job.split(",") if x.strip()], Path(args.workdir),
            partition_s=args.partition), (TestnetError, LaunchError))
    names = [x.strip() for x in args.nodes.split(",")] if args.nodes else (topo.example or ["a", "b"])
    try:
        with Testnet(topo, names) as net:
            print(json.dumps(net.describe(), indent=1))
            if args.hold:
                print("testnet up; SIGINT / SIGTERM removes it", file=sys.stderr)
                while True:
                    time.sleep(3600)
            res = net.probe()
            bad = [f"{a}->{b}" for (a, b), v in res.items() if v is None]
            ok = [v for v in res.values() if v is not None]
            print(f"kernel path (TCP connect + echo, no link model): {len(ok)} of {len(res)} node pairs answer"
                  + (f", slowest {max(ok) * 1e3:.1f} ms" if ok else "") + (f"; failed: {bad}" if bad else ""))
            names_ = list(net.nodes)
            if len(names_) >= 2:
                for a, b in ((names_[0], names_[1]), (names_[-1], names_[0])):
                    bps = net.throughput(a, b)
                    cap = min(net.nodes[a].bandwidth, net.nodes[b].bandwidth)
                    print(f"throughput {a} -> {b} (8 MiB over TCP): "
                          + (f"{bps / 1e6:.1f} Mbit/s" if bps else "failed") + f", node links capped at {cap / 1e6:g} Mbit/s")
            return 1 if bad else 0
    except KeyboardInterrupt:
        print("relay-suite-testnet: interrupted; testnet removed", file=sys.stderr)
        return 130
    except TestnetError as exc:
        print(f"relay-suite-testnet: {exc}", file=sys.stderr)
        return 1
    finally:
        left = leftovers()
        if left:
            print(f"relay-suite-testnet: left behind: {left}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
