"""Replays recorded event logs through the real event-log writers (daemon_runtime.eventlog
EventLog in segment mode), in recorded order, for the streaming report's tests and bench.

    python -m tests.eventlog_replay SRC_DIR LOGDIR [--segment-s 0.3] [--speed 10]
        [--pause-at 0.5 --resume-on FILE] [--done FILE]

Every `SRC_DIR/*.jsonl` line is written again by one EventLog per source file (same file
name, service and node; new timestamps: now), in the order of the recorded `ts`, sleeping
the recorded gaps divided by `--speed`. With `--pause-at F` it stops after that fraction of
the lines until `--resume-on FILE` exists (bounded: 600 s). At the end every log is closed
(its last segment sealed) and `--done FILE` is created. Prints the number of lines written.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path

from daemon_runtime.eventlog import EventLog, EventLogError
from deploy.catalogues import CATALOGUES


def load(src: str) -> list[tuple[float, str, dict]]:
    rows = []
    for path in sorted(Path(src).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
                ts = datetime.fromisoformat(rec["ts"].replace("Z", "+00:00")).timestamp()
            except (ValueError, KeyError):
                continue
            rows.append((ts, path.name, rec))
    rows.sort(key=lambda r: r[0])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("logdir")
    ap.add_argument("--segment-s", type=float, default=0.3)
    ap.add_argument("--speed", type=float, default=10.0)
    ap.add_argument("--pause-at", type=float, default=None)
    ap.add_argument("--resume-on", default=None)
    ap.add_argument("--done", default=None)
    args = ap.parse_args(argv)
    rows = load(args.src)
    os.makedirs(args.logdir, exist_ok=True)
    logs: dict[str, EventLog] = {}
    pause = int(len(rows) * args.pause_at) if args.pause_at is not None else None
    written = 0
    t0_rec, t0 = (rows[0][0] if rows else 0.0), time.monotonic()
    for i, (ts, name, rec) in enumerate(rows):
        if pause is not None and i == pause and args.resume_on:
            limit = time.monotonic() + 600
            while not os.path.exists(args.resume_on) and time.monotonic() < limit:
                time.sleep(0.1)
            t0_rec, t0 = ts, time.monotonic()
        delay = (ts - t0_rec) / args.speed - (time.monotonic() - t0)
        if delay > 0:
            time.sleep(min(delay, 2.0))
        log = logs.get(name)
        if log is None:
            log = logs[name] = EventLog(rec["service"], rec["node"], CATALOGUES,
                                        sink=os.path.join(args.logdir, name),
                                        min_level="debug", segment_s=args.segment_s)
        try:
            log.emit_attrs(rec["event"], rec.get("trace_id"), rec["level"], rec.get("attrs") or {})
            written += 1
        except EventLogError:
            pass
    for log in logs.values():
        log.close()
    if args.done:
        Path(args.done).touch()
    print(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
