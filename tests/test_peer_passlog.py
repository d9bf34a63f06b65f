"""rmb-peer writes the event lines of one event-loop pass together (rmb_peer.daemon._PassLog):
each line is checked when emitted (an undeclared event or attribute raises at the caller,
a line below the level is dropped), the kept lines are written in emit order, with one
timestamp, once the loop runs again, and close() writes what is still held."""
from __future__ import annotations

import asyncio
import io

import orjson
import pytest

from daemon_runtime.eventlog import EventLog, EventLogError
from rmb_peer.daemon import _PassLog
from rmb_peer.events import RMB_EVENTS


def _lines(buf: io.StringIO) -> list[dict]:
    return [orjson.loads(line) for line in buf.getvalue().splitlines() if line]


async def test_lines_of_a_pass_are_written_together_in_order():
    buf = io.StringIO()
    log = _PassLog(EventLog("rmb-peer", "7", [RMB_EVENTS], sink=buf, min_level="info"),
                   asyncio.get_running_loop())
    log.emit("rmb.peer.delivered", "u1", cmd="a.b", src="3")
    log.emit("rmb.peer.received", "u0", "debug", kind="request", src="3", size=1, relay="r")
    log.emit("rmb.peer.answered", "u2", src="3", code=0)
    with pytest.raises(EventLogError):
        log.emit("rmb.peer.answered", "u3", src=3, code=0)       # mistyped: at once
    with pytest.raises(EventLogError):
        log.emit("rmb.peer.no_such_event", None)
    log.log.flush()
    assert _lines(buf) == []                 # held until the loop runs again
    await asyncio.sleep(0)
    log.log.flush()
    lines = _lines(buf)
    assert [(e["event"], e["trace_id"]) for e in lines] == [
        ("rmb.peer.delivered", "u1"), ("rmb.peer.answered", "u2")]   # debug dropped
    assert lines[0]["ts"] == lines[1]["ts"] and lines[0]["node"] == "7"
    assert lines[1]["attrs"] == {"src": "3", "code": 0}


async def test_close_writes_the_lines_still_held():
    buf = io.StringIO()
    log = _PassLog(EventLog("rmb-peer", "7", [RMB_EVENTS], sink=buf),
                   asyncio.get_running_loop())
    log.emit("rmb.peer.connected", None, relay="ws://r")
    log.close()
    assert [e["event"] for e in _lines(buf)] == ["rmb.peer.connected"]
