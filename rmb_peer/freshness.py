"""Twin records: the one freshness rule of every twin table, and the one command a core
uses to ask for a lookup (no I/O, no clock).

Kept apart from rmb_peer/twins.py (the registry client, which does I/O) so the protocol
cores can use them too. DESIGN.md section 3, "Twin lookup".
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TwinFreshness", "LookupTwin"]


@dataclass(frozen=True)
class TwinFreshness:
    """The one freshness rule for twin records, used by every twin table of the relay
    and the peer (TwinDirectory, rmb_relay.lookups.TwinLookups, the relay core's table,
    the peer core's table). DESIGN.md section 3 ("Twin lookup": a TTL cache); `age` is
    seconds since the record was fetched (on the table's own clock):

    - fresh (`age < ttl`): used as it is; a table that refreshes ahead asks for a
      refresh once `refresh_due(age)` (`age >= refresh_ahead x ttl`) and keeps using it;
    - stale (`ttl <= age <= ttl + max_stale`): still served: with a refresh asked for
      at the same time (stale-while-revalidate) where the table does that, or when the
      registry could not be reached (stale-if-error); `servable(age, within)` bounds the
      staleness further to `within` s (the peer's grace while a refresh is in flight);
    - too old (`age > ttl + max_stale`): not served; the registry must answer first.

    ttl, max_stale: seconds, >= 0 (ttl 0: never fresh; max_stale 0: never stale);
    refresh_ahead: fraction of the TTL, 0 < x <= 1 (1: no refresh while fresh; the
    peer's table: 0.5)."""

    ttl: float = 60.0
    max_stale: float = 3600.0
    refresh_ahead: float = 1.0

    def fresh(self, age: float) -> bool:
        return age < self.ttl

    def refresh_due(self, age: float) -> bool:
        """A fresh record is old enough to be refreshed ahead (true once not fresh)."""
        return age >= self.ttl * self.refresh_ahead

    def servable(self, age: float, within: float | None = None) -> bool:
        """Fresh or stale: the record may be served (`within`: at most that many seconds
        past the TTL, never more than max_stale)."""
        stale = self.max_stale if within is None else min(self.max_stale, within)
        return age <= self.ttl + stale


@dataclass
class LookupTwin:
    """A core asks its adapter to look twin `twin` up in the twin registry (at most one
    lookup per twin is in flight). The relay core answers it with
    twin_resolved(twin, record | error, now); the peer core with twin_resolved(twin,
    record | None, now) (None: HTTP 404) or twin_lookup_failed(twin, reason, now).
    `refresh`: True when nothing waits for the answer (the peer's refresh-ahead or retry
    of a record it still serves). `fresh`: True when the adapter must ask the registry
    even if its own cache holds a record within its TTL (the relay's shutdown drain: the
    twin may have moved since)."""
    twin: int
    refresh: bool = False
    fresh: bool = False
