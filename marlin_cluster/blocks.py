"""Real blockchain blocks as Marlin traffic: load a directory of block files and verify blocks.

Formats (detected from the bytes, not the file name):
- Bitcoin raw blocks (80-byte header + transactions), parsed with python-bitcoinlib; the block
  hash is double SHA-256 of the header, byte-reversed; verification also recomputes the
  merkle root (so a block whose transactions were altered is refused).
- Ethereum RLP blocks `rlp([header, transactions, uncles(, withdrawals)])`, parsed with the
  `rlp` library; the hash is keccak256 of the RLP-encoded header.
When no directory is given, `generated_blocks()` makes deterministic synthetic blocks
(kind "synthetic": 8-byte magic, 32-byte sha256 of the body, then the body).

`verify_block(data) -> dict` is what the demo's `block.verify` RMB service runs: it returns
{"kind", "hash", "txs", "size"} or raises BlockError (a ValueError) with a precise reason.
"""
from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass
from pathlib import Path

import rlp
from bitcoin.core import CBlock, b2lx
from Crypto.Hash import keccak

SYNTHETIC_MAGIC = b"RSBLOCK1"
MAX_BLOCK = 4 * 1024 * 1024


class BlockError(ValueError):
    """A block that cannot be parsed or whose contents contradict its header."""


@dataclass(frozen=True)
class BlockFile:
    name: str
    data: bytes


def _btc(data: bytes) -> dict:
    try:
        block = CBlock.deserialize(data)
    except Exception as exc:  # python-bitcoinlib raises several types for truncated input
        raise BlockError(f"not a bitcoin block: {exc}") from None
    if block.calc_merkle_root() != block.hashMerkleRoot:
        raise BlockError("bitcoin block: merkle root does not match the header")
    return {"kind": "btc", "hash": b2lx(block.GetHash()), "txs": len(block.vtx), "size": len(data)}


def _eth(data: bytes) -> dict:
    try:
        items = rlp.decode(data)
    except Exception as exc:  # rlp.DecodingError and friends
        raise BlockError(f"not an RLP block: {exc}") from None
    if not isinstance(items, list) or len(items) < 3 or not isinstance(items[0], list):
        raise BlockError("RLP block must be [header, transactions, uncles, ...]")
    digest = keccak.new(digest_bits=256, data=rlp.encode(items[0])).hexdigest()
    return {"kind": "eth", "hash": "0x" + digest, "txs": len(items[1]), "size": len(data)}


def _synthetic(data: bytes) -> dict:
    digest, body = data[8:40], data[40:]
    if hashlib.sha256(body).digest() != digest:
        raise BlockError("synthetic block: body hash mismatch")
    return {"kind": "synthetic", "hash": digest.hex(), "txs": 0, "size": len(data)}


def verify_block(data: bytes) -> dict:
    """Parses and checks one block; see the module docstring. Raises BlockError."""
    if len(data) > MAX_BLOCK:
        raise BlockError(f"block of {len(data)} bytes exceeds {MAX_BLOCK}")
    if data.startswith(SYNTHETIC_MAGIC):
        return _synthetic(data)
    if data[:1] and data[0] >= 0xC0:  # an RLP list
        return _eth(data)
    if len(data) >= 81:
        return _btc(data)
    raise BlockError("unrecognised block format")


def load_blocks(directory: str | os.PathLike) -> list[BlockFile]:
    """Every regular file in `directory` (sorted by name) that is not JSON/Markdown.
    Raises FileNotFoundError when the directory does not exist."""
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"block directory {root} does not exist")
    out = []
    for path in sorted(root.iterdir()):
        if path.is_file() and path.suffix.lower() not in (".json", ".md", ".txt"):
            out.append(BlockFile(path.name, path.read_bytes()))
    return out


def load_verified_blocks(directory: str | os.PathLike) -> list[BlockFile]:
    """load_blocks(directory), every file checked with verify_block. Raises BlockError with
    one line naming the problem: the folder is missing or not a folder, holds no block
    files, or holds files that are not blocks (how many, and the first with its reason)."""
    root = Path(directory)
    if not root.exists():
        raise BlockError(f"folder {root} does not exist")
    if not root.is_dir():
        raise BlockError(f"{root} is not a folder")
    blocks = load_blocks(root)
    if not blocks:
        raise BlockError(f"no block files in {root} (.json, .md and .txt files are ignored)")
    bad = []
    for block in blocks:
        try:
            verify_block(block.data)
        except BlockError as exc:
            bad.append((block.name, " ".join(str(exc).split())))
    if bad:
        name, why = bad[0]
        raise BlockError(f"{len(bad)} of {len(blocks)} files in {root} are not valid blocks "
                         f"(Bitcoin raw or Ethereum RLP), e.g. {name}: {why}")
    return blocks


def generated_blocks(count: int = 16, seed: int = 7, min_size: int = 512, max_size: int = 64 * 1024) -> list[BlockFile]:
    """Deterministic synthetic blocks for runs without --blocks."""
    rng = random.Random(seed)
    blocks = []
    for i in range(count):
        body = rng.randbytes(rng.randint(min_size, max_size))
        blocks.append(BlockFile(f"synthetic-{i:03d}", SYNTHETIC_MAGIC + hashlib.sha256(body).digest() + body))
    return blocks
