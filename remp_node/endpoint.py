"""The datagram endpoint the REMP daemons use: A's authenticated, fragmenting transport
(remp_node/transport.py + udp.py) when it is in the tree, else a plain stand-in.

    ep = await open_endpoint(key, peers, bind, on_payload, faults=None)
    ep.send(dst_key_id, payload); ep.address; ep.counters; ep.close()

peers: key id -> (public key, (host, port)); on_payload(src_key_id, payload, now) where now
is loop.time(). faults: Faults(loss, duplicate, reorder, reorder_delay, seed) or None
(test-only fault injection at the adapter: parse_faults("loss=0.2,dup=0.1,reorder=0.1")).

The stand-in (PlainEndpoint) is NOT authenticated: a datagram is b"RMP0" + sender key id
(32 bytes) + payload, accepted only from the sender's configured address, at most 65,000
bytes (loopback UDP). It exists so the daemons run before the real transport lands; the
payloads above it (consensus votes, catchain blocks, receipts, rempMessage) carry their own
ed25519 signatures, so a forged stand-in datagram can at worst be dropped by the cores.
"""
from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass
from typing import Callable

__all__ = ["Faults", "parse_faults", "open_endpoint", "PlainEndpoint"]

MAGIC = b"RMP0"
MAX_PLAIN = 65_000


@dataclass(frozen=True)
class Faults:
    """Test-only fault injection (probabilities per datagram sent; reorder delays a datagram
    by uniform(0, reorder_delay) seconds)."""

    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    reorder_delay: float = 0.05
    seed: int = 0


def parse_faults(text: str | None) -> Faults | None:
    """'loss=0.2,dup=0.1,reorder=0.1[,delay=0.05][,seed=1]' -> Faults; '' / None -> None.
    Raises ValueError naming the bad item."""
    if not text:
        return None
    names = {"loss": "loss", "dup": "duplicate", "duplicate": "duplicate", "reorder": "reorder",
             "delay": "reorder_delay", "reorder_delay": "reorder_delay", "seed": "seed"}
    kw: dict = {}
    for item in text.split(","):
        k, sep, v = item.strip().partition("=")
        if not sep or k not in names:
            raise ValueError(f"bad fault item {item!r} (expected loss=, dup=, reorder=, delay=, seed=)")
        try:
            kw[names[k]] = int(v) if k == "seed" else float(v)
        except ValueError:
            raise ValueError(f"bad fault value in {item!r}") from None
        if k != "seed" and not 0 <= kw[names[k]] <= (10 if "delay" in k else 1):
            raise ValueError(f"fault {k} out of range: {v}")
    return Faults(**kw)


class PlainEndpoint(asyncio.DatagramProtocol):
    """The stand-in endpoint (module doc)."""

    def __init__(self, key_id: bytes, peers: dict[bytes, tuple[bytes, tuple[str, int]]],
                 on_payload: Callable[[bytes, bytes, float], None], faults: Faults | None):
        self.key_id = key_id
        self.peers = {k: (v[1][0], int(v[1][1])) for k, v in peers.items()}
        self.on_payload = on_payload
        self.faults = faults
        self.rng = random.Random(faults.seed if faults else 0)
        self.transport: asyncio.DatagramTransport | None = None
        self.counters: Counter[str] = Counter()
        self.address: tuple[str, int] | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.address = transport.get_extra_info("sockname")[:2]

    def datagram_received(self, data: bytes, addr) -> None:
        self.counters["datagrams_in"] += 1
        self.counters["bytes_in"] += len(data)
        if len(data) < 36 or data[:4] != MAGIC:
            self.counters["drop_malformed"] += 1
            return
        src = bytes(data[4:36])
        want = self.peers.get(src)
        if want is None:
            self.counters["drop_unknown_peer"] += 1
            return
        if (addr[0], addr[1]) != want:
            self.counters["drop_wrong_address"] += 1
            return
        loop = asyncio.get_running_loop()
        self.on_payload(src, bytes(data[36:]), loop.time())

    def error_received(self, exc) -> None:
        self.counters["socket_errors"] += 1

    def send(self, dst: bytes, payload: bytes) -> None:
        addr = self.peers.get(dst)
        if addr is None or self.transport is None:
            self.counters["drop_no_route"] += 1
            return
        data = MAGIC + self.key_id + payload
        if len(data) > MAX_PLAIN:
            self.counters["drop_oversized_out"] += 1
            return
        f = self.faults
        copies = 1
        if f is not None:
            if self.rng.random() < f.loss:
                self.counters["fault_lost"] += 1
                return
            if self.rng.random() < f.duplicate:
                self.counters["fault_duplicated"] += 1
                copies = 2
        for _ in range(copies):
            if f is not None and self.rng.random() < f.reorder:
                self.counters["fault_reordered"] += 1
                asyncio.get_running_loop().call_later(self.rng.uniform(0, f.reorder_delay), self._raw, data, addr)
            else:
                self._raw(data, addr)

    def _raw(self, data: bytes, addr) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.counters["datagrams_out"] += 1
        self.counters["bytes_out"] += len(data)
        self.transport.sendto(data, addr)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def open_endpoint(key, peers: dict[bytes, tuple[bytes, tuple[str, int]]], bind: tuple[str, int],
                        on_payload: Callable[[bytes, bytes, float], None], faults: Faults | None = None):
    """Bind a UDP endpoint for node `key` (NodeKey) talking to `peers` (module doc)."""
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_datagram_endpoint(
        lambda: PlainEndpoint(key.key_id, peers, on_payload, faults), local_addr=bind)
    return proto
