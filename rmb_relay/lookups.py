"""The relay's twin lookups survive the registry (relay side).

`TwinLookups` sits on rmb_peer.twins.TwinDirectory (which already dedups concurrent
lookups per twin and serves stale-if-error up to its max_stale) and adds what the relay's
hot path needs:

- `peek(twin_id)`: a record without awaiting, when one is known and younger than
  ttl + max_stale (s). A record older than the TTL is still returned at once and a
  background refresh is started (stale-while-revalidate): a slow or hung registry never
  delays traffic to twins the relay already knows.
- `get(twin_id)`: peek, else one awaited lookup (DirectoryError / UnknownTwin raised).
- bounded: at most `max_records` records, least recently fetched dropped first.

A refresh that fails keeps the old record (logged through `on_stale(twin, age_s, exc)`,
the relay rate-limits it); a refresh answering 404 forgets the twin. Records past
ttl + max_stale are not served (bounded staleness): rmb_peer.twins.TwinFreshness, the
rule every twin table follows. `clock` is monotonic seconds.
"""
from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Callable

from rmb_peer.twins import DirectoryError, Twin, TwinDirectory, TwinFreshness, UnknownTwin


class TwinLookups:
    def __init__(self, directory: TwinDirectory, *, max_stale: float = 3600.0,
                 max_records: int = 100_000, clock: Callable[[], float] = time.monotonic,
                 on_stale: Callable[[Twin, float, Exception], None] | None = None,
                 on_bug: Callable[[str, BaseException], None] | None = None):
        self.directory = directory
        self.max_stale = max_stale
        self.max_records = max_records
        self.clock = clock
        self.on_stale = on_stale
        self.on_bug = on_bug
        self._records: OrderedDict[int, tuple[Twin, float]] = OrderedDict()
        self._refreshing: dict[int, asyncio.Task] = {}
        #: background refreshes started / stale records served (tests, metrics)
        self.refreshes = 0
        self.stale_served = 0

    @property
    def ttl(self) -> float:
        return self.directory.cache_ttl

    def _remember(self, twin: Twin) -> Twin:
        self._records[twin.id] = (twin, self.clock())
        self._records.move_to_end(twin.id)
        while len(self._records) > self.max_records:
            self._records.popitem(last=False)
        return twin

    def peek(self, twin_id: int) -> Twin | None:
        hit = self._records.get(twin_id)
        if hit is None:
            return None
        twin, at = hit
        rule = TwinFreshness(self.ttl, self.max_stale)
        age = self.clock() - at
        if rule.fresh(age):
            return twin
        if not rule.servable(age):
            return None
        if twin_id not in self._refreshing:
            self.refreshes += 1
            task = asyncio.get_running_loop().create_task(self._refresh(twin_id))
            self._refreshing[twin_id] = task
        return twin

    async def _refresh(self, twin_id: int) -> None:
        try:
            self._remember(await self.directory.get(twin_id))
        except UnknownTwin:
            self._records.pop(twin_id, None)
        except DirectoryError as exc:
            hit = self._records.get(twin_id)
            if hit is not None:
                self.stale_served += 1
                if self.on_stale is not None:
                    self.on_stale(hit[0], self.clock() - hit[1], exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - guard of this task entry point
            if self.on_bug is not None:
                self.on_bug("twin refresh", exc)
        finally:
            self._refreshing.pop(twin_id, None)

    async def get(self, twin_id: int) -> Twin:
        """Raises UnknownTwin / DirectoryError."""
        twin = self.peek(twin_id)
        if twin is not None:
            return twin
        return self._remember(await self.directory.get(twin_id))

    def close(self) -> None:
        for task in list(self._refreshing.values()):
            task.cancel()
        self._refreshing.clear()
