"""CPU samples of the main job: the host (all cores) and every process, once a second.

    sampler = CpuSampler(names=lambda: {pid: "rmb-relay-relay1", ...},
                         log=EventLog(..., [DEMO_EVENTS], sink="logs/demo-cpu.jsonl"))
    sampler.start()            # a thread: psutil reads /proc once per interval
    ...
    sampler.stop_logging()     # no more events (the report is about to read the logs)
    ...
    usage = sampler.stop()     # CpuUsage: the demo's CPU seconds, wall seconds, mean share

What is sampled each interval (psutil; events in deploy/events.py, demo.cpu.*):
- the host: `psutil.cpu_percent()` over the interval, percent of ALL logical cores;
- the demo's processes: this process and every descendant (daemons, the embedded Redis,
  the report's JVM, `init` helpers), each process's user + system CPU time since the last
  sample (a process first seen counts all its CPU so far: it started inside the run),
  named by `names()` (pid -> daemon name) or "<process name>[<pid>]";
- the host's other processes: the busiest few (>= OTHER_MIN_PCT of a core), so a report
  can name what else kept the cores busy.

The demo's CPU total (CpuUsage.cpu_s) is the sum over its processes of the last CPU time
observed for each; CPU a process used after its last sample (at most one interval, e.g.
while it shut down) is not counted. Errors reading a process (it exited, access denied)
skip that process for that interval; the sampler never raises into the demo.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

import psutil

#: seconds between two samples
INTERVAL_S = 1.0
#: a demo process is logged when it used at least this percent of one core in the interval
DEMO_MIN_PCT = 1.0
#: the host's other processes: at most OTHER_TOP, each using at least OTHER_MIN_PCT of a core
OTHER_TOP = 5
OTHER_MIN_PCT = 5.0


@dataclass
class CpuUsage:
    """The demo's CPU over the sampled time. cpu_s: CPU seconds of the demo's processes;
    wall_s: seconds sampled; cores: logical cores; host_pct: the host's mean busy share,
    percent of all cores (everything on the machine, not only the demo)."""

    cpu_s: float
    wall_s: float
    cores: int
    host_pct: float

    @property
    def demo_pct(self) -> float:
        """The demo's mean CPU, percent of all cores (50 = half the machine)."""
        return 100.0 * self.cpu_s / (self.wall_s * self.cores) if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {"cpu_s": round(self.cpu_s, 2), "wall_s": round(self.wall_s, 2),
                "cores": self.cores, "demo_pct": round(self.demo_pct, 1),
                "host_pct": round(self.host_pct, 1)}


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


class CpuSampler:
    """Samples host and per-process CPU every `interval` s in a daemon thread (module doc).
    names: callable -> {pid: label} for the demo's daemons (called from the thread; it
    must only read). log: an EventLog with DEMO_EVENTS, or None (no events, the totals
    only)."""

    def __init__(self, names: Callable[[], dict[int, str]] | None = None, log=None,
                 interval: float = INTERVAL_S, root_pid: int | None = None):
        self.names = names or (lambda: {})
        self.log = log
        self.interval = interval
        self.cores = psutil.cpu_count() or os.cpu_count() or 1
        self.root = psutil.Process(root_pid or os.getpid())
        self._seen: dict[int, tuple[psutil.Process, float]] = {}     # demo pid -> (proc, cpu_s)
        self._others: dict[int, tuple[psutil.Process, float]] = {}   # other pid -> (proc, cpu_s)
        self._total_by_pid: dict[tuple[int, float], float] = {}   # (pid, created) -> cpu_s
        self._host_sum = 0.0
        self._host_n = 0
        self._stop = threading.Event()
        self._logging = True
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._t_last = 0.0

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> "CpuSampler":
        psutil.cpu_percent(None)            # the first call sets psutil's reference point
        self._t0 = self._t_last = time.monotonic()
        self._sample_demo(0.0, emit=False)
        self._sample_others(0.0, emit=False)
        self._thread = threading.Thread(target=self._run, name="demo-cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def stop_logging(self) -> None:
        """No more events from the next sample on (the totals keep counting); closes the log."""
        with self._lock:
            self._logging = False
            if self.log is not None:
                self.log.close()

    def stop(self) -> CpuUsage:
        """Stop the thread, take one last sample of the totals and return them."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        with self._lock:
            self._logging = False
            self._sample_demo(time.monotonic() - self._t_last, emit=False)
            wall = time.monotonic() - self._t0
        return self.usage(wall)

    def usage(self, wall: float | None = None) -> CpuUsage:
        """The totals so far."""
        wall = time.monotonic() - self._t0 if wall is None else wall
        return CpuUsage(sum(self._total_by_pid.values()), wall, self.cores,
                        self._host_sum / self._host_n if self._host_n else 0.0)

    # -- sampling ----------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                with self._lock:
                    self.sample()
            except Exception:   # noqa: BLE001 - a sampler must never take the demo down
                pass

    def sample(self) -> None:
        """One sample of everything; events when logging (see module doc)."""
        now = time.monotonic()
        dt = max(now - self._t_last, 1e-6)
        self._t_last = now
        host = psutil.cpu_percent(None)
        emit = self._logging and self.log is not None
        demo_s = self._sample_demo(dt, emit)
        self._sample_others(dt, emit)
        self._host_sum += host
        self._host_n += 1
        if emit:
            self.log.emit("demo.cpu.host", None, cpu_pct=round(float(host), 1), cores=int(self.cores),
                          demo_pct=round(100.0 * demo_s / (dt * self.cores), 1),
                          interval_ms=round(dt * 1000.0, 1))

    def _demo_procs(self) -> list[psutil.Process]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return [self.root]

    def _label(self, proc: psutil.Process, names: dict[int, str]) -> str:
        if proc.pid == self.root.pid:
            return "launcher"
        name = names.get(proc.pid)
        if name:
            return name
        try:
            pname = proc.name()
        except psutil.Error:
            pname = "?"
        return f"{pname}[{proc.pid}]"

    def _sample_demo(self, dt: float, emit: bool) -> float:
        """CPU seconds the demo's processes used in the interval; logs the busy ones."""
        names = dict(self.names()) if emit else {}
        total = 0.0
        for proc in self._demo_procs():
            try:
                key = (proc.pid, proc.create_time())     # a pid may be reused
                now_s = _cpu_s(proc)
            except psutil.Error:
                continue
            delta = now_s - self._total_by_pid.get(key, 0.0)
            self._total_by_pid[key] = now_s
            self._seen[proc.pid] = (proc, now_s)
            total += delta
            if emit and dt > 0:
                pct = 100.0 * delta / dt
                if pct >= DEMO_MIN_PCT:
                    self.log.emit("demo.cpu.process", None, target=self._label(proc, names),
                                  kind="demo", pid=int(proc.pid), core_pct=round(pct, 1))
        return total

    def _sample_others(self, dt: float, emit: bool) -> None:
        demo = set(self._seen)
        seen: dict[int, tuple[psutil.Process, float]] = {}
        busy = []
        for proc in psutil.process_iter():
            pid = proc.pid
            if pid in demo:
                continue
            try:
                now_s = _cpu_s(proc)
            except psutil.Error:
                continue
            prev = self._others.get(pid)
            seen[pid] = (proc, now_s)
            if prev is None or dt <= 0:
                continue
            pct = 100.0 * (now_s - prev[1]) / dt
            if pct >= OTHER_MIN_PCT:
                busy.append((pct, proc))
        self._others = seen
        if not emit:
            return
        busy.sort(key=lambda x: -x[0])
        for pct, proc in busy[:OTHER_TOP]:
            try:
                label = f"{proc.name()}[{proc.pid}]"
            except psutil.Error:
                label = f"?[{proc.pid}]"
            self.log.emit("demo.cpu.process", None, target=label, kind="other",
                          pid=int(proc.pid), core_pct=round(pct, 1))
