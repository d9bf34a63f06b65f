"""The full node follows the chain (DESIGN.md section 4): a sans-I/O core that receives accepted
master blocks, checks the shard block commits they carry, and applies every message to the
full node's own copy of the state, which the REMP client's pre-checks use.

How: the full node is an observer of the masterchain's BlockConsensus (consensus.py: a
non-member polls a member with getCommits every round_timeout and accepts commit
certificates with >= 2/3 valid signatures). Each accepted master block's shard commits are
verified against the shard's group of the block's session (schedule.shard_groups seeded
by the start blocks it saw, as validators do) and their messages executed in order on
`state` (state.ZeroState; wallet balances move); the master block's own masterchain
messages are executed on `state.masterchain`.

Datagrams are the validators' CH_MASTER channel (wire/node_tl.py mux prefix). No I/O, no clock.
Events: ChainBlockApplied (one per master block). Errors: bad remote input never raises out
of receive_datagram; it is counted in `dropped` and reported as a Dropped-like event.
"""
from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass

from . import consensus as cons
from ..wire.keys import NodeKey
from ..wire.messages import MessageRejected, parse_external_message
from .schedule import (GENESIS_MASTER_HASH, ZeroStateConfig, masterchain_members, master_session_at,
                       session_start, shard_groups)
from ..wire.shards import MASTERCHAIN_KEY, MASTERCHAIN_WORKCHAIN
from .state import ZeroState
from ..wire.tl import BlockIdExt
from ..wire.node_tl import CH_MASTER, PayloadError, decode_master_block, decode_shard_payload, demux, mux

__all__ = ["ChainFollower", "ChainBlockApplied", "FollowerDropped"]

#: finalized message ids remembered (message id -> (shard block id, master block id))
MAX_FINALIZED = 200_000


@dataclass(frozen=True)
class ChainBlockApplied:
    """A master block the full node applied. block_id: the master block; session: its
    session tag; shard_blocks: shard block ids it committed; messages: (message id, shard
    key) of every message it finalized (shard key: shard ident or shards.MASTERCHAIN_KEY)."""

    block_id: BlockIdExt
    session: int
    shard_blocks: tuple[BlockIdExt, ...]
    messages: tuple[tuple[bytes, int], ...]


@dataclass(frozen=True)
class FollowerDropped:
    """Remote input the follower dropped: src key id and reason."""

    src: bytes
    reason: str


#: parsed messages kept for the chain application (ChainFollower.remember)
KEEP_PARSED = 8192


class ChainFollower:
    """ChainFollower(key, config, zerostate, *, round_timeout=1.0). key: the full node's
    NodeKey (an observer of the master consensus); state: the ZeroState it keeps updated."""

    def __init__(self, key: NodeKey, config: ZeroStateConfig, zerostate: ZeroState, *, round_timeout: float = 1.0):
        self.cfg = config
        self.state = zerostate
        self.members = masterchain_members(config)
        self.master = cons.BlockConsensus(
            MASTERCHAIN_WORKCHAIN, cons.MASTER_SHARD, self.members, key, start_seqno=1, prev_block_id=None,
            round_timeout=round_timeout, block_interval=config.block_interval,
            collate=lambda seqno, now: None, validate=lambda seqno, payload: "observer")
        self.start_blocks: dict[int, bytes] = {0: GENESIS_MASTER_HASH}
        self._groups: dict[int, dict[int, list[bytes]]] = {}
        self.master_tag = -1
        self.tops = {s: BlockIdExt(config.workchain, s, 0, bytes(32), bytes(32)) for s in config.shards}
        self.finalized: OrderedDict[bytes, tuple[BlockIdExt, BlockIdExt]] = OrderedDict()
        self._events: deque = deque()
        self.dropped: Counter[str] = Counter()
        self.stats = Counter()
        #: messages this full node already parsed (POST /messages): BOC bytes -> parse, so
        #: applying a shard block does not run pytoniq over the same bytes again (~80 us
        #: per message); bounded, oldest out
        self._parsed: OrderedDict[bytes, object] = OrderedDict()

    def remember(self, parsed) -> None:
        """A messages.parse_external_message result of this node's own (the API's): used
        when a shard block carries the same BOC bytes (same bytes, same parse)."""
        self._parsed[parsed.boc] = parsed
        if len(self._parsed) > KEEP_PARSED:
            self._parsed.popitem(last=False)

    # -- schedule ---------------------------------------------------------------------------
    def groups(self, session: int) -> dict[int, list[bytes]] | None:
        g = self._groups.get(session)
        if g is not None:
            return g
        if session < 0:
            return None
        seed = GENESIS_MASTER_HASH if session <= 1 else self.start_blocks.get(session - 1)
        if seed is None:
            return None
        g = self._groups[session] = shard_groups(self.cfg, session, seed)
        return g

    def client_groups(self, shard: int, now: float) -> tuple[list[bytes], list[bytes]]:
        """RempClient.groups: (current, next) validator public keys of `shard` at `now` as
        far as the chain seen so far tells (masterchain: its validators)."""
        if shard == MASTERCHAIN_KEY:
            return list(self.members), []
        n = master_session_at(self.cfg, now)
        while n > 0 and self.groups(n) is None:
            n -= 1
        cur = (self.groups(n) or {}).get(shard, [])
        nxt: list[bytes] = []
        if now >= session_start(self.cfg, n + 1) - 0.2 * self.cfg.mc_catchain_lifetime:
            g = self.groups(n + 1)
            if g is not None:
                nxt = [k for k in g.get(shard, []) if k not in cur]
        return list(cur), nxt

    # -- datagram API -----------------------------------------------------------------------
    def receive_datagram(self, data: bytes, src: bytes, now: float) -> None:
        try:
            kind, sid, body = demux(data)
        except ValueError as exc:
            self._drop(src, str(exc))
            return
        if kind != CH_MASTER or sid != self.master.session_id:
            self._drop(src, f"channel {kind} / session {sid.hex()[:16]} is not the master chain")
            return
        self.master.receive_datagram(body, src, now)
        self._pump()

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, bytes]]:
        out = [(dst, mux(CH_MASTER, self.master.session_id, d)) for dst, d in self.master.datagrams_to_send(now)]
        self._pump()
        return out

    def get_timer(self) -> float | None:
        return self.master.get_timer()

    def handle_timer(self, now: float) -> None:
        self.master.handle_timer(now)
        self._pump()

    def next_event(self):
        return self._events.popleft() if self._events else None

    # -- internals --------------------------------------------------------------------------
    def _drop(self, src: bytes, reason: str) -> None:
        self.dropped[reason.split(":")[0]] += 1
        self._events.append(FollowerDropped(src, reason))

    def _pump(self) -> None:
        while (ev := self.master.next_event()) is not None:
            if isinstance(ev, cons.BlockAccepted):
                try:
                    self._apply(ev)
                except PayloadError as exc:
                    self._drop(b"", f"accepted master block {ev.block_id.seqno} not applicable: {exc}")

    def _execute(self, st, boc: bytes, gen_ms: int) -> None:
        try:
            parsed = self._parsed.pop(boc, None)
            if parsed is None or parsed.workchain not in self.state.workchains:
                parsed = parse_external_message(boc, self.state.workchains)
            else:
                self.stats["parse_reused"] += 1
            st.execute(parsed, gen_ms / 1000.0, committed=True)
        except (MessageRejected, ValueError):
            self.stats["not_executed"] += 1

    def _apply(self, ev) -> None:
        p = decode_master_block(ev.payload)
        shard_blocks, mids = [], []
        for raw in p.shard_commits:
            try:
                c = cons.parse_message(raw)
            except cons.ConsensusWireError as exc:
                raise PayloadError(str(exc)) from None
            cand = c.candidate
            sp = decode_shard_payload(cand.payload)
            g = self.groups(sp.session)
            if g is None or cand.shard not in g:
                raise PayloadError(f"groups of session {sp.session} for shard {cand.shard:016x} unknown")
            try:
                bid = cons.verify_commit(c.session_id, g[cand.shard], c, self.master.sig_memo)
            except cons.ConsensusWireError as exc:
                raise PayloadError(str(exc)) from None
            st = self.state.states[cand.shard]
            for m in sp.messages:
                self._execute(st, m.boc, sp.gen_utime_ms)
                self._finalize(m.message_id, bid, ev.block_id)
                mids.append((m.message_id, cand.shard))
            self.tops[cand.shard] = bid
            shard_blocks.append(bid)
        for m in p.messages:
            self._execute(self.state.masterchain, m.boc, p.gen_utime_ms)
            self._finalize(m.message_id, ev.block_id, ev.block_id)
            mids.append((m.message_id, MASTERCHAIN_KEY))
        if p.session > self.master_tag:
            self.start_blocks.setdefault(p.session, ev.block_id.root_hash)
            self.master_tag = p.session
        self.stats["master_blocks"] += 1
        self.stats["messages"] += len(mids)
        self._events.append(ChainBlockApplied(ev.block_id, p.session, tuple(shard_blocks), tuple(mids)))

    def _finalize(self, mid: bytes, bid: BlockIdExt, mc: BlockIdExt) -> None:
        if mid in self.finalized:
            self.stats["finalized_twice"] += 1      # must stay 0: each message once in the chain
        self.finalized[mid] = (bid, mc)
        while len(self.finalized) > MAX_FINALIZED:
            self.finalized.popitem(last=False)
