"""marlin_cluster.transport on 127.0.0.1: LPF frames round-trip, a truncated and an
oversized record are refused with their reason and counted and close only that peer's
connection, the handshake is a mutual challenge-response (a replayed handshake and an
impostor acceptor are refused and counted), reconnect with backoff after the peer restarts, and
send queues stay bounded (overflow reported)."""
from __future__ import annotations

import asyncio
import os
import struct

import pytest

from marlin_cluster.crypto import NodeKey
from marlin_cluster.transport import LpfDecoder, Transport, dial_handshake, encode_lpf
from marlin_cluster.wire import (HELLO_DIALLER, KIND_ACK, KIND_CHUNK, KIND_HELLO, KIND_HELLO_PROOF, Hello,
                                 MarlinLocalError, MarlinWireError, decode_frame, encode_frame, hello_signed_data,
                                 parse_hello_reply)

MAX = 2 * 1024 * 1024


async def until(pred, timeout=15.0, step=0.01):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(step)


class Node:
    """A Transport plus what it received."""

    def __init__(self, key, directory, known, **kw):
        self.got: list[tuple[bytes, bytes]] = []
        self.rejects: list[tuple[bytes | None, str]] = []
        self.drops: list[tuple[bytes, str, int]] = []
        self.t = Transport(key, directory, known=known, on_frame=self._frame,
                           on_reject=lambda p, r, d: self.rejects.append((p, r)),
                           on_drop=lambda p, r, n: self.drops.append((p, r, n)),
                           max_frame=MAX, **kw)

    def _frame(self, peer, frame):
        if frame[:1] == bytes((KIND_ACK,)) and frame[1:] == b"refuse me":
            raise MarlinWireError("refused by the test core", "bad_attestation")
        self.got.append((peer, frame))


@pytest.fixture
def keys():
    return NodeKey.generate(), NodeKey.generate(), NodeKey.generate()


async def pair(keys, **kw):
    a_key, b_key, _ = keys
    b = Node(b_key, {}, known=[a_key.address])
    port = await b.t.start("127.0.0.1", 0)
    a = Node(a_key, {b_key.address: ("127.0.0.1", port)}, known=[], **kw)
    await a.t.start("127.0.0.1", 0)
    return a, b, port


def test_decoder_splits_at_every_boundary_and_bounds_records():
    frames = [b"x", os.urandom(1000), b"", os.urandom(70000)]
    stream = b"".join(encode_lpf(f) for f in frames)
    for step in (1, 7, 8, 9, 4096, len(stream)):
        dec = LpfDecoder(100_000)
        out = []
        for i in range(0, len(stream), step):
            out += dec.feed(stream[i:i + step])
        dec.eof()
        assert out == frames
    dec = LpfDecoder(10)
    assert dec.feed(struct.pack(">Q", 10) + b"0123456789") == [b"0123456789"]
    with pytest.raises(MarlinWireError) as exc:
        dec.feed(struct.pack(">Q", 11))
    assert exc.value.reason == "oversized" and dec.buffered == 0
    for partial in (b"\x00\x00\x00", struct.pack(">Q", 5) + b"abc"):
        dec = LpfDecoder(10)
        assert dec.feed(partial) == []
        with pytest.raises(MarlinWireError) as exc:
            dec.eof()
        assert exc.value.reason == "truncated"
    with pytest.raises(MarlinLocalError):
        LpfDecoder(0)


async def test_frames_round_trip_in_order_with_the_verified_peer(keys):
    a, b, _ = await pair(keys)
    try:
        frames = [encode_frame(KIND_CHUNK, os.urandom(n)) for n in (1, 100, 65536, 1024 * 1024, 5)]
        for f in frames:
            assert a.t.send(keys[1].address, f)
        await until(lambda: len(b.got) == len(frames))
        assert [f for _, f in b.got] == frames
        assert {p for p, _ in b.got} == {keys[0].address}
        assert b.t.counters[("frames_in", "")] == len(frames)
        await until(lambda: a.t.counters[("frames_out", "")] == len(frames))
        # a frame the core refuses is counted under its reason; the connection stays
        a.t.send(keys[1].address, encode_frame(KIND_ACK, b"refuse me"))
        a.t.send(keys[1].address, frames[0])
        await until(lambda: len(b.got) == len(frames) + 1)
        assert b.t.counters[("rejected", "bad_attestation")] == 1
        assert a.t.counters[("connects", "")] == 1
        with pytest.raises(MarlinLocalError):
            a.t.send(b"\x01" * 20, frames[0])
    finally:
        await a.t.close()
        await b.t.close()


async def raw_connect(port, key=None):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if key is not None:
        await dial_handshake(reader, writer, key, None)
    return reader, writer


async def closed_on_us(reader) -> bool:
    """True when the acceptor closed the connection (EOF, or a reset when it closed with our
    bytes unread)."""
    try:
        while await asyncio.wait_for(reader.read(4096), 10):
            pass
    except ConnectionResetError:
        pass
    return True


async def test_truncated_and_oversized_records_close_only_that_connection(keys):
    a_key, b_key, m_key = keys
    b = Node(b_key, {}, known=[a_key.address, m_key.address])
    port = await b.t.start()
    a = Node(a_key, {b_key.address: ("127.0.0.1", port)}, known=[])
    try:
        a.t.send(b_key.address, encode_frame(KIND_CHUNK, b"honest 1"))
        await until(lambda: len(b.got) == 1)
        # truncated: a header naming 100 bytes, 10 bytes, then EOF
        r, w = await raw_connect(port, m_key)
        w.write(struct.pack(">Q", 100) + b"0123456789")
        await w.drain()
        w.close()
        await until(lambda: b.t.counters[("rejected", "truncated")] == 1)
        # oversized: the header alone is refused and the connection closed by the acceptor
        r, w = await raw_connect(port, m_key)
        w.write(struct.pack(">Q", MAX + 1))
        await w.drain()
        assert await asyncio.wait_for(r.read(), 10) == b""   # closed on us
        w.close()
        assert b.t.counters[("rejected", "oversized")] == 1
        assert ("oversized" in {r for _, r in b.rejects}) and (m_key.address, "truncated") in b.rejects
        # the honest connection was never touched
        a.t.send(b_key.address, encode_frame(KIND_CHUNK, b"honest 2"))
        await until(lambda: len(b.got) == 2)
        assert [f for _, f in b.got] == [encode_frame(KIND_CHUNK, b"honest 1"),
                                        encode_frame(KIND_CHUNK, b"honest 2")]
        assert a.t.counters[("connects", "")] == 1 and not a.drops
    finally:
        await a.t.close()
        await b.t.close()


async def test_handshake_is_a_mutual_challenge_response(keys):
    a_key, b_key, stranger = keys
    b = Node(b_key, {}, known=[a_key.address], hello_timeout=2.0)
    port = await b.t.start()
    try:
        # an honest handshake by a, its bytes captured: hello + proof, then one chunk
        r, w = await asyncio.open_connection("127.0.0.1", port)
        sent = []
        real_write = w.write
        w.write = lambda data: (sent.append(bytes(data)), real_write(data))[1]
        assert await dial_handshake(r, w, a_key, b_key.address) == b_key.address
        w.write(encode_lpf(encode_frame(KIND_CHUNK, b"honest")))
        await w.drain()
        await until(lambda: len(b.got) == 1)
        assert b.got[0][0] == a_key.address
        w.close()
        captured = sent[0] + sent[1]          # hello with a's nonce, proof over b's old nonce
        # replayed verbatim on a new connection: b's fresh challenge is not what it signed
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(captured + encode_lpf(encode_frame(KIND_CHUNK, b"replayed")))
        await w.drain()
        assert await closed_on_us(r)
        await until(lambda: b.t.counters[("rejected", "bad_hello")] == 1)
        assert (None, "bad_hello") in b.rejects
        # a's address claimed by the stranger, who signs b's real challenge with its own key
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(encode_lpf(encode_frame(KIND_HELLO, Hello(a_key.address, os.urandom(32)).wire())))
        await w.drain()
        dec = LpfDecoder(MAX)
        frames = []
        while not frames:
            frames = dec.feed(await asyncio.wait_for(r.read(4096), 10))
        reply = parse_hello_reply(decode_frame(frames[0])[1])
        forged = stranger.sign(hello_signed_data(HELLO_DIALLER, a_key.address, b_key.address, reply.nonce))
        w.write(encode_lpf(encode_frame(KIND_HELLO_PROOF, forged)))
        await w.drain()
        assert await closed_on_us(r)
        # an unknown (but correctly answering) key; a chunk before any hello; silence
        r, w = await asyncio.open_connection("127.0.0.1", port)
        with pytest.raises((MarlinWireError, ConnectionError)):
            await dial_handshake(r, w, stranger, None)
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(encode_lpf(encode_frame(KIND_CHUNK, b"x")))
        await w.drain()
        assert await closed_on_us(r)
        r, w = await asyncio.open_connection("127.0.0.1", port)
        assert await closed_on_us(r)                   # nothing sent: closed after hello_timeout
        c = b.t.counters
        await until(lambda: c[("rejected", "hello_timeout")] == 1)
        assert (c[("rejected", "bad_hello")], c[("rejected", "unknown_peer")], c[("rejected", "no_hello")]) == \
            (2, 1, 1)
        assert b.got == [(a_key.address, encode_frame(KIND_CHUNK, b"honest"))]
    finally:
        await b.t.close()


async def test_dialler_refuses_an_acceptor_that_is_not_the_peer_it_dialled(keys):
    a_key, b_key, impostor_key = keys
    impostor = Node(impostor_key, {}, known=[a_key.address])       # listens where b should be
    port = await impostor.t.start()
    a = Node(a_key, {b_key.address: ("127.0.0.1", port)}, known=[])
    try:
        a.t.send(b_key.address, encode_frame(KIND_CHUNK, b"for b only"))
        await until(lambda: a.t.counters[("rejected", "wrong_peer")] >= 2)
        assert (b_key.address, "wrong_peer") in a.rejects
        assert impostor.got == [] and not a.t.connected(b_key.address)
        assert a.t.queued(b_key.address) == 1                      # kept for the real b
    finally:
        await a.t.close()
        await impostor.t.close()


async def test_reconnects_with_backoff_after_the_peer_restarts(keys):
    a_key, b_key, _ = keys
    b = Node(b_key, {}, known=[a_key.address])
    port = await b.t.start()
    a = Node(a_key, {b_key.address: ("127.0.0.1", port)}, known=[], backoff_min=0.02, backoff_max=0.2)
    try:
        a.t.send(b_key.address, encode_frame(KIND_CHUNK, b"before"))
        await until(lambda: len(b.got) == 1)
        await b.t.close()
        await until(lambda: not a.t.connected(b_key.address))
        # the peer is down: frames queue, dials fail and back off
        a.t.send(b_key.address, encode_frame(KIND_CHUNK, b"during"))
        await until(lambda: a.t.counters[("connect_failures", "")] >= 2)
        assert a.t.queued(b_key.address) == 1
        b2 = Node(b_key, {}, known=[a_key.address])
        await b2.t.start("127.0.0.1", port)
        try:
            a.t.send(b_key.address, encode_frame(KIND_CHUNK, b"after"))
            await until(lambda: len(b2.got) == 2)
            assert [f for _, f in b2.got] == [encode_frame(KIND_CHUNK, b"during"),
                                             encode_frame(KIND_CHUNK, b"after")]
            assert a.t.counters[("connects", "")] == 2
        finally:
            await b2.t.close()
    finally:
        await a.t.close()


async def test_send_queue_is_bounded_and_overflow_reported(keys):
    a_key, b_key, _ = keys
    stalled = asyncio.Event()

    async def never_read(reader, writer):   # accepts, never reads: the kernel buffers fill
        await stalled.wait()
        writer.close()

    server = await asyncio.start_server(never_read, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    limit = 2 * 1024 * 1024
    a = Node(a_key, {b_key.address: ("127.0.0.1", port)}, known=[], queue_bytes=limit, queue_frames=10_000)
    try:
        frame = encode_frame(KIND_CHUNK, b"\0" * 65536)
        accepted = refused = 0
        for _ in range(40):
            for _ in range(50):
                if a.t.send(b_key.address, frame):
                    accepted += 1
                else:
                    refused += 1
            await asyncio.sleep(0.02)
            assert a.t._outboxes[b_key.address].nbytes <= limit
        assert refused > 0 and accepted > 0
        assert a.t.counters[("dropped", "queue_full")] == refused
        assert sum(n for _, r, n in a.drops if r == "queue_full") == refused
        # the drain() backpressure: what left the queue is bounded by the socket buffers
        assert a.t.counters[("bytes_out", "")] < accepted * len(frame)
    finally:
        stalled.set()
        await a.t.close()
        server.close()
        await server.wait_closed()
