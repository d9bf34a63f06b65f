"""Catchain: the causally ordered, signed block DAG under each REMP reliable message queue.

Protocol core only (DESIGN.md section 2): no I/O, no clock; `now` is float seconds.
One `Catchain` per shard session (DESIGN.md section 4, Catchain paragraph; seed:
remp-overview.md "Reliable Message Queue Implementation Details"). Reference read, not
copied: ton-blockchain/ton `catchain/catchain-receiver.cpp`, `catchain-received-block.cpp`,
`catchain-receiver-source.cpp`; TL from `tl/generate/scheme/ton_api.tl`.

Block model (ton_api.tl `catchain.block`, `catchain.block.dep`, `catchain.block.data`):

- A block is (incarnation = session id, src = member index, height >= 1, prev = dep of the
  source's block at height-1 (height 1: the root dep `src=len(members) height=0
  data_hash=incarnation signature=""`), deps = deps of the latest delivered blocks of other
  sources, payload, signature).
- payload = boxed `catchain.block.data.vector msgs:(vector bytes)`; msgs are the records
  given to `submit` (TON puts session data in the same way).
- data_hash = sha256(sha256(payload) || sha256(boxed catchain.block.data prev deps)) -- TON's
  `block_hash_covers_data` variant, so the hash binds payload, prev and deps.
- block hash = sha256(boxed `catchain.block.id incarnation:int256 src:int256 height:int
  data_hash:int256`) where src is the source's key id (keys.key_id of its ed25519 key).
- signature = ed25519 by the source over the serialized boxed `catchain.block.id` (36 + 72
  bytes), exactly as TON signs (`sign_message(id_s)`); not over the hash.

Wire (every datagram is one boxed TL object; ids = CRC32 of the real ton_api.tl line with
the `(vector x)` parentheses dropped, as TON's TL compiler does; checked in the tests):

- `catchain.blockUpdate block:catchain.block` + payload (the rest of the datagram, as TON's
  `serialize_tl_object(update, true, payload)`): a new block, broadcast to all members.
- `catchain.getDifference rt:(vector int)`: "my delivered height per source, -1 = blamed".
  The answer is up to `max_difference_blocks` blockUpdate datagrams (spread fairly over
  sources, lowest heights first) followed by `catchain.difference sent_upto`, or
  `catchain.differenceFork left right` if the asker still trusts a source we blamed.
- `catchain.getBlock block:int256` -> `catchain.blockResult block` + payload, or
  `catchain.blockNotFound`.
TON runs getDifference/getBlock as ADNL queries; here they are plain datagrams and the
answers are datagrams back to the asker (no query ids; an answer is useful whenever it
arrives). The network layer demultiplexes sessions; blocks carry the incarnation anyway.

Delivery: a block is delivered (BlockDelivered event) only after its prev and all deps are
delivered, so every node delivers in an order consistent with causality; own blocks are
delivered when created. Missing blocks are pulled: every ~`sync_interval` a getDifference
goes to a random non-blamed member, and getBlock(hash) for up to `max_get_block` referenced
but unknown blocks (first to the member that sent the referencing block, then random).

Forks (TON `CatChainReceiverSource::on_new_block`): two validly signed blocks (or signed
deps) with one (src, height) and different hashes. The first detection emits ForkDetected
once with proof = boxed `catchain.block.data.fork left:catchain.block.Dep
right:catchain.block.Dep`, blames the source, and broadcasts `catchain.differenceFork` to
every member (who verify both signatures before blaming). Choice, as TON does
(`receive_block`: a blamed source's block is dropped unless another block depends on it):
after the blame, the source's blocks are ignored ("blamed_source") unless a pending block
already depends on them; such needed blocks are verified and delivered *silently* (no
BlockDelivered, payload discarded) so honest blocks that referenced either fork branch
before the blame still get delivered. Blocks of the blamed source delivered before the
blame stay delivered (different members may have delivered different branches -- the fork
proof is what the application acts on). Honest nodes never reference a blamed source in new
deps. Unlike TON we do not blame honest sources for deps mixing fork branches.

Limits: datagrams > `max_datagram` and payloads > `max_payload` are dropped; unsolicited
blocks more than `max_height_gap` above the source's delivered height are dropped
("height_gap"; getDifference fills in order); at most `max_pending_blocks` undelivered
blocks are held (needed ones up to 2x). Memory: delivered blocks of a source are pruned
once every member is known (from its getDifference rt or the deps of its blocks) to have
delivered them and they are `prune_window` below that point, and in any case when more
than `max_blocks_per_source` delivered blocks of that source are stored (a member lagging
further than that cannot catch up from us -- TON would read its DB). getDifference is
answered at most once per peer per sync_interval/2 ("rate_limited"): one small request
can trigger max_difference_blocks datagrams (TON bounds this with allow_send_block).
State is in memory only: a member restarted with the same key and no state would sign a
new height 1 and be blamed for a fork. So a daemon stores `authored` (the session id) before
an own block leaves, and after a restart calls `mute()` on that session: it follows the
session without signing and signs again in the next one.

Errors: bad remote input never raises out of `receive_datagram`; it is dropped, counted in
`rejected[reason]` and reported as a RejectedDatagram event. Parsers raise
CatchainRemoteError (a ValueError) with `.reason`; API misuse raises CatchainUsageError.
Reasons: non_member, from_self, rate_limited, oversize, oversize_payload, malformed, unknown_constructor,
bad_incarnation, bad_src, bad_height, bad_prev, bad_deps, empty_payload, bad_signature,
bad_dep_signature, unknown_self_block, height_gap, blamed_source, pending_full,
bad_difference_query, bad_fork_proof.
"""
from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass

from ..wire.keys import NodeKey, key_id, verify
from ..wire.catchain_tl import (  # noqa: F401  (the core's names stay importable from here)
    BLOCK, BLOCK_DATA, block_data_hash, BLOCK_DEP, block_hash, BLOCK_ID, block_id_bytes,
    BLOCK_NOT_FOUND, BLOCK_RESULT, BLOCK_UPDATE, CatchainRemoteError, CatchainUsageError,
    _check_dep_shape, check_fork, DATA_FORK, DATA_VECTOR, Dep, _DEP_WIRE_MAX, DIFFERENCE,
    DIFFERENCE_FORK, GET_BLOCK, GET_DIFFERENCE, pack_fork_proof, pack_records, parse_block_body,
    parse_datagram, _read_dep, root_dep, root_hash, sign_block, SIGNATURE_SIZE, _tl_id,
    unpack_records, verify_fork_proof, WireBlock, pack_block_not_found, pack_block_result, pack_block_update,
    pack_difference, pack_difference_fork, pack_get_block, pack_get_difference, read_fork_proof, record_size)


# --- events ------------------------------------------------------------------------------

class CatchainEvent:
    """Base class of catchain events (next_event())."""


@dataclass(frozen=True)
class BlockDelivered(CatchainEvent):
    """A block delivered in causal order (exactly once per block; own blocks too).

    source: key id (32 bytes) of the block's author; source_index: its member index;
    height: 1-based height in the author's chain; payload: the raw block payload (boxed
    catchain.block.data.vector); block_hash: 32 bytes; records: the payloads the author
    passed to submit(), in order (empty if the payload is not a data.vector)."""

    source: bytes
    height: int
    payload: bytes
    block_hash: bytes
    source_index: int
    records: tuple[bytes, ...]


@dataclass(frozen=True)
class ForkDetected(CatchainEvent):
    """A member signed two blocks at one height; emitted once per source. proof: boxed
    catchain.block.data.fork (check with verify_fork_proof). The source is blamed."""

    source: bytes
    source_index: int
    proof: bytes


@dataclass(frozen=True)
class RejectedDatagram(CatchainEvent):
    """A datagram was dropped. peer: sender key id; reason: rejected[] key; detail: text."""

    peer: bytes
    reason: str
    detail: str


# --- the core ------------------------------------------------------------------------------

_REF, _PENDING, _DELIVERED = 0, 1, 2


class _Rec:
    """One known block: REF (only a signed dep seen), PENDING (full block, waiting for
    prerequisites) or DELIVERED."""

    __slots__ = ("hash", "dep", "state", "block", "body", "prereqs", "missing", "sender", "asked_at", "asks")

    def __init__(self, h: bytes, dep: Dep, state: int):
        self.hash = h
        self.dep = dep
        self.state = state
        self.block: WireBlock | None = None
        self.body: bytes | None = None
        self.prereqs: tuple[bytes, ...] = ()
        self.missing = 0
        self.sender: bytes | None = None
        self.asked_at = -1e300
        self.asks = 0


class _Source:
    __slots__ = ("index", "public", "key_id", "delivered_height", "delivered_hash", "by_height", "blamed",
                 "fork_proof", "floor", "last_dep_height")

    def __init__(self, index: int, public: bytes, root: bytes):
        self.index = index
        self.public = public
        self.key_id = key_id(public)
        self.delivered_height = 0
        self.delivered_hash = root
        self.by_height: dict[int, list[bytes]] = {}
        self.blamed = False
        self.fork_proof: bytes | None = None
        self.floor = 1                    # heights below are pruned
        self.last_dep_height = 0          # highest height of this source our own blocks referenced


class Catchain:
    """One member's catchain for one session.

    session_id: 32 bytes (the incarnation); members: ed25519 public keys (32 bytes each),
    list order = source index; local: this member's NodeKey (must be a member).
    block_interval (s): at most one own block per interval, produced while records are
    pending (reference: a new catchain block every 100 ms). sync_interval (s): mean period
    of getDifference/getBlock pulls. max_payload (bytes) per block payload.
    max_blocks_per_source: hard cap of stored delivered blocks per source.
    Raises CatchainUsageError on bad arguments."""

    def __init__(self, session_id: bytes, members: list[bytes], local: NodeKey, *,
                 block_interval: float = 0.1, sync_interval: float = 0.5, max_payload: int = 1 << 20,
                 max_blocks_per_source: int = 1024, prune_window: int = 32, max_height_gap: int = 256,
                 max_pending_blocks: int = 4096, max_deps: int | None = None,
                 max_difference_blocks: int = 100, max_get_block: int = 16,
                 max_submit_bytes: int | None = None, rng: random.Random | None = None):
        if len(session_id) != 32:
            raise CatchainUsageError("session_id must be 32 bytes")
        members = [bytes(m) for m in members]
        if not members or any(len(m) != 32 for m in members) or len(set(members)) != len(members):
            raise CatchainUsageError("members must be distinct 32-byte ed25519 public keys")
        if local.public not in members:
            raise CatchainUsageError("local key is not a member")
        if max_blocks_per_source < 2 or prune_window < 1 or max_height_gap < 1 or max_pending_blocks < 1:
            raise CatchainUsageError("limits must be positive (max_blocks_per_source >= 2)")
        if block_interval <= 0 or sync_interval <= 0 or max_payload < 64:
            raise CatchainUsageError("block_interval, sync_interval > 0 and max_payload >= 64 required")
        self.session_id = bytes(session_id)
        self.members = members
        self.n = len(members)
        self.local = local
        self.local_index = members.index(local.public)
        self.block_interval = block_interval
        self.sync_interval = sync_interval
        self.max_payload = max_payload
        self.max_blocks_per_source = max_blocks_per_source
        self.prune_window = prune_window
        self.max_height_gap = max_height_gap
        self.max_pending_blocks = max_pending_blocks
        self.max_deps = max(1, min(self.n - 1, 32 if max_deps is None else max_deps))
        self.max_difference_blocks = max_difference_blocks
        self.max_get_block = max_get_block
        self.max_submit_bytes = max_submit_bytes if max_submit_bytes is not None else 16 * max_payload
        self.max_datagram = 4 + 32 + 8 + _DEP_WIRE_MAX * self.n + 4 + 68 + max_payload
        self._rng = rng or random.Random(int.from_bytes(local.key_id[:8], "little")
                                         ^ int.from_bytes(session_id[:8], "little"))
        self._root = root_hash(self.session_id)
        self._root_dep = root_dep(self.session_id, self.n)
        self._sources = [_Source(i, m, self._root) for i, m in enumerate(members)]
        self._by_key_id = {s.key_id: s.index for s in self._sources}
        self._blocks: dict[bytes, _Rec] = {}
        self._waiters: dict[bytes, list[bytes]] = {}
        self._refs: dict[bytes, None] = {}          # REF hashes that pending blocks wait for
        self._pending = 0
        self._peer_delivered = [[0] * self.n for _ in range(self.n)]
        self._last_answer = [-1e300] * self.n
        self._records: deque[bytes] = deque()
        self._records_bytes = 0
        self._next_block_at: float | None = None
        self._last_block_at = -1e300
        self._next_sync: float | None = None
        self._out: list[tuple[bytes, bytes]] = []
        self._events: deque[CatchainEvent] = deque()
        self._queued_rejections = 0
        self.stats: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.max_pending_seen = 0
        self.max_stored_seen = 0
        #: True: this member never signs a block of this session (see mute())
        self.muted = False

    # --- public API ---------------------------------------------------------------------

    @property
    def local_id(self) -> bytes:
        return self.local.key_id

    def member_ids(self) -> list[bytes]:
        """Key ids of the members, in source index order."""
        return [s.key_id for s in self._sources]

    @property
    def delivered_heights(self) -> list[int]:
        """Delivered height per source (frozen for a blamed source)."""
        return [s.delivered_height for s in self._sources]

    @property
    def blamed(self) -> set[bytes]:
        """Key ids of blamed (forking) sources."""
        return {s.key_id for s in self._sources if s.blamed}

    @property
    def stored_blocks(self) -> int:
        """Blocks held in memory (delivered + pending + referenced-only)."""
        return len(self._blocks)

    @property
    def pending_blocks(self) -> int:
        return self._pending

    def memory(self) -> dict[str, int]:
        """Sizes of every per-session buffer (for /metrics and bound checks)."""
        return {"stored_blocks": len(self._blocks), "pending_blocks": self._pending, "wanted_blocks": len(self._refs),
                "waiter_lists": len(self._waiters), "submit_queue": len(self._records),
                "submit_bytes": self._records_bytes, "outbox": len(self._out), "events": len(self._events),
                "index_heights": sum(len(s.by_height) for s in self._sources)}

    @property
    def authored(self) -> bool:
        """True once this member signed a block of this session (a daemon stores the fact
        before the block leaves, so a restart does not sign another height 1: a fork)."""
        return self.stats["blocks_created"] > 0

    def mute(self) -> None:
        """Restart safety for a session this member authored blocks in before a crash (its
        blocks are not kept on disk): never sign a block here again; submitted records are
        counted ("muted_records") and dropped. The member still receives, delivers and
        answers getDifference, so its RMQ follows the session; it signs again from the
        next session on."""
        self.muted = True

    def submit(self, payload: bytes, now: float) -> None:
        """Queue one record; the next own block (at the next block_interval tick) carries all
        queued records that fit in max_payload. Raises CatchainUsageError if the record
        cannot fit in a block or the queue holds more than max_submit_bytes. A muted
        catchain drops the record (stats["muted_records"])."""
        self._touch(now)
        if self.muted:
            self.stats["muted_records"] += 1
            return
        size = record_size(payload)
        if size + 8 > self.max_payload:
            raise CatchainUsageError(f"record of {len(payload)} bytes does not fit max_payload={self.max_payload}")
        if self._records_bytes + size > self.max_submit_bytes:
            raise CatchainUsageError("submit queue full")
        self._records.append(bytes(payload))
        self._records_bytes += size
        if self._next_block_at is None:
            self._next_block_at = max(now, self._last_block_at + self.block_interval)

    def receive_datagram(self, data: bytes, src: bytes, now: float) -> None:
        """Feed one datagram from member key id `src`. Never raises on bad input."""
        self._touch(now)
        self.stats["datagrams_in"] += 1
        try:
            peer = self._by_key_id.get(bytes(src))
            if peer is None:
                raise CatchainRemoteError("non_member", bytes(src).hex()[:16])
            if peer == self.local_index:
                raise CatchainRemoteError("from_self", "datagram claims our own key id")
            cid, obj = parse_datagram(bytes(data), incarnation=self.session_id, n_sources=self.n,
                                      max_size=self.max_datagram, max_payload=self.max_payload)
            if cid in (BLOCK_UPDATE, BLOCK_RESULT):
                self._on_block(obj, bytes(src))  # type: ignore[arg-type]
            elif cid == GET_DIFFERENCE:
                self._on_get_difference(obj, bytes(src), peer, now)  # type: ignore[arg-type]
            elif cid == GET_BLOCK:
                self._on_get_block(obj, bytes(src))  # type: ignore[arg-type]
            elif cid == DIFFERENCE_FORK:
                left, right = obj  # type: ignore[misc]
                self._on_fork_proof(left, right)
            elif cid == DIFFERENCE:
                self.stats["difference_received"] += 1
            else:
                self.stats["block_not_found_received"] += 1
        except CatchainRemoteError as exc:
            self._reject(bytes(src), exc.reason, exc.detail)

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, bytes]]:
        """Drain the outbox: [(destination key id, datagram)]."""
        out, self._out = self._out, []
        self.stats["datagrams_out"] += len(out)
        return out

    def get_timer(self) -> float | None:
        """Next deadline (s) at which handle_timer must be called."""
        if self._next_sync is None:
            return 0.0
        t = self._next_sync
        if self._records and self._next_block_at is not None:
            t = min(t, self._next_block_at)
        return t

    def handle_timer(self, now: float) -> None:
        """Produce the pending block if its tick came; run the periodic sync and pruning."""
        self._touch(now)
        if self._records and self._next_block_at is not None and now >= self._next_block_at:
            self._produce(now)
        if self._next_sync is not None and now >= self._next_sync:
            self._sync(now)
            self._prune()
            self._next_sync = now + self.sync_interval * (0.75 + 0.5 * self._rng.random())

    def next_event(self) -> CatchainEvent | None:
        if not self._events:
            return None
        ev = self._events.popleft()
        if isinstance(ev, RejectedDatagram):
            self._queued_rejections -= 1
        return ev

    # --- internals: bookkeeping -----------------------------------------------------------

    def _touch(self, now: float) -> None:
        if self._next_sync is None:
            self._next_sync = now + self.sync_interval * self._rng.random()

    def _reject(self, peer: bytes, reason: str, detail: str) -> None:
        self.rejected[reason] += 1
        if self._queued_rejections < 1024:
            self._queued_rejections += 1
            self._events.append(RejectedDatagram(peer, reason, detail))

    def _send(self, dest: int, data: bytes) -> None:
        self._out.append((self._sources[dest].key_id, data))

    def _broadcast(self, data: bytes) -> None:
        for s in self._sources:
            if s.index != self.local_index:
                self._out.append((s.key_id, data))

    def _dep_hash(self, d: Dep) -> bytes:
        if d.height == 0:
            return self._root
        return block_hash(self.session_id, self._sources[d.src].key_id, d.height, d.data_hash)

    def _dep_delivered(self, h: bytes, d: Dep) -> bool:
        if d.height == 0:
            return True
        rec = self._blocks.get(h)
        if rec is not None:
            return rec.state == _DELIVERED
        s = self._sources[d.src]
        return d.height < s.floor and d.height <= s.delivered_height   # pruned after delivery

    def _register(self, h: bytes, d: Dep) -> None:
        """Index (src, height) -> hash; a second hash at one height is a fork."""
        s = self._sources[d.src]
        lst = s.by_height.get(d.height)
        if lst is None:
            s.by_height[d.height] = [h]
            return
        if h in lst:
            return
        lst.append(h)
        if not s.blamed and d.src != self.local_index:
            first = self._blocks[lst[0]].dep
            self._blame(s, pack_fork_proof(first, d))

    def _blame(self, s: _Source, proof: bytes) -> None:
        s.blamed = True
        s.fork_proof = proof
        self.stats["forks_detected"] += 1
        self._events.append(ForkDetected(s.key_id, s.index, proof))
        # tell everybody (catchain.differenceFork, bare deps)
        self._broadcast(pack_difference_fork(*read_fork_proof(proof)))
        # drop its undelivered blocks nobody depends on, highest first so chains unwind
        for height in sorted((x for x in s.by_height if x > s.delivered_height), reverse=True):
            for h in list(s.by_height.get(height, ())):
                rec = self._blocks.get(h)
                if rec is not None and rec.state != _DELIVERED and not self._waiters.get(h):
                    self._forget(rec)

    def _forget(self, rec: _Rec) -> None:
        """Remove a non-delivered block from every structure (idempotent)."""
        if self._blocks.get(rec.hash) is not rec:
            return
        del self._blocks[rec.hash]
        s = self._sources[rec.dep.src]
        lst = s.by_height.get(rec.dep.height)
        if lst is not None and rec.hash in lst:
            lst.remove(rec.hash)
            if not lst:
                del s.by_height[rec.dep.height]
        if rec.state == _PENDING:
            self._pending -= 1
            for ph in rec.prereqs:
                w = self._waiters.get(ph)
                if w is not None and rec.hash in w:
                    w.remove(rec.hash)
                    if not w:
                        del self._waiters[ph]
                        self._refs.pop(ph, None)
                        prec = self._blocks.get(ph)
                        if prec is not None and prec.state == _REF:
                            self._forget(prec)
        self._refs.pop(rec.hash, None)
        if rec.state != _DELIVERED:
            self._waiters.pop(rec.hash, None)

    # --- internals: blocks ------------------------------------------------------------------

    def _on_block(self, blk: WireBlock, sender: bytes) -> None:
        s = self._sources[blk.src]
        dh = blk.data_hash()
        h = block_hash(self.session_id, s.key_id, blk.height, dh)
        rec = self._blocks.get(h)
        if rec is not None and rec.state != _REF:
            self.stats["duplicates"] += 1
            return
        if blk.height < s.floor:
            self.stats["stale"] += 1
            return
        needed = bool(self._waiters.get(h))
        if blk.src == self.local_index:
            raise CatchainRemoteError("unknown_self_block", f"height={blk.height}")
        if s.blamed and not needed:
            raise CatchainRemoteError("blamed_source", f"src={blk.src} height={blk.height}")
        if not needed and blk.height > s.delivered_height + self.max_height_gap:
            raise CatchainRemoteError("height_gap", f"height {blk.height}, delivered {s.delivered_height}")
        limit = self.max_pending_blocks * (2 if needed else 1)
        if self._pending >= limit:
            raise CatchainRemoteError("pending_full", f"{self._pending} pending blocks")
        if not (rec is not None and rec.dep.signature == blk.signature) and \
                not verify(s.public, block_id_bytes(self.session_id, s.key_id, blk.height, dh), blk.signature):
            raise CatchainRemoteError("bad_signature", f"src={blk.src} height={blk.height}")
        prereqs = (blk.prev,) + blk.deps
        hashes = []
        for d in prereqs:
            ph = self._dep_hash(d)
            hashes.append(ph)
            if d.height == 0 or ph in self._blocks:
                continue
            if d.src == self.local_index:
                raise CatchainRemoteError("unknown_self_block", f"dep on own height {d.height}")
            ds = self._sources[d.src]
            if not verify(ds.public, block_id_bytes(self.session_id, ds.key_id, d.height, d.data_hash),
                          d.signature):
                raise CatchainRemoteError("bad_dep_signature", f"dep src={d.src} height={d.height}")
        # accepted: the author has delivered its prev and deps
        row = self._peer_delivered[blk.src]
        row[blk.src] = max(row[blk.src], blk.height)
        for d in blk.deps:
            row[d.src] = max(row[d.src], d.height)
        dep = Dep(blk.src, blk.height, dh, blk.signature)
        if rec is None:
            rec = _Rec(h, dep, _PENDING)
            self._blocks[h] = rec
        else:
            rec.state = _PENDING
            self._refs.pop(h, None)
        rec.block = blk
        rec.body = blk.body()
        rec.prereqs = tuple(hashes)
        self._pending += 1
        self.max_pending_seen = max(self.max_pending_seen, self._pending)
        new_refs = []
        missing = 0
        for d, ph in zip(prereqs, hashes):
            if d.height != 0 and ph not in self._blocks and d.height >= self._sources[d.src].floor:
                ref = _Rec(ph, d, _REF)
                ref.sender = sender
                self._blocks[ph] = ref
                new_refs.append(ref)
            if self._dep_delivered(ph, d):
                continue
            missing += 1
            self._waiters.setdefault(ph, []).append(h)
            prec = self._blocks.get(ph)
            if prec is not None and prec.state == _REF:
                self._refs[ph] = None
                if prec.sender is None:
                    prec.sender = sender
        rec.missing = missing
        # fork detection last: a blame drops undelivered blocks nobody waits for
        self._register(h, dep)
        for ref in new_refs:
            self._register(ref.hash, ref.dep)
        if s.blamed and not needed:       # this very block revealed the fork
            self._forget(rec)
            self.stats["fork_blocks_dropped"] += 1
            return
        self.max_stored_seen = max(self.max_stored_seen, len(self._blocks))
        if missing == 0:
            self._deliver_from(rec)

    def _deliver_from(self, first: _Rec) -> None:
        queue = deque([first])
        while queue:
            rec = queue.popleft()
            if rec.state != _PENDING or rec.hash not in self._blocks:
                continue
            rec.state = _DELIVERED
            self._pending -= 1
            blk = rec.block
            assert blk is not None
            s = self._sources[blk.src]
            if not s.blamed:
                if blk.height > s.delivered_height:
                    s.delivered_height = blk.height
                    s.delivered_hash = rec.hash
                self._emit_delivered(s, rec)
            else:
                self.stats["blocks_delivered_silently"] += 1
            for w in self._waiters.pop(rec.hash, ()):
                wrec = self._blocks.get(w)
                if wrec is not None and wrec.state == _PENDING:
                    wrec.missing -= 1
                    if wrec.missing <= 0:
                        queue.append(wrec)

    def _emit_delivered(self, s: _Source, rec: _Rec) -> None:
        blk = rec.block
        assert blk is not None
        records = unpack_records(blk.payload)
        if records is None:
            self.stats["foreign_payloads"] += 1
        self.stats["blocks_delivered"] += 1
        self._events.append(BlockDelivered(s.key_id, blk.height, blk.payload, rec.hash, s.index, records or ()))

    def _produce(self, now: float) -> None:
        records, size = [], 8
        while self._records:
            sz = record_size(self._records[0])
            if records and size + sz > self.max_payload:
                break
            records.append(self._records.popleft())
            self._records_bytes -= sz
            size += sz
        me = self._sources[self.local_index]
        height = me.delivered_height + 1
        prev = self._blocks[me.delivered_hash].dep if height > 1 else self._root_dep
        cands = [s for s in self._sources
                 if s.index != self.local_index and not s.blamed and s.delivered_height > s.last_dep_height]
        cands.sort(key=lambda s: s.last_dep_height - s.delivered_height)
        deps = []
        for s in sorted(cands[:self.max_deps], key=lambda s: s.index):
            deps.append(self._blocks[s.delivered_hash].dep)
            s.last_dep_height = s.delivered_height
        blk = sign_block(self.local, self.session_id, self.local_index, height, prev, deps, pack_records(records))
        dep = blk.dep()
        h = self._dep_hash(dep)
        rec = _Rec(h, dep, _DELIVERED)
        rec.block = blk
        rec.body = blk.body()
        rec.prereqs = tuple(self._dep_hash(d) for d in (prev, *deps))
        self._blocks[h] = rec
        self._register(h, dep)
        me.delivered_height = height
        me.delivered_hash = h
        self.stats["blocks_created"] += 1
        self._emit_delivered(me, rec)
        self._broadcast(pack_block_update(rec.body))
        self._last_block_at = now
        self._next_block_at = now + self.block_interval if self._records else None
        self.max_stored_seen = max(self.max_stored_seen, len(self._blocks))

    # --- internals: sync ----------------------------------------------------------------------

    def _rt(self) -> list[int]:
        return [-1 if s.blamed else s.delivered_height for s in self._sources]

    def _sync(self, now: float) -> None:
        peers = [s.index for s in self._sources if s.index != self.local_index and not s.blamed]
        if peers:
            target = self._rng.choice(peers)
            rt = self._rt()
            self._send(target, pack_get_difference(rt))
            self.stats["get_difference_sent"] += 1
        asked = 0
        for h in list(self._refs):
            if asked >= self.max_get_block:
                break
            rec = self._blocks.get(h)
            if rec is None or rec.state != _REF or not self._waiters.get(h):
                self._refs.pop(h, None)
                continue
            if now - rec.asked_at < self.sync_interval:
                continue
            dest = None
            if rec.asks == 0 and rec.sender is not None:
                dest = self._by_key_id.get(rec.sender)
            if dest is None:
                others = [i for i in range(self.n) if i != self.local_index]
                dest = self._rng.choice(others) if others else None
            if dest is None:
                break
            rec.asked_at = now
            rec.asks += 1
            self._send(dest, pack_get_block(h))
            self.stats["get_block_sent"] += 1
            asked += 1

    def _on_get_difference(self, rt: list[int], sender: bytes, peer: int, now: float) -> None:
        self.stats["get_difference_received"] += 1
        # one answer per peer per half sync interval: honest peers ask a random member every
        # 0.75..1.25 sync_interval, and an answer is up to max_difference_blocks datagrams
        if now - self._last_answer[peer] < self.sync_interval / 2:
            raise CatchainRemoteError("rate_limited", "getDifference too often")
        self._last_answer[peer] = now
        for i, x in enumerate(rt):
            if x >= 0 and self._sources[i].blamed:
                left, right = self._fork_deps(self._sources[i])
                self._send(peer, pack_difference_fork(left, right))
                self.stats["difference_fork_sent"] += 1
                return
        row = self._peer_delivered[peer]
        for i, x in enumerate(rt):
            if x > row[i]:
                row[i] = x
        budget = self.max_difference_blocks
        sent_upto = list(rt)
        stuck: set[int] = set()
        progressed = True
        while budget > 0 and progressed:       # round robin over sources, lowest heights first
            progressed = False
            for i, s in enumerate(self._sources):
                if budget <= 0:
                    break
                if i in stuck or sent_upto[i] < 0 or sent_upto[i] >= s.delivered_height:
                    continue
                nh = sent_upto[i] + 1
                hashes = s.by_height.get(nh) if nh >= s.floor else None
                rec = self._blocks.get(hashes[0]) if hashes else None
                if rec is None or rec.state != _DELIVERED or rec.body is None:
                    self.stats["difference_unavailable"] += 1     # pruned here
                    stuck.add(i)
                    continue
                self._send(peer, pack_block_update(rec.body))
                sent_upto[i] = nh
                budget -= 1
                progressed = True
                self.stats["difference_blocks_sent"] += 1
        self._send(peer, pack_difference(sent_upto))

    def _fork_deps(self, s: _Source) -> tuple[Dep, Dep]:
        assert s.fork_proof is not None
        return read_fork_proof(s.fork_proof)

    def _on_get_block(self, h: bytes, sender: bytes) -> None:
        self.stats["get_block_received"] += 1
        rec = self._blocks.get(h)
        peer = self._by_key_id[sender]
        if rec is None or rec.body is None:
            self._send(peer, pack_block_not_found())
            return
        self._send(peer, pack_block_result(rec.body))

    def _on_fork_proof(self, left: Dep, right: Dep) -> None:
        src = check_fork(left, right, self.session_id, self.members)
        s = self._sources[src]
        if src == self.local_index:
            raise CatchainRemoteError("bad_fork_proof", "proof against ourselves")
        if s.blamed:
            self.stats["fork_proofs_known"] += 1
            return
        self._blame(s, pack_fork_proof(left, right))

    def _prune(self) -> None:
        """Drop delivered blocks every member has (minus prune_window), and any beyond
        max_blocks_per_source per source."""
        for s in self._sources:
            known = s.delivered_height
            for m in range(self.n):
                if m != self.local_index:
                    known = min(known, self._peer_delivered[m][s.index])
            new_floor = max(known - self.prune_window, s.delivered_height - self.max_blocks_per_source) + 1
            new_floor = min(new_floor, s.delivered_height)      # never the latest delivered block
            if new_floor <= s.floor:
                continue
            for height in range(s.floor, new_floor):
                for h in list(s.by_height.get(height, ())):
                    rec = self._blocks.get(h)
                    if rec is None:
                        continue
                    if rec.state == _DELIVERED:
                        self._blocks.pop(h, None)
                        self.stats["blocks_pruned"] += 1
                    else:
                        self._forget(rec)
                s.by_height.pop(height, None)
            s.floor = new_floor
