"""The main job's REMP segment: a REMP LocalNet (remp_node/testnet/localnet.py) driven with planned faults.

RempSegment (deploy.segments.Segment, name "remp"): configured by the cluster config's
`[remp]` table (keys below), it starts a LocalNet (2 shards x 4 validators by default to fit
a laptop), logs `demo.plan.node` for every node ("v1".., "fullnode1"), submits every real
message of ext_messages.jsonl, every BOC of negative_bocs.jsonl (refused: planned with
plan.expect(..., "rejected", "negative_boc"); an undecodable BOC has no message id and is
counted at the API), generated wallet transfers (some the collator must reject: planned
with plan.expect(..., "rejected", "collator_reject")), kills a validator with SIGKILL
mid-run and restarts it (plan.fault("validator_kill", "v3", duration) first), waits for
final outcomes, and compares its counts with the report's summary.json `remp` table.

`[remp]` keys: enabled (true), shards (2), validators_per_shard (4), fullnodes (2),
masterchain_validators (all), mc_catchain_lifetime (10 s), block_interval (0.2 s), master_block_interval (0.3 s),
wallet_messages (40), collator_rejects (4), kill ("v3"), kill_after (4 s), kill_for (3 s),
deadline (90 s), faults (""), rate (10 messages/s; 0 = all at once).

Full nodes: messages are spread over the `fullnodes` full nodes by remp_node.api.submit.Submitter
(round robin over the HTTP API; a full node that refuses for load, 503 with Retry-After, or
does not answer is skipped and the message goes to the next; outcomes are followed at the
full node that took each message); a message no full node took within the client's bounds
is counted `unplaced`.

Pacing: messages go to the full nodes at `rate` per second on an even schedule (a message the
API refuses, 400 / 422, reaches no validator and takes no slot), not in one burst: in the
demo (three protocol networks, ~30 processes on 2 cores) a burst queued at the validators
and the first-receipt p99 was 2.2-2.6 s against its 1 s objective. The default, 10/s, is
bench/bench_remp_daemon.py's healthy rate (2x7 validators: first receipt p50 93 ms / p99
334 ms, none lost; at 30/s the first receipt p50 was 7.7 s, saturated). Every count compare()
checks is the same at any rate.
"""
from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path

from daemon_runtime.daemons import Daemon
from deploy.segments import Segment
from remp_node.testnet.localnet import LocalNet, load_jsonl

__all__ = ["RempSegment", "DEFAULT_RATE", "DEFAULT_FULLNODES"]


#: [remp] rate default (messages/s): bench/bench_remp_daemon.py's healthy range (module doc)
DEFAULT_RATE = 10.0
#: [remp] fullnodes default: full nodes the messages are spread over (docs/remp-scaling.md)
DEFAULT_FULLNODES = 2


class _Pacer:
    """Submissions at `rate` per second on an even schedule from the first one (0: no
    pacing). wait() sleeps until the next slot; took(http status) uses the slot up unless
    the API refused the message (400 / 413 / 422: it reached no validator)."""

    def __init__(self, rate: float):
        self.rate = rate
        self.start: float | None = None
        self.used = 0

    async def wait(self) -> None:
        if self.rate <= 0:
            return
        now = time.monotonic()
        if self.start is None:
            self.start = now
        at = self.start + self.used / self.rate
        if at > now:
            await asyncio.sleep(at - now)

    def took(self, status: int) -> None:
        if status not in (400, 413, 422):
            self.used += 1


class RempSegment(Segment):
    """The main job's REMP segment (module doc)."""

    name = "remp"

    def __init__(self, cfg: dict, workdir: Path, plan, shared_data: Path | None, blocks: list, **kw):
        super().__init__(cfg, workdir, plan, shared_data, blocks, **kw)
        c = dict(cfg or {})
        self.c = c
        self.dir = Path(workdir) / "remp"
        ext = Path(shared_data) / "ton" / "ext_messages.jsonl" if shared_data else None
        self.ext_path = ext if ext is not None and ext.is_file() else None
        neg = Path(shared_data) / "ton" / "negative_bocs.jsonl" if shared_data else None
        self.neg_path = neg if neg is not None and neg.is_file() else None
        self.local = LocalNet(self.dir, shards=int(c.get("shards", 2)),
                              validators_per_shard=int(c.get("validators_per_shard", 4)),
                              fullnodes=int(c.get("fullnodes", DEFAULT_FULLNODES)),
                              masterchain_validators=c.get("masterchain_validators"),
                              mc_catchain_lifetime=float(c.get("mc_catchain_lifetime", 10.0)),
                              block_interval=float(c.get("block_interval", 0.2)),
                              master_block_interval=float(c.get("master_block_interval", 0.3)),
                              faults=str(c.get("faults", "")), redis_url=c.get("redis_url"),
                              ext_messages=self.ext_path, start_timeout=self.start_timeout, grace=self.grace)
        self.local.logdir = self.logdir           # event logs where the report reads them
        self.counts = {"messages": 0, "accepted": 0, "undecodable": 0, "rejected_by_fullnode": 0,
                       "finalized": 0, "rejected": 0, "timeout": 0, "none": 0, "expected_rejections": 0,
                       "restarts": 0, "unplaced": 0, "refused_for_load": 0}
        self.ids: dict[str, str] = {}          # message id hex -> label
        self.outcomes: dict[str, str] = {}
        self._phase = "init"
        self.sub = None         # remp_node.api.submit.Submitter, made in drive()

    async def start(self) -> None:
        net = await self.local.init()
        await self.local.start()
        from remp_node.core.eventmap import peer_label
        for n in net.nodes:
            self.plan.node(n.label, peer_label(n.key_id), "remp-" + n.role)

    def daemons(self) -> list[Daemon]:
        return list(self.local.daemons.values())

    def progress(self) -> str:
        """One progress line; the outcomes so far are counted live (polled every second
        from the start of sending), the final tally once done."""
        c = dict(self.counts)
        if self._phase != "done":
            for k in ("finalized", "rejected", "timeout"):
                c[k] = sum(1 for o in self.outcomes.values() if o == k)
        return (f"remp {self._phase}: {c['messages']} sent, {c['finalized']} finalized, "
                f"{c['rejected']} rejected, {c['timeout']} timeout")

    async def _post(self, session, boc: bytes) -> tuple[int, dict]:
        """Place one BOC on a full node (remp_node.api.submit); (HTTP status, JSON answer), or
        (0, {}) when no full node took it within the client's bounds."""
        from remp_node.api.submit import Placed
        res = await self.sub.submit(boc)
        if isinstance(res, Placed):
            return res.status, res.doc
        self.counts["unplaced"] += 1
        return 0, {}

    def _messages(self) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]], list[tuple[str, bytes]]]:
        from remp_node.wire.keys import NodeKey
        from remp_node.core.state import make_wallet_message
        real = []
        if self.ext_path:
            for i, row in enumerate(load_jsonl(self.ext_path)):
                real.append((f"real{i}", base64.b64decode(row["boc_base64"])))
        neg = []
        if self.neg_path:
            for i, row in enumerate(load_jsonl(self.neg_path)):
                try:
                    boc = base64.b64decode(row["boc_base64"])
                except (ValueError, KeyError):
                    boc = row.get("boc_base64", "").encode()
                neg.append((f"neg{i}:{row.get('kind', '')}", boc))
        wallets = [w for w in self.local.net.wallets() if w["workchain"] == 0]
        mc = [w for w in self.local.net.wallets() if w["workchain"] == -1]
        gen = []
        t = int(time.time()) + 3600
        n = int(self.c.get("wallet_messages", 40))
        races = int(self.c.get("collator_rejects", 4))
        # the race pairs' wallets take no part in the other transfers: a credit to one (a
        # generated transfer) could cover the second message of its pair when a restarted
        # validator takes it up again, and the pair's spend would then fail the next
        # transfer from that wallet at the full node (seen in 1 of 10 demo runs)
        plain = wallets[:-races] if 0 < races < len(wallets) - 1 else wallets
        for i in range(n):
            w = plain[i % len(plain)]
            k = NodeKey.from_seed(bytes.fromhex(w["seed"]))
            dest = plain[(i + 1) % len(plain)]["address"]
            gen.append((f"gen{i}", make_wallet_message(k, w["address"], dest, 1000 + i, t, nonce=i)))
        for i, w in enumerate(mc):
            k = NodeKey.from_seed(bytes.fromhex(w["seed"]))
            gen.append((f"mc{i}", make_wallet_message(k, w["address"], w["address"], 10, t, nonce=i)))
        # pairs whose sum exceeds the balance: the collator takes one and rejects the other
        bad = []
        for i in range(races):
            w = wallets[-1 - (i % len(wallets))]
            k = NodeKey.from_seed(bytes.fromhex(w["seed"]))
            half = w["balance"] // 2 + 1
            bad.append((f"race{i}a", make_wallet_message(k, w["address"], wallets[0]["address"], half, t,
                                                         nonce=10_000 + 2 * i)))
            bad.append((f"race{i}b", make_wallet_message(k, w["address"], wallets[0]["address"], half, t,
                                                         nonce=10_001 + 2 * i)))
        return real + gen, neg, bad

    async def drive(self) -> None:
        import aiohttp
        good, neg, races = self._messages()
        kill = str(self.c.get("kill", "v3"))
        kill_after = float(self.c.get("kill_after", 4.0))
        kill_for = float(self.c.get("kill_for", 3.0))
        deadline = time.monotonic() + float(self.c.get("deadline", 90.0))
        rate = float(self.c.get("rate", DEFAULT_RATE))
        if rate < 0:
            raise ValueError(f"[remp] rate must be >= 0 messages/s, got {rate}")
        pace = _Pacer(rate)
        self._phase = "sending"
        from remp_node.api.submit import Submitter
        async with aiohttp.ClientSession() as s:
            self.sub = Submitter(self.local.apis, s)
            killer = asyncio.ensure_future(self._kill_restart(kill, kill_after, kill_for))

            async def poll_while_sending() -> None:
                """Outcomes for the progress line while sending (it said 0 finalized until
                the end before); a full node that does not answer is asked again later."""
                while True:
                    await asyncio.sleep(1.0)
                    try:
                        await self._poll(s)
                    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                        pass

            async def send(label: str, boc: bytes) -> tuple[int, dict]:
                """POST one BOC at the paced rate; a message id the full node gives is kept."""
                await pace.wait()
                status, doc = await self._post(s, boc)
                pace.took(status)
                self.counts["messages"] += 1
                if "message_id" in doc:
                    self.ids[doc["message_id"]] = label
                return status, doc

            poller = asyncio.ensure_future(poll_while_sending())
            try:
                for label, boc in neg:
                    status, doc = await send(label, boc)
                    if status == 400:
                        self.counts["undecodable"] += 1       # no message id exists for it
                    elif "message_id" in doc:
                        if status == 422:
                            self.counts["rejected_by_fullnode"] += 1
                        self.plan.expect(doc["message_id"], "rejected", "negative_boc")
                race_ids = []
                for label, boc in races:
                    _, doc = await send(label, boc)
                    if "message_id" in doc:
                        race_ids.append(doc["message_id"])
                # one of each pair is planned to be rejected by the collator; which one is decided
                # by the collator's order (a fresh-clone demo saw the first of a pair rejected), so
                # both messages of a pair are announced; one rejection is expected per pair
                for mid in race_ids:
                    self.plan.expect(mid, "rejected", "collator_reject")
                self.counts["expected_rejections"] += len(race_ids) // 2
                for label, boc in good:
                    await send(label, boc)
            finally:
                poller.cancel()
                await asyncio.gather(poller, return_exceptions=True)
            self._phase = "waiting"
            while time.monotonic() < deadline:
                await self._poll(s)
                if len(self.outcomes) >= len(self.ids) and killer.done():
                    break
                await asyncio.sleep(1.0)
            await killer
        rep = self.sub.report()
        self.counts["refused_for_load"] = sum(sum(n["refused"].values()) for n in rep["nodes"].values())
        for mid in self.ids:
            self.outcomes.setdefault(mid, "none")
        for k in ("finalized", "rejected", "timeout", "none"):
            self.counts[k] = sum(1 for o in self.outcomes.values() if o == k)
        self._phase = "done"

    async def _kill_restart(self, label: str, after: float, duration: float) -> None:
        if label not in self.local.daemons:
            return
        await asyncio.sleep(after)
        self.plan.fault("validator_kill", label, duration)
        self.local.kill(label)
        await asyncio.sleep(duration)
        await self.local.restart(label)
        self.counts["restarts"] += 1
        self.plan.recovered("validator_kill", label)

    async def _poll(self, s) -> None:
        """Outcomes of the messages placed so far, each asked of the full node that took it
        (Submitter.outcome; a full node that does not answer is asked again later)."""
        for mid in [m for m in self.ids if m not in self.outcomes and m in self.sub.where]:
            out = await self.sub.outcome(mid)
            if out is not None:
                self.outcomes[mid] = out["outcome"]

    async def stop(self) -> None:
        await self.local.stop()

    def counters(self) -> dict:
        return dict(self.counts)

    def compare(self, summary: dict) -> list[tuple[str, object, object, bool]]:
        rep = (summary or {}).get("remp") or {}
        outs = rep.get("outcomes") or {}
        mine = {"messages": len(self.ids), "finalized": self.counts["finalized"],
                "rejected": self.counts["rejected"], "timeout": self.counts["timeout"], "none": self.counts["none"]}
        theirs = {"messages": rep.get("messages"), "finalized": outs.get("finalized"),
                  "rejected": outs.get("rejected"), "timeout": outs.get("timeout"), "none": outs.get("none")}
        return [(f"remp.{k}", mine[k], theirs[k], mine[k] == theirs[k]) for k in mine]
