"""rmb_relay.core with a fake clock: connection replacement race, rate-limit windows,
ranker ordering and healing, federation retry plan and expiry, inbound verdicts."""
from __future__ import annotations

import random

import pytest

from rmb_peer.envelope import Envelope, new_uid
from rmb_relay.core import (
    ERR_EXPIRED, ERR_NO_RELAYS, ERR_RATE_LIMIT, ERR_WRONG_SOURCE, ConnectionTable, Drop,
    FederationAccepted, FederationAttemptFailed, FederationExpired, FederationRefused,
    FederationScheduler, FixedWindowLimiter, Federate, Forward, Local, Ranker, Refuse,
    RelayCoreError, RelayRouter, Reply,
)

T0 = 1_700_000_000.0


def make_env(src=(1, None), dst=(2, None), kind="request", ts=T0, ttl=60) -> Envelope:
    env = Envelope()
    env.uid = new_uid()
    env.timestamp = int(ts)
    env.expiration = ttl
    if src is not None:                 # None: no source field at all
        env.source.twin = src[0]
        if src[1] is not None:
            env.source.connection = src[1]
    env.destination.twin = dst[0]
    if dst[1] is not None:
        env.destination.connection = dst[1]
    if kind == "request":
        env.request.command = "test.cmd"
    elif kind == "response":
        env.response.SetInParent()
    elif kind == "error":
        env.error.message = "e"
    elif kind == "ping":
        env.ping.SetInParent()
    env.plain = b"x" * 10
    return env


def drain(sched):
    out = []
    while (ev := sched.next_event()) is not None:
        out.append(ev)
    return out


# ---------------------------------------------------------------- connection table

def test_replacement_race_old_cleanup_keeps_new_connection():
    table = ConnectionTable()
    old, new = object(), object()
    assert table.register((7, None), old) is None
    # the same (twin, sid) connects again: the old one is handed back to be closed
    assert table.register((7, None), new) is old
    # the old connection's cleanup runs AFTER the new registration
    assert table.unregister((7, None), old) is False
    assert table.get((7, None)) is new
    assert table.unregister((7, None), new) is True
    assert table.get((7, None)) is None


def test_sessions_are_distinct_per_sid():
    table = ConnectionTable()
    a, b, c = object(), object(), object()
    table.register((7, None), a)
    table.register((7, "s1"), b)
    table.register((8, "s1"), c)
    assert len(table) == 3
    assert table.get((7, None)) is a and table.get((7, "s1")) is b and table.get((8, "s1")) is c


# ---------------------------------------------------------------- rate limiter

def test_fixed_window_count_limit_and_window_turn():
    lim = FixedWindowLimiter(count=3, size=10_000, window=60)
    now = 60 * 1000.0  # a window boundary
    assert [lim.allow(1, 10, now + i) for i in range(4)] == [True, True, True, False]
    # another twin has its own budget
    assert lim.allow(2, 10, now + 5)
    # still the same window at +59.9 s
    assert not lim.allow(1, 10, now + 59.9)
    # the next fixed window starts at +60 s, not 60 s after the first message
    assert lim.allow(1, 10, now + 60.0)
    assert lim.usage(1, now + 60.0) == (1, 10)


def test_fixed_window_size_limit_refused_message_not_counted():
    lim = FixedWindowLimiter(count=100, size=1000, window=60)
    now = 60 * 5.0
    assert lim.allow(1, 900, now)
    assert not lim.allow(1, 200, now + 1)      # 1100 > 1000: dropped
    assert lim.usage(1, now + 1) == (1, 900)   # the dropped one is not counted
    assert lim.allow(1, 100, now + 2)          # exactly 1000 is fine
    assert not lim.allow(1, 1, now + 3)


def test_limiter_rejects_bad_config():
    with pytest.raises(RelayCoreError):
        FixedWindowLimiter(0, 10)


# ---------------------------------------------------------------- ranker

def test_ranker_orders_by_failures_and_heals():
    ranker = Ranker(period=3600, rng=random.Random(1))
    ranker.downvote("b", T0)
    ranker.downvote("c", T0)
    ranker.downvote("c", T0 + 10)
    assert ranker.order(["c", "b", "a"], T0 + 20) == ["a", "b", "c"]
    assert ranker.failure_rate("c", T0 + 20) == 2.0
    # failures older than the period no longer count: everyone heals
    assert ranker.failures("c", T0 + 3600 + 11) == 0
    assert ranker.failures("b", T0 + 3600 + 11) == 0


def test_ranker_randomizes_ties():
    ranker = Ranker(period=60, rng=random.Random(3))
    ranker.downvote("z", T0)
    seen = {tuple(ranker.order(["a", "b", "c", "z"], T0)) for _ in range(60)}
    assert len(seen) > 1                        # ties shuffled
    assert all(order[-1] == "z" for order in seen)  # the failed one always last


# ---------------------------------------------------------------- federation plan

def test_federation_falls_over_to_second_relay_and_downvotes_first():
    ranker = Ranker(rng=random.Random(0))
    ranker.downvote("r2", T0 - 10)           # r2 failed recently: r1 goes first
    sched = FederationScheduler(ranker, random.Random(0))
    env = make_env(ttl=60)
    job = sched.submit(env, env.SerializeToString(), ["r2", "r1"], T0, context="ctx")
    (att,) = sched.attempts_due(T0)
    assert (att.job, att.domain, att.attempt) == (job, "r1", 1)
    assert sched.attempts_due(T0) == []       # nothing new while in flight
    sched.report(job, "failed", T0 + 0.1, status=0, reason="connection refused")
    (att2,) = sched.attempts_due(T0 + 0.1)    # next relay of the same pass, no backoff
    assert att2.domain == "r2" and att2.attempt == 2
    sched.report(job, "accepted", T0 + 0.2)
    evs = drain(sched)
    assert isinstance(evs[0], FederationAttemptFailed) and evs[0].domain == "r1"
    assert isinstance(evs[1], FederationAccepted) and evs[1].domain == "r2" and evs[1].attempt == 2
    assert len(sched) == 0
    assert ranker.failures("r1", T0 + 1) == 1


def test_federation_passes_backoff_then_expiry_with_reply():
    ranker = Ranker(rng=random.Random(0))
    sched = FederationScheduler(ranker, random.Random(5), base_backoff=0.5, slow_backoff=30)
    env = make_env(ttl=100)
    job = sched.submit(env, env.SerializeToString(), ["r1", "r2"], T0, context=("sender",))
    now = T0
    pass_starts = []
    waits = []
    while True:
        due = sched.attempts_due(now)
        if not due:
            timer = sched.get_timer()
            if timer is None:
                break
            waits.append(timer - now)
            now = timer
            sched.handle_timer(now)
            continue
        for att in due:
            if att.attempt % 2 == 1:
                pass_starts.append(now)
            now += 0.01
            sched.report(att.job, "failed", now, status=503, reason="unavailable")
    evs = drain(sched)
    expired = [e for e in evs if isinstance(e, FederationExpired)]
    assert len(expired) == 1 and expired[0].job == job and expired[0].context == ("sender",)
    assert expired[0].reply.error.message == ERR_EXPIRED
    assert expired[0].reply.uid == env.uid and not expired[0].reply.HasField("source")
    # expiry happens at the envelope deadline, not earlier
    assert now == pytest.approx(T0 + 100)
    # the first fast passes back off 0.5 s, 1 s (x jitter 0.5..1.5), later ones ~30 s
    assert 0.25 <= waits[0] < 0.75 and 0.5 <= waits[1] < 1.5
    assert all(15 <= w < 45 for w in waits[2:-1])
    assert len(pass_starts) >= 4
    fails = [e for e in evs if isinstance(e, FederationAttemptFailed)]
    assert {e.domain for e in fails} == {"r1", "r2"} and all(e.status == 503 for e in fails)
    assert len(sched) == 0


def test_federation_refused_is_permanent():
    sched = FederationScheduler(Ranker(rng=random.Random(0)), random.Random(0))
    env = make_env()
    job = sched.submit(env, env.SerializeToString(), ["r1", "r2"], T0)
    (att,) = sched.attempts_due(T0)
    sched.report(job, "refused", T0 + 0.1, status=404, reason="destination offline")
    (ev,) = drain(sched)
    assert isinstance(ev, FederationRefused) and ev.reply.error.message == "destination offline"
    assert sched.attempts_due(T0 + 1) == [] and sched.get_timer() is None


def test_federation_response_expiry_has_no_reply_and_bad_report_raises():
    sched = FederationScheduler(Ranker(rng=random.Random(0)), random.Random(0))
    env = make_env(kind="response", ttl=1)
    job = sched.submit(env, env.SerializeToString(), ["r1"], T0)
    (att,) = sched.attempts_due(T0)
    with pytest.raises(RelayCoreError, match="unknown outcome"):
        sched.report(job, "maybe", T0)
    sched.report(job, "failed", T0 + 2)       # past the deadline: expires now
    evs = drain(sched)
    assert isinstance(evs[-1], FederationExpired) and evs[-1].reply is None
    with pytest.raises(RelayCoreError, match="state 'done'"):
        sched.report(job, "accepted", T0 + 3)


def test_federation_report_when_not_in_flight_raises():
    sched = FederationScheduler(Ranker(rng=random.Random(0)), random.Random(0))
    env = make_env(ttl=60)
    job = sched.submit(env, env.SerializeToString(), ["r1"], T0)
    with pytest.raises(RelayCoreError, match="'ready'.*'failed'"):
        sched.report(job, "failed", T0)


def test_federation_job_limit():
    sched = FederationScheduler(Ranker(), max_jobs=1)
    env = make_env()
    assert sched.submit(env, b"", ["r1"], T0) is not None
    assert sched.submit(env, b"", ["r1"], T0) is None


# ---------------------------------------------------------------- router verdicts

def test_router_inbound_verdicts():
    router = RelayRouter(["Relay1.local:80"], FixedWindowLimiter(count=4, size=10**6))
    me = (1, "s1")
    ok = make_env(src=me)
    assert isinstance(router.check_inbound(me, ok, 50, T0), Forward)
    wrong = make_env(src=(1, None))
    v = router.check_inbound(me, wrong, 50, T0)
    assert isinstance(v, Reply) and v.envelope.error.message == ERR_WRONG_SOURCE
    assert v.envelope.uid == wrong.uid and v.envelope.error.code == 0
    assert not v.envelope.HasField("source") and not v.envelope.HasField("signature")
    # responses are never answered with relay errors
    resp = make_env(src=(9, None), kind="response")
    assert router.check_inbound(me, resp, 50, T0) == Drop(ERR_WRONG_SOURCE)
    ping = make_env(src=me, dst=(1, "s1"), kind="ping")
    v = router.check_inbound(me, ping, 50, T0)
    assert isinstance(v, Reply) and v.envelope.WhichOneof("message") == "pong"
    assert v.envelope.destination.twin == 1 and v.envelope.destination.connection == "s1"
    # 5th envelope in the window: over the limit
    v = router.check_inbound(me, make_env(src=me), 50, T0)
    assert isinstance(v, Reply) and v.envelope.error.message == ERR_RATE_LIMIT
    # expired envelopes are dropped (new window so the limiter lets it through)
    old = make_env(src=me, ts=T0 - 100, ttl=50)
    assert router.check_inbound(me, old, 50, T0 + 120) == Drop(ERR_EXPIRED)


def test_router_route_local_federate_refuse():
    router = RelayRouter(["r1.example:443", "r1b.example"])
    assert isinstance(router.route(["wss://R1B.example/"]), Local)
    assert router.route(["other:1", "r2:2"]) == Federate(["other:1", "r2:2"])
    assert router.route([]) == Refuse(ERR_NO_RELAYS)
    with pytest.raises(RelayCoreError):
        RelayRouter([])
