"""The in-memory datagram network and fake clock that every protocol's tests drive their
cores over (DESIGN.md section 2: "Tests drive two or more cores against each other in
memory with a fake clock (`now += TICK`), including loss, reordering and duplication").

No I/O and no real clock: the caller owns the time (a FakeClock, or a float it advances)
and passes `now` (seconds) to every call. Addresses are any hashable values (REMP: 32-byte
key ids; Marlin: 20-byte addresses). Randomness comes from one seeded `random.Random`, so a
run is reproducible.

    net = MemNetwork(seed=1, loss=0.05, duplicate=0.02, reorder=0.1)
    net.send(src, dst, data, now)                  # queue one datagram (or drop it: faults)
    for dst, src, data in net.deliver_due(now):    # every datagram due by `now`, in order
        cores[dst].receive_datagram(data, src, now)
    t = net.next_delivery()                        # when the next one is due (None: nothing)

Faults (all probabilities in [0, 1], applied per datagram):
- loss: the datagram is dropped;
- duplicate: a second copy is delivered (with its own delay);
- reorder: the datagram gets an extra delay of up to `reorder_delay` seconds, so later
  datagrams overtake it;
- crashed nodes (`crashed`, a set of addresses): nothing is delivered to or from them;
- `drop_filter(src, dst, data, now) -> bool`: a targeted partition (True drops).
Delays: `latency` + uniform(0, `jitter`) seconds.
"""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Callable, Hashable

__all__ = ["MemNetwork", "NetworkStats", "FakeClock"]


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


class MemNetwork:
    """send(src, dst, data, now) queues a datagram; deliver_due(now) pops the ones due.

    MemNetwork(seed=0, loss=0.0, duplicate=0.0, reorder=0.0, latency=0.005, jitter=0.005,
    reorder_delay=0.05, classify=None, part_payload=0). ValueError for a probability outside
    [0, 1]. `classify(data) -> str` names a datagram's kind for `stats.by_kind` (counted at
    send time, before faults). part_payload (bytes, 0 = off): model a transport that splits a
    datagram into parts and delivers it only if ALL its parts arrive (REMP's transport.py:
    1,154 payload bytes per part, parts never retransmitted): a datagram of
    n = ceil(len / part_payload) parts is lost with probability 1 - (1 - loss) ** n."""

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
        self.crashed: set = set()
        self.drop_filter: Callable[[Hashable, Hashable, bytes, float], bool] | None = None
        self.stats = NetworkStats()
        self._queue: list[tuple[float, int, Hashable, Hashable, bytes]] = []
        self._seq = 0

    def _delay(self) -> float:
        d = self.latency + self.rng.uniform(0.0, self.jitter)
        if self.reorder and self.rng.random() < self.reorder:
            self.stats.reordered += 1
            d += self.rng.uniform(0.0, self.reorder_delay)
        return d

    def _push(self, at: float, src: Hashable, dst: Hashable, data: bytes) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at, self._seq, dst, src, data))

    def send(self, src: Hashable, dst: Hashable, data: bytes, now: float) -> None:
        """Queue `data` from `src` to `dst` at `now` (seconds), or drop it (faults)."""
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
        """When the next queued datagram is due (seconds), None when nothing is queued."""
        return self._queue[0][0] if self._queue else None

    def deliver_due(self, now: float) -> list[tuple[Hashable, Hashable, bytes]]:
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
        """Datagrams queued and not yet delivered (or dropped at delivery)."""
        return len(self._queue)


class FakeClock:
    """The tests' clock: FakeClock(start=0.0). `now` (seconds) moves only when told:
    advance(dt) adds dt >= 0, advance_to(t) jumps to t if it is later. Both return `now`.
    ValueError for a negative dt."""

    __slots__ = ("now",)

    def __init__(self, start: float = 0.0):
        self.now = float(start)

    def advance(self, dt: float) -> float:
        if dt < 0:
            raise ValueError(f"a clock does not go back ({dt} s)")
        self.now += dt
        return self.now

    def advance_to(self, t: float) -> float:
        if t > self.now:
            self.now = float(t)
        return self.now

    def __call__(self) -> float:
        return self.now
