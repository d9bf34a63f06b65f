"""rmb_relay.core bounds with a fake clock, no sockets: a dead
federation domain costs about one attempt per circuit cooldown whatever the number of
jobs, other domains are unaffected, per-domain job cap; the log limiter; ping to twin 0."""
from __future__ import annotations

import random

from rmb_relay.core import (
    ERR_DOMAIN_FULL, FederationAccepted, FederationCircuit, FederationExpired,
    FederationScheduler, LogLimiter, Ranker, RelayRouter, Reply,
)
from tests.test_relay_core import T0, make_env


def drain(sched):
    out = []
    while (ev := sched.next_event()) is not None:
        out.append(ev)
    return out


def test_dead_domain_attempts_bounded_and_live_domain_unaffected():
    sched = FederationScheduler(Ranker(rng=random.Random(1)), random.Random(2))
    for _ in range(1000):
        env = make_env(ttl=60)
        sched.submit(env, b"x", ["dead:1"], T0)
    now = T0
    attempts = {"dead:1": 0, "live:1": 0}
    live_done_at = None
    live_job = None
    tick = 0.05
    while now < T0 + 61:
        if live_job is None and now >= T0 + 10:
            live_env = make_env(ttl=30, ts=now)
            live_job = sched.submit(live_env, b"y", ["live:1"], now)
            assert live_job is not None
        for att in sched.attempts_due(now):
            attempts[att.domain] += 1
            if att.domain == "dead:1":
                sched.report(att.job, "failed", now + 0.001, reason="connection refused")
            else:
                sched.report(att.job, "accepted", now + 0.001)
                live_done_at = now
        now += tick
        sched.handle_timer(now)
    evs = drain(sched)
    # 1,000 jobs, 60 s: without the circuit ~1,000 x (3 fast passes + 11 slow) attempts
    assert attempts["dead:1"] < 100
    assert live_done_at is not None and live_done_at - (T0 + 10) < 0.2
    opened = [e for e in evs if isinstance(e, FederationCircuit) and e.state == "open"]
    assert len(opened) == 1 and opened[0].domain == "dead:1"
    assert sum(isinstance(e, FederationExpired) for e in evs) == 1000
    assert any(isinstance(e, FederationAccepted) for e in evs)
    assert len(sched) == 0


def test_circuit_probe_closes_when_domain_comes_back():
    sched = FederationScheduler(Ranker(rng=random.Random(1)), random.Random(3),
                                circuit_threshold=2, circuit_base=1.0)
    jobs = [sched.submit(make_env(ttl=600), b"x", ["r:1"], T0) for _ in range(50)]
    now = T0
    for att in sched.attempts_due(now):       # 50 attempts in flight at once, all fail
        sched.report(att.job, "failed", now)
    assert sched.circuit_open("r:1", now)
    probes = []
    while not probes:
        now += 0.1
        sched.handle_timer(now)
        probes = sched.attempts_due(now)
    assert len(probes) == 1                   # one half-open probe, not 50
    sched.report(probes[0].job, "accepted", now)
    assert not sched.circuit_open("r:1", now)
    delivered = 1
    for _ in range(200):
        now += 0.1
        sched.handle_timer(now)
        for att in sched.attempts_due(now):
            sched.report(att.job, "accepted", now)
            delivered += 1
        if delivered == len(jobs):
            break
    assert delivered == len(jobs)
    states = [e.state for e in drain(sched) if isinstance(e, FederationCircuit)]
    assert states == ["open", "closed"]


def test_failures_in_flight_when_the_circuit_opens_do_not_lengthen_its_cooldown():
    # 50 attempts in flight fail one after another: the 2nd opens the circuit for ~1 s; the
    # other 48 were sent before it opened and say nothing new (they used to double the
    # cooldown each time, 1 s -> circuit_max, and federated replies expired meanwhile)
    sched = FederationScheduler(Ranker(rng=random.Random(1)), random.Random(4),
                                circuit_threshold=2, circuit_base=1.0, circuit_max=60.0)
    for _ in range(50):
        sched.submit(make_env(ttl=600), b"x", ["r:1"], T0)
    now = T0
    for att in sched.attempts_due(now):
        now += 0.001
        sched.report(att.job, "failed", now)
    probes = []
    while not probes and now < T0 + 120:
        now += 0.05
        sched.handle_timer(now)
        probes = sched.attempts_due(now)
    assert len(probes) == 1 and now - T0 <= 1.2 * 1.0 + 0.25 + 0.2
    sched.report(probes[0].job, "failed", now)          # the probe's failure doubles it
    opened_at, probes = now, []
    while not probes and now < opened_at + 120:
        now += 0.05
        sched.handle_timer(now)
        probes = sched.attempts_due(now)
    assert len(probes) == 1 and 2.0 * 0.8 - 0.05 <= now - opened_at <= 2.0 * 1.2 + 0.25 + 0.2


def test_per_domain_job_cap_leaves_room_for_other_domains():
    sched = FederationScheduler(Ranker(), max_jobs=100, max_jobs_per_domain=10)
    for _ in range(10):
        assert sched.submit(make_env(), b"", ["dead:1"], T0) is not None
    assert sched.submit(make_env(), b"", ["dead:1"], T0) is None
    assert sched.refusal == ERR_DOMAIN_FULL
    assert sched.submit(make_env(), b"", ["dead:1", "other:1"], T0) is not None
    assert sched.submit(make_env(), b"", ["live:1"], T0) is not None


def test_log_limiter_burst_then_summary():
    lim = LogLimiter(burst=3, window=10.0)
    results = [lim.allow("k", T0 + i * 0.01) for i in range(100)]
    assert sum(1 for emit, _ in results if emit) == 3
    emit, suppressed = lim.allow("k", T0 + 11)
    assert emit and suppressed == 97
    lim.allow("k", T0 + 11.1), lim.allow("k", T0 + 11.2), lim.allow("k", T0 + 11.3)
    assert lim.flush(T0 + 15) == []
    assert lim.flush(T0 + 22) == [("k", 1)]


def test_ping_with_destination_twin_0_answered_by_router():
    router = RelayRouter(["r1"])
    ping = make_env(src=(7, "s"), dst=(0, None), kind="ping")
    v = router.check_inbound((7, "s"), ping, 40, T0)
    assert isinstance(v, Reply) and v.envelope.WhichOneof("message") == "pong"
    assert v.envelope.destination.twin == 7 and v.envelope.source.twin == 0


def test_relay_core_uses_the_scheduler_it_is_given_even_when_empty():
    from rmb_relay.core import RelayCore
    ranker = Ranker()
    sched = FederationScheduler(ranker)
    assert len(sched) == 0                    # falsy: `federation or ...` replaced it
    core = RelayCore(["r1"], ranker=ranker, federation=sched)
    assert core.federation is sched and core.ranker is ranker
