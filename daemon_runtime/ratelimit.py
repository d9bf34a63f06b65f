"""The one rate limiter for log lines, shared by every daemon (DESIGN.md section 2 and the
project rule "bad input gets a precise, rate-limited log line and never crashes a daemon").

    lim = LogLimiter(burst=5, window=10.0)
    emit, suppressed = lim.allow(key, now)   # key: any hashable (a reason, (reason, peer), ...)
    if suppressed: log one summary line with that count
    if emit: log this line            else: count it only
    for key, n in lim.flush(now): log one summary line per key   # from a periodic timer

Per key, at most `burst` lines per `window` seconds are allowed; the window of a key starts
at its first line and restarts with the first line after it ended. `suppressed` is how many
lines of this key were withheld in the window(s) before and not yet reported. `burst=1`
gives "at most one line per key per window". `now` is seconds on any monotonic base chosen
by the caller (loop time in adapters, a fake clock in tests): the limiter reads no clock, so
a protocol core may hold one too.

Memory: one entry per key seen within its window. Past `max_keys` entries, the entries
whose window ended are dropped (their withheld counts with them); if all are live, the
table is cleared: a flood of distinct keys (e.g. one per peer address) cannot grow it.
"""
from __future__ import annotations

from typing import Hashable

__all__ = ["LogLimiter"]


class LogLimiter:
    """LogLimiter(burst=5, window=10.0, max_keys=4096): see the module doc. ValueError
    unless burst > 0, window > 0 and max_keys > 0."""

    def __init__(self, burst: int = 5, window: float = 10.0, max_keys: int = 4096):
        if burst <= 0 or window <= 0 or max_keys <= 0:
            raise ValueError(f"log limiter needs burst > 0, window > 0 and max_keys > 0 "
                             f"({burst}, {window}, {max_keys})")
        self.burst = burst
        self.window = window
        self.max_keys = max_keys
        #: key -> [window start, lines allowed in it, lines withheld not yet reported]
        self._state: dict[Hashable, list] = {}

    def allow(self, key: Hashable, now: float) -> tuple[bool, int]:
        """(emit, suppressed) for one line of `key` at `now` (module doc)."""
        st = self._state.get(key)
        if st is None:
            if len(self._state) >= self.max_keys:
                self._prune(now)
            self._state[key] = [now, 1, 0]
            return True, 0
        suppressed = 0
        if now - st[0] >= self.window:
            suppressed = st[2]
            st[0], st[1], st[2] = now, 0, 0
        if st[1] < self.burst:
            st[1] += 1
            return True, suppressed
        st[2] += 1
        return False, suppressed

    def flush(self, now: float) -> list[tuple[Hashable, int]]:
        """[(key, withheld)] for every key whose window ended with lines withheld; every
        ended key is forgotten."""
        out = []
        for key, st in list(self._state.items()):
            if now - st[0] >= self.window:
                if st[2]:
                    out.append((key, st[2]))
                del self._state[key]
        return out

    def _prune(self, now: float) -> None:
        for key in [k for k, st in self._state.items() if now - st[0] >= self.window]:
            del self._state[key]
        if len(self._state) >= self.max_keys:
            self._state.clear()
