"""remp_node/daemon/store.py and `remp-node init` (netfiles.py): what a daemon finds on disk."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

from remp_node.daemon.netfiles import load_key, load_network
from remp_node.core.state import make_wallet_message
from remp_node.daemon.store import FullnodeStore, ValidatorStore
from remp_node.core.validator import JournalEntry


def test_validator_store_survives_sigkill_right_after_write(tmp_path):
    # a child writes, prints "written", then waits to be killed: what write() returned must be on disk
    code = f"""
import sys, time
sys.path.insert(0, {os.getcwd()!r})
from remp_node.daemon.store import ValidatorStore
from remp_node.core.validator import JournalEntry
s = ValidatorStore({str(tmp_path)!r})
s.write([JournalEntry("master_commit", 1, b"c1"), JournalEntry("master_commit", 2, b"c2"),
         JournalEntry("signed_height", b"s" * 32, 7), JournalEntry("authored", b"a" * 32)])
print("written", flush=True)
time.sleep(60)
"""
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "written"
    finally:
        p.kill()
        p.wait(10)
    s = ValidatorStore(tmp_path)
    j = s.load()
    assert j.master_commits == {1: b"c1", 2: b"c2"}
    assert j.signed_heights == {b"s" * 32: 7}
    assert j.authored == {b"a" * 32}
    # heights only grow; commits are write-once
    s.write([JournalEntry("signed_height", b"s" * 32, 3), JournalEntry("master_commit", 1, b"other")])
    j = s.load()
    assert j.signed_heights[b"s" * 32] == 7 and j.master_commits[1] == b"c1"
    assert s.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert s.db.execute("PRAGMA synchronous").fetchone()[0] == 2      # FULL
    s.close()


def test_fullnode_store_keeps_statuses_in_order(tmp_path):
    s = FullnodeStore(tmp_path)
    mid = b"\x01" * 32
    s.add_message(mid, b"boc", 1.5)
    s.add_statuses([(mid, '{\"kind\":\"SentToValidators\"}'), (mid, '{\"kind\":\"PutIntoQueue\"}')])
    s.add_statuses([(mid, '{\"kind\":\"Finalized\"}')])
    assert s.pending() == [(mid, b"boc")]
    s.set_outcome(mid, "finalized", "Finalized", "")
    s.close()
    s = FullnodeStore(tmp_path)
    assert [d["kind"] for d in s.statuses(mid)] == ["SentToValidators", "PutIntoQueue", "Finalized"]
    assert s.message(mid)["outcome"] == "finalized" and s.pending() == []


def test_remp_node_init_writes_a_network(tmp_path):
    d = tmp_path / "net"
    r = subprocess.run([sys.executable, "-m", "remp_node.daemon.cli", "init", "--dir", str(d), "--shards", "2",
                        "--validators-per-shard", "3", "--masterchain-validators", "4", "--fullnodes", "1",
                        "--mc-catchain-lifetime", "12", "--block-interval", "0.2", "--ext-messages", "/nonexistent"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["validators"] == 6
    net = load_network(d)
    assert [n.label for n in net.validators()] == ["v1", "v2", "v3", "v4", "v5", "v6"]
    assert [n.label for n in net.fullnodes()] == ["fullnode1"]
    assert net.config.shard_group_size == 3 and len(net.config.shards) == 2
    assert len(net.config.masterchain_validators) == 4
    assert net.config.mc_catchain_lifetime == 12.0
    for n in net.nodes:
        mode = stat.S_IMODE(os.stat(d / n.key_file).st_mode)
        assert mode == 0o600, (n.label, oct(mode))
        assert load_key(d / n.key_file).public == n.public_key
        assert n.address.startswith("127.0.0.1:") and n.http.startswith("127.0.0.1:")
    assert stat.S_IMODE(os.stat(d / "wallets.json").st_mode) == 0o600
    # the zerostate holds the demo wallets of workchain 0 and -1; their transfers pre-check
    zs = net.zerostate()
    wallets = net.wallets()
    assert {w["workchain"] for w in wallets} == {0, -1}
    from remp_node.wire.keys import NodeKey
    from remp_node.wire.messages import parse_external_message
    for w in wallets:
        k = NodeKey.from_seed(bytes.fromhex(w["seed"]))
        boc = make_wallet_message(k, w["address"], w["address"], 1, 2_000_000_000)
        msg = parse_external_message(boc, zs.workchains)
        zs.state_for(msg.dst).precheck(msg, 1_700_000_000)
    # a bad argument is refused precisely
    r = subprocess.run([sys.executable, "-m", "remp_node.daemon.cli", "init", "--dir", str(tmp_path / "x"),
                        "--shards", "3"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "power of two" in r.stderr


def test_validator_outbox_add_done_in_order(tmp_path):
    """The receipt outbox (OutboxChange records): adds kept in order, done deletes by
    (dst, digest), a repeated add is one entry; what is left is reloaded by a new store."""
    import hashlib

    from remp_node.core.delivery import OutboxChange
    from remp_node.daemon.store import ValidatorStore
    dst = b"\x01" * 32
    rs = [bytes([i]) * 40 for i in range(5)]
    st = ValidatorStore(tmp_path)
    st.write([OutboxChange("add", dst, hashlib.sha256(r).digest(), r, 3) for r in rs])
    st.write([OutboxChange("add", dst, hashlib.sha256(rs[0]).digest(), rs[0], 3),
              OutboxChange("done", dst, hashlib.sha256(rs[1]).digest())])
    st.close()
    st = ValidatorStore(tmp_path)
    assert st.outbox() == [(dst, r, 3) for r in (rs[0], rs[2], rs[3], rs[4])]
    st.close()


def test_fullnode_store_commits_statuses_and_outcomes_together(tmp_path):
    """Statuses and outcomes queue until commit() (the daemon's step end, before its acks
    leave) and go in ONE transaction; reads and close() commit first."""
    import sqlite3
    s = FullnodeStore(tmp_path)
    mid = b"\x02" * 32
    s.add_message(mid, b"boc", 1.0)           # at once: the API answers 202 after it
    other = sqlite3.connect(str(tmp_path / "remp.sqlite3"))
    assert other.execute("SELECT count(*) FROM messages").fetchone()[0] == 1
    s.add_statuses([(mid, '{\"kind\":\"PutIntoQueue\"}')])
    s.set_outcome(mid, "finalized", "Finalized", "")
    assert other.execute("SELECT count(*) FROM statuses").fetchone()[0] == 0
    assert s.commit() == 2 and s.commit() == 0
    assert other.execute("SELECT count(*) FROM statuses").fetchone()[0] == 1
    assert other.execute("SELECT outcome FROM messages").fetchone()[0] == "finalized"
    s.add_statuses([(mid, '{\"kind\":\"Finalized\"}')])
    assert [d["kind"] for d in s.statuses(mid)] == ["PutIntoQueue", "Finalized"]
    s.add_statuses([(mid, '{\"kind\":\"late\"}')])
    s.close()
    assert other.execute("SELECT count(*) FROM statuses").fetchone()[0] == 3
    other.close()


def test_validator_outbox_changes_keep_their_order_in_one_write(tmp_path):
    """add / done runs in one write() (executemany per run) end as the sequence says."""
    from remp_node.core.delivery import OutboxChange
    s = ValidatorStore(tmp_path)
    d = b"\x03" * 32
    dg = [bytes([i]) * 32 for i in range(4)]
    s.write([OutboxChange("add", d, dg[0], b"r0", 1), OutboxChange("add", d, dg[1], b"r1", 1),
             OutboxChange("done", d, dg[0]), OutboxChange("add", d, dg[2], b"r2", 2),
             OutboxChange("done", d, dg[2]), OutboxChange("add", d, dg[2], b"r2", 2),
             OutboxChange("add", d, dg[3], b"r3", 2), OutboxChange("done", d, dg[3])])
    assert s.outbox() == [(d, b"r1", 1), (d, b"r2", 2)]
    s.close()


def test_validator_store_keeps_signed_receipts_until_their_session_is_obsolete(tmp_path):
    """The receipts a validator signed (journal kind "receipt": (message id, status bytes) ->
    (session, receipt bytes)) come back from a new store; the first one written for a key
    stays; "receipts_gc" s deletes those of sessions <= s; a write holding only receipts and
    outbox changes is not fsynced (synchronous NORMAL), one holding another journal kind is."""
    from remp_node.core.delivery import OutboxChange
    m1, m2 = b"\x01" * 32, b"\x02" * 32
    s = ValidatorStore(tmp_path)
    s.write([JournalEntry("receipt", (m1, b"new"), (3, b"r1-new")),
             OutboxChange("add", b"\x09" * 32, b"d" * 32, b"r1-new", 3),
             JournalEntry("receipt", (m1, b"queue"), (3, b"r1-queue")),
             JournalEntry("receipt", (m2, b"new"), (4, b"r2-new"))])
    assert s.db.execute("PRAGMA synchronous").fetchone()[0] == 1      # NORMAL
    s.write([JournalEntry("receipt", (m1, b"new"), (3, b"r1-other")), JournalEntry("authored", b"a" * 32)])
    assert s.db.execute("PRAGMA synchronous").fetchone()[0] == 2      # FULL
    s.close()
    s = ValidatorStore(tmp_path)
    assert s.load().receipts == {(m1, b"new"): (3, b"r1-new"), (m1, b"queue"): (3, b"r1-queue"),
                                 (m2, b"new"): (4, b"r2-new")}
    s.write([JournalEntry("receipts_gc", 3)])
    assert s.load().receipts == {(m2, b"new"): (4, b"r2-new")}
    s.close()
