"""rmb_relay.core.RelayCore in memory with a fake clock, no sockets (DESIGN.md
section 2): offline replay order, connection replacement race, lookups per twin (chain,
stale-while-revalidate, stale-if-error), federation retry and ranker, rate limiter,
fail-fast, expiry, ping, full queue, impossible transitions."""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from rmb_peer.envelope import Envelope
from rmb_peer.twins import DirectoryError, UnknownTwin
from rmb_relay.core import FederationScheduler, FixedWindowLimiter, Ranker
from rmb_relay.core import (
    CloseConnection, Enqueue, LookupTwin, Log, PostFederation, RelayCore, RelayStateError,
    ReadQueue, WriteFrame,
)
from tests.test_relay_core import T0, make_env

HERE = "relay.here:1"


@dataclass
class Rec:
    relays: list


def drain(core):
    out = []
    while (cmd := core.next_event()) is not None:
        out.append(cmd)
    return out


def of(cmds, cls):
    return [c for c in cmds if isinstance(c, cls)]


def frames_to(cmds, conn):
    return [Envelope.FromString(c.data) for c in cmds if isinstance(c, WriteFrame) and c.conn == conn]


def core_with(**kw):
    rng = random.Random(0)
    ranker = Ranker(rng=rng)
    fed = FederationScheduler(ranker, rng, base_backoff=0.5, slow_backoff=2.0)
    return RelayCore([HERE], ranker=ranker, federation=fed, **kw)


def test_offline_replay_order_then_live():
    core = core_with()
    core.peer_connected("A", (1, None), T0)
    drain(core)
    sent = [make_env(src=(1, None), dst=(2, None)) for _ in range(3)]
    for env in sent:
        core.receive_frame("A", env.SerializeToString(), T0)
    cmds = drain(core)
    assert of(cmds, LookupTwin) == [LookupTwin(2)]          # one lookup for three envelopes
    core.twin_resolved(2, Rec([HERE]), T0)
    enq = of(drain(core), Enqueue)
    assert [e.uid for e in enq] == [e.uid for e in sent] and enq[0].session == (2, None)
    for e in enq:
        core.enqueued(e.token, "queued", T0)
    core.peer_connected("B", (2, None), T0 + 1)
    assert of(drain(core), ReadQueue) == [ReadQueue("B", (2, None))]
    live = [make_env(src=(1, None), dst=(2, None)) for _ in range(2)]
    for env in live:                                         # B still replaying: queue too
        core.receive_frame("A", env.SerializeToString(), T0 + 1)
    cmds = drain(core)
    assert [e.uid for e in of(cmds, Enqueue)] == [e.uid for e in live]
    assert frames_to(cmds, "B") == []
    core.queue_replayed("B", T0 + 2)
    last = make_env(src=(1, None), dst=(2, None))
    core.receive_frame("A", last.SerializeToString(), T0 + 2)
    assert [e.uid for e in frames_to(drain(core), "B")] == [last.uid]
    with pytest.raises(RelayStateError, match="'live'.*'replayed'"):
        core.queue_replayed("B", T0 + 3)


def test_connection_replacement_race():
    core = core_with()
    core.peer_connected("A", (1, None), T0)
    core.peer_connected("B1", (2, None), T0)
    core.queue_replayed("A", T0)
    core.queue_replayed("B1", T0)
    drain(core)
    core.peer_connected("B2", (2, None), T0 + 1)
    cmds = drain(core)
    assert CloseConnection("B1", 4000, "replaced by a newer connection") in cmds
    core.queue_replayed("B2", T0 + 1)
    core.peer_disconnected("B1", T0 + 1.1)                  # old cleanup runs after
    env = make_env(src=(1, None), dst=(2, None))
    core.receive_frame("A", env.SerializeToString(), T0 + 2)
    cmds = drain(core)
    assert [e.uid for e in frames_to(cmds, "B2")] == [env.uid] and frames_to(cmds, "B1") == []
    assert core.state_of((2, None)) == "live"


def test_lookup_stale_while_revalidate_and_stale_if_error():
    core = core_with(twin_ttl=10, twin_max_stale=100)
    core.peer_connected("A", (1, None), T0)
    core.queue_replayed("A", T0)
    drain(core)
    core.receive_frame("A", make_env(src=(1, None), dst=(2, None)).SerializeToString(), T0)
    core.twin_resolved(2, Rec([HERE]), T0)
    drain(core)
    assert core.chain_done(2, T0)
    # past the TTL: routed at once AND a refresh asked for, once
    e1 = make_env(src=(1, None), dst=(2, None), ts=T0 + 20)
    e2 = make_env(src=(1, None), dst=(2, None), ts=T0 + 20)
    core.receive_frame("A", e1.SerializeToString(), T0 + 20)
    core.receive_frame("A", e2.SerializeToString(), T0 + 20)
    cmds = drain(core)
    assert [e.uid for e in of(cmds, Enqueue)] == [e1.uid, e2.uid]
    assert of(cmds, LookupTwin) == [LookupTwin(2)]
    core.twin_resolved(2, DirectoryError("registry unreachable"), T0 + 25)
    logs = [c for c in drain(core) if isinstance(c, Log) and c.event == "rmb.relay.twin_stale"]
    assert logs and logs[0].attrs["twin"] == 2
    # beyond ttl + max_stale: the envelope waits for a lookup; an error is the sender's
    e3 = make_env(src=(1, None), dst=(2, None), ts=T0 + 200)
    core.receive_frame("A", e3.SerializeToString(), T0 + 200)
    assert of(drain(core), LookupTwin) == [LookupTwin(2)]
    core.twin_resolved(2, DirectoryError("registry unreachable"), T0 + 205)
    (err,) = frames_to(drain(core), "A")
    assert core.chain_done(2, T0 + 205)
    assert err.uid == e3.uid and err.error.message.startswith("failed to get twin details")
    e4 = make_env(src=(1, None), dst=(9, None), ts=T0 + 200)
    core.receive_frame("A", e4.SerializeToString(), T0 + 200)
    core.twin_resolved(9, UnknownTwin("unknown twin 9"), T0 + 200)
    (err,) = frames_to(drain(core), "A")
    assert err.error.message == "unknown twin destination"


def test_federation_retry_ranker_and_expiry_reply():
    core = core_with()
    core.ranker.downvote("live:1", T0 - 1)                  # dead one ranked first
    core.peer_connected("A", (1, None), T0)
    core.queue_replayed("A", T0)
    drain(core)
    env = make_env(src=(1, None), dst=(5, None), ttl=30)
    core.receive_frame("A", env.SerializeToString(), T0)
    core.twin_resolved(5, Rec(["dead:1", "live:1"]), T0)
    (p1,) = of(drain(core), PostFederation)
    assert p1.domain == "dead:1" and p1.attempt == 1
    core.federation_result(p1.job, "failed", T0 + 0.1, reason="connection refused")
    (p2,) = of(drain(core), PostFederation)
    assert p2.domain == "live:1" and p2.attempt == 2
    core.federation_result(p2.job, "accepted", T0 + 0.2)
    assert any(isinstance(c, Log) and c.event == "rmb.relay.federated" for c in drain(core))
    # a twin whose only relay is dead: retried with backoff until the TTL, then expired
    env = make_env(src=(1, None), dst=(6, None), ttl=5)
    core.receive_frame("A", env.SerializeToString(), T0)
    core.twin_resolved(6, Rec(["dead:1"]), T0)
    now, attempts, errors = T0, 0, []
    while now < T0 + 10:
        for cmd in drain(core):
            if isinstance(cmd, PostFederation):
                attempts += 1
                core.federation_result(cmd.job, "failed", now, reason="refused")
            elif isinstance(cmd, WriteFrame) and cmd.conn == "A":
                errors.append(Envelope.FromString(cmd.data))
        timer = core.get_timer()
        now = timer if timer is not None else now + 1
        core.handle_timer(now)
    errors += frames_to(drain(core), "A")
    assert attempts >= 3
    assert [e.error.message for e in errors] == ["message has expired"]
    assert errors[0].uid == env.uid


def test_rate_limit_fail_fast_expiry_ping_and_full_queue():
    core = core_with(limiter=FixedWindowLimiter(3, 10**6))
    core.peer_connected("A", (1, "s"), T0 + 1)
    core.queue_replayed("A", T0 + 1)
    drain(core)
    ping = make_env(src=(1, "s"), dst=(0, None), kind="ping", ts=T0 + 1)
    core.receive_frame("A", ping.SerializeToString(), T0 + 1)
    (pong,) = frames_to(drain(core), "A")
    assert pong.WhichOneof("message") == "pong" and pong.destination.connection == "s"
    ff = make_env(src=(1, "s"), dst=(2, None), ts=T0 + 1)
    ff.tags = "fail-fast"
    core.receive_frame("A", ff.SerializeToString(), T0 + 1)
    core.twin_resolved(2, Rec([HERE]), T0 + 1)
    (err,) = frames_to(drain(core), "A")
    assert err.uid == ff.uid and err.error.message == "destination offline"
    old = make_env(src=(1, "s"), dst=(2, None), ts=T0 - 100, ttl=10)
    core.receive_frame("A", old.SerializeToString(), T0 + 1)
    cmds = drain(core)
    assert frames_to(cmds, "A") == [] and any(
        isinstance(c, Log) and c.event == "rmb.relay.expired" for c in cmds)
    over = make_env(src=(1, "s"), dst=(2, None), ts=T0 + 1)   # 4th in the window
    core.receive_frame("A", over.SerializeToString(), T0 + 1)
    (err,) = frames_to(drain(core), "A")
    assert err.error.message == "exceeded rate limits, dropping message"
    core2 = core_with()
    core2.peer_connected("A", (1, None), T0)
    core2.queue_replayed("A", T0)
    core2.twin_resolved(2, Rec([HERE]), T0)
    drain(core2)
    env = make_env(src=(1, None), dst=(2, None))
    core2.receive_frame("A", env.SerializeToString(), T0)
    (enq,) = of(drain(core2), Enqueue)
    core2.enqueued(enq.token, "full", T0)
    (err,) = frames_to(drain(core2), "A")
    assert err.uid == env.uid and "queue is full" in err.error.message


def test_garbage_closes_and_unknown_connection_is_local_misuse():
    core = core_with()
    core.peer_connected("A", (1, None), T0)
    drain(core)
    core.receive_frame("A", b"\xff\xff\xff garbage", T0)
    (close,) = of(drain(core), CloseConnection)
    assert close.conn == "A" and close.code == 1007
    with pytest.raises(RelayStateError, match="'closed'.*'frame'"):
        core.receive_frame("nobody", b"", T0)


def test_lookup_chain_keeps_order_until_its_commands_ran():
    """Envelopes arriving while the chain's commands are executing queue behind them."""
    core = core_with()
    core.peer_connected("A", (1, None), T0)
    core.queue_replayed("A", T0)
    drain(core)
    first = [make_env(src=(1, None), dst=(2, None)) for _ in range(2)]
    for env in first:
        core.receive_frame("A", env.SerializeToString(), T0)
    drain(core)
    core.twin_resolved(2, Rec([HERE]), T0)
    routed = [c.uid for c in of(drain(core), Enqueue)]
    late = make_env(src=(1, None), dst=(2, None))
    core.receive_frame("A", late.SerializeToString(), T0)   # before chain_done
    assert of(drain(core), Enqueue) == []                    # waits behind the first two
    assert core.chain_done(2, T0) is False
    routed += [c.uid for c in of(drain(core), Enqueue)]
    assert core.chain_done(2, T0) is True
    assert routed == [e.uid for e in first] + [late.uid]
    after = make_env(src=(1, None), dst=(2, None))
    core.receive_frame("A", after.SerializeToString(), T0)  # record known: routed at once
    assert [c.uid for c in of(drain(core), Enqueue)] == [after.uid]


def test_federation_in_verifies_waits_for_lookups_and_answers():
    import os

    from rmb_peer.challenge import sign_envelope
    from rmb_peer.identity import Identity
    from rmb_peer.twins import Twin
    from rmb_relay.core import FederationAnswer

    alice = Identity.from_seed(os.urandom(32), "ed25519")
    mallory = Identity.from_seed(os.urandom(32), "ed25519")
    core = core_with()
    env = make_env(src=(7, None), dst=(2, None))
    sign_envelope(env, alice)
    core.receive_federation("req1", env.SerializeToString(), "10.0.0.1", T0)
    assert of(drain(core), LookupTwin) == [LookupTwin(2)]   # destination first
    core.twin_resolved(2, Twin(2, bytes(32), [HERE], None), T0)
    assert of(drain(core), LookupTwin) == [LookupTwin(7)]   # then the source's key
    core.twin_resolved(7, Twin(7, alice.account, ["other:1"], None), T0)
    (enq,) = of(drain(core), Enqueue)
    core.enqueued(enq.token, "queued", T0)
    assert of(drain(core), FederationAnswer)[0].status == 202
    spoofed = make_env(src=(7, None), dst=(2, None))
    sign_envelope(spoofed, mallory)
    core.receive_federation("req2", spoofed.SerializeToString(), "10.0.0.1", T0)
    (ans,) = of(drain(core), FederationAnswer)               # records known: at once
    assert ans.status == 401 and ans.text.startswith("bad envelope signature")
    unknown = make_env(src=(7, None), dst=(99, None))
    sign_envelope(unknown, alice)
    core.receive_federation("req3", unknown.SerializeToString(), "10.0.0.1", T0)
    drain(core)
    core.twin_resolved(99, UnknownTwin("unknown twin 99"), T0)
    (ans,) = of(drain(core), FederationAnswer)
    assert ans.status == 404 and ans.request == "req3"
    full = make_env(src=(7, None), dst=(2, None))
    sign_envelope(full, alice)
    core.receive_federation("req4", full.SerializeToString(), "10.0.0.1", T0)
    (enq,) = of(drain(core), Enqueue)
    core.enqueued(enq.token, "full", T0)
    (ans,) = of(drain(core), FederationAnswer)
    assert ans.status == 429 and "queue is full" in ans.text
