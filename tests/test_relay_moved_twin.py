"""A twin that moves to another relay while envelopes for it are being federated (a relay
retired, its twins' peers on a new one): RelayCore in memory with a fake clock, no sockets
(DESIGN.md section 2). The pending federation jobs follow the twin's fresh record instead
of retrying the retired relay until their TTL runs out."""
from __future__ import annotations

import random

from rmb_peer.envelope import Envelope
from rmb_relay.core import (
    FederationScheduler, LookupTwin, PostFederation, Ranker, RelayCore, WriteFrame,
)
from tests.test_relay_core import T0, make_env
from tests.test_relay_core_machine import Rec, drain, of

HERE = "relay1:1"
OLD, NEW = "relay2:1", "relay3:1"


def core_with():
    rng = random.Random(0)
    ranker = Ranker(rng=rng)
    fed = FederationScheduler(ranker, rng, base_backoff=0.5, slow_backoff=2.0)
    return RelayCore([HERE], ranker=ranker, federation=fed, twin_ttl=5.0)


def run_until_answered(core, now, until, dead):
    """Step the fake clock: attempts to `dead` domains fail, others are accepted.
    Returns (accepted domains, the time the job ended, every command seen)."""
    accepted, seen = [], []
    while now < until:
        cmds = drain(core)
        seen += cmds
        for look in of(cmds, LookupTwin):
            core.twin_resolved(look.twin, Rec([NEW]), now)   # the registry: the twin moved
            core.chain_done(look.twin, now)
        for att in of(cmds, PostFederation):
            if att.domain in dead:
                core.federation_result(att.job, "failed", now + 0.05, reason="connection refused")
            else:
                core.federation_result(att.job, "accepted", now + 0.05, status=202)
                accepted.append(att.domain)
        if not len(core.federation):
            return accepted, now, seen + drain(core)
        timer = core.get_timer()
        now = max(now + 0.1, timer if timer is not None else now + 0.1)
        core.handle_timer(now)
    return accepted, now, seen


def federated_to_old_relay(core):
    """alice (A, twin 1, here) sends twin 2, whose record still names the retired relay:
    returns (the envelope, its first federation attempt)."""
    core.peer_connected("A", (1, None), T0)
    drain(core)
    env = make_env(src=(1, None), dst=(2, None), ttl=40)
    core.receive_frame("A", env.SerializeToString(), T0)
    assert of(drain(core), LookupTwin) == [LookupTwin(2)]
    core.twin_resolved(2, Rec([OLD]), T0)            # the record before the move
    (first,) = of(drain(core), PostFederation)
    core.chain_done(2, T0)
    return env, first


def test_federation_follows_a_twin_that_moved_to_a_new_relay():
    core = core_with()
    env, first = federated_to_old_relay(core)
    assert first.domain == OLD
    core.federation_result(first.job, "failed", T0 + 3, reason="connection refused")
    accepted, end, seen = run_until_answered(core, T0 + 3, T0 + 40, dead={OLD})
    # before: every attempt went to the retired relay and the sender got `message has
    # expired` after 40 s; now the job follows the fresh record to the new relay
    assert accepted == [NEW]
    assert end < T0 + 10
    assert not [f for f in of(seen, WriteFrame) if Envelope.FromString(f.data).HasField("error")]


def test_jobs_for_a_twin_now_served_here_are_delivered_here():
    core = core_with()
    env, att = federated_to_old_relay(core)
    core.federation_result(att.job, "failed", T0 + 1, reason="connection refused")
    drain(core)
    core.peer_connected("B", (2, None), T0 + 2)       # the twin connects here instead
    core.queue_replayed("B", T0 + 2)
    drain(core)
    core.twin_resolved(2, Rec([HERE]), T0 + 3)
    frames = [Envelope.FromString(c.data) for c in of(drain(core), WriteFrame) if c.conn == "B"]
    assert [f.uid for f in frames] == [env.uid]
    assert len(core.federation) == 0


def test_retarget_keeps_a_job_in_flight_and_uses_the_new_domain_next():
    sched = FederationScheduler(Ranker(rng=random.Random(0)), random.Random(0))
    env = make_env(ttl=60)
    job = sched.submit(env, env.SerializeToString(), [OLD], T0)
    (att,) = sched.attempts_due(T0)
    assert sched.retarget(job, [NEW], T0 + 0.5)
    assert not sched.retarget(job, [NEW], T0 + 0.5)          # no change: nothing to do
    sched.report(job, "failed", T0 + 1)
    (att2,) = sched.attempts_due(T0 + 1)
    assert att2.domain == NEW
    assert sched.withdraw(job) is None                        # in flight: not withdrawn
    sched.report(job, "accepted", T0 + 1.1)
    assert len(sched) == 0 and sched.domain_jobs(OLD) == 0 and sched.domain_jobs(NEW) == 0
