"""What every protocol takes from daemon_runtime instead of keeping its own copy: the log
rate limiter (daemon_runtime/ratelimit.py) and the event log record (daemon_runtime/
eventlog.py LogRecord)."""
from __future__ import annotations

import pytest

from daemon_runtime.eventlog import LogRecord
from daemon_runtime.ratelimit import LogLimiter


def test_one_log_limiter_and_one_log_record_across_the_protocols():
    import marlin_cluster.daemon as marlin_daemon
    import marlin_cluster.events as marlin_events
    import remp_node.eventmap as remp_eventmap
    import remp_node.udp as remp_udp
    import rmb_relay.core as relay_core
    assert relay_core.LogLimiter is LogLimiter
    assert marlin_daemon.LogLimiter is LogLimiter and not hasattr(marlin_daemon, "RateLimited")
    assert remp_udp.LogLimiter is LogLimiter
    assert remp_eventmap.LogRecord is LogRecord and marlin_events.LogRecord is LogRecord


def test_burst_then_one_summary_per_window():
    lim = LogLimiter(burst=3, window=10.0)
    results = [lim.allow("k", 100 + i * 0.01) for i in range(100)]
    assert sum(1 for emit, _ in results if emit) == 3
    assert lim.allow("k", 111) == (True, 97)          # the next window reports the 97 withheld
    assert lim.flush(115) == []                        # window still open
    lim.allow("k", 111.1), lim.allow("k", 111.2), lim.allow("k", 111.3)
    assert lim.flush(122) == [("k", 1)]
    assert lim.allow("k", 122) == (True, 0)            # flushed keys start afresh


def test_burst_one_is_one_line_per_key_per_window():
    lim = LogLimiter(burst=1, window=5.0)
    emitted = [t for t in (0.0, 1.0, 4.9, 5.0, 7.0, 10.1) if lim.allow(("drop", "x"), t)[0]]
    assert emitted == [0.0, 5.0, 10.1]
    assert lim.allow(("drop", "y"), 7.0)[0]            # keys are independent


def test_a_flood_of_distinct_keys_stays_bounded():
    lim = LogLimiter(burst=1, window=10.0, max_keys=64)
    for i in range(10_000):
        assert lim.allow(("peer", i), float(i) / 1000)[0]
    assert len(lim._state) <= 64


def test_bad_parameters_are_refused():
    for kw in ({"burst": 0}, {"window": 0}, {"max_keys": 0}):
        with pytest.raises(ValueError):
            LogLimiter(**kw)


def test_log_record_defaults_to_no_attrs_and_is_frozen():
    r = LogRecord("remp.validator.status", None, "info")
    assert r.attrs == {}
    with pytest.raises(AttributeError):
        r.level = "warning"  # type: ignore[misc]
