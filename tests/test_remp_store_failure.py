"""The full node when its SQLite store refuses writes (disk full, read-only file): a POSTed
message it cannot record is refused with 503 and not sent (a message it could not resubmit
after a crash is never accepted); statuses it cannot commit stay queued, the receipt acks of
that step are held back so the validators resend, and the failure is counted and logged as
a store failure, not as a bug; a validator holds every datagram of a step until that step's
journal entries are written. The failure is real: SQLite's `PRAGMA query_only` makes every
write fail with "attempt to write a readonly database"."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
import time

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import generate_latest

from remp_node.api.server import add_api_routes
from remp_node.core.delivery import ReceiptSender, classify
from remp_node.wire.keys import NodeKey
from remp_node.daemon.netfiles import load_key, load_network
from remp_node.daemon.node import FullnodeDaemon, ValidatorDaemon, parse_role_args
from remp_node.wire.receipts import New, make_signed_receipt
from remp_node.core.state import make_wallet_message


@pytest.fixture
def net(tmp_path):
    d = tmp_path / "net"
    r = subprocess.run([sys.executable, "-m", "remp_node.daemon.cli", "init", "--dir", str(d), "--shards", "1",
                        "--validators-per-shard", "2", "--fullnodes", "1"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return d


def fullnode(tmp_path, d) -> FullnodeDaemon:
    _, args = parse_role_args("fullnode", [
        "--network", str(d), "--key", str(d / "keys" / "fullnode1.key"), "--data-dir", str(tmp_path / "fn"),
        "--log", str(tmp_path / "fn.jsonl"), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
    return FullnodeDaemon(args)


def wallet_message(d, amount: int) -> bytes:
    w = [w for w in load_network(d).wallets() if w["workchain"] == 0][0]
    k = NodeKey.from_seed(bytes.fromhex(w["seed"]))
    return make_wallet_message(k, w["address"], w["address"], amount, int(time.time()) + 3600, nonce=amount)


def logged(path, event: str) -> list[dict]:
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [e for e in lines if e.get("event") == event]


async def test_a_message_the_store_cannot_record_is_refused_with_503_and_not_sent(tmp_path, net):
    fn = fullnode(tmp_path, net)
    app = web.Application()
    add_api_routes(app, fn)
    info = await fn.start_io(app)
    try:
        api = f"http://127.0.0.1:{info['port']}"
        boc = wallet_message(net, 1)
        fn.store.db.execute("PRAGMA query_only = ON")
        async with aiohttp.ClientSession() as s:
            async with s.post(api + "/messages", data=base64.b64encode(boc)) as r:
                assert r.status == 503, await r.text()
                body = await r.json()
            assert "not accepted" in body["error"] and "readonly" in body["error"]
            assert fn.client.stats["submitted"] == 0 and not fn.client.pending()   # nothing sent
            async with s.get(api + "/metrics") as r:
                assert 'remp_api_refused_total{reason="store_unavailable"} 1.0' in await r.text()
            # the store writable again: the same message is accepted and recorded
            fn.store.db.execute("PRAGMA query_only = OFF")
            async with s.post(api + "/messages", data=base64.b64encode(boc)) as r:
                assert r.status == 202
                mid = bytes.fromhex((await r.json())["message_id"])
            assert fn.store.message(mid) is not None and len(fn.client.pending()) == 1
    finally:
        await fn.close_io()
        fn.close_logs()


def test_statuses_that_cannot_be_committed_stay_queued_and_their_acks_are_held_back(tmp_path, net):
    fn = fullnode(tmp_path, net)
    v1 = load_key(net / "keys" / "v1.key")
    boc = wallet_message(net, 2)
    now = time.time()
    mid = fn.client.submit(boc, now)        # tracked by the client core (no I/O started)
    fn.store.add_message(mid, boc, now)
    fn.step(now)
    sender = ReceiptSender(v1, stream=1, max_delay=0.0)
    sender.add(fn.key.key_id, make_signed_receipt(v1, mid, New(), int(now)), now)
    sender.handle_timer(now)
    packets = [p for _, p in sender.packets_to_send(now)]
    assert len(packets) == 1

    fn.store.db.execute("PRAGMA query_only = ON")
    fn.receive(v1.key_id, packets[0], now)
    out = fn.step(now + 1.0)
    assert not [p for dst, p in out if dst == v1.key_id and classify(p) == "receipt_ack"]   # held back
    assert fn.store_failures == 1 and fn.health()["store_failures"] == 1
    assert sum(fn.errors.values()) == 0                   # not counted as a bug
    fn.step(now + 1.5)                                     # still failing: counted, logged once
    assert fn.store_failures == 2

    # writable again; the validator resends the unacknowledged packet: acked, statuses stored
    fn.store.db.execute("PRAGMA query_only = OFF")
    fn.receive(v1.key_id, packets[0], now + 2.0)
    out = fn.step(now + 3.0)
    assert [p for dst, p in out if dst == v1.key_id and classify(p) == "receipt_ack"]
    kinds = [s.get("kind") for s in fn.store.statuses(mid)]
    assert kinds == ["SentToValidators", "PutIntoQueue"], kinds     # New = PutIntoQueue, once
    fn.close_logs()                                        # flushes the event log
    failed = logged(tmp_path / "fn.jsonl", "remp.node.store_failed")
    assert len(failed) == 1 and failed[0]["level"] == "error", failed
    assert "readonly" in json.dumps(failed[0]) and '"count": 1' in json.dumps(failed[0])
    assert logged(tmp_path / "fn.jsonl", "remp.node.error") == []


def test_a_validator_holds_its_datagrams_until_its_journal_is_written(tmp_path, net):
    """Validators v1, v2 (1 shard, both on the masterchain) stepped in memory, datagrams handed
    across directly. From v1's first failed journal write on, nothing v1 produces leaves (its
    votes depend on journal entries; a step with none still waits behind the unwritten ones) and the network does not move past master height 1; once the
    store takes writes again the held entries are written, the held datagrams leave and both
    reach height 2, as a healthy pair does."""
    def validator(label):
        _, args = parse_role_args("validator", [
            "--network", str(net), "--key", str(net / "keys" / f"{label}.key"),
            "--data-dir", str(tmp_path / label), "--log", str(tmp_path / f"{label}.jsonl")])
        return ValidatorDaemon(args)
    v1, v2 = validator("v1"), validator("v2")
    by_id = {v1.key.key_id: v1, v2.key.key_id: v2}
    t = v1.net.config.genesis_time + 0.01
    sent_by_v1 = 0

    def run(steps: int):
        nonlocal t, sent_by_v1
        for _ in range(steps):
            for v in (v1, v2):
                out = v.step(t)
                if v is v1 and v1.store_failures:     # from its first failed journal write on
                    sent_by_v1 += len(out)
                for dst, data in out:
                    if dst in by_id:
                        by_id[dst].receive(v.key.key_id, data, t)
            t += 0.05

    v1.store.db.execute("PRAGMA query_only = ON")
    run(100)
    assert sent_by_v1 == 0 and v1.store_failures > 0
    h = v1.health()
    assert h["journal_unwritten"] > 0 and h["held_datagrams"] > 0 and h["held_dropped"] == 0
    assert v1.core.master.height == 1 and v2.core.master.height == 1
    assert v1.store.writes == 0

    v1.store.db.execute("PRAGMA query_only = OFF")
    run(60)
    h = v1.health()
    assert h["journal_unwritten"] == 0 and h["held_datagrams"] == 0 and sent_by_v1 > 0
    assert v1.core.master.height == 2 and v2.core.master.height == 2
    # /metrics reads the height at scrape time, and counts the store failures
    metrics = generate_latest(v1.registry).decode()
    assert "\nremp_master_height 2.0\n" in metrics and "\nremp_session 0.0\n" in metrics
    assert f'remp_errors_total{{where="store"}} {float(v1.store_failures)}' in metrics
    assert v1.store.db.execute("SELECT count(*) FROM signed_heights").fetchone()[0] > 0
    v1.close_logs()
    v2.close_logs()
    failed = logged(tmp_path / "v1.jsonl", "remp.node.store_failed")
    assert len(failed) == 1 and "journal entries" in json.dumps(failed[0]), failed
    assert logged(tmp_path / "v1.jsonl", "remp.node.error") == []
