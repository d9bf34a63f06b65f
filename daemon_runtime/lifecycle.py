"""Daemon lifecycle: SIGTERM/SIGINT graceful shutdown, the READY line, /health and /metrics.

    async def main(stop: asyncio.Event) -> None:
        ...start servers...; Ready(port=port).announce()
        await stop.wait()
        ...stop accepting, tell peers, drain up to the grace timeout, cancel...

    def cli(argv=None) -> int:
        return run_daemon(main)

Every daemon prints exactly one `READY {json}` line on stdout once its listeners are bound
(ports included, so port 0 works), which the launcher and the tests wait for. The event log
goes to `--log` (a file, or stdout as JSON lines, which never start with "READY").
"""
from __future__ import annotations

import asyncio
import gc
import json
import signal
import sys
from typing import Awaitable, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


class Ready:
    """The one-line readiness announcement: `READY {"port": 8101, ...}` on stdout, flushed."""

    PREFIX = "READY "

    def __init__(self, **info):
        self.info = info

    def announce(self, stream=None) -> None:
        """Write the line (default: stdout) and flush. In a process started by
        run_daemon, the start-up heap is then frozen (freeze_heap): the daemon is ready,
        what exists now lives as long as the process."""
        stream = stream or sys.stdout
        stream.write(self.PREFIX + json.dumps(self.info, sort_keys=True) + "\n")
        stream.flush()
        if _in_run_daemon:
            freeze_heap()

    @classmethod
    def parse(cls, line: str) -> dict | None:
        """The info dict of a READY line, or None for any other line."""
        if not line.startswith(cls.PREFIX):
            return None
        return json.loads(line[len(cls.PREFIX):])


def add_status_routes(app: web.Application, registry: CollectorRegistry,
                      health: Callable[[], dict]) -> None:
    """GET /metrics: Prometheus text of `registry`. GET /health: health() as JSON, status
    200 when health()["ok"] is true, else 503."""

    async def metrics(_request: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_request: web.Request) -> web.Response:
        state = health()
        return web.json_response(state, status=200 if state.get("ok") else 503)

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", healthz)


async def start_status_server(host: str, port: int, registry: CollectorRegistry,
                              health: Callable[[], dict]) -> tuple[web.AppRunner, int]:
    """Serves /metrics and /health on host:port (0 = any free port). Returns the runner
    (call `await runner.cleanup()` on shutdown) and the bound port. Raises OSError when
    the port is taken."""
    app = web.Application()
    add_status_routes(app, registry, health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # aiohttp exposes no public accessor
    return runner, bound


def parse_hostport(value: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """'HOST:PORT' or ':PORT' or 'PORT' -> (host, port). Raises ValueError."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "", value
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"bad port in {value!r}") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"port out of range in {value!r}")
    return (host.strip("[]") or default_host), number


#: Set by run_daemon: this process is a daemon (Ready.announce then freezes the heap).
_in_run_daemon = False


def freeze_heap() -> int:
    """gc.collect(), then gc.freeze(): every object alive now (modules, classes, the
    daemon's long-lived state: tens of thousands of objects) moves to the permanent
    generation, which the cyclic GC never scans again. Returns the number frozen.

    Why: a full (generation 2) collection walks every tracked object; with the ~50-80k
    objects of a running daemon it paused the event loop for 14-28 ms on the 2-core
    bench VM (measured with gc.callbacks in bench_roundtrip's processes), a latency spike
    on every message in flight. Frozen, a full collection walks only what was allocated
    since. Call it once, when start-up is over (Ready.announce does it for run_daemon
    processes); apps serving latency-sensitive traffic may call it themselves."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def use_event_loop(kind: str) -> str:
    """Install the event loop policy for `kind` ("auto" | "uvloop" | "asyncio") before
    asyncio.run (run_daemon); returns the one in use. "uvloop" without uvloop installed exits
    2. The daemons' `--event-loop` flag (rmb-peer, rmb-relay, remp-node; default auto =
    uvloop when installed: libuv's loop runs the per-datagram and per-timer callbacks
    without the standard loop's Python-level select and handle scheduling)."""
    if kind in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise SystemExit("--event-loop uvloop: uvloop is not installed")
            return "asyncio"
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        return "uvloop"
    return "asyncio"


def run_daemon(main: Callable[[asyncio.Event], Awaitable[None]]) -> int:
    """Runs main(stop) under asyncio; SIGTERM and SIGINT set `stop` (a second signal
    cancels main). Returns 0 after main returns, 1 if it raised (the error is printed).
    The heap is frozen once the daemon announces READY (see freeze_heap)."""
    global _in_run_daemon
    _in_run_daemon = True

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()

        def on_signal() -> None:
            if stop.is_set():
                task.cancel()
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        await main(stop)

    try:
        asyncio.run(runner())
    except asyncio.CancelledError:
        return 0
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # the one boundary: report and exit non-zero
        print(f"fatal: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0
