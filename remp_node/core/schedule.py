"""Zerostate config and master catchain session schedule for the simplified REMP chain.

Pure functions: no I/O, no clock (`now` is float seconds from the caller on the same time
base as `ZeroStateConfig.genesis_time`).

Sources: DESIGN.md section 4 ("A zerostate config lists validators ..., shards ...,
validators per shard group, mc_catchain_lifetime, block interval"; "Master catchain
sessions: seqno N switches every mc_catchain_lifetime. Each session the shard groups rotate
deterministically (seeded by the previous master block hash)"); seeds/remp-overview.md and
seeds/remp-protocol-a.txt ("REMP Catchain session is shared among validators that are
currently validating the given shard and validators that validated this shard in the
previous session"; session lifetime = config param 28 `mc_catchain_lifetime`, 250 s).

Shards are TON 64-bit shard prefixes: the lowest set bit terminates the prefix, e.g.
0x8000000000000000 = the whole workchain, 0x4000000000000000 / 0xC000000000000000 = the two
halves (account ids starting with bit 0 / bit 1). `shard_of` maps an account id (32 bytes)
to its shard using TON's `shard_contains` rule on the first 8 bytes.

Errors: an invalid config or argument raises ScheduleError (a ValueError): configs come from
files and are remote-ish input.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..errors import RempRemoteError
from ..wire.keys import key_id
from ..wire.shards import (FULL_SHARD, U64, ShardError, is_valid_shard, shard_contains,  # noqa: F401
                     shard_for_account, shard_hex, shard_range, split_shards)
from ..wire.node_tl import GROUP_SEED, TL_GROUP_SEED, pack_group_seed  # noqa: F401

MASTERCHAIN = -1
GENESIS_MASTER_HASH = bytes(32)
"""`prev_master_block_hash` to use for session 0 (there is no previous master block)."""



class ScheduleError(RempRemoteError):
    """Invalid zerostate config or schedule argument."""


# --- shards (shards.py; re-exported: is_valid_shard, shard_range, shard_contains, split_shards,
# shard_hex, FULL_SHARD, U64) -----------------------------------------------------------

def _parse_shard(value: Any) -> int:
    if isinstance(value, str):
        try:
            value = int(value, 16)
        except ValueError:
            raise ScheduleError(f"shard {value!r} is not hex") from None
    if not isinstance(value, int) or not is_valid_shard(value):
        raise ScheduleError(f"invalid shard prefix {value!r}")
    return value


def check_shard_cover(shards: Iterable[int]) -> list[int]:
    """Raise ScheduleError unless `shards` are disjoint and cover the whole workchain."""
    shards = list(shards)
    if not shards:
        raise ScheduleError("no shards")
    ranges = sorted(shard_range(s) + (s,) for s in shards)
    pos = 0
    for lo, hi, s in ranges:
        if lo != pos:
            raise ScheduleError(f"shards overlap or leave a gap at {shard_hex(pos)} (shard {shard_hex(s)})")
        pos = hi
    if pos != 1 << 64:
        raise ScheduleError("shards do not cover the whole workchain")
    return shards


def shard_of(shards: "ZeroStateConfig | Iterable[int]", account_hash: bytes) -> int:
    """The shard (of a config or a shard list) holding account id `account_hash` (32 bytes).

    Raises ScheduleError if no shard contains it (shards not a cover) or an input is
    invalid (shards.shard_for_account)."""
    if isinstance(shards, ZeroStateConfig):
        shards = shards.shards
    try:
        return shard_for_account(account_hash, shards)
    except ShardError as exc:
        raise ScheduleError(str(exc)) from None


# --- config ---------------------------------------------------------------------------

def _hex_key(value: Any, what: str) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        raw = bytes(value)
    elif isinstance(value, str):
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            raise ScheduleError(f"{what} is not hex: {value!r}") from None
    else:
        raise ScheduleError(f"{what} must be hex text or bytes, got {type(value).__name__}")
    if len(raw) != 32:
        raise ScheduleError(f"{what} must be 32 bytes, got {len(raw)}")
    return raw


@dataclass(frozen=True)
class ValidatorInfo:
    """A validator: ed25519 `public_key` (32 bytes) and UDP `address` "host:port"."""

    public_key: bytes
    address: str

    def __post_init__(self) -> None:
        if not isinstance(self.public_key, (bytes, bytearray)) or len(self.public_key) != 32:
            raise ScheduleError("validator public_key must be 32 bytes")
        host, sep, port = str(self.address).rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ScheduleError(f"validator address must be host:port, got {self.address!r}")

    @property
    def key_id(self) -> bytes:
        """32-byte key id (sha256 of boxed pub.ed25519), the node id on the wire."""
        return key_id(self.public_key)

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    def to_dict(self) -> dict:
        return {"public_key": self.public_key.hex(), "address": self.address}

    @classmethod
    def from_dict(cls, d: dict) -> "ValidatorInfo":
        if not isinstance(d, dict):
            raise ScheduleError("validator entry must be a table/object")
        return cls(_hex_key(d.get("public_key"), "validator public_key"), str(d.get("address", "")))


@dataclass
class ZeroStateConfig:
    """The zerostate config (DESIGN.md section 4).

    workchain: int (e.g. 0); shards: 64-bit shard prefixes covering the workchain;
    validators: ValidatorInfo list (order is the config order); shard_group_size: validators
    per shard group (e.g. 7; capped at len(validators)); masterchain_validators: "all" or a
    list of 32-byte public keys (each must be a listed validator); mc_catchain_lifetime:
    seconds per master catchain session (250 in production); block_interval: seconds
    between blocks; genesis_time: start of session 0 (seconds, caller's time base);
    group_draw: how shard groups are drawn each session (shard_groups): "independent" (each
    shard's group drawn on its own: a validator may serve several shards while another
    serves none; the default, and the rule of configs written before "dealt") or "dealt"
    (one seeded ranking dealt out shard after shard: disjoint groups while shards x
    shard_group_size <= validators, else every validator in as many groups as any other,
    give or take one). to_dict()/from_dict() give a JSON/TOML-able dict: keys and shards as hex text (shards do
    not fit TOML's signed 64-bit integers).
    """

    workchain: int
    shards: list[int]
    validators: list[ValidatorInfo]
    shard_group_size: int = 7
    masterchain_validators: list[bytes] | str = "all"
    mc_catchain_lifetime: float = 250.0
    block_interval: float = 1.0
    genesis_time: float = 0.0
    extra: dict = field(default_factory=dict)
    group_draw: str = "independent"

    def __post_init__(self) -> None:
        if not isinstance(self.workchain, int) or not -(1 << 31) <= self.workchain < (1 << 31):
            raise ScheduleError(f"workchain must be a 32-bit int, got {self.workchain!r}")
        if self.workchain == MASTERCHAIN:
            raise ScheduleError("the zerostate workchain must be a basechain, not -1")
        self.shards = check_shard_cover([_parse_shard(s) for s in self.shards])
        if not self.validators:
            raise ScheduleError("no validators")
        keys = [v.public_key for v in self.validators]
        if len(set(keys)) != len(keys):
            raise ScheduleError("duplicate validator public key")
        if not isinstance(self.shard_group_size, int) or self.shard_group_size < 1:
            raise ScheduleError(f"shard_group_size must be >= 1, got {self.shard_group_size!r}")
        if self.masterchain_validators != "all":
            if isinstance(self.masterchain_validators, str):
                raise ScheduleError('masterchain_validators must be "all" or a list of keys')
            mc = [_hex_key(k, "masterchain validator") for k in self.masterchain_validators]
            unknown = [k.hex() for k in mc if k not in keys]
            if unknown or not mc or len(set(mc)) != len(mc):
                raise ScheduleError(f"masterchain_validators must be distinct listed validators "
                                    f"(unknown: {unknown})")
            self.masterchain_validators = mc
        for name in ("mc_catchain_lifetime", "block_interval"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ScheduleError(f"{name} must be a positive number of seconds, got {v!r}")
        if not isinstance(self.genesis_time, (int, float)) or not math.isfinite(self.genesis_time):
            raise ScheduleError(f"genesis_time must be a finite number, got {self.genesis_time!r}")
        if self.group_draw not in GROUP_DRAWS:
            raise ScheduleError(f"group_draw must be one of {GROUP_DRAWS}, got {self.group_draw!r}")

    # - lookups -
    def validator(self, public_key: bytes) -> ValidatorInfo:
        for v in self.validators:
            if v.public_key == public_key:
                return v
        raise ScheduleError(f"unknown validator {public_key.hex()[:16]}")

    def by_key_id(self) -> dict[bytes, ValidatorInfo]:
        """key id (32 bytes) -> ValidatorInfo."""
        return {v.key_id: v for v in self.validators}

    def shard_of(self, account_hash: bytes) -> int:
        return shard_of(self.shards, account_hash)

    # - (de)serialization -
    def to_dict(self) -> dict:
        d = {
            "workchain": self.workchain,
            "shards": [shard_hex(s) for s in self.shards],
            "validators": [v.to_dict() for v in self.validators],
            "shard_group_size": self.shard_group_size,
            "masterchain_validators": (self.masterchain_validators if self.masterchain_validators == "all"
                                       else [k.hex() for k in self.masterchain_validators]),
            "mc_catchain_lifetime": float(self.mc_catchain_lifetime),
            "block_interval": float(self.block_interval),
            "genesis_time": float(self.genesis_time),
        }
        if self.group_draw != "independent":     # configs without the key keep the old rule
            d["group_draw"] = self.group_draw
        if self.extra:
            d["extra"] = dict(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ZeroStateConfig":
        if not isinstance(d, dict):
            raise ScheduleError("zerostate config must be a table/object")
        known = {"workchain", "shards", "validators", "shard_group_size", "masterchain_validators",
                 "mc_catchain_lifetime", "block_interval", "genesis_time", "extra", "group_draw"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ScheduleError(f"unknown zerostate config keys: {unknown}")
        for req in ("workchain", "shards", "validators"):
            if req not in d:
                raise ScheduleError(f"zerostate config lacks {req!r}")
        if not isinstance(d["shards"], list) or not isinstance(d["validators"], list):
            raise ScheduleError("shards and validators must be lists")
        mcv = d.get("masterchain_validators", "all")
        return cls(
            workchain=d["workchain"],
            shards=list(d["shards"]),
            validators=[ValidatorInfo.from_dict(v) for v in d["validators"]],
            shard_group_size=d.get("shard_group_size", 7),
            masterchain_validators=mcv if mcv == "all" else list(mcv),
            mc_catchain_lifetime=d.get("mc_catchain_lifetime", 250.0),
            block_interval=d.get("block_interval", 1.0),
            genesis_time=d.get("genesis_time", 0.0),
            extra=dict(d.get("extra", {})),
            group_draw=d.get("group_draw", "independent"),
        )


# --- master sessions --------------------------------------------------------------------

def master_session_at(cfg: ZeroStateConfig, now: float) -> int:
    """Master catchain session seqno N at time `now` (s): N switches every
    mc_catchain_lifetime starting at genesis_time (session N covers
    [genesis + N*lifetime, genesis + (N+1)*lifetime)). Times before genesis give 0."""
    if now <= cfg.genesis_time:
        return 0
    life = cfg.mc_catchain_lifetime
    n = int(math.floor((now - cfg.genesis_time) / life))
    # guard float rounding at the boundaries: session_start(n) <= now < session_start(n+1)
    while n > 0 and session_start(cfg, n) > now:
        n -= 1
    while session_start(cfg, n + 1) <= now:
        n += 1
    return n


def session_start(cfg: ZeroStateConfig, session_seqno: int) -> float:
    """Start time (s) of master session `session_seqno`."""
    if session_seqno < 0:
        raise ScheduleError(f"session seqno must be >= 0, got {session_seqno}")
    return cfg.genesis_time + session_seqno * cfg.mc_catchain_lifetime


def next_session_switch(cfg: ZeroStateConfig, now: float) -> float:
    """Time (s) of the next session switch after `now` (a timer deadline for the caller)."""
    return session_start(cfg, master_session_at(cfg, now) + 1)


def message_obsolete(received_session: int, current_session: int) -> bool:
    """A message received in master session N is obsolete from session N+2 (seed:
    remp-protocol-a.txt, message lifetime)."""
    return current_session >= received_session + 2


# --- groups ------------------------------------------------------------------------------

def masterchain_members(cfg: ZeroStateConfig) -> list[bytes]:
    """Public keys of the masterchain validators, config order (static across sessions)."""
    if cfg.masterchain_validators == "all":
        return [v.public_key for v in cfg.validators]
    return list(cfg.masterchain_validators)


#: ZeroStateConfig.group_draw values (shard_groups)
GROUP_DRAWS = ("independent", "dealt")


def group_seed(session_seqno: int, prev_master_block_hash: bytes, workchain: int, shard: int) -> bytes:
    """sha256(boxed `remp.schedule.groupSeed prev_mc_block_hash:int256 session_seqno:int
    workchain:int shard:long`): the per-shard rotation seed of a session."""
    if session_seqno < 0:
        raise ScheduleError(f"session seqno must be >= 0, got {session_seqno}")
    if len(prev_master_block_hash) != 32:
        raise ScheduleError("prev_master_block_hash must be 32 bytes")
    return hashlib.sha256(pack_group_seed(prev_master_block_hash, session_seqno, workchain, shard)).digest()


def shard_groups(cfg: ZeroStateConfig, session_seqno: int, prev_master_block_hash: bytes) -> dict[int, list[bytes]]:
    """shard -> ordered public keys of the shard's validator group in master session
    `session_seqno`.

    Rule (ours; DESIGN.md section 4 asks for a deterministic rotation seeded by the previous
    master block hash): seed(shard) = group_seed(session, prev_master_block_hash, workchain,
    shard); a group is ordered by sha256(seed(shard) || public_key) (the consensus leader
    order) and has min(shard_group_size, len(validators)) members, chosen by cfg.group_draw:
    - "independent": the first of all validators in that order, for each shard on its own
      (a validator may serve several shards, as in TON, and another none: with 2 shards x 7
      of 14 validators a session's busiest validator did twice the work of an average one);
    - "dealt": all validators ranked once by sha256(seed(0) || public_key) (shard 0 is no
      shard ident: a session-wide seed) and dealt out in that order, k to each shard in
      config order, wrapping around: shard i gets ranked[(i * k + j) % n], j < k. Disjoint
      groups while shards x k <= n (2 x 7 of 14: every validator in exactly one group), and
      otherwise each validator in floor or ceil(shards x k / n) groups.
    Both rotate every session and give every shard a group of k distinct validators. For
    session 0 pass GENESIS_MASTER_HASH.
    """
    n = len(cfg.validators)
    k = min(cfg.shard_group_size, n)
    out: dict[int, list[bytes]] = {}
    if cfg.group_draw == "dealt":
        deal = group_seed(session_seqno, prev_master_block_hash, cfg.workchain, 0)
        ranked = sorted(cfg.validators, key=lambda v: hashlib.sha256(deal + v.public_key).digest())
        for i, shard in enumerate(cfg.shards):
            seed = group_seed(session_seqno, prev_master_block_hash, cfg.workchain, shard)
            members = [ranked[(i * k + j) % n] for j in range(k)]
            members.sort(key=lambda v: hashlib.sha256(seed + v.public_key).digest())
            out[shard] = [v.public_key for v in members]
        return out
    for shard in cfg.shards:
        seed = group_seed(session_seqno, prev_master_block_hash, cfg.workchain, shard)
        ranked = sorted(cfg.validators, key=lambda v: hashlib.sha256(seed + v.public_key).digest())
        out[shard] = [v.public_key for v in ranked[:k]]
    return out


def remp_catchain_members(current: list[bytes], previous: list[bytes]) -> list[bytes]:
    """The REMP catchain (RMQ) members: the union of the current and the previous session's
    group, current group first (its order), then previous-only members (their order)."""
    seen = set(current)
    return list(current) + [p for p in previous if p not in seen and not seen.add(p)]


@dataclass(frozen=True)
class ShardSessionGroups:
    """One shard's groups in one master session: `current` (validates blocks) and `previous`
    (the previous session's group, [] in session 0); `remp_members` is their union."""

    shard: int
    session_seqno: int
    current: list[bytes]
    previous: list[bytes]

    @property
    def remp_members(self) -> list[bytes]:
        return remp_catchain_members(self.current, self.previous)


def shard_session_groups(cfg: ZeroStateConfig, session_seqno: int, prev_master_block_hash: bytes,
                         prev_session_master_block_hash: bytes | None = None) -> dict[int, ShardSessionGroups]:
    """shard -> ShardSessionGroups(current, previous) for master session `session_seqno`.

    `prev_master_block_hash` seeds session N's groups; `prev_session_master_block_hash` is
    the hash that seeded session N-1 (required when N >= 1; ignored for N = 0)."""
    cur = shard_groups(cfg, session_seqno, prev_master_block_hash)
    if session_seqno == 0:
        prev = {s: [] for s in cfg.shards}
    else:
        if prev_session_master_block_hash is None:
            raise ScheduleError("session >= 1 needs the previous session's seed hash")
        prev = shard_groups(cfg, session_seqno - 1, prev_session_master_block_hash)
    return {s: ShardSessionGroups(s, session_seqno, cur[s], prev[s]) for s in cfg.shards}
