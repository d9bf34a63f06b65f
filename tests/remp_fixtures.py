"""Shared helpers for the REMP integration tests (REMP-D): deterministic keys, real wallet
message BOCs (pytoniq-core via remp_node.state), and an RMQ harness that drives several
ReliableMessageQueue cores over the in-memory SimNetwork with a fake clock."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pytoniq_core import Address, Cell, MessageAny
from pytoniq_core.tlb.transaction import ExternalMsgInfo

from remp_node.cache import MessageCache
from remp_node.keys import NodeKey
from remp_node.messages import parse_external_message
from remp_node.network import SimNetwork

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
    from remp_node.catchain import Catchain
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
