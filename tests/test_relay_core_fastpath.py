"""RelayCore.receive_frame's hot path (each protobuf field read once, no call to
RelayRouter.check_inbound when no rate limit is set) decides exactly as check_inbound
does: same commands for every combination of source, session id, message kind, expiry
and destination state."""
from __future__ import annotations

import itertools

from rmb_relay.core import RelayRouter
from rmb_relay.core import CloseConnection, Enqueue, Log, LookupTwin, RelayCore, WriteFrame
from tests.test_relay_core import make_env

NOW = 1_700_000_000.0


class AllowAll:
    """A limiter that never refuses: forces the slow path (check_inbound) in the core."""

    def allow(self, twin, size, now):
        return True


def _env(src, dst, kind, ttl) -> bytes:
    """src/dst: (twin, connection|None) or src None (no source); ttl against NOW - 10."""
    env = make_env(src, dst, kind, ts=NOW - 10, ttl=ttl)
    env.uid = "u-1"
    return env.SerializeToString()


def _describe(cmds):
    out = []
    for c in cmds:
        if isinstance(c, WriteFrame):
            out.append(("write", c.conn, c.data, c.session,
                        (c.log.event, c.log.trace_id, c.log.level, c.log.attrs) if c.log else None))
        elif isinstance(c, Log):
            out.append(("log", c.event, c.trace_id, c.level, c.attrs))
        elif isinstance(c, Enqueue):
            out.append(("enqueue", c.session, c.data, c.kind, c.src))
        elif isinstance(c, LookupTwin):
            out.append(("lookup", c.twin))
        elif isinstance(c, CloseConnection):
            out.append(("close", c.code))
        else:
            out.append((type(c).__name__,))
    return out


def _run(limiter, session, data, dst_state):
    core = RelayCore(["r.local"])
    if limiter is not None:
        core.router = RelayRouter(["r.local"], limiter)
    a, b = "conn-a", "conn-b"
    core.peer_connected(a, session, NOW)
    core.queue_replayed(a, NOW)
    if dst_state != "absent":
        core.peer_connected(b, (2, None), NOW)
        if dst_state == "live":
            core.queue_replayed(b, NOW)
    core.take()
    core.receive_frame(a, data, NOW)
    return _describe(core.take())


def test_fast_path_agrees_with_check_inbound():
    sessions = [(1, None), (1, "s1")]
    sources = [None, (1, None), (1, "s1"), (1, "s2"), (3, None)]
    kinds = ["request", "response", "error", "ping", "none"]
    ttls = [5, 3600]          # expired on arrival, valid
    dsts = [(2, None), (2, "x")]
    states = ["live", "replaying", "absent"]
    checked = forwarded = 0
    for session, src, kind, ttl, dst, state in itertools.product(
            sessions, sources, kinds, ttls, dsts, states):
        data = _env(src, dst, kind, ttl)
        fast = _run(None, session, data, state)
        slow = _run(AllowAll(), session, data, state)
        assert fast == slow, (session, src, kind, ttl, dst, state)
        checked += 1
        forwarded += any(c[0] == "write" and c[4] and c[4][0] == "rmb.relay.forwarded"
                         for c in fast)
    assert checked == 2 * 5 * 5 * 2 * 2 * 3
    assert forwarded > 0          # the hot path itself was exercised
