"""Marlin producer core (no I/O, no clock). SKELETON: API fixed, body being filled in."""
from __future__ import annotations
from typing import Callable
from .crypto import NodeKey
from .events import MarlinEvent
from .membership import Membership
from .params import Params
from .wire import MarlinLocalError


class StakeExhausted(MarlinLocalError):
    """The stake budget of this refresh interval does not cover the block."""


class ProducerCore:
    def __init__(self, key: NodeKey, membership: Membership, params: Params, *,
                 selector: Callable[[list[int], int, int], list[int]] | None = None): ...
    def produce(self, block: bytes, channel: int, now: float) -> int: raise NotImplementedError
    def receive_frame(self, frame: bytes, peer: bytes, now: float) -> None: ...
    def frames_to_send(self, now: float) -> list[tuple[bytes, bytes]]: return []
    def get_timer(self) -> float | None: return None
    def handle_timer(self, now: float) -> None: ...
    def next_event(self) -> MarlinEvent | None: return None
    def missing_acks(self, message_id: int) -> list[int]: return []
