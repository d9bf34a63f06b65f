"""REMP's name for the shared in-memory datagram network (daemon_runtime/memnet.py): the
simulation (sim.py) and the REMP core tests drive their cores over it with a fake clock.
Addresses are node key ids (32 bytes)."""
from __future__ import annotations

from daemon_runtime.memnet import MemNetwork as SimNetwork, NetworkStats

__all__ = ["SimNetwork", "NetworkStats"]
