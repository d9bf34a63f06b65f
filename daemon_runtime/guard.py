"""The one error guard of every daemon (DESIGN.md section 2 and the project rule "bad input
gets a precise, rate-limited log line and never crashes a daemon"): what an entry point
catches that is not a remote error ends here, is counted, logged, and the daemon goes on.

    guard = Guard(log=fn(where, exc, src), metric=fn(where, exc), window=5.0)
    guard.bug(exc, "timer")              # count, then one line per (where, type) per window
    Guard(log=..., window=None).bug(...) # count, then every line (the caller logs in full)

`where` names the entry point (with the exception type, the rate-limit key); `src` is where
the input came from (a peer, a queue), passed to `log` only. `window` (seconds on the
monotonic clock, through daemon_runtime.ratelimit.LogLimiter, burst 1): None logs every
bug, for callers whose lines are complete today or that hand the exception on to another
guard that limits. `bug` never raises: a broken log sink or metric must not take the daemon
down (the bug and the sink's error then go to stderr).
"""
from __future__ import annotations

import sys
import time
from typing import Callable

from .ratelimit import LogLimiter

__all__ = ["Guard", "BUG_WINDOW"]

#: seconds: at most one bug line per (where, exception type) per window (the rest counted)
BUG_WINDOW = 5.0


class Guard:
    """Guard(log=fn(where, exc, src), metric=fn(where, exc) | None, window=BUG_WINDOW |
    None): see the module doc. ValueError for a window <= 0."""

    __slots__ = ("log", "metric", "_limit")

    def __init__(self, log: Callable[[str, BaseException, str | None], None],
                 metric: Callable[[str, BaseException], None] | None = None,
                 window: float | None = BUG_WINDOW):
        self.log = log
        self.metric = metric
        self._limit = None if window is None else LogLimiter(burst=1, window=window)

    def bug(self, exc: BaseException, where: str = "loop", src: str | None = None) -> None:
        """Count `exc` (metric), then log it (at most once per (where, type) per window when
        the guard has one). Never raises."""
        try:
            if self.metric is not None:
                self.metric(where, exc)
            if self._limit is None or self._limit.allow((where, type(exc).__name__), time.monotonic())[0]:
                self.log(where, exc, src)
        except Exception as sink_error:   # a broken log sink must not take the daemon down,
            try:                          # nor hide the bug: stderr is the last witness
                print(f"guard: bug at {where}: {exc!r}; its log line failed: {sink_error!r}",
                      file=sys.stderr, flush=True)
            except Exception:  # noqa: BLE001 - stderr itself gone: nothing left to tell
                pass
