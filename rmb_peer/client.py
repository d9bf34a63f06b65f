"""The app side of rmb-peer: call remote twins and serve commands through the local peer's
Redis queues (DESIGN.md section 3, "rmb-peer Redis protocol"; seed: rmb.md, "rmb-peer
message types").

    client = RmbClient("redis://127.0.0.1:6379/0")
    replies = await client.call([7, 9], "calc.add", b"[1,2]", ttl=60)   # one Reply per twin
    await client.close()

    service = RmbService("redis://127.0.0.1:6379/0", "calc")
    @service.handler("calc.add")
    async def add(data: bytes) -> bytes: ...
    await service.run(stop_event)

RmbClient pushes requests to `msgbus.system.local` with a `ref` (the caller's, e.g.
`call(..., ref=my_id)`, else a fresh UUIDv4) and its own return queue
`msgbus.client.<uuid>`; one reader task BRPOPs that queue and resolves calls by `ref`; every
Reply carries that `ref`. Semantics as rmb-rs (src/peer/storage: JsonOutgoingRequest `ref`
is an optional free string the peer keeps in its backlog record, field `reference`, and
echoes as `ref` in each reply; the envelope uid is the peer's). This suite's rmb-peer uses a
UUID ref that is not in flight as the envelope uid (rmb_peer/core.py send_request), so with
a UUID ref, e.g. `new_uid()`, the caller knows the request's uid (the trace id of the
peer's and relays' events) before the request leaves the process; rmb-rs makes its own. RmbService BRPOPs `msgbus.<cmd>` for its commands and pushes replies to the
request's `ret` (msgbus.system.reply). Payloads are bytes; `dat` is standard base64.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
import uuid
from dataclasses import dataclass
from typing import Awaitable, Callable

import orjson
from redis.exceptions import RedisError

from daemon_runtime.redis_server import reconnecting_redis

from rmb_peer.core import ERR_BAD_PAYLOAD, ERR_EXPIRED, ERR_OTHER, LOCAL_QUEUE
from rmb_peer.envelope import MAX_ENVELOPE_SIZE, MAX_UID_LEN, new_uid
from rmb_peer.redisq import QueueReader, RedisWriter

__all__ = ["Reply", "RmbClient", "RmbService", "ServiceError", "CALL_GRACE",
           "MAX_REPLY_PAYLOAD"]

#: Seconds a call waits beyond its ttl for the peer's own expiry replies (102) before it
#: gives up on the peer (e.g. rmb-peer not running) and answers 102 itself.
CALL_GRACE = 5.0
DRAIN_COUNT = 256
#: Largest reply payload RmbService sends, bytes: the relay's envelope limit (1 MiB by
#: default) less room for the uid, addresses, signature, schema and the e2e nonce + tag.
#: A bigger reply becomes error 101 to the requester (the peer would refuse it too).
MAX_REPLY_PAYLOAD = MAX_ENVELOPE_SIZE - 4096


@dataclass
class Reply:
    """One reply to a call. src: "twin[:sid]" that answered (or the destination for
    peer-made errors); data: payload bytes; code/message: the error (None when ok):
    100..106/500 from the peer (DESIGN.md section 3), 102 on expiry, or the service's own."""
    src: str
    data: bytes
    code: int | None = None
    message: str | None = None
    schema: str | None = None
    #: the `ref` of the request this replies to (the caller's or the generated one)
    ref: str | None = None

    @property
    def ok(self) -> bool:
        return self.code is None


class ServiceError(Exception):
    """Raise from a handler to answer with a specific error code (default 500)."""

    def __init__(self, message: str, code: int = ERR_OTHER):
        super().__init__(message)
        self.code = code
        self.message = message


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _dumps(obj: dict) -> bytes:
    """Compact JSON bytes (orjson; the stdlib for what orjson refuses, e.g. ints > 64 bits)."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        return json.dumps(obj, separators=(",", ":")).encode()


def _time_out(future: asyncio.Future) -> None:
    if not future.done():
        future.set_exception(asyncio.TimeoutError())


class _Call:
    __slots__ = ("future", "expected", "replies", "dst")

    def __init__(self, expected: int, dst: list[int]):
        self.future: asyncio.Future = asyncio.get_running_loop().create_future()
        self.expected = expected
        self.replies: list[Reply] = []
        self.dst = dst


class RmbClient:
    """Async client of a local rmb-peer. redis_url: the peer's Redis (same database);
    log: an EventLog for rmb.app.* events (optional); name: the app's return-queue tag."""

    def __init__(self, redis_url: str, log=None, name: str = "app"):
        self.redis = reconnecting_redis(redis_url)      # rides out a Redis restart
        self.log = log
        self.ret = f"msgbus.client.{name}.{uuid.uuid4()}"
        self._calls: dict[str, _Call] = {}
        self._reader: asyncio.Task | None = None
        self._writer = RedisWriter(self.redis)
        self._closed = False

    async def call(self, dst: list[int] | int, cmd: str, data: bytes, ttl: int = 60,
                   tags: str | None = None, schema: str | None = None,
                   ref: str | None = None) -> list[Reply]:
        """Send `data` to every twin in `dst` as command `cmd`; wait for one Reply per
        destination (in arrival order), each with `ref` set. ttl: seconds (1..1800; 0
        means the peer's 300). ref: the request's reference, 1..MAX_UID_LEN (256) chars,
        unique among this client's calls in flight (default: a fresh UUIDv4); a UUID ref
        is the envelope uid with this suite's rmb-peer (module docstring).
        Never raises for remote failures: they are Replies with a code (102 when nothing
        came within ttl + CALL_GRACE s). Raises ValueError for bad arguments (a ref that
        is not such a string, or is in flight already) and redis errors when Redis is
        unreachable."""
        dsts = [dst] if isinstance(dst, int) else list(dst)
        if not dsts or not cmd:
            raise ValueError("call needs at least one destination and a command")
        if ref is None:
            ref = new_uid()
        elif not isinstance(ref, str) or not ref or len(ref) > MAX_UID_LEN:
            raise ValueError(f"ref must be a string of 1..{MAX_UID_LEN} chars, got {ref!r:.80}")
        elif ref in self._calls:
            raise ValueError(f"ref {ref!r:.80} is already in flight on this client")
        if self._closed:
            raise RuntimeError("client is closed")
        if self._reader is None or self._reader.done():
            self._writer.start()
            self._reader = asyncio.get_running_loop().create_task(self._read())
        call = _Call(len(dsts), dsts)
        self._calls[ref] = call
        started = time.monotonic()
        msg = {"ver": 1, "ref": ref, "cmd": cmd, "exp": int(ttl), "dat": _b64(bytes(data)),
               "tag": tags, "dst": dsts, "ret": self.ret, "shm": schema, "now": int(time.time())}
        self._writer.push(LOCAL_QUEUE, _dumps(msg))
        if self.log is not None:
            self.log.emit("rmb.app.requested", ref, cmd=cmd, dst=",".join(map(str, dsts)),
                          count=len(dsts), size=len(data), ttl=int(ttl))
        wait = (ttl if ttl > 0 else 300) + CALL_GRACE
        # a timer on the call's future instead of wait_for(shield(...)): no extra task per call
        timer = asyncio.get_running_loop().call_later(wait, _time_out, call.future)
        try:
            await call.future
        except asyncio.TimeoutError:
            answered = [r.src for r in call.replies]
            for d in dsts:
                if str(d) in answered:
                    answered.remove(str(d))
                    continue
                call.replies.append(Reply(str(d), b"", ERR_EXPIRED,
                                          "no reply within ttl (is rmb-peer running?)",
                                          ref=ref))
        finally:
            timer.cancel()
            self._calls.pop(ref, None)
        if self.log is not None:
            ms = (time.monotonic() - started) * 1000.0
            for r in call.replies:
                self.log.emit("rmb.app.replied", ref, src=r.src, code=r.code or 0,
                              size=len(r.data), duration_ms=ms)
        return call.replies

    async def _read(self) -> None:
        reader = QueueReader(self.redis, [self.ret], DRAIN_COUNT, timeout=1)
        try:
            while not self._closed:
                try:
                    items = await reader.read()
                except (RedisError, OSError):
                    await asyncio.sleep(0.5)
                    continue
                for _key, raw in items:
                    self._on_reply(raw)
        finally:
            await reader.close()

    def _on_reply(self, raw: bytes) -> None:
        try:
            obj = orjson.loads(raw)
            ref = obj.get("ref")
            call = self._calls.get(ref) if isinstance(ref, str) else None
            if call is None:
                return  # a late reply to a call that already gave up
            err = obj.get("err")
            try:
                data = base64.b64decode(obj.get("dat") or "", validate=True)
            except (binascii.Error, ValueError):
                data, err = b"", {"code": 101, "message": "reply payload is not base64"}
            reply = Reply(str(obj.get("src")), data,
                          int(err["code"]) if err else None,
                          str(err.get("message")) if err else None, obj.get("shm"), ref)
        except (ValueError, TypeError, KeyError, AttributeError):
            return  # not ours / garbage on our queue
        call.replies.append(reply)
        if len(call.replies) >= call.expected and not call.future.done():
            call.future.set_result(None)

    async def close(self) -> None:
        self._closed = True
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):
                pass
        await self._writer.close()
        await self.redis.aclose()

    async def __aenter__(self) -> "RmbClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


Handler = Callable[[bytes], Awaitable[bytes]]


class RmbService:
    """Serves commands behind a local rmb-peer. redis_url: the peer's Redis; name: the
    service name (event log `service`); log: EventLog for rmb.app.handled (optional);
    concurrency: handlers running at once; max_reply: largest reply payload, bytes (a
    handler returning more answers error 101 "reply too large" instead, logged at warning
    and counted in `refused`)."""

    def __init__(self, redis_url: str, name: str, log=None, concurrency: int = 64,
                 max_reply: int = MAX_REPLY_PAYLOAD):
        self.redis = reconnecting_redis(redis_url)
        self.name = name
        self.log = log
        self.handlers: dict[str, Handler] = {}
        self._sem = asyncio.Semaphore(concurrency)
        self._writer = RedisWriter(self.redis)
        self._tasks: set[asyncio.Task] = set()
        self.max_reply = max_reply
        #: requests handled (tests, metrics)
        self.handled = 0
        #: replies refused because they could not become valid envelopes
        self.refused = 0

    def handler(self, cmd: str) -> Callable[[Handler], Handler]:
        """Decorator: `@service.handler("calc.add") async def f(data: bytes) -> bytes`."""
        def register(fn: Handler) -> Handler:
            self.handlers[cmd] = fn
            return fn
        return register

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set; then finish running handlers and flush replies."""
        if not self.handlers:
            raise ValueError("no handlers registered")
        queues = ["msgbus." + cmd for cmd in self.handlers]
        reader = QueueReader(self.redis, queues, DRAIN_COUNT, timeout=0.5)
        self._writer.start()
        try:
            while not stop.is_set():
                try:
                    items = await reader.read()
                except (RedisError, OSError):
                    await asyncio.sleep(0.5)
                    continue
                for queue, raw in items:
                    await self._sem.acquire()
                    task = asyncio.get_running_loop().create_task(
                        self._handle(queue.decode()[len("msgbus."):], raw))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        finally:
            await reader.close()
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=5.0)
            await self._writer.close()
            await self.redis.aclose()

    async def _handle(self, cmd: str, raw: bytes) -> None:
        started = time.monotonic()
        try:
            try:
                req = orjson.loads(raw)
                ref, src, ret = req["ref"], req["src"], req.get("ret") or "msgbus.system.reply"
                if not isinstance(ref, str) or not isinstance(src, str) or not isinstance(ret, str):
                    raise TypeError("ref/src/ret must be strings")
                if not ref or len(ref) > MAX_UID_LEN:
                    raise ValueError("ref is no envelope uid")
            except (ValueError, TypeError, KeyError):
                return  # not a request the peer wrote: nobody to answer
            err = None
            out = b""
            try:
                data = base64.b64decode(req.get("dat") or "", validate=True)
                out = await self.handlers[cmd](data)
                if not isinstance(out, (bytes, bytearray)):
                    raise TypeError(f"handler returned {type(out).__name__}, not bytes")
            except ServiceError as exc:
                err = {"code": exc.code, "message": exc.message}
            except (binascii.Error, ValueError) as exc:
                err = {"code": 101, "message": f"bad payload: {exc}"}
            except Exception as exc:  # a handler bug answers 500; the service keeps serving
                err = {"code": ERR_OTHER, "message": f"{type(exc).__name__}: {exc}"[:1024]}
            if err is None and len(out) > self.max_reply:
                self.refused += 1
                err = {"code": ERR_BAD_PAYLOAD, "message": f"reply too large: {len(out)} "
                       f"bytes > {self.max_reply}"}
            elif err is not None and len(str(err.get("message"))) > 4096:
                err["message"] = str(err["message"])[:4096]
            reply = {"ver": 1, "ref": ref, "dat": "" if err else _b64(bytes(out)), "dst": src,
                     "shm": req.get("shm"), "now": int(time.time())}
            if err:
                reply["err"] = err
            self._writer.push(ret, _dumps(reply))
            self.handled += 1
            if self.log is not None:
                self.log.emit("rmb.app.handled", ref, cmd=cmd, src=src,
                              code=err["code"] if err else 0,
                              duration_ms=(time.monotonic() - started) * 1000.0)
        finally:
            self._sem.release()
