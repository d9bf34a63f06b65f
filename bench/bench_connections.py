"""Many concurrent authenticated peers on one relay: RSS per connection and the control
round trip while they are connected.

    .venv/bin/python bench/bench_connections.py [--connections 10000] [--workers 4]
                                                [--twins 100] [--rounds 300]

- rmb-relay: the real daemon (`python -m rmb_relay.daemon`, uvloop when installed, event
  log at info to a file), a real registry (--data-dir in a temp dir) and embedded Redis.
  RLIMIT_NOFILE is raised to the hard limit in this process, the workers and the relay
  (the relay does it itself at start).
- --connections WebSockets, each authenticated with its own JWT: --twins registered
  twins x (connections / twins) session ids (one connection per (twin, sid), as rmb-rs).
  Opened by --workers client processes (websockets library), at most 200 handshakes in
  flight per worker; every connection stays open (the clients answer the relay's pings).
- control: two more twins A and B on the same relay; A sends --rounds requests to B one
  at a time (B's client echoes each back as a response through the relay) while all
  connections are open. Round trip = A's send -> A's receipt of the response (two relay
  traversals). Printed: p50/p99/max, the target (p99 <= 50 ms) and, measured in the
  same run before the crowd connected, the control round trip on an idle relay (the
  baseline). RSS per connection = (relay RSS with all connected - RSS before) / N.

Bounded: connect phase at most --connect-timeout s (default 300). Not part of the tests.
Note the machine load (printed from /proc/loadavg) when reading the figures.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def start_proc(args: list[str]) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO)
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"{args[:3]} did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc, json.loads(line[6:])


def stop_proc(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------ worker processes
def worker(port: int, tokens: list[str], conn, timeout: float) -> None:
    """Opens one WebSocket per token, reports how many are open, holds them until told."""
    raise_nofile()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_worker(port, tokens, conn, timeout))


async def _worker(port, tokens, conn, timeout):
    from websockets.asyncio.client import connect

    sem = asyncio.Semaphore(200)
    socks: list = []
    failures = 0

    async def one(tok):
        nonlocal failures
        async with sem:
            for _attempt in range(3):
                try:
                    ws = await connect(f"ws://127.0.0.1:{port}/?{tok}", open_timeout=60,
                                       compression=None, ping_interval=None)
                    socks.append(ws)
                    return
                except Exception:  # noqa: BLE001 - retried, then counted
                    await asyncio.sleep(0.5)
            failures += 1

    try:
        await asyncio.wait_for(asyncio.gather(*(one(t) for t in tokens)), timeout)
    except asyncio.TimeoutError:
        pass
    conn.send(("open", len(socks), failures))
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, conn.recv)          # "close"
    await asyncio.gather(*(ws.close() for ws in socks), return_exceptions=True)
    conn.send(("closed", len(socks), 0))


# ------------------------------------------------------------------ control round trip
async def control_rounds(port, ia, a, ib, b, rounds: int) -> list[float]:
    from websockets.asyncio.client import connect
    from rmb_peer.envelope import Envelope, new_uid
    from rmb_peer.token import make_token

    now = int(time.time())
    wa = await connect(f"ws://127.0.0.1:{port}/?{make_token(ia, a, 'ctl', now, 3600)}",
                       compression=None)
    wb = await connect(f"ws://127.0.0.1:{port}/?{make_token(ib, b, 'ctl', now, 3600)}",
                       compression=None)

    async def echo():
        async for frame in wb:
            req = Envelope.FromString(frame)
            resp = Envelope()
            resp.uid = req.uid
            resp.timestamp = int(time.time())
            resp.expiration = 60
            resp.source.twin, resp.source.connection = b, "ctl"
            resp.destination.CopyFrom(req.source)
            resp.response.SetInParent()
            resp.plain = req.plain
            await wb.send(resp.SerializeToString())

    task = asyncio.create_task(echo())
    await asyncio.sleep(0.3)
    times = []
    try:
        for i in range(rounds):
            env = Envelope()
            env.uid = new_uid()
            env.timestamp = int(time.time())
            env.expiration = 60
            env.source.twin, env.source.connection = a, "ctl"
            env.destination.twin, env.destination.connection = b, "ctl"
            env.request.command = "bench.ping"
            env.plain = os.urandom(64)
            t0 = time.perf_counter()
            await wa.send(env.SerializeToString())
            while True:
                got = Envelope.FromString(await asyncio.wait_for(wa.recv(), 10))
                if got.uid == env.uid:
                    break
            times.append((time.perf_counter() - t0) * 1000.0)
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await wa.close()
        await wb.close()
    return times


async def churn(port, ident, twin, pid, n: int) -> None:
    """Connection churn: n authenticated connect + close cycles (distinct sids, 50 at a
    time, half closed cleanly, half aborted without a close frame); relay RSS and open fds
    before, after and 3 s later (a closed connection must be freed at once)."""
    from websockets.asyncio.client import connect
    from rmb_peer.token import make_token

    def fds():
        return len(os.listdir(f"/proc/{pid}/fd"))

    rss_a, fd_a = rss_kib(pid), fds()
    sem = asyncio.Semaphore(50)
    now = int(time.time())

    async def one(i):
        async with sem:
            ws = await connect(f"ws://127.0.0.1:{port}/?{make_token(ident, twin, f'c{i}', now, 3600)}",
                               compression=None, open_timeout=60)
            if i % 2:
                await ws.close()
            else:
                ws.transport.abort()

    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(n)))
    took = time.monotonic() - started
    rss_b, fd_b = rss_kib(pid), fds()
    await asyncio.sleep(3)
    rss_c, fd_c = rss_kib(pid), fds()
    print(f"RESULT churn {n} connect+close cycles in {took:.1f} s: relay RSS {rss_a / 1024:.1f} "
          f"-> {rss_b / 1024:.1f} MiB (3 s later {rss_c / 1024:.1f} MiB, "
          f"{(rss_c - rss_a) / max(1, n) * 1000 / 1024:.2f} MiB per 1,000 cycles); open fds "
          f"{fd_a} -> {fd_b} -> {fd_c}; load {open('/proc/loadavg').read().split()[0]}",
          flush=True)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


async def main_async(opts) -> None:
    from daemon_runtime.redis_server import EmbeddedRedis
    from rmb_peer.identity import Identity
    from rmb_peer.token import make_token
    from rmb_peer.twins import TwinDirectory

    limit = raise_nofile()
    print(f"RLIMIT_NOFILE here {limit}; load {open('/proc/loadavg').read().strip()}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-conns-"))
    redis_srv = EmbeddedRedis().start()
    procs: list[subprocess.Popen] = []
    workers: list = []
    try:
        reg, reg_info = start_proc([sys.executable, "-m", "rmb_relay.registry", "--listen",
                                    "127.0.0.1:0", "--data-dir", str(tmp / "registry"),
                                    "--log", str(tmp / "reg.jsonl")])
        procs.append(reg)
        registry = f"http://127.0.0.1:{reg_info['port']}"
        domain = "bench-conns.local"
        relay, info = start_proc([sys.executable, "-m", "rmb_relay.daemon", "-m", domain,
                                  "--listen", "127.0.0.1:0", "--redis", redis_srv.url,
                                  "--registry", registry, "--log", str(tmp / "relay.jsonl"),
                                  "--twin-cache-ttl", "600"])
        procs.append(relay)
        port = info["port"]
        nofile = Path(f"/proc/{relay.pid}/limits").read_text()
        nofile = [ln for ln in nofile.splitlines() if ln.startswith("Max open files")][0]
        print(f"relay pid {relay.pid} ({' '.join(nofile.split()[3:5])} soft/hard fds)", flush=True)

        directory = TwinDirectory(registry)
        idents = [Identity.from_seed(os.urandom(32), "ed25519") for _ in range(opts.twins + 2)]
        twins = []
        for ident in idents:
            twins.append((await directory.create(ident, [domain], None)).id)
        await directory.close()
        ia, a, ib, b = idents[-2], twins[-2], idents[-1], twins[-1]

        idle = await control_rounds(port, ia, a, ib, b, opts.rounds)
        if opts.churn:
            await churn(port, idents[0], twins[0], relay.pid, opts.churn)
            return
        rss0 = rss_kib(relay.pid)
        now = int(time.time())
        per_twin = -(-opts.connections // opts.twins)
        tokens = []
        for i in range(opts.connections):
            t = i % opts.twins
            tokens.append(make_token(idents[t], twins[t], f"s{i // opts.twins}", now, 3600))
        assert per_twin >= 1
        ctx = mp.get_context("spawn")
        started = time.monotonic()
        for w in range(opts.workers):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker, args=(port, tokens[w::opts.workers], child,
                                                 opts.connect_timeout), daemon=True)
            p.start()
            workers.append((p, parent))
        opened = failed = 0
        for p, parent in workers:
            if parent.poll(opts.connect_timeout + 30):
                _, n, f = parent.recv()
                opened += n
                failed += f
        connect_s = time.monotonic() - started
        await asyncio.sleep(2.0)
        rss1 = rss_kib(relay.pid)
        busy = await control_rounds(port, ia, a, ib, b, opts.rounds)
        rss2 = rss_kib(relay.pid)
        per_conn = (rss1 - rss0) / max(1, opened)
        print(f"connected {opened} of {opts.connections} authenticated WebSockets "
              f"({failed} failed) in {connect_s:.1f} s with {opts.workers} client processes",
              flush=True)
        print(f"relay RSS {rss0 / 1024:.1f} MiB before, {rss1 / 1024:.1f} MiB with them "
              f"({rss2 / 1024:.1f} MiB after the control rounds): {per_conn:.1f} KiB per "
              f"connection", flush=True)
        for name, t in (("idle relay (baseline)", idle), (f"{opened} connected", busy)):
            print(f"control round trip, {name}: p50 {pct(t, .5):.2f} ms, p99 {pct(t, .99):.2f} "
                  f"ms, max {max(t):.2f} ms over {len(t)} rounds", flush=True)
        p99 = pct(busy, .99)
        print(f"RESULT {opened} connections, control round trip p99 {p99:.2f} ms (target <= 50 "
              f"ms: {'met' if p99 <= 50 and opened >= opts.connections else 'NOT met'}), idle "
              f"p99 {pct(idle, .99):.2f} ms, ratio {p99 / max(1e-9, pct(idle, .99)):.1f}x; "
              f"{per_conn:.1f} KiB RSS per connection; load "
              f"{open('/proc/loadavg').read().split()[0]}", flush=True)
        from result_file import write_result
        write_result("connections", {"connections": opened, "failed": failed, "connect_s": connect_s,
                                     "rss_per_connection_kib": per_conn, "control_p50_ms": pct(busy, .5),
                                     "control_p99_ms": p99},
                     {"idle_control_p50_ms": pct(idle, .5), "idle_control_p99_ms": pct(idle, .99)},
                     {"p99/idle_p99": p99 / max(1e-9, pct(idle, .99))})
    finally:
        for p, parent in workers:
            try:
                parent.send("close")
            except (OSError, BrokenPipeError):
                pass
        for p, _parent in workers:
            p.join(30)
            if p.is_alive():
                p.kill()
        for proc in procs:
            stop_proc(proc)
        redis_srv.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--connections", type=int, default=10000,
                   help="concurrent authenticated connections (default 10000)")
    p.add_argument("--workers", type=int, default=4, help="client processes (default 4)")
    p.add_argument("--twins", type=int, default=100,
                   help="registered twins the connections are spread over (default 100)")
    p.add_argument("--rounds", type=int, default=300,
                   help="control round trips per measurement (default 300)")
    p.add_argument("--churn", type=int, default=0, metavar="N",
                   help="instead: N connect+close cycles, relay RSS and fds before/after "
                        "(closed connections freed at once); 0 = off (default)")
    p.add_argument("--connect-timeout", type=float, default=300.0,
                   help="bound on the connect phase, s (default 300)")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
