"""A whole REMP network in memory: validators, a masterchain, one full node, a fake clock.

Simulation builds a zerostate (schedule.ZeroStateConfig + state.ZeroState), one
validator.ValidatorCore per validator, one client.RempClient (the full node), and drives all
cores over network.SimNetwork (seeded loss, duplication, reordering, crashes, targeted
drops). Simulated time is free: the loop jumps to the next due datagram or timer.

With `event_log=factory` (factory(service, node) -> daemon_runtime EventLog) the run also
writes real event logs through eventmap.py: one log per validator (service remp-validator),
one for the full node (remp-fullnode) and one for the masterchain as seen by the first live
validator (remp-masterchain); node = key id hex prefix (8 digits), trace_id = message id
hex. Line timestamps are the real clock (EventLog's), not the simulated one.

It collects every receipt the full node receives (validators' datagrams, before the client
core filters anything) and every receipt the full node produces itself, as the seed's JSON
(receipts.to_json), plus the validators' blame, block and final-status events.

Source: DESIGN.md sections 2 and 4; the issue's must-show scenarios (tests/test_remp_sim.py).
"""
from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable

from ..core.client import FinalStatus, ReceiptEvent, RempClient
from ..core.eventmap import (SERVICE_FULLNODE, SERVICE_MASTERCHAIN, SERVICE_VALIDATOR, client_records,
                       emit_records, fullnode_dropped_record, peer_label, validator_records)
from ..wire.keys import NodeKey
from ..wire.shards import shard_prefixes
from .network import SimNetwork
from ..wire.receipts import ReceiptError, SignedReceipt, to_json
from ..core.schedule import ValidatorInfo, ZeroStateConfig
from ..core.state import ZeroState, build_zero_state
from ..core.validator import ForkBlamed, MasterBlockAccepted, ReceiptSent, ValidatorCore, ValidatorJournal
from ..wire.node_tl import CH_CLIENT, CHANNEL_NAMES, ZERO32, demux, mux
from ..wire.packets import WireError, decode_datagram

__all__ = ["Simulation", "SimConfig", "classify_datagram"]

#: default fake clock origin: a Unix time (the wallet executor compares valid_until with it)
DEFAULT_T0 = 1_700_000_000.0


def classify_datagram(data: bytes) -> str:
    """Channel name of a muxed datagram ("client", "rmq", "shard", "master", "announce")."""
    return CHANNEL_NAMES.get(data[0], "other") if data else "other"


def default_catchain_factory(session_id, members, local, block_interval=0.05):
    from ..core.catchain import Catchain
    return Catchain(session_id, members, local, block_interval=block_interval, sync_interval=0.5)


@dataclass
class SimConfig:
    """Simulation parameters (seconds unless stated).

    validators: total validators; shard_count: shards of workchain 0; group_size: validators
    per shard group; masterchain_validators: "all" or a count (the first k validators);
    mc_catchain_lifetime, block_interval: zerostate config; latency + uniform(0, jitter):
    datagram delay (jitter 0 keeps every link FIFO); loss/duplicate/reorder: per-datagram
    probabilities; seed: randomness of keys and network; journal: keep each validator's
    ValidatorJournal in memory (journal_updates after every flush) so restart(i) works.
    part_payload: bytes per transport part (0 = whole datagrams; 1,154 = transport.py's
    fragmentation, where loss applies to every part: network.SimNetwork). master_commit_bytes:
    ValidatorCore's cap on the shard commit bytes of one master block (None: its default)."""

    validators: int = 14
    shard_count: int = 2
    group_size: int = 7
    masterchain_validators: str | int = "all"
    mc_catchain_lifetime: float = 30.0
    block_interval: float = 0.1
    master_block_interval: float = 0.3
    rmq_block_interval: float = 0.05
    shard_round_timeout: float = 0.6
    master_round_timeout: float = 1.0
    resend_interval: float = 2.0
    latency: float = 0.005
    jitter: float = 0.005
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    seed: int = 0
    t0: float = DEFAULT_T0
    tick: float = 0.005
    catchain_factory: Callable | None = None
    journal: bool = False
    part_payload: int = 0
    master_commit_bytes: int | None = None


class Simulation:
    """Simulation(SimConfig, wallets=[(public_key, balance)], open_accounts=['0:hex', ...],
    masterchain_wallets=[(public_key, balance)] (wallets of workchain -1)).

    submit(boc) hands a message to the full node now; run(seconds) / run_until(pred,
    max_seconds) advance the fake clock. crash(i), fork_rmq(i, ...) inject faults.
    Results: receipts (list of JSON dicts, in arrival order), finals (message id ->
    [FinalStatus]), blames (validator index -> set of blamed key ids), committed (message id
    -> [(master block id, shard block id)] in the masterchain of the first live validator)."""

    def __init__(self, cfg: SimConfig, *, wallets: Iterable[tuple[bytes, int]] = (),
                 open_accounts: Iterable[str] = (), event_log: Callable[[str, str], object] | None = None,
                 masterchain_wallets: Iterable[tuple[bytes, int]] = ()):
        self.cfg = cfg
        self._log_factory = event_log
        self.logs: dict[tuple[str, str], object] = {}    # (service, node) -> EventLog
        self.now = cfg.t0
        self.keys = [NodeKey.from_seed(hashlib.sha256(f"remp-sim:{cfg.seed}:{i}".encode()).digest())
                     for i in range(cfg.validators)]
        mcv = ("all" if cfg.masterchain_validators == "all"
               else [k.public for k in self.keys[:int(cfg.masterchain_validators)]])
        self.config = ZeroStateConfig(
            workchain=0, shards=shard_prefixes(cfg.shard_count),
            validators=[ValidatorInfo(k.public, f"127.0.0.1:{30000 + i}") for i, k in enumerate(self.keys)],
            shard_group_size=cfg.group_size, masterchain_validators=mcv,
            mc_catchain_lifetime=cfg.mc_catchain_lifetime, block_interval=cfg.block_interval,
            genesis_time=cfg.t0)
        self.zerostate: ZeroState = build_zero_state(0, cfg.shard_count, wallets, open_accounts,
                                                     masterchain_wallets=masterchain_wallets)
        self.net = SimNetwork(cfg.seed, loss=cfg.loss, duplicate=cfg.duplicate, reorder=cfg.reorder,
                              latency=cfg.latency, jitter=cfg.jitter, classify=classify_datagram,
                              part_payload=cfg.part_payload)
        self.fullnode_key = NodeKey.from_seed(hashlib.sha256(f"remp-sim-fullnode:{cfg.seed}".encode()).digest())
        self.journals: dict[int, ValidatorJournal] = {i: ValidatorJournal() for i in range(cfg.validators)}
        self.validators = [self._make_validator(k, ValidatorJournal() if cfg.journal else None) for k in self.keys]
        self.by_id = {v.key.key_id: v for v in self.validators}
        self.index = {v.key.key_id: i for i, v in enumerate(self.validators)}
        self.all_validator_keys = [k.public for k in self.keys]
        self.client = RempClient(self.fullnode_key, self.zerostate.copy(), self._client_groups,
                                 resend_interval=cfg.resend_interval,
                                 extra_keys=lambda: self.all_validator_keys)
        self.fullnode_id = self.fullnode_key.key_id
        self.crashed: set[int] = set()
        self.receipts: list[dict] = []
        self._receipt_seen: set[bytes] = set()
        self.client_events: list = []
        self.finals: dict[bytes, list[FinalStatus]] = defaultdict(list)
        self.blames: dict[int, set[bytes]] = defaultdict(set)
        self.validator_events: dict[int, list] = defaultdict(list)
        self.committed: dict[bytes, list] = defaultdict(list)
        self.bad_receipts: list[str] = []
        self.extra_nodes: list[tuple[bytes, object, Callable]] = []   # (src key id, core, wrap)
        self.submitted: list[bytes] = []
        self._dirty: set = set(range(len(self.validators))) | {"client"}

    def _make_validator(self, k: NodeKey, journal: ValidatorJournal | None = None) -> ValidatorCore:
        cfg = self.cfg
        return ValidatorCore(k, self.config, self.zerostate, catchain_factory=cfg.catchain_factory or default_catchain_factory,
                             full_nodes={self.fullnode_key.key_id: self.fullnode_key.public},
                             rmq_block_interval=cfg.rmq_block_interval,
                             shard_round_timeout=cfg.shard_round_timeout,
                             master_round_timeout=cfg.master_round_timeout,
                             master_block_interval=cfg.master_block_interval, journal=journal,
                             **({} if cfg.master_commit_bytes is None else
                                {"master_commit_bytes": cfg.master_commit_bytes}))

    def restart(self, i: int) -> ValidatorCore:
        """Validator i (crashed) comes back: a NEW core with the same key, built from its
        journal only (needs SimConfig.journal), as a daemon restarted with its data dir."""
        import copy
        if not self.cfg.journal:
            raise RuntimeError("restart needs SimConfig(journal=True)")
        old = self.validators[i]
        v = self._make_validator(old.key, copy.deepcopy(self.journals[i]))
        self.validators[i] = v
        self.by_id[v.key.key_id] = v
        self.crashed.discard(i)
        self.net.crashed.discard(v.key.key_id)
        self._dirty.add(i)
        return v

    # -- the full node --------------------------------------------------------------------------
    def _view(self) -> ValidatorCore:
        for i, v in enumerate(self.validators):
            if i not in self.crashed:
                return v
        raise RuntimeError("every validator crashed")

    def _client_groups(self, shard: int, now: float):
        return self._view().client_groups(shard, now)

    def submit(self, boc: bytes) -> bytes:
        mid = self.client.submit(boc, self.now)
        self.submitted.append(mid)
        self._dirty.add("client")
        self._drain_client()
        return mid

    def _record_receipt(self, signed: SignedReceipt) -> None:
        raw = signed.serialize()
        if raw in self._receipt_seen:
            return
        self._receipt_seen.add(raw)
        try:
            self.receipts.append(to_json(signed.open(), signed.signature))
        except ReceiptError as exc:
            self.bad_receipts.append(str(exc))

    # -- event logs -----------------------------------------------------------------------------
    def _log(self, service: str, key_id: bytes, records) -> None:
        if self._log_factory is None or not records:
            return
        node = peer_label(key_id)
        log = self.logs.get((service, node))
        if log is None:
            log = self.logs[(service, node)] = self._log_factory(service, node)
        emit_records(log, records)

    def close_logs(self) -> None:
        """Flush and close every event log the factory opened."""
        for log in self.logs.values():
            log.close()

    def _drain_client(self) -> None:
        while (ev := self.client.next_event()) is not None:
            self.client_events.append(ev)
            if self._log_factory is not None:
                self._log(SERVICE_FULLNODE, self.fullnode_id, client_records(ev))
            if isinstance(ev, ReceiptEvent) and ev.origin == "fullnode":
                self._record_receipt(ev.signed())
            elif isinstance(ev, FinalStatus):
                self.finals[ev.message_id].append(ev)

    # -- faults -------------------------------------------------------------------------------------
    def crash(self, i: int) -> None:
        """Validator i stops: nothing is delivered to or from it any more."""
        self.crashed.add(i)
        self.net.crashed.add(self.validators[i].key.key_id)

    def add_extra_sender(self, src_key_id: bytes, core, wrap: Callable[[bytes], bytes]) -> None:
        """Drive one more core that sends as `src_key_id` (e.g. a Byzantine twin); its
        datagrams are wrapped with `wrap` before they hit the network; it receives nothing."""
        self.extra_nodes.append((src_key_id, core, wrap))

    # -- the loop ----------------------------------------------------------------------------------------
    def _flush(self) -> None:
        now = self.now
        for i in sorted(k for k in self._dirty if k != "client"):
            if i in self.crashed:
                continue
            v = self.validators[i]
            src = v.key.key_id
            out = v.datagrams_to_send(now)
            if self.cfg.journal:        # durable before anything that depends on it is sent
                self.journals[i].apply(v.journal_updates())
            for dst, data in out:
                self.net.send(src, dst, data, now)
            while (ev := v.next_event()) is not None:
                self._on_validator_event(i, ev)
        if "client" in self._dirty:
            for dst, data in self.client.datagrams_to_send(now):
                self.net.send(self.fullnode_id, dst, mux(CH_CLIENT, ZERO32, data), now)
            self._drain_client()
        for src, core, wrap in self.extra_nodes:
            for dst, data in core.datagrams_to_send(now):
                self.net.send(src, dst, wrap(data), now)
        self._dirty.clear()

    def _on_validator_event(self, i: int, ev) -> None:
        if self._log_factory is not None:
            kid = self.validators[i].key.key_id
            if isinstance(ev, MasterBlockAccepted):
                if self.validators[i] is self._view():
                    self._log(SERVICE_MASTERCHAIN, kid, validator_records(ev))
            else:
                self._log(SERVICE_VALIDATOR, kid, validator_records(ev))
        if isinstance(ev, ForkBlamed):
            self.blames[i].add(ev.source)
        elif isinstance(ev, MasterBlockAccepted):
            if self.validators[i] is self._view():
                for mid in ev.messages:
                    self.committed[mid].append(ev.block_id)
        if not isinstance(ev, ReceiptSent):
            self.validator_events[i].append(ev)

    def _deliver_to_fullnode(self, src: bytes, data: bytes) -> None:
        try:
            kind, _, body = demux(data)
            if kind != CH_CLIENT:
                raise ValueError(f"channel {kind} at the full node")
            dg = decode_datagram(body)
            if isinstance(dg, SignedReceipt):
                self._record_receipt(dg)
            self.client.receive_datagram(body, src, self.now)
        except (ValueError, WireError, ReceiptError) as exc:
            self.bad_receipts.append(f"{type(exc).__name__}: {exc}")
            if self._log_factory is not None:
                self._log(SERVICE_FULLNODE, self.fullnode_id, [fullnode_dropped_record(src, str(exc), len(data))])
        self._dirty.add("client")

    def _next_time(self) -> float:
        ts = []
        t = self.net.next_delivery()
        if t is not None:
            ts.append(t)
        for i, v in enumerate(self.validators):
            if i not in self.crashed:
                t = v.get_timer()
                if t is not None:
                    ts.append(t)
        t = self.client.get_timer()
        if t is not None:
            ts.append(t)
        for _, core, _ in self.extra_nodes:
            t = core.get_timer()
            if t is not None:
                ts.append(t)
        return min(ts) if ts else self.now + 1.0

    def step(self) -> None:
        nxt = max(self._next_time(), self.now + self.cfg.tick)
        self.now = nxt
        for dst, src, data in self.net.deliver_due(self.now):
            if dst == self.fullnode_id:
                self._deliver_to_fullnode(src, data)
                continue
            v = self.by_id.get(dst)
            if v is None:
                continue
            i = self.index[dst]
            v.receive_datagram(data, src, self.now)
            self._dirty.add(i)
        for i, v in enumerate(self.validators):
            if i in self.crashed:
                continue
            t = v.get_timer()
            if t is not None and t <= self.now:
                v.handle_timer(self.now)
                self._dirty.add(i)
        t = self.client.get_timer()
        if t is not None and t <= self.now:
            self.client.handle_timer(self.now)
            self._dirty.add("client")
        for _, core, _ in self.extra_nodes:
            t = core.get_timer()
            if t is not None and t <= self.now:
                core.handle_timer(self.now)
        self._flush()

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            self.step()

    def run_until(self, pred: Callable[[], bool], max_seconds: float, check_every: float = 0.25) -> bool:
        """Run until pred() is true (checked every `check_every` simulated seconds) or
        `max_seconds` passed. Returns pred()."""
        end = self.now + max_seconds
        next_check = self.now
        while self.now < end:
            if self.now >= next_check:
                if pred():
                    return True
                next_check = self.now + check_every
            self.step()
        return pred()

    # -- results ------------------------------------------------------------------------------------------
    def receipts_for(self, mid: bytes) -> list[dict]:
        h = mid.hex()
        return [r for r in self.receipts if r["message_id"] == h]

    def final_outcome(self, mid: bytes) -> str | None:
        f = self.finals.get(mid)
        return f[0].outcome if f else None
