"""UdpEndpoint with real sockets on
127.0.0.1: honest request/response keeps flowing while an attacker's socket sends garbage,
a forged signature, an oversized datagram, a never-completed fragmented payload and
replayed datagrams, each refused and counted by reason; the test-only Faults flag
(loss, duplication, reordering at the adapter); receipt delivery over UDP with 20% loss."""
from __future__ import annotations

import asyncio
import hashlib
import os
import socket

from remp_node.core.delivery import ReceiptReceiver, ReceiptSender, classify
from remp_node.wire.keys import NodeKey
from remp_node.wire.receipts import Accepted, Level, New, make_signed_receipt
from remp_node.wire.tl import BlockIdExt
from remp_node.transport.core import HEADER_SIZE, TransportCore, TransportLimits
from remp_node.transport.udp import Faults, UdpEndpoint


def key(tag: str) -> NodeKey:
    return NodeKey.from_seed(hashlib.sha256(tag.encode()).digest())


A, B, C, M = key("udp-a"), key("udp-b"), key("udp-c"), key("udp-mallory")


async def until(pred, timeout: float = 20.0) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if pred():
            return True
        await asyncio.sleep(0.01)
    return pred()


async def pair(limits_b=None, faults_a=None, faults_b=None, on_b=None):
    got_a, got_b = [], []
    ca = TransportCore(A, {}, epoch=1)
    cb = TransportCore(B, {}, epoch=1, limits=limits_b or TransportLimits())
    ea = await UdpEndpoint.create(ca, ("127.0.0.1", 0), lambda s, p, n: got_a.append((s, p)), faults=faults_a)
    eb = await UdpEndpoint.create(cb, ("127.0.0.1", 0), on_b or (lambda s, p, n: got_b.append((s, p))),
                                  faults=faults_b)
    ca.add_peer(B.key_id, B.public, eb.address)
    cb.add_peer(A.key_id, A.public, ea.address)
    return ea, eb, got_a, got_b


async def test_honest_traffic_flows_while_each_bad_input_is_refused():
    holder = {}

    def echo(src, payload, now):            # B answers every request
        holder["eb"].send(src, b"re:" + payload)

    ea, eb, got_a, _ = await pair(limits_b=TransportLimits(reassembly_timeout=1.0), on_b=echo)
    holder["eb"] = eb
    cb = eb.core
    cb.add_peer(C.key_id, C.public, ("127.0.0.1", 9))
    attacker = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    attacker.bind(("127.0.0.1", 0))
    stop = asyncio.Event()
    sent = []

    async def honest():
        i = 0
        while not stop.is_set():
            p = b"req %d " % i + os.urandom(i % 3000)    # single- and multi-part requests
            sent.append(p)
            ea.send(B.key_id, p)
            i += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(honest())
    try:
        assert await until(lambda: len(got_a) >= 5)
        # garbage
        for n in (1, 40, 300):
            attacker.sendto(os.urandom(n), eb.address)
        # forged signature: A's real header, a ciphertext bit flipped
        tap = TransportCore(A, {B.public: eb.address}, epoch=1)   # A's key, its own seq space
        tap.send(B.key_id, b"forged", 0.0)
        dg = bytearray(tap.datagrams_to_send(0.0)[0][0])
        dg[HEADER_SIZE + 5] ^= 0x40
        attacker.sendto(bytes(dg), eb.address)
        # forged sender: Mallory names A in the header
        mal = TransportCore(M, {B.public: eb.address}, epoch=1)
        mal.send(B.key_id, b"I am A", 0.0)
        dg = bytearray(mal.datagrams_to_send(0.0)[0][0])
        dg[2:34] = A.key_id
        attacker.sendto(bytes(dg), eb.address)
        # oversized
        attacker.sendto(os.urandom(1500), eb.address)
        # replayed: a datagram of C's accepted once, sent again twice
        cc = TransportCore(C, {B.public: eb.address}, epoch=1)
        cc.send(B.key_id, b"from C once", 0.0)
        once = cc.datagrams_to_send(0.0)[0][0]
        for _ in range(3):
            attacker.sendto(once, eb.address)
        # never-completed fragmented payload from C
        cc.send(B.key_id, os.urandom(8000), 0.0)
        for data, _ in cc.datagrams_to_send(0.0)[:-1]:
            attacker.sendto(data, eb.address)
        cnt = cb.counters
        assert await until(lambda: cnt["dropped_reassembly_timeout"] == 1 and cnt["dropped_replayed"] == 2)
        n = len(got_a)
        assert await until(lambda: len(got_a) >= n + 20)     # still answering
    finally:
        stop.set()
        await task
        attacker.close()
    assert await until(lambda: len(got_a) == len(sent))
    assert [p for _, p in got_a] == [b"re:" + p for p in sent]       # every honest request answered, in order
    assert cnt["dropped_garbage"] == 3 and cnt["dropped_forged"] == 2 and cnt["dropped_oversized"] == 1
    assert cnt["dropped_replayed"] == 2 and cnt["dropped_reassembly_timeout"] == 1
    assert ea.core.counters["dropped_forged"] == 0
    ea.close()
    eb.close()


async def test_faults_at_the_adapter_lose_duplicate_and_reorder():
    fa = Faults(loss=0.2, duplicate=0.2, reorder=0.3, reorder_delay=0.03, seed=7)
    ea, eb, _, got_b = await pair(faults_a=fa)
    payloads = [b"%04d" % i + os.urandom(100) for i in range(300)]
    for p in payloads:
        ea.send(B.key_id, p)
        await asyncio.sleep(0.001)
    expect = len(payloads) - fa.stats["lost"]
    assert await until(lambda: len(got_b) == expect and eb.core.counters["dropped_replayed"] == fa.stats["duplicated"])
    got = [p for _, p in got_b]
    assert len(set(got)) == len(got) and set(got) <= set(payloads)
    assert fa.stats["lost"] > 20 and fa.stats["duplicated"] > 20 and fa.stats["reordered"] > 20
    assert got != sorted(got)                      # reordering was real
    ea.close()
    eb.close()


async def test_receipts_delivered_complete_and_in_order_over_udp_with_20_percent_loss():
    """ReceiptSender on a validator, ReceiptReceiver on the full node, UdpEndpoints with
    20% loss, duplication and reordering at BOTH adapters (the issue's must-show 2 shape)."""
    loop = asyncio.get_running_loop()
    fv = Faults(loss=0.2, duplicate=0.2, reorder=0.2, seed=1)
    ff = Faults(loss=0.2, duplicate=0.2, reorder=0.2, seed=2)
    sender = ReceiptSender(A, stream=1)
    receiver = ReceiptReceiver(B, [A.public])
    delivered = []
    holder = {}

    def pump():
        now = loop.time()
        for dst, p in sender.packets_to_send(now):
            holder["ev"].send(dst, p)
        for dst, p in receiver.packets_to_send(now):
            holder["ef"].send(dst, p)
        while (ev := receiver.next_event()) is not None:
            delivered.append(ev.signed.serialize())

    def on_validator(src, payload, now):
        assert classify(payload) == "receipt_ack"
        sender.receive_ack(src, payload, now)

    def on_fullnode(src, payload, now):
        assert classify(payload) == "receipt_batch"
        receiver.receive(src, payload, now)
        pump()

    ev = await UdpEndpoint.create(TransportCore(A, {}, epoch=1), ("127.0.0.1", 0), on_validator, faults=fv)
    ef = await UdpEndpoint.create(TransportCore(B, {}, epoch=1), ("127.0.0.1", 0), on_fullnode, faults=ff)
    ev.core.add_peer(B.key_id, B.public, ef.address)
    ef.core.add_peer(A.key_id, A.public, ev.address)
    holder.update(ev=ev, ef=ef)
    block = BlockIdExt(0, 0x4000000000000000, 1, b"\x01" * 32, b"\x02" * 32)
    produced = []
    for i in range(150):
        mid = hashlib.sha256(b"%d" % i).digest()
        for st in (New(), Accepted(Level.QUEUE), Accepted(Level.COLLATOR, block)):
            s = make_signed_receipt(A, mid, st, 1_700_000_000_000 + i)
            produced.append(s.serialize())
            sender.add(B.key_id, s, loop.time())
        pump()
        await asyncio.sleep(0.002)

    async def ticker():
        while True:
            pump()
            await asyncio.sleep(0.01)

    t = asyncio.create_task(ticker())
    try:
        assert await until(lambda: sender.unacked() == 0 and len(delivered) == len(produced), 60.0)
    finally:
        t.cancel()
    assert delivered == produced
    assert fv.stats["lost"] > 0 and ff.stats["lost"] > 0 and sender.stats["resends"] > 0
    ev.close()
    ef.close()
