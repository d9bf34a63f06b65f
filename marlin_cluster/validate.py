"""Block hashes and block validation with each chain's own rules, through maintained
libraries (seed: "isValidBlock").

Channels (params.py): CHANNEL_BTC, CHANNEL_ETH, CHANNEL_RAW.

block_hash(channel, block) -> 32 bytes, the hash whose first 4 bytes are the message id
(seed "Generate Message Id"):
    btc: double SHA-256 of the 80-byte header in internal byte order (python-bitcoinlib
         CBlockHeader.GetHash(); the usual display reverses it, so the id is not the proof of
         work's leading zeros)
    eth: keccak256 of the RLP-encoded header (blocks.verify_block computes it)
    raw: keccak256 of the whole block

validate_block(channel, block, now=None) -> BlockInfo, raises BlockInvalid:
    btc: Bitcoin Core's context-free CheckBlock (libbitcoinkernel through py-bitcoinkernel,
         mainnet consensus parameters, proof of work and merkle checks on): header proof of
         work against nBits, merkle root of the transactions and its mutation (duplicate
         transactions), size, coinbase first and only first, every transaction's
         CheckTransaction (inputs and outputs present, values in range, no duplicate inputs,
         coinbase scriptSig size, no null prevouts), legacy sigop limit; plus a header time
         more than 2 h past `now` (unix seconds; the header's own time when None) and, for
         blocks that carry witness data, python-bitcoinlib's weight and segwit commitment
         rules. A block Core refuses is checked again with python-bitcoinlib's CheckBlock
         rules (see _btc_lib) for the precise reason in the message. 4.7 ms for block 413567
         (1 MB, 1,557 transactions) against 181.8 ms for python-bitcoinlib's deserialize +
         CheckBlock in pure Python (median of 10 pairs, bench/bench_marlin_validate.py).
    eth: RLP [header, transactions, uncles(, withdrawals)] (blocks.verify_block);
         transactionsRoot = root of the hexary Merkle-Patricia trie rlp(index) -> transaction
         (the `trie` package's HexaryTrie); ommersHash = keccak256(rlp(uncles)); withdrawalsRoot
         (post-Shanghai headers) likewise. Ethash/beacon consensus is not checked.
    raw: nothing beyond the size bound.

check_message_id(message_id, info) raises BlockInvalid("message_id_mismatch") unless the id
is the first 4 bytes of the block hash.
"""
from __future__ import annotations

from dataclasses import dataclass

import ctypes
import functools
import hashlib

import rlp
from bitcoin.core import (MAX_BLOCK_SIGOPS, MAX_BLOCK_SIZE, MAX_BLOCK_WEIGHT, CBlock, CBlockHeader, CheckBlockError,
                          CheckBlockHeader, CheckTransaction, GetLegacySigOpCount, Hash, ValidationError)
from Crypto.Hash import keccak
from trie import HexaryTrie

from .blocks import BlockError, verify_block
from .params import CHANNEL_BTC, CHANNEL_ETH, CHANNEL_RAW

__all__ = ["BlockInvalid", "BlockInfo", "block_hash", "validate_block", "check_message_id", "message_id_of"]

_BTC_HEADER = 80


class BlockInvalid(BlockError):
    """A block that breaks its chain's rules (a ValueError, blocks.BlockError).
    `reason`: "invalid_block" or "message_id_mismatch"."""

    def __init__(self, message: str, reason: str = "invalid_block"):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class BlockInfo:
    """What validation learned: chain ("btc"/"eth"/"raw"), 32-byte hash (block_hash's
    order), transaction count, size in bytes."""
    kind: str
    hash: bytes
    txs: int
    size: int


def _keccak(data: bytes) -> bytes:
    return keccak.new(digest_bits=256, data=data).digest()


def block_hash(channel: int, block: bytes) -> bytes:
    """See the module docstring. Raises BlockInvalid when the block cannot even be hashed
    (too short for a Bitcoin header, not an RLP block)."""
    if channel == CHANNEL_BTC:
        if len(block) < _BTC_HEADER:
            raise BlockInvalid(f"bitcoin block of {len(block)} bytes is shorter than its header")
        return CBlockHeader.deserialize(block[:_BTC_HEADER]).GetHash()
    if channel == CHANNEL_ETH:
        try:
            items = rlp.decode(block)
            return _keccak(rlp.encode(items[0]))
        except Exception as exc:  # rlp.DecodingError, IndexError on a non-list
            raise BlockInvalid(f"not an RLP block: {exc}") from None
    return _keccak(block)


def message_id_of(channel: int, block: bytes) -> int:
    """First 4 bytes of block_hash as a uint32 (seed "generateMessageId")."""
    return int.from_bytes(block_hash(channel, block)[:4], "big")


_MAX_FUTURE_BLOCK_TIME = 2 * 60 * 60   # seconds; Bitcoin Core validation.h, python-bitcoinlib CheckBlockHeader


@functools.lru_cache(maxsize=1)
def _kernel():
    """(block class, mainnet chain parameters, their consensus parameters) of
    py-bitcoinkernel, loaded once per process. The block class hands the bytes to
    btck_block_create in one copy (pbk.Block builds its ctypes array element by element,
    95 ms for 1 MB)."""
    from pbk.block import Block
    from pbk.capi import KernelOpaquePtr
    from pbk.chain import ChainParameters, ChainType

    class _Block(Block):
        def __init__(self, raw: bytes):
            KernelOpaquePtr.__init__(self, (ctypes.c_ubyte * len(raw)).from_buffer_copy(raw), len(raw))

    chain = ChainParameters(ChainType.MAINNET)
    return _Block, chain, chain.consensus_params


def _compact_size(b: bytes, pos: int) -> tuple[int, int]:
    n = b[pos]
    if n < 0xFD:
        return n, pos + 1
    width = {0xFD: 2, 0xFE: 4, 0xFF: 8}[n]
    return int.from_bytes(b[pos + 1:pos + 1 + width], "little"), pos + 1 + width


def _walk(block: bytes, ntx: int) -> tuple[int, bool]:
    """(end offset of the last of `ntx` transactions, whether any carries witness data) of
    a block Bitcoin Core has already parsed: only the CompactSize counts and lengths of the
    consensus encoding are read (a transaction in the extended format has the marker 0x00
    where a count of inputs would be, BIP 144). Raises IndexError/KeyError on bytes that
    end early."""
    pos = _compact_size(block, _BTC_HEADER)[1]
    witness = False
    for _ in range(ntx):
        pos += 4
        flagged = block[pos] == 0
        if flagged:
            witness = True
            pos += 2
        n_in, pos = _compact_size(block, pos)
        for _ in range(n_in):
            n, pos = _compact_size(block, pos + 36)
            pos += n + 4
        n_out, pos = _compact_size(block, pos)
        for _ in range(n_out):
            n, pos = _compact_size(block, pos + 8)
            pos += n
        if flagged:
            for _ in range(n_in):
                items, pos = _compact_size(block, pos)
                for _ in range(items):
                    n, pos = _compact_size(block, pos)
                    pos += n
        pos += 4
    if pos > len(block):
        raise IndexError("transactions run past the end of the block")
    return pos, witness


def _btc(block: bytes, now: float | None) -> BlockInfo:
    """See the module docstring: Bitcoin Core's CheckBlock, then the header time; witness
    blocks, and blocks Core refuses or cannot parse, also go through _btc_lib (its verdict
    and message win; a block only Core refuses is refused with Core's result name)."""
    if len(block) <= _BTC_HEADER:
        return _btc_lib(block, now)
    kblock, _chain, consensus = _kernel()
    try:
        b = kblock(block)
    except Exception:  # pbk raises RuntimeError when btck_block_create cannot parse the bytes
        _btc_lib(block, now)
        raise BlockInvalid("not a bitcoin block: Bitcoin Core cannot parse it") from None
    state = b.check(consensus)
    if state.validation_mode != 0:            # pbk.block.ValidationMode.VALID
        _btc_lib(block, now)
        raise BlockInvalid(f"bitcoin block: Bitcoin Core CheckBlock: {state.block_validation_result.name}")
    ntx = len(b.transactions)
    try:
        end, witness = _walk(block, ntx)
    except (IndexError, KeyError):
        end, witness = -1, True
    if witness or end != len(block):          # weight and segwit commitment / trailing bytes
        return _btc_lib(block, now)
    n_time = int.from_bytes(block[68:72], "little")
    cur_time = int(now) if now is not None else n_time
    if n_time > cur_time + _MAX_FUTURE_BLOCK_TIME:
        raise BlockInvalid("bitcoin block: CheckBlockHeader() : block timestamp too far in the future")
    return BlockInfo("btc", hashlib.sha256(hashlib.sha256(block[:_BTC_HEADER]).digest()).digest(), ntx, len(block))


def _btc_lib(block: bytes, now: float | None) -> BlockInfo:
    """python-bitcoinlib's CheckBlock rules, in its order, from its own primitives, without its
    repeated passes over the block: CheckBlock serializes the whole block three times (the
    size and weight limits) and every transaction twice more (txids for the duplicate test and
    again for the merkle root), although CBlock.deserialize has already built the merkle tree
    (vMerkleTree: the txids, then each level, the root last) from the same transactions. Here
    the sizes come from the bytes received (deserialize refuses trailing bytes, so a block
    without witness data is exactly `block`), txids and the root from vMerkleTree, and only
    CheckTransaction serializes each transaction. Block 413567 (1 MB, 1,557 transactions):
    1.7x faster than deserialize + CheckBlock (154 vs 239 ms median at load 4,
    bench/bench_marlin_validate.py); tests/test_marlin_validate.py checks CheckBlock's
    verdict, message included, on the real blocks and on mutated ones."""
    try:
        b = CBlock.deserialize(block)
    except Exception as exc:  # python-bitcoinlib raises several types on junk
        raise BlockInvalid(f"not a bitcoin block: {exc}") from None
    try:
        _check_block(b, len(block), int(now) if now is not None else b.nTime)
    except ValidationError as exc:  # CheckBlockError, CheckProofOfWorkError, CheckTransactionError
        raise BlockInvalid(f"bitcoin block: {exc}") from None
    except Exception as exc:  # python-bitcoinlib on structurally odd blocks (e.g. scripts it cannot count)
        raise BlockInvalid(f"bitcoin block: {type(exc).__name__}: {exc}") from None
    return BlockInfo("btc", b.GetHash(), len(b.vtx), len(block))


def _check_block(b: CBlock, size: int, cur_time: int) -> None:
    """bitcoin.core.CheckBlock(b, fCheckPoW=True, fCheckMerkleRoot=True, cur_time) for a block
    deserialized from `size` bytes; raises what it raises (python-bitcoinlib 0.12)."""
    CheckBlockHeader(b.get_header(), fCheckPoW=True, cur_time=cur_time)
    vtx = b.vtx
    if not vtx:
        raise CheckBlockError("CheckBlock() : vtx empty")
    witness = bool(b.vWitnessMerkleTree)
    stripped = len(b.serialize(dict(include_witness=False))) if witness else size
    if stripped > MAX_BLOCK_SIZE:
        raise CheckBlockError("CheckBlock() : block larger than MAX_BLOCK_SIZE")
    if stripped * 3 + size > MAX_BLOCK_WEIGHT:
        raise CheckBlockError("CheckBlock() : block larger than MAX_BLOCK_WEIGHT")
    if not vtx[0].is_coinbase():
        raise CheckBlockError("CheckBlock() : first tx is not coinbase")
    txids = b.vMerkleTree[:len(vtx)]
    unique = set()
    sigops = 0
    for tx, txid in zip(vtx[1:], txids[1:]):
        if tx.is_coinbase():
            raise CheckBlockError("CheckBlock() : more than one coinbase")
        CheckTransaction(tx)
        if txid in unique:
            raise CheckBlockError("CheckBlock() : duplicate transaction")
        unique.add(txid)
        sigops += GetLegacySigOpCount(tx)
        if sigops > MAX_BLOCK_SIGOPS:
            raise CheckBlockError("CheckBlock() : out-of-bounds SigOpCount")
    if b.hashMerkleRoot != b.vMerkleTree[-1]:
        raise CheckBlockError("CheckBlock() : hashMerkleRoot mismatch")
    if witness:
        root = b.vWitnessMerkleTree[-1]
        nonce_script = vtx[0].wit.vtxinwit[0].scriptWitness
        nonce = nonce_script.stack[0]
        if len(nonce_script.stack) != 1 or len(nonce) != 32:
            raise CheckBlockError("CheckBlock() : invalid coinbase witnessScript")
        try:
            index = b.get_witness_commitment_index()
        except ValueError as e:
            raise CheckBlockError("CheckBlock() : " + str(e)) from None
        commit_script = vtx[0].vout[index].scriptPubKey
        if not (6 + 32 <= len(commit_script) <= 6 + 32 + 1):
            raise CheckBlockError("CheckBlock() : invalid segwit commitment length")
        if commit_script[6:6 + 32] != Hash(root + nonce):
            raise CheckBlockError("CheckBlock() : invalid segwit commitment")


def _trie_root(items: list) -> bytes:
    t = HexaryTrie({})
    for i, item in enumerate(items):
        t[rlp.encode(i)] = item if isinstance(item, bytes) else rlp.encode(item)
    return t.root_hash


def _eth(block: bytes) -> BlockInfo:
    try:
        base = verify_block(block)   # RLP shape and keccak256(header)
    except BlockError as exc:
        raise BlockInvalid(str(exc)) from None
    if base["kind"] != "eth":
        raise BlockInvalid(f"not an Ethereum block (looks like {base['kind']})")
    items = rlp.decode(block)
    header, txs, uncles = items[0], items[1], items[2]
    if len(header) < 15 or not all(isinstance(f, bytes) for f in header):
        raise BlockInvalid(f"Ethereum header has {len(header)} fields, malformed")
    if not isinstance(txs, list) or not isinstance(uncles, list):
        raise BlockInvalid("Ethereum transactions / uncles are not lists")
    if _keccak(rlp.encode(uncles)) != header[1]:
        raise BlockInvalid("ethereum block: ommers hash does not match the header")
    if _trie_root(txs) != header[4]:
        raise BlockInvalid("ethereum block: transactions root does not match the header")
    if len(items) >= 4 and len(header) > 16:
        if not isinstance(items[3], list) or _trie_root(items[3]) != header[16]:
            raise BlockInvalid("ethereum block: withdrawals root does not match the header")
    return BlockInfo("eth", bytes.fromhex(base["hash"][2:]), len(txs), len(block))


def validate_block(channel: int, block: bytes, now: float | None = None) -> BlockInfo:
    """See the module docstring. Raises BlockInvalid."""
    if channel == CHANNEL_BTC:
        return _btc(block, now)
    if channel == CHANNEL_ETH:
        return _eth(block)
    return BlockInfo("raw" if channel == CHANNEL_RAW else str(channel), _keccak(block), 0, len(block))


def check_message_id(message_id: int, info: BlockInfo) -> None:
    """Raises BlockInvalid(reason "message_id_mismatch") unless message_id is the first 4
    bytes of info.hash."""
    if int.from_bytes(info.hash[:4], "big") != message_id:
        raise BlockInvalid(f"message id {message_id:08x} is not the first 4 bytes of block hash "
                           f"{info.hash.hex()}", "message_id_mismatch")
