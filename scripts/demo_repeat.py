"""Runs the main job N times in a row on fresh work dirs and prints one line per run and a
final tally ("10 runs in a row, each exit 0 with every comparison row ok and
every SLA of the default file passing").

    bash scripts/demo-repeat.sh N [demo args...]     # e.g. bash scripts/demo-repeat.sh 10

Per run: exit code, comparison rows ok / total (and which differ), SLA objectives passing /
judged (and which fail), wall time. Reads <workdir>/launcher.json written by
relay-suite-demo; a run that wrote none (it failed before the report) shows its last
stderr line. Work dirs: out/demo-repeat/<time>/run-<i> (each run's full output in
run-<i>.out). Exit status: 0 when every run passed, 1 otherwise.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


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
    bad_sla = [s["objective"] for s in slas if not s["ok"]]
    ok = proc.returncode == 0 and not bad_rows and not bad_sla and bool(rows)
    line = (f"run {i:2}: exit {proc.returncode}  rows {len(rows) - len(bad_rows)}/{len(rows)} ok"
            f"{' (' + ', '.join(bad_rows) + ')' if bad_rows else ''}"
            f"  SLA {'pass' if not bad_sla else 'FAIL'} {len(slas) - len(bad_sla)}/{len(slas)}"
            f"{' (' + ', '.join(bad_sla) + ')' if bad_sla else ''}  {wall:6.1f} s")
    return ok, line


def main(argv: list[str]) -> int:
    if not argv or not argv[0].isdigit() or int(argv[0]) < 1:
        print("usage: demo-repeat.sh N [relay-suite-demo args...]", file=sys.stderr)
        return 2
    n, extra = int(argv[0]), argv[1:]
    base = Path("out/demo-repeat") / time.strftime("%Y%m%d-%H%M%S")
    base.mkdir(parents=True, exist_ok=True)
    print(f"demo-repeat: {n} runs of relay-suite-demo {' '.join(extra)} in {base}", flush=True)
    passed, walls = 0, []
    for i in range(1, n + 1):
        t = time.monotonic()
        ok, line = one_run(i, base, extra)
        walls.append(time.monotonic() - t)
        passed += ok
        print(line, flush=True)
    print(f"tally: {passed}/{n} runs passed (exit 0, every row ok, every SLA passing); "
          f"wall {min(walls):.1f}-{max(walls):.1f} s, mean {sum(walls) / n:.1f} s", flush=True)
    return 0 if passed == n else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
