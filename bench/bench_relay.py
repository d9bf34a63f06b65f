"""Relay throughput: envelopes/s on the local route, against a raw websockets forwarder.

    .venv/bin/python bench/bench_relay.py [--count 50000] [--seconds 10] [--rounds 5]
                                          [--loop auto|uvloop|asyncio]

Both servers run as their own process on 127.0.0.1 and are driven by the SAME client
code (websockets library): one sender pipelines binary frames as fast as the socket
takes them, one receiver counts them; rate = frames received / time from first send to
last receive. Each run stops at --count envelopes or --seconds, whichever comes first.

- rmb-relay: the real daemon (`python -m rmb_relay.daemon`, event log at info to a file),
  a real registry, embedded Redis (or $REDIS_URL), two twins connected with real tokens;
  the sender's envelopes are 1 KiB-payload requests A -> B (the relay parses each one,
  checks its source and expiry (no --limit, the default), writes it to B's connection
  without touching Redis, and logs one `rmb.relay.forwarded` event at info to its file).
- baseline: a websockets-library server that forwards every binary frame from the first
  connection to the second, nothing else (`--baseline-server`).
Both servers and the client run on the SAME event loop implementation (--loop; auto =
uvloop when installed, the relay's default), so the loop is not what is compared.

One warm-up run of each (not counted), then --rounds interleaved rounds (baseline, relay,
baseline, relay, ...: ABAB, so load drift on a shared machine hits both). Prints every run,
each pair's relay/baseline ratio (throughput, and server CPU per envelope) and the median of
the pairs' ratios, then best and median of the rounds for: envelopes/s, server CPU time per envelope and the
client's CPU per envelope (from /proc and getrusage: robust on a shared machine where
wall-clock rates swing), and relay/baseline (target >= 0.90) for the best and the median.
Bounded: at most (rounds + 1) x 2 x (--seconds + a few s). Not part of the test suite.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


# ------------------------------------------------------------------ baseline server
async def baseline_server() -> None:
    from websockets.asyncio.server import serve

    conns: list = []
    ready = asyncio.Event()

    async def handler(ws):
        conns.append(ws)
        if len(conns) == 2:
            ready.set()
        if len(conns) == 1:            # the sender: forward each frame to the receiver
            await ready.wait()
            async for frame in ws:
                await conns[1].send(frame)
        else:
            await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0, max_size=2 * 1024 * 1024, compression=None) as srv:
        port = srv.sockets[0].getsockname()[1]
        print("READY " + json.dumps({"port": port}), flush=True)
        await asyncio.Future()


# ------------------------------------------------------------------ client side
def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a process so far (psutil), 0 when it is gone."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return t.user + t.system


def start_proc(args: list[str], env=None) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env=env)
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"{args[:3]} did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc, json.loads(line[6:])


def stop_proc(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def main_async(opts) -> None:
    from daemon_runtime.redis_server import EmbeddedRedis
    from rmb_peer.envelope import Envelope, new_uid
    from rmb_peer.identity import Identity
    from rmb_peer.token import make_token
    from rmb_peer.twins import TwinDirectory

    tmp = Path(tempfile.mkdtemp(prefix="bench-relay-"))
    redis_srv = None
    redis_url = os.environ.get("REDIS_URL")
    if not redis_url:
        redis_srv = EmbeddedRedis().start()
        redis_url = redis_srv.url
    procs: list[subprocess.Popen] = []
    try:
        reg, reg_info = start_proc([sys.executable, "-m", "rmb_relay.registry", "--listen",
                                    "127.0.0.1:0", "--redis", redis_url, "--log", str(tmp / "reg.jsonl")])
        procs.append(reg)
        registry = f"http://127.0.0.1:{reg_info['port']}"
        domain = "bench-relay.local"
        prof = ["-m", "cProfile", "-o", opts.profile] if opts.profile else []
        relay, relay_info = start_proc([sys.executable, *prof, "-m", "rmb_relay.daemon", "-m", domain,
                                        "--listen", "127.0.0.1:0", "--redis", redis_url,
                                        "--registry", registry, "--log", str(tmp / "relay.jsonl"),
                                        "--event-loop", opts.loop] + opts.relay_args)
        procs.append(relay)
        print(f"relay pid {relay.pid}, log {tmp / 'relay.jsonl'}", flush=True)
        base_cmd = [sys.executable, __file__, "--baseline-server", "--loop", opts.loop]
        base, base_info = start_proc(base_cmd)
        procs.append(base)

        directory = TwinDirectory(registry)
        ia = Identity.from_seed(os.urandom(32), "ed25519")
        ib = Identity.from_seed(os.urandom(32), "ed25519")
        a = (await directory.create(ia, [domain], None)).id
        b = (await directory.create(ib, [domain], None)).id
        await directory.close()

        payload = os.urandom(opts.payload)
        frames = []
        now = int(time.time())
        for _ in range(opts.count):
            env = Envelope()
            env.uid = new_uid()
            env.timestamp = now
            env.expiration = 3600
            env.source.twin = a
            env.destination.twin = b
            env.request.command = "bench.echo"
            env.plain = payload
            frames.append(env.SerializeToString())

        rport = relay_info["port"]
        runs: dict[str, list[tuple[float, float, float]]] = {"baseline": [], "relay": []}
        client_cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])  # noqa: E731
        plan = [("baseline", True), ("relay", True)] + [("baseline", False), ("relay", False)] * opts.rounds
        plan = [(n, w) for n, w in plan if opts.only in (None, n)]
        for name, warmup in plan:   # interleaved rounds after one warm-up run each
            if name == "relay":
                t = int(time.time())
                send_url = f"ws://127.0.0.1:{rport}/?{make_token(ia, a, None, t, 600)}"
                recv_url = f"ws://127.0.0.1:{rport}/?{make_token(ib, b, None, t, 600)}"
            else:
                # restart the forwarder so "first connection = sender" holds each run
                stop_proc(base)
                procs.remove(base)
                base, base_info = start_proc(base_cmd)
                procs.append(base)
                send_url = recv_url = f"ws://127.0.0.1:{base_info['port']}/"
            server = relay if name == "relay" else base
            cpu0, ccpu0 = cpu_seconds(server.pid), client_cpu()
            got, elapsed = await drive(send_url, recv_url, frames, opts.seconds)
            cpu, ccpu = cpu_seconds(server.pid) - cpu0, client_cpu() - ccpu0
            rate = got / elapsed if elapsed > 0 else 0.0
            us = cpu / got * 1e6 if got else float("inf")
            cus = ccpu / got * 1e6 if got else float("inf")
            if not warmup:
                runs[name].append((rate, us, cus))
            print(f"{name:9s}{' (warm-up)' if warmup else '          '} {got:6d} envelopes of "
                  f"{len(frames[0])} B in {elapsed:6.3f} s = {rate:7.0f} envelopes/s; CPU per "
                  f"envelope: server {us:5.1f} us, client {cus:5.1f} us", flush=True)
        summary = {}
        if opts.only:
            return
        for name, rows in runs.items():
            rates = [r[0] for r in rows]
            scpu = [r[1] for r in rows]
            ccpu = [r[2] for r in rows]
            summary[name] = (max(rates), statistics.median(rates), min(scpu),
                             statistics.median(scpu), statistics.median(ccpu))
            print(f"{name:9s} best {max(rates):7.0f}/s, median {statistics.median(rates):7.0f}/s; "
                  f"server CPU best {min(scpu):5.1f} us, median {statistics.median(scpu):5.1f} us; "
                  f"client CPU median {statistics.median(ccpu):5.1f} us per envelope")
        # ABAB pairs: round i of the baseline ran right before round i of the relay, so
        # load drift on the shared machine hits both sides of a pair alike
        pairs = []
        for i, (b_row, r_row) in enumerate(zip(runs["baseline"], runs["relay"]), 1):
            ratio = r_row[0] / b_row[0] if b_row[0] else 0.0
            cpu_ratio = b_row[1] / r_row[1] if r_row[1] else 0.0
            pairs.append((ratio, cpu_ratio))
            print(f"pair {i}: relay {r_row[0]:7.0f}/s / baseline {b_row[0]:7.0f}/s = {ratio:.2f}; "
                  f"server CPU baseline/relay {b_row[1]:.1f}/{r_row[1]:.1f} us = {cpu_ratio:.2f}")
        pair_median = statistics.median(p[0] for p in pairs)
        cpu_median = statistics.median(p[1] for p in pairs)
        print(f"PAIRS median relay/baseline throughput ratio {pair_median:.2f} (target >= 0.90), "
              f"median server CPU ratio baseline/relay {cpu_median:.2f}")
        rb, rm = summary["relay"][0], summary["relay"][1]
        bb, bm = summary["baseline"][0], summary["baseline"][1]
        print(f"RESULT relay {rb:.0f} envelopes/s (median {rm:.0f}), raw websockets forwarding "
              f"baseline {bb:.0f} envelopes/s (median {bm:.0f}), ratio best {rb / bb:.2f}, "
              f"median {rm / bm:.2f}, median of the pairs' ratios {pair_median:.2f} (target >= 0.90); server CPU per envelope (median) relay "
              f"{summary['relay'][3]:.1f} us, baseline {summary['baseline'][3]:.1f} us; "
              f"event loop {opts.loop_used}, {opts.rounds} rounds, load {os.getloadavg()[0]:.1f}")
        from result_file import write_result
        write_result("relay", {"envelopes_per_s_best": rb, "envelopes_per_s_median": rm,
                               "server_cpu_per_envelope_us": summary["relay"][3]},
                     {"raw_forwarder_per_s_best": bb, "raw_forwarder_per_s_median": bm,
                      "raw_server_cpu_per_envelope_us": summary["baseline"][3]},
                     {"best": rb / bb, "median": rm / bm, "median_of_pairs": pair_median,
                      "server_cpu_baseline/relay": cpu_median})
    finally:
        for proc in procs:
            stop_proc(proc)
        if redis_srv is not None:
            redis_srv.stop()


async def drive(send_url: str, recv_url: str, frames: list[bytes], seconds: float) -> tuple[int, float]:
    """Connects the sender first (the baseline forwarder's rule), then the receiver; a
    pipelined sender and a counting receiver. Returns (frames received, elapsed s)."""
    from websockets.asyncio.client import connect

    tx = await connect(send_url, max_size=None, compression=None)
    rx = await connect(recv_url, max_size=None, compression=None)
    try:
        return await _drive_pair(tx, rx, frames, seconds)
    finally:
        await tx.close()
        await rx.close()


async def _drive_pair(tx, rx, frames, seconds):
    await asyncio.sleep(0.3)
    total = len(frames)
    got = 0
    done = asyncio.Event()
    start = time.perf_counter()
    last = start

    async def receiver():
        nonlocal got, last
        async for _frame in rx:
            got += 1
            last = time.perf_counter()
            if got >= total:
                break
        done.set()

    rtask = asyncio.create_task(receiver())
    deadline = start + seconds
    for i, frame in enumerate(frames):
        await tx.send(frame)
        if i % 256 == 0 and time.perf_counter() > deadline:
            break
    try:
        await asyncio.wait_for(done.wait(), timeout=max(1.0, seconds - (time.perf_counter() - start)) + 2)
    except asyncio.TimeoutError:
        pass
    rtask.cancel()
    return got, last - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--count", type=int, default=50000, help="envelopes per run (default 50000)")
    p.add_argument("--seconds", type=float, default=10.0, help="time bound per run, s (default 10)")
    p.add_argument("--rounds", type=int, default=5,
                   help="interleaved rounds after the warm-up; best and median (default 5)")
    p.add_argument("--loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                   help="event loop of both servers and the client (default auto = uvloop if installed)")
    p.add_argument("--payload", type=int, default=1024, help="payload bytes (default 1024)")
    p.add_argument("--relay-arg", dest="relay_args", action="append", default=[],
                   help="extra rmb-relay flag (repeatable), e.g. --relay-arg=--log-level=warning")
    p.add_argument("--profile", metavar="PATH", help="run the relay under cProfile, stats to PATH")
    p.add_argument("--only", choices=("relay", "baseline"), default=None,
                   help="run only one side (for profiling, e.g. py-spy on the printed relay pid)")
    p.add_argument("--baseline-server", action="store_true", help=argparse.SUPPRESS)
    opts = p.parse_args()
    from daemon_runtime.lifecycle import use_event_loop
    opts.loop_used = use_event_loop(opts.loop)
    if opts.baseline_server:
        asyncio.run(baseline_server())
        return
    asyncio.run(main_async(opts))


if __name__ == "__main__":
    main()
