"""The two error bases of REMP: remote (a peer sent something we drop) and local (we misused
our own API). DESIGN.md section 2, after h11's `RemoteProtocolError` / `LocalProtocolError`
and websockets' `exceptions.py`; marlin_cluster/wire.py has the same pair
(`MarlinWireError` / `MarlinLocalError`).

    RempRemoteError(ValueError)   bytes or a request from a peer that do not parse, do not
                                  verify or break a protocol rule. `reason` is a short
                                  snake_case code, fit for a metric label or an event attr
                                  (e.g. "malformed", "bad_signature", "oversized").
    RempLocalError(Exception)     the local caller misused an API (bad argument, impossible
                                  state transition). Never a ValueError, so a boundary that
                                  turns remote errors into drops cannot swallow a bug.

Every REMP error type derives from exactly one of the two. The wire codecs (remp_node/wire/)
and the cores (remp_node/core/) raise subclasses; each daemon has one boundary that turns a
RempRemoteError into a counted, rate-limited drop.
"""
from __future__ import annotations

import re

__all__ = ["RempRemoteError", "RempLocalError", "REASON_RE"]

#: what a `reason` looks like: a metric label value (lower snake case, <= 40 characters)
REASON_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


class RempRemoteError(ValueError):
    """Remote error: input from a peer that we drop. `reason` is a metric label
    (REASON_RE); the message says what was wrong, for the log line."""

    reason = "malformed"

    def __init__(self, message: str = "", reason: str | None = None):
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class RempLocalError(Exception):
    """Local error: we misused the API (a bug in the caller, not bad input from a peer)."""
