"""Durable storage for the twin registry (a Redis without persistence erases every twin
when it restarts, so SQLite is the registry's default store).

Two stores with one async API (all methods raise StoreError when storage fails):

- `SqliteTwinStore(data_dir)`: SQLite file `<data_dir>/registry.sqlite3` (stdlib sqlite3, WAL
  journal, synchronous=FULL: every accepted write is fsync'ed before the HTTP answer). Calls
  run on one worker thread so the event loop never waits on a disk flush.
- `RedisTwinStore(redis)`: the previous Redis layout (keys rmb.registry.*), durable only when
  that Redis runs with AOF in a data directory.

API (ids are 1..2^32-1; account/pk hex strings; relays a JSON text; ts unix s):
  create(account_hex, relays_json, pk_hex, ts) -> new id, or 0 if the account exists
  update(tid, ts, relays_json, pk_hex, sig_digest_hex, seen_ttl_s, now) -> 1 applied,
      0 older than the last write, -1 unknown twin, -2 replayed signature
  load(tid) -> {"account", "relays", "pk", "ts"} (str values) | None
  find(account_hex) -> id | None
  ping() -> None;  close() -> None
"""
from __future__ import annotations

import asyncio
import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

KEY_PREFIX = "rmb.registry."

_CREATE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local id = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], id)
redis.call('HSET', ARGV[1] .. id, 'account', ARGV[2], 'relays', ARGV[3], 'pk', ARGV[4], 'ts', ARGV[5])
return id
"""

_UPDATE_LUA = """
local cur = redis.call('HGET', KEYS[1], 'ts')
if not cur then return -1 end
if tonumber(ARGV[1]) < tonumber(cur) then return 0 end
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[4]) then return -2 end
redis.call('HSET', KEYS[1], 'relays', ARGV[2], 'pk', ARGV[3], 'ts', ARGV[1])
return 1
"""


class StoreError(Exception):
    """Storage unavailable or failed (the registry answers 503)."""


class RedisTwinStore:
    """Twin records in Redis (see module doc). Durable only with AOF enabled. Each command
    waits at most `timeout` s: a Redis that hangs (connected, not answering) is a StoreError
    (the registry answers 503) instead of a request held open for ever."""

    def __init__(self, redis, timeout: float = 5.0):
        self.redis = redis
        self.timeout = timeout
        self._create = redis.register_script(_CREATE_LUA)
        self._update = redis.register_script(_UPDATE_LUA)

    async def _call(self, coro):
        import redis.asyncio as aioredis
        try:
            async with asyncio.timeout(self.timeout):
                return await coro
        except TimeoutError:
            raise StoreError(f"redis: no answer within {self.timeout:g} s") from None
        except (aioredis.RedisError, OSError) as exc:
            raise StoreError(f"redis: {type(exc).__name__}") from None

    async def ping(self) -> None:
        await self._call(self.redis.ping())

    async def durable(self) -> bool | None:
        """True when the Redis has the append-only file on (`CONFIG GET appendonly`), False
        when off (a restart of that Redis erases every twin), None when CONFIG is refused
        (renamed or ACL-restricted). Raises StoreError if Redis cannot be reached."""
        import redis.asyncio as aioredis
        try:
            async with asyncio.timeout(self.timeout):
                got = await self.redis.config_get("appendonly")
        except TimeoutError:
            raise StoreError(f"redis: no answer within {self.timeout:g} s") from None
        except aioredis.ResponseError:
            return None
        except (aioredis.RedisError, OSError) as exc:
            raise StoreError(f"redis: {type(exc).__name__}") from None
        value = got.get("appendonly", got.get(b"appendonly"))
        if isinstance(value, bytes):
            value = value.decode()
        return None if value is None else value == "yes"

    async def create(self, account: str, relays: str, pk: str, ts: int) -> int:
        return int(await self._call(self._create(
            keys=[f"{KEY_PREFIX}account.{account}", f"{KEY_PREFIX}next_id"],
            args=[f"{KEY_PREFIX}twin.", account, relays, pk, ts])))

    async def update(self, tid: int, ts: int, relays: str, pk: str, sig_digest: str,
                     seen_ttl: int, now: float) -> int:
        return int(await self._call(self._update(
            keys=[f"{KEY_PREFIX}twin.{tid}", f"{KEY_PREFIX}seen.{sig_digest}"],
            args=[ts, relays, pk, seen_ttl])))

    async def load(self, tid: int) -> dict | None:
        h = await self._call(self.redis.hgetall(f"{KEY_PREFIX}twin.{tid}"))
        if not h:
            return None
        return {k.decode(): v.decode() for k, v in h.items()}

    async def find(self, account: str) -> int | None:
        tid = await self._call(self.redis.get(f"{KEY_PREFIX}account.{account}"))
        return int(tid) if tid is not None else None

    async def close(self) -> None:
        await self.redis.aclose()


_SCHEMA = """
CREATE TABLE IF NOT EXISTS twins (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    account TEXT NOT NULL UNIQUE,
    relays TEXT NOT NULL,
    pk TEXT NOT NULL,
    ts INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS seen (
    digest TEXT PRIMARY KEY,
    until REAL NOT NULL
);
"""


class SqliteTwinStore:
    """Twin records in `<data_dir>/registry.sqlite3` (see module doc). Creates the
    directory and the file. Raises StoreError when the file cannot be opened."""

    FILENAME = "registry.sqlite3"

    def __init__(self, data_dir: str | os.PathLike):
        self.path = Path(data_dir) / self.FILENAME
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="registry-sqlite")
        self._db: sqlite3.Connection | None = None
        try:
            Path(data_dir).mkdir(parents=True, exist_ok=True)
            self._pool.submit(self._open).result()
        except (OSError, sqlite3.Error) as exc:
            self._pool.shutdown(wait=False)
            raise StoreError(f"cannot open {self.path} (set the directory with --data-dir): "
                             f"{exc}") from None

    def _open(self) -> None:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(_SCHEMA)
        self._db = db

    async def _run(self, fn, *args):
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite: {exc}") from None

    async def ping(self) -> None:
        await self._run(lambda: self._db.execute("SELECT 1").fetchone())

    def _create_sync(self, account: str, relays: str, pk: str, ts: int) -> int:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            if db.execute("SELECT 1 FROM twins WHERE account = ?", (account,)).fetchone():
                db.execute("ROLLBACK")
                return 0
            cur = db.execute("INSERT INTO twins (account, relays, pk, ts) VALUES (?, ?, ?, ?)",
                             (account, relays, pk, ts))
            db.execute("COMMIT")
            return int(cur.lastrowid)
        except BaseException:
            db.execute("ROLLBACK")
            raise

    async def create(self, account: str, relays: str, pk: str, ts: int) -> int:
        return await self._run(self._create_sync, account, relays, pk, ts)

    def _update_sync(self, tid, ts, relays, pk, digest, seen_ttl, now) -> int:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT ts FROM twins WHERE id = ?", (tid,)).fetchone()
            if row is None:
                db.execute("ROLLBACK")
                return -1
            if ts < row[0]:
                db.execute("ROLLBACK")
                return 0
            db.execute("DELETE FROM seen WHERE until <= ?", (now,))
            if db.execute("SELECT 1 FROM seen WHERE digest = ?", (digest,)).fetchone():
                db.execute("ROLLBACK")
                return -2
            db.execute("INSERT INTO seen (digest, until) VALUES (?, ?)", (digest, now + seen_ttl))
            db.execute("UPDATE twins SET relays = ?, pk = ?, ts = ? WHERE id = ?",
                       (relays, pk, ts, tid))
            db.execute("COMMIT")
            return 1
        except BaseException:
            db.execute("ROLLBACK")
            raise

    async def update(self, tid: int, ts: int, relays: str, pk: str, sig_digest: str,
                     seen_ttl: int, now: float) -> int:
        return await self._run(self._update_sync, tid, ts, relays, pk, sig_digest, seen_ttl, now)

    def _load_sync(self, tid: int) -> dict | None:
        row = self._db.execute("SELECT account, relays, pk, ts FROM twins WHERE id = ?",
                               (tid,)).fetchone()
        if row is None:
            return None
        return {"account": row[0], "relays": row[1], "pk": row[2], "ts": str(row[3])}

    async def load(self, tid: int) -> dict | None:
        return await self._run(self._load_sync, tid)

    async def find(self, account: str) -> int | None:
        row = await self._run(lambda: self._db.execute(
            "SELECT id FROM twins WHERE account = ?", (account,)).fetchone())
        return int(row[0]) if row else None

    async def close(self) -> None:
        if self._db is not None:
            db, self._db = self._db, None
            await asyncio.get_running_loop().run_in_executor(self._pool, db.close)
        self._pool.shutdown(wait=True)
