"""The relay's Redis side: the offline queue (one stream per (twin, sid)) and the
federation outbox, executing RelayCore's Enqueue, ReadQueue, AckQueue and ProbeQueue
commands (DESIGN.md section 3: "queue for ~1 h, replay on reconnect"; seed: rmb.md "Peer").

Stream key `rmb.relay.<first domain>.queue.<twin>[:<sid>]`, entry fields e (envelope),
d (deadline, unix s), t (queued at), s (sender twin); `<key>:src` counts entries per
sender (--queue-per-source). Every command waits at most --redis-timeout s (`call`):
past it Redis is marked down (/health, rmb_relay_redis_down_seconds) and queue commands
fail at once until a PING is answered again (rmb.relay.redis_recovered).
`OfflineQueue(relay)` uses relay.redis, relay.core (through relay.runner: feed / execute),
relay.events, relay.metrics and relay._warn.
"""
from __future__ import annotations

import asyncio
import traceback

import redis.asyncio as aioredis

from rmb_peer.envelope import Envelope
from rmb_relay.core import AckQueue, Enqueue, ReadQueue, Session, session_str

__all__ = ["OfflineQueue", "QUEUED", "FULL", "FAILED", "SHARE_FULL"]

#: offline-queue outcomes of _enqueue / _deliver
QUEUED, FULL, FAILED, SHARE_FULL = "queued", "full", "failed", "share"

#: XADD only below the cap: a full queue refuses the new envelope instead of trimming the
#: oldest (XADD MAXLEN did that silently). Returns the new length or -1.
#: A second bound per sender twin (KEYS[2]: hash sender -> entries it has in the stream):
#: one sender cannot take more than --queue-per-source entries of a twin's queue, so it
#: cannot crowd the others out either (-2).
_ENQUEUE_LUA = """
local n = redis.call('XLEN', KEYS[1])
if n >= tonumber(ARGV[1]) then return -1 end
local c = tonumber(redis.call('HGET', KEYS[2], ARGV[6]) or '0')
if c >= tonumber(ARGV[7]) then return -2 end
redis.call('XADD', KEYS[1], '*', 'e', ARGV[2], 'd', ARGV[3], 't', ARGV[4], 's', ARGV[6])
redis.call('HINCRBY', KEYS[2], ARGV[6], 1)
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[5])
return n + 1
"""


def _lenient_decode(data: bytes) -> Envelope | None:
    """Best-effort decode of bytes parse_envelope refused, to answer with a relay error
    (same uid) instead of closing. None when they do not decode or carry no uid."""
    env = Envelope()
    try:
        env.ParseFromString(bytes(data))
    except Exception:  # noqa: BLE001 - any decode failure means "not an envelope"
        return None
    if not env.uid:
        return None
    return env


class OfflineQueue:
    """See the module doc. prefix: the stream key prefix; down_since: loop time Redis
    first did not answer within --redis-timeout (None while it answers)."""

    def __init__(self, relay) -> None:
        self.relay = relay
        self.prefix = f"rmb.relay.{relay.domains[0]}.queue."
        self.down_since: float | None = None
        self._script = relay.redis.register_script(_ENQUEUE_LUA)

    async def call(self, awaitable):
        """Await an offline-queue Redis command for at most --redis-timeout s. Raises
        TimeoutError (builtin) when Redis did not answer: Redis is then marked down (every
        queue command fails at once, no waiting) until a probe's PING is answered, logged
        as rmb.relay.redis_recovered. Redis's own errors (RedisError, OSError) pass through."""
        if self.down_since is not None:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
            raise TimeoutError(f"Redis at {self.relay.redis_url} has not answered for "
                               f"{asyncio.get_running_loop().time() - self.down_since:.0f} s")
        try:
            async with asyncio.timeout(self.relay.redis_timeout):
                return await awaitable
        except TimeoutError:
            if self.down_since is None:
                self.down_since = asyncio.get_running_loop().time()
                self.relay._spawn(self._probe_loop(), "Redis probe")
            raise TimeoutError(f"Redis at {self.relay.redis_url} did not answer within "
                               f"{self.relay.redis_timeout:g} s (--redis-timeout)") from None

    async def _probe_loop(self) -> None:
        """PING Redis once a second (each bounded by --redis-timeout) until it answers."""
        loop = asyncio.get_running_loop()
        while not self.relay._closing:
            await asyncio.sleep(1.0)
            try:
                async with asyncio.timeout(self.relay.redis_timeout):
                    await self.relay.redis.ping()
            except (TimeoutError, aioredis.RedisError, OSError):
                continue
            down_s = loop.time() - self.down_since
            self.down_since = None
            self.relay.events.emit("rmb.relay.redis_recovered", None, level="warning",
                             redis=self.relay.redis_url, down_s=round(down_s, 3))
            return

    @property
    def fedkey(self) -> str:
        return f"rmb.relay.{self.relay.domains[0]}.federation"

    async def save_federation(self) -> int:
        """Writes every pending federation job to the outbox stream (envelope bytes, twin
        relay domains, sender session, deadline); restore_federation() resumes them.
        Returns the number saved; on a Redis error each job is logged as expired."""
        jobs = list(self.relay.federation._jobs.values())
        self.relay.federation._jobs.clear()
        if not jobs:
            return 0
        try:
            async with self.relay.redis.pipeline(transaction=True) as pipe:
                for job in jobs:
                    pipe.xadd(self.fedkey, {
                        "e": job.data, "d": ",".join(job.domains), "u": repr(job.deadline),
                        "c": session_str(job.context) if isinstance(job.context, tuple) else ""})
                pipe.expire(self.fedkey, int(self.relay.queue_ttl) + 1)
                await pipe.execute()
        except (aioredis.RedisError, OSError) as exc:
            for job in jobs:
                self.relay.events.emit("rmb.relay.expired", job.env.uid, level="error", dst="",
                                 reason=f"relay shut down before federation and the outbox "
                                        f"failed: {exc!r}"[:200])
            return 0
        self.relay.metrics.fed_saved.inc(len(jobs))
        for job in jobs:          # per envelope: its sender's trace says where it waits
            self.relay.events.emit(
                "rmb.relay.federation_saved", job.env.uid, level="warning",
                dst=f"{job.env.destination.twin}", domain=",".join(job.domains)[:200],
                reason=f"not federated within --grace; waits in {self.fedkey} for this "
                       f"relay's next start")
        self.relay.events.emit("rmb.relay.federation_outbox", None, level="warning",
                               count=len(jobs), reason="saved at shutdown")
        return len(jobs)

    async def restore_federation(self) -> int:
        """Resumes the federation jobs a previous run saved at shutdown (start() calls it):
        each envelope still before its deadline is planned again for its relays and the
        outbox is emptied. Returns the number resumed."""
        try:
            entries = await self.relay.redis.xrange(self.fedkey, "-", "+")
        except (aioredis.RedisError, OSError) as exc:
            self.relay._warn("federation outbox", "rmb.relay.queue_error", None, level="error",
                       dst=self.fedkey, reason=f"federation outbox unreadable: {exc!r}"[:200])
            return 0
        if not entries:
            return 0
        now = self.relay.clock()
        resumed = 0
        for _entry_id, fields in entries:
            try:                                   # the queue item guard
                data = fields[b"e"]
                domains = [d for d in fields[b"d"].decode().split(",") if d]
                until = float(fields[b"u"])
                ctx = fields.get(b"c", b"").decode()
                env = _lenient_decode(data)
                if env is None or not domains:
                    raise ValueError("not an envelope with relays")
                context: Session | None = None
                if ctx:
                    twin, _, sid = ctx.partition(":")
                    context = (int(twin), sid or None)
            except (KeyError, ValueError, UnicodeDecodeError) as exc:
                self.relay.guard.bug(exc, f"federation outbox entry {_entry_id!r}")
                continue
            if until <= now:
                self.relay.metrics.expired.inc()
                self.relay.events.emit("rmb.relay.expired", env.uid, level="warning", dst="",
                                 reason="expired in the federation outbox")
                continue
            if self.relay.federation.submit(env, data, domains, now, context=context) is not None:
                resumed += 1
            else:
                self.relay.events.emit("rmb.relay.expired", env.uid, level="warning", dst="",
                                 reason=f"federation outbox: {self.relay.federation.refusal}")
        await self.relay.redis.delete(self.fedkey)
        self.relay.events.emit("rmb.relay.federation_outbox", None, count=resumed,
                         reason="resumed at start")
        self.relay.runner.feed(self.relay.core.handle_timer)        # dispatch the attempts due
        await self.relay.runner.execute()
        return resumed

    def key(self, session: Session) -> str:
        return self.prefix + session_str(session)

    async def enqueue(self, cmd: Enqueue, via: str = "peer") -> str:
        """Enqueue executor: XADD to the session's offline stream unless it holds
        --queue-maxlen entries. Returns QUEUED, FULL (nothing evicted; counted) or FAILED
        (Redis error, logged)."""
        now = self.relay.clock()
        try:
            length = await self.call(self._script(
                keys=[self.key(cmd.session), self.key(cmd.session) + ":src"],
                args=[self.relay.queue_maxlen, cmd.data, repr(cmd.until), repr(now),
                      int(self.relay.queue_ttl) + 1, cmd.src.split(":")[0], self.relay.queue_per_source]))
        except TimeoutError as exc:
            self.relay.metrics.queue_failed.labels("timeout").inc()
            self.relay._warn("queue error: Redis not answering", "rmb.relay.queue_error", cmd.uid,
                       level="error", dst=session_str(cmd.session), reason=str(exc)[:200])
            return FAILED
        except (aioredis.RedisError, OSError) as exc:
            self.relay.metrics.queue_failed.labels("error").inc()
            self.relay._warn("queue error", "rmb.relay.queue_error", cmd.uid, level="error",
                       dst=session_str(cmd.session), reason=repr(exc)[:200])
            return FAILED
        if int(length) == -2:
            self.relay.metrics.queue_full.labels(via).inc()
            return SHARE_FULL
        if int(length) < 0:
            self.relay.metrics.queue_full.labels(via).inc()
            return FULL
        return QUEUED

    async def read(self, cmd: ReadQueue) -> None:
        """ReadQueue executor (a task per batch; the peer's replay_task)."""
        peer = cmd.conn
        if peer.ws.closed:
            return
        try:
            entries = await self.call(self.relay.redis.xrange(self.key(cmd.session), "-",
                                                               "+", count=cmd.count))
        except asyncio.CancelledError as exc:
            # the connection closed: the frames the cancellation unwound (Redis client,
            # asyncio.timeout) hold the error in their locals, a cycle error -> traceback
            # -> frame -> error that would keep this peer until a cyclic GC pass. This
            # frame is executing and so is not cleared, yet it is in the error's traceback
            # too: it lets go of the command and its connection itself.
            traceback.clear_frames(exc.__traceback__)
            del cmd, peer
            raise
        except (TimeoutError, aioredis.RedisError, OSError) as exc:
            self.relay.runner.feed(self.relay.core.queue_failed, peer, repr(exc))
        else:
            self.relay.runner.feed(self.relay.core.queue_read, peer, entries)
        await self.relay.runner.execute()

    async def ack(self, cmd: AckQueue) -> None:
        """AckQueue executor: XDEL and the per-sender counts in one transaction."""
        key = self.key(cmd.session)
        try:
            async with self.relay.redis.pipeline(transaction=True) as pipe:
                pipe.xdel(key, *cmd.ids)
                for sender, count in cmd.senders.items():
                    pipe.hincrby(key + ":src", sender, -count)
                await self.call(pipe.execute())
        except asyncio.CancelledError as exc:
            traceback.clear_frames(exc.__traceback__)
            del cmd                        # as in read(): this frame is in the traceback
            raise
        except (TimeoutError, aioredis.RedisError, OSError) as exc:
            self.relay.runner.feed(self.relay.core.queue_failed, cmd.conn, repr(exc))
        else:
            self.relay.runner.feed(self.relay.core.queue_acked, cmd.conn, cmd.more)

    async def probe(self) -> None:
        """ProbeQueue executor: PING Redis (bounded by --redis-timeout); not a routing task
        (close() cancels it instead of waiting for it)."""
        ok = False
        if self.down_since is None:     # else the Redis probe is waiting on it already
            try:
                async with asyncio.timeout(self.relay.redis_timeout):
                    await self.relay.redis.ping()
                ok = True
            except (TimeoutError, aioredis.RedisError, OSError):
                pass
        self.relay.runner.feed(self.relay.core.queue_probed, ok)
        await self.relay.runner.execute()
