"""A local REMP network on disk: what `remp-node init` writes and every daemon reads.

Layout of the network directory D (all JSON, UTF-8):

- ``D/network.json``: ``{"zerostate": ZeroStateConfig.to_dict(), "state": {...},
  "nodes": [...], "timing": {...}}``. ``state`` is the input of
  zero_state_from_config (workchain, shard_count, wallets [{public_key, balance}],
  open_accounts ['wc:hex64'], masterchain_accounts ['-1:hex64'] (accounts of workchain -1,
  processed by the masterchain validators)); ``nodes`` lists every node:
  ``{"label": "v1" | "fullnode1", "role": "validator" | "fullnode", "public_key": hex,
  "key_id": hex, "address": "127.0.0.1:port" (UDP), "http": "127.0.0.1:port" (metrics,
  health, and the full node's API), "key_file": "keys/v1.key"}``; ``timing``: the core
  knobs (rmq_block_interval, master_block_interval, shard_round_timeout,
  master_round_timeout, resend_interval; seconds).
- ``D/keys/<label>.key``: ``{"label", "role", "seed": 64 hex}`` (the ed25519 seed), mode
  0600, written through os.open(..., 0o600) so it is never world-readable, not even briefly.
- ``D/wallets.json`` (mode 0600): the demo's wallets ``[{"label", "seed", "address",
  "balance"}]`` so a driver can sign transfers (state.make_wallet_message).

Ports: ``base_port`` P gives validator i (1-based) UDP P+i-1 and HTTP P+1000+i-1, full node
j UDP P+500+j-1 and HTTP P+1500+j-1; ``base_port=0`` picks ports free now for UDP and TCP,
below the kernel's ephemeral range (daemon_runtime.ports.free_ports: outgoing connections
never take those; another explicit bind before the daemons start still could).

Time: ``genesis_time`` is Unix seconds (daemons run the cores on ``loop.time()`` plus
a fixed offset to Unix time, so every process agrees on master sessions). ``init`` sets it
to now + ``genesis_delay`` unless given.

Errors: NetFilesError (a ValueError) for a malformed or inconsistent network directory.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from daemon_runtime.ports import free_ports

from ..errors import RempRemoteError
from ..wire.keys import NodeKey
from ..core.schedule import ScheduleError, ValidatorInfo, ZeroStateConfig
from ..wire.shards import shard_prefixes
from ..core.state import ZeroState, wallet_address, zero_state_from_mapping

__all__ = ["NetFilesError", "NodeEntry", "Network", "init_network", "load_network", "load_key",
           "write_private_json", "DEFAULT_TIMING", "real_message_destinations", "zero_state_from_config"]


def real_message_destinations(path: str | Path) -> list[str]:
    """Distinct 'wc:hex64' destinations of an ext_messages.jsonl file, in file order."""
    seen: dict[str, None] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            seen.setdefault(json.loads(line)["dst"], None)
    return list(seen)


def zero_state_from_config(config: dict) -> ZeroState:
    """state.zero_state_from_mapping of a network's "state" config, with the destinations
    of the real messages in the file its optional "ext_messages" key names (e.g.
    "../shared/data/ton/ext_messages.jsonl") as open accounts. A missing or absent file is
    skipped (the real data is optional)."""
    path = config.get("ext_messages")
    dsts = real_message_destinations(path) if path and Path(path).is_file() else []
    return zero_state_from_mapping(config, dsts)

NETWORK_FILE = "network.json"
WALLETS_FILE = "wallets.json"
DEFAULT_TIMING = {"rmq_block_interval": 0.1, "master_block_interval": None,
                  "shard_round_timeout": 0.6, "master_round_timeout": 1.0, "resend_interval": 2.0}


class NetFilesError(RempRemoteError):
    """A malformed or inconsistent network directory or key file."""


def write_private_json(path: Path, obj) -> None:
    """Write JSON to `path` with mode 0600 from creation on (replaces an existing file)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


@dataclass(frozen=True)
class NodeEntry:
    """One node of the network file (see module doc)."""

    label: str
    role: str
    public_key: bytes
    address: str
    http: str
    key_file: str

    @property
    def key_id(self) -> bytes:
        from ..wire.keys import key_id
        return key_id(self.public_key)

    def to_dict(self) -> dict:
        return {"label": self.label, "role": self.role, "public_key": self.public_key.hex(),
                "key_id": self.key_id.hex(), "address": self.address, "http": self.http,
                "key_file": self.key_file}


@dataclass
class Network:
    """A loaded network directory: root, zerostate config, state config (dict), nodes,
    timing."""

    root: Path
    config: ZeroStateConfig
    state: dict
    nodes: list[NodeEntry]
    timing: dict = field(default_factory=dict)

    def zerostate(self) -> ZeroState:
        """A fresh ZeroState (every node builds its own copy)."""
        return zero_state_from_config(self.state)

    def node(self, label: str) -> NodeEntry:
        for n in self.nodes:
            if n.label == label:
                return n
        raise NetFilesError(f"no node labelled {label!r} in {self.root / NETWORK_FILE}")

    def by_key_id(self) -> dict[bytes, NodeEntry]:
        return {n.key_id: n for n in self.nodes}

    def validators(self) -> list[NodeEntry]:
        return [n for n in self.nodes if n.role == "validator"]

    def fullnodes(self) -> list[NodeEntry]:
        return [n for n in self.nodes if n.role == "fullnode"]

    def key_of(self, label: str) -> NodeKey:
        return load_key(self.root / self.node(label).key_file)

    def wallets(self) -> list[dict]:
        """The demo wallets (wallets.json): label, seed (hex), address, balance."""
        p = self.root / WALLETS_FILE
        return json.loads(p.read_text()) if p.is_file() else []


def load_key(path: str | Path) -> NodeKey:
    """NodeKey from a key file ({"seed": 64 hex, ...}). Raises NetFilesError."""
    try:
        d = json.loads(Path(path).read_text())
        return NodeKey.from_seed(bytes.fromhex(d["seed"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise NetFilesError(f"key file {path}: {type(exc).__name__}: {exc}") from None


def init_network(root: str | Path, *, shards: int = 2, validators_per_shard: int = 7,
                 masterchain_validators: int | None = None, fullnodes: int = 1,
                 mc_catchain_lifetime: float = 30.0, block_interval: float = 0.5,
                 base_port: int = 0, genesis_time: float | None = None, genesis_delay: float = 5.0,
                 wallets: int = 8, wallet_balance: int = 10**12, ext_messages: str | Path | None = None,
                 masterchain_wallets: int = 2, timing: dict | None = None, host: str = "127.0.0.1",
                 group_draw: str = "dealt") -> Network:
    """Write a network directory (module doc) and return it loaded.

    Validators: shards * validators_per_shard keys ("v1".."vN"); shard groups of
    validators_per_shard drawn from all of them each session (schedule.shard_groups; with
    group_draw "dealt", the default, the groups of one session are disjoint: each validator
    serves one shard; "independent" draws each shard's group on its own);
    masterchain validators: the first `masterchain_validators` (default: all). Accounts:
    `wallets` wallets of workchain 0 and `masterchain_wallets` of workchain -1 with
    `wallet_balance` each (seeds in wallets.json), plus an open account per destination
    of `ext_messages` (the real messages' accounts) when that file exists."""
    root = Path(root)
    (root / "keys").mkdir(parents=True, exist_ok=True)
    n_val = shards * validators_per_shard
    if n_val < 1 or fullnodes < 0:
        raise NetFilesError("need at least one validator")
    nodes: list[NodeEntry] = []
    vkeys: list[NodeKey] = []

    # base_port 0: distinct ports free now for UDP and TCP alike, below the kernel's
    # ephemeral range (daemon_runtime/ports.py: a bind(0) port raced with outgoing
    # connections and a validator failed to start with EADDRINUSE in CI)
    free = iter(free_ports(host, 2 * (n_val + fullnodes), (socket.SOCK_DGRAM, socket.SOCK_STREAM))
                if not base_port else ())

    def ports(i: int, udp_off: int, http_off: int) -> tuple[str, str]:
        if base_port:
            return f"{host}:{base_port + udp_off + i}", f"{host}:{base_port + http_off + i}"
        return f"{host}:{next(free)}", f"{host}:{next(free)}"

    for i in range(n_val):
        k = NodeKey.generate()
        vkeys.append(k)
        label = f"v{i + 1}"
        udp, http = ports(i, 0, 1000)
        kf = f"keys/{label}.key"
        write_private_json(root / kf, {"label": label, "role": "validator", "seed": k.seed().hex()})
        nodes.append(NodeEntry(label, "validator", k.public, udp, http, kf))
    for j in range(fullnodes):
        k = NodeKey.generate()
        label = f"fullnode{j + 1}"
        udp, http = ports(j, 500, 1500)
        kf = f"keys/{label}.key"
        write_private_json(root / kf, {"label": label, "role": "fullnode", "seed": k.seed().hex()})
        nodes.append(NodeEntry(label, "fullnode", k.public, udp, http, kf))
    mcv: str | list = "all"
    if masterchain_validators is not None and masterchain_validators < n_val:
        mcv = [k.public.hex() for k in vkeys[:max(1, masterchain_validators)]]
    if genesis_time is None:
        genesis_time = time.time() + genesis_delay
    try:
        cfg = ZeroStateConfig(
            workchain=0, shards=shard_prefixes(shards),
            validators=[ValidatorInfo(n.public_key, n.address) for n in nodes if n.role == "validator"],
            shard_group_size=validators_per_shard, masterchain_validators=mcv,
            mc_catchain_lifetime=mc_catchain_lifetime, block_interval=block_interval,
            genesis_time=genesis_time, group_draw=group_draw)
    except ScheduleError as exc:
        raise NetFilesError(str(exc)) from None
    wallet_rows = []
    for w in range(wallets + masterchain_wallets):
        wc = 0 if w < wallets else -1
        k = NodeKey.generate()
        wallet_rows.append({"label": f"w{w + 1}", "seed": k.seed().hex(), "public_key": k.public.hex(),
                            "workchain": wc, "address": wallet_address(k.public, wc), "balance": wallet_balance})
    opens: list[str] = []
    if ext_messages is not None and Path(ext_messages).is_file():
        opens = real_message_destinations(ext_messages)
    state = {"workchain": 0, "shard_count": shards,
             "wallets": [{"public_key": w["public_key"], "balance": w["balance"]}
                         for w in wallet_rows if w["workchain"] == 0],
             "masterchain_wallets": [{"public_key": w["public_key"], "balance": w["balance"]}
                                     for w in wallet_rows if w["workchain"] == -1],
             "open_accounts": opens}
    tm = dict(DEFAULT_TIMING)
    tm.update(timing or {})
    doc = {"zerostate": cfg.to_dict(), "state": state, "nodes": [n.to_dict() for n in nodes], "timing": tm}
    tmp = root / (NETWORK_FILE + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, root / NETWORK_FILE)
    write_private_json(root / WALLETS_FILE, wallet_rows)
    return load_network(root)


def load_network(root: str | Path) -> Network:
    """Read a network directory. Raises NetFilesError naming the file and the problem."""
    root = Path(root)
    path = root / NETWORK_FILE
    try:
        doc = json.loads(path.read_text())
        cfg = ZeroStateConfig.from_dict(doc["zerostate"])
        nodes = [NodeEntry(n["label"], n["role"], bytes.fromhex(n["public_key"]), n["address"], n["http"],
                           n["key_file"]) for n in doc["nodes"]]
        state = dict(doc["state"])
        timing = {**DEFAULT_TIMING, **doc.get("timing", {})}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise NetFilesError(f"{path}: {type(exc).__name__}: {exc}") from None
    for n in nodes:
        if n.role not in ("validator", "fullnode"):
            raise NetFilesError(f"{path}: node {n.label} has unknown role {n.role!r}")
    return Network(root, cfg, state, nodes, timing)
