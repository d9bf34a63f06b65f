"""The REMP validator node core: RMQs, message cache, shard and masterchain consensus,
session switches and signed receipts, composed behind one datagram API. No I/O, no clock.

Sources: DESIGN.md sections 2 and 4; seeds/remp-overview.md (statuses, RMQ, message cache,
forwarding); seeds/remp-protocol-b.txt (status sequences, "Rejection sequences").

What one `ValidatorCore` runs (the core modules underneath):
- per shard and master session N where it is a member: a ReliableMessageQueue over a
  Catchain (members = current group + previous session's group, schedule.py);
- per shard and session where it is in the current group: a BlockConsensus for the shard
  chain; the round leader collates the oldest pending messages of the RMQ, executing them on
  a copy of its shard state (state.ShardState); failed executions -> RejectedByCollator with
  the executor's error text; validators re-execute and refuse candidates holding a message
  that is already in an accepted block (cache.MessageCache.block_refusal);
- one BlockConsensus for the masterchain (member or observer); a master block commits
  accepted shard blocks by carrying their commit certificates (consensus.Commit datagrams),
  checked with consensus.verify_commit against the shard's group -> Finalized;
- master session switch at schedule.session_start(N): groups for N are seeded by the first
  master block of session N-1 ("start block", genesis for N <= 1); pending RMQ messages are
  forwarded to the new RMQ (rmq.forward_records), the message cache is garbage collected
  (a message received in N is dropped at N+2; unfinished ones get Timeout from every
  validator that said New, except while a live block still decides them: a candidate of a
  live shard session, or an accepted shard block the masterchain may yet commit; those end
  with their block, Finalized if committed, else Timeout; see `_end_held`). The shard chain of session N starts on top of the shard block
  committed by the start block of N; accepted shard blocks of older sessions that it did not
  commit are orphaned (their messages: IgnoredByMasterchain, back to the queue).

Session rule for master blocks (ours): a master block carries a session tag (the
collator's master_session_at(now)), tags never decrease, and a master block may only commit
shard blocks whose session tag is >= the tag of the previous master block (so the start
block of N takes the last blocks of N-1, and nothing of N-1 can be committed after it).

Receipts: every status of every message this validator handles is signed
(receipts.make_signed_receipt) and sent to the full node(s) the message came from (the
origin travels in RMQ records and shard blocks). Sequence per validator for a finalized
message: PutIntoQueue (New), AcceptedByQueue, IncludedIntoBlock, IncludedIntoAcceptedBlock,
Finalized. Each status is signed once: the journal keeps every signed receipt
(ValidatorJournal.receipts) for the message's lifetime, and a validator restarted from it,
which learns the messages of its queue again from the RMQ and meets them again in blocks,
sends the receipt it signed before the crash for such a status (same bytes, same digest),
never a second signature with a new timestamp.

Receipt flushing (known difference, kept on purpose): every receipt goes out at once as its
own `tonNode.rempSignedReceipt` datagram (about 5 per validator per finalized message). The
reference (ever-node `src/network/remp.rs`, receipts worker) keeps only the LAST receipt per
(full node, message), re-sends a message's update no sooner than 0 / 1 / 2 / 5 s after the
previous one, and every 100 ms packs pending ones into one unsigned `tonNode.rempCombinedReceipt
source_id ids:(vector tonNode.blockIdExt) receipts:(vector tonNode.RempReceiptCompact)`
datagram, sent when it would pass 768 bytes or 1 s after the previous packet to that node.
So the reference saves datagrams but may skip intermediate statuses; we send every status,
signed (receipts.py verifies each one end to end), within the "receipt flush <= 1 s" bound
of DESIGN.md section 4. Batching would need the compact TL, one signature per packet and a
flush timer in this core; it changes datagram counts only, no status. Not done.

Multiplexing: every datagram between REMP nodes starts with a 33-byte prefix: one channel
kind byte (CH_CLIENT, CH_RMQ, CH_SHARD, CH_MASTER, CH_ANNOUNCE, CH_MASTER_REF,
CH_COMMIT_NEED) and the 32-byte session id of the sub-protocol instance (zeros for
CH_CLIENT, CH_ANNOUNCE and CH_COMMIT_NEED). `mux`/`demux` are the helpers
(remp_node/wire/node_tl.py, with the block payload codecs and the reference bodies); a full node wraps
its wire.py datagrams with CH_CLIENT.

Shard commits by reference: a master block commits shard blocks by carrying their commit
certificates (consensus.Commit: the candidate with its message bodies + the precommits).
Every masterchain member already holds them (its own group accepted the block, or two group
members announced it, CH_ANNOUNCE), so a master proposal or commit datagram to another
masterchain member goes as CH_MASTER_REF (same session id): `encode_refs` segments, literal
bytes and the sha256 of each shard commit of >= MIN_REF_BYTES. The receiver rebuilds the
exact CH_MASTER bytes from the commits it keeps by hash (KEEP_RAW_COMMITS) and feeds them to
the master consensus, which checks every signature as before (a reference cannot forge
anything: the rebuilt bytes are what the leader signed, or they fail). A member lacking a
commit parks the datagram (MAX_PARKED) and sends CH_COMMIT_NEED (`count:int` + hashes) to the
sender, at most once per NEED_RETRY per commit; the sender answers each with a CH_ANNOUNCE of
the commit, after which the parked datagrams are fed. Non-members (the full node's follower)
get whole CH_MASTER datagrams; the journal keeps whole master commits.

Errors: remote garbage never raises out of receive_datagram (it becomes a `Dropped` event);
local misuse raises ValidatorError.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

from . import consensus as cons
from .cache import AddResult, CacheStatus, MessageCache
from ..errors import RempLocalError
from ..wire.keys import NodeKey, key_id
from ..wire.messages import MessageRejected, parse_external_message
from ..wire.receipts import (Accepted, Duplicate, Ignored, Level, New, Rejected, SignedReceipt, Timeout,
                       make_signed_receipt, truncate_error)
from .rmq import (MessageAcceptedByQueue, MessageDuplicate, MessageQueued, MessageRejectedByQueue,
                  RecordDropped, ReliableMessageQueue, SourceBlamed)
from .schedule import (GENESIS_MASTER_HASH, ZeroStateConfig, masterchain_members, master_session_at,
                       session_start, shard_groups)
from ..wire.shards import FULL_SHARD, MASTERCHAIN_KEY, MASTERCHAIN_WORKCHAIN, shard_contains
from .state import ShardState, ZeroState
from ..wire.tl import ZERO_BLOCK_ID, BlockIdExt
from ..wire.packets import RempMessageDatagram, WireError, decode_datagram, encode_receipt
# the node's own wire objects (channel prefix, block payloads, shard commits by reference) are
# codecs in wire/node_tl.py; re-exported here for existing importers
from ..wire.node_tl import (CH_ANNOUNCE, CH_CLIENT, CH_COMMIT_NEED, CH_MASTER, CH_MASTER_REF,  # noqa: F401
                            CH_RMQ, CH_SHARD, CHANNEL_NAMES, MASTER_BLOCK, MAX_REFS, MAX_SHARD_PAYLOAD, PREFIX,
                            SHARD_BLOCK, ZERO32, BlockMessage, CommitRef, MasterPayload, PayloadError,
                            ShardPayload, decode_commit_need, decode_master_block, decode_refs,
                            decode_shard_payload, demux, encode_commit_need, encode_master_block, encode_refs,
                            encode_shard_payload, mux)

__all__ = ["ValidatorCore", "ValidatorError", "ValidatorJournal", "JournalEntry", "ValidatorEvent", "ReceiptSent", "ForkBlamed",
           "ShardBlockAccepted", "MasterBlockAccepted", "SessionStarted", "Dropped",
           "mux", "demux", "CH_CLIENT", "CH_RMQ", "CH_SHARD", "CH_MASTER", "CH_ANNOUNCE",
           "encode_shard_payload", "decode_shard_payload", "encode_master_block", "decode_master_block"]

#: most messages a collator puts into one shard block
MAX_BLOCK_MESSAGES = 64
#: most message bytes (BOCs) a collator puts into one block: a candidate travels in every
#: proposal, commit and master block, so its size multiplies the datagram parts on the wire,
#: and a payload arrives only when every part does (0.8 ** parts under 20% loss: 4 parts
#: 41%, 14 parts 4% per attempt). 4 KiB keeps a shard proposal at <= 4 parts of 1,232 bytes;
#: one message larger than it still goes alone.
MAX_BLOCK_BYTES = 4 * 1024
#: most shard commit bytes (consensus.Commit datagrams, each carrying its shard candidate)
#: one master block carries; the rest go in the next master blocks (oldest first, shards in
#: turn); one bigger commit still goes alone. Between masterchain members a master proposal
#: or commit carries the shard commits by reference (CH_MASTER_REF: 32 bytes each, the
#: members hold them from their group or its announces), so this bounds the full master
#: block (journal, catch-up, the full node's follower), not the proposals' parts. It was
#: 4 KiB while proposals carried the commits whole (36 KB proposals of 32 parts stalled the
#: masterchain under 20% part loss, tests/test_remp_master_fragments.py), and that cap was
#: the network's throughput limit: ~12 wallet messages per master block (~20 msg/s).
MAX_MASTER_COMMIT_BYTES = 32 * 1024
#: client messages buffered while no RMQ of their shard exists on this node
MAX_EARLY = 4096
#: message ids remembered as sent to this validator by a full node itself (received_directly)
MAX_DIRECT = 65536
#: how many shard group members announce each accepted shard block's commit to one
#: masterchain member outside the group
ANNOUNCE_COPIES = 2
#: shard commits kept by sha256 (the references of CH_MASTER_REF datagrams; own group's
#: accepted blocks, announces, master blocks seen)
KEEP_RAW_COMMITS = 2048
#: shard commits of at least this many bytes travel by reference in CH_MASTER_REF datagrams
MIN_REF_BYTES = 200
#: CH_MASTER_REF datagrams held while the shard commits they reference are fetched
MAX_PARKED = 64
#: seconds before the same commit is asked from the same member again (CH_COMMIT_NEED)
NEED_RETRY = 0.2
#: verified shard commits kept (raw bytes -> _ShardCommit): a commit is checked on its
#: announce, in each master proposal carrying it and again when that master block is
#: accepted; its q ed25519 signatures are verified once
KEEP_VERIFIED_COMMITS = 512


class ValidatorError(RempLocalError):
    """Local misuse of the validator core."""


@dataclass(frozen=True)
class _ShardCommit:
    block_id: BlockIdExt
    prev: BlockIdExt
    payload: ShardPayload
    raw: bytes


# --- events ----------------------------------------------------------------------------------------

class ValidatorEvent:
    """Base class of validator core events."""


@dataclass(frozen=True)
class ReceiptSent(ValidatorEvent):
    """A signed receipt this validator produced. kind: JSON kind; message_id: 32 bytes;
    dst: full node key ids it was sent to; shard: shard ident; signed: receipts.SignedReceipt;
    status: the status object it carries (None: read it from signed)."""

    message_id: bytes
    kind: str
    shard: int
    dst: tuple[bytes, ...]
    signed: object
    reason: str = ""
    status: object = None       # the receipts.* status signed (signed.open().status, unparsed)


@dataclass(frozen=True)
class ForkBlamed(ValidatorEvent):
    """An RMQ catchain proved that `source` (key id) signed two blocks at one height."""

    shard: int
    session: int
    source: bytes
    proof: object


@dataclass(frozen=True)
class ShardBlockAccepted(ValidatorEvent):
    block_id: BlockIdExt
    session: int
    messages: tuple[bytes, ...]


@dataclass(frozen=True)
class MasterBlockAccepted(ValidatorEvent):
    """A master block; shard_blocks: the shard block ids it committed; messages: their
    message ids."""

    block_id: BlockIdExt
    session: int
    shard_blocks: tuple[BlockIdExt, ...]
    messages: tuple[bytes, ...]


@dataclass(frozen=True)
class SessionStarted(ValidatorEvent):
    """This node switched to master session `session`; roles: shard -> "current" |
    "previous" membership of its RMQ."""

    session: int
    roles: dict


@dataclass(frozen=True)
class Dropped(ValidatorEvent):
    """Remote input dropped: channel name, source key id, reason."""

    channel: str
    src: bytes
    reason: str


@dataclass
class ValidatorJournal:
    """What a validator must find again after a crash (store.py keeps it in SQLite; sim.py
    in memory). master_commits: seqno -> the commit certificate (consensus.Commit datagram,
    verifiable with the members' keys) of every accepted master block, so a restarted
    validator rebuilds its chain view, shard states and message cache by replaying them;
    signed_heights: consensus session id -> the highest height it signed a proposal or vote
    at (BlockConsensus.mute_through after a restart: no equivocation); authored: RMQ
    catchain session ids it signed blocks in (Catchain.mute after a restart: no fork);
    rejected: message id -> (uid, master session received in) of every message its
    collator rejected (a final RejectedByCollator: a restarted validator replaying its RMQ
    must not take the message up again; seed remp-protocol-b, "Rejection sequences": after
    all rejects "nobody will try to collate the message"); receipts: (message id, status
    TL bytes, receipts.RempStatus.pack()) -> (master session the message was received in,
    the boxed tonNode.rempSignedReceipt bytes) of every status it signed: a restarted
    validator learns the messages of its queue again (RMQ records, blocks) and sends for a
    status it signed before the receipt it signed then, never a second one with a new
    timestamp (a different digest for the same status)."""

    master_commits: dict[int, bytes] = field(default_factory=dict)
    signed_heights: dict[bytes, int] = field(default_factory=dict)
    authored: set[bytes] = field(default_factory=set)
    rejected: dict[bytes, tuple[bytes, int]] = field(default_factory=dict)
    receipts: dict[tuple[bytes, bytes], tuple[int, bytes]] = field(default_factory=dict)

    def apply(self, entries: "list[JournalEntry]") -> None:
        """Add journal_updates() output (what a store writes)."""
        for e in entries:
            if e.kind == "master_commit":
                self.master_commits[e.key] = e.value
            elif e.kind == "signed_height":
                self.signed_heights[e.key] = max(e.value, self.signed_heights.get(e.key, 0))
            elif e.kind == "authored":
                self.authored.add(e.key)
            elif e.kind == "rejected":
                self.rejected[e.key] = e.value
            elif e.kind == "rejected_gc":
                for mid in [m for m, (_, n) in self.rejected.items() if n <= e.key]:
                    del self.rejected[mid]
            elif e.kind == "receipt":
                self.receipts.setdefault(e.key, e.value)
            elif e.kind == "receipts_gc":
                for k in [k for k, (n, _) in self.receipts.items() if n <= e.key]:
                    del self.receipts[k]


@dataclass(frozen=True)
class JournalEntry:
    """One durable fact from ValidatorCore.journal_updates(). kind: "master_commit" (key:
    seqno int, value: commit bytes), "signed_height" (key: consensus session id, value:
    height int), "authored" (key: catchain session id, value: None), "rejected" (key:
    message id, value: (uid, master session it was received in)): this node's collator
    rejected it (final), "rejected_gc" (key: master session s): the "rejected" entries of
    sessions <= s are obsolete (message lifetime over) and may be deleted; "receipt" (key:
    (message id, status TL bytes), value: (master session the message was received in,
    signed receipt bytes)): a receipt this node signed, "receipts_gc" (key: master session
    s): the "receipt" entries of sessions <= s are obsolete. The two receipt kinds are as
    durable as the receipt outbox (store.py: SIGKILL-safe, not fsynced per commit): a host
    crash that loses the last ones loses their outbox rows too, and those statuses are
    signed again, as before this journal kept receipts."""

    kind: str
    key: object
    value: object = None


@dataclass
class _Ann:
    """What this validator told the full nodes about one message."""

    origins: set = field(default_factory=set)
    said_new: bool = False
    said_queue: bool = False    # Accepted(QUEUE) sent: the RMQ accepts a message once per record
    ended: bool = False         # source-final (Rejected*/Timeout/Finalized) on this node
    last: object = None         # last SignedReceipt
    shard: int = 0
    master_seqno: int = 0


@dataclass
class _ShardSession:
    shard: int
    session: int
    consensus: object
    tip: ShardState
    accepted: list = field(default_factory=list)     # _ShardCommit of this session, uncommitted
    collated: set = field(default_factory=set)       # message ids in candidates of this session


class ValidatorCore:
    """One validator. ValidatorCore(key, config, zerostate, *, catchain_factory,
    full_nodes=None, rmq_block_interval=0.05, shard_round_timeout=0.6,
    master_round_timeout=1.0, master_block_interval=None, wall_clock=lambda now: now,
    journal=None, master_commit_bytes=MAX_MASTER_COMMIT_BYTES).

    config: schedule.ZeroStateConfig (validators, shards, group size, mc_catchain_lifetime,
    block_interval, genesis_time); zerostate: state.ZeroState (the node's own copy is
    taken); catchain_factory(session_id, members, local, block_interval=...) -> Catchain;
    full_nodes: key id -> public key of full nodes whose rempMessage signatures are checked
    (None: accept any sender, signature unchecked). Times in seconds; `wall_clock(now)` ->
    Unix seconds for receipts and the executor. journal: the ValidatorJournal a store kept
    (an empty one at a first start); with one, the core also records every receipt it signs
    for journal_updates(); None: a core that keeps no journal (its caller never drains
    journal_updates(): the signed receipts are not recorded, they would only pile up).
    """

    def __init__(self, key: NodeKey, config: ZeroStateConfig, zerostate: ZeroState, *,
                 catchain_factory: Callable[..., object], full_nodes: dict[bytes, bytes] | None = None,
                 rmq_block_interval: float = 0.05, shard_round_timeout: float = 0.6,
                 master_round_timeout: float = 1.0, master_block_interval: float | None = None,
                 wall_clock: Callable[[float], float] = lambda now: now,
                 journal: ValidatorJournal | None = None, master_commit_bytes: int = MAX_MASTER_COMMIT_BYTES):
        if key.public not in [v.public_key for v in config.validators]:
            raise ValidatorError("key is not a validator of the zerostate config")
        self.key = key
        self.cfg = config
        self.workchain = config.workchain
        self.master_commit_bytes = master_commit_bytes
        # restart: what the journal says this node signed before (module doc, "Restarts")
        self._restored = journal or ValidatorJournal()
        self._replay: dict[int, bytes] | None = dict(self._restored.master_commits) or None
        self._replaying = False
        self._j_master = max(self._restored.master_commits, default=0)
        self._j_signed: dict[bytes, int] = dict(self._restored.signed_heights)
        self._j_authored: set[bytes] = set(self._restored.authored)

        def _catchain(session_id, members, local, **kw):
            c = catchain_factory(session_id, members, local, **kw)
            if session_id in self._restored.authored and hasattr(c, "mute"):
                c.mute()
            return c
        self.catchain_factory = _catchain
        self.full_nodes = full_nodes
        self.rmq_block_interval = rmq_block_interval
        self.shard_round_timeout = shard_round_timeout
        self.master_round_timeout = master_round_timeout
        self.master_block_interval = master_block_interval if master_block_interval is not None else config.block_interval
        self.wall_clock = wall_clock
        self.cache = MessageCache()
        self.bodies: dict[bytes, bytes] = {}
        self._parsed: dict[bytes, object] = {}
        # the same entries by BOC bytes (kept with _parsed): a message the full node sent here
        # came back in the RMQ's record check (_check_body) and was parsed a second time
        self._parsed_boc: dict[bytes, object] = {}
        self.ann: dict[bytes, _Ann] = {}
        #: ids of messages a full node sent to this validator itself (tonNode.rempMessage on
        #: the client channel), newest last, at most MAX_DIRECT: received_directly()
        self._direct: OrderedDict[bytes, None] = OrderedDict()
        # messages this node's collator rejected before a restart: REJECTED in the cache (never
        # collated again by this node; pending() skips them) and already answered (no second
        # PutIntoQueue, no Timeout); the session switches' cache.gc drops them as usual
        self._j_rejected: list[JournalEntry] = []
        for mid, (uid, seqno) in self._restored.rejected.items():
            if self.cache.add(mid, uid, seqno).result is AddResult.NEW:
                self.cache.set_status(mid, CacheStatus.REJECTED)
            self.ann[mid] = _Ann(said_new=True, ended=True, master_seqno=seqno)
        # receipts signed before a restart, (message id, status bytes) -> (session, signed
        # receipt bytes): the first time this run produces one of these statuses again, the
        # receipt signed then goes out again instead of a new signature (_send_receipt)
        self._signed_before: dict[tuple[bytes, bytes], tuple[int, bytes]] = dict(self._restored.receipts)
        self._j_receipts: list[JournalEntry] = []
        self._keep_receipts = journal is not None
        self.committed = {s: zerostate.states[s].copy() for s in config.shards}
        #: the masterchain's accounts as committed by accepted master blocks (item 4)
        self.mc_committed: ShardState = zerostate.masterchain.copy()
        self.tops = {s: BlockIdExt(self.workchain, s, 0, ZERO32, ZERO32) for s in config.shards}
        self.validator_keys = {v.key_id: v.public_key for v in config.validators}
        # master chain view
        self.master_members = masterchain_members(config)
        self.master_ids = [key_id(m) for m in self.master_members]
        self.master_tag = -1                    # session tag of the last master block
        self.master_blocks: list[tuple[BlockIdExt, MasterPayload]] = []
        self.start_blocks: dict[int, bytes] = {0: GENESIS_MASTER_HASH}   # session -> start block hash
        self._groups: dict[int, dict[int, list[bytes]]] = {}
        self.master: cons.BlockConsensus | None = None
        self._known_commits: dict[int, dict[int, _ShardCommit]] = {s: {} for s in config.shards}
        self._verified_commits: dict[bytes, _ShardCommit] = {}
        #: signatures this node found valid, shared by its consensus sessions and its shard
        #: commit checks (consensus.SignatureMemo: each member's copy of a commit carries its
        #: own subset of the same precommit signatures)
        self.sig_memo = cons.SignatureMemo()
        # shard commits by reference between masterchain members (module doc)
        self._master_id_set = set(self.master_ids)
        self._raws: OrderedDict[bytes, bytes] = OrderedDict()          # sha256 -> raw shard commit
        self._parked: deque[tuple[bytes, bytes, list]] = deque()      # (src, session id, segments)
        self._need_at: dict[tuple[bytes, bytes], float] = {}          # (member, hash) -> last asked
        self._compact_memo: OrderedDict[bytes, bytes | None] = OrderedDict()
        # sessions
        self.session = -1
        self.rmqs: dict[tuple[int, int], ReliableMessageQueue] = {}
        self._rmq_by_sid: dict[bytes, ReliableMessageQueue] = {}
        self.shard_sessions: dict[tuple[int, int], _ShardSession] = {}
        self._shard_by_sid: dict[bytes, _ShardSession] = {}
        self._early: list[tuple[object, bytes, float]] = []
        self._held: set[bytes] = set()      # obsolete messages a live block still decides (_end_held)
        self.blamed: set[bytes] = set()
        self._out: list[tuple[bytes, bytes]] = []
        self._events: deque[ValidatorEvent] = deque()
        self._now = 0.0
        self.crashed = False
        self.stats = {"receipts": 0, "shard_blocks": 0, "master_blocks": 0, "collator_rejects": 0,
                      "orphaned_blocks": 0, "dropped": 0, "held": 0, "master_ref_out": 0, "master_ref_in": 0,
                      "master_ref_parked": 0, "commit_needs": 0, "commits_resent": 0,
                      "receipts_kept": 0}

    # -- restarts ------------------------------------------------------------------------------
    def _mute_restored(self, c) -> None:
        h = self._restored.signed_heights.get(c.session_id)
        if h:
            c.mute_through(h)

    def _replay_master(self, now: float) -> None:
        """Feed the journal's master commit certificates to the master consensus, in seqno
        order, as if a peer sent them (each is verified again); the accepted blocks rebuild
        tops, shard states, the masterchain state, the message cache and the session seeds.
        No receipt goes out for this history."""
        commits, self._replay = self._replay or {}, None
        src = next((m for m in self.master_ids if m != self.key.key_id), self.key.key_id)
        self._replaying = True
        try:
            for seqno in sorted(commits):
                self.master.receive_datagram(commits[seqno], src, now)
                while (ev := self.master.next_event()) is not None:
                    self._on_master_event(ev, now)
        finally:
            self._replaying = False
        self.stats["replayed_master_blocks"] = self.master.height - 1

    def journal_updates(self) -> list[JournalEntry]:
        """Durable facts produced since the last call (see ValidatorJournal). A daemon calls
        this after datagrams_to_send and writes the entries to its store (fsync) BEFORE it
        sends those datagrams: a vote, a catchain block or a receipt that depends on them
        never leaves first."""
        out: list[JournalEntry] = []
        m = self.master
        if m is not None:
            for seqno in range(self._j_master + 1, m.height):
                raw = m.commit_for(seqno)
                if raw is not None:
                    out.append(JournalEntry("master_commit", seqno, raw))
            self._j_master = max(self._j_master, m.height - 1)
        for c in [m] + [s.consensus for s in self.shard_sessions.values()]:
            if c is not None and c.signed_height > self._j_signed.get(c.session_id, 0):
                self._j_signed[c.session_id] = c.signed_height
                out.append(JournalEntry("signed_height", c.session_id, c.signed_height))
        for q in self.rmqs.values():
            if q.session_id not in self._j_authored and getattr(q.catchain, "authored", False):
                self._j_authored.add(q.session_id)
                out.append(JournalEntry("authored", q.session_id))
        if self._j_rejected:
            out.extend(self._j_rejected)
            self._j_rejected = []
        if self._j_receipts:
            out.extend(self._j_receipts)
            self._j_receipts = []
        return out

    # -- schedule ------------------------------------------------------------------------------
    def groups(self, session: int) -> dict[int, list[bytes]] | None:
        """shard -> current group public keys of master session `session`, or None while
        the seed (start block of session-1) is unknown to this node."""
        g = self._groups.get(session)
        if g is not None:
            return g
        if session < 0:
            return {s: [] for s in self.cfg.shards}
        seed = GENESIS_MASTER_HASH if session <= 1 else self.start_blocks.get(session - 1)
        if seed is None:
            return None
        g = shard_groups(self.cfg, session, seed)
        self._groups[session] = g
        return g

    def client_groups(self, shard: int, now: float) -> tuple[list[bytes], list[bytes]]:
        """(current, next) groups of `shard` as this node sees them at `now` (for a full
        node's RempClient.groups): next is given during the last 20% of a session."""
        if shard == MASTERCHAIN_KEY:
            return list(self.master_members), []
        n = max(self.session, 0)
        cur = (self.groups(n) or {}).get(shard, [])
        nxt: list[bytes] = []
        if now >= session_start(self.cfg, n + 1) - 0.2 * self.cfg.mc_catchain_lifetime:
            g = self.groups(n + 1)
            if g is not None:
                nxt = [k for k in g[shard] if k not in cur]
        return list(cur), nxt

    # -- datagram API -------------------------------------------------------------------------
    def receive_datagram(self, data: bytes, src: bytes, now: float) -> None:
        """One datagram addressed to this node (mux prefix first). Never raises for remote input."""
        self._advance(now)
        try:
            kind, sid, body = demux(data)
        except ValueError as exc:
            self._drop("mux", src, str(exc))
            return
        if kind == CH_CLIENT:
            self._on_client(body, src, now)
        elif kind == CH_RMQ:
            q = self._rmq_by_sid.get(sid)
            if q is None:
                self._drop("rmq", src, "unknown RMQ session")
            else:
                q.receive_datagram(body, src, now)
        elif kind == CH_SHARD:
            s = self._shard_by_sid.get(sid)
            if s is None:
                self._drop("shard", src, "unknown shard consensus session")
            else:
                s.consensus.receive_datagram(body, src, now)
        elif kind == CH_MASTER:
            if self.master is None or sid != self.master.session_id:
                self._drop("master", src, "unknown master session")
            else:
                self.master.receive_datagram(body, src, now)
        elif kind == CH_ANNOUNCE:
            self._on_announce(body, src)
            self._retry_parked(now)
        elif kind == CH_MASTER_REF:
            self._on_master_ref(sid, body, src, now)
        elif kind == CH_COMMIT_NEED:
            self._on_commit_need(body, src)
        else:
            self._drop("mux", src, f"unknown channel kind {kind}")
        self._pump(now)

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, bytes]]:
        self._advance(now)
        self._pump(now)
        out, self._out = self._out, []
        for q in list(self.rmqs.values()):
            out.extend((dst, mux(CH_RMQ, q.session_id, d)) for dst, d in q.datagrams_to_send(now))
        for s in list(self.shard_sessions.values()):
            out.extend((dst, mux(CH_SHARD, s.consensus.session_id, d)) for dst, d in s.consensus.datagrams_to_send(now))
        if self.master is not None:
            sid = self.master.session_id
            for dst, d in self.master.datagrams_to_send(now):
                ref = self._compact(d) if dst in self._master_id_set else None
                out.append((dst, mux(CH_MASTER, sid, d) if ref is None else mux(CH_MASTER_REF, sid, ref)))
        self._pump(now)
        out.extend(self._out)
        self._out = []
        return out

    def get_timer(self) -> float | None:
        # scanned twice per daemon step (before: is anything due; after: the next wake-up):
        # a running minimum, no temporary list
        m = session_start(self.cfg, self.session + 1) if self.session >= 0 else self._now
        for q in self.rmqs.values():
            t = q.get_timer()
            if t is not None and t < m:
                m = t
        for s in self.shard_sessions.values():
            t = s.consensus.get_timer()
            if t is not None and t < m:
                m = t
        if self.master is not None:
            t = self.master.get_timer()
            if t is not None and t < m:
                m = t
        return m

    def handle_timer(self, now: float) -> None:
        self._advance(now)
        for q in list(self.rmqs.values()):
            t = q.get_timer()
            if t is not None and t <= now:
                q.handle_timer(now)
        for s in list(self.shard_sessions.values()):
            t = s.consensus.get_timer()
            if t is not None and t <= now:
                s.consensus.handle_timer(now)
        if self.master is not None:
            t = self.master.get_timer()
            if t is not None and t <= now:
                self.master.handle_timer(now)
        self._pump(now)

    def next_event(self) -> ValidatorEvent | None:
        return self._events.popleft() if self._events else None

    # -- time and sessions ----------------------------------------------------------------------
    def _advance(self, now: float) -> None:
        self._now = now
        if self.master is None:
            self.master = cons.BlockConsensus(
                -1, cons.MASTER_SHARD, self.master_members, self.key, start_seqno=1, prev_block_id=None,
                round_timeout=self.master_round_timeout, block_interval=self.master_block_interval,
                collate=self._collate_master, validate=self._validate_master, start_time=now,
                sig_memo=self.sig_memo)
            self._mute_restored(self.master)
        if self._replay is not None:
            self._replay_master(now)
        if self._replaying:
            # no session switch in the middle of the journal replay: the shard sessions
            # would start on a half-replayed committed state (a stale collator tip)
            return
        target = master_session_at(self.cfg, now)
        while self.session < target:
            if not self._switch(self.session + 1, now):
                break

    def _switch(self, n: int, now: float) -> bool:
        """Enter master session n (RMQs, forwarding, GC). False while the seed is unknown."""
        groups = self.groups(n)
        prev_groups = self.groups(n - 1)
        if groups is None or prev_groups is None:
            return False
        old = self.session
        self.session = n
        roles = {}
        for shard in self.cfg.shards:
            cur, prev = groups[shard], prev_groups[shard]
            if self.key.public not in cur and self.key.public not in prev:
                continue
            roles[shard] = "current" if self.key.public in cur else "previous"
            q = ReliableMessageQueue(
                self.workchain, shard, n, cur, prev, self.key, self.cache, self._parse,
                self.catchain_factory, block_interval=self.rmq_block_interval, bodies=self.bodies,
                shard_check=lambda p, s=shard: self._in_shard(p, s))
            self.rmqs[(shard, n)] = q
            self._rmq_by_sid[q.session_id] = q
            oldq = self.rmqs.get((shard, old))
            if oldq is not None and oldq.local_is_current:
                q.add_forwarded(oldq.forward_records(n), now)
        if self.key.public in self.master_members:
            # the masterchain's own message queue: members are the (static) masterchain
            # validators, current and previous alike; key shards.MASTERCHAIN_KEY
            roles[MASTERCHAIN_KEY] = "current"
            q = ReliableMessageQueue(
                MASTERCHAIN_WORKCHAIN, FULL_SHARD, n, list(self.master_members), list(self.master_members),
                self.key, self.cache, self._parse, self.catchain_factory,
                block_interval=self.rmq_block_interval, bodies=self.bodies,
                shard_check=lambda p: p.workchain == MASTERCHAIN_WORKCHAIN)
            self.rmqs[(MASTERCHAIN_KEY, n)] = q
            self._rmq_by_sid[q.session_id] = q
            oldq = self.rmqs.get((MASTERCHAIN_KEY, old))
            if oldq is not None:
                q.add_forwarded(oldq.forward_records(n), now)
        # the lifetime of messages received in n-2 is over, except for those a block still
        # decides (held: see _open_block_messages), which end when their block does (_end_held)
        if n >= 2 and not self._replaying:
            self._j_rejected.append(JournalEntry("rejected_gc", n - 2))
            if self._keep_receipts:
                self._j_receipts.append(JournalEntry("receipts_gc", n - 2))
            if self._signed_before:
                self._signed_before = {k: v for k, v in self._signed_before.items() if v[0] > n - 2}
        in_blocks = self._open_block_messages()
        hold = lambda e: e.message_id in in_blocks and e.status in (CacheStatus.COLLATED, CacheStatus.ACCEPTED)
        for entry in self.cache.gc(n, hold):
            self._time_out(entry)
        held = {mid for mid in in_blocks if (e := self.cache.get(mid)) is not None
                and self.cache.obsolete(e.master_seqno, n) and hold(e)}
        self.stats["held"] += len(held - self._held)
        self._held |= held
        for key in [k for k in self.rmqs if k[1] <= n - 2]:
            q = self.rmqs.pop(key)
            self._rmq_by_sid.pop(q.session_id, None)
        for key in [k for k in self.shard_sessions if k[1] <= n - 2]:
            s = self.shard_sessions.pop(key)
            self._shard_by_sid.pop(s.consensus.session_id, None)
        self._end_held()
        for key in [k for k in self._groups if k < n - 3]:
            del self._groups[key]
        self._events.append(SessionStarted(n, roles))
        # client messages that waited for an RMQ of their shard
        early, self._early = self._early, []
        for parsed, origin, received_in in early:
            if not self.cache.obsolete(received_in, n):
                self._route_client(parsed, origin, now, received_in)
        if n == 0:
            self._start_shard_sessions(0, now)
        elif n in self.start_blocks:
            self._start_shard_sessions(n, now)
        return True

    def _time_out(self, entry) -> None:
        """The lifetime of a dropped cache entry is over: Timeout (final) to the full nodes
        if this node said New and has not ended the message yet; forget its body."""
        a = self.ann.get(entry.message_id)
        if (a is not None and a.said_new and not a.ended
                and entry.status not in (CacheStatus.FINALIZED, CacheStatus.DUPLICATE)):
            self._send_receipt(entry.message_id, Timeout(), a.shard, final=True)
        self.ann.pop(entry.message_id, None)
        p = self._parsed.pop(entry.message_id, None)
        if p is not None:
            self._parsed_boc.pop(p.boc, None)
        self.bodies.pop(entry.message_id, None)

    def _open_block_messages(self) -> set[bytes]:
        """Message ids whose fate a live shard session still decides: in a candidate of it
        (may yet be accepted) or in an accepted block of it not committed yet (the
        masterchain may yet commit it)."""
        out: set[bytes] = set()
        for s in self.shard_sessions.values():
            out |= s.collated
            for sc in s.accepted:
                out.update(m.message_id for m in sc.payload.messages)
        return out

    def _end_held(self) -> None:
        """Obsolete messages held past their lifetime because a block still decided them
        (cache.gc `hold`): once no live session can accept or commit them, those not
        finalized get their Timeout now. Without the hold a validator said Timeout (final)
        for a message in an accepted shard block that the lagging masterchain committed a
        moment later (Finalized after Timeout: the full node's verdict contradicted the
        chain; seen in the demo under load, tests/test_remp_held.py)."""
        if not self._held:
            return
        in_blocks = self._open_block_messages()
        for mid in list(self._held):
            e = self.cache.get(mid)
            if e is None:
                self._held.discard(mid)
                continue
            if e.status in (CacheStatus.COLLATED, CacheStatus.ACCEPTED) and mid in in_blocks:
                continue                    # still decided by a live block
            self._held.discard(mid)
            if e.status is CacheStatus.FINALIZED or e.status is CacheStatus.DUPLICATE:
                continue                    # dropped by the next gc, as any finished entry
            self.cache.drop(mid)
            self._time_out(e)

    def _start_shard_sessions(self, n: int, now: float) -> None:
        groups = self.groups(n)
        if groups is None:
            return
        for shard in self.cfg.shards:
            if self.key.public not in groups[shard] or (shard, n) in self.shard_sessions:
                continue
            top = self.tops[shard]
            sess = _ShardSession(shard, n, None, self.committed[shard].copy())
            sess.consensus = cons.BlockConsensus(
                self.workchain, shard, groups[shard], self.key, start_seqno=top.seqno + 1, prev_block_id=top,
                round_timeout=self.shard_round_timeout, block_interval=self.cfg.block_interval,
                collate=lambda seqno, t, s=sess: self._collate_shard(s, seqno, t),
                validate=lambda seqno, payload, s=sess: self._validate_shard(s, seqno, payload),
                start_time=now, sig_memo=self.sig_memo)
            self._mute_restored(sess.consensus)
            self.shard_sessions[(shard, n)] = sess
            self._shard_by_sid[sess.consensus.session_id] = sess

    # -- helpers ------------------------------------------------------------------------------------
    def _in_shard(self, parsed, shard: int) -> bool:
        if shard == MASTERCHAIN_KEY:
            return parsed.workchain == MASTERCHAIN_WORKCHAIN
        return parsed.workchain == self.workchain and shard_contains(shard, parsed.account)

    def _shard_of(self, parsed) -> int | None:
        if parsed.workchain == MASTERCHAIN_WORKCHAIN:
            return MASTERCHAIN_KEY
        for s in self.cfg.shards:
            if self._in_shard(parsed, s):
                return s
        return None

    def _parse(self, boc: bytes):
        if type(boc) is bytes:
            p = self._parsed_boc.get(boc)
            if p is not None:
                return p
        p = parse_external_message(boc, (self.workchain, MASTERCHAIN_WORKCHAIN))
        if self._parsed.setdefault(p.id, p) is p:
            self._parsed_boc[p.boc] = p
        return p

    def _parsed_of(self, m: BlockMessage):
        p = self._parsed.get(m.message_id)
        if p is None or p.boc != m.boc:
            p = parse_external_message(m.boc, (self.workchain, MASTERCHAIN_WORKCHAIN))
        return p

    def _drop(self, channel: str, src: bytes, reason: str) -> None:
        self.stats["dropped"] += 1
        self._events.append(Dropped(channel, src, reason))

    def _ms(self) -> int:
        return int(round(self.wall_clock(self._now) * 1000))

    def _send_receipt(self, mid: bytes, status, shard: int, *, final: bool = False, reason: str = "",
                      only: bytes | None = None) -> None:
        if self._replaying:     # history replayed from the journal: the full nodes had these
            return
        a = self.ann.get(mid)
        if a is None or not a.origins:
            return
        key = (mid, status.pack())
        kept = self._signed_before.pop(key, None) if self._signed_before else None
        if kept is not None:
            # signed before a restart (ValidatorJournal.receipts): the same receipt again, so
            # a full node never holds two different signed receipts of one status from us
            raw = kept[1]
            signed = SignedReceipt.parse(raw)
            self.stats["receipts_kept"] += 1
        else:
            signed = make_signed_receipt(self.key, mid, status, self._ms())
            raw = encode_receipt(signed)
            if self._keep_receipts:
                self._j_receipts.append(JournalEntry("receipt", key, (a.master_seqno, raw)))
        a.last = signed
        if final:
            a.ended = True
        dsts = (only,) if only is not None else tuple(sorted(a.origins))
        data = mux(CH_CLIENT, ZERO32, raw)
        for d in dsts:
            self._out.append((d, data))
        if kept is None:
            self.stats["receipts"] += 1
            self._events.append(ReceiptSent(mid, status.kind, shard, dsts, signed, reason, status))

    def _ann(self, mid: bytes, origin: bytes | None, shard: int, master_seqno: int) -> _Ann:
        a = self.ann.get(mid)
        if a is None:
            a = self.ann[mid] = _Ann(shard=shard, master_seqno=master_seqno)
        if origin is not None and origin != ZERO32:
            a.origins.add(origin)
        return a

    # -- client channel --------------------------------------------------------------------------------
    def _on_client(self, body: bytes, src: bytes, now: float) -> None:
        try:
            dg = decode_datagram(body)
        except WireError as exc:
            self._drop("client", src, str(exc))
            return
        if not isinstance(dg, RempMessageDatagram):
            self._drop("client", src, "a validator accepts only tonNode.rempMessage from full nodes")
            return
        if self.full_nodes is not None:
            pk = self.full_nodes.get(src)
            if pk is None or not dg.verify(pk):
                self._drop("client", src, "rempMessage from an unknown full node or with a bad signature")
                return
        try:
            parsed = self._parse(dg.boc)
        except MessageRejected as exc:
            self._drop("client", src, f"bad message: {exc.text}")
            return
        if parsed.id != dg.message_id:
            self._drop("client", src, "rempMessage id is not the BOC's root hash")
            return
        self._direct[parsed.id] = None
        self._direct.move_to_end(parsed.id)
        if len(self._direct) > MAX_DIRECT:
            self._direct.popitem(last=False)
        self._route_client(parsed, src, now)

    def received_directly(self, message_id: bytes) -> bool:
        """True iff a full node sent message `message_id` (32 bytes) to this validator itself
        (one of the last MAX_DIRECT such messages), not only through the RMQ of its shard
        group. The daemon's receipt sender sends the first status (PutIntoQueue) of such a
        message at once: it is the first receipt the full node's user waits for; the group's
        other members learn the message from the RMQ, and their PutIntoQueue may wait for
        its batch (at most delivery.ReceiptSender.max_delay, the issue's 100 ms)."""
        return message_id in self._direct

    def _route_client(self, parsed, origin: bytes, now: float, received_in: int | None = None) -> None:
        received_in = self.session if received_in is None else received_in
        shard = self._shard_of(parsed)
        if shard is None:
            self._drop("client", origin, f"message to workchain {parsed.workchain}")
            return
        if shard == MASTERCHAIN_KEY and self.key.public not in self.master_members:
            self._drop("client", origin, "message to workchain -1 at a validator outside the masterchain")
            return
        q = self.rmqs.get((shard, self.session))
        if q is None:
            if len(self._early) < MAX_EARLY:
                self._early.append((parsed, origin, received_in))
            return
        a = self.ann.get(parsed.id)
        if a is not None:
            a.origins.add(origin)
            if a.last is not None:      # a resent message: repeat our latest status to it
                self._out.append((origin, mux(CH_CLIENT, ZERO32, encode_receipt(a.last))))
                return
        e = self.cache.get(parsed.id)
        if e is not None and e.in_accepted_block:
            # replay of a message already in an accepted block: never queued again
            self._ann(parsed.id, origin, shard, e.master_seqno)
            bid = e.block_id if isinstance(e.block_id, BlockIdExt) else ZERO_BLOCK_ID
            self._send_receipt(parsed.id, Duplicate(bid), shard, only=origin)
            return
        if q.local_is_current:
            self._ann(parsed.id, origin, shard, received_in)
        q.add_client_message(parsed, origin, now, received_in)

    # -- RMQ / consensus events ----------------------------------------------------------------------
    def _pump(self, now: float) -> None:
        for (shard, n), q in list(self.rmqs.items()):
            while (ev := q.next_event()) is not None:
                self._on_rmq_event(q, shard, n, ev)
        for key, s in list(self.shard_sessions.items()):
            while (ev := s.consensus.next_event()) is not None:
                self._on_shard_event(s, ev, now)
        if self.master is not None:
            while (ev := self.master.next_event()) is not None:
                self._on_master_event(ev, now)

    def _on_rmq_event(self, q: ReliableMessageQueue, shard: int, n: int, ev) -> None:
        if isinstance(ev, SourceBlamed):
            self.blamed.add(ev.source)
            self._events.append(ForkBlamed(shard, n, ev.source, ev.proof))
            return
        if isinstance(ev, RecordDropped):
            self._drop("rmq", ev.source, ev.reason)
            return
        if not q.local_is_current:
            return
        if isinstance(ev, MessageQueued):
            a = self._ann(ev.message_id, ev.origin, shard, ev.master_seqno)
            if not a.said_new:
                a.said_new = True
                a.ended = False
                self._send_receipt(ev.message_id, New(), shard)
        elif isinstance(ev, MessageAcceptedByQueue):
            a = self._ann(ev.message_id, ev.origin, shard, n)
            e = self.cache.get(ev.message_id)
            # a message that reached this validator both from a full node and through another
            # member's record is accepted by the queue twice: one status tells it
            if a.said_new and not a.said_queue and e is not None and e.status is CacheStatus.PENDING:
                a.said_queue = True
                self._send_receipt(ev.message_id, Accepted(Level.QUEUE), shard)
        elif isinstance(ev, MessageDuplicate):
            a = self._ann(ev.message_id, ev.origin, shard, n)
            orig = self.cache.get(ev.original_id)
            bid = orig.block_id if orig is not None and isinstance(orig.block_id, BlockIdExt) else ZERO_BLOCK_ID
            self._send_receipt(ev.message_id, Duplicate(bid), shard)
        elif isinstance(ev, MessageRejectedByQueue):
            a = self._ann(ev.message_id, ev.origin, shard, n)
            self._send_receipt(ev.message_id, Rejected(Level.QUEUE, ZERO_BLOCK_ID, truncate_error(ev.reason)),
                               shard, final=True, reason=ev.reason)

    # -- shard chain ----------------------------------------------------------------------------------
    def _collate_shard(self, s: _ShardSession, seqno: int, now: float) -> bytes | None:
        if master_session_at(self.cfg, now) != s.session or self.session != s.session:
            return None
        q = self.rmqs.get((s.shard, s.session))
        if q is None:
            return None
        gen_ms = int(round(self.wall_clock(now) * 1000))
        state = s.tip.copy()
        msgs = self._collate_messages(q, state, s.shard, gen_ms)
        if not msgs:
            return None
        payload = encode_shard_payload(ShardPayload(s.session, gen_ms, self.key.key_id, tuple(msgs)))
        bid = cons.Candidate(self.workchain, s.shard, seqno, s.consensus.prev, self.key.key_id, payload).block_id
        for m in msgs:
            self._included(m, s, bid)
        return payload

    def _collate_messages(self, q, state, shard: int, gen_ms: int) -> list[BlockMessage]:
        """The messages of the next block of `shard` (a shard or MASTERCHAIN_KEY): pending
        messages of RMQ `q` oldest first, at most MAX_BLOCK_MESSAGES and MAX_BLOCK_BYTES of
        bodies (the first always fits), each executed on `state` (mutated); a message already
        refused is skipped, one whose execution fails is RejectedByCollator (final receipt)."""
        msgs: list[BlockMessage] = []
        size = 0
        for qm in q.pending(limit=4 * MAX_BLOCK_MESSAGES):
            if len(msgs) >= MAX_BLOCK_MESSAGES:
                break
            if msgs and size + len(qm.body) > MAX_BLOCK_BYTES:
                continue        # a bigger one goes first in a later block (oldest first)
            if self.cache.collation_refusal(qm.message_id, qm.uid) is not None:
                continue
            parsed = qm.parsed or self._parse(qm.body)
            res = state.execute(parsed, gen_ms / 1000.0)
            if not res.ok:
                self.stats["collator_rejects"] += 1
                self.cache.set_status(qm.message_id, CacheStatus.REJECTED)
                # durable before the final receipt leaves (journal_updates precedes sending)
                self._j_rejected.append(JournalEntry("rejected", qm.message_id, (qm.uid, qm.master_seqno)))
                self._ann(qm.message_id, qm.origin, shard, qm.master_seqno)
                self._send_receipt(qm.message_id, Rejected(Level.COLLATOR, ZERO_BLOCK_ID, truncate_error(res.error)),
                                   shard, final=True, reason=res.error)
                continue
            msgs.append(BlockMessage(qm.message_id, qm.uid, qm.origin, qm.body))
            size += len(qm.body)
        return msgs

    def _included(self, m: BlockMessage, s: _ShardSession, bid: BlockIdExt) -> None:
        s.collated.add(m.message_id)
        e = self.cache.get(m.message_id)
        if e is None:
            self.cache.add(m.message_id, m.uid, s.session)
            e = self.cache.get(m.message_id)
        if e.status in (CacheStatus.PENDING, CacheStatus.COLLATED, CacheStatus.REJECTED):
            self.cache.set_status(m.message_id, CacheStatus.COLLATED, block_id=bid)
        a = self._ann(m.message_id, m.origin, s.shard, e.master_seqno)
        a.ended = False
        self._queued_via_block(a, m.message_id, s)
        self._send_receipt(m.message_id, Accepted(Level.COLLATOR, bid), s.shard)

    def _queued_via_block(self, a: _Ann, mid: bytes, s: _ShardSession) -> None:
        """A current RMQ member that meets a message in a shard block before its RMQ
        delivered it (the network reordered the catchain and the shard-chain datagrams)
        reports PutIntoQueue and AcceptedByQueue first: the block proves the collator's
        queue had it, and each validator's statuses keep the main sequence (seed:
        remp-protocol-b, "Message statuses"). The later RMQ delivery says nothing more."""
        if a.said_new:
            return
        q = self.rmqs.get((s.shard, s.session))
        if q is None or not q.local_is_current:
            return
        a.said_new = a.said_queue = True
        self._send_receipt(mid, New(), s.shard)
        self._send_receipt(mid, Accepted(Level.QUEUE), s.shard)

    def _validate_shard(self, s: _ShardSession, seqno: int, payload: bytes) -> str | None:
        if self.session != s.session:
            return f"shard session {s.session} is over (now {self.session})"
        try:
            p = decode_shard_payload(payload)
        except PayloadError as exc:
            return str(exc)
        if p.session != s.session:
            return f"block of session {p.session} in session {s.session}"
        if not p.messages:
            return "empty block"
        reason = self.cache.block_refusal([(m.message_id, m.uid) for m in p.messages])
        if reason is not None:
            return reason
        state = s.tip.copy()
        for m in p.messages:
            try:
                parsed = self._parsed_of(m)
            except MessageRejected as exc:
                return f"message {m.message_id.hex()}: {exc.text}"
            if parsed.id != m.message_id or parsed.uid != m.uid or not self._in_shard(parsed, s.shard):
                return f"message {m.message_id.hex()} does not match its BOC or shard"
            res = state.execute(parsed, p.gen_utime_ms / 1000.0)
            if not res.ok:
                return f"message {m.message_id.hex()} fails: {res.error}"
        bid = cons.Candidate(self.workchain, s.shard, seqno, s.consensus.prev, p.collator, payload).block_id
        for m in p.messages:
            self._included(m, s, bid)
        return None

    def _on_shard_event(self, s: _ShardSession, ev, now: float) -> None:
        if isinstance(ev, cons.BlockAccepted):
            try:
                p = decode_shard_payload(ev.payload)
            except PayloadError as exc:
                self._drop("shard", ZERO32, f"accepted block with bad payload: {exc}")
                return
            for m in p.messages:
                try:
                    parsed = self._parsed_of(m)
                    s.tip.execute(parsed, p.gen_utime_ms / 1000.0, committed=True)
                except (MessageRejected, ValueError):
                    pass
                e = self.cache.get(m.message_id)
                if e is None:
                    self.cache.add(m.message_id, m.uid, s.session)
                    e = self.cache.get(m.message_id)
                if e.status is not CacheStatus.FINALIZED and e.status is not CacheStatus.DUPLICATE:
                    self.cache.set_status(m.message_id, CacheStatus.ACCEPTED, block_id=ev.block_id)
                a = self._ann(m.message_id, m.origin, s.shard, e.master_seqno)
                a.ended = False
                self._queued_via_block(a, m.message_id, s)
                self._send_receipt(m.message_id, Accepted(Level.SHARDCHAIN, ev.block_id), s.shard)
            raw = s.consensus.commit_for(ev.block_id.seqno)
            if raw is not None:
                self._keep_raw(raw)
                sc = _ShardCommit(ev.block_id, cons.parse_message(raw).candidate.prev, p, raw)
                s.accepted.append(sc)
                self._known_commits[s.shard][ev.block_id.seqno] = sc
                # announce to the masterchain members outside the group: each of them from
                # ANNOUNCE_COPIES group members (not from all n: n x outside copies of every
                # commit). A lost announce only means that member's own master collation
                # leaves the block to the next leader; master proposals carry the commit.
                data = mux(CH_ANNOUNCE, ZERO32, raw)
                group_ids = [key_id(k) for k in s.consensus.members]
                me = group_ids.index(self.key.key_id) if self.key.key_id in group_ids else 0
                outside = [mid for mid in self.master_ids if mid not in group_ids]
                g = len(group_ids)
                for j, mid in enumerate(outside):
                    if (j - me) % g < ANNOUNCE_COPIES:
                        self._out.append((mid, data))
            self.stats["shard_blocks"] += 1
            self._events.append(ShardBlockAccepted(ev.block_id, s.session, tuple(m.message_id for m in p.messages)))
        elif isinstance(ev, cons.EquivocationDetected):
            self.blamed.add(ev.member)
            self._events.append(ForkBlamed(s.shard, s.session, ev.member, ev.evidence))

    # -- shard commits and the masterchain -------------------------------------------------------------
    def _check_commit(self, raw: bytes, min_tag: int, max_tag: int) -> _ShardCommit:
        """Parse and verify a shard block commit certificate (raises PayloadError)."""
        sc = self._verified_commits.get(raw)
        self._keep_raw(raw)
        if sc is not None:
            if not min_tag <= sc.payload.session <= max_tag:
                raise PayloadError(f"shard block of session {sc.payload.session} outside [{min_tag}, {max_tag}]")
            return sc
        sc = self._verify_commit(raw, min_tag, max_tag)
        self._verified_commits[raw] = sc
        while len(self._verified_commits) > KEEP_VERIFIED_COMMITS:
            del self._verified_commits[next(iter(self._verified_commits))]
        return sc

    def _verify_commit(self, raw: bytes, min_tag: int, max_tag: int) -> _ShardCommit:
        try:
            c = cons.parse_message(raw)
        except cons.ConsensusWireError as exc:
            raise PayloadError(f"shard commit: {exc}") from None
        if not isinstance(c, cons.Commit):
            raise PayloadError("not a commit")
        cand = c.candidate
        if cand.workchain != self.workchain or cand.shard not in self.tops:
            raise PayloadError(f"commit of unknown chain {cand.workchain}:{cand.shard:016x}")
        p = decode_shard_payload(cand.payload)
        if not min_tag <= p.session <= max_tag:
            raise PayloadError(f"shard block of session {p.session} outside [{min_tag}, {max_tag}]")
        groups = self.groups(p.session)
        if groups is None:
            raise PayloadError(f"groups of session {p.session} unknown")
        try:
            bid = cons.verify_commit(c.session_id, groups[cand.shard], c, self.sig_memo)
        except cons.ConsensusWireError as exc:
            raise PayloadError(str(exc)) from None
        return _ShardCommit(bid, cand.prev, p, raw)

    # -- shard commits by reference (CH_MASTER_REF / CH_COMMIT_NEED) ---------------------------------
    def _keep_raw(self, raw: bytes) -> bytes:
        """Remember a shard commit by its sha256 (what CH_MASTER_REF references); returns the hash."""
        h = hashlib.sha256(raw).digest()
        if h in self._raws:
            self._raws.move_to_end(h)
        else:
            self._raws[h] = raw
            while len(self._raws) > KEEP_RAW_COMMITS:
                self._raws.popitem(last=False)
        return h

    def _compact(self, d: bytes) -> bytes | None:
        """The CH_MASTER_REF body for master consensus datagram `d` (a proposal or a commit
        whose master block carries shard commits: each one of >= MIN_REF_BYTES replaced by its
        sha256), or None to send `d` as it is. Memoized per datagram (a broadcast and its
        resends are one bytes object)."""
        memo = self._compact_memo
        if d in memo:
            return memo[d]
        ref = None
        if len(d) >= 2 * MIN_REF_BYTES and int.from_bytes(d[:4], "little") in (cons.PROPOSAL, cons.COMMIT):
            try:
                commits = decode_master_block(cons.parse_message(d).candidate.payload).shard_commits
            except ValueError:
                commits = ()
            segs: list = []
            pos = 0
            for raw in commits:
                if len(raw) < MIN_REF_BYTES:
                    continue
                i = d.find(raw, pos)
                if i < 0:
                    continue
                if i > pos:
                    segs.append(d[pos:i])
                segs.append(CommitRef(self._keep_raw(raw)))
                pos = i + len(raw)
            if segs:
                segs.append(d[pos:])
                ref = encode_refs(segs)
                self.stats["master_ref_out"] += 1
        memo[d] = ref
        while len(memo) > 32:
            memo.popitem(last=False)
        return ref

    def _resolve(self, segs: list) -> tuple[bytes | None, list[bytes]]:
        """(the rebuilt datagram, []) or (None, hashes of the shard commits we lack)."""
        missing = [seg.hash for seg in segs if isinstance(seg, CommitRef) and seg.hash not in self._raws]
        if missing:
            return None, missing
        return b"".join(self._raws[seg.hash] if isinstance(seg, CommitRef) else seg for seg in segs), []

    def _on_master_ref(self, sid: bytes, body: bytes, src: bytes, now: float) -> None:
        """A master consensus datagram with its shard commits by reference: rebuilt and fed to
        the master consensus (which checks its signatures as usual: a wrong reference cannot
        forge a proposal), or parked while the commits it lacks are asked from the sender."""
        if self.master is None or sid != self.master.session_id:
            self._drop("master", src, "unknown master session")
            return
        try:
            segs = decode_refs(body)
        except PayloadError as exc:
            self._drop("master", src, str(exc))
            return
        self.stats["master_ref_in"] += 1
        data, missing = self._resolve(segs)
        if data is not None:
            self.master.receive_datagram(data, src, now)
            return
        self.stats["master_ref_parked"] += 1
        self._parked.append((src, sid, segs))
        while len(self._parked) > MAX_PARKED:
            self._parked.popleft()
        ask = [h for h in missing if now - self._need_at.get((src, h), -1e18) >= NEED_RETRY]
        if ask and src in self.validator_keys:
            if len(self._need_at) > 4096:
                self._need_at.clear()
            for h in ask:
                self._need_at[(src, h)] = now
            self.stats["commit_needs"] += 1
            self._out.append((src, mux(CH_COMMIT_NEED, ZERO32, encode_commit_need(ask))))

    def _retry_parked(self, now: float) -> None:
        """Feed the parked CH_MASTER_REF datagrams whose shard commits all arrived."""
        if not self._parked:
            return
        keep: deque = deque()
        for src, sid, segs in self._parked:
            data, _ = self._resolve(segs)
            if data is None:
                keep.append((src, sid, segs))
            elif self.master is not None and sid == self.master.session_id:
                self.master.receive_datagram(data, src, now)
        self._parked = keep

    def _on_commit_need(self, body: bytes, src: bytes) -> None:
        """A member lacks shard commits we referenced: each goes to it as an announce."""
        if src not in self.validator_keys:
            self._drop("commit_need", src, "not a validator")
            return
        try:
            hashes = decode_commit_need(body)
        except PayloadError as exc:
            self._drop("commit_need", src, f"commit need: {exc}")
            return
        for h in hashes:
            raw = self._raws.get(h)
            if raw is not None:
                self.stats["commits_resent"] += 1
                self._out.append((src, mux(CH_ANNOUNCE, ZERO32, raw)))

    def _on_announce(self, raw: bytes, src: bytes) -> None:
        self._keep_raw(raw)
        try:
            sc = self._check_commit(raw, max(self.master_tag, 0), self.session + 1)
        except PayloadError as exc:
            self._drop("announce", src, str(exc))
            return
        if sc.block_id.seqno > self.tops[sc.block_id.shard].seqno:
            self._known_commits[sc.block_id.shard].setdefault(sc.block_id.seqno, sc)

    def _collate_master(self, seqno: int, now: float) -> bytes | None:
        tag = max(master_session_at(self.cfg, now), self.master_tag)
        if self.groups(tag) is None:
            return None
        # the shard commits that extend the committed tops, taken one per shard in turn while
        # they fit MAX_MASTER_COMMIT_BYTES (the first one always goes): the master candidate
        # travels in every proposal and commit, so a backlog carried whole (36 KB, 32 parts)
        # would almost never arrive under loss and the masterchain would stall until the
        # session switch orphaned the shard blocks (messages ended Timeout)
        commits: list[bytes] = []
        size = 0
        tops = dict(self.tops)
        open_shards = list(self.cfg.shards)
        while open_shards:
            for shard in list(open_shards):
                top = tops[shard]
                sc = self._known_commits[shard].get(top.seqno + 1)
                if sc is None or sc.prev != top or not max(self.master_tag, 0) <= sc.payload.session <= tag:
                    open_shards.remove(shard)
                    continue
                if commits and size + len(sc.raw) > self.master_commit_bytes:
                    open_shards = []
                    break
                commits.append(sc.raw)
                size += len(sc.raw)
                tops[shard] = sc.block_id
        gen_ms = int(round(self.wall_clock(now) * 1000))
        msgs = self._collate_mc_messages(gen_ms)
        if not commits and not msgs and tag == self.master_tag:
            return None
        return encode_master_block(MasterPayload(tag, gen_ms, tuple(commits), tuple(msgs)))

    def _collate_mc_messages(self, gen_ms: int) -> list[BlockMessage]:
        """The oldest pending messages of the masterchain's RMQ that execute on the
        committed masterchain state (failures: RejectedByCollator, as in a shard)."""
        q = self.rmqs.get((MASTERCHAIN_KEY, self.session))
        if q is None:
            return []
        state = self.mc_committed.copy()
        msgs = self._collate_messages(q, state, MASTERCHAIN_KEY, gen_ms)
        return msgs

    def _check_mc_messages(self, p: MasterPayload) -> str | None:
        """Why the masterchain messages of a master block candidate are invalid, or None."""
        if not p.messages:
            return None
        reason = self.cache.block_refusal([(m.message_id, m.uid) for m in p.messages])
        if reason is not None:
            return reason
        state = self.mc_committed.copy()
        for m in p.messages:
            try:
                parsed = self._parsed_of(m)
            except MessageRejected as exc:
                return f"message {m.message_id.hex()}: {exc.text}"
            if parsed.id != m.message_id or parsed.uid != m.uid or parsed.workchain != MASTERCHAIN_WORKCHAIN:
                return f"message {m.message_id.hex()} does not match its BOC or the masterchain"
            res = state.execute(parsed, p.gen_utime_ms / 1000.0)
            if not res.ok:
                return f"message {m.message_id.hex()} fails: {res.error}"
        return None

    def _validate_master(self, seqno: int, payload: bytes) -> str | None:
        try:
            p, _ = self._master_commits(payload)
        except PayloadError as exc:
            return str(exc)
        return self._check_mc_messages(p)

    def _master_commits(self, payload: bytes) -> tuple[MasterPayload, list[_ShardCommit]]:
        p = decode_master_block(payload)
        if p.session < self.master_tag:
            raise PayloadError(f"master block session {p.session} < previous {self.master_tag}")
        if p.session > master_session_at(self.cfg, self._now) + 1:
            raise PayloadError(f"master block session {p.session} is in the future")
        tops = dict(self.tops)
        out = []
        for raw in p.shard_commits:
            sc = self._check_commit(raw, max(self.master_tag, 0), p.session)
            shard = sc.block_id.shard
            if sc.prev != tops[shard] or sc.block_id.seqno != tops[shard].seqno + 1:
                raise PayloadError(f"shard block {sc.block_id.seqno} of {shard:016x} does not extend the committed top")
            tops[shard] = sc.block_id
            out.append(sc)
        return p, out

    def _on_master_event(self, ev, now: float) -> None:
        if not isinstance(ev, cons.BlockAccepted):
            if isinstance(ev, cons.EquivocationDetected):
                self.blamed.add(ev.member)
            return
        try:
            p, commits = self._master_commits(ev.payload)
        except PayloadError as exc:
            # accepted by a quorum; only a node with a diverging view gets here
            self._drop("master", ZERO32, f"accepted master block we cannot apply: {exc}")
            return
        first_of_session = p.session > self.master_tag
        self.master_tag = p.session
        self.master_blocks.append((ev.block_id, p))
        mids = []
        for sc in commits:
            shard = sc.block_id.shard
            self.tops[shard] = sc.block_id
            st = self.committed[shard]
            groups = self.groups(sc.payload.session) or {}
            in_group = self.key.public in groups.get(shard, [])
            for m in sc.payload.messages:
                mids.append(m.message_id)
                try:
                    st.execute(self._parsed_of(m), sc.payload.gen_utime_ms / 1000.0, committed=True)
                except (MessageRejected, ValueError):
                    pass
                e = self.cache.get(m.message_id)
                if e is None:
                    self.cache.add(m.message_id, m.uid, p.session)
                    e = self.cache.get(m.message_id)
                if e.status is not CacheStatus.DUPLICATE:
                    self.cache.set_status(m.message_id, CacheStatus.FINALIZED, block_id=sc.block_id,
                                          master_block_id=ev.block_id)
                a = self.ann.get(m.message_id)
                if in_group or (a is not None and a.said_new):
                    a = self._ann(m.message_id, m.origin, shard, e.master_seqno)
                    self._send_receipt(m.message_id, Accepted(Level.MASTERCHAIN, sc.block_id, ev.block_id),
                                       shard, final=True)
            for s in self.shard_sessions.values():
                if s.shard == shard:
                    s.accepted = [x for x in s.accepted if x.block_id.seqno > sc.block_id.seqno]
            for seq in [k for k in self._known_commits[shard] if k <= sc.block_id.seqno]:
                del self._known_commits[shard][seq]
        for m in p.messages:
            mids.append(m.message_id)
            self._apply_mc_message(m, p, ev.block_id)
        self.stats["master_blocks"] += 1
        self._events.append(MasterBlockAccepted(ev.block_id, p.session, tuple(sc.block_id for sc in commits),
                                                tuple(mids)))
        if first_of_session:
            self.start_blocks.setdefault(p.session, ev.block_id.root_hash)
            self._orphan_before(p.session)
            if self.session >= p.session:
                self._start_shard_sessions(p.session, now)
            # a switch may have waited for this seed
            self._advance(now)

    def _apply_mc_message(self, m: BlockMessage, p: MasterPayload, bid: BlockIdExt) -> None:
        """A masterchain message in an accepted master block: executed on the masterchain
        state; the block is its collated, accepted and finalizing block at once, so a
        masterchain validator reports IncludedIntoBlock, IncludedIntoAcceptedBlock and
        Finalized with the master block id (after PutIntoQueue/AcceptedByQueue if its RMQ
        had not delivered the message yet)."""
        try:
            self.mc_committed.execute(self._parsed_of(m), p.gen_utime_ms / 1000.0, committed=True)
        except (MessageRejected, ValueError):
            pass
        e = self.cache.get(m.message_id)
        if e is None:
            self.cache.add(m.message_id, m.uid, p.session)
            e = self.cache.get(m.message_id)
        if e.status is not CacheStatus.DUPLICATE:
            self.cache.set_status(m.message_id, CacheStatus.FINALIZED, block_id=bid, master_block_id=bid)
        a = self.ann.get(m.message_id)
        if self.key.public not in self.master_members and (a is None or not a.said_new):
            return
        a = self._ann(m.message_id, m.origin, MASTERCHAIN_KEY, e.master_seqno)
        a.ended = False
        if not a.said_new and (MASTERCHAIN_KEY, self.session) in self.rmqs:
            a.said_new = a.said_queue = True
            self._send_receipt(m.message_id, New(), MASTERCHAIN_KEY)
            self._send_receipt(m.message_id, Accepted(Level.QUEUE), MASTERCHAIN_KEY)
        self._send_receipt(m.message_id, Accepted(Level.COLLATOR, bid), MASTERCHAIN_KEY)
        self._send_receipt(m.message_id, Accepted(Level.SHARDCHAIN, bid), MASTERCHAIN_KEY)
        self._send_receipt(m.message_id, Accepted(Level.MASTERCHAIN, bid, bid), MASTERCHAIN_KEY, final=True)

    def _orphan_before(self, n: int) -> None:
        """Accepted shard blocks of sessions < n that the start block of n did not commit can
        never be committed: their messages return to the queue (IgnoredByMasterchain)."""
        for key in [k for k in self.shard_sessions if k[1] < n]:
            s = self.shard_sessions.pop(key)
            self._shard_by_sid.pop(s.consensus.session_id, None)
            for sc in s.accepted:
                if sc.block_id.seqno <= self.tops[s.shard].seqno:
                    continue
                self.stats["orphaned_blocks"] += 1
                for m in sc.payload.messages:
                    e = self.cache.get(m.message_id)
                    if e is not None and e.status is CacheStatus.ACCEPTED:
                        self.cache.set_status(m.message_id, CacheStatus.PENDING)
                        self._send_receipt(m.message_id, Ignored(Level.MASTERCHAIN, sc.block_id), s.shard)
        for shard in self.cfg.shards:
            for seq in [k for k, sc in self._known_commits[shard].items() if sc.payload.session < n]:
                del self._known_commits[shard][seq]
        self._end_held()
