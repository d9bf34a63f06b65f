"""Protocol segments of the main job: REMP and Marlin plug into relay-suite-demo through
this contract (RMB is the launcher's own `Cluster`).

A segment is built from its table in the cluster config (`[remp]`, `[marlin]`), starts its
own daemons as subprocesses (daemon_runtime.daemons.Daemon, console scripts, READY lines), drives
its traffic with its planned faults, stops, and compares what it counted with the Spark
report's summary.json.

    class RempSegment(Segment):  # deploy/remp_segment.py; MarlinSegment in deploy/marlin_segment.py
        name = "remp"

The launcher calls, in order: `start()`, `drive()` (concurrently with the other segments'),
`stop()`, then `compare(summary)` after the report. `daemons()` and `progress()` are polled
while it runs (a daemon that `died()` outside the plan fails the run).

Planned faults are logged through `Plan` BEFORE they are injected (deploy/events.py,
demo.plan.*), so the report can show planned failures apart from unplanned ones.
"""
from __future__ import annotations

import socket
from pathlib import Path

from daemon_runtime.daemons import Daemon
from daemon_runtime.eventlog import EventLog
from marlin_cluster.blocks import BlockFile
from deploy.events import DEMO_EVENTS


class Plan:
    """The launcher's plan log: service "relay-suite-demo", node "launcher", one JSON-lines
    file `<logdir>/demo-plan.jsonl`. Thread-unsafe; one per run, shared by all segments."""

    def __init__(self, logdir: Path):
        self.log = EventLog("relay-suite-demo", "launcher", [DEMO_EVENTS],
                            sink=str(Path(logdir) / "demo-plan.jsonl"))

    def fault(self, fault: str, target: str, duration_s: float = 0.0) -> None:
        """A planned fault `fault` (e.g. "validator_kill") on node label `target` starts now
        and is planned to last `duration_s` seconds (0: instantaneous)."""
        self.log.emit("demo.plan.fault", None, fault=fault, target=target,
                      duration_ms=float(duration_s) * 1000.0)

    def recovered(self, fault: str, target: str) -> None:
        """The planned fault `fault` on `target` ended (e.g. the killed node is back)."""
        self.log.emit("demo.plan.recovered", None, fault=fault, target=target)

    def expect(self, trace_id: str, outcome: str, fault: str) -> None:
        """Message `trace_id` is planned to end as `outcome` (not delivered) because of `fault`."""
        self.log.emit("demo.plan.expect", trace_id, outcome=outcome, fault=fault)

    def node(self, label: str, raw: str, service: str, host: str | None = None) -> None:
        """Node `raw` (its `node` field in other events) is shown as `label` in the report;
        it runs on `host` (default: this machine's host name, where the launcher starts every
        daemon), so the report knows which nodes share a clock."""
        self.log.emit("demo.plan.node", None, target=label, peer=raw, kind=service,
                      host=host or socket.gethostname())

    def close(self) -> None:
        self.log.close()


class Segment:
    """Base of a protocol segment. Subclasses set `name` and implement every method.

    cfg: the segment's table from the cluster config (dict; `enabled` false skips it).
    workdir: the run directory; event logs go to `workdir / "logs"` (*.jsonl, read by the
    report), daemon data directories under `workdir / name`.
    plan: the shared Plan. shared_data: ../shared/data or None when absent.
    blocks: the run's payload blocks (real Bitcoin/Ethereum blocks when present).
    """

    name = "segment"

    def __init__(self, cfg: dict, workdir: Path, plan: Plan, shared_data: Path | None,
                 blocks: list[BlockFile], *, host: str = "127.0.0.1",
                 start_timeout: float = 30.0, grace: float = 10.0):
        self.cfg = cfg
        self.workdir = Path(workdir)
        self.logdir = self.workdir / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.plan = plan
        self.shared_data = shared_data
        self.blocks = blocks
        self.host = host
        self.start_timeout = start_timeout
        self.grace = grace

    async def start(self) -> None:
        """Start every daemon and wait until each is healthy; raises LaunchError."""
        raise NotImplementedError

    def daemons(self) -> list[Daemon]:
        """Every daemon of the segment (for liveness checks and shutdown)."""
        raise NotImplementedError

    async def drive(self) -> None:
        """Send the segment's traffic and inject its planned faults; returns when every
        message has reached a final outcome or its deadline passed."""
        raise NotImplementedError

    def progress(self) -> str:
        """One short line for the launcher's per-second progress print."""
        return ""

    async def stop(self) -> None:
        """SIGTERM every daemon (grace, then SIGKILL)."""
        raise NotImplementedError

    def counters(self) -> dict:
        """What the segment counted itself (JSON-able), printed by the launcher."""
        raise NotImplementedError

    def compare(self, summary: dict) -> list[tuple[str, object, object, bool]]:
        """Rows (name, launcher, report, equal) against the report's summary.json."""
        raise NotImplementedError
