"""Erasure coding of blocks into chunks (seed: "Erasure Coding of the block": NUM_CHUNKS
chunks of which any MIN_CHUNKS rebuild the block; DESIGN.md section 5).

The seed names Rabin's IDA over GF(p); we use an MDS Reed-Solomon code over GF(2^8) with the
same any-k-of-n property, from a maintained library: pyeclib (liberasurecode) with ec_type
"isa_l_rs_cauchy" (Intel ISA-L, bundled in the wheel). Not "isa_l_rs_vand": it is not MDS
for every k, m (it failed to decode 3 of 300 random 10-of-20 subsets here).

Each chunk is a pyeclib fragment: an 80-byte self-describing header (index, sizes, a
checksum of the header itself; the payload is not checksummed: the attestation's chunk hash
and block validation cover it) followed by ceil(len(block) / k) bytes rounded up for alignment.

    coder = Coder(num_chunks=12, min_chunks=8)
    chunks = coder.encode(block)            # list of 12 bytes objects, chunk id = index
    block = coder.decode({3: c3, 7: c7, ...})  # any 8 of them

Errors: CodingError (a MarlinWireError, remote) when chunks do not decode (too few,
inconsistent, forged). MarlinLocalError for bad parameters / empty blocks.
"""
from __future__ import annotations

import functools
from typing import Mapping

from pyeclib.ec_iface import ECDriver

from .wire import MarlinLocalError, MarlinWireError

__all__ = ["Coder", "CodingError", "EC_TYPE", "coder"]

EC_TYPE = "isa_l_rs_cauchy"


class CodingError(MarlinWireError):
    """Chunks that do not rebuild a block (remote: a producer or relay sent bad chunks)."""

    reason = "undecodable"


class Coder:
    """NUM_CHUNKS = num_chunks fragments, any MIN_CHUNKS = min_chunks rebuild (k = min_chunks,
    m = num_chunks - min_chunks). Thread-compatible, no state between calls."""

    def __init__(self, num_chunks: int, min_chunks: int):
        if not 1 <= min_chunks < num_chunks <= 32:
            raise MarlinLocalError(f"need 1 <= min_chunks < num_chunks <= 32, got {min_chunks}/{num_chunks}")
        self.num_chunks = num_chunks
        self.min_chunks = min_chunks
        self.driver = ECDriver(k=min_chunks, m=num_chunks - min_chunks, ec_type=EC_TYPE)

    def encode(self, block: bytes) -> list[bytes]:
        """block (>= 1 byte) -> num_chunks chunks; chunk i has chunk id i."""
        if not block:
            raise MarlinLocalError("cannot encode an empty block")
        return self.driver.encode(block)

    def decode(self, chunks: Mapping[int, bytes]) -> bytes:
        """{chunk id: chunk} with at least min_chunks entries -> the block. Uses the first
        min_chunks by id (decoding needs no more). Raises CodingError."""
        if len(chunks) < self.min_chunks:
            raise CodingError(f"{len(chunks)} chunks, {self.min_chunks} needed")
        ids = sorted(chunks)[: self.min_chunks]
        try:
            return self.driver.decode([chunks[i] for i in ids])
        except Exception as exc:  # pyeclib raises ECDriverError subclasses (and others on junk)
            raise CodingError(f"chunks {ids} do not decode: {type(exc).__name__}: {exc}") from None


@functools.lru_cache(maxsize=64)
def coder(num_chunks: int, min_chunks: int) -> Coder:
    """A shared Coder per (num_chunks, min_chunks)."""
    return Coder(num_chunks, min_chunks)
