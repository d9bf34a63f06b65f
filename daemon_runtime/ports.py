"""Free local ports for networks written ahead of their daemons (`remp-node init`,
`marlin-node init` with base port 0: tests and the launcher).

A port that bind(0) hands out comes from the kernel's ephemeral range, where the outgoing
connections of every process started next (Redis and HTTP clients, the daemons' own peers)
race for it: a daemon of the network then fails with EADDRINUSE (seen in CI:
`test_remp_network_of_processes`, a validator's HTTP port taken between `init` and its
start). Ports below that range are only ever taken by an explicit bind, so they are picked
from there when the range leaves room.
"""
from __future__ import annotations

import random
import socket

__all__ = ["ephemeral_range", "free_ports"]


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (/proc/sys/net/ipv4/ip_local_port_range), or
    Linux's default 32768-60999 when it cannot be read."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            lo, hi = (int(x) for x in fh.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(host: str, n: int, kinds: tuple[int, ...] = (socket.SOCK_STREAM,)) -> list[int]:
    """n distinct ports free on `host` now for every socket kind in `kinds` (SOCK_STREAM,
    SOCK_DGRAM), chosen at random below the ephemeral range (up to 12,000 ports under it),
    else handed out by bind(0). Another process may still take one before it is used; the
    range only removes the race with outgoing connections. Raises OSError when `host`
    cannot be bound at all."""
    lo, _ = ephemeral_range()
    held: list[socket.socket] = []
    ports: list[int] = []

    def take(port: int) -> int | None:
        socks = []
        try:
            for kind in kinds:
                s = socket.socket(socket.AF_INET, kind)
                socks.append(s)
                s.bind((host, port))
                port = s.getsockname()[1]      # bind(0): the first kind picks the port
        except OSError:
            for s in socks:
                s.close()
            return None
        held.extend(socks)                     # kept bound until all n are chosen: distinct
        return port

    try:
        candidates = list(range(max(1024, lo - 12000), lo)) if lo > 2048 else []
        random.shuffle(candidates)
        for port in candidates:
            if len(ports) == n:
                break
            got = take(port)
            if got is not None:
                ports.append(got)
        misses = 0
        while len(ports) < n:
            got = take(0)
            if got is None:
                misses += 1                    # the port bind(0) gave one kind was taken for another
                if misses > 50:
                    raise OSError(f"no free port on {host} for socket kinds {kinds}")
                continue
            ports.append(got)
    finally:
        for s in held:
            s.close()
    return ports
