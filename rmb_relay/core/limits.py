"""Rate limits of the relay core (no I/O, no clock: `now` is passed in).

seed: rmb.md "Rate Limiting": `--limit COUNT SIZE`, fixed 60 s windows per twin
(`FixedWindowLimiter`); `NoLimit` without the flag. The same window limiter keys the
federation-in limit by source relay address (`--federation-limit`).
"""
from __future__ import annotations

import math

from rmb_relay.core.errors import RelayCoreError

__all__ = ["NoLimit", "FixedWindowLimiter"]

class NoLimit:
    """The limiter used without --limit: everything passes."""

    def allow(self, twin: int, size: int, now: float) -> bool:
        return True


class FixedWindowLimiter:
    """seed: rmb.md "Rate Limiting", FixedWindowLimiter.

    Time is cut into fixed windows of `window` s (60) aligned on multiples of the window
    (window k = [k*window, (k+1)*window)). In each window a twin may send at most `count`
    envelopes totalling at most `size` bytes. `allow(twin, size, now)` counts the envelope
    and returns True, or returns False without counting it (the caller drops it and sends
    `exceeded rate limits, dropping message`; the connection stays). Memory: one entry per
    twin active in the current window (older entries are pruned when the window turns).
    Raises RelayCoreError for count/size/window <= 0.
    """

    def __init__(self, count: int, size: int, window: float = 60.0):
        if count <= 0 or size <= 0 or window <= 0:
            raise RelayCoreError(f"limit needs count > 0, size > 0, window > 0 (got {count}, {size}, {window})")
        self.count = count
        self.size = size
        self.window = window
        self._current = -1
        self._used: dict[int, list[int]] = {}

    def allow(self, twin: int, size: int, now: float) -> bool:
        index = math.floor(now / self.window)
        if index != self._current:
            self._current = index
            self._used.clear()          # every stored entry belongs to an older window
        used = self._used.get(twin)
        if used is None:
            used = self._used[twin] = [0, 0]
        if used[0] + 1 > self.count or used[1] + size > self.size:
            return False
        used[0] += 1
        used[1] += size
        return True

    def usage(self, twin: int, now: float) -> tuple[int, int]:
        """(envelopes, bytes) counted for `twin` in the window containing `now`."""
        if math.floor(now / self.window) != self._current:
            return (0, 0)
        used = self._used.get(twin, [0, 0])
        return (used[0], used[1])


