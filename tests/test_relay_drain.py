"""Relay graceful drain on SIGTERM (a demo's relay restart lost 2 responses):
the relay stops accepting connections, routes every frame it already received (to its
session, else to the offline queue in Redis), closes each session with 1001 and exits 0;
after a restart on the same port and Redis nothing is missing. Real rmb-relay subprocess,
real rmb-peer daemons and app client/service over real sockets and a real Redis."""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest

from tests.rmb_harness import RmbCluster, _spawn_ready, events_of

TTL = 15          # s: a lost request shows up as 102 after this
WORKERS = 24


async def _restartable_relay(cluster: RmbCluster, tmp_path, name: str = "relay",
                             drain: float = 10.0):
    """A relay subprocess (its own log file) and the argv that restarts it on its port."""
    relay = await cluster.start_relay(subprocess_mode=True)
    relay.proc.kill()                             # same port and domain, our own argv
    relay.proc.wait(5)
    argv = [sys.executable, "-m", "rmb_relay.daemon", "--domain", relay.domain, "--listen",
            relay.domain, "--redis", cluster.redis_url, "--registry", cluster.registry_url,
            "--grace", str(drain), "--log", str(tmp_path / f"{name}.jsonl")]
    relay.proc, _ = await _spawn_ready(argv)
    return relay, argv


@pytest.mark.parametrize("federated", [False, True], ids=["one-relay", "federated"])
async def test_sigterm_drains_and_restart_loses_nothing(redis_url, tmp_path, federated):
    """Request/response traffic in flight (24 concurrent callers) through the relay when it
    gets SIGTERM and is restarted: every call gets its reply or an explicit error, none
    expires (102). federated: the replier's twin is on a second relay (requests and
    responses cross federation both ways)."""
    async with RmbCluster(redis_url, tmp_path) as cluster:
        relay, argv = await _restartable_relay(cluster, tmp_path)
        other = (await _restartable_relay(cluster, tmp_path, "other"))[0] if federated else relay
        a = await cluster.new_twin([relay], pk=False, key_type="ed25519")
        b = await cluster.new_twin([other], pk=False, key_type="ed25519")
        pa = await cluster.start_peer(a, [relay])
        pb = await cluster.start_peer(b, [other])

        async def echo(data: bytes) -> bytes:
            await asyncio.sleep(0.005)
            return data
        cluster.service(pb, "drain", {"drain.echo": echo})
        client = cluster.client(pa)
        await client.call(b.id, "drain.echo", b"warm-up", ttl=TTL)

        stop = asyncio.Event()
        outcomes: list[tuple[bytes, object]] = []

        async def worker(n: int) -> None:
            i = 0
            while not stop.is_set():
                payload = f"{n}-{i}".encode() + os.urandom(64)
                i += 1
                [reply] = await client.call(b.id, "drain.echo", payload, ttl=TTL)
                outcomes.append((payload, reply))

        workers = [asyncio.ensure_future(worker(n)) for n in range(WORKERS)]
        await asyncio.sleep(1.5)
        before = len(outcomes)
        assert before > 0, "no traffic flowed before the restart"
        relay.proc.send_signal(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        code = await loop.run_in_executor(None, relay.proc.wait, 30)
        err = relay.proc.stderr.read()
        assert code == 0, err[-2000:]
        relay.proc, _ = await _spawn_ready(argv)
        deadline = time.monotonic() + TTL + 10
        while len(outcomes) < before + 200 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*workers), TTL + 15)

        lost = [(p, r) for p, r in outcomes if r.code == 102]
        wrong = [(p, r) for p, r in outcomes if r.ok and r.data != p]
        errors = [(r.code, r.message) for _, r in outcomes if not r.ok and r.code != 102]
        log = events_of(tmp_path / "relay.jsonl")
        drained = [e for e in log if e["event"] == "rmb.relay.drained"]
        print(f"calls {len(outcomes)}, ok {sum(r.ok for _, r in outcomes)}, "
              f"explicit errors {len(errors)} {errors[:3]}, lost {len(lost)}; drain {drained}")
        assert not wrong
        assert not lost, f"{len(lost)} of {len(outcomes)} requests got no answer: " \
                         f"{[r.message for _, r in lost[:3]]}"
        assert len(drained) == 1 and drained[0]["attrs"]["reason"].startswith("drained")
        relay.proc.send_signal(signal.SIGTERM)
        assert await loop.run_in_executor(None, relay.proc.wait, 30) == 0


async def test_frames_received_before_sigterm_are_routed(redis_url, tmp_path):
    """A burst the relay has received but not yet routed when SIGTERM arrives: every
    envelope reaches the offline queue (none dropped by the close), the sender's session
    is closed with 1001, the relay exits 0, and after a restart the destination gets all
    of them in order. Raw WebSocket twins with real tokens and signed envelopes."""
    from websockets.asyncio.client import connect

    from rmb_peer.token import make_token
    from tests.relay_harness import IDENTITIES, envelope, recv_env

    burst = 3000
    async with RmbCluster(redis_url, tmp_path) as cluster:
        relay, argv = await _restartable_relay(cluster, tmp_path)
        a = await cluster.new_twin([relay], pk=False, key_type="ed25519")
        c = await cluster.new_twin([relay], pk=False, key_type="ed25519")
        IDENTITIES[a.id] = a.identity

        def ws_url(t):
            return f"ws://{relay.domain}/?{make_token(t.identity, t.id, None, int(time.time()), 300)}"

        sent = []
        frames = []
        for i in range(burst):
            env = envelope((a.id,), (c.id,), payload=f"burst {i}".encode(), ttl=300)
            sent.append(env.uid)
            frames.append(env.SerializeToString())
        loop = asyncio.get_running_loop()
        async with connect(ws_url(a), max_queue=None) as wa:
            await recv_nothing(wa)
            for f in frames:
                await wa.send(f)
            relay.proc.send_signal(signal.SIGTERM)     # most of the burst is not routed yet
            await asyncio.wait_for(wa.wait_closed(), 30)
            assert wa.close_code == 1001, (wa.close_code, wa.close_reason)
        code = await loop.run_in_executor(None, relay.proc.wait, 30)
        assert code == 0, relay.proc.stderr.read()[-2000:]
        relay.proc, _ = await _spawn_ready(argv)
        got = []
        async with connect(ws_url(c), max_queue=None) as wc:
            while len(got) < burst:
                try:
                    got.append((await recv_env(wc, timeout=10)).uid)
                except asyncio.TimeoutError:
                    break
        assert got == sent, f"{len(got)} of {burst} envelopes delivered after the restart"
        log = events_of(tmp_path / "relay.jsonl")
        drained = [e["attrs"] for e in log if e["event"] == "rmb.relay.drained"]
        assert drained and drained[0]["reason"].startswith("drained") and drained[0]["count"] == 1
        relay.proc.send_signal(signal.SIGTERM)
        assert await loop.run_in_executor(None, relay.proc.wait, 30) == 0


async def recv_nothing(ws, wait: float = 0.2) -> None:
    """The relay has the session registered (its offline replay found nothing to send)."""
    try:
        frame = await asyncio.wait_for(ws.recv(), wait)
    except asyncio.TimeoutError:
        return
    raise AssertionError(f"unexpected frame {frame!r}")


def _ws_url(relay, t) -> str:
    from rmb_peer.token import make_token
    tok = make_token(t.identity, t.id, None, int(time.time()), 300)
    return f"ws://{relay.domain}/?{tok}"


async def _send_federated(wa, a, d, count: int, log_path, event: str) -> list[str]:
    """Sends `count` envelopes a -> d on `wa` and waits (30 s at most) until the sending
    relay's log at `log_path` holds `event` for each; returns their uids."""
    from tests.relay_harness import envelope
    sent = []
    for i in range(count):
        env = envelope((a.id,), (d.id,), payload=f"fed {i}".encode(), ttl=120)
        sent.append(env.uid)
        await wa.send(env.SerializeToString())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        log = events_of(log_path) if log_path.exists() else []
        if sum(e["event"] == event for e in log) >= count:
            break
        await asyncio.sleep(0.1)
    return sent


async def test_pending_federation_is_saved_and_resumed(redis_url, tmp_path):
    """Federation jobs still retrying when SIGTERM arrives (their relay is down) are saved
    to the Redis outbox and resumed by the next start: the destination twin, whose relay
    comes up meanwhile, gets every request (before: dropped, logged as expired)."""
    from websockets.asyncio.client import connect

    from tests.relay_harness import IDENTITIES, recv_env

    count = 20
    async with RmbCluster(redis_url, tmp_path) as cluster:
        r1, argv1 = await _restartable_relay(cluster, tmp_path, "r1")
        r2, argv2 = await _restartable_relay(cluster, tmp_path, "r2")
        loop = asyncio.get_running_loop()
        r2.proc.send_signal(signal.SIGTERM)                    # r2 is down for now
        assert await loop.run_in_executor(None, r2.proc.wait, 30) == 0
        a = await cluster.new_twin([r1], pk=False, key_type="ed25519")
        d = await cluster.new_twin([r2], pk=False, key_type="ed25519")
        IDENTITIES[a.id] = a.identity

        async with connect(_ws_url(r1, a)) as wa:
            sent = await _send_federated(wa, a, d, count, tmp_path / "r1.jsonl",
                                         "rmb.relay.received")
            r1.proc.send_signal(signal.SIGTERM)
            assert await loop.run_in_executor(None, r1.proc.wait, 30) == 0
        saved = [e["attrs"] for e in events_of(tmp_path / "r1.jsonl")
                 if e["event"] == "rmb.relay.federation_outbox"]
        assert saved == [{"count": count, "reason": "saved at shutdown"}]
        told = [e["trace_id"] for e in events_of(tmp_path / "r1.jsonl")
                if e["event"] == "rmb.relay.federation_saved"]
        assert sorted(told) == sorted(sent)           # each envelope named for its sender

        r2.proc, _ = await _spawn_ready(argv2)
        got = []
        async with connect(_ws_url(r2, d)) as wd:
            r1.proc, _ = await _spawn_ready(argv1)             # resumes the saved jobs
            while len(got) < count:
                try:
                    got.append((await recv_env(wd, timeout=20)).uid)
                except asyncio.TimeoutError:
                    break
        assert sorted(got) == sorted(sent), f"{len(got)} of {count} federated after the restart"
        for proc in (r1.proc, r2.proc):
            proc.send_signal(signal.SIGTERM)
            assert await loop.run_in_executor(None, proc.wait, 30) == 0


async def test_drain_federates_to_a_twin_that_moved_off_a_dead_relay(redis_url, tmp_path):
    """A relay retired for good never resumes its federation outbox. Its drain tries the
    pending federation jobs within --grace, following a fresh registry record: requests
    for a twin whose relay died and who moved to another relay reach it there, none is
    saved (before: all were saved to the outbox at SIGTERM and expired unseen)."""
    from websockets.asyncio.client import connect

    from tests.relay_harness import IDENTITIES, recv_env

    count = 10
    async with RmbCluster(redis_url, tmp_path) as cluster:
        r1, _argv1 = await _restartable_relay(cluster, tmp_path, "r1")
        old, _ = await _restartable_relay(cluster, tmp_path, "old")
        r2, _ = await _restartable_relay(cluster, tmp_path, "r2")
        loop = asyncio.get_running_loop()
        old.proc.send_signal(signal.SIGTERM)                   # the retired relay
        assert await loop.run_in_executor(None, old.proc.wait, 30) == 0
        a = await cluster.new_twin([r1], pk=False, key_type="ed25519")
        d = await cluster.new_twin([old], pk=False, key_type="ed25519")
        IDENTITIES[a.id] = a.identity

        async with connect(_ws_url(r1, a)) as wa:
            # every job failed once at `old`
            sent = await _send_federated(wa, a, d, count, tmp_path / "r1.jsonl",
                                         "rmb.relay.federation_failed")
            await cluster.directory.update(d.identity, d.id, [r2.domain], None)   # d moved
            async with connect(_ws_url(r2, d)) as wd:
                await recv_nothing(wd)
                r1.proc.send_signal(signal.SIGTERM)         # r1 is retired too
                got = []
                while len(got) < count:
                    try:
                        got.append((await recv_env(wd, timeout=20)).uid)
                    except asyncio.TimeoutError:
                        break
                assert await loop.run_in_executor(None, r1.proc.wait, 30) == 0
        log = events_of(tmp_path / "r1.jsonl")
        assert sorted(got) == sorted(sent), f"{len(got)} of {count} federated by the drain"
        assert not [e for e in log if e["event"] in ("rmb.relay.federation_outbox",
                                                     "rmb.relay.federation_saved")]
        assert any(e["event"] == "rmb.relay.retargeted" and e["attrs"]["twin"] == d.id
                   for e in log)
        r2.proc.send_signal(signal.SIGTERM)
        assert await loop.run_in_executor(None, r2.proc.wait, 30) == 0
