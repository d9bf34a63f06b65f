"""rmb-peer's durable twin table: the last known twin records in SQLite
(`<--data-dir>/twins.sqlite3`), so a peer restarted while the registry is down starts from
its last known state.

One row per twin: id, the registry JSON form of the record (rmb_peer.twins.Twin.to_json),
and the wall-clock unix time it was fetched (ages survive restarts; the core's TTL and
stale bound apply to them). WAL journal, synchronous=NORMAL: a committed row survives a
process crash; the last rows before a power loss may be lost, which only means one more
lookup. Writes are small and rare (one per twin per refresh, about every TTL/2).
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from rmb_peer.twins import Twin

__all__ = ["TwinStore", "TWIN_DB"]

#: File name inside --data-dir.
TWIN_DB = "twins.sqlite3"


class TwinStore:
    """SQLite table of twin records. path: the data directory (created if missing).
    Raises OSError / sqlite3.Error when the directory or file cannot be used."""

    def __init__(self, data_dir: str | Path):
        self.dir = Path(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / TWIN_DB
        self._db = sqlite3.connect(str(self.path), isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS twins (id INTEGER PRIMARY KEY, "
                         "account BLOB NOT NULL, record TEXT NOT NULL, fetched REAL NOT NULL)")
        self._db.execute("CREATE INDEX IF NOT EXISTS twins_account ON twins(account)")

    def put(self, twin: Twin, fetched: float) -> None:
        """Insert or replace `twin`, fetched at wall-clock unix time `fetched` (s)."""
        self._db.execute("INSERT OR REPLACE INTO twins (id, account, record, fetched) "
                         "VALUES (?, ?, ?, ?)",
                         (twin.id, twin.account, json.dumps(twin.to_json()), float(fetched)))

    def delete(self, twin_id: int) -> None:
        """Forget a twin (the registry says it does not exist)."""
        self._db.execute("DELETE FROM twins WHERE id = ?", (int(twin_id),))

    def load(self, wall_now: float, limit: int = 100_000) -> list[tuple[Twin, float]]:
        """The newest `limit` records as (Twin, age in s at `wall_now`); unreadable rows
        are skipped (and deleted)."""
        out: list[tuple[Twin, float]] = []
        bad: list[int] = []
        for tid, record, fetched in self._db.execute(
                "SELECT id, record, fetched FROM twins ORDER BY fetched DESC LIMIT ?", (limit,)):
            try:
                out.append((Twin.from_json(json.loads(record)), max(0.0, wall_now - fetched)))
            except (ValueError, TypeError):
                bad.append(tid)
        for tid in bad:
            self.delete(tid)
        return out

    def by_account(self, account: bytes) -> tuple[Twin, float] | None:
        """(record, fetched wall time) of the twin with this account key, or None."""
        row = self._db.execute("SELECT record, fetched FROM twins WHERE account = ? "
                               "ORDER BY fetched DESC LIMIT 1", (bytes(account),)).fetchone()
        if row is None:
            return None
        try:
            return Twin.from_json(json.loads(row[0])), row[1]
        except (ValueError, TypeError):
            return None

    def close(self) -> None:
        self._db.close()
