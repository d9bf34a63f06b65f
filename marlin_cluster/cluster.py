"""Marlin cluster member core (no I/O, no clock). SKELETON: API fixed, body being filled in."""
from __future__ import annotations
from .crypto import NodeKey
from .events import MarlinEvent
from .membership import Membership
from .params import Params


class ClusterMemberCore:
    def __init__(self, key: NodeKey, membership: Membership, params: Params, cluster_id: int): ...
    def receive_frame(self, frame: bytes, peer: bytes, now: float) -> None: ...
    def frames_to_send(self, now: float) -> list[tuple[bytes, bytes]]: return []
    def get_timer(self) -> float | None: return None
    def handle_timer(self, now: float) -> None: ...
    def next_event(self) -> MarlinEvent | None: return None
