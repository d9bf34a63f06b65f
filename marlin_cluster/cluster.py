"""Marlin cluster member core: no I/O, reads no clock (DESIGN.md section 2).

Seed: marlin-data.txt "Data Propogation" (onChunk, acknowledgeMessage, verifyWitness,
verifyAttestation, isValidClusterMember, isValidProducer, sendToPeers) and "Attestation"
(stake offsets: "If the same stake is attached again to another message within a refresh
interval, the producer will be slashed").

    m = ClusterMemberCore(key, membership, params, cluster_id)
    m.receive_frame(frame, peer, now)     # peer: the link's 20-byte address (authenticated by
                                          # the transport); now: unix seconds
    m.frames_to_send(now) -> [(address, frame)]; m.next_event(); get_timer()/handle_timer()

Per chunk frame, in this order:
 1. duplicate suppression before any signature check, on (message id, chunk id, attestation
    signature): the producer is not known before its signature is verified (it is recovered
    from it), so the pre-check key is the exact attestation of a chunk this member already
    verified. The cache holds verified chunks only, keyed (message id, producer, chunk id)
    once the producer is known (seed: several producers may send the same message id), so
    a forged duplicate cannot shadow or evict the honest chunk: a forgery with a new
    signature is verified and refused (never cached); one that copies a verified chunk's
    attestation is dropped as a duplicate of a chunk already relayed; a second producer's
    chunk with the same (message id, chunk id) is a separate entry. Counted, not logged;
 2. channel configured, sizes (MIN/NUM_CHUNKS bounds, max chunk), timestamp not older than
    TOLERABLE_LATENCY ("stale") nor more than max_clock_skew ahead ("future");
 3. attestation: from a producer link (KIND_ATTESTED_CHUNK) the peer must be a known producer
    ("not_producer") and the signature must recover to it ("attestation_mismatch"); from a
    member link (KIND_CHUNK) it must recover to a known producer ("unknown_producer");
 4. witness (KIND_CHUNK only): signature over keccak256(attestation wire || chunk) by a member
    of this cluster ("bad_witness");
 5. stake: the chunk's stake units [offset, offset + (length + 81) x STAKE_PER_BYTE) overlap
    units another (message id, chunk id) of the same producer holds in the same epoch
    (timestamp // refresh_interval) -> StakeEvidence recorded (bounded, `evidence`) and the
    chunk refused ("stake_reuse"); a range beyond the stake budget is refused ("stake_exceeded").
Accepted from the producer: this member is the first; it witnesses, queues a signed
acknowledgement to the producer, and relays `| Attestation | Witness | Chunk |` to the other
members of its cluster and to every consumer. Accepted from a member: relayed to every
consumer.

Memory: the duplicate cache drops entries older than TOLERABLE_LATENCY + max_clock_skew (a
replay of an older chunk is then refused as stale); the stake table drops an epoch
TOLERABLE_LATENCY after it ends (its chunks are all stale by then); each holds at most
max_cached_chunks entries; evidence keeps the last max_evidence records.
Errors: receive_frame never raises for remote input (ChunkRejected event + "rejected.<reason>").
"""
from __future__ import annotations

import bisect
from collections import Counter, OrderedDict, deque

from .crypto import BadSignature, NodeKey, keccak256, recover_address, recover_signer
from .events import AckSent, ChunkRejected, ChunkRelayed, ChunkWitnessed, MarlinEvent, StakeEvidence
from .membership import Membership, MembershipError
from .params import Params
from .wire import (ATTESTATION_LEN, KIND_ACK, KIND_ATTESTED_CHUNK, KIND_CHUNK, SIGNATURE_LEN, Ack, MarlinWireError,
                   decode_frame, encode_chunk_message, encode_frame, parse_chunk_message, peek_chunk_ids)

__all__ = ["ClusterMemberCore", "DUPLICATE_REASONS"]

#: Why a member drops a chunk frame as a duplicate, counted per reason (counters
#: "duplicate.<reason>", `ClusterMemberCore.duplicates()`):
#: replayed_attestation: the exact attestation of a witnessed chunk already relayed (before
#:     any signature check); chunk_seen: another copy of a witnessed chunk already relayed;
#: resent_by_producer: the producer sent a chunk again (acknowledged again, not relayed).
DUPLICATE_REASONS = ("replayed_attestation", "chunk_seen", "resent_by_producer")


class ClusterMemberCore:
    """See the module docstring."""

    def __init__(self, key: NodeKey, membership: Membership, params: Params, cluster_id: int):
        if not membership.is_member(key.address, cluster_id):
            raise MembershipError(f"0x{key.address.hex()} is not a member of cluster {cluster_id}")
        self.key = key
        self.address = key.address
        self.membership = membership
        self.params = params
        self.cluster_id = cluster_id
        self.counters: Counter = Counter()
        self.evidence: deque = deque(maxlen=params.max_evidence)
        self._seen: OrderedDict = OrderedDict()    # (mid, producer, cid) -> (arrival, att signature)
        self._sigs: dict = {}                      # (mid, cid, att signature) -> key in _seen
        # (producer, epoch) -> [sorted stake range starts, [(start, end, record)]] in creation order
        self._stake: OrderedDict = OrderedDict()
        self._stake_entries = 0
        self._out: list = []
        self._events: deque = deque()
        self._horizon = params.tolerable_latency + params.max_clock_skew
        self._peers = [m for m in membership.clusters[cluster_id] if m != key.address]
        self._consumers = list(membership.consumers)

    # ---- input ----------------------------------------------------------------------------
    def receive_frame(self, frame: bytes, peer: bytes, now: float) -> None:
        """One frame from `peer` (20-byte address). Never raises for bad input."""
        self._prune(now)
        ids = (None, None)
        producer = None
        try:
            kind, body = decode_frame(frame, self.params.max_frame)
            if kind not in (KIND_ATTESTED_CHUNK, KIND_CHUNK):
                raise MarlinWireError(f"a cluster member takes chunks, not frame kind {kind}", "unknown_kind")
            mid, channel, cid = peek_chunk_ids(body)
            ids = (mid, cid)
            if kind == KIND_CHUNK and len(body) >= ATTESTATION_LEN and \
                    (mid, cid, bytes(body[ATTESTATION_LEN - SIGNATURE_LEN:ATTESTATION_LEN])) in self._sigs:
                self._duplicate("replayed_attestation")
                return
            producer = self._accept(kind, body, mid, channel, cid, peer, now)
        except MarlinWireError as exc:
            self.counters[f"rejected.{exc.reason}"] += 1
            self._events.append(ChunkRejected("cluster", exc.reason, str(exc), peer, len(frame), ids[0],
                                              producer, ids[1]))

    def _accept(self, kind: int, body, mid: int, channel: int, cid: int, peer: bytes, now: float) -> bytes:
        p = self.params
        cp = p.channels.get(channel)
        if cp is None:
            raise MarlinWireError(f"channel {channel} is not configured", "unknown_channel")
        from_producer = kind == KIND_ATTESTED_CHUNK
        msg = parse_chunk_message(body, witnessed=not from_producer, max_chunk=cp.max_chunk)
        att = msg.attestation
        if cid >= cp.num_chunks:
            raise MarlinWireError(f"chunk id {cid} >= NUM_CHUNKS {cp.num_chunks}", "malformed")
        if now - att.timestamp > p.tolerable_latency:
            raise MarlinWireError(f"chunk timestamp {att.timestamp} is {now - att.timestamp:.1f} s old "
                                  f"(TOLERABLE_LATENCY {p.tolerable_latency} s)", "stale")
        if att.timestamp - now > p.max_clock_skew:
            raise MarlinWireError(f"chunk timestamp {att.timestamp} is {att.timestamp - now:.1f} s ahead",
                                  "future")
        if from_producer and not self.membership.is_producer(peer):
            raise MarlinWireError(f"attested chunk from 0x{peer.hex()}, not a producer", "not_producer")
        chunk = msg.chunk
        chunk_hash = keccak256(chunk)
        try:
            signer = recover_signer(att.signed_data(len(chunk), chunk_hash), att.signature)
        except BadSignature as exc:
            raise MarlinWireError(f"attestation: {exc}", "bad_signature") from None
        if from_producer and signer != peer:
            raise MarlinWireError(f"attestation does not verify as signed by producer 0x{peer.hex()} "
                                  "(forged signature, or chunk/fields not what it signed)", "attestation_mismatch")
        if not self.membership.is_producer(signer):
            raise MarlinWireError(f"attestation recovers to 0x{signer.hex()}, not a known producer",
                                  "unknown_producer")
        message_hash = keccak256(msg.attestation_wire, chunk)
        if not from_producer:
            try:
                witness_by = recover_address(message_hash, msg.witness)
            except BadSignature as exc:
                raise MarlinWireError(f"witness: {exc}", "bad_witness") from None
            if not self.membership.is_member(witness_by, self.cluster_id):
                raise MarlinWireError(f"witness by 0x{witness_by.hex()}, not a member of cluster "
                                      f"{self.cluster_id}", "bad_witness")
        self._check_stake(signer, att, msg.attestation_wire, len(chunk), chunk_hash, mid, cid, now)
        key = (mid, signer, cid)
        if key in self._seen:
            self._duplicate("resent_by_producer" if from_producer else "chunk_seen")
            if from_producer:
                # the producer re-sent a chunk this member already has (its first ack was lost,
                # or another member of the cluster witnessed it): acknowledge again, do not relay
                self._ack(mid, cid, signer, peer, now)
            return signer
        # accepted
        sig = att.signature
        self._seen[key] = (now, sig)
        self._sigs[(mid, cid, sig)] = key
        if len(self._seen) > p.max_cached_chunks:
            self._forget_oldest()
            self.counters["evicted"] += 1
        if from_producer:
            witness = self.key.sign_recoverable(message_hash)
            self._events.append(ChunkWitnessed(mid, signer, cid, self.cluster_id, peer, len(chunk)))
            self._ack(mid, cid, signer, peer, now)
            relay = encode_chunk_message(msg.attestation_wire, witness, chunk)
            for m in self._peers:
                self._out.append((m, relay))
            self.counters["witnessed"] += 1
        else:
            relay = b"".join((bytes((KIND_CHUNK,)), body))
            self.counters["relayed"] += 1
            self._events.append(ChunkRelayed(mid, signer, cid, self.cluster_id, peer, len(chunk)))
        for c in self._consumers:
            self._out.append((c, relay))
        return signer

    def _duplicate(self, reason: str) -> None:
        self.counters["duplicate"] += 1
        self.counters[f"duplicate.{reason}"] += 1

    def duplicates(self) -> dict[str, int]:
        """{reason: chunk frames dropped as duplicates} (see DUPLICATE_REASONS)."""
        return {r: self.counters[f"duplicate.{r}"] for r in DUPLICATE_REASONS}

    def _ack(self, mid: int, cid: int, producer: bytes, peer: bytes, now: float) -> None:
        """seed "acknowledgeMessage": | Message Id | Chunk Id | Cluster Id | Timestamp | Producer Id |
        signed by this member, queued to the producer link."""
        ts = int(now) & 0xFFFFFFFF
        unsigned = Ack(mid, cid, self.cluster_id, ts, producer, b"")
        ack = Ack(mid, cid, self.cluster_id, ts, producer, self.key.sign(unsigned.signed_data()))
        self._out.append((peer, encode_frame(KIND_ACK, ack.wire())))
        self.counters["acks_sent"] += 1
        self._events.append(AckSent(mid, producer, cid, self.cluster_id))

    def _check_stake(self, producer: bytes, att, att_wire: bytes, chunk_len: int, chunk_hash: bytes,
                     mid: int, cid: int, now: float) -> None:
        """The chunk holds stake units [offset, offset + (chunk length + 81) x STAKE_PER_BYTE) of
        its producer's budget for epoch timestamp // refresh_interval; a range overlapping one
        another chunk holds in the same epoch is reuse (the seed's "same stake attached again")."""
        cost = (chunk_len + ATTESTATION_LEN) * self.params.stake_per_byte
        if cost == 0:
            return
        epoch = int(att.timestamp // self.params.refresh_interval)
        start, end = att.stake_offset, att.stake_offset + cost
        if end > self.params.stake_budget:
            raise MarlinWireError(f"stake units {start}..{end} exceed the stake budget {self.params.stake_budget}",
                                  "stake_exceeded")
        record = (mid, cid, att_wire, chunk_len, chunk_hash)
        group = self._stake.get((producer, epoch))
        if group is None:
            group = self._stake[(producer, epoch)] = ([], [])
        starts, items = group
        i = bisect.bisect_right(starts, start)
        for j in (i - 1, i):
            if 0 <= j < len(items):
                s0, e0, prev = items[j]
                if s0 < end and start < e0:         # overlapping ranges
                    if prev[:2] == (mid, cid):      # (this producer's group: same producer)
                        return                      # the same chunk again (a producer re-send)
                    ev = StakeEvidence(producer, epoch, start, prev, record)
                    self.evidence.append(ev)
                    self.counters["stake_evidence"] += 1
                    self._events.append(ev)
                    raise MarlinWireError(
                        f"stake units {start}..{end} of producer 0x{producer.hex()} overlap {s0}..{e0} used by "
                        f"{prev[0]:08x}/{prev[1]} in epoch {epoch}", "stake_reuse")
        starts.insert(i, start)
        items.insert(i, (start, end, record))
        self._stake_entries += 1
        while self._stake_entries > self.params.max_cached_chunks and self._stake:
            _, (_, old) = self._stake.popitem(last=False)
            self._stake_entries -= len(old)
            self.counters["evicted"] += len(old)

    def _forget_oldest(self) -> None:
        (mid, _, cid), (_, sig) = self._seen.popitem(last=False)
        self._sigs.pop((mid, cid, sig), None)

    def _stake_expiry(self, epoch: int) -> float:
        # every chunk of an epoch is stale TOLERABLE_LATENCY after the epoch ends
        return (epoch + 1) * self.params.refresh_interval + self.params.tolerable_latency

    # ---- memory ---------------------------------------------------------------------------
    def _prune(self, now: float) -> None:
        limit = now - self._horizon
        seen = self._seen
        while seen:
            arrival = next(iter(seen.values()))[0]
            if arrival > limit:
                break
            self._forget_oldest()
        while self._stake:
            (producer, epoch), (_, items) = next(iter(self._stake.items()))
            if self._stake_expiry(epoch) > now:
                break
            del self._stake[(producer, epoch)]
            self._stake_entries -= len(items)

    # ---- output ---------------------------------------------------------------------------
    def frames_to_send(self, now: float) -> list[tuple[bytes, bytes]]:
        """Frames queued since the last call: [(address, frame)] (acks to the producer,
        relays to members and consumers)."""
        out, self._out = self._out, []
        return out

    def get_timer(self) -> float | None:
        """When the oldest cache entry expires (unix seconds), or None when empty."""
        firsts = []
        if self._seen:
            firsts.append(next(iter(self._seen.values()))[0] + self._horizon)
        if self._stake:
            firsts.append(self._stake_expiry(next(iter(self._stake))[1]))
        return min(firsts) if firsts else None

    def handle_timer(self, now: float) -> None:
        """Drops expired cache entries."""
        self._prune(now)

    def next_event(self) -> MarlinEvent | None:
        """The next event (events.py), or None."""
        return self._events.popleft() if self._events else None

    def cache_size(self) -> int:
        """Entries in the duplicate cache."""
        return len(self._seen)
