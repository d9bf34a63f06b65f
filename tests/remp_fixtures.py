"""Shared helpers for the REMP integration tests: deterministic keys, real wallet
message BOCs (pytoniq-core via remp_node.core.state), and an RMQ harness that drives several
ReliableMessageQueue cores over the in-memory SimNetwork with a fake clock."""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from pytoniq_core import Cell, MessageAny
from pytoniq_core.tlb.transaction import ExternalMsgInfo

from remp_node.core.cache import MessageCache
from remp_node.wire.keys import NodeKey
from remp_node.wire.messages import parse_external_message
from remp_node.testnet.network import SimNetwork

#: fake clock origin: a Unix time (the wallet executor compares valid_until with it)
T0 = 1_700_000_000.0


def keys(n: int, tag: str) -> list[NodeKey]:
    return [NodeKey.from_seed(hashlib.sha256(f"{tag}:{i}".encode()).digest()) for i in range(n)]


def load_real_messages(shared_data: Path) -> list[dict]:
    path = shared_data / "ton" / "ext_messages.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def same_body_new_id(boc: bytes) -> bytes:
    """A message with the same body cell as `boc` but another header (import_fee 1), so
    another root hash (message id) and the same uid: the replay-by-body case."""
    root = Cell.one_from_boc(boc)
    msg = MessageAny.deserialize(root.begin_parse())
    info = ExternalMsgInfo(src=None, dest=msg.info.dest, import_fee=msg.info.import_fee + 1)
    return MessageAny(info=info, init=msg.init, body=msg.body).serialize().to_boc()


def catchain_factory(session_id, members, local, block_interval=0.05):
    from remp_node.core.catchain import Catchain
    return Catchain(session_id, members, local, block_interval=block_interval, sync_interval=0.3)


class RmqHarness:
    """N RMQ cores (one per member key) of one session over a SimNetwork."""

    def __init__(self, net: SimNetwork, now: float = T0):
        self.net = net
        self.now = now
        self.nodes: dict[bytes, object] = {}     # key id -> RMQ
        self.events: dict[bytes, list] = {}
        self.caches: dict[bytes, MessageCache] = {}

    def add(self, rmq) -> None:
        kid = rmq.local.key_id
        self.nodes[kid] = rmq
        self.events.setdefault(kid, [])

    def _flush(self) -> None:
        for kid, q in self.nodes.items():
            if kid in self.net.crashed:
                continue
            for dst, data in q.datagrams_to_send(self.now):
                self.net.send(kid, dst, data, self.now)
            while (ev := q.next_event()) is not None:
                self.events[kid].append(ev)

    def run(self, seconds: float, step: float = 0.01) -> None:
        end = self.now + seconds
        self._flush()
        while self.now < end:
            self.now = round(self.now + step, 6)
            for dst, src, data in self.net.deliver_due(self.now):
                q = self.nodes.get(dst)
                if q is not None:
                    q.receive_datagram(data, src, self.now)
            for kid, q in self.nodes.items():
                if kid in self.net.crashed:
                    continue
                t = q.get_timer()
                if t is not None and t <= self.now:
                    q.handle_timer(self.now)
            self._flush()


def parse(boc: bytes):
    return parse_external_message(boc)


# --- simulation scenarios -------------------------------------------------------------------

KIND_SEQUENCE = ["PutIntoQueue", "AcceptedByQueue", "IncludedIntoBlock", "IncludedIntoAcceptedBlock",
                 "Finalized"]


class WalletSet:
    """`n` wallets (deterministic keys) with `balance` each; builds signed transfers."""

    def __init__(self, n: int, tag: str, balance: int = 1000):
        from remp_node.core.state import wallet_address
        self.keys = keys(n, tag)
        self.balance = balance
        self.addresses = [wallet_address(k.public) for k in self.keys]
        self._nonce = 0

    def genesis(self) -> list[tuple[bytes, int]]:
        return [(k.public, self.balance) for k in self.keys]

    def transfer(self, i: int, amount: int, valid_until: int, *, dest: str | None = None,
                 sign_with=None) -> bytes:
        from remp_node.core.state import make_wallet_message
        self._nonce += 1
        key = sign_with or self.keys[i]
        return make_wallet_message(key, self.addresses[i], dest or self.addresses[i], amount, valid_until,
                                   nonce=self._nonce)


def full_sequences(receipts: list[dict], mid_hex: str) -> dict[str, list[str]]:
    """source_id -> kinds of that validator's receipts for one message, ordered by
    timestamp then by the position of the kind in the main sequence."""
    rank = {k: i for i, k in enumerate(KIND_SEQUENCE)}
    by_src: dict[str, list[tuple[int, int, str]]] = {}
    for r in receipts:
        if r["message_id"] == mid_hex:
            by_src.setdefault(r["source_id"], []).append((r["timestamp"], rank.get(r["kind"], 99), r["kind"]))
    return {s: [k for _, _, k in sorted(v)] for s, v in by_src.items()}


def has_main_sequence(kinds: list[str]) -> bool:
    """True iff `kinds` contains the five main-sequence kinds in order (others may interleave)."""
    it = iter(kinds)
    return all(any(k == want for k in it) for want in KIND_SEQUENCE)


def transfers(net, n: int, nonce0: int = 0) -> list[bytes]:
    """`n` signed wallet transfers (workchain 0) from the wallets of a LocalNet's network
    (`net.wallets()`), each to itself, valid for an hour; distinct by `nonce0 + i`."""
    from remp_node.core.state import make_wallet_message
    ws = [w for w in net.wallets() if w["workchain"] == 0]
    out = []
    for i in range(n):
        w = ws[i % len(ws)]
        k = NodeKey.from_seed(bytes.fromhex(w["seed"]))
        out.append(make_wallet_message(k, w["address"], w["address"], 1 + i, int(time.time()) + 3600,
                                       nonce=nonce0 + i))
    return out
