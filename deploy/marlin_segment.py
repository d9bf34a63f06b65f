"""The main job's Marlin segment: a MarlinNet (marlin_cluster/localnet.py) driven with planned faults.

`MarlinSegment(deploy.segments.Segment)`: the `[marlin]` segment of relay-suite-demo. Its
network: `clusters` x `members` (default 3 x 2), producers "producer" (honest traffic) and
"producer2" (sends the corrupted Bitcoin block, so its trace id differs from the honest
block's), consumers "consumer1" and "consumer2". drive() sends every payload block, kills
one cluster member (`kill` label, default "c2m1") with SIGKILL part-way through (logged with
`plan.fault("member_kill", label, duration)` first) and restarts it `kill_duration` s later
(`plan.recovered`), waits until both consumers rebuilt every block, then sends the corrupted
Bitcoin block (`plan.expect(trace, "dispute", "corrupted_block")`) right away and waits for
both consumers' disputes. The corrupted block shares the honest block's message id (same
header); the cores key per-message state on (message id, producer), so no cache horizon
has to pass first.

cfg keys ([marlin] table): enabled, clusters, members, kill ("c2m1"), kill_at (fraction of
the blocks sent before the kill, 0.5), kill_duration (s, 3), deadline (s, 120), interval (s between blocks, 0.5),
tolerable_latency (s, 10), max_clock_skew (s, 2), params (list of extra "NAME=VALUE" for init).
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

from daemon_runtime.daemons import Daemon, LaunchError
from deploy.segments import Segment
from marlin_cluster.localnet import CORRUPTED_NAME, MarlinNet, wait_for

__all__ = ["MarlinSegment"]


class MarlinSegment(Segment):
    """The Marlin segment of the main job (see the module docstring)."""

    name = "marlin"

    def __init__(self, cfg: dict, workdir: Path, plan, shared_data: Path | None, blocks: list, **kw):
        super().__init__(cfg, workdir, plan, shared_data, blocks, **kw)
        c = cfg or {}
        self.kill_label = str(c.get("kill", "c2m1"))
        self.kill_at = float(c.get("kill_at", 0.5))
        self.kill_duration = float(c.get("kill_duration", 3.0))
        self.deadline = float(c.get("deadline", 120.0))
        # seconds between two blocks: a chain produces blocks at intervals, not in one burst;
        # a burst measures queueing behind the other blocks, not a block's propagation
        self.interval = float(c.get("interval", 0.5))
        tol = float(c.get("tolerable_latency", 10))
        skew = float(c.get("max_clock_skew", 2))
        self.horizon = tol + skew
        params = [f"tolerable_latency={tol}", f"max_clock_skew={skew}"] + list(c.get("params", []))
        self.net = MarlinNet(self.workdir, clusters=int(c.get("clusters", 3)), members=int(c.get("members", 2)),
                             producers=2, consumers=2, params=params, logdir=self.logdir,
                             start_timeout=self.start_timeout)
        self.honest = [b for b in blocks if "corrupted" not in b.name]
        self.corrupted = next((b for b in blocks if "corrupted" in b.name), None)
        if self.corrupted is None and shared_data is not None and (Path(shared_data) / "btc" / CORRUPTED_NAME).is_file():
            from marlin_cluster.blocks import BlockFile
            self.corrupted = BlockFile(CORRUPTED_NAME, (Path(shared_data) / "btc" / CORRUPTED_NAME).read_bytes())
        self.sent: dict[str, str] = {}          # trace id -> block name (honest)
        self.corrupted_trace: str | None = None
        self.refused: list[str] = []
        self.state = "new"
        self._final: dict = {}

    async def start(self) -> None:
        self.state = "starting"
        await self.net.start()
        service = {"producer": "marlin-producer", "member": "marlin-cluster", "consumer": "marlin-consumer"}
        for name, entry in self.net.nodes.items():
            self.plan.node(name, entry["address"], service[entry["role"]])
        self.state = "started"

    def daemons(self) -> list[Daemon]:
        return list(self.net.procs.values())

    def _rebuilt_pairs(self) -> int:
        return sum(1 for c in self.net.names("consumer") for t in self.net.rebuilt(c) if t in self.sent)

    def _disputes(self) -> int:
        return sum(1 for c in self.net.names("consumer")
                   for r in self.net.events(c, "marlin.consumer.dispute") if r.get("trace_id") == self.corrupted_trace)

    async def drive(self) -> None:
        net = self.net
        consumers = net.names("consumer")
        loop_deadline = time.monotonic() + self.deadline
        kill_index = int(len(self.honest) * self.kill_at) if self.honest else -1
        restart_task = None
        self.state = "sending"
        for i, block in enumerate(self.honest):
            if i == kill_index and self.kill_label in net.procs:
                self.plan.fault("member_kill", self.kill_label, self.kill_duration)
                await net.kill(self.kill_label)
                restart_task = asyncio.ensure_future(self._restart_later())
            try:
                out = await net.produce("producer", block.data)
                self.sent[out["trace_id"]] = block.name
            except LaunchError as exc:
                self.refused.append(f"{block.name}: {exc}")
            if self.interval > 0 and i + 1 < len(self.honest):
                await asyncio.sleep(self.interval)
        if restart_task is not None:
            await restart_task
        self.state = "waiting"
        want = len(self.sent) * len(consumers)
        await wait_for(lambda: self._rebuilt_pairs() >= want, max(1.0, loop_deadline - time.monotonic()), 0.25)
        if self.corrupted is not None:
            # same message id as the honest block (same header), another producer: the cores
            # key per-message state on (message id, producer), so it is sent right away
            from marlin_cluster.validate import message_id_of
            from marlin_cluster.params import CHANNEL_BTC
            from marlin_cluster.events import trace_id as make_trace
            mid = message_id_of(CHANNEL_BTC, self.corrupted.data)
            self.corrupted_trace = make_trace(mid, bytes.fromhex(net.address("producer2")[2:]))
            self.plan.expect(self.corrupted_trace, "dispute", "corrupted_block")
            self.state = "corrupted block"
            try:
                await net.produce("producer2", self.corrupted.data, "btc")
            except LaunchError as exc:
                self.refused.append(f"{self.corrupted.name}: {exc}")
            await wait_for(lambda: self._disputes() >= len(consumers),
                           max(5.0, loop_deadline - time.monotonic()), 0.25)
        # the producers re-send a chunk whose acknowledgement is missing (ack_timeout, up to
        # max_send_attempts, e.g. to the member killed by the plan); count only once no chunk
        # waits for an acknowledgement, else the report (which reads every chunk_sent line up
        # to shutdown) counts re-sends made after this count
        self.state = "settling"
        await self._settled(max(15.0, loop_deadline - time.monotonic()))
        self.state = "done"
        self._final = await self._collect()

    async def _settled(self, timeout: float) -> bool:
        """Wait until no producer has a chunk without a verified acknowledgement (its /health
        `missing_acks` is 0), polling every 0.25 s for at most `timeout` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            missing = 0
            for name in self.net.names("producer"):
                try:
                    missing += int((await self.net.health(name)).get("missing_acks", 0))
                except Exception:       # a producer that does not answer: nothing to wait for
                    pass
            if missing == 0:
                return True
            await asyncio.sleep(0.25)
        return False

    async def _restart_later(self) -> None:
        await asyncio.sleep(self.kill_duration)
        await self.net.restart(self.kill_label)
        self.plan.recovered("member_kill", self.kill_label)

    def progress(self) -> str:
        if self.state in ("new", "starting"):
            return f"marlin: {self.state}"
        return (f"marlin: {self.state}, {len(self.sent)} blocks sent, "
                f"{self._rebuilt_pairs()}/{len(self.sent) * 2} rebuilt")

    async def _collect(self) -> dict:
        counts = {}
        for name in self.net.names("producer") + self.net.names("consumer"):
            try:
                counts[name] = (await self.net.health(name))["counts"]
            except Exception:     # a dead daemon: counted as nothing, the launcher reports it
                counts[name] = {}
        prods = self.net.names("producer")
        cons = self.net.names("consumer")
        return {
            "blocks": sum(counts[p].get("blocks_produced", 0) for p in prods),
            "rebuilt": self._rebuilt_pairs() + sum(1 for c in cons for t in self.net.rebuilt(c)
                                                   if t not in self.sent),
            "disputes": sum(v for c in cons for k, v in counts[c].items() if k.startswith("disputes")),
            "chunks_sent": sum(counts[p].get("chunks_sent", 0) for p in prods),
            "chunks_received": sum(counts[c].get("chunks_received", 0) for c in cons),
            "expected_rebuilt": len(self.sent) * len(cons),
            "refused": len(self.refused),
        }

    async def stop(self) -> None:
        if not self._final and self.net.procs and self.net._session is not None:
            try:
                self._final = await self._collect()
            except Exception:
                pass
        await self.net.stop(self.grace)

    def counters(self) -> dict:
        return dict(self._final)

    def compare(self, summary: dict) -> list[tuple[str, object, object, bool]]:
        table = (summary or {}).get("marlin") or {}
        rows = []
        for key in ("blocks", "rebuilt", "disputes", "chunks_sent", "chunks_received"):
            mine, theirs = self._final.get(key), table.get(key)
            rows.append((f"marlin.{key}", mine, theirs, mine == theirs))
        return rows
