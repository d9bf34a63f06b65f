"""Catchain's TL objects and their pure checks: constructor ids (CRC32 of the ton_api.tl
lines with `(vector x)` parentheses dropped, as TON's TL compiler does), `Dep` and
`WireBlock`, block hashes and signatures, the datagrams the core sends, the datagram parser,
fork proofs. No state: the
catchain state machine that sends, pulls, delivers and blames is
remp_node/core/catchain.py, whose module docstring gives the block model, the wire and the
drop reasons (DESIGN.md section 4; ton-blockchain/ton `catchain/`, read, not copied).

Errors: parsers raise CatchainRemoteError (a RempRemoteError) with `.reason`; misuse raises
CatchainUsageError (a RempLocalError).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable

from ..errors import RempLocalError, RempRemoteError
from .keys import NodeKey, key_id, verify
from .tl import TLError, TLReader, pack_bytes, pack_id, pack_int, pack_int256, tl_constructor_id


def _tl_id(line: str) -> int:
    """Constructor id of a ton_api.tl line (remp_node.wire.tl drops `(vector x)` parentheses
    as TON's TL compiler does: catchain.getDifference = 0xd06cced8)."""
    return tl_constructor_id(line)


BLOCK_ID = _tl_id("catchain.block.id incarnation:int256 src:int256 height:int data_hash:int256 = catchain.block.Id")
BLOCK_DEP = _tl_id("catchain.block.dep src:int height:int data_hash:int256 signature:bytes = catchain.block.Dep")
BLOCK_DATA = _tl_id("catchain.block.data prev:catchain.block.dep deps:(vector catchain.block.dep) = catchain.block.Data")
BLOCK = _tl_id("catchain.block incarnation:int256 src:int height:int data:catchain.block.data signature:bytes "
               "= catchain.Block")
BLOCK_UPDATE = _tl_id("catchain.blockUpdate block:catchain.block = catchain.Update")
DATA_FORK = _tl_id("catchain.block.data.fork left:catchain.block.Dep right:catchain.block.Dep "
                   "= catchain.block.inner.Data")
DATA_VECTOR = _tl_id("catchain.block.data.vector msgs:(vector bytes) = catchain.block.inner.Data")
DIFFERENCE = _tl_id("catchain.difference sent_upto:(vector int) = catchain.Difference")
DIFFERENCE_FORK = _tl_id("catchain.differenceFork left:catchain.block.dep right:catchain.block.dep "
                         "= catchain.Difference")
BLOCK_NOT_FOUND = _tl_id("catchain.blockNotFound = catchain.BlockResult")
BLOCK_RESULT = _tl_id("catchain.blockResult block:catchain.block = catchain.BlockResult")
GET_BLOCK = _tl_id("catchain.getBlock block:int256 = catchain.BlockResult")
GET_DIFFERENCE = _tl_id("catchain.getDifference rt:(vector int) = catchain.Difference")

SIGNATURE_SIZE = 64
_DEP_WIRE_MAX = 4 + 4 + 32 + 68 + 4          # src height data_hash signature:bytes (+ box id)


class CatchainRemoteError(RempRemoteError):
    """A peer sent something we drop; `reason` is the counter key (see module doc)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason, reason)
        self.detail = detail


class CatchainUsageError(RempLocalError):
    """The local caller misused the API (bad constructor args, oversize submit...)."""


# --- wire objects -------------------------------------------------------------------------

@dataclass(frozen=True)
class Dep:
    """`catchain.block.dep src:int height:int data_hash:int256 signature:bytes`: a signed
    reference to a block (enough to compute its hash and check its signature)."""

    src: int
    height: int
    data_hash: bytes
    signature: bytes

    def pack(self) -> bytes:
        """Bare TL (as inside catchain.block.data and catchain.differenceFork)."""
        return pack_int(self.src) + pack_int(self.height) + pack_int256(self.data_hash) + pack_bytes(self.signature)

    def pack_boxed(self) -> bytes:
        return pack_id(BLOCK_DEP) + self.pack()


@dataclass(frozen=True)
class WireBlock:
    """`catchain.block incarnation src height data:catchain.block.data signature` + payload."""

    incarnation: bytes
    src: int
    height: int
    prev: Dep
    deps: tuple[Dep, ...]
    signature: bytes
    payload: bytes

    def pack_data(self) -> bytes:
        """Bare catchain.block.data prev deps."""
        return self.prev.pack() + pack_int(len(self.deps)) + b"".join(d.pack() for d in self.deps)

    def data_hash(self) -> bytes:
        return block_data_hash(self.prev, self.deps, self.payload)

    def body(self) -> bytes:
        """Bare catchain.block followed by the payload (what follows the box id of a
        catchain.blockUpdate or catchain.blockResult)."""
        return (pack_int256(self.incarnation) + pack_int(self.src) + pack_int(self.height) + self.pack_data()
                + pack_bytes(self.signature) + self.payload)

    def encode_update(self) -> bytes:
        """The broadcast datagram: boxed catchain.blockUpdate + payload."""
        return pack_id(BLOCK_UPDATE) + self.body()

    def dep(self) -> Dep:
        return Dep(self.src, self.height, self.data_hash(), self.signature)


def block_data_hash(prev: Dep, deps: Iterable[Dep], payload: bytes) -> bytes:
    """data_hash = sha256(sha256(payload) || sha256(boxed catchain.block.data)) (TON's
    block_hash_covers_data)."""
    deps = tuple(deps)
    data = pack_id(BLOCK_DATA) + prev.pack() + pack_int(len(deps)) + b"".join(d.pack() for d in deps)
    return hashlib.sha256(hashlib.sha256(payload).digest() + hashlib.sha256(data).digest()).digest()


def block_id_bytes(incarnation: bytes, src_key_id: bytes, height: int, data_hash: bytes) -> bytes:
    """Serialized boxed `catchain.block.id`: the bytes that are signed and hashed."""
    return pack_id(BLOCK_ID) + pack_int256(incarnation) + pack_int256(src_key_id) + pack_int(height) \
        + pack_int256(data_hash)


def block_hash(incarnation: bytes, src_key_id: bytes, height: int, data_hash: bytes) -> bytes:
    """32-byte block hash = sha256(boxed catchain.block.id)."""
    return hashlib.sha256(block_id_bytes(incarnation, src_key_id, height, data_hash)).digest()


def root_dep(incarnation: bytes, n_sources: int) -> Dep:
    """The virtual height-0 block every source's first block points to (TON create_root)."""
    return Dep(n_sources, 0, incarnation, b"")


def root_hash(incarnation: bytes) -> bytes:
    return block_hash(incarnation, incarnation, 0, incarnation)


def pack_records(records: Iterable[bytes]) -> bytes:
    """Block payload: boxed catchain.block.data.vector msgs."""
    records = list(records)
    return pack_id(DATA_VECTOR) + pack_int(len(records)) + b"".join(pack_bytes(r) for r in records)


def unpack_records(payload: bytes) -> tuple[bytes, ...] | None:
    """Records of a catchain.block.data.vector payload; None if the payload is not one."""
    try:
        r = TLReader(payload, max_bytes=max(len(payload), 1))
        if r.constructor() != DATA_VECTOR:
            return None
        n = r.int()
        if n < 0 or n > len(payload):
            return None
        out = tuple(r.bytes() for _ in range(n))
        r.finish()
        return out
    except TLError:
        return None


def sign_block(key: NodeKey, session_id: bytes, src: int, height: int, prev: Dep, deps: Iterable[Dep],
               payload: bytes) -> WireBlock:
    """Build and sign a block of source `src` (whose key is `key`). Used by the core for its
    own blocks; tests use it to make a forking member."""
    deps = tuple(deps)
    dh = block_data_hash(prev, deps, payload)
    sig = key.sign(block_id_bytes(session_id, key.key_id, height, dh))
    return WireBlock(session_id, src, height, prev, deps, sig, payload)


def pack_fork_proof(left: Dep, right: Dep) -> bytes:
    """Fork proof = boxed catchain.block.data.fork (boxed deps), TON's fork_proof format."""
    return pack_id(DATA_FORK) + left.pack_boxed() + right.pack_boxed()


def read_fork_proof(proof: bytes) -> tuple[Dep, Dep]:
    """The (left, right) deps of a fork proof made by pack_fork_proof (our own or one that
    verify_fork_proof accepted; <= 1024 bytes). TLError on bytes of another shape."""
    r = TLReader(proof, max_bytes=1024)
    r.constructor()
    r.constructor()
    left = _read_dep(r)
    r.constructor()
    return left, _read_dep(r)


def record_size(record: bytes) -> int:
    """Bytes one record takes in a block's catchain.block.data.vector (TL `bytes`: length
    prefix, data, padding to 4)."""
    return len(pack_bytes(record))


# --- catchain datagrams (boxed; what the core sends) ------------------------------------------

def pack_block_update(block_body: bytes) -> bytes:
    """catchain.blockUpdate: a bare catchain.block + payload (a block's stored body)."""
    return pack_id(BLOCK_UPDATE) + block_body


def pack_block_result(block_body: bytes) -> bytes:
    """catchain.blockResult: the answer to catchain.getBlock for a block we hold."""
    return pack_id(BLOCK_RESULT) + block_body


def pack_block_not_found() -> bytes:
    """catchain.blockNotFound: the answer to catchain.getBlock for a block we lack."""
    return pack_id(BLOCK_NOT_FOUND)


def pack_get_block(block_hash_: bytes) -> bytes:
    """catchain.getBlock block:int256."""
    return pack_id(GET_BLOCK) + pack_int256(block_hash_)


def pack_get_difference(rt: list[int]) -> bytes:
    """catchain.getDifference rt:(vector int): our delivered height per source (-1: blamed)."""
    return pack_id(GET_DIFFERENCE) + pack_int(len(rt)) + b"".join(pack_int(x) for x in rt)


def pack_difference(sent_upto: list[int]) -> bytes:
    """catchain.difference sent_upto:(vector int): the heights an answer brought each source to."""
    return pack_id(DIFFERENCE) + pack_int(len(sent_upto)) + b"".join(pack_int(x) for x in sent_upto)


def pack_difference_fork(left: Dep, right: Dep) -> bytes:
    """catchain.differenceFork left:catchain.block.dep right:catchain.block.dep (bare deps)."""
    return pack_id(DIFFERENCE_FORK) + left.pack() + right.pack()


# --- parsers (pure; raise CatchainRemoteError) ------------------------------------------

def _read_dep(r: TLReader) -> Dep:
    src, height, data_hash, sig = r.int(), r.int(), r.int256(), r.bytes()
    return Dep(src, height, data_hash, sig)


def _check_dep_shape(d: Dep, n_sources: int, incarnation: bytes | None, what: str) -> None:
    if d.height == 0:
        if d.src != n_sources or d.signature or (incarnation is not None and d.data_hash != incarnation):
            raise CatchainRemoteError("bad_prev" if what == "prev" else "bad_deps", f"{what}: bad root reference")
        return
    if d.height < 0 or not 0 <= d.src < n_sources or len(d.signature) != SIGNATURE_SIZE:
        raise CatchainRemoteError("bad_prev" if what == "prev" else "bad_deps",
                                  f"{what}: src={d.src} height={d.height} sig={len(d.signature)} bytes")


def parse_block_body(r: TLReader, *, incarnation: bytes, n_sources: int, max_payload: int) -> WireBlock:
    """Read a bare catchain.block + trailing payload and check its shape (TON
    pre_validate_block): height >= 1, src a member, prev = own height-1 (or root), deps from
    distinct other sources with height >= 1, 64-byte signatures, non-empty payload."""
    inc = r.int256()
    src, height = r.int(), r.int()
    prev = _read_dep(r)
    n = r.int()
    if n < 0 or n >= max(n_sources, 1):
        raise CatchainRemoteError("bad_deps", f"{n} deps for {n_sources} sources")
    deps = tuple(_read_dep(r) for _ in range(n))
    sig = r.bytes()
    payload = r.raw(r.remaining())
    if inc != incarnation:
        raise CatchainRemoteError("bad_incarnation", inc.hex()[:16])
    if not 0 <= src < n_sources:
        raise CatchainRemoteError("bad_src", f"src={src}")
    if height < 1:
        raise CatchainRemoteError("bad_height", f"height={height}")
    if len(sig) != SIGNATURE_SIZE:
        raise CatchainRemoteError("bad_signature", f"signature of {len(sig)} bytes")
    _check_dep_shape(prev, n_sources, incarnation, "prev")
    if height == 1:
        if prev.height != 0:
            raise CatchainRemoteError("bad_prev", "first block must point to the root")
    elif prev.src != src or prev.height != height - 1:
        raise CatchainRemoteError("bad_prev", f"prev src={prev.src} height={prev.height} for {src}@{height}")
    seen = {src}
    for d in deps:
        _check_dep_shape(d, n_sources, incarnation, "dep")
        if d.height == 0 or d.src in seen:
            raise CatchainRemoteError("bad_deps", f"dep src={d.src} height={d.height}")
        seen.add(d.src)
    if not payload:
        raise CatchainRemoteError("empty_payload")
    if len(payload) > max_payload:
        raise CatchainRemoteError("oversize_payload", f"{len(payload)} > {max_payload}")
    return WireBlock(inc, src, height, prev, deps, sig, payload)


def parse_datagram(data: bytes, *, incarnation: bytes, n_sources: int, max_size: int,
                   max_payload: int) -> tuple[int, object]:
    """Parse one catchain datagram -> (constructor id, object): WireBlock for blockUpdate /
    blockResult, list[int] for getDifference / difference, bytes (hash) for getBlock,
    (Dep, Dep) for differenceFork, None for blockNotFound. Raises CatchainRemoteError."""
    if len(data) > max_size:
        raise CatchainRemoteError("oversize", f"{len(data)} > {max_size} bytes")
    try:
        r = TLReader(data, max_bytes=max_size)
        cid = r.constructor()
        if cid in (BLOCK_UPDATE, BLOCK_RESULT):
            return cid, parse_block_body(r, incarnation=incarnation, n_sources=n_sources, max_payload=max_payload)
        if cid in (GET_DIFFERENCE, DIFFERENCE):
            n = r.int()
            if n != n_sources:
                raise CatchainRemoteError("bad_difference_query", f"vector of {n} for {n_sources} sources")
            rt = [r.int() for _ in range(n)]
            r.finish()
            if any(x < -1 for x in rt):
                raise CatchainRemoteError("bad_difference_query", "height < -1")
            return cid, rt
        if cid == GET_BLOCK:
            h = r.int256()
            r.finish()
            return cid, h
        if cid == DIFFERENCE_FORK:
            left, right = _read_dep(r), _read_dep(r)
            r.finish()
            return cid, (left, right)
        if cid == BLOCK_NOT_FOUND:
            r.finish()
            return cid, None
        raise CatchainRemoteError("unknown_constructor", f"0x{cid:08x}")
    except TLError as exc:
        raise CatchainRemoteError("malformed", str(exc)) from None


def check_fork(left: Dep, right: Dep, incarnation: bytes, members: list[bytes]) -> int:
    """Verify a fork proof's two deps: same source and height, different data_hash, both
    validly signed by that member. Returns the source index; raises CatchainRemoteError
    ("bad_fork_proof")."""
    n = len(members)
    for d in (left, right):
        if not 0 <= d.src < n or d.height < 1 or len(d.signature) != SIGNATURE_SIZE:
            raise CatchainRemoteError("bad_fork_proof", f"bad dep src={d.src} height={d.height}")
    if left.src != right.src or left.height != right.height or left.data_hash == right.data_hash:
        raise CatchainRemoteError("bad_fork_proof", "not a fork")
    pub = members[left.src]
    for side, d in (("left", left), ("right", right)):
        if not verify(pub, block_id_bytes(incarnation, key_id(pub), d.height, d.data_hash), d.signature):
            raise CatchainRemoteError("bad_fork_proof", f"{side} signature invalid")
    return left.src


def verify_fork_proof(proof: bytes, session_id: bytes, members: list[bytes]) -> int:
    """Check a ForkDetected.proof (boxed catchain.block.data.fork) against the session;
    returns the forking source index or raises CatchainRemoteError."""
    try:
        r = TLReader(proof, max_bytes=1024)
        if r.constructor() != DATA_FORK:
            raise CatchainRemoteError("bad_fork_proof", "not catchain.block.data.fork")
        deps = []
        for _ in range(2):
            if r.constructor() != BLOCK_DEP:
                raise CatchainRemoteError("bad_fork_proof", "dep is not catchain.block.dep")
            deps.append(_read_dep(r))
        r.finish()
    except TLError as exc:
        raise CatchainRemoteError("bad_fork_proof", str(exc)) from None
    return check_fork(deps[0], deps[1], session_id, members)
