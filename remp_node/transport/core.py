"""REMP datagram transport core: authenticated, fragmented, replay-protected. Sans-I/O.

No sockets and no clock in the protocol logic: the caller passes `now` (seconds, float;
`loop.time()` in daemons) and moves bytes (udp.py is the asyncio adapter). Addresses are
opaque hashable values (`(host, port)` for UDP; anything for in-memory tests).

Source of the requirements: DESIGN.md sections 2 and 4
(ever-node sends REMP as ADNL custom messages; ADNL splits anything over 1,024 B into
`adnl.message.part` pieces; catchain blocks are at most 16 KiB; a message BOC is at most
64 KiB). This is our own datagram format, not ADNL: the nodes of one network all run it.

Authentication (why per-peer keys, not a signature per datagram)
-----------------------------------------------------------------
Every node has an ed25519 NodeKey (keys.py); peers are known by their ed25519 public keys
(the network file). Each pair of nodes agrees ONE shared secret without any handshake:
both ed25519 keys are mapped to X25519 with libsodium's
`crypto_sign_ed25519_{pk,sk}_to_curve25519` (PyNaCl, the standard birational map, also what
ADNL does to encrypt to an ed25519 id) and X25519(my secret, peer public) gives the secret.
For each direction and each sender epoch (see Restarts) a 32-byte AES-256-GCM key is
HKDF-SHA256(secret, info = "remp-transport/1" | sender key id | receiver key id | epoch).
Each datagram is sealed with AES-GCM (cryptography) under that key; nonce = 4 zero bytes |
seq (8 bytes LE), unique because seq never repeats under one key; the clear header is the
AAD, so the sender key id, epoch and seq are authenticated too.
Cost per datagram, measured here (1,100-byte body): AES-GCM seal/open ~1-2 us, against
ed25519 sign ~32 us + verify ~94 us. At the issue's 300 messages/s x (2N + 3) client and
catchain datagrams + receipts, verify-per-datagram alone would cost ~1 CPU-second per
second across the network on a 2-core machine; AEAD costs ~1/60 of that. Key agreement
is once per peer (~0.1 ms) and HKDF once per (peer, epoch).
A forged datagram (wrong key, tampered byte, a datagram for another receiver) fails the
GCM tag and is dropped as "forged".

Restarts and replay
-------------------
`epoch` (u64) names one run of the sender; it must grow across restarts of a node
(default: microseconds since the Unix epoch at construction; the caller may pass its own,
e.g. a counter kept in the data directory). The receiver keeps, per peer, the highest
epoch seen on an authenticated datagram and a 1,024-sequence sliding window (bitmap) over
seq: a datagram of a lower epoch is "stale_epoch", a seq already seen or older than the
window is "replayed" (this also absorbs duplicates the network makes). A higher epoch
(the peer restarted) resets the window and drops the peer's unfinished reassemblies.

Datagram layout (all integers little-endian)
--------------------------------------------
    off size
      0    1  version = 1
      1    1  kind = 1 (sealed frame)
      2   32  sender key id (keys.key_id of its ed25519 public key)
     34    8  epoch
     42    8  seq (1, 2, ... per sender, receiver and epoch)
     50    n  AES-256-GCM(body) including the 16-byte tag (AAD = bytes 0..49)
    body:
      0    4  message number (u32, per sender, receiver and epoch)
      4    2  part index
      6    2  part count (1 for an unfragmented payload)
      8    4  total payload length (bytes)
     12    .  this part's bytes
Overhead: 78 bytes per datagram; with `part_size` 1,232 a part carries 1,154 payload bytes
(a 16 KiB catchain block = 15 datagrams, a 64 KiB message + 4 KiB = 61).

Bundles (kind = 2): several small payloads for one peer in ONE datagram (`send_many`), same
clear header (kind 2, authenticated as AAD) and sealing, body = one or more entries
    0    2  payload length n (u16, >= 1)
    2    n  payload
filling the body exactly. Each entry is one whole payload (one PayloadReceived, in order).
Why: a validator's step sends several payloads to one peer at once (votes, RMQ catchain
blocks, receipt batches, acks; ~1.5 small payloads per destination per step in
bench_remp_daemon at 100 msg/s), and each datagram costs a sendto system call, a seal, a
receive callback, an open and a replay-window update at both ends. A bundle that does not
parse is dropped whole as "malformed" (after authentication, so only a peer's bug).

Bounds (TransportLimits)
------------------------
max_payload per message, part_size per datagram (in and out), max_parts per message,
max_inflight_bytes_per_peer and max_inflight_messages_per_peer (reassembly buffers; a new
message over the bound is dropped, never someone else's data), reassembly_timeout (an
unfinished message is discarded and counted "reassembly_timeout"), a token bucket per
authenticated peer (rate, burst) and one per source address before any crypto (so a flood
from one address costs no AEAD work and does not touch other peers' budgets).

Drop reasons (counters["dropped_<reason>"], DatagramDropped.reason): see DROP_REASONS.

Errors: remote input never raises (it is counted, and becomes a DatagramDropped event);
local misuse (unknown destination, payload over max_payload, a key id that does not match
its public key) raises TransportError, which is not a ValueError.
"""
from __future__ import annotations

import struct
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Mapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from nacl import bindings as sodium

from ..errors import RempLocalError
from ..wire.keys import NodeKey, key_id as key_id_of

__all__ = ["TransportLimits", "TransportCore", "TransportError", "TransportEvent",
           "PayloadReceived", "DatagramDropped", "DROP_REASONS", "HEADER_SIZE", "OVERHEAD",
           "BUNDLE_OVERHEAD", "parse_header"]

VERSION = 1
KIND_FRAME = 1
KIND_BUNDLE = 2
_ENTRY = struct.Struct("<H")
_HEADER = struct.Struct("<BB32sQQ")
HEADER_SIZE = _HEADER.size          # 50
TAG_SIZE = 16
_PART = struct.Struct("<IHHI")
PART_HEADER_SIZE = _PART.size       # 12
#: bytes of a datagram that are not payload
OVERHEAD = HEADER_SIZE + TAG_SIZE + PART_HEADER_SIZE   # 78
#: bytes of a bundle datagram that are not payload, besides 2 per entry
BUNDLE_OVERHEAD = HEADER_SIZE + TAG_SIZE               # 66
#: largest datagram the issue allows (bytes, header included)
MAX_PART_SIZE = 1232
REPLAY_WINDOW = 1024
_INFO = b"remp-transport/1"

#: Why an incoming datagram (or a reassembly) was dropped:
#: garbage: shorter than a header (a frame's or a bundle's), unknown version/kind; oversized: datagram over
#: part_size, or a part announcing a payload over max_payload; unknown_peer: sender key id
#: not among the peers; rate_limited: over the per-address or per-peer token bucket;
#: stale_epoch: an epoch older than the peer's current one; forged: the AES-GCM tag does not
#: verify (wrong key, tampered, meant for another node); replayed: seq already seen or older
#: than the replay window (also network duplicates); malformed: authenticated but
#: inconsistent part header (count 0, index >= count, a part that disagrees with earlier
#: parts, lengths that do not add up); too_many_parts: part count over max_parts;
#: inflight_limit: reassembly bytes or messages per peer over the bound; reassembly_timeout:
#: a fragmented payload not completed within reassembly_timeout (one per message).
DROP_REASONS = ("garbage", "oversized", "unknown_peer", "rate_limited", "stale_epoch", "forged",
                "replayed", "malformed", "too_many_parts", "inflight_limit", "reassembly_timeout")


class TransportError(RempLocalError):
    """Local misuse of TransportCore (not a remote error; not a ValueError)."""


@dataclass(frozen=True)
class TransportLimits:
    """Bounds of one TransportCore (bytes, seconds, datagrams per second).

    max_payload: largest payload `send` accepts and a receiver reassembles (65,535 + 4,096:
        a maximal message BOC plus TL framing). part_size: largest datagram sent or accepted,
        header included (<= 1,232, the issue's bound). max_parts: parts per payload (default
        64 >= ceil(max_payload / (part_size - 78))). max_inflight_bytes_per_peer /
        max_inflight_messages_per_peer: unfinished reassemblies per peer (announced total
        bytes / count). reassembly_timeout: seconds a fragmented payload may take.
        rate_per_peer / burst_per_peer: token bucket per authenticated peer (datagrams/s,
        datagrams). rate_per_address / burst_per_address: token bucket per source address,
        checked before any crypto. max_addresses: source-address buckets remembered (LRU).
        max_pending_drop_events: DatagramDropped events queued at most (the counters always
        count; a garbage flood cannot grow memory)."""

    max_payload: int = 65535 + 4096
    part_size: int = MAX_PART_SIZE
    max_parts: int = 64
    max_inflight_bytes_per_peer: int = 1 << 20
    max_inflight_messages_per_peer: int = 64
    reassembly_timeout: float = 5.0
    rate_per_peer: float = 20000.0
    burst_per_peer: float = 4000.0
    rate_per_address: float = 20000.0
    burst_per_address: float = 4000.0
    max_addresses: int = 4096
    max_pending_drop_events: int = 1024

    def __post_init__(self):
        if not OVERHEAD < self.part_size <= MAX_PART_SIZE:
            raise TransportError(f"part_size must be in ({OVERHEAD}, {MAX_PART_SIZE}]")
        if self.max_payload <= 0 or self.max_parts <= 0 or self.max_parts > 0xFFFF:
            raise TransportError("max_payload and max_parts must be positive (max_parts <= 65535)")
        if self.max_payload > self.max_parts * self.chunk_size:
            raise TransportError(f"max_payload {self.max_payload} needs more than max_parts "
                                 f"{self.max_parts} parts of {self.chunk_size} bytes")

    @property
    def chunk_size(self) -> int:
        """Payload bytes per datagram (part_size - 78)."""
        return self.part_size - OVERHEAD


class TransportEvent:
    """Base class of the events TransportCore.next_event() returns."""


@dataclass(frozen=True)
class PayloadReceived(TransportEvent):
    """A whole payload arrived, authenticated and reassembled.

    src: the sender's 32-byte key id; payload: the bytes it passed to `send`."""

    src: bytes
    payload: bytes


@dataclass(frozen=True)
class DatagramDropped(TransportEvent):
    """An incoming datagram (or an unfinished reassembly) was dropped.

    reason: one of DROP_REASONS; addr: the source address (None for reassembly_timeout);
    size: bytes of the datagram (for reassembly_timeout: payload bytes received so far);
    src: the claimed sender key id when the header parsed (None otherwise)."""

    reason: str
    addr: object
    size: int
    src: bytes | None = None


def parse_header(data: bytes) -> tuple[int, int, bytes, int, int]:
    """(version, kind, sender key id, epoch, seq) of a datagram; ValueError if too short."""
    if len(data) < HEADER_SIZE + TAG_SIZE:
        raise ValueError(f"datagram of {len(data)} bytes is shorter than {HEADER_SIZE + TAG_SIZE}")
    return _HEADER.unpack_from(data)


class _Bucket:
    __slots__ = ("tokens", "at")

    def __init__(self, burst: float, now: float):
        self.tokens = burst
        self.at = now

    def take(self, rate: float, burst: float, now: float) -> bool:
        if now > self.at:
            self.tokens = min(burst, self.tokens + (now - self.at) * rate)
            self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass
class _Partial:
    count: int
    total: int
    deadline: float
    parts: dict = field(default_factory=dict)   # index -> bytes
    received: int = 0


class _Peer:
    """What the core knows about one peer."""

    def __init__(self, kid: bytes, public_key: bytes, addr: Hashable):
        self.kid = kid
        self.public_key = public_key
        self.addr = addr
        self.secret: bytes | None = None
        self.send_aead: AESGCM | None = None
        self.send_seq = 0
        self.send_msg = 0
        self.recv_epoch = -1
        self.recv_aead: AESGCM | None = None
        self.max_seq = 0
        self.window = 0            # bit i set: seq max_seq - i seen
        self.bucket: _Bucket | None = None
        self.partials: dict[int, _Partial] = {}
        self.inflight = 0


class TransportCore:
    """One node's end of the REMP datagram transport (see the module doc).

    key: this node's NodeKey. peers: {ed25519 public key (32 bytes): address}, the nodes it
    talks to (more with add_peer). limits: TransportLimits. epoch: see module doc (must grow
    across restarts; default microseconds since the Unix epoch, read once here).

    Use: send(dst key id, payload, now) or send_many(dst, [payload, ...], now) (small ones
    share bundle datagrams); receive_datagram(data, addr, now); then
    datagrams_to_send(now) -> [(datagram, addr)], next_event() until None, and call
    handle_timer(now) at get_timer(). `counters` (dict[str, int]): sent_datagrams,
    sent_bytes, sent_payloads, received_datagrams, received_bytes, received_payloads and
    dropped_<reason> for every reason in DROP_REASONS.
    """

    def __init__(self, key: NodeKey, peers: Mapping[bytes, Hashable] | Iterable = (), *,
                 limits: TransportLimits = TransportLimits(), epoch: int | None = None):
        self.key = key
        self.key_id = key.key_id
        self.limits = limits
        self.epoch = int(time.time_ns() // 1000 if epoch is None else epoch)
        if not 0 <= self.epoch < (1 << 64):
            raise TransportError("epoch must fit in 64 bits")
        sk64 = key.seed() + key.public
        self._curve_sk = sodium.crypto_sign_ed25519_sk_to_curve25519(sk64)
        self._peers: dict[bytes, _Peer] = {}
        self._addr_buckets: OrderedDict = OrderedDict()
        self._out: list[tuple[bytes, Hashable]] = []
        self._events: deque[TransportEvent] = deque()
        self._drop_events = 0
        self._expiry: deque[tuple[float, bytes, int, int]] = deque()   # (deadline, peer, epoch, msg)
        self.counters: dict[str, int] = {k: 0 for k in (
            "sent_datagrams", "sent_bytes", "sent_payloads", "received_datagrams", "received_bytes",
            "received_payloads")}
        for r in DROP_REASONS:
            self.counters["dropped_" + r] = 0
        items = peers.items() if isinstance(peers, Mapping) else peers
        for pk, addr in items:
            self.add_peer(key_id_of(pk), pk, addr)

    # -- peers -----------------------------------------------------------------------------
    def add_peer(self, key_id: bytes, public_key: bytes, addr: Hashable) -> None:
        """Add or update a peer: key_id must be keys.key_id(public_key) (32-byte ed25519
        public key); addr: where its datagrams go. Re-adding with the same key only
        updates the address. Raises TransportError on a mismatch or a bad key."""
        public_key = bytes(public_key)
        if len(public_key) != 32 or key_id_of(public_key) != bytes(key_id):
            raise TransportError("key_id does not match the 32-byte public key")
        p = self._peers.get(key_id)
        if p is not None and p.public_key == public_key:
            p.addr = addr
            return
        self._peers[bytes(key_id)] = _Peer(bytes(key_id), public_key, addr)

    def peer_address(self, key_id: bytes) -> Hashable | None:
        p = self._peers.get(key_id)
        return None if p is None else p.addr

    def peers(self) -> list[bytes]:
        """Key ids of the known peers."""
        return list(self._peers)

    def _secret(self, p: _Peer) -> bytes:
        if p.secret is None:
            try:
                curve_pk = sodium.crypto_sign_ed25519_pk_to_curve25519(p.public_key)
                p.secret = sodium.crypto_scalarmult(self._curve_sk, curve_pk)
            except Exception as exc:  # libsodium refuses a low-order / invalid point
                raise TransportError(f"no key agreement with peer {p.kid.hex()[:8]}: {exc}") from None
        return p.secret

    def _aead(self, p: _Peer, sender: bytes, receiver: bytes, epoch: int) -> AESGCM:
        k = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                 info=_INFO + sender + receiver + epoch.to_bytes(8, "little")).derive(self._secret(p))
        return AESGCM(k)

    # -- sending ---------------------------------------------------------------------------
    def send(self, dst: bytes, payload: bytes, now: float) -> None:
        """Queue `payload` (bytes, <= limits.max_payload) for peer `dst` (key id) as one or
        more datagrams of at most limits.part_size bytes. Raises TransportError for an
        unknown dst or an oversized payload (local misuse)."""
        p = self._peers.get(dst)
        if p is None:
            raise TransportError(f"unknown destination {bytes(dst).hex()[:16]}")
        payload = bytes(payload)
        n = len(payload)
        lim = self.limits
        if n > lim.max_payload:
            raise TransportError(f"payload of {n} bytes exceeds max_payload {lim.max_payload}")
        chunk = lim.chunk_size
        count = max(1, -(-n // chunk))
        p.send_msg = (p.send_msg + 1) & 0xFFFFFFFF
        for i in range(count):
            self._seal(p, KIND_FRAME, _PART.pack(p.send_msg, i, count, n) + payload[i * chunk:(i + 1) * chunk])
        self.counters["sent_payloads"] += 1

    def _seal(self, p: _Peer, kind: int, body: bytes) -> None:
        """Queue one datagram of `kind` to peer p: the clear header (the next send seq, also
        the AES-GCM nonce) authenticated as AAD, then `body` sealed (module doc)."""
        if p.send_aead is None:
            p.send_aead = self._aead(p, self.key_id, p.kid, self.epoch)
        p.send_seq += 1
        head = _HEADER.pack(VERSION, kind, self.key_id, self.epoch, p.send_seq)
        dg = head + p.send_aead.encrypt(b"\x00\x00\x00\x00" + p.send_seq.to_bytes(8, "little"), body, head)
        self._out.append((dg, p.addr))
        c = self.counters
        c["sent_datagrams"] += 1
        c["sent_bytes"] += len(dg)

    def send_many(self, dst: bytes, payloads: Iterable[bytes], now: float) -> None:
        """Queue several payloads for peer `dst`, in order: consecutive ones that fit one
        datagram together (2 bytes of length each, within limits.part_size) go as one bundle
        (module doc); a payload too big for a bundle goes as `send` sends it, at its place in
        the order. Same errors as `send`; nothing is queued when one payload is refused."""
        p = self._peers.get(dst)
        if p is None:
            raise TransportError(f"unknown destination {bytes(dst).hex()[:16]}")
        items = [bytes(x) for x in payloads]
        lim = self.limits
        for x in items:
            if len(x) > lim.max_payload:
                raise TransportError(f"payload of {len(x)} bytes exceeds max_payload {lim.max_payload}")
        room = lim.part_size - BUNDLE_OVERHEAD
        group: list[bytes] = []
        size = 0
        for x in items:
            need = 2 + len(x)
            if x and need <= room:          # part_size <= MAX_PART_SIZE: the u16 length fits
                if size + need > room:
                    self._send_group(p, group, now)
                    group, size = [], 0
                group.append(x)
                size += need
                continue
            self._send_group(p, group, now)
            group, size = [], 0
            self.send(dst, x, now)
        self._send_group(p, group, now)

    def _send_group(self, p: _Peer, group: list[bytes], now: float) -> None:
        if not group:
            return
        if len(group) == 1:
            self.send(p.kid, group[0], now)
            return
        self._seal(p, KIND_BUNDLE, b"".join(_ENTRY.pack(len(x)) + x for x in group))
        self.counters["sent_payloads"] += len(group)

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Hashable]]:
        """Drain the outbox: [(datagram bytes, address)] in send order."""
        out, self._out = self._out, []
        return out

    # -- receiving -------------------------------------------------------------------------
    def _drop(self, reason: str, addr, size: int, src: bytes | None = None) -> None:
        self.counters["dropped_" + reason] += 1
        if self._drop_events < self.limits.max_pending_drop_events:
            self._drop_events += 1
            self._events.append(DatagramDropped(reason, addr, size, src))

    def _addr_ok(self, addr, now: float) -> bool:
        lim = self.limits
        b = self._addr_buckets.get(addr)
        if b is None:
            b = self._addr_buckets[addr] = _Bucket(lim.burst_per_address, now)
            if len(self._addr_buckets) > lim.max_addresses:
                self._addr_buckets.popitem(last=False)
        else:
            self._addr_buckets.move_to_end(addr)
        return b.take(lim.rate_per_address, lim.burst_per_address, now)

    def receive_datagram(self, data: bytes, addr: Hashable, now: float) -> None:
        """Feed one datagram from `addr`. Never raises for remote input: a bad datagram is
        counted (counters["dropped_<reason>"]) and queued as a DatagramDropped event; a
        completed payload becomes a PayloadReceived event."""
        size = len(data)
        self.counters["received_datagrams"] += 1
        self.counters["received_bytes"] += size
        lim = self.limits
        if size > lim.part_size:
            self._drop("oversized", addr, size)
            return
        if not self._addr_ok(addr, now):
            self._drop("rate_limited", addr, size)
            return
        if size < HEADER_SIZE + TAG_SIZE + 6:       # a bundle holds >= 2 entries of >= 3 bytes
            self._drop("garbage", addr, size)
            return
        version, kind, src, epoch, seq = _HEADER.unpack_from(data)
        if version != VERSION or seq == 0 or not (
                kind == KIND_BUNDLE or (kind == KIND_FRAME and size >= HEADER_SIZE + TAG_SIZE + PART_HEADER_SIZE)):
            self._drop("garbage", addr, size)
            return
        p = self._peers.get(src)
        if p is None:
            self._drop("unknown_peer", addr, size, src)
            return
        if epoch < p.recv_epoch:
            self._drop("stale_epoch", addr, size, src)
            return
        if epoch == p.recv_epoch:
            aead = p.recv_aead
        else:
            try:
                aead = self._aead(p, src, self.key_id, epoch)
            except TransportError:
                self._drop("forged", addr, size, src)
                return
        head = bytes(data[:HEADER_SIZE])
        try:
            body = aead.decrypt(b"\x00\x00\x00\x00" + seq.to_bytes(8, "little"), bytes(data[HEADER_SIZE:]), head)
        except InvalidTag:
            self._drop("forged", addr, size, src)
            return
        # authenticated first, so a forgery is never mistaken for a replay (AEAD: ~1 us)
        if epoch == p.recv_epoch and (seq + REPLAY_WINDOW <= p.max_seq or (
                seq <= p.max_seq and (p.window >> (p.max_seq - seq)) & 1)):
            self._drop("replayed", addr, size, src)
            return
        if p.bucket is None:
            p.bucket = _Bucket(lim.burst_per_peer, now)
        if not p.bucket.take(lim.rate_per_peer, lim.burst_per_peer, now):
            self._drop("rate_limited", addr, size, src)
            return
        # authenticated: new epoch (peer restarted) resets the window and its reassemblies
        if epoch > p.recv_epoch:
            p.recv_epoch, p.recv_aead = epoch, aead
            p.max_seq, p.window = 0, 0
            p.partials.clear()
            p.inflight = 0
        if seq > p.max_seq:
            shift = seq - p.max_seq
            p.window = ((p.window << shift) | 1) & ((1 << REPLAY_WINDOW) - 1) if shift < REPLAY_WINDOW else 1
            p.max_seq = seq
        else:
            p.window |= 1 << (p.max_seq - seq)
        if kind == KIND_BUNDLE:
            self._on_bundle(p, body, addr, size)
        else:
            self._on_part(p, body, addr, size, now)

    def _on_bundle(self, p: _Peer, body: bytes, addr, size: int) -> None:
        out = []
        off, end = 0, len(body)
        while off < end:
            if off + 2 > end:
                break
            (n,) = _ENTRY.unpack_from(body, off)
            off += 2
            if n == 0 or off + n > end:
                break
            out.append(body[off:off + n])
            off += n
        if off != end or not out:
            self._drop("malformed", addr, size, p.kid)
            return
        self.counters["received_payloads"] += len(out)
        kid = p.kid
        self._events.extend(PayloadReceived(kid, x) for x in out)

    def _on_part(self, p: _Peer, body: bytes, addr, size: int, now: float) -> None:
        lim = self.limits
        if len(body) < PART_HEADER_SIZE:
            self._drop("malformed", addr, size, p.kid)
            return
        msg, index, count, total = _PART.unpack_from(body)
        chunk = body[PART_HEADER_SIZE:]
        if count == 0 or index >= count:
            self._drop("malformed", addr, size, p.kid)
            return
        if total > lim.max_payload:
            self._drop("oversized", addr, size, p.kid)
            return
        if count > lim.max_parts:
            self._drop("too_many_parts", addr, size, p.kid)
            return
        if count == 1:
            if len(chunk) != total:
                self._drop("malformed", addr, size, p.kid)
                return
            self.counters["received_payloads"] += 1
            self._events.append(PayloadReceived(p.kid, chunk))
            return
        part = p.partials.get(msg)
        if part is None:
            if total > count * lim.chunk_size or total < count - 1:
                self._drop("malformed", addr, size, p.kid)
                return
            if (len(p.partials) >= lim.max_inflight_messages_per_peer
                    or p.inflight + total > lim.max_inflight_bytes_per_peer):
                self._drop("inflight_limit", addr, size, p.kid)
                return
            part = p.partials[msg] = _Partial(count, total, now + lim.reassembly_timeout)
            p.inflight += total
            self._expiry.append((part.deadline, p.kid, p.recv_epoch, msg))
        elif part.count != count or part.total != total:
            self._drop("malformed", addr, size, p.kid)
            return
        if index in part.parts:       # same part under a new seq: a sender bug, not a replay
            self._drop("malformed", addr, size, p.kid)
            return
        if part.received + len(chunk) > part.total:
            self._drop("malformed", addr, size, p.kid)
            return
        part.parts[index] = chunk
        part.received += len(chunk)
        if len(part.parts) == part.count:
            del p.partials[msg]
            p.inflight -= part.total
            payload = b"".join(part.parts[i] for i in range(part.count))
            if len(payload) != part.total:
                self._drop("malformed", addr, size, p.kid)
                return
            self.counters["received_payloads"] += 1
            self._events.append(PayloadReceived(p.kid, payload))

    # -- timers and events -----------------------------------------------------------------
    def get_timer(self) -> float | None:
        """Earliest reassembly deadline (seconds, caller's clock), or None."""
        while self._expiry:
            deadline, kid, epoch, msg = self._expiry[0]
            p = self._peers.get(kid)
            if p is None or p.recv_epoch != epoch or msg not in p.partials \
                    or p.partials[msg].deadline != deadline:
                self._expiry.popleft()      # finished or reset meanwhile
                continue
            return deadline
        return None

    def handle_timer(self, now: float) -> None:
        """Discard reassemblies whose deadline passed (one "reassembly_timeout" each)."""
        while self._expiry and self._expiry[0][0] <= now:
            deadline, kid, epoch, msg = self._expiry.popleft()
            p = self._peers.get(kid)
            if p is None or p.recv_epoch != epoch:
                continue
            part = p.partials.get(msg)
            if part is None or part.deadline != deadline:
                continue
            del p.partials[msg]
            p.inflight -= part.total
            self._drop("reassembly_timeout", None, part.received, kid)

    def next_event(self) -> TransportEvent | None:
        """The next PayloadReceived / DatagramDropped, or None."""
        if not self._events:
            return None
        ev = self._events.popleft()
        if isinstance(ev, DatagramDropped):
            self._drop_events -= 1
        return ev

    def inflight(self, key_id: bytes) -> tuple[int, int]:
        """(unfinished reassemblies, their announced bytes) from peer key_id."""
        p = self._peers.get(key_id)
        return (0, 0) if p is None else (len(p.partials), p.inflight)
