"""The network file: who is in a local Marlin network and where (DESIGN.md section 5).

`marlin-node init --dir D` writes `D/network.json` and one key file per node under
`D/keys/<name>.key` (the 32-byte secp256k1 secret as hex, mode 0600). Every daemon loads
the network file (`load_network`) into A's `Membership` and `Params`, and its own key with
`Network.load_key(name)`.

network.json (version 1):

    {"version": 1,
     "params": {Params.to_dict()},             # the seed's TBD constants (params.py)
     "nodes": [
       {"name": "producer", "role": "producer", "address": "0x<20 bytes>",
        "public_key": "0x<65 bytes>", "host": "127.0.0.1", "port": 7100,
        "key_file": "keys/producer.key"},
       {"name": "c1m1", "role": "member", "cluster": 10923, ...},
       {"name": "consumer1", "role": "consumer", ...}]}

Names: producers "producer", "producer2", ...; members "c<i>m<j>" (cluster i, member j,
1-based); consumers "consumer<k>". Cluster ids are spread evenly over the uint16 space
(seed "getClusterOptions" measures distance in id space). `host:port` is the node's
transport listener (LPF over TCP); relative key_file paths are relative to the network
file's directory.

Errors: NetfileError (a MarlinLocalError: our own file, not a peer's bytes) naming the
file and what is wrong; a key file readable by group or others is refused.
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from daemon_runtime.ports import free_ports

from .crypto import NodeKey, address_of
from .membership import Membership
from .params import Params
from .wire import MarlinLocalError

__all__ = ["NetfileError", "NodeEntry", "Network", "load_network", "write_network", "ROLES",
           "cluster_ids", "NETWORK_FILE"]

NETWORK_FILE = "network.json"
ROLES = ("producer", "member", "consumer")


class NetfileError(MarlinLocalError):
    """A missing, malformed or inconsistent network file or key file."""


@dataclass(frozen=True)
class NodeEntry:
    """One node of the network file (see the module docstring)."""
    name: str
    role: str
    address: bytes
    public_key: bytes
    host: str
    port: int
    key_file: str
    cluster: int | None = None

    @property
    def hex(self) -> str:
        return "0x" + self.address.hex()


@dataclass
class Network:
    """A loaded network file: `nodes` by name, `membership`, `params`, `path`."""
    path: Path
    nodes: dict[str, NodeEntry]
    params: Params
    membership: Membership = field(init=False)

    def __post_init__(self) -> None:
        prod = {n.address: n.public_key for n in self.nodes.values() if n.role == "producer"}
        mem = {n.address: n.public_key for n in self.nodes.values() if n.role == "member"}
        cons = {n.address: n.public_key for n in self.nodes.values() if n.role == "consumer"}
        clusters: dict[int, list[bytes]] = {}
        for n in self.nodes.values():
            if n.role == "member":
                clusters.setdefault(n.cluster, []).append(n.address)
        try:
            self.membership = Membership(producers=prod, clusters=clusters, members=mem, consumers=cons)
        except MarlinLocalError as exc:
            raise NetfileError(f"{self.path}: {exc}") from None

    def node(self, name: str) -> NodeEntry:
        try:
            return self.nodes[name]
        except KeyError:
            raise NetfileError(f"{self.path}: no node named {name!r} (known: "
                               f"{', '.join(sorted(self.nodes))})") from None

    def by_role(self, role: str) -> list[NodeEntry]:
        return [n for n in self.nodes.values() if n.role == role]

    def by_address(self, address: bytes) -> NodeEntry | None:
        for n in self.nodes.values():
            if n.address == address:
                return n
        return None

    def directory(self, exclude: bytes | None = None) -> dict[bytes, tuple[str, int]]:
        """{address: (host, port)} of every node but `exclude`."""
        return {n.address: (n.host, n.port) for n in self.nodes.values() if n.address != exclude}

    def load_key(self, name: str, key_file: str | None = None) -> NodeKey:
        """The node's NodeKey from its key file (or `key_file`). Raises NetfileError when
        the file is missing, readable by group/others, malformed, or does not match the
        node's address."""
        entry = self.node(name)
        path = Path(key_file or entry.key_file)
        if not path.is_absolute():
            path = self.path.parent / path
        try:
            mode = path.stat().st_mode
            text = path.read_text().strip()
        except OSError as exc:
            raise NetfileError(f"key file {path}: {exc}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise NetfileError(f"key file {path} is accessible by group/others (mode "
                               f"{stat.S_IMODE(mode):04o}); chmod 600 it")
        try:
            key = NodeKey.from_secret(bytes.fromhex(text.removeprefix("0x")))
        except (ValueError, MarlinLocalError) as exc:
            raise NetfileError(f"key file {path}: not a 32-byte hex secret ({exc})") from None
        if key.address != entry.address:
            raise NetfileError(f"key file {path} holds 0x{key.address.hex()}, not {name}'s {entry.hex}")
        return key


def _hex(value, what: str, size: int | None, path) -> bytes:
    try:
        raw = bytes.fromhex(str(value).removeprefix("0x"))
    except ValueError:
        raise NetfileError(f"{path}: {what} is not hex: {value!r}") from None
    if size is not None and len(raw) != size:
        raise NetfileError(f"{path}: {what} must be {size} bytes, got {len(raw)}")
    return raw


def load_network(path: str | os.PathLike) -> Network:
    """Reads a network file. Raises NetfileError."""
    path = Path(path)
    if path.is_dir():
        path = path / NETWORK_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise NetfileError(f"network file {path}: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != 1 or not isinstance(data.get("nodes"), list):
        raise NetfileError(f"{path}: not a version 1 network file")
    try:
        params = Params.from_dict(data.get("params") or {})
    except MarlinLocalError as exc:
        raise NetfileError(f"{path}: params: {exc}") from None
    nodes: dict[str, NodeEntry] = {}
    for i, raw in enumerate(data["nodes"]):
        where = f"{path}: nodes[{i}]"
        try:
            entry = NodeEntry(name=str(raw["name"]), role=str(raw["role"]),
                              address=_hex(raw["address"], "address", 20, where),
                              public_key=_hex(raw["public_key"], "public_key", 65, where),
                              host=str(raw["host"]), port=int(raw["port"]), key_file=str(raw["key_file"]),
                              cluster=None if raw.get("cluster") is None else int(raw["cluster"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise NetfileError(f"{where}: {exc!r}") from None
        if entry.role not in ROLES:
            raise NetfileError(f"{where}: role {entry.role!r} is not one of {ROLES}")
        if (entry.role == "member") != (entry.cluster is not None):
            raise NetfileError(f"{where}: members (and only members) have a cluster id")
        if not 0 < entry.port < 65536:
            raise NetfileError(f"{where}: port {entry.port} out of range")
        if address_of(entry.public_key) != entry.address:
            raise NetfileError(f"{where}: address does not match the public key")
        if entry.name in nodes:
            raise NetfileError(f"{where}: duplicate name {entry.name!r}")
        nodes[entry.name] = entry
    return Network(path=path, nodes=nodes, params=params)


def cluster_ids(n: int) -> list[int]:
    """n cluster ids spread evenly over the uint16 space, ascending."""
    return [int((i + 0.5) * 65536 / n) for i in range(n)]


def write_network(directory: str | os.PathLike, *, clusters: int = 3, members: int = 2, producers: int = 1,
                  consumers: int = 2, base_port: int = 0, host: str = "127.0.0.1",
                  params: Params | None = None, host_prefix: str | None = None) -> Network:
    """Creates keys and the network file in `directory` (see the module docstring).
    base_port 0 picks free ports now, below the ephemeral range (for tests; another process
    may still take one before the daemons start), else node i listens on base_port + i. host_prefix: each node's host is
    host_prefix + its name (one container per node) instead of `host`. Raises NetfileError when the
    directory already holds a network file."""
    d = Path(directory)
    if clusters < 1 or members < 1 or producers < 1 or consumers < 1:
        raise NetfileError("need at least one cluster, member, producer and consumer")
    if (d / NETWORK_FILE).exists():
        raise NetfileError(f"{d / NETWORK_FILE} exists; refusing to overwrite keys")
    (d / "keys").mkdir(parents=True, exist_ok=True)
    os.chmod(d / "keys", 0o700)
    names: list[tuple[str, str, int | None]] = []
    names += [("producer" if i == 0 else f"producer{i + 1}", "producer", None) for i in range(producers)]
    for ci, cid in enumerate(cluster_ids(clusters)):
        names += [(f"c{ci + 1}m{j + 1}", "member", cid) for j in range(members)]
    names += [(f"consumer{k + 1}", "consumer", None) for k in range(consumers)]
    total = len(names)
    if base_port:
        if base_port + total > 65535:
            raise NetfileError(f"--base-port {base_port} leaves no room for {total} nodes")
        ports = [base_port + i for i in range(total)]
    else:
        ports = free_ports(host, total)
    nodes = []
    for (name, role, cid), port in zip(names, ports):
        key = NodeKey.generate()
        rel = f"keys/{name}.key"
        fd = os.open(d / rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key.secret.hex() + "\n")
        entry = {"name": name, "role": role, "address": "0x" + key.address.hex(),
                 "public_key": "0x" + key.public_key.hex(),
                 "host": host_prefix + name if host_prefix else host, "port": port, "key_file": rel}
        if cid is not None:
            entry["cluster"] = cid
        nodes.append(entry)
    doc = {"version": 1, "params": (params or Params()).to_dict(), "nodes": nodes}
    tmp = d / (NETWORK_FILE + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(d / NETWORK_FILE)
    return load_network(d / NETWORK_FILE)
