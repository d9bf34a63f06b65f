"""RempSegment alone (start / drive / stop, no report): the main job's REMP part on a small
network of processes, with its planned validator kill and its expectations logged."""
from __future__ import annotations

import json

import pytest

from deploy.segments import Plan
from deploy.remp_segment import RempSegment
from remp_node.wire.messages import parse_external_message
from remp_node.core.state import decode_wallet_body

from tests.conftest import SHARED_DATA

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


async def test_remp_segment_start_drive_stop(tmp_path):
    (tmp_path / "logs").mkdir()
    plan = Plan(tmp_path / "logs")
    cfg = {"shards": 2, "validators_per_shard": 2, "mc_catchain_lifetime": 20.0, "block_interval": 0.25,
           "wallet_messages": 12, "collator_rejects": 2, "kill": "v3", "kill_after": 2.0, "kill_for": 2.0,
           "deadline": 240.0}
    seg = RempSegment(cfg, tmp_path, plan, SHARED_DATA if SHARED_DATA.is_dir() else None, [],
                      start_timeout=90.0, grace=5.0)
    await seg.start()
    try:
        assert len(seg.daemons()) == 6 and all(d.alive() for d in seg.daemons())    # 2 full nodes
        # the race pairs' wallets neither send nor receive the generated transfers (a credit
        # could cover a pair's second message when it is taken up again after the kill)
        good, _, races = seg._messages()
        race_wallets = {parse_external_message(b, (0, -1)).dst for _, b in races}
        assert len(race_wallets) == 2
        for label, boc in good:
            if label.startswith("gen"):
                m = parse_external_message(boc, (0, -1))
                assert m.dst not in race_wallets and decode_wallet_body(m.body).dest not in race_wallets
        await seg.drive()
        assert not [d.name for d in seg.daemons() if d.died()]
    finally:
        await seg.stop()
        plan.close()
    c = seg.counters()
    real = 50 if SHARED_DATA.is_dir() else 0
    neg = 13 if SHARED_DATA.is_dir() else 0
    assert c["messages"] == real + neg + 12 + 2 + 2 * 2
    assert c["restarts"] == 1
    # every message with an id reached a final outcome; the undecodable BOCs were counted at the API
    assert c["none"] == 0 and c["timeout"] == 0
    assert c["undecodable"] + c["rejected_by_fullnode"] + len(seg.ids) >= c["messages"] - neg
    assert c["finalized"] >= real + 12 + 2 - (1 if real else 0)   # the 42 KB message may ride alone later
    assert c["rejected"] >= 2                                       # one of each race pair
    lines = [json.loads(x) for x in (tmp_path / "logs" / "demo-plan.jsonl").read_text().splitlines()]
    kinds = [x["event"] for x in lines]
    assert kinds.count("demo.plan.node") == 6
    assert {x["attrs"]["target"] for x in lines if x["event"] == "demo.plan.node"} == {"v1", "v2", "v3", "v4",
                                                                                         "fullnode1", "fullnode2"}
    # the messages were spread over both full nodes, none left unplaced
    placed = [n["placed"] for n in seg.sub.report()["nodes"].values()]
    assert len(placed) == 2 and min(placed) >= 10 and c["unplaced"] == 0
    fault = [x for x in lines if x["event"] == "demo.plan.fault"]
    assert fault and fault[0]["attrs"]["target"] == "v3" and "demo.plan.recovered" in kinds
    assert kinds.index("demo.plan.fault") < kinds.index("demo.plan.recovered")
    assert sum(1 for x in lines if x["event"] == "demo.plan.expect") >= 2
    # the event logs the report reads are in workdir/logs
    assert (tmp_path / "logs" / "fullnode1.jsonl").exists() and (tmp_path / "logs" / "v3.jsonl").exists()
    # compare(): equal against a summary with the same counts, unequal against a wrong one
    summary = {"remp": {"messages": len(seg.ids), "outcomes": {k: c[k] for k in ("finalized", "rejected",
                                                                                  "timeout", "none")}}}
    assert all(row[3] for row in seg.compare(summary))
    summary["remp"]["outcomes"]["finalized"] += 1
    assert not all(row[3] for row in seg.compare(summary))


def test_progress_counts_outcomes_before_the_end(tmp_path):
    """The progress line counts the outcomes polled so far while sending and waiting (it said
    '0 finalized' until the very end before), and the final tally once done."""
    plan = Plan(tmp_path)
    try:
        seg = RempSegment({}, tmp_path, plan, None, [])
        seg.counts["messages"] = 4
        seg.ids = {"a": "gen0", "b": "gen1", "c": "race0a", "d": "gen2"}
        seg.outcomes = {"a": "finalized", "b": "finalized", "c": "rejected"}
        seg._phase = "sending"
        assert seg.progress() == "remp sending: 4 sent, 2 finalized, 1 rejected, 0 timeout"
        seg._phase, seg.counts["finalized"] = "done", 3
        assert seg.progress() == "remp done: 4 sent, 3 finalized, 0 rejected, 0 timeout"
    finally:
        plan.close()
