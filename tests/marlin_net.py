"""In-memory Marlin network for core tests: producer, cluster members and consumer cores
wired over a fake link with a fake clock (DESIGN.md section 2: cores against each other,
loss, duplication, reordering). No sockets, no real time."""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from pathlib import Path

from marlin_cluster.cluster import ClusterMemberCore
from marlin_cluster.consumer import ConsumerCore
from marlin_cluster.crypto import NodeKey, keccak256
from marlin_cluster.membership import Membership
from marlin_cluster.params import Params
from marlin_cluster.producer import ProducerCore

T0 = 1_800_000_000.0
DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"


def key(name: str) -> NodeKey:
    return NodeKey.from_secret(keccak256(b"marlin-test:" + name.encode()))


@dataclass
class Link:
    """Delivery policy: latency uniform in [lo, hi] seconds (so frames reorder), loss and
    duplication probabilities, a deterministic drop filter drop(src, dst, frame) -> bool,
    and dead nodes (nothing to or from them)."""
    lo: float = 0.001
    hi: float = 0.020
    loss: float = 0.0
    dup: float = 0.0
    seed: int = 1
    drop: object = None
    dead: set = field(default_factory=set)

    def __post_init__(self):
        self.rng = random.Random(self.seed)

    def delays(self, src: bytes, dst: bytes, frame: bytes) -> list[float]:
        if src in self.dead or dst in self.dead:
            return []
        if self.drop is not None and self.drop(src, dst, frame):
            return []
        if self.rng.random() < self.loss:
            return []
        n = 2 if self.rng.random() < self.dup else 1
        return [self.rng.uniform(self.lo, self.hi) for _ in range(n)]


class Net:
    """Cores by address; run() steps the fake clock to the next delivery or timer."""

    def __init__(self, n_clusters: int = 3, members: int = 2, consumers: int = 2, *,
                 params: Params | None = None, link: Link | None = None, selector=None,
                 cluster_ids=None, producers: int = 1):
        self.params = params or Params()
        self.link = link or Link()
        self.now = T0
        self.producer_keys = [key(f"producer{i}") for i in range(producers)]
        cids = cluster_ids or [1000 + 20000 * i for i in range(n_clusters)]
        self.member_keys = {c: [key(f"member{c}.{j}") for j in range(members)] for c in cids}
        self.consumer_keys = [key(f"consumer{i}") for i in range(consumers)]
        self.outsider = key("outsider")
        self.membership = Membership(
            producers={k.address: k.public_key for k in self.producer_keys},
            clusters={c: [k.address for k in ks] for c, ks in self.member_keys.items()},
            members={k.address: k.public_key for ks in self.member_keys.values() for k in ks},
            consumers={k.address: k.public_key for k in self.consumer_keys})
        self.producers = [ProducerCore(k, self.membership, self.params, selector=selector)
                          for k in self.producer_keys]
        self.producer = self.producers[0]
        self.members = {k.address: ClusterMemberCore(k, self.membership, self.params, c)
                        for c, ks in self.member_keys.items() for k in ks}
        self.consumers = [ConsumerCore(k, self.membership, self.params) for k in self.consumer_keys]
        self.nodes = {p.address: p for p in self.producers}
        self.nodes.update(self.members)
        self.nodes.update({c.address: c for c in self.consumers})
        self.events: dict[bytes, list] = {a: [] for a in self.nodes}
        self._q: list = []
        self._seq = 0
        self.delivered = 0

    def _flush(self) -> None:
        for addr, core in self.nodes.items():
            for dst, frame in core.frames_to_send(self.now):
                for d in self.link.delays(addr, dst, frame):
                    self._seq += 1
                    heapq.heappush(self._q, (self.now + d, self._seq, addr, dst, frame))
            while (ev := core.next_event()) is not None:
                self.events[addr].append(ev)

    def inject(self, dst: bytes, frame: bytes, src: bytes) -> None:
        """Deliver a frame to `dst` now, as if from `src`."""
        self.nodes[dst].receive_frame(frame, src, self.now)
        self._flush()

    def run(self, duration: float, max_steps: int = 200_000) -> None:
        """Deliver and fire timers until `duration` seconds of fake time passed or nothing
        is left to do. Bounded by max_steps."""
        end = self.now + duration
        self._flush()
        for _ in range(max_steps):
            timers = [(t, a) for a, c in self.nodes.items()
                      if c.address not in self.link.dead and (t := c.get_timer()) is not None]
            t_timer = min(timers)[0] if timers else None
            t_frame = self._q[0][0] if self._q else None
            nxt = min(t for t in (t_timer, t_frame) if t is not None) if (t_timer or t_frame) else None
            if nxt is None or nxt > end:
                self.now = max(self.now, end) if nxt is not None else self.now
                return
            self.now = max(self.now, nxt)
            if t_frame is not None and t_frame <= self.now:
                _, _, src, dst, frame = heapq.heappop(self._q)
                if dst in self.nodes and dst not in self.link.dead:
                    self.nodes[dst].receive_frame(frame, src, self.now)
                    self.delivered += 1
            else:
                for t, a in timers:
                    if t <= self.now:
                        self.nodes[a].handle_timer(self.now)
            self._flush()
        raise AssertionError("network did not settle within max_steps")

    def of(self, addr: bytes, cls) -> list:
        return [e for e in self.events[addr] if isinstance(e, cls)]
