"""Shard state and a small deterministic wallet executor (DESIGN.md section 4, "Account
execution": wallet-style signature over the body with the account's public key,
`valid_until`, balance moves; rejected executions give RejectedByCollator with the error text).

Accounts are keyed 'workchain:hex64'. An account has an ed25519 public key (a wallet) or
None (an "open" account: it accepts any well-formed external message and moves no value;
the real mainnet messages in ../shared/data/ton/ext_messages.jsonl go to such accounts).

Wallet message body (one cell, built and read with pytoniq-core in remp_node/wire/wallet.py):

    signature:bits512  valid_until:uint32  nonce:uint32  dest:MsgAddressInt  amount:Coins

The signature is ed25519 over the representation hash of the cell holding the fields after
the signature (the "signed part"), as TON wallets do. `valid_until` is Unix seconds; the
message is expired when valid_until < now. `nonce` is any uint32 that makes two transfers with
otherwise equal fields distinct (replay protection is REMP's message cache, not the wallet).

Time: `now` everywhere in this module is Unix time in seconds (float or int), because it
is compared with valid_until; a simulation's fake clock must start at a Unix epoch value.
"""
from __future__ import annotations

import copy as _copy
import functools
import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ..wire.keys import verify
from ..wire.messages import ExternalMessage, MessageRejected, parse_account_id
from ..wire.shards import (FULL_SHARD, MASTERCHAIN_KEY, MASTERCHAIN_WORKCHAIN, shard_contains, shard_for_account,
                     shard_hex, shard_prefixes)
# the wallet body and message codecs and the account keys are in wire/wallet.py; re-exported
# here for existing importers
from ..wire.wallet import (MAX_AMOUNT, WalletBodyError, WalletTransfer, account_key,  # noqa: F401
                           build_wallet_body, decode_wallet_body, make_wallet_message, wallet_address)

@dataclass
class Account:
    """One account: public_key (32 bytes) or None for an open account; balance in nano
    units (int >= 0)."""

    public_key: bytes | None
    balance: int = 0


def _copy_account(a: Account, _new=object.__new__) -> Account:
    """A new Account with every field of `a` (a shallow copy: its fields are immutable)."""
    n = _new(Account)
    n.__dict__.update(a.__dict__)
    return n


#: memo of the pure, per-message parts of an execution (the body decode and the ed25519 check
#: of its signature), which every collator, validator, accepted-block and master-block
#: application of one message repeats (about 4 executions on each of the shard group's
#: validators, 1 on every other masterchain member and the full node: ~35 decodes and
#: signature checks per message with 2 x 7 validators). Bounded, least recently used out.
_MEMO_MAX = 1 << 15
_decoded: "OrderedDict[bytes, WalletTransfer | WalletBodyError]" = OrderedDict()


def _memo_put(memo: OrderedDict, key, value) -> None:
    memo[key] = value
    if len(memo) > _MEMO_MAX:
        memo.popitem(last=False)


def _wallet_transfer(msg: ExternalMessage) -> "WalletTransfer | WalletBodyError":
    """decode_wallet_body(msg.body), memoized by the body cell hash (msg.uid)."""
    key = msg.uid
    tr = _decoded.get(key)
    if tr is not None:
        _decoded.move_to_end(key)          # least recently USED goes first
    else:
        try:
            tr = decode_wallet_body(msg.body)
        except WalletBodyError as exc:
            tr = exc
        _memo_put(_decoded, key, tr)
    return tr


def _signed_by(public_key: bytes, tr: WalletTransfer) -> bool:
    """verify(public_key, signed hash, signature), memoized on all three."""
    return _verify_memo(public_key, tr.signed_hash, tr.signature)


_verify_memo = functools.lru_cache(maxsize=_MEMO_MAX)(verify)


@dataclass(frozen=True)
class ExecResult:
    """Outcome of executing one message.

    ok: accepted; error: exact reason when not ok ("" when ok), used as the RejectedByCollator
    / RejectedByFullnode error text; account: the destination account key; amount: value moved
    (0 for open accounts); dest: transfer destination or None; credited_here: True when dest
    is in this shard and was credited; otherwise the credit is an outbound transfer for the
    caller (another shard) to apply with `ShardState.credit`."""

    ok: bool
    error: str = ""
    account: str = ""
    amount: int = 0
    dest: str | None = None
    credited_here: bool = False


class ShardState:
    """The accounts of one shard (workchain, shard ident in 64-bit prefix form).

    Deterministic: the same messages executed in the same order from the same state give
    the same state (`state_hash`). `copy()` gives an independent state (collators execute a
    candidate on a copy and keep it only when the block is accepted)."""

    def __init__(self, workchain: int, shard: int, accounts: Mapping[str, Account] | None = None):
        self.workchain = workchain
        self.shard = shard
        self.accounts: dict[str, Account] = {}
        for key, acc in (accounts or {}).items():
            self.add_account(key, acc.public_key, acc.balance)

    def __repr__(self) -> str:
        return f"ShardState({self.workchain}:{shard_hex(self.shard)}, {len(self.accounts)} accounts)"

    def holds(self, dst: str) -> bool:
        """True iff account 'wc:hex64' belongs to this shard (whether or not it exists)."""
        wc, acc = parse_account_id(dst)
        return wc == self.workchain and shard_contains(self.shard, acc)

    def add_account(self, dst: str, public_key: bytes | None, balance: int = 0) -> Account:
        """Create (or replace) an account. ValueError if it belongs to another shard."""
        if not self.holds(dst):
            raise ValueError(f"account {dst} is not in shard {self.workchain}:{shard_hex(self.shard)}")
        if public_key is not None and len(public_key) != 32:
            raise ValueError("public key must be 32 bytes")
        if balance < 0:
            raise ValueError("balance must be >= 0")
        acc = Account(public_key, balance)
        self.accounts[dst] = acc
        return acc

    def get(self, dst: str) -> Account | None:
        """The account or None."""
        return self.accounts.get(dst)

    def credit(self, dst: str, amount: int) -> None:
        """Add `amount` to `dst` (created as an open account when absent)."""
        acc = self.accounts.get(dst)
        if acc is None:
            acc = self.add_account(dst, None, 0)
        acc.balance += amount

    def _check(self, msg: ExternalMessage, now: float,
               committed: bool = False) -> tuple[ExecResult, WalletTransfer | None]:
        dst = msg.dst
        acc = self.accounts.get(dst)
        if acc is None:
            return ExecResult(False, f"Unknown account {dst}", dst), None
        if acc.public_key is None:
            return ExecResult(True, "", dst), None
        tr = _wallet_transfer(msg)
        if isinstance(tr, WalletBodyError):
            return ExecResult(False, f"Bad wallet message body: {tr}", dst), None
        if not committed and not _signed_by(acc.public_key, tr):
            return ExecResult(False, "Invalid signature: body not signed by the account key", dst), None
        if tr.valid_until < now:
            return ExecResult(False, f"Message expired: valid_until {tr.valid_until} < now {int(now)}", dst), None
        if tr.amount > acc.balance:
            return ExecResult(False, f"Insufficient balance: {acc.balance} < {tr.amount}", dst), None
        return ExecResult(True, "", dst, tr.amount, tr.dest), tr

    def _own(self, msg: ExternalMessage) -> None:
        if msg.workchain != self.workchain or not shard_contains(self.shard, msg.account):
            raise ValueError(f"message to {msg.dst} does not belong to shard "
                             f"{self.workchain}:{shard_hex(self.shard)}")

    def try_execute(self, msg: ExternalMessage, now: float) -> ExecResult:
        """Execute without changing the state. ValueError if msg is for another shard."""
        self._own(msg)
        return self._check(msg, now)[0]

    def precheck(self, msg: ExternalMessage, now: float) -> None:
        """The full node's state checks (RejectedByFullnode): raises MessageRejected with
        code "unknown_account" ("Unknown account 0:...") or "pre_execution" ("Pre-execution
        failed: <executor error>"); returns None when the message would execute now."""
        res = self.try_execute(msg, now)
        if res.ok:
            return
        if res.error.startswith("Unknown account"):
            raise MessageRejected("unknown_account", res.error)
        raise MessageRejected("pre_execution", f"Pre-execution failed: {res.error}")

    def execute(self, msg: ExternalMessage, now: float, committed: bool = False) -> ExecResult:
        """The collator's execution: on success apply the balance moves (debit the wallet,
        credit the destination when it is in this shard) and return ok; on failure change
        nothing and return the error text (for RejectedByCollator).

        committed=True: `msg` comes from a block a quorum of its shard group accepted (each
        of them executed it with every check when it validated the candidate), as a
        validator outside that group or a full node applies it: the wallet's ed25519 body
        signature is not verified again (~70-90 us per message per node, half of a
        validator's wallet verifies with two shards); every state check (account, body,
        expiry against the block's time, balance) still runs, so the states stay equal."""
        self._own(msg)
        res, tr = self._check(msg, now, committed)
        if not res.ok or tr is None:
            return res
        self.accounts[res.account].balance -= tr.amount
        here = self.holds(tr.dest)
        if here:
            self.credit(tr.dest, tr.amount)
        return ExecResult(True, "", res.account, tr.amount, tr.dest, here)

    def copy(self) -> "ShardState":
        """An independent copy: a new account table of new Account objects (public keys are
        immutable bytes). Collators and validators copy the tip for every candidate and the
        master collator the masterchain state for every master block: copy.deepcopy of a
        200-account state cost ~2-6 ms (its memo and reconstruction per object), a fixed cost
        per block at every validator; this is ~30x cheaper. Each Account is copied field by
        field whatever its fields (its __dict__), as fast as calling its constructor."""
        new = ShardState.__new__(ShardState)
        new.__dict__.update(self.__dict__)
        new.accounts = {k: _copy_account(a) for k, a in self.accounts.items()}
        return new

    def state_hash(self) -> bytes:
        """sha256 over the canonical account list (sorted keys; key, public key, balance)."""
        h = hashlib.sha256(f"{self.workchain}:{shard_hex(self.shard)}".encode())
        for k in sorted(self.accounts):
            acc = self.accounts[k]
            h.update(k.encode() + b"|" + (acc.public_key or b"").hex().encode() + b"|"
                     + str(acc.balance).encode() + b";")
        return h.digest()


@dataclass
class ZeroState:
    """The initial shard states of one workchain: `shards` (ascending shard idents) and
    `states` (shard ident -> ShardState), plus the masterchain's accounts: `masterchain`, a
    ShardState of workchain -1, shard 8000000000000000 (external messages
    to workchain -1 accounts are processed by the masterchain validators)."""

    workchain: int
    shards: list[int]
    states: dict[int, ShardState] = field(default_factory=dict)
    masterchain: ShardState = field(default_factory=lambda: ShardState(MASTERCHAIN_WORKCHAIN, FULL_SHARD))

    @property
    def workchains(self) -> tuple[int, int]:
        """Workchains that take external messages: (workchain, -1)."""
        return (self.workchain, MASTERCHAIN_WORKCHAIN)

    def shard_of(self, dst: str) -> int:
        """Shard ident holding account 'wc:hex64'; shards.MASTERCHAIN_KEY for workchain -1
        (ValueError for another workchain)."""
        wc, acc = parse_account_id(dst)
        if wc == MASTERCHAIN_WORKCHAIN:
            return MASTERCHAIN_KEY
        if wc != self.workchain:
            raise ValueError(f"account {dst} is not in workchain {self.workchain}")
        return shard_for_account(acc, self.shards)

    def state_for(self, dst: str) -> ShardState:
        """The ShardState holding account `dst` (the masterchain state for workchain -1)."""
        s = self.shard_of(dst)
        return self.masterchain if s == MASTERCHAIN_KEY else self.states[s]

    def state_of_key(self, shard: int) -> ShardState:
        """The state of shard ident `shard` or of shards.MASTERCHAIN_KEY."""
        return self.masterchain if shard == MASTERCHAIN_KEY else self.states[shard]

    def add_account(self, dst: str, public_key: bytes | None, balance: int = 0) -> Account:
        """Create an account in the right shard."""
        return self.state_for(dst).add_account(dst, public_key, balance)

    def copy(self) -> "ZeroState":
        """An independent deep copy (each node keeps its own states)."""
        return _copy.deepcopy(self)


def build_zero_state(workchain: int = 0, shard_count: int = 2,
                     wallets: Iterable[tuple[bytes, int]] = (),
                     open_accounts: Iterable[str] = (), open_balance: int = 0,
                     masterchain_wallets: Iterable[tuple[bytes, int]] = ()) -> ZeroState:
    """Shard states for `shard_count` equal shards of `workchain`, with one wallet per
    (public_key, balance) at wallet_address(public_key) and one open account (key None,
    `open_balance`) per 'wc:hex64' in `open_accounts` (e.g. netfiles.real_message_destinations;
    '-1:hex64' ones go to the masterchain state); `masterchain_wallets` are wallets at
    wallet_address(public_key, -1)."""
    shards = shard_prefixes(shard_count)
    zs = ZeroState(workchain, shards, {s: ShardState(workchain, s) for s in shards})
    for pk, balance in wallets:
        zs.add_account(wallet_address(pk, workchain), pk, balance)
    for pk, balance in masterchain_wallets:
        zs.add_account(wallet_address(pk, MASTERCHAIN_WORKCHAIN), pk, balance)
    for dst in open_accounts:
        zs.add_account(dst, None, open_balance)
    return zs


def zero_state_from_mapping(config: Mapping, ext_destinations: Iterable[str] = ()) -> ZeroState:
    """build_zero_state from a config mapping (e.g. the zerostate JSON) and the destinations
    of the real messages (daemon/netfiles.py real_message_destinations reads them from the
    file named by "ext_messages"; this core reads no file):

    {"workchain": 0, "shard_count": 2,
     "wallets": [{"public_key": "<64 hex>", "balance": 1000000000}, ...],
     "open_accounts": ["0:<64 hex>", ...],            # optional
     "masterchain_wallets": [{"public_key": ..., "balance": ...}],  # optional, workchain -1
     "masterchain_accounts": ["-1:<64 hex>", ...],    # optional open accounts of workchain -1
     "open_balance": 0}                                # optional
    `ext_destinations` ('wc:hex64') become open accounts after "open_accounts"."""
    opens = list(config.get("open_accounts", []))
    opens += [d for d in ext_destinations if d not in opens]
    opens += [d for d in config.get("masterchain_accounts", []) if d not in opens]
    wallets = [(bytes.fromhex(w["public_key"]), int(w.get("balance", 0))) for w in config.get("wallets", [])]
    mc_wallets = [(bytes.fromhex(w["public_key"]), int(w.get("balance", 0)))
                  for w in config.get("masterchain_wallets", [])]
    return build_zero_state(int(config.get("workchain", 0)), int(config.get("shard_count", 2)),
                            wallets, opens, int(config.get("open_balance", 0)), mc_wallets)
