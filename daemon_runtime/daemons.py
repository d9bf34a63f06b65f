"""Daemon subprocesses: the process plumbing of the local networks (remp_node/testnet/localnet.py,
marlin_cluster/localnet.py) and of the launcher (deploy/).

    Daemon(name, argv, logdir): start(timeout) -> READY info dict; stop(grace) -> exit code;
    alive(); died() (exited and not asked to); stderr_tail(lines)
    script(name) -> path of the console script next to this interpreter
    LaunchError: a cluster that cannot start or keep running; the message says what and why.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from daemon_runtime.lifecycle import Ready


class LaunchError(RuntimeError):
    """A cluster that cannot start or keep running; the message says what and why."""


@dataclass
class Daemon:
    """One daemon subprocess: its command, READY info, logs and liveness."""

    name: str
    argv: list[str]
    logdir: Path
    proc: asyncio.subprocess.Process | None = None
    info: dict = field(default_factory=dict)
    expected_exit: bool = False
    starts: int = 0

    @property
    def stderr_path(self) -> Path:
        return self.logdir / f"{self.name}.stderr"

    async def start(self, timeout: float) -> dict:
        self.starts += 1
        err = open(self.stderr_path, "ab")
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv, stdout=asyncio.subprocess.PIPE, stderr=err,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        finally:
            err.close()
        # only now: while the new process was being created, the old one (stopped on
        # purpose, e.g. a planned restart) still counts as an expected exit
        self.proc, self.expected_exit = proc, False
        try:
            self.info = await asyncio.wait_for(self._read_ready(), timeout)
        except asyncio.TimeoutError:
            await self.stop(1)
            raise LaunchError(f"{self.name} did not report READY within {timeout:.0f} s; "
                              f"see {self.stderr_path}:\n{self.stderr_tail()}") from None
        asyncio.ensure_future(self._drain_stdout())
        return self.info

    async def _read_ready(self) -> dict:
        assert self.proc and self.proc.stdout
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                code = await self.proc.wait()
                raise LaunchError(f"{self.name} exited with code {code} before READY; "
                                  f"see {self.stderr_path}:\n{self.stderr_tail()}")
            info = Ready.parse(line.decode(errors="replace"))
            if info is not None:
                return info

    async def _drain_stdout(self) -> None:
        proc = self.proc
        while proc and proc.stdout and await proc.stdout.readline():
            pass

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def died(self) -> bool:
        return self.proc is not None and self.proc.returncode is not None and not self.expected_exit

    def stderr_tail(self, lines: int = 12) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("    " + x for x in text[-lines:])

    async def stop(self, grace: float) -> int | None:
        """SIGTERM, wait up to `grace` s, then SIGKILL. Returns the exit code."""
        self.expected_exit = True
        if not self.alive():
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), grace)
        except asyncio.TimeoutError:
            self.proc.kill()
            return await self.proc.wait()


def script(name: str) -> str:
    """The console script `name` next to this interpreter (the project's venv)."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if not found:
        raise LaunchError(f"console script {name!r} not found: is relay-suite installed (pip install -e .)?")
    return found


