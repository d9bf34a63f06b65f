"""REMP event logs from a simulated network (remp_node/core/eventmap.py + Simulation(event_log=)):
real daemon_runtime EventLogs onto tmp files, every line parses and follows the line
contract, each message's trace holds the full node's received event, validator statuses up
to Finalized, the full node's final; drops and fork blame map onto catalogued events."""
from __future__ import annotations

import io
import json
import re
from collections import defaultdict

import pytest

from deploy.catalogues import all_catalogues
from daemon_runtime.eventlog import LINE_FIELDS, EventLog, EventLogError, attr_types
from remp_node.core.eventmap import (LogRecord, client_records, emit_records, peer_label,
                                validator_records)
from remp_node.events import REMP_EVENTS
from remp_node.testnet.sim import SimConfig, Simulation
from remp_node.core.validator import CH_CLIENT, CH_RMQ, Dropped, ForkBlamed, mux

from tests.remp_fixtures import KIND_SEQUENCE, WalletSet

pytest.importorskip("remp_node.core.catchain", reason="remp_node/core/catchain.py is not in the tree")

HEX8 = re.compile(r"^[0-9a-f]{8}$")


def read_lines(paths):
    lines = []
    for p in paths:
        for raw in p.read_text().splitlines():
            lines.append(json.loads(raw))          # every line parses
    return lines


def test_simulated_run_writes_full_traces(tmp_path):
    attr_types(all_catalogues())                   # one type per attribute name: must not raise
    files = {}

    def factory(service, node):
        path = tmp_path / f"{service}-{node}.jsonl"
        files[(service, node)] = path
        return EventLog(service, node, [REMP_EVENTS], sink=str(path), min_level="info")

    w = WalletSet(12, "sim-eventlog")
    sim = Simulation(SimConfig(seed=7, validators=8, group_size=4, mc_catchain_lifetime=60.0, reorder=0.05),
                     wallets=w.genesis(), event_log=factory)
    t0 = int(sim.now)
    sim.run(0.2)
    mids = [sim.submit(w.transfer(i, 3, t0 + 3600)) for i in range(10)]
    refused = sim.submit(w.transfer(10, 5, t0 + 3600, sign_with=w.keys[11]))     # RejectedByFullnode
    # garbage to a validator and to the full node: dropped, logged once each
    v0 = sim.validators[0].key.key_id
    sim.net.send(sim.fullnode_id, v0, mux(CH_RMQ, b"\x07" * 32, b"junk"), sim.now)
    sim.net.send(v0, sim.fullnode_id, mux(CH_CLIENT, bytes(32), b"\x01\x02\x03\x04junk"), sim.now)
    assert sim.run_until(lambda: all(sim.finals.get(m) for m in mids), 40.0)
    sim.run(0.3)
    sim.close_logs()

    services = {s for s, _ in files}
    assert services == {"remp-validator", "remp-fullnode", "remp-masterchain"}
    assert sum(1 for s, _ in files if s == "remp-validator") == 8
    lines = read_lines(files.values())
    assert lines
    catalogue = {spec.name: spec for spec in REMP_EVENTS}
    for ln in lines:
        assert list(ln) == [k for k, _ in LINE_FIELDS]
        assert ln["event"] in catalogue and set(ln["attrs"]) <= set(catalogue[ln["event"]].attrs)
        assert HEX8.match(ln["node"]) and ln["level"] in ("info", "warning")
        assert ln["ts"].endswith("Z")
    by_trace = defaultdict(list)
    for ln in lines:
        if ln["trace_id"] is not None:
            by_trace[ln["trace_id"]].append(ln)
    fullnode = peer_label(sim.fullnode_id)
    for mid in mids:
        trace = by_trace[mid.hex()]
        ev = [(x["service"], x["event"]) for x in trace]
        assert ("remp-fullnode", "remp.fullnode.received") in ev
        assert ("remp-fullnode", "remp.fullnode.sent") in ev
        finals = [x for x in trace if x["event"] == "remp.fullnode.final"]
        assert [f["attrs"]["outcome"] for f in finals] == ["finalized"]
        assert finals[0]["node"] == fullnode and finals[0]["attrs"]["duration_ms"] > 0
        per_validator = defaultdict(list)
        for x in trace:
            if x["event"] == "remp.validator.status":
                assert x["service"] == "remp-validator" and x["attrs"]["shard"] in ("4000000000000000", "c000000000000000")
                per_validator[x["node"]].append(x["attrs"]["kind"])
        full = [n for n, kinds in per_validator.items() if kinds == KIND_SEQUENCE]
        assert full, per_validator                   # some validator logged every status up to Finalized
        levels = {x["attrs"]["kind"]: x["attrs"]["level"] for x in trace if x["event"] == "remp.validator.status"}
        assert [levels[k] for k in KIND_SEQUENCE] == [1, 1, 2, 3, 4]
        fin = [x for x in trace if x["event"] == "remp.validator.status" and x["attrs"]["kind"] == "Finalized"]
        assert all(x["attrs"]["block_seqno"] >= 1 for x in fin)
        statuses = [x["attrs"]["kind"] for x in trace if x["event"] == "remp.fullnode.status"]
        assert statuses[0] == "SentToValidators" and "Finalized" in statuses
    rej = by_trace[refused.hex()]
    assert [x["event"] for x in rej] == ["remp.fullnode.received", "remp.fullnode.status", "remp.fullnode.final"]
    assert rej[1]["attrs"]["kind"] == "RejectedByFullnode" and rej[1]["level"] == "warning"
    assert "Invalid signature" in rej[2]["attrs"]["reason"]
    drops = [x for x in lines if x["event"] in ("remp.validator.dropped", "remp.fullnode.dropped")]
    assert {(x["event"], x["node"]) for x in drops} == {("remp.validator.dropped", peer_label(v0)),
                                                       ("remp.fullnode.dropped", fullnode)}
    assert next(x for x in drops if x["event"] == "remp.validator.dropped")["attrs"]["channel"] == "rmq"
    committed = [x for x in lines if x["event"] == "remp.masterchain.committed"]
    assert committed and all(x["service"] == "remp-masterchain" for x in committed)
    assert sum(1 for x in lines if x["event"] == "remp.shardchain.accepted") >= 2
    assert {x["attrs"]["session"] for x in lines if x["event"] == "remp.validator.session"} == {0}


def test_fork_blame_and_drop_records_are_catalogued():
    buf = io.StringIO()
    log = EventLog("remp-validator", "aabbccdd", [REMP_EVENTS], sink=buf)
    src = bytes.fromhex("0123456789") + bytes(27)
    recs = validator_records(ForkBlamed(0x4000000000000000, 3, src, None))
    recs += validator_records(Dropped("shard", src, "unknown shard consensus session"))
    emit_records(log, recs)
    log.flush()
    a, b = (json.loads(x) for x in buf.getvalue().splitlines())
    assert (a["event"], a["level"], a["attrs"]) == (
        "remp.validator.blamed", "warning", {"peer": "01234567", "shard": "4000000000000000", "session": 3})
    assert (b["event"], b["attrs"]["channel"], b["attrs"]["peer"]) == ("remp.validator.dropped", "shard", "01234567")
    with pytest.raises(TypeError):
        validator_records("not an event")
    with pytest.raises(TypeError):
        client_records(object())
    with pytest.raises(EventLogError):                # the mapping's records are checked against the catalogue
        emit_records(log, [LogRecord("remp.validator.status", None, "info", {"level": "4"})])


def test_validator_status_line_is_the_same_from_the_event_status_or_the_signed_bytes():
    """ReceiptSent carries the status it signed, so the log line needs no parse of the signed
    receipt; the line is the one the signed bytes give."""
    from remp_node.core.eventmap import validator_records
    from remp_node.wire.keys import NodeKey
    from remp_node.wire.receipts import Accepted, Level, New, Rejected, make_signed_receipt
    from remp_node.wire.tl import BlockIdExt
    from remp_node.core.validator import ReceiptSent
    k = NodeKey.from_seed(b"\x07" * 32)
    bid = BlockIdExt(0, 0x4000000000000000, 5, b"\x01" * 32, b"\x02" * 32)
    for st in (New(), Accepted(Level.COLLATOR, bid), Accepted(Level.MASTERCHAIN, bid, bid),
               Rejected(Level.COLLATOR, bid, "Insufficient balance: 1 < 2")):
        signed = make_signed_receipt(k, b"\x03" * 32, st, 1_700_000_000_000)
        with_status = ReceiptSent(b"\x03" * 32, st.kind, 0x4000000000000000, (b"\x04" * 32,), signed, "r", st)
        without = ReceiptSent(b"\x03" * 32, st.kind, 0x4000000000000000, (b"\x04" * 32,), signed, "r")
        assert validator_records(with_status) == validator_records(without)


def test_statuses_for_two_candidates_of_one_seqno_are_two_lines_not_a_duplicate(tmp_path):
    """Consensus rounds at one height: a message in round 0's candidate and in round 1's
    (another collator) gets IncludedIntoBlock twice from a validator, with the same
    block_seqno. The lines carry block_id (the candidate's root hash), so the report's
    duplicate rule (one process logging the same event with the same attrs twice) does not
    count them: a healthy run logs no line twice. Before block_id was logged, this run had
    dozens of such pairs and the main job's report showed them as duplicates."""
    files = []

    def factory(service, node):
        path = tmp_path / f"{service}-{node}.jsonl"
        files.append(path)
        return EventLog(service, node, [REMP_EVENTS], sink=str(path), min_level="info")

    w = WalletSet(30, "sim-rounds")
    # short shard rounds against 20-120 ms links with 10% loss: heights often take more than
    # one round
    sim = Simulation(SimConfig(seed=2, validators=8, group_size=4, latency=0.02, jitter=0.1,
                               loss=0.1, duplicate=0.1, reorder=0.1, shard_round_timeout=0.15,
                               mc_catchain_lifetime=60.0),
                     wallets=w.genesis(), event_log=factory)
    t0 = int(sim.now)
    sim.run(0.2)
    mids = []
    for i in range(30):
        mids.append(sim.submit(w.transfer(i, 3, t0 + 3600)))
        if i % 10 == 9:
            sim.run(0.1)
    assert sim.run_until(lambda: all(sim.finals.get(m) for m in mids), 60.0)
    assert all([f.outcome for f in sim.finals[m]] == ["finalized"] for m in mids)
    sim.close_logs()
    per_seqno: dict = defaultdict(list)
    seen: dict = defaultdict(int)
    for path in files:
        for ln in read_lines([path]):
            seen[(path.name, ln["event"], ln["trace_id"], json.dumps(ln["attrs"], sort_keys=True))] += 1
            a = ln["attrs"]
            if ln["event"] == "remp.validator.status" and a["kind"] == "IncludedIntoBlock":
                per_seqno[(ln["node"], ln["trace_id"], a["shard"], a["block_seqno"])].append(a.get("block_id"))
    assert any(len(ids) >= 2 for ids in per_seqno.values())     # the case happened
    assert [k for k, n in seen.items() if n > 1 and k[1].endswith(".status")] == []
    for ids in per_seqno.values():
        assert all(re.fullmatch(r"[0-9a-f]{64}", b) for b in ids) and len(set(ids)) == len(ids)


def test_emit_records_a_bad_record_does_not_take_the_others_with_it():
    """emit_records writes a batch in one go; a record the catalogues do not declare (a bug)
    is raised after the batch's other records were written, one by one, in order."""
    sink = io.StringIO()
    log = EventLog("remp-node", "t", [REMP_EVENTS], sink=sink)
    good = [LogRecord("remp.node.store_failed", None, "error", {"reason": f"r{i}"}) for i in range(2)]
    with pytest.raises(EventLogError, match="remp.no.such"):
        emit_records(log, [good[0], LogRecord("remp.no.such", None, "info", {}), good[1]])
    log.close()
    lines = [json.loads(x) for x in sink.getvalue().splitlines()]
    assert [x["attrs"]["reason"] for x in lines] == ["r0", "r1"]
