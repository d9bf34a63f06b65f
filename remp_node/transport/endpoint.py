"""The datagram endpoint the REMP daemons use: the authenticated, fragmenting transport of
remp_node/transport/core.py driven by remp_node/transport/udp.py.

    ep = await open_endpoint(key, peers, bind, on_payload, faults=None)
    ep.send(dst_key_id, payload); ep.send_many(dst_key_id, [payload, ...]); ep.address;
    ep.counters; ep.close()

peers: key id -> (public key, (host, port)); on_payload(src_key_id, payload, now) where now
is loop.time(). faults: Faults(loss, duplicate, reorder, reorder_delay, seed) or None
(test-only fault injection at the adapter: parse_faults("loss=0.2,dup=0.1,reorder=0.1")).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

__all__ = ["Faults", "parse_faults", "open_endpoint", "AuthEndpoint"]


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


class AuthEndpoint:
    """A's authenticated transport behind the daemons' endpoint interface: TransportCore
    (transport.py: per-peer AEAD keys, parts <= 1,232 bytes, bounded reassembly, replay
    window, rate limits, drops counted by reason) driven by udp.UdpEndpoint."""

    def __init__(self, core, ep):
        self.core = core
        self.ep = ep
        self.local_counters: Counter[str] = Counter()

    @property
    def address(self) -> tuple[str, int]:
        return self.ep.address

    @property
    def counters(self) -> dict:
        out = dict(self.core.counters)
        out.update(self.local_counters)
        if self.ep.faults is not None:
            out.update({"fault_" + k: v for k, v in self.ep.faults.stats.items()})
        return out

    def send(self, dst: bytes, payload: bytes) -> None:
        from .core import TransportError
        try:
            self.ep.send(dst, payload)
        except TransportError as exc:   # unknown peer / oversized payload: a local bug, counted
            self.local_counters["send_refused"] += 1
            self.local_counters["send_refused_" + ("size" if "payload" in str(exc) else "other")] += 1

    def send_many(self, dst: bytes, payloads: list[bytes]) -> None:
        """Several payloads for one peer, in order; small ones share datagrams (transport.py,
        "Bundles"). A refused batch (unknown peer, a payload over max_payload) is counted as
        send() counts it and then sent one by one, so the others still leave."""
        from .core import TransportError
        try:
            self.ep.send_many(dst, payloads)
        except TransportError:
            for x in payloads:
                self.send(dst, x)

    def close(self) -> None:
        self.ep.close()


async def open_endpoint(key, peers: dict[bytes, tuple[bytes, tuple[str, int]]], bind: tuple[str, int],
                        on_payload: Callable[[bytes, bytes, float], None], faults: Faults | None = None,
                        on_drop: Callable | None = None, epoch: int | None = None):
    """Bind A's authenticated UDP endpoint for node `key` (NodeKey) talking to `peers`
    (module doc). on_drop(transport.DatagramDropped) for every dropped datagram. epoch: this
    run's transport epoch (must grow across restarts; default: the current time in us)."""
    from .core import TransportCore
    from .udp import Faults as UdpFaults, UdpEndpoint
    core = TransportCore(key, {pk: (addr[0], int(addr[1])) for pk, addr in peers.values()}, epoch=epoch)
    uf = None
    if faults is not None:
        uf = UdpFaults(loss=faults.loss, duplicate=faults.duplicate, reorder=faults.reorder,
                       reorder_delay=faults.reorder_delay, seed=faults.seed)
    else:   # test only: per-destination delay / loss from RELAY_SUITE_LINKS (the testnet)
        from daemon_runtime.linkmodel import DatagramFaults, from_env
        uf = DatagramFaults(from_env()) if from_env() is not None else None
    ep = await UdpEndpoint.create(core, bind, on_payload, faults=uf, on_drop=on_drop)
    _grow_buffers(ep.transport.get_extra_info("socket"))
    return AuthEndpoint(core, ep)


#: socket buffer sizes asked for (bytes; Linux caps them at net.core.rmem_max / wmem_max)
SOCKET_BUFFER = 4 << 20


def _grow_buffers(sock) -> None:
    """Ask for 4 MiB receive and send buffers: a validator receives bursts from every peer
    at once (a proposal of ~20 parts broadcast by the leader, then every member's votes),
    and Linux's default 208 KiB receive buffer overflowed (RcvbufErrors in /proc/net/snmp,
    reassembly timeouts) when 15 nodes shared 2 loaded cores."""
    import socket
    if sock is None:
        return
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        except OSError:
            pass
