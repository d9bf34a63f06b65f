"""Batched Redis writes for rmb-peer and its apps (DESIGN.md section 3: every push is LPUSH
then LTRIM 0 9999).

`RedisWriter` collects pushes, SET EX and DEL in call order and writes them in pipelines
(no MULTI) from one background task, so a burst of N pushes costs one round trip instead of
2N. Within one pipeline, all pushes to one queue become ONE `LPUSH queue v1 v2 ...` (Redis
pushes the values left to right, so the consumer's RPOP/BRPOP still sees them in call
order) followed by ONE `LTRIM queue 0 max_len-1` (same end state as trimming after every
push); the command sits where the queue's first push was. Order is preserved per key:
operations on one key are executed in the order they were queued (operations on different
keys within one pipeline may be regrouped; they are sent together anyway).

    writer = RedisWriter(redis_client)         # redis.asyncio.Redis
    writer.start()
    writer.push("msgbus.system.local", payload) # bytes; LPUSH + LTRIM 0 max_len-1
    writer.set("msgbus.backlog.<uid>", record, ttl=60)
    await writer.flush()                        # everything queued so far is written
    await writer.close()
"""
from __future__ import annotations

import asyncio
from typing import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

__all__ = ["RedisWriter", "QueueReader", "QUEUE_MAX_LEN"]

#: Queues are trimmed to this many entries (LTRIM 0 QUEUE_MAX_LEN-1).
QUEUE_MAX_LEN = 10000
#: Operations per pipeline, at most.
BATCH = 512


class RedisWriter:
    """Pipelines LPUSH+LTRIM / SET EX / DEL from one task. `on_error(exc, n_ops)` is called
    when a pipeline fails after `retries` attempts (the operations are then dropped: the
    caller logs it once); a daemon never stops on a Redis error."""

    def __init__(self, client: aioredis.Redis, max_len: int = QUEUE_MAX_LEN,
                 on_error: Callable[[Exception, int], None] | None = None, retries: int = 3):
        self.client = client
        self.max_len = max_len
        self.on_error = on_error
        self.retries = retries
        self._ops: list[tuple] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task | None = None
        self.written = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def push(self, queue: str, payload: bytes) -> None:
        """LPUSH payload on queue, then LTRIM 0 max_len-1."""
        self._ops.append(("push", queue, payload))
        self._kick()

    def set(self, key: str, value: bytes, ttl: int) -> None:
        """SET key value EX ttl (seconds, >= 1)."""
        self._ops.append(("set", key, value, max(1, int(ttl))))
        self._kick()

    def delete(self, key: str) -> None:
        self._ops.append(("del", key))
        self._kick()

    def _kick(self) -> None:
        self._idle.clear()
        self._wake.set()

    async def flush(self) -> None:
        """Wait until every operation queued so far was written (or dropped on error)."""
        if self._task is None:
            self.start()
        while self._ops or not self._idle.is_set():
            await self._idle.wait()
            if self._ops:
                await asyncio.sleep(0)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._ops:
                ops, self._ops = self._ops[:BATCH], self._ops[BATCH:]
                await self._write(ops)
            if not self._ops:
                self._idle.set()

    @staticmethod
    def _group(ops: list[tuple]) -> list[tuple]:
        """Pushes to one queue merged into one ("lpush", queue, [values]) at the position of
        the queue's first push; other operations unchanged, in order."""
        out: list = []
        pushes: dict[str, list[bytes]] = {}
        for op in ops:
            if op[0] == "push":
                values = pushes.get(op[1])
                if values is None:
                    values = pushes[op[1]] = []
                    out.append(("lpush", op[1], values))
                values.append(op[2])
            else:
                out.append(op)
        return out

    async def _write(self, ops: list[tuple]) -> None:
        grouped = self._group(ops)
        for attempt in range(self.retries):
            pipe = self.client.pipeline(transaction=False)
            for op in grouped:
                if op[0] == "lpush":
                    pipe.lpush(op[1], *op[2])
                    pipe.ltrim(op[1], 0, self.max_len - 1)
                elif op[0] == "set":
                    pipe.set(op[1], op[2], ex=op[3])
                else:
                    pipe.delete(op[1])
            try:
                await pipe.execute()
                self.written += len(ops)
                return
            except (RedisError, OSError) as exc:
                if attempt == self.retries - 1:
                    if self.on_error is not None:
                        self.on_error(exc, len(ops))
                    return
                await asyncio.sleep(0.2 * (attempt + 1))

    async def close(self) -> None:
        """Flush, then stop the background task."""
        try:
            await asyncio.wait_for(self.flush(), timeout=5.0)
        except asyncio.TimeoutError:
            pass
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None


class QueueReader:
    """Consumer of one or more Redis lists (the rmb-peer queues are LPUSHed, so RPOP takes
    the oldest first) with as few round trips as the load allows:

    - idle: one BRPOP over all `keys` (blocks up to `timeout` s); the element it returns
      is handed back at once (lowest latency);
    - after a BRPOP or a non-empty drain: the next read() drains every key with
      `RPOP key count` in one pipelined round trip, and keeps doing so while elements come
      back, so a sustained load costs one round trip per batch instead of BRPOP + RPOP;
    - an empty drain means idle again: BRPOP (in the same read() call).

        reader = QueueReader(redis_client, ["msgbus.system.local", "msgbus.system.reply"])
        items = await reader.read()   # [(key bytes, value bytes), ...], [] after a timeout

    Raises what redis.asyncio raises (RedisError, OSError); the caller backs off.
    """

    def __init__(self, client: aioredis.Redis, keys: list[str], count: int = 256,
                 timeout: float = 1.0):
        self.client = client
        self.keys = list(keys)
        self._bkeys = [k.encode() for k in self.keys]
        self.count = count
        self.timeout = timeout
        self._busy = False

    async def read(self) -> list[tuple[bytes, bytes]]:
        if self._busy:
            if len(self.keys) == 1:
                got = [await self.client.rpop(self.keys[0], self.count)]
            else:
                pipe = self.client.pipeline(transaction=False)
                for key in self.keys:
                    pipe.rpop(key, self.count)
                got = await pipe.execute()
            items = [(bkey, raw) for bkey, values in zip(self._bkeys, got) for raw in values or ()]
            if items:
                return items
            self._busy = False
        got = await self.client.brpop(self.keys, timeout=self.timeout)
        if got is None:
            return []
        self._busy = True
        return [(got[0], got[1])]
