"""Block consensus's TL objects and their pure checks: the remp.consensus.* schema and
constructor ids, Candidate / Proposal / Vote / Commit / CommitSignatures / GetCommits,
signed-data layouts, the datagram parser, commit and signature verification (with its memo)
and the master payload codec. No state: the Tendermint-style state machine that proposes,
votes, commits and catches up is remp_node/core/consensus.py, whose module docstring gives
the wire layout and the drop reasons (DESIGN.md section 4).

Errors: malformed remote input raises ConsensusWireError (a RempRemoteError); misuse raises
ConsensusUsageError (a RempLocalError), an impossible step transition ConsensusStateError.
"""
from __future__ import annotations

import functools
import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

from ..errors import RempLocalError, RempRemoteError
from .keys import NodeKey, key_id as key_id_of, verify
from .tl import (BlockIdExt, TLError, TLReader, pack_bytes, pack_id, pack_int, pack_int256, pack_int512, pack_long,
                 tl_constructor_id)

# --- TL schema ------------------------------------------------------------------------------

TL_CANDIDATE = ("remp.consensus.candidate workchain:int shard:long seqno:int prev:tonNode.blockIdExt "
                "collator:int256 payload:bytes = remp.consensus.Candidate")
TL_BLOCK_ROOT = ("remp.consensus.blockRoot workchain:int shard:long seqno:int prev:tonNode.blockIdExt "
                 "payload_hash:int256 = remp.consensus.BlockRoot")
TL_SESSION = ("remp.consensus.session workchain:int shard:long start_seqno:int prev:tonNode.blockIdExt "
              "members:(vector int256) = remp.consensus.Session")
TL_PROPOSAL_DATA = ("remp.consensus.proposalData session_id:int256 round:int pol_round:int "
                    "block:tonNode.blockIdExt = remp.consensus.SignedData")
TL_VOTE_DATA = ("remp.consensus.voteData session_id:int256 kind:int round:int block:tonNode.blockIdExt "
                "= remp.consensus.SignedData")
TL_PROPOSAL = ("remp.consensus.proposal session_id:int256 round:int pol_round:int candidate:bytes "
               "pol_signatures:(vector remp.consensus.signature) signature:int512 = remp.consensus.Message")
TL_VOTE = ("remp.consensus.vote session_id:int256 kind:int round:int who:int256 block:tonNode.blockIdExt "
           "signature:int512 = remp.consensus.Message")
TL_SIGNATURE = "remp.consensus.signature who:int256 signature:int512 = remp.consensus.Signature"
TL_COMMIT = ("remp.consensus.commit session_id:int256 round:int candidate:bytes "
             "signatures:(vector remp.consensus.signature) = remp.consensus.Message")
TL_COMMIT_SIGS = ("remp.consensus.commitSignatures session_id:int256 round:int block:tonNode.blockIdExt "
                  "signatures:(vector remp.consensus.signature) = remp.consensus.Message")
TL_GET_COMMITS = ("remp.consensus.getCommits session_id:int256 from_seqno:int max_count:int "
                  "= remp.consensus.Message")
TL_MASTER_PAYLOAD = ("remp.consensus.masterPayload shard_blocks:(vector tonNode.blockIdExt) "
                     "= remp.consensus.MasterPayload")

CANDIDATE = tl_constructor_id(TL_CANDIDATE)
BLOCK_ROOT = tl_constructor_id(TL_BLOCK_ROOT)
SESSION = tl_constructor_id(TL_SESSION)
PROPOSAL_DATA = tl_constructor_id(TL_PROPOSAL_DATA)
VOTE_DATA = tl_constructor_id(TL_VOTE_DATA)
PROPOSAL = tl_constructor_id(TL_PROPOSAL)
VOTE = tl_constructor_id(TL_VOTE)
COMMIT = tl_constructor_id(TL_COMMIT)
GET_COMMITS = tl_constructor_id(TL_GET_COMMITS)
COMMIT_SIGS = tl_constructor_id(TL_COMMIT_SIGS)
MASTER_PAYLOAD = tl_constructor_id(TL_MASTER_PAYLOAD)

PREVOTE = 0
PRECOMMIT = 1
KIND_NAMES = {PREVOTE: "prevote", PRECOMMIT: "precommit"}
ZERO256 = bytes(32)

MAX_DATAGRAM = 1 << 20
"""Largest datagram accepted (bytes); a candidate payload must leave room for the envelope."""
MAX_PAYLOAD = MAX_DATAGRAM - 64 * 1024
MAX_MEMBERS = 1024


class ConsensusWireError(RempRemoteError):
    """A peer sent a malformed or invalid consensus datagram (reason "malformed" unless
    given)."""


class ConsensusUsageError(RempLocalError):
    """The local caller misused the consensus API."""


class ConsensusStateError(ConsensusUsageError):
    """An impossible round-step transition (names the state and the input)."""

    def __init__(self, state: "Step", event: str):
        super().__init__(f"impossible transition: step {state.name} on {event!r}")
        self.state = state
        self.event = event


# --- wire objects ---------------------------------------------------------------------------

def _reader(data: bytes, limit: int = MAX_DATAGRAM) -> TLReader:
    try:
        return TLReader(data, max_bytes=limit)
    except TLError as exc:
        raise ConsensusWireError(str(exc)) from None


def nil_block(workchain: int, shard: int, seqno: int) -> BlockIdExt:
    """The nil vote's block id: zero root and file hash."""
    return BlockIdExt(workchain, shard, seqno, ZERO256, ZERO256)


def is_nil(b: BlockIdExt) -> bool:
    return b.root_hash == ZERO256 and b.file_hash == ZERO256


@dataclass(frozen=True)
class Candidate:
    """A block candidate: chain (workchain, shard), seqno, prev (the block it extends),
    collator (key id, 32 bytes) and the caller's payload (bytes)."""

    workchain: int
    shard: int
    seqno: int
    prev: BlockIdExt
    collator: bytes
    payload: bytes

    def pack(self) -> bytes:
        """Boxed remp.consensus.candidate (the bytes file_hash is taken over)."""
        return (pack_id(CANDIDATE) + pack_int(self.workchain) + pack_long(self.shard) + pack_int(self.seqno)
                + self.prev.pack() + pack_int256(self.collator) + pack_bytes(self.payload))

    @property
    def root_hash(self) -> bytes:
        return hashlib.sha256(pack_id(BLOCK_ROOT) + pack_int(self.workchain) + pack_long(self.shard)
                              + pack_int(self.seqno) + self.prev.pack()
                              + pack_int256(hashlib.sha256(self.payload).digest())).digest()

    @property
    def block_id(self) -> BlockIdExt:
        return BlockIdExt(self.workchain, self.shard, self.seqno, self.root_hash,
                          hashlib.sha256(self.pack()).digest())

    @classmethod
    def parse(cls, data: bytes) -> "Candidate":
        """Parse boxed candidate bytes; raises ConsensusWireError."""
        r = _reader(data)
        try:
            if r.constructor() != CANDIDATE:
                raise ConsensusWireError("candidate: wrong constructor")
            c = cls(r.int(), r.ulong(), r.int(), BlockIdExt.read(r), r.int256(), r.bytes())
            r.finish()
        except TLError as exc:
            raise ConsensusWireError(f"candidate: {exc}") from None
        if len(c.payload) > MAX_PAYLOAD:
            raise ConsensusWireError(f"candidate payload {len(c.payload)} bytes > {MAX_PAYLOAD}")
        return c


def proposal_signed_data(session_id: bytes, round: int, pol_round: int, block: BlockIdExt) -> bytes:
    return pack_id(PROPOSAL_DATA) + pack_int256(session_id) + pack_int(round) + pack_int(pol_round) + block.pack()


def vote_signed_data(session_id: bytes, kind: int, round: int, block: BlockIdExt) -> bytes:
    """The bytes a prevote/precommit signature covers; BlockAccepted.signatures are ed25519
    signatures of vote_signed_data(session_id, PRECOMMIT, round, block_id)."""
    return pack_id(VOTE_DATA) + pack_int256(session_id) + pack_int(kind) + pack_int(round) + block.pack()


@dataclass(frozen=True)
class Proposal:
    session_id: bytes
    round: int
    pol_round: int
    candidate_bytes: bytes
    signature: bytes
    candidate: Candidate = field(compare=False, repr=False)
    pol_signatures: tuple = ()   # ((who key id, prevote signature of pol_round), ...)

    def pack(self) -> bytes:
        return (pack_id(PROPOSAL) + pack_int256(self.session_id) + pack_int(self.round) + pack_int(self.pol_round)
                + pack_bytes(self.candidate_bytes) + _pack_sigs(self.pol_signatures) + pack_int512(self.signature))

    def signed_data(self, block: BlockIdExt | None = None) -> bytes:
        return proposal_signed_data(self.session_id, self.round, self.pol_round, block or self.candidate.block_id)


@dataclass(frozen=True)
class Vote:
    session_id: bytes
    kind: int
    round: int
    who: bytes
    block: BlockIdExt
    signature: bytes

    def pack(self) -> bytes:
        return (pack_id(VOTE) + pack_int256(self.session_id) + pack_int(self.kind) + pack_int(self.round)
                + pack_int256(self.who) + self.block.pack() + pack_int512(self.signature))

    def signed_data(self) -> bytes:
        return vote_signed_data(self.session_id, self.kind, self.round, self.block)


@dataclass(frozen=True)
class Commit:
    session_id: bytes
    round: int
    candidate_bytes: bytes
    signatures: tuple  # ((who key id, 64-byte signature), ...)
    candidate: Candidate = field(compare=False, repr=False)

    def pack(self) -> bytes:
        return (pack_id(COMMIT) + pack_int256(self.session_id) + pack_int(self.round)
                + pack_bytes(self.candidate_bytes) + _pack_sigs(self.signatures))


@dataclass(frozen=True)
class CommitSignatures:
    """A commit without its candidate: the block id and the precommits of `round` for it.
    Sent to members whose precommit for the block the sender holds (they hold the candidate);
    a receiver without the candidate asks for the whole commit (getCommits)."""

    session_id: bytes
    round: int
    block: BlockIdExt
    signatures: tuple  # ((who key id, 64-byte signature), ...)

    def pack(self) -> bytes:
        return (pack_id(COMMIT_SIGS) + pack_int256(self.session_id) + pack_int(self.round) + self.block.pack()
                + _pack_sigs(self.signatures))


def _pack_sigs(sigs) -> bytes:
    return pack_int(len(sigs)) + b"".join(pack_int256(w) + pack_int512(s) for w, s in sigs)


def _read_sigs(r: TLReader, allow_empty: bool) -> tuple:
    count = r.int()
    if not (0 if allow_empty else 1) <= count <= MAX_MEMBERS:
        raise ConsensusWireError(f"bad signature count {count}")
    # one read of count x 96 bytes, sliced here (two reader calls per signature before)
    raw = r.raw(96 * count)
    return tuple((raw[i:i + 32], raw[i + 32:i + 96]) for i in range(0, 96 * count, 96))


@dataclass(frozen=True)
class GetCommits:
    session_id: bytes
    from_seqno: int
    max_count: int

    def pack(self) -> bytes:
        return pack_id(GET_COMMITS) + pack_int256(self.session_id) + pack_int(self.from_seqno) + pack_int(self.max_count)


def parse_message(data: bytes) -> Proposal | Vote | Commit | CommitSignatures | GetCommits:
    """Parse one consensus datagram (pure; <= MAX_DATAGRAM bytes). Checks structure only
    (no signatures). Raises ConsensusWireError."""
    r = _reader(data)
    try:
        cid = r.constructor()
        if cid == PROPOSAL:
            sid, rnd, pol, cb = r.int256(), r.int(), r.int(), r.bytes()
            pol_sigs = _read_sigs(r, allow_empty=True)
            sig = r.int512()
            r.finish()
            if rnd < 0 or not -1 <= pol < rnd or (pol < 0) != (not pol_sigs):
                raise ConsensusWireError(f"proposal: bad round {rnd} / pol_round {pol} / {len(pol_sigs)} pol signatures")
            return Proposal(sid, rnd, pol, cb, sig, Candidate.parse(cb), pol_sigs)
        if cid == VOTE:
            sid, kind, rnd, who, blk, sig = r.int256(), r.int(), r.int(), r.int256(), BlockIdExt.read(r), r.int512()
            r.finish()
            if kind not in KIND_NAMES or rnd < 0:
                raise ConsensusWireError(f"vote: bad kind {kind} or round {rnd}")
            return Vote(sid, kind, rnd, who, blk, sig)
        if cid == COMMIT:
            sid, rnd, cb = r.int256(), r.int(), r.bytes()
            sigs = _read_sigs(r, allow_empty=False)
            r.finish()
            if rnd < 0:
                raise ConsensusWireError(f"commit: bad round {rnd}")
            return Commit(sid, rnd, cb, sigs, Candidate.parse(cb))
        if cid == COMMIT_SIGS:
            sid, rnd, blk = r.int256(), r.int(), BlockIdExt.read(r)
            sigs = _read_sigs(r, allow_empty=False)
            r.finish()
            if rnd < 0:
                raise ConsensusWireError(f"commitSignatures: bad round {rnd}")
            return CommitSignatures(sid, rnd, blk, sigs)
        if cid == GET_COMMITS:
            sid, frm, mx = r.int256(), r.int(), r.int()
            r.finish()
            if frm < 0 or mx <= 0:
                raise ConsensusWireError(f"getCommits: bad range from {frm} max {mx}")
            return GetCommits(sid, frm, mx)
        raise ConsensusWireError(f"unknown constructor 0x{cid:08x}")
    except TLError as exc:
        raise ConsensusWireError(str(exc)) from None


def make_proposal(key: NodeKey, session_id: bytes, round: int, pol_round: int, candidate: Candidate,
                  pol_signatures: tuple = ()) -> Proposal:
    """A proposal signed by `key` (the round's leader); pol_signatures: the prevotes of
    pol_round for the candidate ((key id, signature), ...) when pol_round >= 0."""
    sig = key.sign(proposal_signed_data(session_id, round, pol_round, candidate.block_id))
    return Proposal(session_id, round, pol_round, candidate.pack(), sig, candidate, tuple(pol_signatures))


def make_vote(key: NodeKey, session_id: bytes, kind: int, round: int, block: BlockIdExt) -> Vote:
    """A prevote (kind 0) or precommit (kind 1) signed by `key`; block = nil_block(..) for nil."""
    return Vote(session_id, kind, round, key.key_id, block,
                key.sign(vote_signed_data(session_id, kind, round, block)))


def session_id_for(workchain: int, shard: int, start_seqno: int, prev: BlockIdExt, members: list[bytes]) -> bytes:
    """Default session id: sha256 of boxed remp.consensus.session (members = public keys)."""
    body = [pack_id(SESSION), pack_int(workchain), pack_long(shard), pack_int(start_seqno), prev.pack(),
            pack_int(len(members))] + [pack_int256(m) for m in members]
    return hashlib.sha256(b"".join(body)).digest()


def quorum(n: int) -> int:
    """Signatures needed among n equal-weight members: TON's cutoff 2n/3 + 1 (weight > 2/3)."""
    return (2 * n) // 3 + 1


class SignatureMemo:
    """The (public key, signed data, signature) triples one node already found valid, so an
    identical signature is not checked with ed25519 again (bounded, least recently used out;
    only valid ones are kept, so garbage cannot evict them and is always checked).

    ed25519 signatures are deterministic: a member's precommit for (session, round, block)
    has one signature, so every commit certificate of one shard block carries mostly the same
    (member, signature) pairs, which a group member already verified as votes. Counted in
    bench_remp_sim at 100 msg/s (2 x 7 validators): of ~66 verifies per message, ~9.7 were
    commit certificates (each of the n members' own copy of a commit has its own signature
    subset, so the announce copies, the master proposals that carry the leader's copy and
    the group's own precommits were verified again at every validator). One memo per node
    (ValidatorCore passes its own to every consensus session and its commit checks): a
    process-wide one would let one simulated validator's check stand for another's."""

    def __init__(self, max_entries: int = 1 << 14):
        self.max_entries = max_entries
        self._ok: OrderedDict[tuple[bytes, bytes, bytes], None] = OrderedDict()
        self.hits = 0
        self.checks = 0

    def verify(self, public_key: bytes, data: bytes, signature: bytes) -> bool:
        """keys.verify(public_key, data, signature), from the memo when already valid."""
        k = (public_key, data, signature)
        if k in self._ok:
            self._ok.move_to_end(k)
            self.hits += 1
            return True
        self.checks += 1
        if not verify(public_key, data, signature):
            return False
        self._ok[k] = None
        if len(self._ok) > self.max_entries:
            self._ok.popitem(last=False)
        return True


def verify_commit(session_id: bytes, members: list[bytes], commit: Commit,
                  memo: SignatureMemo | None = None) -> BlockIdExt:
    """Check a commit's certificate: >= quorum(len(members)) distinct members' valid precommit
    signatures of commit.round for the carried candidate's block id. Returns the block id;
    raises ConsensusWireError naming the defect. memo: the node's SignatureMemo (signatures
    it already found valid are not checked again)."""
    bid = commit.candidate.block_id
    verify_signatures(session_id, members, commit.round, bid, commit.signatures, memo)
    return bid


@functools.lru_cache(maxsize=256)
def _member_ids(members: tuple) -> dict[bytes, bytes]:
    """key id -> public key of a member list, cached for recent lists (a sha256 per member
    per certificate before). The dict is shared: read it, never change it."""
    return {key_id_of(m): m for m in members}


def verify_signatures(session_id: bytes, members: list[bytes], round: int, bid: BlockIdExt, signatures,
                      memo: SignatureMemo | None = None) -> None:
    """>= quorum distinct members' valid precommit signatures of `round` for `bid`, else
    ConsensusWireError (verify_commit's certificate check)."""
    pubs = _member_ids(tuple(members))
    data = vote_signed_data(session_id, PRECOMMIT, round, bid)
    check = memo.verify if memo is not None else verify
    seen: set[bytes] = set()
    for who, sig in signatures:
        if who in seen:
            raise ConsensusWireError("commit: duplicate signer")
        if who not in pubs:
            raise ConsensusWireError("commit: signer is not a member")
        if not check(pubs[who], data, sig):
            raise ConsensusWireError("commit: bad signature")
        seen.add(who)
    if len(seen) < quorum(len(members)):
        raise ConsensusWireError(f"commit: {len(seen)} signatures < quorum {quorum(len(members))}")


def encode_master_payload(shard_blocks: list[BlockIdExt]) -> bytes:
    """Masterchain payload: boxed remp.consensus.masterPayload (vector of tonNode.blockIdExt)."""
    return pack_id(MASTER_PAYLOAD) + pack_int(len(shard_blocks)) + b"".join(b.pack() for b in shard_blocks)


def decode_master_payload(payload: bytes) -> list[BlockIdExt]:
    """Inverse of encode_master_payload; raises ConsensusWireError."""
    r = _reader(payload)
    try:
        if r.constructor() != MASTER_PAYLOAD:
            raise ConsensusWireError("master payload: wrong constructor")
        n = r.int()
        if not 0 <= n <= r.remaining() // 80:
            raise ConsensusWireError(f"master payload: bad count {n}")
        out = [BlockIdExt.read(r) for _ in range(n)]
        r.finish()
        return out
    except TLError as exc:
        raise ConsensusWireError(f"master payload: {exc}") from None


# --- double-signing evidence ---------------------------------------------------------------------

@dataclass(frozen=True)
class Evidence:
    """Double-signing proof: `member` (key id) signed `first` and `second` (both complete
    signed datagrams: proposals or votes of one `kind`) for different blocks at (seqno, round).
    kind: "proposal" | "prevote" | "precommit"."""

    member: bytes
    seqno: int
    round: int
    kind: str
    first: bytes
    second: bytes


def verify_evidence(session_id: bytes, members: list[bytes], ev: Evidence) -> bool:
    """True iff `ev` proves that ev.member double-signed (both signatures valid, same
    session, seqno, round and kind, different blocks)."""
    pubs = {key_id_of(m): m for m in members}
    if ev.member not in pubs:
        return False
    try:
        a, b = parse_message(ev.first), parse_message(ev.second)
    except ConsensusWireError:
        return False
    if type(a) is not type(b) or a.session_id != session_id or b.session_id != session_id:
        return False
    if isinstance(a, Proposal):
        ba, bb = a.candidate.block_id, b.candidate.block_id
        n = len(members)
        if ev.kind != "proposal" or a.round != b.round or members[(ba.seqno + a.round) % n] != pubs[ev.member]:
            return False
        ok = verify(pubs[ev.member], a.signed_data(ba), a.signature) and verify(pubs[ev.member], b.signed_data(bb), b.signature)
    elif isinstance(a, Vote):
        ba, bb = a.block, b.block
        if (a.who != ev.member or b.who != ev.member or a.kind != b.kind or a.round != b.round
                or KIND_NAMES[a.kind] != ev.kind):
            return False
        ok = verify(pubs[ev.member], a.signed_data(), a.signature) and verify(pubs[ev.member], b.signed_data(), b.signature)
    else:
        return False
    return ok and ba.seqno == bb.seqno == ev.seqno and a.round == ev.round and ba != bb
