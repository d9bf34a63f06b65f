"""Block consensus for the shard chains and the masterchain: one core, no I/O, no clock.

Source of the rules: DESIGN.md section 4 ("the round's leader collates a candidate from the
oldest pending messages, the group validates it ... and signs; >= 2/3 signatures make it
accepted. A slow or dead leader is skipped after a timeout. The masterchain commits accepted
shard block ids the same way (one consensus module serves both chains)"), section 2 (API
shape); the voting scheme is Tendermint's (Buchman, Kwon, Milosevic, "The latest gossip on
BFT consensus", 2018, Algorithm 1) reduced to one timer per round; the quorum is TON's
validator-session cutoff `total_weight * 2 / 3 + 1` (every member has weight 1).

Heights, rounds, leaders
    The chain is (chain_workchain, chain_shard); the masterchain is workchain -1, shard
    0x8000000000000000 with payload = encode_master_payload(accepted shard block ids).
    Height `seqno` starts at `start_seqno` on top of `prev_block_id` (None = a zero id).
    At height s, round r, the leader is members[(s + r) % n]. Round 0 of a height starts
    `block_interval` seconds after the previous block was accepted; each round lasts at most
    `round_timeout` seconds, after which it is skipped (RoundSkipped) and the next leader
    proposes.

One round (n members, quorum q = 2n // 3 + 1, i.e. weight > 2/3; f = n - q faults tolerated)
    1. The leader proposes: if it knows a `valid` candidate (one that had q prevotes in an
       earlier round of this height) it re-proposes it with pol_round = that round and those
       q prevote signatures (the polka certificate, so the lock rule can be checked by a
       member that lost the old round's votes), else it
       calls collate(seqno, now) (None = nothing yet, retried) and proposes a new candidate
       with pol_round = -1. The proposal is signed by the leader.
    2. Every member prevotes once per round: for the candidate if validate(seqno, payload)
       returns None, the candidate extends our last accepted block, and the lock allows it
       (not locked, or locked on this candidate, or pol_round >= our lock round and we hold
       the q prevotes of pol_round for it); otherwise nil. No proposal before the round's
       deadline: nil.
    3. Seeing q prevotes for candidate B in the current round (a "polka"), a member that has
       prevoted and holds B (valid) LOCKS on (round, B) and precommits B. If no polka is
       possible any more in this round (or at the deadline) it precommits nil.
    4. q precommits for B in one round accept B: BlockAccepted(block_id, payload,
       signatures = those precommits, round); the member sends a commit so members that
       missed votes accept the same block (the candidate + signatures to members whose
       precommit for B it lacks, the signatures only, remp.consensus.commitSignatures, to
       the others, which hold B; only B's collator sends them: every member decides by
       itself from the broadcast precommits, stragglers are pushed commits when they send
       stale-height messages), and moves to seqno+1.
       If no commit is possible in the round any more (or at the deadline), the member moves
       to the next round (RoundSkipped).
    5. Seeing messages of a higher round r' from f + 1 distinct members, a member jumps to r'
       (it cannot be alone in r' any more; Tendermint line 55).

Safety argument (at most f of the n members Byzantine, any loss/duplication/reordering)
    (a) Two quorums intersect in >= 2q - n >= f + 1 members (3q > 2n), so at least one honest
        member. An honest member prevotes and precommits at most once per (seqno, round) and
        kind; so there is at most one polka and one precommit quorum per (seqno, round).
    (b) Suppose B is accepted with q precommits at round r. Then >= q - f >= f + 1 honest
        members locked on (r, B). In any round r' > r, an honest locked member prevotes some
        B' != B only for a proposal with pol_round vr, r <= vr < r', carrying a polka for B'
        at vr — i.e. only if a polka for B' already exists in (r, r'). By induction on r'
        there is none: the polka in round r itself is for B (a), and a polka for B' in a
        later round needs >= q prevotes, but only n - (f + 1) < q members are not locked on B.
        No polka for B' after r means no honest precommit for B' after r, hence no precommit
        quorum for B' in rounds > r; in round r none by (a); in rounds < r, a quorum for B'
        would give the symmetric argument against B. Hence no two different blocks are
        accepted at one seqno.
    (c) Commits received from others are accepted only with q valid distinct precommit
        signatures of one round for the carried candidate (verify_commit), so the same
        argument covers blocks learnt by catch-up. Signatures bind session_id, kind, round
        and the full block id, so votes cannot be replayed into another round, kind, chain
        or session.
    Liveness needs partial synchrony: after loss stops hiding quorums, each member resends
    each of its current-round proposal/votes resend_interval after it last sent it (except
    to members that provably no longer need it: the proposal to those that prevoted or
    precommitted its block, the prevote to those that precommitted a block in the round;
    BlockConsensus._needs), lagging members receive commits
    (pushed when they send stale-height messages, pulled with getCommits when they see
    higher heights), and rounds with a silent, slow or rejected leader end at the deadline.

Equivocation
    Two signed proposals by one leader, or two signed votes of one kind by one member, for
    different blocks at one (seqno, round) are recorded as Evidence (both signed messages,
    verifiable with verify_evidence) and reported once as EquivocationDetected. Only the
    first proposal is used; every distinct signed vote (up to MAX_VOTES_PER_MEMBER) counts
    for its block — safe by (a), since two quorums for different blocks would need f + 1
    double-signers, and needed for liveness: a member that first received an equivocator's
    other vote must still see the polka the others locked on.

Block id (document for verifiers)
    candidate bytes = boxed `remp.consensus.candidate workchain:int shard:long seqno:int
        prev:tonNode.blockIdExt collator:int256 payload:bytes` (collator = key id)
    root_hash = sha256(boxed `remp.consensus.blockRoot workchain:int shard:long seqno:int
        prev:tonNode.blockIdExt payload_hash:int256`), payload_hash = sha256(payload)
    file_hash = sha256(candidate bytes)
    block_id  = tonNode.blockIdExt(workchain, shard, seqno, root_hash, file_hash)

Wire (codecs in remp_node/wire/consensus_tl.py; every datagram is one boxed TL object; ids =
tl_constructor_id of the TL_* lines there;
    ed25519 signatures over the boxed *Data objects)
    remp.consensus.proposal  session_id:int256 round:int pol_round:int candidate:bytes
                             pol_signatures:(vector remp.consensus.signature) signature:int512
        signed: remp.consensus.proposalData session_id:int256 round:int pol_round:int block:tonNode.blockIdExt
        pol_signatures: for pol_round >= 0, the q prevotes of pol_round for the candidate (the
        polka certificate; each is a prevote signature, so a member that lost the old round's
        votes can still check the lock rule), empty for pol_round = -1
    remp.consensus.vote      session_id:int256 kind:int round:int who:int256 block:tonNode.blockIdExt signature:int512
        signed: remp.consensus.voteData session_id:int256 kind:int round:int block:tonNode.blockIdExt
        kind 0 = prevote, 1 = precommit; nil = block id with zero root and file hash
    remp.consensus.commit    session_id:int256 round:int candidate:bytes signatures:(vector remp.consensus.signature)
        remp.consensus.signature who:int256 signature:int512   (precommits of `round`)
    remp.consensus.commitSignatures session_id:int256 round:int block:tonNode.blockIdExt
                             signatures:(vector remp.consensus.signature)
        a commit without its candidate, for a member that holds it (see step 4)
    remp.consensus.getCommits session_id:int256 from_seqno:int max_count:int
        answered with up to min(max_count, CATCHUP_BATCH) commit datagrams
    session_id = sha256(boxed `remp.consensus.session workchain:int shard:long start_seqno:int
        prev:tonNode.blockIdExt members:(vector int256)`) unless given.

Errors: malformed remote input raises ConsensusWireError (ValueError) from the parse_*
functions; receive_datagram never raises for remote input — it drops the datagram, counts the
reason in `drops` and reports the first drop per (source, reason) as DatagramDropped. Local
misuse (bad constructor arguments, collate returning non-bytes or an oversized payload)
raises ConsensusUsageError; an impossible round-step transition raises ConsensusStateError.
"""
from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from enum import Enum
from typing import Callable, NamedTuple

from ..wire.keys import NodeKey, key_id as key_id_of, verify  # noqa: F401  (verify: tests use it from here)
from ..wire.tl import BlockIdExt
from ..wire.consensus_tl import (  # noqa: F401  (the core's names stay importable from here)
    BLOCK_ROOT, Candidate, CANDIDATE, Commit, COMMIT, COMMIT_SIGS, CommitSignatures,
    ConsensusStateError, ConsensusUsageError, ConsensusWireError, decode_master_payload,
    encode_master_payload, GET_COMMITS, GetCommits, is_nil, KIND_NAMES, make_proposal, make_vote,
    MASTER_PAYLOAD, MAX_DATAGRAM, MAX_MEMBERS, MAX_PAYLOAD, _member_ids, nil_block, _pack_sigs,
    parse_message, PRECOMMIT, PREVOTE, PROPOSAL, Proposal, PROPOSAL_DATA, proposal_signed_data,
    quorum, _read_sigs, _reader, SESSION, session_id_for, SignatureMemo, TL_BLOCK_ROOT,
    TL_CANDIDATE, TL_COMMIT, TL_COMMIT_SIGS, TL_GET_COMMITS, TL_MASTER_PAYLOAD, TL_PROPOSAL,
    TL_PROPOSAL_DATA, TL_SESSION, TL_SIGNATURE, TL_VOTE, TL_VOTE_DATA, verify_commit,
    verify_signatures, Vote, VOTE, VOTE_DATA, vote_signed_data, ZERO256, Evidence, verify_evidence)

INF = float("inf")

MASTER_WORKCHAIN = -1
MASTER_SHARD = 0x8000000000000000

MAX_ROUND_AHEAD = 64
"""Messages for rounds further than this past our round are ignored (bounded memory)."""
FUTURE_HEIGHTS = 2
"""Proposals/votes are kept for heights up to this far ahead (a member about to catch up)."""
FUTURE_COMMITS = 256
MAX_VOTES_PER_MEMBER = 4
"""Distinct signed votes kept per member, kind and round (more than one = equivocation)."""
CATCHUP_BATCH = 16
"""Commits sent per getCommits answer / per push."""
KEEP_COMMITS = 4096
"""Commits (and accepted block ids) kept for catch-up answers."""


# --- events -----------------------------------------------------------------------

class ConsensusEvent:
    """Base class of block consensus events."""


@dataclass(frozen=True)
class BlockAccepted(ConsensusEvent):
    """A block is accepted at block_id.seqno (the same block at every honest member).
    payload: the candidate's payload (bytes); signatures: member key id -> 64-byte ed25519
    signature of vote_signed_data(session_id, PRECOMMIT, round, block_id), >= quorum of them;
    round: the round whose precommits accepted it."""

    block_id: BlockIdExt
    payload: bytes
    signatures: dict
    round: int


@dataclass(frozen=True)
class RoundSkipped(ConsensusEvent):
    """Round `round` at `seqno` ended without a block. leader: key id of its leader;
    reason: why (timeout without candidate, rejected candidate, no quorum, jump)."""

    seqno: int
    round: int
    leader: bytes
    reason: str


@dataclass(frozen=True)
class CandidateRejected(ConsensusEvent):
    """Our validate() (or a structural check) refused the candidate `leader` proposed at
    (seqno, round); reason is the validator's text. We prevote nil for it."""

    seqno: int
    round: int
    leader: bytes
    reason: str


@dataclass(frozen=True)
class EquivocationDetected(ConsensusEvent):
    """`member` (key id) double-signed; evidence is verifiable with verify_evidence."""

    member: bytes
    evidence: Evidence


@dataclass(frozen=True)
class DatagramDropped(ConsensusEvent):
    """First drop of a bad datagram for this (src, reason code); later ones only count in
    BlockConsensus.drops. src: transport key id; reason: code; detail: human text."""

    src: bytes
    reason: str
    detail: str


# --- the core ------------------------------------------------------------------------------------

class Step(Enum):
    """What we have sent in the current round."""
    NEW = 0
    PREVOTED = 1
    PRECOMMITTED = 2


_STEP_TABLE = {
    (Step.NEW, "prevote"): Step.PREVOTED,
    (Step.PREVOTED, "precommit"): Step.PRECOMMITTED,
}


class _Drop(NamedTuple):
    """Why an input datagram is dropped: `code` (a metric label, DatagramDropped.reason) and
    `detail` (for the log line). Returned by the input handlers, never raised."""
    code: str
    detail: str = ""


@dataclass
class _Cand:
    candidate: Candidate
    raw: bytes
    round: int           # first round it was proposed in
    leader: bytes
    verdict: bool | str | None = None   # None unknown, True valid, str = reason


class _Own:
    """One of our own messages of the current round: its bytes, the block it names and when
    it was last sent (s, caller's clock; BlockConsensus._resend_due)."""
    __slots__ = ("raw", "block", "at")

    def __init__(self, raw: bytes, block: BlockIdExt, at: float):
        self.raw, self.block, self.at = raw, block, at


class _Height:
    def __init__(self, seqno: int):
        self.seqno = seqno
        self.candidates: dict[BlockIdExt, _Cand] = {}
        self.proposals: dict[int, tuple[Proposal, BlockIdExt, bytes]] = {}
        # (kind, round) -> voter key id -> {block id: signed vote}; first entry = first vote
        self.votes: dict[tuple[int, int], dict[bytes, dict[BlockIdExt, bytes]]] = {}
        self.round_senders: dict[int, set[bytes]] = {}
        self.evidenced: set[tuple] = set()
        # (kind, round) -> _tally() result, dropped whenever a vote of that box is stored
        self.tallies: dict[tuple[int, int], tuple] = {}


class BlockConsensus:
    """Block consensus of one chain for one validator group (see the module docstring).

    members: ordered ed25519 public keys (32 bytes each; order = leader order); local: this
    node's NodeKey (a non-member is an observer: it only follows commits, polling a member
    with getCommits every round_timeout). start_seqno / prev_block_id: the first height and
    the block it extends (None = zero id); every member must pass the same values (they
    enter the default session_id). round_timeout, block_interval, resend_interval: seconds.
    collate(seqno, now) -> payload bytes | None (None: nothing yet, asked again
    `collate_retry` s later); validate(seqno, payload) -> None if valid, else the reason text
    (it is never called for our own candidates nor for blocks arriving with a commit).

    Datagrams: receive_datagram(data, src_key_id, now); datagrams_to_send(now) -> list of
    (dst key id, bytes). Timers: get_timer() -> absolute deadline (s) | None;
    handle_timer(now). Events: next_event() -> ConsensusEvent | None.
    Introspection: height (next seqno to accept), round, block_ids (seqno -> BlockIdExt of
    accepted blocks, last KEEP_COMMITS), drops/ignored (Counter by reason code), evidence.
    """

    def __init__(self, chain_workchain: int, chain_shard: int, members: list[bytes], local: NodeKey, *,
                 start_seqno: int, prev_block_id: BlockIdExt | None, round_timeout: float, block_interval: float,
                 collate: Callable[[int, float], bytes | None], validate: Callable[[int, bytes], str | None],
                 resend_interval: float | None = None, collate_retry: float | None = None,
                 session_id: bytes | None = None, start_time: float | None = None,
                 sig_memo: SignatureMemo | None = None):
        members = [bytes(m) for m in members]
        if not members or len(members) > MAX_MEMBERS or any(len(m) != 32 for m in members):
            raise ConsensusUsageError("members must be 1..1024 public keys of 32 bytes")
        if len(set(members)) != len(members):
            raise ConsensusUsageError("duplicate member")
        if not round_timeout > 0 or not block_interval > 0:
            raise ConsensusUsageError("round_timeout and block_interval must be > 0 seconds")
        if start_seqno < 0:
            raise ConsensusUsageError("start_seqno must be >= 0")
        self.workchain = chain_workchain
        self.shard = chain_shard & 0xFFFFFFFFFFFFFFFF
        self.members = members
        self.member_ids = [key_id_of(m) for m in members]
        self._pub = dict(zip(self.member_ids, members))
        self.n = len(members)
        self.quorum = quorum(self.n)
        self.skip_threshold = self.n - self.quorum + 1
        self.local = local
        #: signatures this node already found valid (shared by the node's sessions)
        self.sig_memo = sig_memo if sig_memo is not None else SignatureMemo()
        self.me = local.key_id
        self.is_member = self.me in self._pub
        self.round_timeout = float(round_timeout)
        self.block_interval = float(block_interval)
        self.resend_interval = float(resend_interval) if resend_interval else self.round_timeout / 4
        self.collate_retry = float(collate_retry) if collate_retry else max(self.round_timeout / 20, 1e-3)
        self._collate = collate
        self._validate = validate
        prev = prev_block_id or BlockIdExt(chain_workchain, self.shard, start_seqno - 1, ZERO256, ZERO256)
        self.session_id = session_id or session_id_for(chain_workchain, self.shard, start_seqno, prev, members)
        if len(self.session_id) != 32:
            raise ConsensusUsageError("session_id must be 32 bytes")

        self.height = start_seqno
        self.prev = prev
        self.round = 0
        self.step = Step.NEW
        self._lock: tuple[int, BlockIdExt | None] = (-1, None)
        self._valid: tuple[int, BlockIdExt | None] = (-1, None)
        self._heights: dict[int, _Height] = {}
        #: current round's own proposal/prevote/precommit: kind -> _Own (raw, block, last sent)
        self._my: dict[str, _Own] = {}
        self._started = False
        self._propose_at = 0.0
        self._deadline = 0.0
        self._next_resend = INF
        self._next_collate = 0.0
        self._next_poll = 0.0
        self._poll_idx = 0
        self._commits: OrderedDict[int, bytes] = OrderedDict()
        #: highest height at which this member signed a proposal or a vote (0: none);
        #: a daemon stores it before the signed datagram leaves (restart safety)
        self.signed_height = 0
        #: heights <= this are muted: no proposal, no vote signed (set by mute_through)
        self.muted_through = 0
        self.block_ids: OrderedDict[int, BlockIdExt] = OrderedDict()
        self._future_commits: dict[int, tuple[Commit, bytes]] = {}
        self._last_push: dict[bytes, float] = {}
        self._accepted_at = -1e18
        self._last_pull: dict[bytes, float] = {}
        self._out: list[tuple[bytes, bytes]] = []
        self._events: deque[ConsensusEvent] = deque()
        self._dropped_once: set[tuple[bytes, str]] = set()
        self.drops: Counter[str] = Counter()
        self.ignored: Counter[str] = Counter()
        self.evidence: list[Evidence] = []
        self.sent_datagrams = 0
        #: datagrams sent again by the resend timer (_resend_due)
        self.resent = 0
        if start_time is not None:
            self._start(start_time)

    # -- public API --------------------------------------------------------------------------

    def leader(self, seqno: int, round: int) -> bytes:
        """Key id of the leader of (seqno, round): members[(seqno + round) % n]."""
        return self.member_ids[(seqno + round) % self.n]

    def receive_datagram(self, data: bytes, src_key_id: bytes, now: float) -> None:
        """Feed one datagram from transport peer `src_key_id`. Never raises for bad input."""
        self._start(now)
        d = self._input(data, src_key_id, now)
        if d is not None:
            self.drops[d.code] += 1
            if (src_key_id, d.code) not in self._dropped_once and len(self._dropped_once) < 10000:
                self._dropped_once.add((src_key_id, d.code))
                self._events.append(DatagramDropped(src_key_id, d.code, d.detail))
            return
        self._progress(now)

    def _input(self, data: bytes, src_key_id: bytes, now: float) -> _Drop | None:
        """Parse and apply one datagram; a _Drop when it is refused (the one place where a
        ConsensusWireError from the parser becomes a drop)."""
        if len(data) > MAX_DATAGRAM:
            return _Drop("oversized", f"{len(data)} bytes > {MAX_DATAGRAM}")
        try:
            msg = parse_message(data)
        except ConsensusWireError as exc:
            return _Drop("malformed", str(exc))
        if msg.session_id != self.session_id:
            return _Drop("wrong_session", msg.session_id.hex()[:16])
        if isinstance(msg, Proposal):
            return self._on_proposal(msg, data, src_key_id, now)
        if isinstance(msg, Vote):
            return self._on_vote(msg, data, src_key_id, now)
        if isinstance(msg, Commit):
            return self._on_commit(msg, data, src_key_id, now)
        if isinstance(msg, CommitSignatures):
            return self._on_commit_signatures(msg, src_key_id, now)
        self._on_get_commits(msg, src_key_id, now)
        return None

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, bytes]]:
        """Pending (dst key id, datagram) pairs; the list is handed over (cleared here)."""
        self._start(now)
        out, self._out = self._out, []
        self.sent_datagrams += len(out)
        return out

    def get_timer(self) -> float | None:
        """Absolute time (s) at which handle_timer should run next (0.0 before the first call)."""
        if not self._started:
            return 0.0
        if not self.is_member:
            return self._next_poll
        t = min(self._deadline, self._next_resend)
        if self.leader(self.height, self.round) == self.me and "proposal" not in self._my:
            t = min(t, max(self._propose_at, self._next_collate))
        return t

    def handle_timer(self, now: float) -> None:
        """Run what is due at `now`: round deadline, resends, proposing, observer polling."""
        self._start(now)
        if not self.is_member:
            if now >= self._next_poll:
                self._send(self.member_ids[self._poll_idx % self.n],
                           GetCommits(self.session_id, self.height, CATCHUP_BATCH).pack())
                self._poll_idx += 1
                self._next_poll = now + self.round_timeout
            return
        if now >= self._deadline:
            self._timeout(now)
        if now >= self._next_resend:
            self._resend_due(now)
        self._progress(now)

    def next_event(self) -> ConsensusEvent | None:
        return self._events.popleft() if self._events else None

    def commit_for(self, seqno: int) -> bytes | None:
        """The commit datagram of accepted block `seqno` (if still kept)."""
        return self._commits.get(seqno)

    # -- internals: bookkeeping ---------------------------------------------------------------

    def _start(self, now: float) -> None:
        if self._started:
            return
        self._started = True
        self._begin_height(now)
        self._next_poll = now

    def _begin_height(self, now: float) -> None:
        self.round = 0
        self.step = Step.NEW
        self._lock = (-1, None)
        self._valid = (-1, None)
        self._clear_my()
        self._propose_at = now + self.block_interval
        self._deadline = self._propose_at + self.round_duration(0)
        self._next_collate = 0.0
        for s in [s for s in self._heights if s < self.height]:
            del self._heights[s]

    def _h(self, seqno: int) -> _Height:
        h = self._heights.get(seqno)
        if h is None:
            h = self._heights[seqno] = _Height(seqno)
        return h

    def _transition(self, event: str) -> None:
        nxt = _STEP_TABLE.get((self.step, event))
        if nxt is None:
            raise ConsensusStateError(self.step, event)
        self.step = nxt

    def _send(self, dst: bytes, data: bytes) -> None:
        self._out.append((dst, data))

    def _broadcast(self, data: bytes) -> None:
        for m in self.member_ids:
            if m != self.me:
                self._out.append((m, data))

    # -- own messages of the round and their resends ------------------------------------------
    def _clear_my(self) -> None:
        self._my = {}
        self._next_resend = INF

    def _sent_my(self, kind: str, raw: bytes, block: BlockIdExt, now: float) -> None:
        """Our `kind` message of the current round was signed and broadcast at `now`."""
        self._my[kind] = _Own(raw, block, now)
        self._next_resend = min(self._next_resend, now + self.resend_interval)
        self._broadcast(raw)

    def _resend_due(self, now: float) -> None:
        """Resend each of our current-round messages last sent resend_interval ago or more
        (each on its own clock: one timer for the round sent a vote cast 50 ms earlier again,
        a third of all consensus datagrams at 100 msg/s in bench_remp_daemon), to every
        member except those that provably no longer need it (_needs)."""
        nxt = INF
        for kind in ("proposal", "prevote", "precommit"):
            own = self._my.get(kind)
            if own is None:
                continue
            due = own.at + self.resend_interval
            if now >= due - 1e-9:
                h = self._heights.get(self.height)
                for m in self.member_ids:
                    if m != self.me and (h is None or self._needs(h, m, kind)):
                        self._out.append((m, own.raw))
                        self.resent += 1
                own.at = now
                due = now + self.resend_interval
            nxt = min(nxt, due)
        self._next_resend = nxt

    def _needs(self, h: "_Height", m: bytes, kind: str) -> bool:
        """False when member m provably has no use for our `kind` message of this round any
        more: the proposal, when m prevoted or precommitted its block in this round (m holds
        the candidate); our prevote, when m precommitted a block (not nil) in this round (it
        saw that round's polka, the only one the round can have, and takes no more prevotes
        of it into account). Everything else is resent (precommits always)."""
        r = self.round
        if kind == "proposal":
            b = self._my["proposal"].block
            return not (b in h.votes.get((PREVOTE, r), {}).get(m, ())
                        or b in h.votes.get((PRECOMMIT, r), {}).get(m, ()))
        if kind == "prevote":
            nil = self._nil()
            return not any(b != nil for b in h.votes.get((PRECOMMIT, r), {}).get(m, ()))
        return True

    def _emit(self, ev: ConsensusEvent) -> None:
        self._events.append(ev)

    def _check_height(self, seqno: int, src: bytes, now: float) -> bool:
        """True if a message for `seqno` should be stored; answers stale/future senders."""
        if seqno < self.height:
            self.ignored["stale_height"] += 1
            # a vote for the block just accepted that arrives right after the quorum is the
            # normal late vote of a member that decides by itself: a push only once it had
            # time to (a member that is really behind resends every resend_interval)
            if seqno < self.height - 1 or now - self._accepted_at >= self.resend_interval / 2:
                self._push(src, seqno, now)
            return False
        if seqno > self.height:
            self._pull(src, now)
        if seqno > self.height + FUTURE_HEIGHTS:
            self.ignored["far_future_height"] += 1
            return False
        return True

    def _round_ok(self, seqno: int, round: int) -> bool:
        base = self.round if seqno == self.height else 0
        if round > base + MAX_ROUND_AHEAD:
            self.ignored["far_future_round"] += 1
            return False
        return True

    def _push(self, src: bytes, seqno: int, now: float) -> None:
        """`src` is behind: send it the commits from `seqno` on (rate-limited per peer)."""
        if src not in self._pub or now < self._last_push.get(src, -1e18) + self.resend_interval / 2:
            return
        sent = 0
        for s in range(seqno, self.height):
            c = self._commits.get(s)
            if c is not None:
                self._send(src, c)
                sent += 1
                if sent >= CATCHUP_BATCH:
                    break
        if sent:
            self._last_push[src] = now

    def _pull(self, src: bytes, now: float) -> None:
        """`src` is ahead: ask it for the commits we miss (rate-limited per peer)."""
        if src not in self._pub or now < self._last_pull.get(src, -1e18) + self.resend_interval / 2:
            return
        self._last_pull[src] = now
        self._send(src, GetCommits(self.session_id, self.height, CATCHUP_BATCH).pack())

    def _record_evidence(self, h: _Height, member: bytes, round: int, kind: str, first: bytes, second: bytes) -> None:
        key = (member, round, kind)
        if key in h.evidenced:
            return
        h.evidenced.add(key)
        ev = Evidence(member, h.seqno, round, kind, first, second)
        self.evidence.append(ev)
        self._emit(EquivocationDetected(member, ev))

    # -- internals: input ---------------------------------------------------------------------

    def _wrong_chain(self, b: BlockIdExt | Candidate) -> _Drop | None:
        if b.workchain != self.workchain or (b.shard & 0xFFFFFFFFFFFFFFFF) != self.shard:
            return _Drop("wrong_chain", f"{b.workchain}:{b.shard:016x}")
        return None

    def _on_proposal(self, p: Proposal, raw: bytes, src: bytes, now: float) -> _Drop | None:
        cand = p.candidate
        if (d := self._wrong_chain(cand)) is not None:
            return d
        if cand.collator not in self._pub:
            return _Drop("bad_candidate", "collator is not a member")
        if not self._check_height(cand.seqno, src, now) or not self._round_ok(cand.seqno, p.round):
            return None
        leader = self.leader(cand.seqno, p.round)
        h = self._heights.get(cand.seqno)
        if h is not None and (prior := h.proposals.get(p.round)) is not None and prior[2] == raw:
            self.ignored["duplicate"] += 1      # a resend of the proposal already verified
            return None
        bid = cand.block_id
        if not self.sig_memo.verify(self._pub[leader], p.signed_data(bid), p.signature):
            return _Drop("bad_signature", "proposal not signed by the round's leader")
        h = self._h(cand.seqno)
        prior = h.proposals.get(p.round)
        if prior is not None:
            if prior[1] == bid:
                self.ignored["duplicate"] += 1
            else:
                self._record_evidence(h, leader, p.round, "proposal", prior[2], raw)
            return None
        if p.pol_round >= 0:
            pol_votes = [Vote(self.session_id, PREVOTE, p.pol_round, who, bid, sig) for who, sig in p.pol_signatures]
            for v in pol_votes:
                if v.who not in self._pub or not self.sig_memo.verify(self._pub[v.who], v.signed_data(), v.signature):
                    return _Drop("bad_signature", "proposal carries an invalid pol_round prevote")
            if len({v.who for v in pol_votes}) < self.quorum:
                return _Drop("bad_candidate", "re-proposal without a polka certificate")
            for v in pol_votes:
                self._store_vote(h, v, v.pack())
        h.proposals[p.round] = (p, bid, raw)
        if bid not in h.candidates:
            h.candidates[bid] = _Cand(cand, p.candidate_bytes, p.round, leader)
        h.round_senders.setdefault(p.round, set()).add(leader)
        return None

    def _on_vote(self, v: Vote, raw: bytes, src: bytes, now: float) -> _Drop | None:
        if v.who not in self._pub:
            return _Drop("not_member", "vote signer is not a member")
        if (d := self._wrong_chain(v.block)) is not None:
            return d
        if not self._check_height(v.block.seqno, src, now) or not self._round_ok(v.block.seqno, v.round):
            return None
        h = self._heights.get(v.block.seqno)
        if h is not None and h.votes.get((v.kind, v.round), {}).get(v.who, {}).get(v.block) == raw:
            # the same bytes as a vote already verified and stored (a resend): no ed25519 check
            self.ignored["duplicate"] += 1
            return None
        if not self.sig_memo.verify(self._pub[v.who], v.signed_data(), v.signature):
            return _Drop("bad_signature", f"{KIND_NAMES[v.kind]} signature invalid")
        self._store_vote(self._h(v.block.seqno), v, raw)
        return None

    def _store_vote(self, h: _Height, v: Vote, raw: bytes) -> None:
        """Record a verified vote (first per member, round and kind; a different second one
        is evidence)."""
        mine = h.votes.setdefault((v.kind, v.round), {}).setdefault(v.who, {})
        if v.block in mine:
            self.ignored["duplicate"] += 1
            return
        if mine:
            first = next(iter(mine.values()))
            self._record_evidence(h, v.who, v.round, KIND_NAMES[v.kind], first, raw)
            if len(mine) >= MAX_VOTES_PER_MEMBER:
                self.ignored["equivocation_cap"] += 1
                return
        mine[v.block] = raw
        h.tallies.pop((v.kind, v.round), None)
        h.round_senders.setdefault(v.round, set()).add(v.who)

    def _on_commit(self, c: Commit, raw: bytes, src: bytes, now: float) -> _Drop | None:
        cand = c.candidate
        if (d := self._wrong_chain(cand)) is not None:
            return d
        s = cand.seqno
        if s < self.height:
            self.ignored["stale_commit"] += 1
            return None
        if s > self.height + FUTURE_COMMITS:
            self.ignored["far_future_commit"] += 1
            self._pull(src, now)
            return None
        if s in self._future_commits:
            self.ignored["duplicate"] += 1
            return None
        try:
            verify_commit(self.session_id, self.members, c, self.sig_memo)
        except ConsensusWireError as exc:
            return _Drop("bad_commit", str(exc))
        if s > self.height:
            self._future_commits[s] = (c, raw)
            self._pull(src, now)
            return None
        if cand.prev != self.prev:
            return _Drop("commit_prev_mismatch", f"commit at {s} extends another block")
        self._accept(cand, c.round, dict(c.signatures), raw, now, broadcast=False)
        return None

    def _on_commit_signatures(self, c: CommitSignatures, src: bytes, now: float) -> _Drop | None:
        b = c.block
        if (d := self._wrong_chain(b)) is not None:
            return d
        if b.seqno < self.height:
            self.ignored["stale_commit"] += 1
            return None
        h = self._heights.get(b.seqno)
        cand = h.candidates.get(b) if h is not None else None
        if b.seqno > self.height or cand is None or cand.candidate.prev != self.prev:
            self._pull(src, now)        # we lack the candidate (or earlier blocks): the whole commit
            return None
        try:
            verify_signatures(self.session_id, self.members, c.round, b, c.signatures, self.sig_memo)
        except ConsensusWireError as exc:
            return _Drop("bad_commit", str(exc))
        self._accept(cand.candidate, c.round, dict(c.signatures), None, now, broadcast=False)
        return None

    def _on_get_commits(self, g: GetCommits, src: bytes, now: float) -> None:
        end = min(self.height, g.from_seqno + min(g.max_count, CATCHUP_BATCH))
        for s in range(g.from_seqno, end):
            c = self._commits.get(s)
            if c is not None:
                self._send(src, c)

    # -- internals: rules -------------------------------------------------------------------------

    def _accept(self, cand: Candidate, round: int, sigs: dict, commit_raw: bytes | None, now: float,
                broadcast: bool) -> None:
        bid = cand.block_id
        pairs = self._member_order(sigs)
        if commit_raw is None:
            commit_raw = Commit(self.session_id, round, cand.pack(), pairs, cand).pack()
        self._commits[bid.seqno] = commit_raw
        self.block_ids[bid.seqno] = bid
        while len(self._commits) > KEEP_COMMITS:
            self._commits.popitem(last=False)
        while len(self.block_ids) > KEEP_COMMITS:
            self.block_ids.popitem(last=False)
        self._emit(BlockAccepted(bid, cand.payload, dict(sigs), round))
        if broadcast and self.is_member:
            # Who gets a commit: a member from which we hold a prevote or a precommit for
            # this block has the candidate and gets every precommit broadcast, so it decides
            # by itself; the block's collator alone sends those the signatures only
            # (remp.consensus.commitSignatures, one copy each: a member that lost precommits).
            # The others (no vote for the block seen: they may lack the candidate) get the
            # whole commit from every member. A member that lost all of that catches up by
            # push (its resent vote is a stale-height message, _check_height) or pull (it
            # sees the next height). Every member sending a copy to every other one (n*(n-1),
            # 182 per master block of 14 members) plus a whole-commit push answering each
            # vote that arrived after the quorum were most of the masterchain's datagrams.
            h = self._heights.get(bid.seqno)
            knows = set(sigs)
            if h is not None:
                for (kind, _r), box in h.votes.items():
                    knows.update(who for who, blocks in box.items() if bid in blocks)
            lead = cand.collator == self.me
            compact = CommitSignatures(self.session_id, round, bid, pairs).pack() if lead else None
            for m in self.member_ids:
                if m == self.me:
                    continue
                if m not in knows:
                    self._out.append((m, commit_raw))
                elif lead:
                    self._out.append((m, compact))
        self._accepted_at = now
        self.prev = bid
        self.height = bid.seqno + 1
        self._future_commits.pop(bid.seqno, None)
        self._begin_height(now)

    def _verdict(self, h: _Height, bid: BlockIdExt) -> bool | str:
        """Validity of a candidate at the current height (validate() called once)."""
        c = h.candidates[bid]
        if c.verdict is None:
            if c.candidate.prev != self.prev:
                c.verdict = f"candidate extends {c.candidate.prev.root_hash.hex()[:16]}, not our last block"
            else:
                try:
                    reason = self._validate(h.seqno, c.candidate.payload)
                except Exception as exc:  # the caller's validator must not crash the core
                    reason = f"validate raised {exc!r}"
                c.verdict = True if reason is None else str(reason)
            if c.verdict is not True:
                self._emit(CandidateRejected(h.seqno, c.round, c.leader, c.verdict))
        return c.verdict

    def _member_order(self, sigs: dict) -> tuple:
        """(who, signature) pairs of `sigs` in member order, as commits carry them."""
        order = {m: i for i, m in enumerate(self.member_ids)}
        return tuple(sorted(sigs.items(), key=lambda kv: order[kv[0]]))

    def _tally(self, h: _Height, kind: int, round: int) -> tuple[Counter, int, dict]:
        """(votes per block, voters, the box) of (kind, round); cached until a vote of that
        box is stored (_progress tallies after every datagram; callers only read the result)."""
        res = h.tallies.get((kind, round))
        if res is not None:
            return res
        box = h.votes.get((kind, round), {})
        counts: Counter = Counter()
        for blocks in box.values():
            counts.update(blocks.keys())
        res = (counts, len(box), box)
        if box:
            h.tallies[(kind, round)] = res
        return res

    def _polka(self, h: _Height, round: int) -> BlockIdExt | None:
        counts, _, _ = self._tally(h, PREVOTE, round)
        for b, c in counts.items():
            if c >= self.quorum and not is_nil(b):
                return b
        return None

    def _impossible(self, counts: Counter, total: int) -> bool:
        """No non-nil block can reach quorum among the votes still to come."""
        best = max((c for b, c in counts.items() if not is_nil(b)), default=0)
        return best + (self.n - total) < self.quorum

    def round_duration(self, round: int) -> float:
        """Seconds round `round` of a height may last: round_timeout * (1 + round / 2),
        at most 8 x round_timeout. Growing timeouts are what makes Tendermint live under
        partial synchrony (timeoutPropose + r * delta): when a loaded machine cannot gather
        a quorum within round_timeout, later rounds get the time they need instead of
        timing out forever."""
        return self.round_timeout * min(1.0 + 0.5 * max(round, 0), 8.0)

    def mute_through(self, height: int) -> None:
        """Restart safety: never sign a proposal or a vote at a height <= `height` (this
        member may have signed there before a crash, and a second, different signature
        would be an equivocation). The state machine still steps (our missing votes count
        as absent); commits from others are still accepted, so the member catches up and
        signs again from height + 1."""
        self.muted_through = max(self.muted_through, int(height))

    def _vote(self, kind: int, block: BlockIdExt, now: float) -> None:
        if self.height <= self.muted_through:
            self.ignored["muted_vote"] += 1
            self._transition(KIND_NAMES[kind])
            return
        self.signed_height = max(self.signed_height, self.height)
        v = make_vote(self.local, self.session_id, kind, self.round, block)
        raw = v.pack()
        h = self._h(self.height)
        h.votes.setdefault((kind, self.round), {})[self.me] = {block: raw}
        h.tallies.pop((kind, self.round), None)
        h.round_senders.setdefault(self.round, set()).add(self.me)
        self._transition(KIND_NAMES[kind])
        self._sent_my(KIND_NAMES[kind], raw, block, now)

    def _nil(self) -> BlockIdExt:
        return nil_block(self.workchain, self.shard, self.height)

    def _next_round(self, now: float, reason: str, to_round: int | None = None) -> None:
        self._emit(RoundSkipped(self.height, self.round, self.leader(self.height, self.round), reason))
        self.round = self.round + 1 if to_round is None else to_round
        self.step = Step.NEW
        self._clear_my()
        self._propose_at = now
        self._next_collate = 0.0
        self._deadline = now + self.round_duration(self.round)

    def _round_failure(self, h: _Height) -> str:
        prop = h.proposals.get(self.round)
        if prop is None:
            return "no candidate from the leader"
        c = h.candidates[prop[1]]
        if isinstance(c.verdict, str):
            return f"candidate rejected: {c.verdict}"
        return "no quorum"

    def _timeout(self, now: float) -> None:
        h = self._h(self.height)
        reason = f"timeout after {self.round_timeout:g}s: {self._round_failure(h)}"
        if self.step is Step.NEW:
            self._vote(PREVOTE, self._nil(), now)
        if self.step is Step.PREVOTED:
            self._vote(PRECOMMIT, self._nil(), now)
        self._next_round(now, reason)

    def _try_future_commit(self, now: float) -> bool:
        item = self._future_commits.get(self.height)
        if item is None:
            return False
        c, raw = item
        del self._future_commits[self.height]
        if c.candidate.prev != self.prev:
            self.drops["commit_prev_mismatch"] += 1
            return True
        self._accept(c.candidate, c.round, dict(c.signatures), raw, now, broadcast=False)
        return True

    def _try_decide(self, h: _Height, now: float) -> bool:
        for (kind, rnd), box in list(h.votes.items()):
            if kind != PRECOMMIT or len(box) < self.quorum:
                continue
            counts, _, _ = self._tally(h, PRECOMMIT, rnd)
            for b, c in counts.items():
                if c < self.quorum or is_nil(b):
                    continue
                cand = h.candidates.get(b)
                if cand is None or cand.candidate.prev != self.prev:
                    # a quorum exists but we lack the candidate: fetch the commit
                    for who, blocks in box.items():
                        if b in blocks and who != self.me:
                            self._pull(who, now)
                            break
                    continue
                sigs = {}
                for who, blocks in box.items():
                    if b in blocks:
                        sigs[who] = blocks[b][-64:]
                self._accept(cand.candidate, rnd, sigs, None, now, broadcast=True)
                return True
        return False

    def _try_jump(self, h: _Height, now: float) -> bool:
        target = None
        for r, senders in h.round_senders.items():
            if r > self.round and len(senders) >= self.skip_threshold and (target is None or r > target):
                target = r
        if target is None:
            return False
        self._next_round(now, f"jumped to round {target}: {self.skip_threshold} members are there", target)
        return True

    def _try_propose(self, h: _Height, now: float) -> bool:
        if (self.leader(self.height, self.round) != self.me or "proposal" in self._my
                or now < self._propose_at or now < self._next_collate or self.height <= self.muted_through):
            return False
        vr, vb = self._valid
        pol_sigs: tuple = ()
        if vb is not None and vb in h.candidates:
            cand, pol = h.candidates[vb].candidate, vr
            box = h.votes.get((PREVOTE, vr), {})
            pol_sigs = tuple((who, blocks[vb][-64:]) for who, blocks in box.items() if vb in blocks)
        else:
            payload = self._collate(self.height, now)
            if payload is None:
                self._next_collate = now + self.collate_retry
                return False
            if not isinstance(payload, (bytes, bytearray)) or len(payload) > MAX_PAYLOAD:
                raise ConsensusUsageError(f"collate must return bytes of <= {MAX_PAYLOAD} bytes or None")
            cand, pol = Candidate(self.workchain, self.shard, self.height, self.prev, self.me, bytes(payload)), -1
        self.signed_height = max(self.signed_height, self.height)
        p = make_proposal(self.local, self.session_id, self.round, pol, cand, pol_sigs)
        raw = p.pack()
        bid = cand.block_id
        if bid not in h.candidates:
            h.candidates[bid] = _Cand(cand, p.candidate_bytes, self.round, self.me, verdict=True)
        prior = h.proposals.get(self.round)
        if prior is None:
            h.proposals[self.round] = (p, bid, raw)
        h.round_senders.setdefault(self.round, set()).add(self.me)
        self._sent_my("proposal", raw, bid, now)
        return True

    def _try_prevote(self, h: _Height, now: float) -> bool:
        prop = h.proposals.get(self.round)
        if prop is None:
            return False
        p, bid, _raw = prop
        lr, lb = self._lock
        if self._verdict(h, bid) is not True:
            choice = self._nil()
        elif p.pol_round < 0:
            choice = bid if lb is None or lb == bid else self._nil()
        elif self._polka(h, p.pol_round) == bid:
            choice = bid if lr <= p.pol_round or lb == bid else self._nil()
        elif lb == bid:
            choice = bid
        else:
            return False   # wait for the prevotes of pol_round (or the deadline)
        self._vote(PREVOTE, choice, now)
        return True

    def _try_precommit(self, h: _Height, now: float) -> bool:
        b = self._polka(h, self.round)
        if b is not None:
            if b in h.candidates and self._verdict(h, b) is True:
                self._lock = (self.round, b)
                self._valid = (self.round, b)
                self._vote(PRECOMMIT, b, now)
                return True
            if b in h.candidates:   # a polka for a block we find invalid
                self._vote(PRECOMMIT, self._nil(), now)
                return True
            return False            # wait for the proposal to arrive
        counts, total, _ = self._tally(h, PREVOTE, self.round)
        if self._impossible(counts, total):
            self._vote(PRECOMMIT, self._nil(), now)
            return True
        return False

    def _update_valid(self, h: _Height) -> None:
        """valid := the candidate of the latest polka seen (any round up to ours)."""
        for kind, r in sorted(h.votes, key=lambda kr: -kr[1]):
            if kind != PREVOTE or r <= self._valid[0] or r > self.round:
                continue
            b = self._polka(h, r)
            if b is not None and b in h.candidates and self._verdict(h, b) is True:
                self._valid = (r, b)
                return

    def _progress(self, now: float) -> None:
        for _ in range(10000):
            if self._try_future_commit(now):
                continue
            h = self._h(self.height)
            if self._try_decide(h, now):
                continue
            if not self.is_member:
                return
            if self._try_jump(h, now):
                continue
            if self._try_propose(h, now):
                continue
            if self.step is Step.NEW and self._try_prevote(h, now):
                continue
            if self.step is Step.PREVOTED and self._try_precommit(h, now):
                continue
            self._update_valid(h)
            if self.step is Step.PRECOMMITTED:
                counts, total, _ = self._tally(h, PRECOMMIT, self.round)
                if self._impossible(counts, total):
                    self._next_round(now, f"no commit possible: {self._round_failure(h)}")
                    continue
            return
        raise ConsensusUsageError("consensus rules did not settle")  # pragma: no cover
