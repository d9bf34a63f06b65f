"""MarlinSegment alone (start / drive / stop, no launcher, no report): every real block
carried to both consumers through 3 clusters x 2 members while a member is SIGKILLed and
restarted, the corrupted Bitcoin block disputed, the plan log naming the fault, the
expectation and every node; compare() against a summary table."""
from __future__ import annotations

import asyncio
import json

import pytest

from marlin_cluster.blocks import load_blocks
from deploy.segments import Plan
from deploy.marlin_segment import MarlinSegment

from .conftest import SHARED_DATA


def test_segment_carries_every_block_through_a_member_kill(tmp_path):
    if not (SHARED_DATA / "btc").is_dir() or not (SHARED_DATA / "eth").is_dir():
        pytest.skip(f"real blocks not found under {SHARED_DATA} (../shared/data absent)")
    blocks = load_blocks(SHARED_DATA / "btc") + load_blocks(SHARED_DATA / "eth")
    honest = [b for b in blocks if "corrupted" not in b.name]
    assert any("corrupted" in b.name for b in blocks)
    plan = Plan(tmp_path)
    seg = MarlinSegment({"tolerable_latency": 6, "max_clock_skew": 2, "kill": "c2m1", "kill_duration": 2,
                         "deadline": 90, "params": ["ack_timeout=1.5"]},
                        tmp_path, plan, SHARED_DATA, blocks, start_timeout=60, grace=5)

    async def run():
        await seg.start()
        try:
            assert len(seg.daemons()) == 10 and all(d.alive() for d in seg.daemons())
            await asyncio.wait_for(seg.drive(), 150)
            died = [d.name for d in seg.daemons() if d.died()]
            return died
        finally:
            await seg.stop()

    died = asyncio.run(run())
    plan.close()
    assert died == []
    c = seg.counters()
    assert c["blocks"] == len(honest) + 1
    assert c["expected_rebuilt"] == 2 * len(honest)
    assert c["rebuilt"] == 2 * len(honest), seg.progress()
    assert c["disputes"] == 2
    assert c["chunks_sent"] >= 12 * (len(honest) + 1)
    assert c["chunks_received"] >= 2 * 8 * (len(honest) + 1)
    # byte-identical at both consumers
    by_trace = {t: n for t, n in seg.sent.items()}
    data = {b.name: b.data for b in honest}
    for consumer in ("consumer1", "consumer2"):
        got = seg.net.rebuilt(consumer)
        assert {t: got[t] for t in by_trace} == {t: data[n] for t, n in by_trace.items()}
    # the plan log: nodes, the kill and its recovery, the expected dispute
    lines = [json.loads(x) for x in (tmp_path / "demo-plan.jsonl").read_text().splitlines()]
    nodes = {r["attrs"]["target"]: r["attrs"] for r in lines if r["event"] == "demo.plan.node"}
    assert set(nodes) == {"producer", "producer2", "c1m1", "c1m2", "c2m1", "c2m2", "c3m1", "c3m2",
                          "consumer1", "consumer2"}
    assert nodes["c2m1"]["kind"] == "marlin-cluster" and nodes["c2m1"]["peer"] == seg.net.address("c2m1")
    faults = [r for r in lines if r["event"] == "demo.plan.fault"]
    assert [(f["attrs"]["fault"], f["attrs"]["target"]) for f in faults] == [("member_kill", "c2m1")]
    assert any(r["event"] == "demo.plan.recovered" and r["attrs"]["target"] == "c2m1" for r in lines)
    expects = [r for r in lines if r["event"] == "demo.plan.expect"]
    assert [(e["trace_id"], e["attrs"]["outcome"]) for e in expects] == [(seg.corrupted_trace, "dispute")]
    assert seg.corrupted_trace.endswith(seg.net.address("producer2"))
    assert seg.net.procs["c2m1"].starts == 2
    # compare() against a report table
    summary = {"marlin": {k: c[k] for k in ("blocks", "rebuilt", "disputes", "chunks_sent", "chunks_received")}}
    assert all(row[3] for row in seg.compare(summary))
    summary["marlin"]["rebuilt"] -= 1
    assert [row[0] for row in seg.compare(summary) if not row[3]] == ["marlin.rebuilt"]
