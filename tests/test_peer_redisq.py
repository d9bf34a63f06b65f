"""rmb_peer.redisq against a real Redis: the batched writer keeps per-queue FIFO order and the
trim bound when pushes are merged into one LPUSH, and the QueueReader drains bursts in order
across its BRPOP/RPOP-COUNT modes."""
from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from rmb_peer.redisq import QueueReader, RedisLink, RedisWriter


async def test_writer_merges_pushes_but_keeps_order_trim_and_sets(redis_url):
    r = aioredis.Redis.from_url(redis_url)
    writer = RedisWriter(r, max_len=50)
    writer.start()
    for i in range(120):   # interleaved queues and SETs, all in one or a few pipelines
        writer.push("q.a", f"a{i}".encode())
        if i % 3 == 0:
            writer.push("q.b", f"b{i}".encode())
        if i % 10 == 0:
            writer.set(f"k{i}", f"v{i}".encode(), ttl=60)
    await writer.flush()
    # consumers RPOP: oldest first; LTRIM kept the newest max_len
    a = [x.decode() for x in reversed(await r.lrange("q.a", 0, -1))]
    assert a == [f"a{i}" for i in range(70, 120)]
    b = [x.decode() for x in reversed(await r.lrange("q.b", 0, -1))]
    assert b == [f"b{i}" for i in range(0, 120, 3)]
    assert await r.get("k110") == b"v110" and 0 < await r.ttl("k110") <= 60
    assert writer.written == 120 + 40 + 12
    await writer.close()
    await r.aclose()


async def test_reader_drains_bursts_in_order_and_blocks_when_idle(redis_url):
    r = aioredis.Redis.from_url(redis_url)
    reader = QueueReader(r, ["q.1", "q.2"], count=7, timeout=0.2)
    assert await reader.read() == []            # idle: BRPOP timed out
    for i in range(30):
        await r.lpush("q.1", f"x{i}")
    await r.lpush("q.2", "y0")
    got: list[tuple[bytes, bytes]] = []
    while len(got) < 31:
        items = await asyncio.wait_for(reader.read(), 5)
        assert items, "a non-empty queue must not time out"
        got.extend(items)
    assert [v.decode() for k, v in got if k == b"q.1"] == [f"x{i}" for i in range(30)]
    assert [v for k, v in got if k == b"q.2"] == [b"y0"]
    assert await reader.read() == []            # drained: back to BRPOP, which times out

    async def push_later():
        await asyncio.sleep(0.05)
        await r.lpush("q.2", "late")
    task = asyncio.get_running_loop().create_task(push_later())
    reader.timeout = 2
    assert await reader.read() == [(b"q.2", b"late")]   # BRPOP woke on the push
    await task
    await r.aclose()


async def test_refused_command_is_reported_others_run_and_link_reconnects(redis_url):
    from redis.exceptions import RedisError, ResponseError
    r = aioredis.Redis.from_url(redis_url)
    await r.set("not.a.list", b"x")
    failures: list[tuple[Exception, int]] = []
    writer = RedisWriter(r, on_error=lambda exc, n: failures.append((exc, n)))
    writer.start()
    writer.push("q.ok", b"1")
    writer.push("not.a.list", b"2")       # WRONGTYPE: refused by Redis, not retried
    writer.push("q.ok", b"3")
    await writer.flush()
    assert await r.lrange("q.ok", 0, -1) == [b"3", b"1"]
    assert len(failures) == 1 and isinstance(failures[0][0], ResponseError)
    reader = QueueReader(r, ["not.a.list"], timeout=0.2)
    try:
        await reader.read()
        raise AssertionError("reading a string key must raise")
    except RedisError:
        pass
    # the server drops the link's connection: run() raises once, then reconnects
    link = RedisLink(r)
    [cid] = await link.run([("CLIENT", "ID")])
    await r.execute_command("CLIENT", "KILL", "ID", cid)
    try:
        await link.run([("LPUSH", "q.ok", b"4")])
    except RedisError:
        await link.run([("LPUSH", "q.ok", b"4")])
    assert await r.lindex("q.ok", 0) == b"4"
    await link.close()
    await reader.close()
    await writer.close()
    await r.aclose()


async def test_writer_merges_dels_but_keeps_set_del_order_per_key(redis_url):
    """DELs in one pipeline become one DEL command, except where a key was SET after the
    merged DEL's position: the key's SET and DEL keep their order (a request that finished
    in the same batch it started in leaves no backlog record)."""
    ops = [("del", "a"), ("set", "b", b"1", 60), ("del", "c"), ("del", "b"),
           ("set", "a", b"2", 60), ("del", "d")]
    grouped = RedisWriter._group(ops)
    assert grouped == [("del", ["a", "c"]), ("set", "b", b"1", 60), ("del", ["b", "d"]),
                       ("set", "a", b"2", 60)]
    r = aioredis.Redis.from_url(redis_url)
    for key in ("a", "c", "d"):
        await r.set(key, b"old")
    writer = RedisWriter(r)
    writer.start()
    for op in ops:
        if op[0] == "del":
            writer.delete(op[1])
        else:
            writer.set(op[1], op[2], ttl=op[3])
    await writer.flush()
    assert await r.get("a") == b"2" and await r.get("b") is None
    assert await r.get("c") is None and await r.get("d") is None
    await writer.close()
    await r.aclose()


async def test_link_reads_no_reply_between_reply_off_and_on(redis_url):
    """RedisLink.run: the commands from REPLY_OFF to REPLY_ON are executed without a reply
    (None in their place), the connection answers again after REPLY_ON; a refused command
    after the silent run is still reported. The commands are packed as redis-py packs them."""
    from redis.asyncio.connection import Connection
    from redis.exceptions import ResponseError

    from daemon_runtime.redislink import REPLY_OFF, REPLY_ON, _pack_command
    r = aioredis.Redis.from_url(redis_url)
    await r.set("str.key", b"x")
    link = RedisLink(r)
    replies = await asyncio.wait_for(link.run([
        ("SET", "k.a", b"1"), REPLY_OFF, ("SET", "k.b", b"2", "EX", 60), ("SET", "k.c", 3),
        REPLY_ON, ("GET", "k.b"), ("LPUSH", "str.key", b"v"), ("GET", "k.c")]), 5)
    assert replies[:5] == [b"OK", None, None, None, b"OK"]
    assert replies[5] == b"2" and isinstance(replies[6], ResponseError) and replies[7] == b"3"
    assert await link.run([("GET", "k.a")]) == [b"1"]       # same connection, replies on
    assert 0 < await r.ttl("k.b") <= 60
    if _pack_command is not None:
        conn = Connection()
        for cmd in [("BRPOP", "a", "b", 0.5), ("SET", "k", b"\x00\xff", "EX", 30),
                    ("LTRIM", "q", 0, 9999), ("LPUSH", "q", "é", b"v", 1e20), REPLY_OFF]:
            assert _pack_command(cmd) == b"".join(conn.pack_command(*cmd))
    await link.close()
    await r.aclose()


async def test_writer_sends_runs_of_sets_without_replies(redis_url):
    """Two or more SETs in a row go between REPLY_OFF and REPLY_ON (one backlog SET per app
    request no longer costs a reply each); a lone SET is sent as it is; everything is
    written, in order per key, and a refused push is still reported."""
    from rmb_peer.redisq import REPLY_OFF, REPLY_ON
    r = aioredis.Redis.from_url(redis_url)
    writer = RedisWriter(r)
    ops = [("set", "a", b"1", 60), ("set", "b", b"2", 60), ("push", "q", b"x"),
           ("set", "c", b"3", 60), ("del", "a")]
    assert writer._commands(ops) == [
        REPLY_OFF, ("SET", "a", b"1", "EX", 60), ("SET", "b", b"2", "EX", 60), REPLY_ON,
        ("LPUSH", "q", b"x"), ("LTRIM", "q", 0, 9999), ("SET", "c", b"3", "EX", 60),
        ("DEL", "a")]
    await r.set("not.a.list", b"x")
    failures: list = []
    writer.on_error = lambda exc, n: failures.append((exc, n))
    writer.start()
    for i in range(200):
        writer.set(f"bl.{i}", f"v{i}".encode(), ttl=30)
        if i % 50 == 49:
            writer.push("not.a.list", b"refused")
            writer.delete(f"bl.{i - 1}")
    await writer.flush()
    assert [await r.get(f"bl.{i}") for i in (0, 47, 49, 199)] == [b"v0", b"v47", b"v49", b"v199"]
    assert await r.get("bl.48") is None and 0 < await r.ttl("bl.199") <= 30
    assert failures and all("WRONGTYPE" in str(exc) for exc, _ in failures)
    assert writer.written == 200 + 4 + 4
    assert await writer._link.run([("PING",)]) == [b"PONG"]   # the link answers again
    await writer.close()
    await r.aclose()


async def test_writer_on_a_server_that_refuses_client_reply_reads_every_reply(redis_url):
    """A connection whose user may not run CLIENT (ACL -client; a proxy or Redis < 3.2 refuse
    it too) gets an error for CLIENT REPLY OFF and then a reply for every SET: RedisLink
    probes each new connection and there sends no REPLY_OFF/ON and reads every reply, so
    replies stay aligned with their commands (a refused push is still reported, later
    commands answer with their own replies). The default user honours them."""
    from urllib.parse import urlsplit, urlunsplit

    from rmb_peer.redisq import REPLY_OFF, REPLY_ON
    admin = aioredis.Redis.from_url(redis_url)
    await admin.execute_command("ACL", "SETUSER", "noclient", "on", ">pw", "~*", "&*", "+@all", "-client")
    parts = urlsplit(redis_url)
    url = urlunsplit(parts._replace(netloc=f"noclient:pw@{parts.hostname}:{parts.port}"))
    r = aioredis.Redis.from_url(url)
    try:
        link = RedisLink(r)
        replies = await asyncio.wait_for(link.run([
            REPLY_OFF, ("SET", "n.a", b"1"), ("SET", "n.b", b"2"), REPLY_ON, ("GET", "n.a")]), 5)
        assert link.reply_off is False
        assert replies == [None, b"OK", b"OK", None, b"1"]
        assert await link.run([("GET", "n.b")]) == [b"2"]
        await link.close()
        await admin.set("n.str", b"x")
        failures: list = []
        writer = RedisWriter(r, on_error=lambda exc, n: failures.append((exc, n)))
        writer.start()
        for i in range(100):
            writer.set(f"nb.{i}", f"v{i}".encode(), ttl=30)
            if i % 50 == 49:
                writer.push("n.str", b"refused")
        await writer.flush()
        assert [await admin.get(f"nb.{i}") for i in (0, 99)] == [b"v0", b"v99"]
        assert failures and all("WRONGTYPE" in str(exc) for exc, _ in failures)
        assert writer._link.reply_off is False
        assert await writer._link.run([("PING",)]) == [b"PONG"]
        await writer.close()
        ok = RedisLink(admin)
        assert await ok.run([("PING",)]) == [b"PONG"] and ok.reply_off is True
        await ok.close()
    finally:
        await r.aclose()
        await admin.execute_command("ACL", "DELUSER", "noclient")
        await admin.aclose()
