"""Marlin consumer core: no I/O, reads no clock (DESIGN.md section 2).

Seed: marlin-data.txt "Data Exit" (receive, onChunkExpiryTimer, getMessageFromChunks,
Consumer::raiseDispute).

    c = ConsumerCore(key, membership, params)               # validate=validate.validate_block
    c.receive_frame(frame, peer, now)                       # KIND_CHUNK frames from members
    c.handle_timer(now) when now >= c.get_timer()           # chunk expiry
    c.next_event() -> ChunkReceived | ChunkRejected | BlockRebuilt | Dispute | None
    c.frames_to_send(now) -> []                             # a consumer sends nothing

Messages are keyed (message id, producer): several producers may send the same message id
(seed "TODO: What happens when multiple producers send the block simultaneously? ... the
receiver will not drop even if the same message is being sent again"), e.g. a corrupted
block with an honest block's header; each is rebuilt, delivered or disputed on its own.
Per chunk frame: duplicate suppression before any signature check on (message id, chunk
id, attestation signature) of chunks already accepted (the producer is only known once the
signature is verified, so the pre-check key is the exact attestation); channel and sizes;
timestamp not "stale"/"future"; attestation must recover to a known producer
("unknown_producer"); then duplicates by (message id, producer, chunk id) and chunks of a
finished (message id, producer) are counted and dropped (a late chunk of a finished message
costs one chunk hash and one signature recovery); the witness must recover to a member of
one of the NO_OF_CLUSTER_OPTIONS clusters of that chunk ("bad_witness"); all chunks of a
message on one channel ("channel_mismatch"). A forged chunk cannot evict or shadow an honest
one: only verified chunks enter the caches, a forgery copying an accepted attestation is a
duplicate of a chunk already held, and another producer's chunks are another message.
The first accepted chunk of a message starts its expiry timer (now + chunk_expiry). At
MIN_CHUNKS chunks the block is rebuilt (coding.py), validated (`validate(channel, block)`,
default validate.validate_block, which raises a ValueError for an invalid block) and its
hash checked against the message id; then BlockRebuilt (deliver it) or a Dispute naming every
producer that attested a chunk of it ("invalid_block", "message_id_mismatch",
"undecodable"). The expiry timer firing first raises Dispute("expired").

Rebuilding inline (offload=False, the default) runs rebuild_block inside receive_frame. With
offload=True the core hands the work out instead, so the caller can run it off its event
loop while later chunks keep coming in (a 1 MB Bitcoin block costs milliseconds of decoding
and validation):

    job = c.next_job()                                  # RebuildJob | None
    outcome = rebuild_block(*job.args(c.validate))      # anywhere: pure, picklable
    c.rebuild_done(job, outcome, now)                   # -> BlockRebuilt | Dispute

The message counts as finished when its job is handed out (later chunks are duplicates);
its chunk bytes count against max_pending_bytes until rebuild_done.

Memory: at most max_messages unfinished messages and max_pending_bytes chunk bytes; a chunk
beyond either bound is refused ("memory"), never someone else's pending data evicted.
Finished message ids are remembered max(finished_retention, TOLERABLE_LATENCY +
max_clock_skew) and at most 4 x max_messages of them; attestations of accepted chunks
TOLERABLE_LATENCY + max_clock_skew (later copies are stale by then).

Stale chunks (a partition longer than TOLERABLE_LATENCY, after which a member's transport
sends the chunks it kept): refused ("stale"), and a verified stale chunk of a (message id,
producer) neither pending nor finished ends that block with Dispute("expired") at once (0
chunks), so a block is rebuilt, disputed or expired, never silently lost (seed
onChunkExpiryTimer); a stale chunk of a pending message leaves it to its expiry timer.
Errors: receive_frame never raises for remote input (ChunkRejected + "rejected.<reason>").
"""
from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

from .coding import CodingError, coder
from .crypto import BadSignature, NodeKey, keccak256, recover_address, recover_signer
from .events import BlockRebuilt, ChunkReceived, ChunkRejected, Dispute, MarlinEvent
from .membership import Membership
from .params import Params
from .validate import BlockInfo, block_hash, validate_block
from .wire import (ATTESTATION_LEN, KIND_CHUNK, SIGNATURE_LEN, MarlinLocalError, MarlinWireError, decode_frame,
                   parse_chunk_message, peek_chunk_ids)

__all__ = ["ConsumerCore", "Validator", "DUPLICATE_REASONS", "RebuildJob", "rebuild_block", "warm_worker"]

#: Why a consumer drops a chunk frame as a duplicate, counted per reason (counters
#: "duplicate.<reason>", `ConsumerCore.duplicates()`):
#: replayed_attestation: the exact attestation of a chunk already accepted (before any
#:     signature check); chunk_held: another copy (other witness) of a chunk of an
#:     unfinished message already held; message_finished: a chunk of a message already
#:     rebuilt, disputed or expired.
DUPLICATE_REASONS = ("replayed_attestation", "chunk_held", "message_finished")

#: validate(channel, block) -> BlockInfo | None; raises a ValueError for an invalid block.
Validator = Callable[[int, bytes], "BlockInfo | None"]


@dataclass
class RebuildJob:
    """A message that reached MIN_CHUNKS, to rebuild and validate (ConsumerCore.next_job)."""
    message_id: int
    """uint32 message id"""
    producers: list
    """attesting producers (20-byte addresses), first seen first"""
    channel: int
    """channel id"""
    num_chunks: int
    """the channel's NUM_CHUNKS"""
    min_chunks: int
    """the channel's MIN_CHUNKS"""
    chunks: dict
    """{chunk id: chunk bytes}, at least min_chunks"""
    first_at: float
    """when the first chunk was accepted (the caller's clock, seconds)"""
    size: int
    """chunk bytes held"""

    def args(self, validate: "Validator") -> tuple:
        """rebuild_block's arguments (picklable when `validate` is a module-level function)."""
        return (self.channel, self.num_chunks, self.min_chunks, self.chunks, validate)


def rebuild_block(channel: int, num_chunks: int, min_chunks: int, chunks: dict,
                  validate: "Validator | None" = None) -> tuple:
    """Erasure-decode `chunks` (coding.py) and validate the block (`validate(channel, block)`,
    default validate.validate_block). Pure: no I/O, no clock, no state, so it runs in a
    worker process or thread. Returns ("ok", block, 32-byte block hash) or ("dispute",
    reason, detail) with reason "undecodable" or the validator's (BlockInvalid.reason,
    else "invalid_block"). Never raises for bad chunks or an invalid block."""
    try:
        block = coder(num_chunks, min_chunks).decode(chunks)
    except CodingError as exc:
        return ("dispute", "undecodable", str(exc))
    try:
        info = (validate or validate_block)(channel, block)
        digest = info.hash if isinstance(info, BlockInfo) else block_hash(channel, block)
    except ValueError as exc:   # validate.BlockInvalid and any validator's ValueError
        return ("dispute", getattr(exc, "reason", "invalid_block"), str(exc))
    return ("ok", block, digest)


def warm_worker() -> None:
    """Load what rebuild_block needs (the coder, libbitcoinkernel) in a worker process."""
    from .validate import _kernel
    _kernel()


@dataclass
class _Pending:
    channel: int
    first_at: float
    deadline: float
    chunks: dict = field(default_factory=dict)      # chunk id -> bytes
    producers: list = field(default_factory=list)   # attesting producers, first seen first
    size: int = 0


class ConsumerCore:
    """See the module docstring."""

    def __init__(self, key: NodeKey, membership: Membership, params: Params, *,
                 validate: Validator | None = None, offload: bool = False):
        self.key = key
        self.address = key.address
        self.membership = membership
        self.params = params
        self.validate = validate or validate_block
        self.offload = offload
        self._jobs: deque = deque()
        self._inflight_bytes = 0
        self._inflight_jobs = 0
        self.counters: Counter = Counter()
        self._pending: OrderedDict[tuple, _Pending] = OrderedDict()   # (mid, producer) ->
        self._done: OrderedDict[tuple, float] = OrderedDict()         # (mid, producer) -> finished at
        self._sigs: OrderedDict[tuple, float] = OrderedDict()         # (mid, cid, att signature) -> at
        self._pending_bytes = 0
        self._events: deque = deque()
        self._horizon = params.tolerable_latency + params.max_clock_skew
        self._done_horizon = max(self._horizon, params.finished_retention)

    def receive_frame(self, frame: bytes, peer: bytes, now: float) -> None:
        """One frame from member `peer`. Never raises for bad input."""
        self._prune_done(now)
        ids = (None, None)
        producer = None
        try:
            kind, body = decode_frame(frame, self.params.max_frame)
            if kind != KIND_CHUNK:
                raise MarlinWireError(f"a consumer takes witnessed chunks, not frame kind {kind}", "unknown_kind")
            mid, channel, cid = peek_chunk_ids(body)
            ids = (mid, cid)
            if len(body) >= ATTESTATION_LEN and \
                    (mid, cid, bytes(body[ATTESTATION_LEN - SIGNATURE_LEN:ATTESTATION_LEN])) in self._sigs:
                self._duplicate("replayed_attestation")
                return
            producer = self._accept(body, mid, channel, cid, peer, now)
        except MarlinWireError as exc:
            self.counters[f"rejected.{exc.reason}"] += 1
            self._events.append(ChunkRejected("consumer", exc.reason, str(exc), peer, len(frame), ids[0],
                                              producer, ids[1]))

    def _accept(self, body, mid: int, channel: int, cid: int, peer: bytes, now: float) -> bytes | None:
        p = self.params
        cp = p.channels.get(channel)
        if cp is None:
            raise MarlinWireError(f"channel {channel} is not configured", "unknown_channel")
        msg = parse_chunk_message(body, witnessed=True, max_chunk=cp.max_chunk)
        att = msg.attestation
        if cid >= cp.num_chunks:
            raise MarlinWireError(f"chunk id {cid} >= NUM_CHUNKS {cp.num_chunks}", "malformed")
        if now - att.timestamp > p.tolerable_latency:
            self._stale(msg, mid, channel, cid, now)
            raise MarlinWireError(f"chunk timestamp {att.timestamp} is {now - att.timestamp:.1f} s old "
                                  f"(TOLERABLE_LATENCY {p.tolerable_latency} s)", "stale")
        if att.timestamp - now > p.max_clock_skew:
            raise MarlinWireError(f"chunk timestamp {att.timestamp} is {att.timestamp - now:.1f} s ahead",
                                  "future")
        chunk = msg.chunk
        try:
            signer = recover_signer(att.signed_data(len(chunk), keccak256(chunk)), att.signature)
        except BadSignature as exc:
            raise MarlinWireError(f"attestation: {exc}", "bad_signature") from None
        if not self.membership.is_producer(signer):
            raise MarlinWireError(f"attestation recovers to 0x{signer.hex()}, not a known producer",
                                  "unknown_producer")
        key = (mid, signer)
        pend = self._pending.get(key)
        if key in self._done:
            self._duplicate("message_finished")
            return None
        if pend is not None and cid in pend.chunks:
            self._duplicate("chunk_held")
            return None
        try:
            witness_by = recover_address(keccak256(msg.attestation_wire, chunk), msg.witness)
        except BadSignature as exc:
            raise MarlinWireError(f"witness: {exc}", "bad_witness") from None
        options = self.membership.options(mid, cid, p.no_of_cluster_options)
        if not self.membership.clusters_of(witness_by) & set(options):
            raise MarlinWireError(f"witness by 0x{witness_by.hex()} (clusters "
                                  f"{sorted(self.membership.clusters_of(witness_by))}), not a member of the "
                                  f"chunk's cluster options {options}", "bad_witness")
        if pend is not None and pend.channel != channel:
            raise MarlinWireError(f"chunk on channel {channel}, message {mid:08x} is on {pend.channel}",
                                  "channel_mismatch")
        if pend is None:
            if len(self._pending) >= p.max_messages:
                raise MarlinWireError(f"{len(self._pending)} messages pending (max_messages)", "memory")
            pend = _Pending(channel, now, now + p.chunk_expiry)
            self._pending[key] = pend
        if self._pending_bytes + self._inflight_bytes + len(chunk) > p.max_pending_bytes:
            raise MarlinWireError(f"{self._pending_bytes + self._inflight_bytes} chunk bytes pending or being "
                                  "rebuilt (max_pending_bytes)", "memory")
        pend.chunks[cid] = chunk
        self._sigs[(mid, cid, att.signature)] = now
        if len(self._sigs) > p.max_cached_chunks:
            self._sigs.popitem(last=False)     # only costs a verification of a later duplicate
        pend.size += len(chunk)
        self._pending_bytes += len(chunk)
        if signer not in pend.producers:
            pend.producers.append(signer)
        self.counters["chunks"] += 1
        self._events.append(ChunkReceived(mid, signer, cid, peer, len(chunk)))
        if len(pend.chunks) >= cp.min_chunks:
            self._rebuild(key, pend, now)
        return signer

    def _stale(self, msg, mid: int, channel: int, cid: int, now: float) -> None:
        """A stale chunk (older than TOLERABLE_LATENCY) is refused, but its block must not
        vanish: when the chunk verifies (attestation by a known producer, witness by a member
        of one of its cluster options) and its (message id, producer) is neither pending (its
        expiry timer will raise the dispute) nor finished, the block can no longer be rebuilt
        in time, so it ends here with Dispute("expired") naming the producer, as the seed's
        onChunkExpiryTimer does for a block short of MIN_CHUNKS. Later chunks of it are then
        duplicates of a finished message."""
        chunk = msg.chunk
        try:
            signer = recover_signer(msg.attestation.signed_data(len(chunk), keccak256(chunk)),
                                    msg.attestation.signature)
            witness_by = recover_address(keccak256(msg.attestation_wire, chunk), msg.witness)
        except BadSignature:
            return
        key = (mid, signer)
        if key in self._pending or key in self._done or not self.membership.is_producer(signer):
            return
        options = self.membership.options(mid, cid, self.params.no_of_cluster_options)
        if not self.membership.clusters_of(witness_by) & set(options):
            return
        pend = _Pending(channel, now, now, producers=[signer])
        self._done[key] = now
        if len(self._done) > 4 * self.params.max_messages:
            self._done.popitem(last=False)
        age = now - msg.attestation.timestamp
        self._dispute(mid, pend, "expired", f"0 of {self.params.channel(channel).min_chunks} chunks within "
                      f"TOLERABLE_LATENCY {self.params.tolerable_latency} s (first chunk {age:.1f} s old)", 0.0)

    def _duplicate(self, reason: str) -> None:
        self.counters["duplicate"] += 1
        self.counters[f"duplicate.{reason}"] += 1

    def duplicates(self) -> dict[str, int]:
        """{reason: chunk frames dropped as duplicates} (see DUPLICATE_REASONS)."""
        return {r: self.counters[f"duplicate.{r}"] for r in DUPLICATE_REASONS}

    def _rebuild(self, key: tuple, pend: _Pending, now: float) -> None:
        cp = self.params.channel(pend.channel)
        self._finish(key, pend, now)
        job = RebuildJob(key[0], list(pend.producers), pend.channel, cp.num_chunks, cp.min_chunks,
                         pend.chunks, pend.first_at, pend.size)
        if not self.offload:
            self.rebuild_done(job, rebuild_block(*job.args(self.validate)), now)
            return
        self._inflight_bytes += job.size
        self._inflight_jobs += 1
        self._jobs.append(job)

    def next_job(self) -> "RebuildJob | None":
        """With offload=True: the next block to rebuild, or None. The caller runs
        `rebuild_block(*job.args(core.validate))` (in a worker process or thread) and hands
        its result to rebuild_done. Jobs leave in the order their last chunk arrived."""
        return self._jobs.popleft() if self._jobs else None

    def rebuild_done(self, job: "RebuildJob", outcome: tuple, now: float) -> None:
        """The result of rebuild_block for `job` -> BlockRebuilt or Dispute (duration from the
        first chunk to `now`). Raises MarlinLocalError for an outcome rebuild_block cannot
        return."""
        if self.offload:
            self._inflight_bytes -= job.size
            self._inflight_jobs -= 1
        duration = (now - job.first_at) * 1000.0
        mid = job.message_id
        if outcome[0] == "dispute":
            self._dispute(mid, job, outcome[1], outcome[2], duration)
            return
        if outcome[0] != "ok":
            raise MarlinLocalError(f"rebuild outcome {outcome[0]!r} is not ok/dispute")
        block, digest = outcome[1], outcome[2]
        if int.from_bytes(digest[:4], "big") != mid:
            self._dispute(mid, job, "message_id_mismatch",
                          f"message id {mid:08x} is not the first 4 bytes of block hash {digest.hex()}", duration)
            return
        self.counters["rebuilt"] += 1
        self._events.append(BlockRebuilt(mid, job.producers[0], job.channel, block, len(job.chunks), duration))

    def rebuilding(self) -> int:
        """Blocks handed out by next_job whose rebuild_done has not come yet, plus those
        waiting in next_job."""
        return self._inflight_jobs

    def _dispute(self, mid: int, pend, reason: str, detail: str, duration: float) -> None:
        self.counters[f"dispute.{reason}"] += 1
        self._events.append(Dispute(mid, list(pend.producers), reason, detail, pend.channel, len(pend.chunks),
                                    duration))

    def _finish(self, key: tuple, pend: _Pending, now: float) -> None:
        del self._pending[key]
        self._pending_bytes -= pend.size
        self._done[key] = now
        if len(self._done) > 4 * self.params.max_messages:
            self._done.popitem(last=False)

    def _prune_done(self, now: float) -> None:
        limit = now - self._done_horizon
        while self._done:
            mid, t = next(iter(self._done.items()))
            if t > limit:
                break
            del self._done[mid]
        limit = now - self._horizon
        sigs = self._sigs
        while sigs:
            t = next(iter(sigs.values()))
            if t > limit:
                break
            sigs.popitem(last=False)

    # ---- timers ---------------------------------------------------------------------------
    def get_timer(self) -> float | None:
        """The earliest chunk-expiry deadline (unix seconds), else the next prune of finished
        ids, else None."""
        if self._pending:
            return next(iter(self._pending.values())).deadline
        firsts = [next(iter(d.values())) + h for d, h in ((self._done, self._done_horizon),
                                                           (self._sigs, self._horizon)) if d]
        return min(firsts) if firsts else None

    def handle_timer(self, now: float) -> None:
        """Messages whose expiry passed before MIN_CHUNKS -> Dispute("expired")."""
        while self._pending:
            key, pend = next(iter(self._pending.items()))
            if pend.deadline > now:
                break
            mid = key[0]
            self._finish(key, pend, now)
            cp = self.params.channel(pend.channel)
            self._dispute(mid, pend, "expired", f"{len(pend.chunks)} of {cp.min_chunks} chunks within "
                          f"{self.params.chunk_expiry} s", (now - pend.first_at) * 1000.0)
        self._prune_done(now)

    def frames_to_send(self, now: float) -> list[tuple[bytes, bytes]]:
        """A consumer sends nothing: always []."""
        return []

    def next_event(self) -> MarlinEvent | None:
        """The next event (events.py), or None."""
        return self._events.popleft() if self._events else None

    def pending(self) -> dict[tuple[int, bytes], int]:
        """{(message id, producer address): chunks held} of unfinished messages."""
        return {key: len(p.chunks) for key, p in self._pending.items()}
