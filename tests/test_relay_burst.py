"""rmb-relay hot path under a burst: every envelope is delivered in order, the trace events
(one `forwarded` at info on this live local route) are logged for each, and the destination socket is never left
held back (rmb_relay.daemon write coalescing: the rest of a burst leaves in one transport
write at the end of the loop pass)."""
from __future__ import annotations

import asyncio

import pytest
from websockets.asyncio.client import connect

from tests.relay_harness import Cluster, envelope, recv_env, url


@pytest.fixture
async def cluster(redis_url):
    async with Cluster(redis_url) as c:
        yield c


async def test_burst_delivered_in_order_logged_and_uncorked(cluster):
    relay = await cluster.relay()
    ia, a = await cluster.twin([relay.domain])
    ib, b = await cluster.twin([relay.domain])
    async with connect(url(relay, ia, a), compression=None) as wa, \
            connect(url(relay, ib, b), compression=None) as wb:
        envs = [envelope((a,), (b,), payload=bytes([i % 256]) * 64) for i in range(300)]
        await asyncio.sleep(0.1)   # both connected, offline replay finished
        # one write: the relay reads many frames per chunk and writes them as one burst
        for env in envs:
            await wa.send(env.SerializeToString())
        got = [await recv_env(wb) for _ in envs]
        assert [g.uid for g in got] == [e.uid for e in envs]
        await asyncio.sleep(0.05)  # the relay's loop turned: the burst is over
        target = relay.table.get((b, None))
        assert target.transport is not None       # coalescing is on for this connection
        assert target.out is None                 # nothing held back after the pass
        # one more single envelope still arrives (nothing is held back)
        single = envelope((a,), (b,))
        await wa.send(single.SerializeToString())
        assert (await recv_env(wb, timeout=2)).uid == single.uid
    uids = {e.uid for e in envs}
    # the live local route logs ONE event per envelope, `forwarded`, at info
    events = [e for e in relay.test_events.of("rmb.relay.forwarded") if e["trace_id"] in uids]
    assert len(events) == len(envs) and {e["level"] for e in events} == {"info"}
    for name in ("rmb.relay.received", "rmb.relay.delivered"):
        assert not [e for e in relay.test_events.of(name) if e["trace_id"] in uids]
    forwarded = {e["trace_id"]: e["attrs"] for e in events}
    assert forwarded[envs[0].uid] == {"kind": "request", "src": str(a), "dst": str(b),
                                      "size": envs[0].ByteSize()}


async def test_held_back_frames_of_a_closed_connection_are_queued_and_replayed(cluster):
    """A frame held back for the end of the loop pass whose connection closed before the
    flush is not lost: it goes back to the core (write_failed), into the destination's
    offline queue, and is replayed, in order, when the twin reconnects; no `forwarded`
    event is logged for it (it was never written)."""
    from rmb_relay.core import Log, WriteFrame

    relay = await cluster.relay()
    ia, a = await cluster.twin([relay.domain])
    ib, b = await cluster.twin([relay.domain])
    envs = [envelope((a,), (b,), payload=bytes([i]) * 32) for i in range(3)]
    async with connect(url(relay, ib, b), compression=None) as wb:
        await asyncio.sleep(0.1)                  # connected, offline replay finished
        target = relay.table.get((b, None))
        # as _write leaves them in a burst: held back, the flush pending
        target.out = [WriteFrame(target, e.SerializeToString(), (b, None),
                                 Log("rmb.relay.forwarded", e.uid, "info",
                                     {"kind": "request", "src": str(a), "dst": str(b),
                                      "size": e.ByteSize()}))
                      for e in envs]
        target.out_bytes = sum(e.ByteSize() for e in envs)
        target.transport.close()                  # the connection is gone before the flush
        relay.writer.flush(target)
        assert target.out is None
    await asyncio.sleep(0.3)                      # the re-queue task ran
    uids = [e.uid for e in envs]
    assert not [e for e in relay.test_events.of("rmb.relay.forwarded") if e["trace_id"] in uids]
    queued = [e["trace_id"] for e in relay.test_events.of("rmb.relay.queued")
              if e["trace_id"] in uids]
    assert queued == uids
    async with connect(url(relay, ib, b), compression=None) as wb2:
        got = [await recv_env(wb2) for _ in envs]
    assert [g.uid for g in got] == uids


def test_eventlog_emit_many_lines_match_emit_attrs():
    """EventLog.emit_many (the relay logs the frames of one coalesced write with it): one
    line per event in order, the same fields and checks as emit_attrs, one shared ts;
    an invalid event raises before anything is written; below min_level is skipped."""
    import io

    import orjson

    from daemon_runtime.eventlog import EventLog, EventLogError
    from rmb_peer.events import RMB_EVENTS

    out = io.StringIO()
    log = EventLog("rmb-relay", "r.local", [RMB_EVENTS], sink=out)
    attrs = [{"kind": "request", "src": "1", "dst": "2", "size": n} for n in (10, 20, 30)]
    log.emit_many([("rmb.relay.forwarded", f"u{i}", "info", a) for i, a in enumerate(attrs)]
                  + [("rmb.relay.forwarded", "dbg", "debug", attrs[0])])
    log.emit_attrs("rmb.relay.forwarded", "single", "info", attrs[0])
    log.flush()
    lines = [orjson.loads(x) for x in out.getvalue().splitlines()]
    assert [x["trace_id"] for x in lines] == ["u0", "u1", "u2", "single"]
    assert [x["attrs"]["size"] for x in lines[:3]] == [10, 20, 30]
    assert len({x["ts"] for x in lines[:3]}) == 1
    assert [list(x) for x in lines] == [list(lines[3])] * 4      # same fields, same order
    assert {k: v for k, v in lines[0].items() if k not in ("ts", "trace_id", "attrs")} == \
        {k: v for k, v in lines[3].items() if k not in ("ts", "trace_id", "attrs")}
    with pytest.raises(EventLogError):
        log.emit_many([("rmb.relay.forwarded", "ok", "info", attrs[0]),
                       ("rmb.relay.forwarded", "bad", "info", {"size": "x"})])
    log.flush()
    assert len(out.getvalue().splitlines()) == 4                 # nothing of the bad batch
