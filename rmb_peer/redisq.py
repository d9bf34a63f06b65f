"""Batched Redis writes for rmb-peer and its apps (DESIGN.md section 3: every push is LPUSH
then LTRIM 0 9999).

`RedisWriter` collects pushes, SET EX and DEL in call order and writes them in pipelines
(no MULTI) from one background task, so a burst of N pushes costs one round trip instead of
2N. Within one pipeline, all pushes to one queue become ONE `LPUSH queue v1 v2 ...` (Redis
pushes the values left to right, so the consumer's RPOP/BRPOP still sees them in call
order) followed by ONE `LTRIM queue 0 max_len-1` (same end state as trimming after every
push); the command sits where the queue's first push was. DELs become one `DEL k1 k2 ...`
where the first of them was, unless a key was SET after that point (then a new DEL starts
there), so one reply per pipeline instead of one per finished request. Two or more SETs in
a row are sent between `CLIENT REPLY OFF` and `CLIENT REPLY ON` (Redis >= 3.2): Redis
executes them as ever but answers none of them, so the pipeline's replies are one per
queue and DEL, not one per request (reading a reply costs ~5 us of CPU in redis-py; a
backlog SET per app request was the peer's largest Redis cost). What that gives up: a SET
Redis refuses there is not reported by itself; the refusals that apply to a SET (OOM,
READONLY, MISCONF, NOPERM) apply to the pushes and the DEL around it, which are. A server
that refuses CLIENT REPLY (an ACL without +client, a proxy) is found by RedisLink's probe
of each connection; there every SET is answered and read as before. Order is preserved
per key:
operations on one key are executed in the order they were queued (operations on different
keys within one pipeline may be regrouped; they are sent together anyway).

    writer = RedisWriter(redis_client)         # redis.asyncio.Redis
    writer.start()
    writer.push("msgbus.system.local", payload) # bytes; LPUSH + LTRIM 0 max_len-1
    writer.set("msgbus.backlog.<uid>", record, ttl=60)
    await writer.flush()                        # everything queued so far is written
    await writer.close()

A Redis that accepts the connection but does not answer (SIGSTOPped, swapping, a full
disk behind appendfsync always) is waited for, not given up on: nothing queued is dropped
by a timeout. What the writer offers instead is visibility and a bound: `pending` (queued
plus in-flight operations), `write_wait(now)` (seconds the oldest unfinished pipeline has
waited) for the daemon's health, metrics and stall log line, and `full` / `room()`: at
`max_pending` queued operations the producers stop taking input (rmb-peer stops reading
its relay connections and local queues, so TCP flow control holds the traffic upstream,
where the relay's bounded queues report what they refuse) until the backlog is below
max_pending again. A Redis that refuses or drops the connection is a failure: retried,
then the pipeline's operations are dropped and reported through on_error (as is a backlog
that close() could not write in its time).
"""
from __future__ import annotations

import asyncio
from typing import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from daemon_runtime.redislink import REPLY_OFF, REPLY_ON, RedisLink


__all__ = ["RedisWriter", "QueueReader", "RedisLink", "QUEUE_MAX_LEN", "MAX_PENDING", "REPLY_OFF", "REPLY_ON"]

#: Queues are trimmed to this many entries (LTRIM 0 QUEUE_MAX_LEN-1).
QUEUE_MAX_LEN = 10000
#: Operations per pipeline, at most.
BATCH = 512
#: Pending operations (queued + in flight) at which RedisWriter.full turns True.
MAX_PENDING = 65536


class RedisWriter:
    """Pipelines LPUSH+LTRIM / SET EX / DEL from one task. `on_error(exc, n_ops)` is called
    when a pipeline fails after `retries` attempts (the operations are then dropped: the
    caller logs it once); a daemon never stops on a Redis error. max_pending: operations
    (queued + in flight) at which `full` turns True and room() waits (a soft bound: the
    producers check it between slices of input; see the module docstring)."""

    def __init__(self, client: aioredis.Redis, max_len: int = QUEUE_MAX_LEN,
                 on_error: Callable[[Exception, int], None] | None = None, retries: int = 3,
                 max_pending: int = MAX_PENDING):
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, not {max_pending}")
        self.client = client
        self.max_len = max_len
        self.on_error = on_error
        self.retries = retries
        self.max_pending = max_pending
        self._ops: list[tuple] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._room = asyncio.Event()       # set while pending < max_pending
        self._room.set()
        self._in_flight = 0
        #: loop time (s) the pipeline in flight was taken (None: nothing in flight)
        self.in_flight_since: float | None = None
        self._task: asyncio.Task | None = None
        self._link = RedisLink(client)
        self.written = 0

    @property
    def pending(self) -> int:
        """Operations queued or in flight (not yet written nor dropped)."""
        return len(self._ops) + self._in_flight

    def write_wait(self, now: float) -> float:
        """Seconds (loop time `now`) the pipeline in flight has waited for Redis; 0.0 when
        none is in flight."""
        since = self.in_flight_since
        return 0.0 if since is None else max(0.0, now - since)

    async def room(self) -> None:
        """Return once fewer than max_pending operations are pending."""
        await self._room.wait()

    @property
    def full(self) -> bool:
        """True while max_pending or more operations are pending (producers await room())."""
        return not self._room.is_set()

    def _check_room(self) -> None:
        if self.pending >= self.max_pending:
            self._room.clear()
        else:
            self._room.set()

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
        if self._room.is_set() and self.pending >= self.max_pending:
            self._room.clear()

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
                self._in_flight = len(ops)
                self.in_flight_since = asyncio.get_running_loop().time()
                try:
                    await self._write(ops)
                finally:
                    self._in_flight = 0
                    self.in_flight_since = None
                    self._check_room()
            if not self._ops:
                self._idle.set()

    @staticmethod
    def _group(ops: list[tuple]) -> list[tuple]:
        """Pushes to one queue merged into one ("lpush", queue, [values]) at the position of
        the queue's first push; DELs merged into ("del", [keys]) at the position of the
        first DEL, a new group starting when a key was SET after that position (so a
        key's SET and DEL keep their order); SETs unchanged, in order."""
        out: list = []
        pushes: dict[str, list[bytes]] = {}
        dels: list[str] | None = None
        set_since: set[str] = set()
        for op in ops:
            kind = op[0]
            if kind == "push":
                values = pushes.get(op[1])
                if values is None:
                    values = pushes[op[1]] = []
                    out.append(("lpush", op[1], values))
                values.append(op[2])
            elif kind == "del":
                if dels is None or op[1] in set_since:
                    dels = []
                    set_since = set()
                    out.append(("del", dels))
                dels.append(op[1])
            else:
                if dels is not None:
                    set_since.add(op[1])
                out.append(op)
        return out

    def _commands(self, ops: list[tuple]) -> list[tuple]:
        """The pipeline's Redis commands for `ops` (see _group), runs of two or more SETs
        between REPLY_OFF and REPLY_ON."""
        commands: list[tuple] = []
        grouped = self._group(ops)
        last = len(grouped) - 1
        silent = False          # inside CLIENT REPLY OFF (see the module docstring)
        for i, op in enumerate(grouped):
            kind = op[0]
            if kind == "set":
                if not silent and i < last and grouped[i + 1][0] == "set":
                    commands.append(REPLY_OFF)
                    silent = True
                commands.append(("SET", op[1], op[2], "EX", op[3]))
                continue
            if silent:
                commands.append(REPLY_ON)
                silent = False
            if kind == "lpush":
                commands.append(("LPUSH", op[1], *op[2]))
                commands.append(("LTRIM", op[1], 0, self.max_len - 1))
            else:
                commands.append(("DEL", *op[1]))
        if silent:
            commands.append(REPLY_ON)
        return commands

    async def _write(self, ops: list[tuple]) -> None:
        commands = self._commands(ops)
        for attempt in range(self.retries):
            try:
                replies = await self._link.run(commands)
            except (RedisError, OSError) as exc:   # connection-level: retried, then dropped
                if attempt == self.retries - 1:
                    if self.on_error is not None:
                        self.on_error(exc, len(ops))
                    return
                await asyncio.sleep(0.2 * (attempt + 1))
                continue
            self.written += len(ops)
            errors = [r for r in replies if isinstance(r, ResponseError)]
            if errors and self.on_error is not None:   # executed, refused (e.g. WRONGTYPE)
                self.on_error(errors[0], len(errors))
            return

    async def close(self, timeout: float = 5.0) -> None:
        """Flush for at most `timeout` s, then stop the background task; what could not be
        written by then is reported through on_error (TimeoutError, n operations)."""
        try:
            await asyncio.wait_for(self.flush(), timeout=timeout)
        except asyncio.TimeoutError:
            if self.on_error is not None and self.pending:
                self.on_error(TimeoutError(f"Redis did not take the last writes within "
                                           f"{timeout:g} s of shutdown"), self.pending)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        await self._link.close()


class QueueReader:
    """Consumer of one or more Redis lists (the rmb-peer queues are LPUSHed, so RPOP takes
    the oldest first) with ONE round trip per batch, at any load: every read() sends

        BRPOP key1 key2 ... timeout ; RPOP key1 count ; RPOP key2 count ; ...

    in one packet on the reader's own connection. Redis serves a client's pipelined
    commands in order and holds the ones behind a blocked BRPOP until it is served, so the
    RPOPs run right after the BRPOP returned and bring the rest of the burst along: an idle
    reader blocks (up to `timeout` s), a single message costs one round trip (not BRPOP and
    then an RPOP that comes back empty), and a burst comes back whole (up to 1 + count per
    key).

        reader = QueueReader(redis_client, ["msgbus.system.local", "msgbus.system.reply"])
        items = await reader.read()   # [(key bytes, value bytes), ...] in order per key; []
                                      # after a timeout
        await reader.close()

    Raises what redis.asyncio raises (RedisError, OSError; ResponseError for a key that is
    not a list); the caller backs off.
    """

    def __init__(self, client: aioredis.Redis, keys: list[str], count: int = 256,
                 timeout: float = 1.0):
        self.client = client
        self.keys = list(keys)
        self._bkeys = [k.encode() for k in self.keys]
        self.count = count
        self.timeout = timeout
        self._link = RedisLink(client)

    async def read(self) -> list[tuple[bytes, bytes]]:
        replies = await self._link.run([("BRPOP", *self.keys, self.timeout)]
                                       + [("RPOP", key, self.count) for key in self.keys])
        for reply in replies:
            if isinstance(reply, ResponseError):
                raise reply
        first = replies[0]
        items = [] if first is None else [(bytes(first[0]), first[1])]
        for bkey, values in zip(self._bkeys, replies[1:]):
            if values:
                items.extend((bkey, raw) for raw in values)
        return items

    async def close(self) -> None:
        """Give the reader's connection back to the pool."""
        await self._link.close()
