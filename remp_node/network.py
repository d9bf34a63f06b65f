"""An in-memory datagram network for driving REMP cores against each other with a fake clock.

No I/O, no real clock (DESIGN.md section 2: "Tests drive two or more cores against each other
in memory with a fake clock, including loss, reordering and duplication"). Addresses are node
key ids (32 bytes). Randomness comes from one seeded `random.Random`, so a run is reproducible.

Faults (all probabilities in [0, 1], applied per datagram):
- loss: the datagram is dropped;
- duplicate: a second copy is delivered (with its own delay);
- reorder: the datagram gets an extra delay of up to `reorder_delay` seconds, so later
  datagrams overtake it;
- crashed nodes: nothing is delivered to or from them;
- `drop_filter(src, dst, data, now) -> bool`: a targeted partition (True drops).
Delays: `latency` + uniform(0, `jitter`) seconds.
"""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["SimNetwork", "NetworkStats"]


@dataclass
class NetworkStats:
    """Counters in datagrams (and bytes for `bytes_sent`)."""

    sent: int = 0
    delivered: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    to_crashed: int = 0
    filtered: int = 0
    bytes_sent: int = 0
    by_kind: dict = field(default_factory=dict)


class SimNetwork:
    """send(src, dst, data, now) queues a datagram; deliver_due(now) pops the ones due.

    SimNetwork(seed=0, loss=0.0, duplicate=0.0, reorder=0.0, latency=0.005, jitter=0.005,
    reorder_delay=0.05, classify=None, part_payload=0). `classify(data) -> str` names a datagram's kind for
    `stats.by_kind` (counted at send time, before faults). part_payload (bytes, 0 = off): model
    the UDP transport's fragmentation (transport.py: 1,154 payload bytes per part, a payload is
    delivered only if ALL its parts arrive in one send, parts are never retransmitted): a
    datagram of n = ceil(len / part_payload) parts is lost with probability 1 - (1 - loss) ** n."""

    def __init__(self, seed: int = 0, *, loss: float = 0.0, duplicate: float = 0.0,
                 reorder: float = 0.0, latency: float = 0.005, jitter: float = 0.005,
                 reorder_delay: float = 0.05, classify: Callable[[bytes], str] | None = None,
                 part_payload: int = 0):
        for name, p in (("loss", loss), ("duplicate", duplicate), ("reorder", reorder)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} probability {p} not in [0, 1]")
        self.rng = random.Random(seed)
        self.loss, self.duplicate, self.reorder = loss, duplicate, reorder
        self.latency, self.jitter, self.reorder_delay = latency, jitter, reorder_delay
        self.classify = classify
        self.part_payload = int(part_payload)
        self.crashed: set[bytes] = set()
        self.drop_filter: Callable[[bytes, bytes, bytes, float], bool] | None = None
        self.stats = NetworkStats()
        self._queue: list[tuple[float, int, bytes, bytes, bytes]] = []
        self._seq = 0

    def _delay(self) -> float:
        d = self.latency + self.rng.uniform(0.0, self.jitter)
        if self.reorder and self.rng.random() < self.reorder:
            self.stats.reordered += 1
            d += self.rng.uniform(0.0, self.reorder_delay)
        return d

    def _push(self, at: float, src: bytes, dst: bytes, data: bytes) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at, self._seq, dst, src, data))

    def send(self, src: bytes, dst: bytes, data: bytes, now: float) -> None:
        st = self.stats
        st.sent += 1
        st.bytes_sent += len(data)
        if self.classify is not None:
            kind = self.classify(data)
            st.by_kind[kind] = st.by_kind.get(kind, 0) + 1
        if src in self.crashed or dst in self.crashed:
            st.to_crashed += 1
            return
        if self.drop_filter is not None and self.drop_filter(src, dst, data, now):
            st.filtered += 1
            return
        if self.loss:
            parts = -(-len(data) // self.part_payload) if self.part_payload > 0 else 1
            if any(self.rng.random() < self.loss for _ in range(max(1, parts))):
                st.lost += 1
                return
        self._push(now + self._delay(), src, dst, data)
        if self.duplicate and self.rng.random() < self.duplicate:
            st.duplicated += 1
            self._push(now + self._delay(), src, dst, data)

    def next_delivery(self) -> float | None:
        return self._queue[0][0] if self._queue else None

    def deliver_due(self, now: float) -> list[tuple[bytes, bytes, bytes]]:
        """Pop every datagram due at `now`: [(dst, src, data)] in delivery order. Datagrams
        to a node that crashed while they were in flight are dropped."""
        out = []
        while self._queue and self._queue[0][0] <= now:
            _, _, dst, src, data = heapq.heappop(self._queue)
            if dst in self.crashed:
                self.stats.to_crashed += 1
                continue
            self.stats.delivered += 1
            out.append((dst, src, data))
        return out

    def in_flight(self) -> int:
        return len(self._queue)
