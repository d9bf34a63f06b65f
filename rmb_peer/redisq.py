"""Batched Redis writes for rmb-peer and its apps (DESIGN.md section 3: every push is LPUSH
then LTRIM 0 9999).

`RedisWriter` collects pushes, SET EX and DEL in call order and writes them in pipelines
(no MULTI) from one background task, so a burst of N pushes costs one round trip instead of
2N. Order is preserved: operations are executed in the order they were queued.

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

__all__ = ["RedisWriter", "QUEUE_MAX_LEN"]

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

    async def _write(self, ops: list[tuple]) -> None:
        for attempt in range(self.retries):
            pipe = self.client.pipeline(transaction=False)
            for op in ops:
                if op[0] == "push":
                    pipe.lpush(op[1], op[2])
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
