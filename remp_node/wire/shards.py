"""TON shard idents: the one implementation of the shard helpers used across remp_node.

A shard is a 64-bit "prefix with tag": a shard of depth d carries the account-id prefix in
its top d bits, then a single 1 bit (the tag), then zeros (TON `ShardIdFull`,
`shard_contains`). 0x8000000000000000 is the whole workchain (and the masterchain's only
shard); two shards: 0x4000000000000000 (account ids starting with bit 0) and
0xC000000000000000 (bit 1). An account id (32 bytes) belongs to the shard whose prefix
equals the top d bits of its first 8 bytes, read big-endian.

Sources: DESIGN.md section 4 (shards of workchain 0, `shard` as 16 hex digits in receipts);
TON `block/block.cpp` `shard_contains`.

Errors: ShardError (a ValueError) for an invalid shard ident, a too short account id, a
shard count that is not a power of two in 1..256, or an account no shard of a list holds.
messages.py and schedule.py re-export these names (schedule.shard_of turns ShardError into
its ScheduleError).
"""
from __future__ import annotations

from typing import Iterable

from ..errors import RempRemoteError

__all__ = ["U64", "FULL_SHARD", "MASTERCHAIN_KEY", "MASTERCHAIN_WORKCHAIN", "ShardError", "is_valid_shard", "shard_range", "shard_depth",
           "shard_contains", "shard_prefixes", "split_shards", "shard_for_account", "shard_hex"]

U64 = (1 << 64) - 1
#: The shard ident covering a whole workchain; the masterchain's only shard.
FULL_SHARD = 0x8000000000000000
#: Workchain id of the masterchain.
MASTERCHAIN_WORKCHAIN = -1
#: The key the REMP cores use where they key things by shard ident (RMQs, groups, receipts'
#: `shard` in events) for the masterchain's own message queue: external messages to
#: workchain -1 accounts, processed by the masterchain validators. Not a
#: valid shard ident on purpose (no workchain-0 shard can collide with it); shard_hex maps
#: it to the masterchain's only shard, 8000000000000000.
MASTERCHAIN_KEY = -1
#: Deepest split the helpers accept (2**8 = 256 shards).
MAX_SPLIT_DEPTH = 8


class ShardError(RempRemoteError):
    """An invalid shard ident, account id or shard split."""


def is_valid_shard(shard: int) -> bool:
    """True iff `shard` is a 64-bit TON shard ident (an int, non-zero, < 2**64)."""
    return isinstance(shard, int) and not isinstance(shard, bool) and 0 < shard <= U64


def shard_range(shard: int) -> tuple[int, int]:
    """[lo, hi) of the 64-bit account-id prefixes covered by `shard`. Raises ShardError."""
    if not is_valid_shard(shard):
        raise ShardError(f"invalid shard prefix {shard!r}")
    low = shard & -shard
    lo = shard & ~((low << 1) - 1) & U64
    return lo, lo + (low << 1)


def shard_depth(shard: int) -> int:
    """Number of prefix bits of a shard ident (0 for FULL_SHARD). Raises ShardError."""
    if not is_valid_shard(shard):
        raise ShardError(f"invalid shard prefix {shard!r} (no tag bit)")
    return 63 - ((shard & -shard).bit_length() - 1)


def shard_contains(shard: int, account: bytes) -> bool:
    """TON `shard_contains`: True iff the account id (>= 8 bytes; 32 in practice) falls into
    `shard` (the top shard_depth bits of its first 8 bytes equal the shard's prefix).
    Raises ShardError for an invalid shard or an account id shorter than 8 bytes."""
    if len(account) < 8:
        raise ShardError(f"account id must be >= 8 bytes, got {len(account)}")
    lo, hi = shard_range(shard)
    return lo <= int.from_bytes(account[:8], "big") < hi


def shard_prefixes(count: int) -> list[int]:
    """The `count` equal shards of one workchain (count a power of two, 1..256), ascending:
    shard_prefixes(1) == [0x8000000000000000]; shard_prefixes(2) == [0x4000000000000000,
    0xC000000000000000]. Raises ShardError otherwise."""
    if not isinstance(count, int) or count < 1 or count > 1 << MAX_SPLIT_DEPTH or count & (count - 1):
        raise ShardError(f"shard count must be a power of two in 1..256, got {count}")
    step = 1 << (64 - (count.bit_length() - 1))
    return [i * step + (step >> 1) for i in range(count)]


def split_shards(depth: int) -> list[int]:
    """The 2**depth equal shards of a workchain (depth 0..8), e.g. depth 1 ->
    [0x4000000000000000, 0xC000000000000000]. Raises ShardError."""
    if not isinstance(depth, int) or not 0 <= depth <= MAX_SPLIT_DEPTH:
        raise ShardError(f"shard split depth must be 0..{MAX_SPLIT_DEPTH}, got {depth}")
    return shard_prefixes(1 << depth)


def shard_for_account(account: bytes, shards: Iterable[int]) -> int:
    """The shard among `shards` (a partition of one workchain) holding the account id.
    Raises ShardError if none does."""
    for s in shards:
        if shard_contains(s, account):
            return s
    raise ShardError(f"no shard holds account {bytes(account).hex()}")


def shard_hex(shard: int) -> str:
    """Shard ident as 16 hex digits (receipt JSON `shard`, event log attribute), e.g.
    '4000000000000000'. MASTERCHAIN_KEY -> '8000000000000000' (the masterchain's shard)."""
    if shard == MASTERCHAIN_KEY:
        return f"{FULL_SHARD:016x}"
    return f"{shard & U64:016x}"
