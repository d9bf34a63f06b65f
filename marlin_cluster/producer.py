"""Marlin producer core: no I/O, reads no clock (DESIGN.md section 2).

Seed: marlin-data.txt "Data Entry" (generateMessageId, getChunksFromMessage,
getClusterOptions, clusterSelector, send, attest, getStakeOffset, awaitAck).

    p = ProducerCore(key, membership, params)
    message_id = p.produce(block, channel, now)      # codes, attests, queues every chunk
    for peer, frame in p.frames_to_send(now): ...    # (member address, frame)
    p.receive_frame(frame, peer, now)                # acknowledgements
    p.handle_timer(now) when now >= p.get_timer()    # ack timeouts -> re-send / AckMissing
    while (ev := p.next_event()) is not None: ...    # events.py
    p.missing_acks(message_id) -> [chunk ids without a verified ack]

`now` is unix seconds (float): attestations carry unix timestamps that other nodes compare
with their own clocks (daemons pass time.time()).

Per block: message id = first 4 bytes of the block hash (validate.block_hash); NUM_CHUNKS
chunks (coding.py); per chunk the NO_OF_CLUSTER_OPTIONS clusters closest to
keccak256(messageId, chunkNo) (membership.cluster_options), ordered by the selector; the
candidates are each chosen cluster's members (rotated by chunk id), in that order; the chunk
goes to the first candidate and, after each ack_timeout without a verified acknowledgement,
to the next one (at most max_send_attempts sends). Members that missed an acknowledgement are
tried last for 10 x ack_timeout. Stake: each chunk costs (chunk length + 81) x STAKE_PER_BYTE
units at consecutive stake offsets; the budget restarts each refresh interval (epoch =
timestamp // refresh_interval); a block the remaining budget does not cover is refused
whole (StakeExhausted) and nothing is sent.

Errors: produce raises StakeExhausted, BlockRefused, Backpressure, MarlinConfigError (all
MarlinLocalError). receive_frame never raises for remote input: a bad frame becomes a
ChunkRejected(role="producer") event and a "rejected.<reason>" count.
"""
from __future__ import annotations

import heapq
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

from .coding import coder
from .crypto import BadSignature, NodeKey, keccak256, recover_signer
from .events import (AckMissing, BlockProduced, ChunkAcknowledged, ChunkRejected, ChunkSent,
                     MarlinEvent)
from .membership import Membership, MembershipError
from .params import Params
from .validate import BlockInvalid, message_id_of
from .wire import (ATTESTATION_LEN, KIND_ACK, MarlinLocalError, MarlinWireError, decode_frame,
                   encode_chunk_message, make_attestation, parse_ack, signed_attestation_data)

__all__ = ["ProducerCore", "StakeExhausted", "BlockRefused", "Backpressure", "Selector", "closest_first"]

#: selector(options, message_id, chunk_id) -> clusters to use, in order of preference (a
#: subset of options; a single int means that cluster first, then the other options).
Selector = Callable[[list, int, int], "list[int] | int"]


class StakeExhausted(MarlinLocalError):
    """The stake budget left in this refresh interval does not cover the block."""


class BlockRefused(MarlinLocalError):
    """A block this producer cannot send: empty, larger than max_block, not parseable for its
    channel (no block hash), or already in flight."""


class Backpressure(MarlinLocalError):
    """max_messages messages are still waiting for acknowledgements."""


def closest_first(options: list, message_id: int, chunk_id: int) -> list:
    """The default selector: the options as given (closest cluster id first)."""
    return options


@dataclass
class _Chunk:
    frame: bytes
    offset: int
    candidates: list          # [(cluster id, member address)]
    attempt: int = 0          # sends so far
    first_sent: float = 0.0
    ack: bytes | None = None
    ack_cluster: int | None = None
    given_up: bool = False


@dataclass
class _Message:
    channel: int
    produced_at: float
    chunks: dict = field(default_factory=dict)  # chunk id -> _Chunk
    open: int = 0             # chunks neither acknowledged nor given up
    closed_at: float | None = None


class ProducerCore:
    """See the module docstring."""

    def __init__(self, key: NodeKey, membership: Membership, params: Params, *,
                 selector: Selector | None = None):
        if not membership.cluster_ids:
            raise MembershipError("the membership has no clusters to send chunks to")
        self.key = key
        self.address = key.address
        self.membership = membership
        self.params = params
        self.selector = selector or closest_first
        self.counters: Counter = Counter()
        self._messages: OrderedDict[int, _Message] = OrderedDict()
        self._timers: list = []    # heap of (deadline, seq, kind, message id, chunk id, attempt)
        self._seq = 0
        self._out: list = []
        self._events: deque = deque()
        self._epoch = -1
        self._stake_used = 0
        self._suspect: dict[bytes, float] = {}

    # ---- stake ----------------------------------------------------------------------------
    def duplicates(self) -> dict[str, int]:
        """{reason: frames dropped as duplicates}: "ack", an acknowledgement of a chunk whose
        acknowledgement the producer already holds."""
        return {"ack": self.counters["duplicate_acks"]}

    def stake_left(self, now: float) -> int:
        """Stake units left in the refresh interval containing `now`."""
        epoch = self._epoch_of(int(now))
        return self.params.stake_budget - (self._stake_used if epoch == self._epoch else 0)

    def stake_state(self) -> tuple[int, int]:
        """(epoch, used): the refresh interval the stake counter belongs to (unix seconds //
        refresh_interval; -1 before the first block) and the stake units used in it, i.e. the
        next chunk's stake offset. Save it durably before the block's frames leave, so a
        restart does not reuse offsets (members record reuse as slashing evidence; seed
        "Attestation": "If the same stake is attached again ... the producer will be slashed")."""
        return self._epoch, self._stake_used

    def restore_stake(self, epoch: int, used: int) -> None:
        """Continue a saved stake_state() after a restart: later chunks of `epoch` get offsets
        from `used` up (a block produced in a later epoch starts from 0 as usual). Raises
        MarlinLocalError for an epoch < -1 or `used` outside 0..stake_budget."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < -1:
            raise MarlinLocalError(f"stake epoch {epoch!r} is not an int >= -1")
        if isinstance(used, bool) or not isinstance(used, int) or not 0 <= used <= self.params.stake_budget:
            raise MarlinLocalError(f"stake used {used!r} is not an int in 0..{self.params.stake_budget}")
        self._epoch, self._stake_used = epoch, used

    def _epoch_of(self, ts: int) -> int:
        return int(ts // self.params.refresh_interval)

    # ---- produce --------------------------------------------------------------------------
    def produce(self, block: bytes, channel: int, now: float) -> int:
        """Codes `block` for `channel`, attests every chunk, queues each for its first
        candidate member; returns the message id (uint32). Raises StakeExhausted,
        BlockRefused, Backpressure, MarlinConfigError (unknown channel)."""
        cp = self.params.channel(channel)
        if not block or len(block) > cp.max_block:
            raise BlockRefused(f"block of {len(block)} bytes is outside 1..{cp.max_block}")
        try:
            mid = message_id_of(channel, block)
        except BlockInvalid as exc:
            raise BlockRefused(f"no block hash for channel {channel}: {exc}") from None
        self._expire(now)
        if mid in self._messages:
            raise BlockRefused(f"message {mid:08x} was already produced")
        if len(self._messages) >= self.params.max_messages:
            self._evict_closed()
            if len(self._messages) >= self.params.max_messages:
                raise Backpressure(f"{len(self._messages)} messages still wait for acknowledgements")
        ts = int(now)
        epoch = self._epoch_of(ts)
        if epoch != self._epoch:
            self._epoch, self._stake_used = epoch, 0
        chunks = coder(cp.num_chunks, cp.min_chunks).encode(block)
        spb = self.params.stake_per_byte
        total = sum((len(c) + ATTESTATION_LEN) * spb for c in chunks)
        if self._stake_used + total > self.params.stake_budget:
            self.counters["refused.stake"] += 1
            raise StakeExhausted(f"block needs {total} stake units, {self.params.stake_budget - self._stake_used} "
                                 f"left in this refresh interval")
        msg = _Message(channel, now)
        self._messages[mid] = msg
        self._events.append(BlockProduced(mid, self.address, channel, len(block), len(chunks), total))
        n_opt = self.params.no_of_cluster_options
        for cid, chunk in enumerate(chunks):
            offset = self._stake_used
            self._stake_used += (len(chunk) + ATTESTATION_LEN) * spb
            signed = signed_attestation_data(mid, channel, cid, ts, len(chunk), offset, keccak256(chunk))
            att = make_attestation(mid, channel, cid, ts, offset, self.key.sign(signed))
            frame = encode_chunk_message(att.wire(), None, chunk)
            options = self.membership.options(mid, cid, n_opt)
            msg.chunks[cid] = _Chunk(frame, offset, self._candidates(options, mid, cid, now))
            msg.open += 1
            self._send(mid, cid, now)
        return mid

    def _candidates(self, options: list, mid: int, cid: int, now: float) -> list:
        chosen = self.selector(options, mid, cid)
        if isinstance(chosen, int):
            chosen = [chosen] + [c for c in options if c != chosen]
        out = []
        for c in chosen:
            members = list(self.membership.clusters.get(c, ()))
            if not members:
                continue
            r = cid % len(members)
            out.extend((c, m) for m in members[r:] + members[:r])
        if not out:
            raise MembershipError(f"selector chose no known cluster among {options}")
        # members that recently missed an acknowledgement go last (stable order otherwise)
        return sorted(out, key=lambda cm: self._suspect.get(cm[1], 0.0) > now)

    def _send(self, mid: int, cid: int, now: float) -> None:
        ch = self._messages[mid].chunks[cid]
        cluster, member = ch.candidates[ch.attempt]
        ch.attempt += 1
        if ch.attempt == 1:
            ch.first_sent = now
        self._out.append((member, ch.frame))
        self.counters["chunks_sent"] += 1
        self._events.append(ChunkSent(mid, self.address, cid, cluster, member, len(ch.frame), ch.offset, ch.attempt))
        self._push(now + self.params.ack_timeout, "ack", mid, cid, ch.attempt)

    def _push(self, deadline: float, kind: str, mid: int, cid: int, attempt: int) -> None:
        self._seq += 1
        heapq.heappush(self._timers, (deadline, self._seq, kind, mid, cid, attempt))

    # ---- acknowledgements -----------------------------------------------------------------
    def receive_frame(self, frame: bytes, peer: bytes, now: float) -> None:
        """An acknowledgement from `peer` (20-byte address). Never raises for bad input."""
        mid = cid = None
        try:
            kind, body = decode_frame(frame, self.params.max_frame)
            if kind != KIND_ACK:
                raise MarlinWireError(f"a producer takes acknowledgements, not frame kind {kind}", "unknown_kind")
            ack = parse_ack(body)
            mid, cid = ack.message_id, ack.chunk_id
            if ack.producer != self.address:
                raise MarlinWireError(f"acknowledgement for producer 0x{ack.producer.hex()}", "bad_ack")
            msg = self._messages.get(ack.message_id)
            ch = msg.chunks.get(ack.chunk_id) if msg else None
            if ch is None:
                raise MarlinWireError(f"acknowledgement for chunk {ack.message_id:08x}/{ack.chunk_id} "
                                      "this producer is not sending", "bad_ack")
            if ch.ack is not None:
                self.counters["duplicate_acks"] += 1
                return
            try:
                signer = recover_signer(ack.signed_data(), ack.signature)
            except BadSignature as exc:
                raise MarlinWireError(str(exc), "bad_signature") from None
            sent_to = {c for c, _ in ch.candidates[:ch.attempt]}
            if ack.cluster_id not in sent_to:
                raise MarlinWireError(f"acknowledgement names cluster {ack.cluster_id}, chunk went to "
                                      f"{sorted(sent_to)}", "bad_ack")
            if not self.membership.is_member(signer, ack.cluster_id):
                raise MarlinWireError(f"acknowledgement signed by 0x{signer.hex()}, not a member of cluster "
                                      f"{ack.cluster_id}", "bad_ack")
        except MarlinWireError as exc:
            self.counters[f"rejected.{exc.reason}"] += 1
            self._events.append(ChunkRejected("producer", exc.reason, str(exc), peer, len(frame), mid,
                                              self.address if mid is not None else None, cid))
            return
        ch.ack, ch.ack_cluster = ack.wire(), ack.cluster_id
        self._suspect.pop(signer, None)
        self.counters["acks"] += 1
        self._events.append(ChunkAcknowledged(mid, self.address, cid, ack.cluster_id, signer,
                                              (now - ch.first_sent) * 1000.0, ch.ack))
        if not ch.given_up:   # a late ack after giving up is held too; the chunk was closed then
            self._close_chunk(msg, mid, now)

    def _close_chunk(self, msg: _Message, mid: int, now: float) -> None:
        msg.open -= 1
        if msg.open == 0:
            msg.closed_at = now
            self._push(now + self.params.ack_retention, "purge", mid, -1, 0)

    # ---- timers ---------------------------------------------------------------------------
    def get_timer(self) -> float | None:
        """The earliest deadline (unix seconds) handle_timer must run at, or None."""
        while self._timers and not self._live(self._timers[0]):
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def _live(self, entry) -> bool:
        _, _, kind, mid, cid, attempt = entry
        msg = self._messages.get(mid)
        if msg is None:
            return False
        if kind == "purge":
            return msg.closed_at is not None
        ch = msg.chunks[cid]
        return ch.ack is None and not ch.given_up and ch.attempt == attempt

    def handle_timer(self, now: float) -> None:
        """Ack timeouts: AckMissing, then a re-send to the next candidate or give up
        (final); purges closed messages after ack_retention."""
        while self._timers and self._timers[0][0] <= now:
            entry = heapq.heappop(self._timers)
            if not self._live(entry):
                continue
            _, _, kind, mid, cid, attempt = entry
            msg = self._messages[mid]
            if kind == "purge":
                del self._messages[mid]
                continue
            ch = msg.chunks[cid]
            cluster, member = ch.candidates[attempt - 1]
            self._suspect[member] = now + 10 * self.params.ack_timeout
            final = attempt >= min(self.params.max_send_attempts, len(ch.candidates))
            self.counters["ack_missing"] += 1
            self._events.append(AckMissing(mid, self.address, cid, cluster, member, attempt, final))
            if final:
                ch.given_up = True
                self.counters["ack_missing_final"] += 1
                self._close_chunk(msg, mid, now)
            else:
                self._send(mid, cid, now)
        if len(self._suspect) > 4 * len(self.membership.members) + 16:
            self._suspect = {m: t for m, t in self._suspect.items() if t > now}

    def _expire(self, now: float) -> None:
        if self._timers and self._timers[0][0] <= now:
            self.handle_timer(now)

    def _evict_closed(self) -> None:
        for mid in [m for m, msg in self._messages.items() if msg.closed_at is not None]:
            del self._messages[mid]
            if len(self._messages) < self.params.max_messages:
                return

    # ---- output ---------------------------------------------------------------------------
    def frames_to_send(self, now: float) -> list[tuple[bytes, bytes]]:
        """Frames queued since the last call: [(member address, frame)]."""
        out, self._out = self._out, []
        return out

    def next_event(self) -> MarlinEvent | None:
        """The next event (events.py), or None."""
        return self._events.popleft() if self._events else None

    # ---- queries --------------------------------------------------------------------------
    def missing_acks(self, message_id: int) -> list[int]:
        """Chunk ids of `message_id` without a verified acknowledgement (sorted); [] for a
        message this producer does not (or no longer) track."""
        msg = self._messages.get(message_id)
        if msg is None:
            return []
        return sorted(cid for cid, ch in msg.chunks.items() if ch.ack is None)

    def acks(self, message_id: int) -> dict[int, bytes]:
        """{chunk id: the 97-byte signed acknowledgement held} for `message_id`."""
        msg = self._messages.get(message_id)
        return {cid: ch.ack for cid, ch in msg.chunks.items() if ch.ack is not None} if msg else {}

    def messages(self) -> list[int]:
        """Message ids this producer tracks (in flight or retained)."""
        return list(self._messages)
