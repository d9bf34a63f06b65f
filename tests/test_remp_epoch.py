"""Restart ordering: a daemon's transport epoch and receipt delivery stream come from its
data dir as max(previous + 1, now_us), so a node restarted with its clock set back is
still newer than its previous run to every peer (no stale_epoch / stale_stream refusal)."""
from __future__ import annotations

import subprocess
import sys
import time

from remp_node.core.delivery import ReceiptReceiver, ReceiptSender
from remp_node.daemon.node import FullnodeDaemon, ValidatorDaemon, parse_role_args
from remp_node.wire.receipts import New, make_signed_receipt
from remp_node.daemon.store import FullnodeStore, ValidatorStore
from remp_node.transport.core import TransportCore


def test_run_epoch_grows_even_when_the_clock_goes_back(tmp_path):
    st = ValidatorStore(tmp_path / "v")
    assert st.run_epoch(5_000_000) == 5_000_000
    assert st.run_epoch(1_000) == 5_000_001          # clock set back
    assert st.run_epoch(9_000_000) == 9_000_000       # clock ahead: the clock wins
    st.close()
    assert ValidatorStore(tmp_path / "v").run_epoch(0) == 9_000_001     # survives reopening
    fs = FullnodeStore(tmp_path / "f")
    assert fs.run_epoch(7) == 7 and fs.run_epoch(3) == 8


def test_daemons_restarted_with_the_clock_set_back_are_not_stale(tmp_path, monkeypatch):
    d = tmp_path / "net"
    r = subprocess.run([sys.executable, "-m", "remp_node.daemon.cli", "init", "--dir", str(d), "--shards", "1",
                        "--validators-per-shard", "2", "--fullnodes", "1"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr

    def daemon(cls, role, label):
        _, args = parse_role_args(role, ["--network", str(d), "--key", str(d / "keys" / f"{label}.key"),
                                         "--data-dir", str(tmp_path / "data" / label), "--log", "-"])
        return cls(args)

    real = time.time_ns()
    v1 = daemon(ValidatorDaemon, "validator", "v1")
    fn = daemon(FullnodeDaemon, "fullnode", "fullnode1")
    first = (v1.epoch, v1.sender.stream, fn.epoch)
    assert v1.sender.stream == v1.epoch and v1.epoch >= real // 1000
    v1.close_logs()
    fn.close_logs()
    # restart with the clock one hour behind
    monkeypatch.setattr(time, "time_ns", lambda: real - 3600 * 10**9)
    v1b = daemon(ValidatorDaemon, "validator", "v1")
    fnb = daemon(FullnodeDaemon, "fullnode", "fullnode1")
    assert v1b.epoch > first[0] and v1b.sender.stream > first[1] and fnb.epoch > first[2]
    # what a peer does with them: the transport accepts the restarted run, refuses the old one
    a1, a2 = TransportCore(v1.key, {fn.key.public: fn.key.key_id}, epoch=first[0]), \
        TransportCore(v1b.key, {fn.key.public: fn.key.key_id}, epoch=v1b.epoch)
    b = TransportCore(fn.key, {v1.key.public: v1.key.key_id}, epoch=fnb.epoch)
    got = []
    for core, payload in ((a1, b"run 1"), (a2, b"run 2"), (a1, b"run 1 again")):
        core.send(fn.key.key_id, payload, 0.0)
        for data, _ in core.datagrams_to_send(0.0):
            b.receive_datagram(data, v1.key.key_id, 0.0)
        while (ev := b.next_event()) is not None:
            got.append(getattr(ev, "payload", None))
    assert [g for g in got if g] == [b"run 1", b"run 2"] and b.counters["dropped_stale_epoch"] == 1
    # and the receipt delivery: the restarted stream replaces the old one at the full node
    rx = ReceiptReceiver(fn.key, {v1.key.key_id: v1.key.public})
    for sender, t in ((ReceiptSender(v1.key, stream=first[1]), 1), (ReceiptSender(v1.key, stream=v1b.sender.stream), 2)):
        sender.add(fn.key.key_id, make_signed_receipt(v1.key, bytes([t]) * 32, New(), t), 0.0)
        sender.handle_timer(1.0)
        for _, p in sender.packets_to_send(1.0):
            rx.receive(v1.key.key_id, p, 1.0)
    assert rx.stats["receipts"] == 2
    v1b.close_logs()
    fnb.close_logs()
