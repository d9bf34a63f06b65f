"""What every protocol takes from daemon_runtime instead of keeping its own copy: the log
rate limiter (daemon_runtime/ratelimit.py) and the event log record (daemon_runtime/
eventlog.py LogRecord), and the in-memory network with a fake clock that the core tests of
every protocol drive their cores over (daemon_runtime/memnet.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from daemon_runtime.eventlog import LogRecord
from daemon_runtime.ratelimit import LogLimiter


def test_one_log_limiter_and_one_log_record_across_the_protocols():
    import marlin_cluster.daemon as marlin_daemon
    import marlin_cluster.events as marlin_events
    import remp_node.core.eventmap as remp_eventmap
    import remp_node.transport.udp as remp_udp
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


def test_log_record_defaults_to_no_attrs_and_has_fixed_fields():
    r = LogRecord("remp.validator.status", None, "info")
    assert r.attrs == {} and r.attrs is not LogRecord("x", None, "info").attrs
    with pytest.raises(AttributeError):
        r.levle = "warning"  # type: ignore[attr-defined]


def test_the_relay_log_command_is_the_shared_log_record():
    from rmb_relay.core import Log, RelayCommand
    assert Log is LogRecord and isinstance(LogRecord("rmb.relay.forwarded", "u", "info"), RelayCommand)


def test_one_in_memory_network_for_every_protocol_s_core_tests():
    from daemon_runtime.memnet import MemNetwork
    from remp_node.testnet.network import SimNetwork
    assert SimNetwork is MemNetwork
    for name in ("test_marlin_cores.py", "test_remp_catchain.py", "test_remp_consensus.py"):
        text = (Path(__file__).parent / name).read_text()
        assert "MemNetwork" in text and "heapq" not in text, name


def test_mem_network_faults_and_fake_clock():
    from daemon_runtime.memnet import FakeClock, MemNetwork
    clock = FakeClock(10.0)
    net = MemNetwork(3, loss=0.2, duplicate=0.2, reorder=0.3, latency=0.01, jitter=0.02)
    net.crashed.add("dead")
    for i in range(1000):
        net.send("a", "b", i.to_bytes(2, "big"), clock.now)
    net.send("a", "dead", b"x", clock.now)
    assert net.next_delivery() >= 10.01
    assert net.deliver_due(clock.now) == []              # nothing is due before its latency
    got = net.deliver_due(clock.advance(1.0))
    st = net.stats
    assert st.to_crashed == 1 and 120 < st.lost < 280 and 120 < st.duplicated < 280
    assert len(got) == st.delivered == 1000 - st.lost + st.duplicated
    seq = [int.from_bytes(d, "big") for _, _, d in got]
    assert seq != sorted(seq)                             # reordered
    assert set(seq) <= set(range(1000))
    assert clock.advance_to(5.0) == 11.0 and clock() == 11.0
    with pytest.raises(ValueError):
        clock.advance(-1)
    with pytest.raises(ValueError):
        MemNetwork(loss=1.5)
