"""Receipt verifier CLI and the masterchain-less receipt rule.

Real signed receipts come from the REMP cores (a small in-memory Simulation: 4 validators,
1 shard, a masterchain, one full node). The CLI must print ok for each, bad with the precise
reason for a forged one, a tampered field and garbage, and exit non-zero on any bad."""
from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from remp_node.wire.keys import NodeKey, verify
from remp_node.wire.receipts import (NO_MASTER_BLOCK_ID, Accepted, Level, New, from_json, make_signed_receipt,
                                to_json)
from remp_node.wire.tl import REMP_ACCEPTED, REMP_COLLATOR, REMP_RECEIPT, BlockIdExt, pack_id, pack_int, pack_long
from remp_node.daemon.verify import main

from tests.remp_fixtures import WalletSet

SHARD_BLOCK = BlockIdExt(0, 0x4000000000000000, 9, b"\x31" * 32, b"\x32" * 32)


def test_receipt_json_without_mc_fields_verifies_with_ever_block_default():
    """ever-block-json parse_remp_status: master_id = parse_block_id_ext(mc).unwrap_or_default();
    ever-block: BlockIdExt::default() -> ShardIdent::default() = workchain 0, prefix
    SHARD_FULL 0x8000000000000000, seqno 0, zero hashes. Build those TL bytes by hand from
    the JSON and check the validator's signature over them."""
    v = NodeKey.from_seed(b"\x41" * 32)
    mid = b"\x42" * 32
    signed = make_signed_receipt(v, mid, Accepted(Level.COLLATOR, SHARD_BLOCK), 1_700_000_000_123)
    obj = json.loads(json.dumps(to_json(signed.open(), signed.signature)))
    assert obj["kind"] == "IncludedIntoBlock" and not any(k.startswith("mc_") for k in obj)
    reference_bytes = (
        pack_id(REMP_RECEIPT) + bytes.fromhex(obj["message_id"])
        + pack_id(REMP_ACCEPTED) + pack_id(REMP_COLLATOR)
        + pack_int(obj["wc"]) + pack_long(int(obj["shard"], 16)) + pack_int(obj["block_seqno"])
        + bytes.fromhex(obj["block_id"]) + bytes.fromhex(obj["block_file_hash"])
        + pack_int(0) + pack_long(0x8000000000000000) + pack_int(0) + bytes(32) + bytes(32)   # default
        + pack_long(obj["timestamp"]) + bytes.fromhex(obj["source_id"]))
    receipt, sig = from_json(obj)
    assert receipt.serialize() == reference_bytes == signed.receipt
    assert receipt.status.master_id == NO_MASTER_BLOCK_ID
    assert verify(v.public, reference_bytes, sig)
    # the old rule (workchain 0, shard 0) gives bytes the signature does not cover
    old = reference_bytes.replace(pack_int(0) + pack_long(0x8000000000000000) + pack_int(0) + bytes(64),
                                  bytes(80))
    assert old != reference_bytes and not verify(v.public, old, sig)
    # an all-zero master id given by old code is read as the default too
    assert Accepted(Level.QUEUE, SHARD_BLOCK, BlockIdExt(0, 0, 0, bytes(32), bytes(32))).master_id \
        == NO_MASTER_BLOCK_ID


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from remp_node.testnet.sim import SimConfig, Simulation
    w = WalletSet(6, "verify-cli")
    sim = Simulation(SimConfig(validators=4, shard_count=1, group_size=4, seed=11, mc_catchain_lifetime=60.0),
                     wallets=w.genesis())
    t0 = int(sim.now)
    mids = [sim.submit(w.transfer(i, 3, t0 + 3600)) for i in range(4)]
    mids.append(sim.submit(w.transfer(4, 10 ** 9, t0 + 3600)))      # RejectedByFullnode
    assert sim.run_until(lambda: all(sim.finals.get(m) for m in mids), 60.0)
    d = tmp_path_factory.mktemp("verify")
    network = {"zerostate": sim.config.to_dict(),
               "nodes": [{"label": "fullnode1", "role": "fullnode", "public_key": sim.fullnode_key.public.hex()}]}
    (d / "network.json").write_text(json.dumps(network))
    (d / "validators.json").write_text(json.dumps([k.public.hex() for k in sim.keys]))
    return sim, d


def cli(argv, stdin_text=""):
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stdin=io.StringIO(stdin_text), stdout=out, stderr=err)
    return code, out.getvalue().splitlines(), err.getvalue()


def test_every_real_receipt_verifies(run):
    sim, d = run
    kinds = {r["kind"] for r in sim.receipts}
    assert {"PutIntoQueue", "AcceptedByQueue", "IncludedIntoBlock", "IncludedIntoAcceptedBlock", "Finalized",
            "SentToValidators", "RejectedByFullnode"} <= kinds
    (d / "receipts.jsonl").write_text("\n".join(json.dumps(r) for r in sim.receipts) + "\n")
    (d / "receipts.json").write_text(json.dumps(sim.receipts))
    for argv, stdin in ((["--validators", str(d / "network.json"), str(d / "receipts.jsonl")], ""),
                        (["--validators", str(d / "network.json"), str(d / "receipts.json")], ""),
                        (["--validators", str(d / "network.json")], json.dumps({"receipts": sim.receipts}))):
        code, lines, err = cli(argv, stdin)
        assert code == 0, lines[:3]
        assert len(lines) == len(sim.receipts) and all(line.startswith("ok ") for line in lines)
        assert f"{len(sim.receipts)} ok, 0 bad" in err
    # a validators-only key set: the full node's own statuses have no key there
    code, lines, _ = cli(["--validators", str(d / "validators.json"), str(d / "receipts.jsonl")])
    assert code == 1
    bad = [line for line in lines if line.startswith("bad:")]
    own = [r for r in sim.receipts if r["source_id"] == sim.fullnode_key.key_id.hex()]
    assert len(bad) == len(own) > 0 and all(line.startswith("bad: unknown_source") for line in bad)


def test_forged_tampered_and_garbage_are_bad_with_reason(run):
    sim, d = run
    good = [r for r in sim.receipts if r["kind"] == "IncludedIntoBlock"][0]
    tampered = dict(good, block_seqno=good["block_seqno"] + 1)
    stranger = NodeKey.from_seed(b"\x77" * 32)
    s = make_signed_receipt(stranger, bytes.fromhex(good["message_id"]), New(), good["timestamp"])
    forged_unknown = to_json(s.open(), s.signature)
    # claims a real validator as source, signed by the stranger
    claimed = dict(forged_unknown, source_id=good["source_id"])
    lines_in = [json.dumps(good), json.dumps(tampered), json.dumps(forged_unknown), json.dumps(claimed),
                "{not json", json.dumps({"kind": "Finalized"})]
    code, lines, err = cli(["--validators", str(d / "network.json")], "\n".join(lines_in))
    assert code == 1
    assert lines[0].startswith("ok IncludedIntoBlock " + good["message_id"])
    assert lines[1].startswith("bad: bad_signature") and "stdin:2" in lines[1]
    assert lines[2].startswith("bad: unknown_source")
    assert lines[3].startswith("bad: bad_signature")
    assert lines[4].startswith("bad: malformed: not JSON")
    assert lines[5].startswith("bad: malformed: missing field")
    assert "1 ok, 5 bad" in err
    code, lines, _ = cli(["-q", "--validators", str(d / "network.json")], "\n".join(lines_in))
    assert code == 1 and len(lines) == 5


def test_unusable_input_exits_2(run, tmp_path):
    sim, d = run
    (tmp_path / "empty.json").write_text("[]")
    (tmp_path / "keys.json").write_text('["abcd"]')
    assert cli(["--validators", str(tmp_path / "missing.json")])[0] == 2
    assert cli(["--validators", str(tmp_path / "keys.json")], "{}")[0] == 2
    assert cli(["--validators", str(d / "network.json"), str(tmp_path / "empty.json")])[0] == 2


def test_module_entry_point(run):
    sim, d = run
    text = "\n".join(json.dumps(r) for r in sim.receipts[:5])
    p = subprocess.run([sys.executable, "-m", "remp_node.daemon.verify", "--validators", str(d / "network.json"), "-"],
                       input=text, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.count("\nok ") + p.stdout.startswith("ok ") == 5
    bad = json.dumps(dict(sim.receipts[0], timestamp=sim.receipts[0]["timestamp"] + 1))
    p = subprocess.run([sys.executable, "-m", "remp_node.daemon.verify", "--validators", str(d / "network.json")],
                       input=bad, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and p.stdout.startswith("bad: bad_signature")
