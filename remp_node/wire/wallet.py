"""Wallet message bodies and account keys of REMP's model executor (DESIGN.md section 4,
"Account execution"): the body layout, its builder and reader, a whole external-in message
BOC for a transfer, and the 'workchain:hex64' account keys. Cells are built and read only
with pytoniq-core. The executor that checks and applies a transfer is
remp_node/core/state.py, whose module docstring gives the rules.

Wallet message body (one cell):

    signature:bits512  valid_until:uint32  nonce:uint32  dest:MsgAddressInt  amount:Coins

The signature is ed25519 over the representation hash of the cell holding the fields after
the signature (the "signed part"), as TON wallets do.

Errors: decode_wallet_body raises WalletBodyError (a RempRemoteError, a ValueError); the
builders raise ValueError for an out-of-range argument.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from pytoniq_core import Address, Builder, Cell, MessageAny
from pytoniq_core.tlb.transaction import ExternalMsgInfo

from ..errors import RempRemoteError
from .keys import NodeKey
from .messages import parse_account_id

__all__ = ["MAX_AMOUNT", "account_key", "wallet_address", "WalletTransfer", "WalletBodyError",
           "build_wallet_body", "decode_wallet_body", "make_wallet_message"]

#: Largest amount a Coins field holds (VarUInteger 16: 15 bytes).
MAX_AMOUNT = (1 << 120) - 1


def account_key(workchain: int, account: bytes) -> str:
    """'workchain:hex64' for a 32-byte account id."""
    if len(account) != 32:
        raise ValueError("account id must be 32 bytes")
    return f"{workchain}:{account.hex()}"


def wallet_address(public_key: bytes, workchain: int = 0) -> str:
    """The model's wallet address for an ed25519 public key: 'workchain:' + hex(sha256(key)).
    (Our rule, standing in for TON's StateInit hash.)"""
    if len(public_key) != 32:
        raise ValueError("public key must be 32 bytes")
    return account_key(workchain, hashlib.sha256(public_key).digest())


@dataclass(frozen=True)
class WalletTransfer:
    """The decoded signed part of a wallet body: valid_until (Unix s), nonce, dest
    ('workchain:hex64'), amount (nano units), plus the signature and the signed hash."""

    signature: bytes
    signed_hash: bytes
    valid_until: int
    nonce: int
    dest: str
    amount: int


class WalletBodyError(RempRemoteError):
    """A wallet message body that does not have the wallet layout (see module doc)."""


def build_wallet_body(key: NodeKey, dest: str, amount: int, valid_until: int, nonce: int) -> Cell:
    """The signed wallet body cell for a transfer of `amount` to `dest` ('wc:hex64')."""
    if not 0 <= amount <= MAX_AMOUNT:
        raise ValueError(f"amount out of range: {amount}")
    wc, acc = parse_account_id(dest)
    signed = (Builder().store_uint(valid_until, 32).store_uint(nonce, 32)
              .store_address(Address((wc, acc))).store_coins(amount).end_cell())
    return Builder().store_bytes(key.sign(signed.hash)).store_cell(signed).end_cell()


def decode_wallet_body(body: Cell) -> WalletTransfer:
    """Read a wallet body (see module doc). Raises WalletBodyError with what is wrong."""
    try:
        s = body.begin_parse()
        if s.remaining_bits < 512:
            raise WalletBodyError(f"body has {s.remaining_bits} bits, a signature needs 512")
        signature = s.load_bytes(64)
        signed = s.to_cell()
        p = signed.begin_parse()
        valid_until = p.load_uint(32)
        nonce = p.load_uint(32)
        dest = p.load_address()
        amount = p.load_coins()
        if not isinstance(dest, Address):
            raise WalletBodyError("destination is not a standard internal address")
        if p.remaining_bits or p.remaining_refs:
            raise WalletBodyError(f"{p.remaining_bits} bits and {p.remaining_refs} refs left after the transfer")
    except WalletBodyError:
        raise
    except Exception as exc:  # pytoniq-core slice errors
        raise WalletBodyError(f"{type(exc).__name__}: {exc}") from None
    return WalletTransfer(signature, signed.hash, valid_until, nonce,
                          account_key(int(dest.wc), bytes(dest.hash_part)), amount)


def make_wallet_message(key: NodeKey, src: str, dest: str, amount: int, valid_until: int,
                        nonce: int = 0) -> bytes:
    """A real external-in message BOC (pytoniq-core) to wallet `src` ('wc:hex64') asking it
    to move `amount` to `dest`, signed by `key`. Returns the BOC bytes (no CRC)."""
    wc, acc = parse_account_id(src)
    body = build_wallet_body(key, dest, amount, valid_until, nonce)
    info = ExternalMsgInfo(src=None, dest=Address((wc, acc)), import_fee=0)
    return MessageAny(info=info, init=None, body=body).serialize().to_boc()
