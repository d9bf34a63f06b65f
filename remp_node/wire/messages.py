"""Inbound external messages: BOC parsing with pytoniq-core, RejectedByFullnode checks, shards.

Sources: DESIGN.md section 4 ("Message id = root hash of the message BOC ... RejectedByFullnode
covers: undecodable BOC ("Can't deserialize message"), not an inbound external message, size >
65535 bytes or depth >= 512, wrong workchain ..."); seeds/remp-protocol-b.txt (message_id = root
hash of message boc); TL-B `message$_ info:CommonMsgInfo init:(Maybe ...) body:(Either X ^X)`,
`ext_in_msg_info$10 src:MsgAddressExt dest:MsgAddressInt import_fee:Grams`.

Cells are parsed only by pytoniq-core (never by hand). Unknown account and failed
pre-execution are decided against the shard state (state.py), not here.

Shards (TON's 64-bit "prefix with tag" idents): shards.py; shard_prefixes, shard_depth,
shard_contains, shard_for_account and shard_hex are re-exported here.
"""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Iterable

from pytoniq_core import Address, Cell, MessageAny
from pytoniq_core.tlb.transaction import ExternalMsgInfo, ExternalOutMsgInfo, InternalMsgInfo

from ..errors import RempRemoteError

# the shard helpers live in shards.py; re-exported here for existing importers
from .shards import (FULL_SHARD, shard_contains, shard_depth, shard_for_account,  # noqa: F401
                     shard_hex, shard_prefixes)

#: Largest accepted message BOC (bytes); bigger ones get RejectedByFullnode (DESIGN.md s. 4).
MAX_MESSAGE_SIZE = 65535
#: Cell tree depth limit: depth >= MAX_MESSAGE_DEPTH is refused (DESIGN.md section 4).
MAX_MESSAGE_DEPTH = 512
#: The full-workchain shard ident (shards.FULL_SHARD).
SHARD_FULL = FULL_SHARD


class MessageRejected(RempRemoteError):
    """The full node refuses a message (becomes a RejectedByFullnode receipt); a remote
    error (the message came from a client or a peer).

    `reason` (== `code`) is the short tag, a metric label: "deserialize", "not_external_in",
    "too_big", "too_deep", "bad_workchain", "unknown_account", "pre_execution". `text` is
    the exact error text for the receipt, e.g. "Can't deserialize message: BocError: Crc32c
    hashsum mismatch" (DESIGN.md section 4). str(exc) == text."""

    reason = "rejected_by_fullnode"

    def __init__(self, code: str, text: str):
        super().__init__(text, code)
        self.text = text

    @property
    def code(self) -> str:
        """The short tag (the same as `reason`)."""
        return self.reason


@dataclass(frozen=True)
class ExternalMessage:
    """A parsed inbound external message (ext_in_msg_info).

    id: 32 bytes, the root cell hash (REMP message id); uid: 32 bytes, hash of the body cell
    (replay-protection key: two BOCs with one body are duplicates); workchain: destination
    workchain; account: 32-byte destination account id; body: the body Cell (pytoniq-core);
    boc: the original BOC bytes; size: len(boc) in bytes; has_state_init: init present."""

    id: bytes
    uid: bytes
    workchain: int
    account: bytes
    body: Cell
    boc: bytes
    size: int
    has_state_init: bool = False

    @property
    def dst(self) -> str:
        """Destination as 'workchain:hex' (the shard-state account key)."""
        return f"{self.workchain}:{self.account.hex()}"

    @property
    def id_hex(self) -> str:
        """Message id as 64 hex digits (the trace_id in event logs)."""
        return self.id.hex()


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def parse_external_message(boc: bytes, workchains: Iterable[int] = (0,)) -> ExternalMessage:
    """Parse a message BOC and apply the full node's stateless checks, in this order:

    1. size: len(boc) > MAX_MESSAGE_SIZE -> code "too_big";
    2. BOC decoding by pytoniq-core, exactly one root -> "deserialize" with reason
       "Can't deserialize message: <library error>";
    3. the root must be a Message whose info is ext_in_msg_info with a std internal
       destination; internal / external-out messages, transactions and other cells ->
       "not_external_in";
    4. root depth >= MAX_MESSAGE_DEPTH -> "too_deep";
    5. destination workchain not in `workchains` -> "bad_workchain".

    Returns an ExternalMessage; raises MessageRejected (a RempRemoteError, a ValueError) and nothing else."""
    if not isinstance(boc, (bytes, bytearray, memoryview)):
        raise TypeError("boc must be bytes")
    boc = bytes(boc)
    if len(boc) > MAX_MESSAGE_SIZE:
        raise MessageRejected("too_big", f"Message is too big: {len(boc)} bytes > {MAX_MESSAGE_SIZE}")
    if not boc:
        raise MessageRejected("deserialize", "Can't deserialize message: empty BOC")
    try:
        roots = Cell.from_boc(boc)
    except Exception as exc:  # pytoniq-core raises BocError, IndexError, ValueError, ...
        raise MessageRejected("deserialize", f"Can't deserialize message: {_describe(exc)}") from None
    if len(roots) != 1:
        raise MessageRejected("deserialize",
                              f"Can't deserialize message: BOC has {len(roots)} roots, expected 1")
    root = roots[0]
    try:
        msg = MessageAny.deserialize(root.begin_parse())
    except Exception as exc:
        raise MessageRejected("not_external_in",
                              f"Not an inbound external message: root cell is not a Message "
                              f"({_describe(exc)})") from None
    info = msg.info
    if isinstance(info, InternalMsgInfo):
        raise MessageRejected("not_external_in", "Not an inbound external message: internal message")
    if isinstance(info, ExternalOutMsgInfo):
        raise MessageRejected("not_external_in",
                              "Not an inbound external message: outbound external message")
    if not isinstance(info, ExternalMsgInfo) or not isinstance(info.dest, Address):
        raise MessageRejected("not_external_in",
                              "Not an inbound external message: no standard destination address")
    depth = root.get_depth()
    if depth >= MAX_MESSAGE_DEPTH:
        raise MessageRejected("too_deep", f"Message is too deep: cell depth {depth} >= {MAX_MESSAGE_DEPTH}")
    allowed = sorted(set(workchains))
    wc = int(info.dest.wc)
    if wc not in allowed:
        raise MessageRejected("bad_workchain",
                              f"Wrong workchain {wc}: this network accepts workchains {allowed}")
    return ExternalMessage(id=root.hash, uid=msg.body.hash, workchain=wc,
                           account=bytes(info.dest.hash_part), body=msg.body, boc=boc,
                           size=len(boc), has_state_init=msg.init is not None)


def parse_external_message_base64(text: str, workchains: Iterable[int] = (0,)) -> ExternalMessage:
    """parse_external_message of a base64 string (as users and the data files give BOCs);
    invalid base64 -> MessageRejected("deserialize", "Can't deserialize message: invalid
    base64 ...")."""
    try:
        boc = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MessageRejected("deserialize", f"Can't deserialize message: invalid base64 ({exc})") from None
    return parse_external_message(boc, workchains)


def message_id_of(boc: bytes) -> bytes | None:
    """Root cell hash of any single-root BOC, or None if it does not decode (used to name a
    rejected message in its RejectedByFullnode receipt when it is a valid BOC)."""
    try:
        roots = Cell.from_boc(bytes(boc))
    except Exception:
        return None
    return roots[0].hash if len(roots) == 1 else None


def parse_account_id(dst: str) -> tuple[int, bytes]:
    """'workchain:hex64' -> (workchain, 32-byte account). ValueError when malformed."""
    wc_text, sep, hex_text = dst.partition(":")
    if not sep:
        raise ValueError(f"account must be 'workchain:hex', got {dst!r}")
    account = bytes.fromhex(hex_text)
    if len(account) != 32:
        raise ValueError(f"account id must be 32 bytes, got {len(account)}")
    return int(wc_text), account
