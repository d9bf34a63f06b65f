"""Runs the main job N times in a row on fresh work dirs and prints one line per run and a
final tally: every run must exit 0 with every comparison row ok and every SLA objective of
the default file passing.

    bash scripts/demo-repeat.sh N [--background-load F] [demo args...]
    bash scripts/demo-repeat.sh 10 --background-load 0.5    # a laptop doing something else

--background-load F: during each run, an unrelated CPU-bound load of F cores (F = 0.5: half
of one core; F = 2: two cores busy): ceil(F) processes, each a duty-cycled busy loop (busy
F / ceil(F) of every 100 ms, asleep the rest), started just before the run and stopped
(SIGTERM, then SIGKILL) right after it. The load competes for the cores like any other
program: under contention it gets its share, not more.

Per run: exit code, comparison rows ok / total (and which differ), SLA objectives passing /
judged (and which fail, with the report's verdict, e.g. "missed, host saturated"), the
demo's mean CPU while its cluster ran (percent of all cores, launcher.json `cpu`), wall
time. Reads <workdir>/launcher.json written by relay-suite-demo; a run that wrote none (it
failed before the report) shows its last stderr line. Work dirs:
out/demo-repeat/<time>/run-<i> (each run's full output in run-<i>.out). Exit status: 0 when
every run passed, 1 otherwise; 2 for bad arguments.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

#: seconds per duty cycle of a background-load process
BURN_PERIOD_S = 0.1


def burn(duty: float) -> None:
    """Busy-loop `duty` (0..1) of every BURN_PERIOD_S, sleep the rest; until SIGTERM."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    busy = BURN_PERIOD_S * min(max(duty, 0.0), 1.0)
    x = 0
    while True:
        end = time.monotonic() + busy
        while time.monotonic() < end:
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF
        if busy < BURN_PERIOD_S:
            time.sleep(BURN_PERIOD_S - busy)


class BackgroundLoad:
    """`cores` cores' worth of unrelated CPU load (module doc); a context manager."""

    def __init__(self, cores: float):
        self.cores = cores
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "BackgroundLoad":
        n = math.ceil(self.cores) if self.cores > 0 else 0
        for _ in range(n):
            self.procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--burn", repr(self.cores / n)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


def one_run(i: int, base: Path, extra: list[str]) -> tuple[bool, str]:
    work = base / f"run-{i}"
    started = time.monotonic()
    with open(base / f"run-{i}.out", "w") as out:
        proc = subprocess.run(["relay-suite-demo", "--workdir", str(work), *extra],
                              stdout=out, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - started
    try:
        result = json.loads((work / "launcher.json").read_text())
    except (OSError, ValueError):
        result = None
    if result is None:
        tail = (base / f"run-{i}.out").read_text(errors="replace").strip().splitlines()[-1:] or [""]
        return False, f"run {i:2}: exit {proc.returncode}  no result ({tail[0][:120]})  {wall:6.1f} s"
    rows, slas = result.get("rows", []), [s for s in result.get("sla", []) if s.get("ok") is not None]
    bad_rows = [r["name"] for r in rows if not r["ok"]]
    bad_sla = [s["objective"] + (f": {s['verdict']}" if s.get("verdict") == "missed, host saturated" else "")
               for s in slas if not s["ok"]]
    ok = proc.returncode == 0 and not bad_rows and not bad_sla and bool(rows)
    cpu = (result.get("cpu") or {}).get("cluster") or {}
    cpu_text = (f"  cpu {cpu['demo_pct']:.0f}% of {cpu['cores']} cores (host {cpu['host_pct']:.0f}%)"
                if cpu else "")
    line = (f"run {i:2}: exit {proc.returncode}  rows {len(rows) - len(bad_rows)}/{len(rows)} ok"
            f"{' (' + ', '.join(bad_rows) + ')' if bad_rows else ''}"
            f"  SLA {'pass' if not bad_sla else 'FAIL'} {len(slas) - len(bad_sla)}/{len(slas)}"
            f"{' (' + ', '.join(bad_sla) + ')' if bad_sla else ''}{cpu_text}  {wall:6.1f} s")
    return ok, line


USAGE = "usage: demo-repeat.sh N [--background-load F] [relay-suite-demo args...]"


def parse(argv: list[str]) -> tuple[int, float, list[str]]:
    """(N, background load in cores, the demo's arguments); raises ValueError with the usage."""
    if not argv or not argv[0].isdigit() or int(argv[0]) < 1:
        raise ValueError(USAGE)
    n, rest, load = int(argv[0]), list(argv[1:]), 0.0
    for flag in ("--background-load",):
        for j, arg in enumerate(rest):
            value = None
            if arg == flag and j + 1 < len(rest):
                value, cut = rest[j + 1], 2
            elif arg.startswith(flag + "="):
                value, cut = arg.split("=", 1)[1], 1
            elif arg == flag:
                raise ValueError(f"{flag} needs a value (cores of load, e.g. 0.5)\n{USAGE}")
            if value is not None:
                try:
                    load = float(value)
                except ValueError:
                    raise ValueError(f"{flag} takes a number of cores, got {value!r}\n{USAGE}") from None
                if not 0 <= load <= 64:
                    raise ValueError(f"{flag} must be between 0 and 64 cores, got {value}")
                del rest[j:j + cut]
                break
    return n, load, rest


def main(argv: list[str]) -> int:
    if argv[:1] == ["--burn"]:
        burn(float(argv[1]))
        return 0
    try:
        n, load, extra = parse(argv)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    base = Path("out/demo-repeat") / time.strftime("%Y%m%d-%H%M%S")
    base.mkdir(parents=True, exist_ok=True)
    what = f" with a background load of {load:g} cores" if load else ""
    print(f"demo-repeat: {n} runs of relay-suite-demo {' '.join(extra)}{what} in {base}", flush=True)
    passed, walls = 0, []
    for i in range(1, n + 1):
        t = time.monotonic()
        with BackgroundLoad(load):
            ok, line = one_run(i, base, extra)
        walls.append(time.monotonic() - t)
        passed += ok
        print(line, flush=True)
    print(f"tally: {passed}/{n} runs passed (exit 0, every row ok, every SLA passing); "
          f"wall {min(walls):.1f}-{max(walls):.1f} s, mean {sum(walls) / n:.1f} s", flush=True)
    return 0 if passed == n else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
