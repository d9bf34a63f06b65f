"""How fresh a twin record is: the one rule of every twin table (no I/O, no clock).

Kept apart from rmb_peer/twins.py (the registry client, which does I/O) so the protocol
cores can use it too. DESIGN.md section 3, "Twin lookup".
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TwinFreshness"]


@dataclass(frozen=True)
class TwinFreshness:
    """The one freshness rule for twin records, used by every twin table of the relay
    and the peer (TwinDirectory, rmb_relay.lookups.TwinLookups, the relay core's table).
    DESIGN.md section 3 ("Twin lookup": a TTL cache); `age` is seconds since the record
    was fetched (on the table's own clock):

    - fresh (`age < ttl`): used as it is, no lookup;
    - stale (`ttl <= age <= ttl + max_stale`): still served: with a refresh asked for
      at the same time (stale-while-revalidate) where the table does that, or when the
      registry could not be reached (stale-if-error);
    - too old (`age > ttl + max_stale`): not served; the registry must answer first.

    ttl, max_stale: seconds, >= 0 (ttl 0: never fresh; max_stale 0: never stale)."""

    ttl: float = 60.0
    max_stale: float = 3600.0

    def fresh(self, age: float) -> bool:
        return age < self.ttl

    def servable(self, age: float) -> bool:
        """Fresh or stale: the record may be served."""
        return age <= self.ttl + self.max_stale
