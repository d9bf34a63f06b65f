"""TCP transport between Marlin nodes (DESIGN.md section 5 "Transport").

Framing is OpenWeaver's LPF (marlinprotocol/OpenWeaver `core/include/marlin/stream/
StreamTransport.hpp`'s length-prefix framing, `LpfTransport`): every record is

    | Length 8 (u64 big-endian) | Frame (Length bytes) |

and each frame is one `marlin_cluster.wire` frame (kind byte + body).

Two layers, aioquic style:

* `LpfDecoder` (sans-I/O): `feed(bytes) -> [frame, ...]`, `eof()`; a length above
  `max_frame` raises `MarlinWireError(reason="oversized")` as soon as the 8-byte header is
  seen (the body is never buffered); `eof()` with a partial record buffered raises
  `MarlinWireError(reason="truncated")`. Pure, bounded memory (at most one header + one
  max_frame body buffered).
* `Transport` (asyncio streams adapter): one listening socket; an outgoing connection per
  peer address, dialled on first use (or `warm()`), re-dialled with exponential backoff
  (0.05 s doubling to 2 s, +-25 % jitter) when it fails or the peer goes away; a bounded
  send queue per peer (frames and bytes) whose overflow is dropped and reported
  (`counters[("dropped", reason)]`, `on_drop`); writes await `drain()` (backpressure from
  the kernel's socket buffer to the queue).

Handshake (mutual challenge-response, wire.py "Connection handshake"):

    dialler  -> acceptor  KIND_HELLO        | dialler address | nonce_D (32 fresh bytes) |
    acceptor -> dialler   KIND_HELLO_REPLY  | acceptor address | nonce_A | sig_A |
                          sig_A over hello_signed_data("A", acceptor, dialler, nonce_D)
    dialler  -> acceptor  KIND_HELLO_PROOF  | sig_D |
                          sig_D over hello_signed_data("D", dialler, acceptor, nonce_A)

The acceptor refuses a dialler address not in `known` ("unknown_peer", before it signs
anything) and a proof that does not recover to the claimed address over ITS fresh nonce
("bad_hello": a replayed or forged handshake; a captured handshake is worthless on a new
connection). The dialler refuses a reply not signed over its nonce ("bad_hello") or naming
another address than the directory entry it dialled ("wrong_peer"), so the acceptor proves
who it is too. Either side gives the handshake `hello_timeout` seconds ("hello_timeout").
Only after it are the connection's frames handed to `on_frame(peer_address, frame)`.
No clock is involved (no timestamp to tolerate).

After the handshake connections are one-way: frames flow dialler -> acceptor (the dialler
watches its socket for EOF to notice a peer restart sooner). Frames the kernel had accepted
when a peer died are lost without notice; the protocol's acknowledgements and erasure
coding cover that, frames still queued here are sent after the reconnect.

Errors and the one boundary per connection: a decoder or hello error (a MarlinWireError)
is counted under `counters[("rejected", reason)]`, reported to `on_reject(peer, reason,
detail)` and closes THAT connection only; a MarlinWireError raised by `on_frame` (a chunk
the core refused) is counted and reported but the connection stays; anything else raised
by `on_frame` is a bug: reported to `on_bug` through the shared guard
(daemon_runtime.guard.Guard), counted as ("rejected", "bug"), the connection stays.
"""
from __future__ import annotations

import asyncio
import collections
import os
import random
import struct
import time
from typing import Callable, Iterable, Mapping

from daemon_runtime.guard import Guard
from daemon_runtime.linkmodel import delay_transport

from .crypto import BadSignature, NodeKey, recover_signer
from .wire import (DEFAULT_MAX_FRAME, HELLO_ACCEPTOR, HELLO_DIALLER, KIND_HELLO, KIND_HELLO_PROOF, KIND_HELLO_REPLY,
                   NONCE_LEN, Hello, HelloReply, MarlinLocalError, MarlinWireError, decode_frame, encode_frame,
                   hello_signed_data, parse_hello, parse_hello_proof, parse_hello_reply)

__all__ = ["LpfDecoder", "encode_lpf", "Transport", "LPF_HEADER", "dial_handshake"]

_LEN = struct.Struct(">Q")
LPF_HEADER = _LEN.size  # 8


def encode_lpf(frame: bytes) -> bytes:
    """One LPF record: u64 big-endian length + frame."""
    return _LEN.pack(len(frame)) + frame


class LpfDecoder:
    """Sans-I/O LPF record decoder. `max_frame`: largest frame in bytes (a header naming
    more raises MarlinWireError("oversized") before any body byte is kept)."""

    __slots__ = ("max_frame", "_buf", "_need")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME):
        if max_frame < 1:
            raise MarlinLocalError("max_frame must be positive")
        self.max_frame = max_frame
        self._buf = bytearray()
        self._need = -1   # body length of the record being read, -1 = header not yet read

    @property
    def buffered(self) -> int:
        """Bytes held waiting for the rest of a record."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        """Adds bytes; returns the complete frames (possibly none). Raises
        MarlinWireError("oversized") for a record longer than max_frame; the decoder is then
        unusable (close the connection)."""
        buf = self._buf
        buf += data
        out: list[bytes] = []
        while True:
            if self._need < 0:
                if len(buf) < LPF_HEADER:
                    return out
                (n,) = _LEN.unpack_from(buf, 0)
                if n > self.max_frame:
                    buf.clear()
                    raise MarlinWireError(f"LPF record of {n} bytes exceeds {self.max_frame}", "oversized")
                del buf[:LPF_HEADER]
                self._need = n
            if len(buf) < self._need:
                return out
            n = self._need
            out.append(bytes(buf[:n]))
            del buf[:n]
            self._need = -1

    def eof(self) -> None:
        """The stream ended. Raises MarlinWireError("truncated") when part of a record
        (header or body) is buffered."""
        if self._need >= 0 or self._buf:
            got = len(self._buf)
            want = self._need if self._need >= 0 else LPF_HEADER
            self._buf.clear()
            self._need = -1
            raise MarlinWireError(f"stream ended inside an LPF record ({got} of {want} bytes)", "truncated")


def _recover(data: bytes, signature: bytes, what: str) -> bytes:
    try:
        return recover_signer(data, signature)
    except BadSignature as exc:
        raise MarlinWireError(f"{what} signature: {exc}", "bad_hello") from None


async def _read_frame(reader: asyncio.StreamReader, decoder: LpfDecoder) -> bytes:
    while True:
        data = await reader.read(4096)
        if not data:
            decoder.eof()
            raise MarlinWireError("connection closed during the handshake", "truncated")
        frames = decoder.feed(data)
        if frames:
            return frames[0]


async def dial_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: NodeKey,
                         expected: bytes | None, *, timeout: float = 10.0,
                         max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """The dialler's side of the handshake (module docstring) on an open connection: sends
    the hello with a fresh nonce, checks the reply (signed by the address it names over our
    nonce; that address == `expected` unless None), sends the proof. Returns the acceptor's
    address. Raises MarlinWireError: "bad_hello", "wrong_peer", "no_hello" (another frame
    kind), "hello_timeout" (no reply within `timeout` s), "truncated"/"oversized"; OSError
    when the connection fails."""
    nonce = os.urandom(NONCE_LEN)
    writer.write(encode_lpf(encode_frame(KIND_HELLO, Hello(key.address, nonce).wire())))
    await writer.drain()
    try:
        frame = await asyncio.wait_for(_read_frame(reader, LpfDecoder(max_frame)), timeout)
    except asyncio.TimeoutError:
        raise MarlinWireError(f"no hello reply within {timeout} s", "hello_timeout") from None
    kind, body = decode_frame(frame, max_frame)
    if kind != KIND_HELLO_REPLY:
        raise MarlinWireError(f"frame kind {kind} instead of a hello reply", "no_hello")
    reply = parse_hello_reply(body)
    signer = _recover(hello_signed_data(HELLO_ACCEPTOR, reply.address, key.address, nonce), reply.signature,
                      "hello reply")
    if signer != reply.address:
        raise MarlinWireError(f"hello reply naming 0x{reply.address.hex()} does not sign our nonce with its key",
                              "bad_hello")
    if expected is not None and reply.address != expected:
        raise MarlinWireError(f"dialled 0x{expected.hex()}, the acceptor proved to be 0x{reply.address.hex()}",
                              "wrong_peer")
    proof = key.sign(hello_signed_data(HELLO_DIALLER, key.address, reply.address, reply.nonce))
    writer.write(encode_lpf(encode_frame(KIND_HELLO_PROOF, proof)))
    await writer.drain()
    return reply.address


class _Outbox:
    __slots__ = ("peer", "frames", "nbytes", "wake", "task", "connected", "connects", "failures")

    def __init__(self, peer: bytes):
        self.peer = peer
        self.frames: collections.deque[bytes] = collections.deque()
        self.nbytes = 0
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.connected = False
        self.connects = 0
        self.failures = 0


class Transport:
    """Asyncio TCP transport of one node (see the module docstring).

    key:        this node's NodeKey (signs the hello)
    directory:  {peer address (20 bytes): (host, port)} peers this node dials
    known:      addresses allowed to connect to us (default: the directory's keys)
    on_frame(peer, frame):   called for every frame after the hello (synchronously)
    on_reject(peer|None, reason, detail): every refused record / frame / hello
    on_drop(peer, reason, frames): frames this node did not send (queue full, connection lost)
    on_bug(exc):             an unexpected exception from on_frame
    max_frame:   bytes, largest LPF record accepted (default wire.DEFAULT_MAX_FRAME)
    queue_frames / queue_bytes: per-peer send queue bounds
    hello_timeout: seconds either side gives the handshake to finish
    clock:       unix-seconds clock (time.time; kept for callers, the handshake reads none)
    """

    def __init__(self, key: NodeKey, directory: Mapping[bytes, tuple[str, int]], *,
                 on_frame: Callable[[bytes, bytes], None],
                 known: Iterable[bytes] | None = None,
                 on_reject: Callable[[bytes | None, str, str], None] | None = None,
                 on_drop: Callable[[bytes, str, int], None] | None = None,
                 on_bug: Callable[[BaseException], None] | None = None,
                 max_frame: int = DEFAULT_MAX_FRAME, queue_frames: int = 4096,
                 queue_bytes: int = 64 * 1024 * 1024, hello_timeout: float = 10.0,
                 backoff_min: float = 0.05, backoff_max: float = 2.0, connect_timeout: float = 5.0,
                 clock: Callable[[], float] = time.time):
        self.key = key
        self.directory = dict(directory)
        self._known = set(known) if known is not None else set(self.directory)
        self.on_frame = on_frame
        self.on_reject = on_reject
        self.on_drop = on_drop
        self.on_bug = on_bug
        #: the shared guard (daemon_runtime.guard): counted as ("rejected", "bug"), every
        #: one handed to on_bug (whose own guard rate-limits the log line)
        self.guard = Guard(self._report_bug, self._count_bug, window=None)
        self.max_frame = max_frame
        self.queue_frames = queue_frames
        self.queue_bytes = queue_bytes
        self.hello_timeout = hello_timeout
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self.connect_timeout = connect_timeout
        self.clock = clock
        #: ("frames_in"|"frames_out"|"bytes_in"|"bytes_out"|"connects"|"connect_failures"
        #:  |"accepted", "") and ("rejected"|"dropped", reason) -> count
        self.counters: collections.Counter = collections.Counter()
        self._outboxes: dict[bytes, _Outbox] = {}
        self._server: asyncio.base_events.Server | None = None
        self._inbound: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._closing = False
        self.port: int | None = None

    # ------------------------------------------------------------------ inbound

    def is_known(self, address: bytes) -> bool:
        return address in self._known

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on host:port (0 = a free port). Returns the bound port. Raises OSError."""
        self._server = await asyncio.start_server(self._accept, host, port, limit=1 << 20)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def _reject(self, peer: bytes | None, reason: str, detail: str) -> None:
        self.counters[("rejected", reason)] += 1
        if self.on_reject is not None:
            try:
                self.on_reject(peer, reason, detail)
            except Exception as exc:  # a broken reporter must not kill the connection loop
                self.guard.bug(exc, "on_reject")

    def _count_bug(self, where: str, exc: BaseException) -> None:
        self.counters[("rejected", "bug")] += 1

    def _report_bug(self, where: str, exc: BaseException, src: str | None) -> None:
        if self.on_bug is not None:
            self.on_bug(exc)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._inbound.add(task)
        self._writers.add(writer)
        self.counters[("accepted", "")] += 1
        peer: bytes | None = None
        claimed: bytes | None = None       # the dialler's address, until its proof verifies
        challenge = b""
        decoder = LpfDecoder(self.max_frame)
        handshake_until = asyncio.get_running_loop().time() + self.hello_timeout
        try:
            while not self._closing:
                if peer is None:
                    left = handshake_until - asyncio.get_running_loop().time()
                    try:
                        data = await asyncio.wait_for(reader.read(1 << 18), max(0.0, left))
                    except asyncio.TimeoutError:
                        raise MarlinWireError(f"handshake not finished within {self.hello_timeout} s",
                                              "hello_timeout") from None
                else:
                    data = await reader.read(1 << 18)
                if not data:
                    decoder.eof()
                    return
                frames = decoder.feed(data)
                for frame in frames:
                    if peer is None:
                        kind, body = decode_frame(frame, self.max_frame)
                        if claimed is None:
                            if kind != KIND_HELLO:
                                raise MarlinWireError(f"first frame is kind {kind}, not hello", "no_hello")
                            hello = parse_hello(body)
                            if not self.is_known(hello.address):
                                raise MarlinWireError(f"0x{hello.address.hex()} is not in the network",
                                                      "unknown_peer")
                            claimed, challenge = hello.address, os.urandom(NONCE_LEN)
                            sig = self.key.sign(hello_signed_data(HELLO_ACCEPTOR, self.key.address, claimed,
                                                                  hello.nonce))
                            writer.write(encode_lpf(encode_frame(
                                KIND_HELLO_REPLY, HelloReply(self.key.address, challenge, sig).wire())))
                            await writer.drain()
                            continue
                        if kind != KIND_HELLO_PROOF:
                            raise MarlinWireError(f"frame kind {kind} before the hello proof", "no_hello")
                        signer = _recover(hello_signed_data(HELLO_DIALLER, claimed, self.key.address, challenge),
                                          parse_hello_proof(body), "hello proof")
                        if signer != claimed:
                            raise MarlinWireError(f"hello proof for 0x{claimed.hex()} does not sign this "
                                                  "connection's challenge (replayed or forged)", "bad_hello")
                        peer = claimed
                        continue
                    self.counters[("frames_in", "")] += 1
                    self.counters[("bytes_in", "")] += len(frame) + LPF_HEADER
                    try:
                        self.on_frame(peer, frame)
                    except MarlinWireError as exc:       # the core refused this frame: keep going
                        self._reject(peer, exc.reason, str(exc))
                    except Exception as exc:             # a bug: logged, connection kept
                        self.guard.bug(exc, "on_frame")
        except MarlinWireError as exc:                   # framing / hello: close this connection
            self._reject(peer, exc.reason, str(exc))
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            self._inbound.discard(task)
            self._writers.discard(writer)
            writer.close()

    # ------------------------------------------------------------------ outbound

    def send(self, peer: bytes, frame: bytes) -> bool:
        """Queue `frame` for `peer`. False (and counted, reported) when the peer's queue is
        full. Raises MarlinLocalError for a peer not in the directory."""
        box = self._outboxes.get(peer)
        if box is None:
            if peer not in self.directory:
                raise MarlinLocalError(f"no address for peer 0x{peer.hex()}")
            box = self._open(peer)
        if len(box.frames) >= self.queue_frames or box.nbytes + len(frame) > self.queue_bytes:
            self._drop(peer, "queue_full", 1)
            return False
        box.frames.append(frame)
        box.nbytes += len(frame)
        box.wake.set()
        return True

    def warm(self, peers: Iterable[bytes] | None = None) -> None:
        """Start dialling `peers` (default: every directory peer) before any frame is sent."""
        for peer in (self.directory if peers is None else peers):
            if peer not in self._outboxes:
                self._open(peer)

    def connected(self, peer: bytes) -> bool:
        box = self._outboxes.get(peer)
        return bool(box and box.connected)

    def queued(self, peer: bytes) -> int:
        """Frames waiting in `peer`'s send queue."""
        box = self._outboxes.get(peer)
        return len(box.frames) if box else 0

    def _drop(self, peer: bytes, reason: str, n: int) -> None:
        self.counters[("dropped", reason)] += n
        if self.on_drop is not None:
            try:
                self.on_drop(peer, reason, n)
            except Exception as exc:
                self.guard.bug(exc, "on_drop")

    def _open(self, peer: bytes) -> _Outbox:
        box = _Outbox(peer)
        self._outboxes[peer] = box
        if not self._closing:
            box.task = asyncio.get_running_loop().create_task(self._dial_loop(box))
        return box

    async def _dial_loop(self, box: _Outbox) -> None:
        host, port = self.directory[box.peer]
        backoff = self.backoff_min
        while not self._closing:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port),
                                                        self.connect_timeout)
            except (OSError, asyncio.TimeoutError):
                self.counters[("connect_failures", "")] += 1
                box.failures += 1
                await asyncio.sleep(backoff * random.uniform(0.75, 1.25))
                backoff = min(backoff * 2, self.backoff_max)
                continue
            delay_transport(writer.transport, host)     # test only: RELAY_SUITE_LINKS
            try:
                await dial_handshake(reader, writer, self.key, box.peer, timeout=self.hello_timeout,
                                     max_frame=self.max_frame)
            except (MarlinWireError, OSError) as exc:
                if isinstance(exc, MarlinWireError):     # the acceptor did not prove who it is
                    self._reject(box.peer, exc.reason, str(exc))
                else:
                    self.counters[("connect_failures", "")] += 1
                box.failures += 1
                writer.close()
                await asyncio.sleep(backoff * random.uniform(0.75, 1.25))
                backoff = min(backoff * 2, self.backoff_max)
                continue
            backoff = self.backoff_min
            box.connects += 1
            self.counters[("connects", "")] += 1
            self._writers.add(writer)
            box.connected = True
            watcher = asyncio.get_running_loop().create_task(self._watch_eof(reader, writer, box))
            inflight = 0
            try:
                while not self._closing:
                    if writer.is_closing():
                        raise ConnectionResetError("peer closed")
                    if not box.frames:
                        box.wake.clear()
                        await box.wake.wait()
                        continue
                    batch = []
                    size = 0
                    while box.frames and size < (1 << 20):
                        frame = box.frames.popleft()
                        box.nbytes -= len(frame)
                        batch.append(_LEN.pack(len(frame)))
                        batch.append(frame)
                        size += len(frame)
                    inflight = len(batch) // 2
                    writer.writelines(batch)
                    await writer.drain()
                    self.counters[("frames_out", "")] += inflight
                    self.counters[("bytes_out", "")] += size + LPF_HEADER * inflight
                    inflight = 0
            except (ConnectionError, OSError):
                if inflight:
                    self._drop(box.peer, "connection_lost", inflight)
            finally:
                box.connected = False
                watcher.cancel()
                self._writers.discard(writer)
                writer.close()
            if not self._closing:
                await asyncio.sleep(backoff * random.uniform(0.75, 1.25))
                backoff = min(backoff * 2, self.backoff_max)

    async def _watch_eof(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         box: _Outbox) -> None:
        """The acceptor writes nothing after its hello reply: EOF or an error here means the
        peer went away."""
        try:
            while await reader.read(4096):
                pass
        except (ConnectionError, OSError):
            pass
        writer.close()
        box.wake.set()   # wake the writer so it notices

    # ------------------------------------------------------------------ shutdown

    async def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` s until every send queue is empty. True when they are."""
        deadline = asyncio.get_running_loop().time() + timeout
        while any(b.frames for b in self._outboxes.values()):
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def close(self, grace: float = 0.0) -> None:
        """Stop accepting, flush queues up to `grace` s, then close every connection.
        Frames still queued are reported as dropped ("shutdown")."""
        if self._server is not None:
            self._server.close()
        if grace > 0:
            await self.flush(grace)
        self._closing = True
        tasks = [b.task for b in self._outboxes.values() if b.task] + list(self._inbound)
        for b in self._outboxes.values():
            if b.frames:
                self._drop(b.peer, "shutdown", len(b.frames))
                b.frames.clear()
            b.wake.set()
        for w in list(self._writers):
            w.close()
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            except asyncio.TimeoutError:
                pass
