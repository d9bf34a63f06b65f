"""The stage model of the trace report: data, not code (DESIGN.md section 6).

Three tables per protocol drive the whole job (spark/report.py) and the DuckDB baseline
(bench/bench_spark_report.py):

STEP_RULES   catalogued event (+ SQL condition) -> named step of a trace, with the branch it
             belongs to (RMB: the responder twin, so a multi-destination request has one branch
             per destination; Marlin: the consumer node; REMP: one branch) and a `detail`
             (error code, reason, TTL). One event may match several rules (e.g. a REMP
             Finalized status is both `fullnode.Finalized` and `finalized`). `branch=None` marks
             a root step shared by every branch; a branch expression that yields NULL means
             "infer": the step goes to the trace's only branch, or to `?` when there are several.
STAGES       edges between steps: duration = ts(to) - ts(from) of the first occurrence of each
             step in the branch. `e2e` marks the end-to-end stages; `clock` marks edges that are
             a causal pair between the two logged events (the `from` event happens-before the
             `to` event in real time), usable to prove clock skew (spark/clock.py).
OUTCOMES     which steps make a (trace, branch) sent / delivered / answered / expired / errored,
             where the TTL comes from, for the delivery table and the SLA.

SQL expressions run in Spark SQL and DuckDB alike, over one event row with columns
`ts_us, level, service, node, event, trace_id, attrs.<name>`, the helper columns of DERIVED
(computed first; e.g. `dst_twin`, `src_twin`: the twin id part of `12:sid`, NULL for the
relay's own twin 0) and the trace facts of a protocol's `facts` (first non-null value of
the expression over the trace).

RMB (seed: rmb.md; DESIGN.md section 3): app requested -> peer sent -> relay received ->
[federation_received (remote relay)] -> relay delivered -> peer received -> peer delivered ->
app handled -> and back for the response, which shares the request's envelope uid. Note:
`rmb.relay.federated` is logged when the remote relay answered 202, i.e. after the remote
`federation_received`, so the model has `relay.received -> relay.fed_received` (the
federation hop) and `relay.fed_received -> relay.federated` (the 202 coming back), not
`federated -> federation_received`. `rmb.relay.forwarded` (the live local route: received
and written to the destination's connection in one loop pass, one event on the hot path) is
both `relay.received` and `relay.delivered` of its leg, at the same ts. Relay events without
`kind` (`federated`; `delivered`, `queued` and `expired` in logs from before they carried
`kind` and `src`) get their leg from the trace facts: an envelope whose `dst` is the
requester twin is a response; a response's branch is its `src` (the responder) when logged,
else inferred; `federated` logged by the relay that received the request from
its peer belongs to the request leg. The round trip ends at `app.answer`: a reply that is
not the peer's own expiry notice. Reply codes (`rmb.app.replied` / `rmb.peer.answered`): null or 0 = answer,
102 = expired (rmb-peer error codes), anything else = error. rmb_peer/client.py logs the app
events under the app's own `ref`, not the envelope uid: such a trace holds only
app.requested -> app.replied (the round trip, the app's view); delivery is counted on the
envelope traces (`sent` = peer sent / relay received the request), so a request is not
counted twice.

REMP (seeds: remp-protocol-b.txt): fullnode received -> sent (first rempMessage to a validator)
-> statuses by kind (every kind is a step `fullnode.<kind>` / `validator.<kind>`, the first
occurrence over all validators) -> Finalized; `remp.fullnode.final` (the full node's verdict,
`final.<outcome>`) also makes a message finalized / rejected / timed out.
Time to first receipt = received -> the first status the full node got from a validator
(any kind except its own SentToValidators / RejectedByFullnode).

Marlin (seed: marlin-data.txt): chunk sent (first chunk of the message) -> witnessed ->
acknowledged; per consumer: chunk received -> block rebuilt.
"""
from __future__ import annotations

from dataclasses import dataclass, field


def tw(expr: str, engine: str = "spark") -> str:
    """SQL: twin id part of a `twin[:sid]` string (Spark: substring_index, DuckDB: split_part;
    both far cheaper than a regular expression)."""
    if engine == "duckdb":
        return f"split_part({expr}, ':', 1)"
    return f"substring_index({expr}, ':', 1)"


@dataclass(frozen=True)
class StepRule:
    """event -> step. step: literal name; step_sql: SQL string expression instead (dynamic
    names such as REMP kinds); when: SQL boolean; branch: SQL string or None (root);
    detail: SQL string (error code, reason, ttl) or None; hop: False for an alias step (a
    second name for an event already listed as a hop, e.g. `finalized`), kept out of the
    hops table."""

    event: str
    step: str = ""
    when: str = "true"
    branch: str | None = None
    detail: str | None = None
    step_sql: str | None = None
    hop: bool = True


@dataclass(frozen=True)
class Stage:
    """A measured edge: duration_ms = ts(to_step) - ts(from_step) within one branch."""

    name: str
    from_step: str
    to_step: str
    e2e: bool = False
    clock: bool = True


@dataclass(frozen=True)
class Outcomes:
    """Delivery classification of one (trace, branch), decided ONCE by rule (DESIGN.md section 6).
    Only rows with a `sent` step are in the delivery table.

    The deciding events are `answered` (a reply without error reached the app), `errored`
    (an error reply reached the app; its `detail` is the code) and `expired` (the peer's own
    expiry notice, code 102, or a Timeout). The first of them (by ts) decides, and with
    `deadline=True` only when it came before the deadline = ts(first `deadline_from` step) +
    TTL; otherwise the outcome is `expired`. A reply after the deadline, and any `late` step
    (rmb-peer's 102 "reply for a request that already completed or expired"), count as a
    late reply and do not change the outcome. When none of the deciding events is logged,
    `fallback_errored` / `fallback_expired` steps decide (e.g. the relay dropped the
    envelope); with none of those either: older than the TTL at the end of the logs =
    lost_or_stuck, else in_flight. ttl_step: step whose `detail` is the TTL in seconds
    (else default_ttl_s)."""

    start: tuple[str, ...]
    sent: tuple[str, ...]
    delivered: tuple[str, ...]
    answered: tuple[str, ...]
    expired: tuple[str, ...]
    errored: tuple[str, ...]
    default_ttl_s: float
    ttl_step: str | None = None
    fallback_errored: tuple[str, ...] = ()
    fallback_expired: tuple[str, ...] = ()
    late: tuple[str, ...] = ()
    deadline: bool = False
    deadline_from: tuple[str, ...] = ()

    def steps(self) -> tuple[str, ...]:
        """Every step the rule reads."""
        return (self.start + self.sent + self.delivered + self.answered + self.expired
                + self.errored + self.fallback_errored + self.fallback_expired + self.late
                + self.deadline_from + ((self.ttl_step,) if self.ttl_step else ()))


def timed_out_sql(log_end_us, start: str, ttl: str) -> str:
    """SQL boolean: a row undecided at `log_end_us` (us, or SQL of it: the latest event
    time read, the watermark) whose life began at `start` (us) is past its ttl (`ttl`,
    seconds): it is `lost_or_stuck`, not `in_flight`. NULL when log_end_us is NULL."""
    return f"({log_end_us} - {start} > ({ttl}) * 1000000)"


def outcome_sql(o: Outcomes, ts, detail, ttl_default: float, log_end_us: int,
                t0: str = "t0") -> dict[str, str]:
    """SQL (Spark and DuckDB alike) of the outcome columns of one (trace, branch) row.
    ts(step) / detail(step): SQL of the first ts (us) / detail of that step in the row, NULL
    when absent. Returns sent, delivered, answered, errored, expired, late (booleans),
    outcome, error_code, start_us, deadline_us, end_us, ttl_s. end_us: when the outcome was
    decided (the first answered / errored / expired step), else the deadline: the end of the
    row's life that a planned fault's window is matched against (spark/plan.py)."""
    def least(steps):
        if not steps:
            return "CAST(NULL AS BIGINT)"
        if len(steps) == 1:
            return ts(steps[0])
        return "least(" + ", ".join(ts(s) for s in steps) + ")"

    def has(steps):
        return "(" + " OR ".join(f"{ts(s)} IS NOT NULL" for s in steps) + ")" if steps else "false"

    start = "coalesce(" + ", ".join([ts(s) for s in o.start] + [t0]) + ")"
    ttl = f"CAST({float(ttl_default)} AS DOUBLE)"
    if o.ttl_step:
        ttl = f"coalesce(TRY_CAST({detail(o.ttl_step)} AS DOUBLE), {ttl})"
    dstart = "coalesce(" + ", ".join([ts(s) for s in o.deadline_from] + [start]) + ")"
    deadline = f"({dstart} + CAST(({ttl}) * 1000000 AS BIGINT))"
    ok, err, exp = least(o.answered), least(o.errored), least(o.expired)
    first = f"least({ok}, {err}, {exp})"
    def in_time(x):
        return f"{x} <= {deadline}"
    if o.deadline:
        decided = (
            f"CASE WHEN {ok} IS NOT NULL AND {ok} = {first} AND {in_time(ok)} THEN 'answered' "
            f"WHEN {err} IS NOT NULL AND {err} = {first} AND {in_time(err)} THEN 'errored' "
            f"WHEN {first} IS NOT NULL THEN 'expired' ")
    else:   # no deadline: precedence answered > errored > expired (e.g. REMP: one
        # validator's reject does not undo the message's Finalized)
        decided = (f"CASE WHEN {has(o.answered)} THEN 'answered' "
                   f"WHEN {has(o.errored)} THEN 'errored' WHEN {has(o.expired)} THEN 'expired' ")
    outcome = (
        decided +
        f"WHEN {has(o.fallback_errored)} THEN 'errored' "
        f"WHEN {has(o.fallback_expired)} THEN 'expired' "
        f"WHEN {timed_out_sql(log_end_us, start, ttl)} THEN 'lost_or_stuck' "
        f"ELSE 'in_flight' END")
    codes = [detail(s) for s in o.errored]
    fb = [detail(s) for s in o.fallback_errored]
    code = ("coalesce(" + ", ".join(
        [f"CASE WHEN {ts(s)} = {err} THEN {detail(s)} END" for s in o.errored if o.deadline]
        + codes + fb + ["'unknown'"]) + ")")
    replies = [s for s in o.answered + o.errored]
    late_reply = (" OR ".join(f"coalesce({ts(s)} > {deadline}, false)" for s in replies)
                  if o.deadline and replies else "false")
    late = f"({has(o.late)} OR {late_reply})"
    return {"sent": has(o.sent), "delivered": has(o.delivered), "outcome": outcome,
            "error_code": code, "late": late, "start_us": start,
            "deadline_us": deadline, "end_us": f"coalesce({first}, {deadline})", "ttl_s": ttl}


@dataclass(frozen=True)
class Protocol:
    name: str
    rules: tuple[StepRule, ...]
    stages: tuple[Stage, ...]
    outcomes: Outcomes
    facts: dict[str, str] = field(default_factory=dict)

    def root_steps(self) -> set[str]:
        return {r.step for r in self.rules if r.branch is None and r.step}

    def step_names(self) -> set[str]:
        return {r.step for r in self.rules if r.step}


R = StepRule
S = Stage

def derived(engine: str = "spark") -> dict[str, str]:
    """Per-event helper columns (SQL over the event row), computed once before the rules."""
    src = tw("attrs.src", engine)
    return {
        "twin": tw("node", engine),
        "dst_twin": tw("attrs.dst", engine),
        "src_twin": f"CASE WHEN {src} IN ('', '0') THEN NULL ELSE {src} END",
        "is_req": "coalesce(attrs.kind = 'request', false)",
        "code_s": "CAST(attrs.code AS STRING)",
    }


DERIVED = derived()

_REQ = "is_req"
_RESP = "NOT is_req"
# leg of relay events: by `kind` when logged (delivered, queued, expired since
# rmb.relay.forwarded came in), else by dst: an envelope to the requester is a response
_LEG_RESP = ("CASE WHEN attrs.kind IS NOT NULL THEN NOT is_req "
             "ELSE coalesce(dst_twin = requester, false) END")
_LEG_REQ = f"NOT {_LEG_RESP}"
# `federated` carries neither kind nor dst: the relay that got the request from its peer
_FED_REQ = "coalesce(node = origin_relay, false)"
_FED_RESP = f"NOT {_FED_REQ}"
_SRC_TWIN = "src_twin"
_CODE = "code_s"

RMB = Protocol(
    name="rmb",
    facts={
        # the requester twin: who asked (app or its peer, or the request's src at the relay)
        "requester": (
            f"CASE WHEN event = 'rmb.app.requested' THEN twin "
            f"WHEN event = 'rmb.peer.sent' AND {_REQ} THEN twin "
            f"WHEN event IN ('rmb.relay.received', 'rmb.relay.federation_received', "
            f"'rmb.relay.forwarded') AND {_REQ} THEN src_twin END"),
        # the relay the requester's peer is connected to
        "origin_relay": (f"CASE WHEN event IN ('rmb.relay.received', 'rmb.relay.forwarded') "
                         f"AND {_REQ} THEN node END"),
    },
    rules=(
        R("rmb.app.requested", "app.requested", detail="CAST(attrs.ttl AS STRING)"),
        R("rmb.peer.sent", "peer.sent.req", _REQ, "dst_twin"),
        R("rmb.relay.received", "relay.received.req", _REQ, "dst_twin"),
        R("rmb.relay.federation_received", "relay.fed_received.req", _REQ, "dst_twin"),
        R("rmb.relay.federated", "relay.federated.req", _FED_REQ, "NULL"),
        R("rmb.relay.queued", "relay.queued.req", _LEG_REQ, "dst_twin"),
        R("rmb.relay.delivered", "relay.delivered.req", _LEG_REQ, "dst_twin"),
        R("rmb.relay.forwarded", "relay.received.req", _REQ, "dst_twin"),
        R("rmb.relay.forwarded", "relay.delivered.req", _REQ, "dst_twin"),
        R("rmb.relay.expired", "relay.expired", _LEG_REQ, "dst_twin", "attrs.reason"),
        R("rmb.relay.rejected", "relay.rejected", "true", "dst_twin", "attrs.reason"),
        R("rmb.peer.received", "peer.received.req", _REQ, "twin"),
        R("rmb.peer.delivered", "peer.delivered", "true", "twin"),
        R("rmb.app.handled", "app.handled", "true", "twin", _CODE),
        R("rmb.peer.sent", "peer.sent.resp", _RESP, "twin"),
        R("rmb.relay.received", "relay.received.resp", _RESP, _SRC_TWIN),
        R("rmb.relay.federation_received", "relay.fed_received.resp", _RESP, _SRC_TWIN),
        R("rmb.relay.federated", "relay.federated.resp", _FED_RESP, "NULL"),
        R("rmb.relay.queued", "relay.queued.resp", _LEG_RESP, _SRC_TWIN),
        R("rmb.relay.delivered", "relay.delivered.resp", _LEG_RESP, _SRC_TWIN),
        R("rmb.relay.forwarded", "relay.received.resp", _RESP, _SRC_TWIN),
        R("rmb.relay.forwarded", "relay.delivered.resp", _RESP, _SRC_TWIN),
        R("rmb.relay.expired", "relay.expired", _LEG_RESP, _SRC_TWIN, "attrs.reason"),
        R("rmb.peer.received", "peer.received.resp", _RESP, _SRC_TWIN),
        R("rmb.peer.answered", "peer.answered", "true", _SRC_TWIN, _CODE),
        R("rmb.peer.answered", "peer.answered.ok", "coalesce(attrs.code, 0) = 0", _SRC_TWIN,
          _CODE, hop=False),
        # a reply the peer pushed because one came in (not its own expiry notice, 102)
        R("rmb.peer.answered", "peer.answered.reply", "coalesce(attrs.code, 0) <> 102",
          _SRC_TWIN, _CODE, hop=False),
        R("rmb.peer.answered", "peer.answered.expired", "attrs.code = 102", _SRC_TWIN, _CODE,
          hop=False),
        R("rmb.peer.answered", "peer.answered.error", "coalesce(attrs.code, 0) NOT IN (0, 102)",
          _SRC_TWIN, _CODE, hop=False),
        R("rmb.peer.expired", "peer.expired", "true", "dst_twin", _CODE),
        R("rmb.peer.rejected", "peer.rejected", "true", _SRC_TWIN, _CODE),
        # a reply for a request that already completed or expired (rmb-peer code 102)
        R("rmb.peer.rejected", "peer.rejected.late", "attrs.code = 102", _SRC_TWIN, _CODE,
          hop=False),
        R("rmb.app.replied", "app.replied", "true", _SRC_TWIN, _CODE),
        R("rmb.app.replied", "app.answer", "coalesce(attrs.code, 0) <> 102", _SRC_TWIN, _CODE, hop=False),
        R("rmb.app.replied", "reply.ok", "coalesce(attrs.code, 0) = 0", _SRC_TWIN, _CODE, hop=False),
        R("rmb.app.replied", "reply.expired", "attrs.code = 102", _SRC_TWIN, _CODE, hop=False),
        R("rmb.app.replied", "reply.error", "coalesce(attrs.code, 0) NOT IN (0, 102)",
          _SRC_TWIN, _CODE, hop=False),
    ),
    stages=(
        S("round_trip", "app.requested", "app.answer", e2e=True),
        S("request_delivery", "app.requested", "peer.delivered", e2e=True),
        S("app_to_peer", "app.requested", "peer.sent.req"),
        S("peer_to_relay", "peer.sent.req", "relay.received.req"),
        S("relay_transit", "relay.received.req", "relay.delivered.req"),
        S("federation", "relay.received.req", "relay.fed_received.req"),
        S("federation_ack", "relay.fed_received.req", "relay.federated.req"),
        S("relay_queue", "relay.queued.req", "relay.delivered.req"),
        S("relay_to_peer", "relay.delivered.req", "peer.received.req"),
        # rmb-peer logs `received` at debug only: this edge is measured at info too
        S("relay_to_service", "relay.delivered.req", "peer.delivered"),
        S("peer_to_service", "peer.received.req", "peer.delivered"),
        S("service", "peer.delivered", "app.handled"),
        S("service_to_peer", "app.handled", "peer.sent.resp"),
        S("peer_to_relay_resp", "peer.sent.resp", "relay.received.resp"),
        S("relay_transit_resp", "relay.received.resp", "relay.delivered.resp"),
        S("federation_resp", "relay.received.resp", "relay.fed_received.resp"),
        S("federation_ack_resp", "relay.fed_received.resp", "relay.federated.resp"),
        S("relay_queue_resp", "relay.queued.resp", "relay.delivered.resp"),
        S("relay_to_peer_resp", "relay.delivered.resp", "peer.received.resp"),
        # to the reply the peer pushed, not its own earlier expiry notice (a late reply's
        # relay delivery comes after that notice: no causal pair)
        S("relay_to_app", "relay.delivered.resp", "peer.answered.reply"),
        S("peer_to_app", "peer.received.resp", "peer.answered.reply"),
        S("app_return", "peer.answered", "app.replied"),
    ),
    outcomes=Outcomes(
        start=("app.requested", "peer.sent.req", "relay.received.req"),
        sent=("peer.sent.req", "relay.received.req"),
        delivered=("peer.delivered",),
        answered=("reply.ok", "peer.answered.ok"),
        expired=("reply.expired", "peer.answered.expired", "peer.expired"),
        errored=("reply.error", "peer.answered.error"),
        fallback_errored=("relay.rejected",), fallback_expired=("relay.expired",),
        late=("peer.rejected.late",), deadline=True,
        deadline_from=("peer.sent.req", "app.requested", "relay.received.req"),
        default_ttl_s=300.0, ttl_step="app.requested"),
)

_STATUS = "event IN ('remp.fullnode.status', 'remp.validator.status')"
REMP = Protocol(
    name="remp",
    rules=(
        R("remp.fullnode.received", "fullnode.received"),
        R("remp.fullnode.sent", "fullnode.sent"),
        R("remp.fullnode.final", step_sql="concat('final.', attrs.outcome)",
          when="attrs.outcome IS NOT NULL", detail="attrs.kind"),
        R("remp.fullnode.final", "finalized", "attrs.outcome = 'finalized'", hop=False),
        R("remp.fullnode.final", "rejected", "attrs.outcome = 'rejected'", detail="attrs.kind",
          hop=False),
        R("remp.fullnode.final", "timeout", "attrs.outcome = 'timeout'", hop=False),
        R("remp.fullnode.status", step_sql="concat('fullnode.', attrs.kind)",
          when="attrs.kind IS NOT NULL", detail="attrs.reason"),
        R("remp.validator.status", step_sql="concat('validator.', attrs.kind)",
          when="attrs.kind IS NOT NULL", detail="attrs.reason"),
        R("remp.fullnode.status", "first_receipt",
          "attrs.kind NOT IN ('SentToValidators', 'RejectedByFullnode')", hop=False),
        R("remp.fullnode.status", "finalized", "attrs.kind = 'Finalized'", hop=False),
        R("remp.validator.status", "finalized", "attrs.kind = 'Finalized'", hop=False),
        R("remp.fullnode.status", "rejected", "attrs.kind LIKE 'Rejected%'", detail="attrs.kind", hop=False),
        R("remp.validator.status", "rejected", "attrs.kind LIKE 'Rejected%'", detail="attrs.kind", hop=False),
        R("remp.fullnode.status", "timeout", "attrs.kind = 'Timeout'", hop=False),
        R("remp.validator.status", "timeout", "attrs.kind = 'Timeout'", hop=False),
        # receipts: produced by validator `node`, delivered to the full node (peer = that
        # validator); counted by spark/report.py (receipts_produced / receipts_delivered)
        R("remp.validator.status", step_sql="concat('produced:', node, ':', attrs.kind)",
          when="attrs.kind IS NOT NULL AND node IS NOT NULL", hop=False),
        R("remp.fullnode.status", step_sql="concat('delivered:', attrs.peer, ':', attrs.kind)",
          when="attrs.kind IS NOT NULL AND attrs.peer IS NOT NULL", hop=False),
    ),
    stages=(
        S("first_receipt", "fullnode.received", "first_receipt", e2e=True),
        S("finalized", "fullnode.received", "finalized", e2e=True),
        S("sent_to_validators", "fullnode.received", "fullnode.SentToValidators"),
        S("to_first_validator", "fullnode.received", "fullnode.sent"),
        S("to_queue", "fullnode.received", "validator.PutIntoQueue"),
        S("first_put_into_queue", "fullnode.received", "fullnode.PutIntoQueue"),
        S("included_into_block", "fullnode.received", "fullnode.IncludedIntoBlock"),
        S("included_into_accepted_block", "fullnode.received",
          "fullnode.IncludedIntoAcceptedBlock"),
        S("collator", "validator.PutIntoQueue", "validator.IncludedIntoBlock", clock=False),
        S("shardchain", "validator.IncludedIntoBlock", "validator.IncludedIntoAcceptedBlock",
          clock=False),
        S("masterchain", "validator.IncludedIntoAcceptedBlock", "finalized", clock=False),
    ),
    outcomes=Outcomes(
        start=("fullnode.received",), sent=("fullnode.received",),
        delivered=("first_receipt", "validator.PutIntoQueue"), answered=("finalized",),
        expired=("timeout",), errored=("rejected",), default_ttl_s=240.0),
)

MARLIN = Protocol(
    name="marlin",
    rules=(
        R("marlin.producer.chunk_sent", "chunk_sent"),
        R("marlin.cluster.witnessed", "witnessed"),
        R("marlin.cluster.acknowledged", "acknowledged"),
        R("marlin.cluster.rejected", "rejected", detail="attrs.reason"),
        R("marlin.consumer.chunk_received", "chunk_received", branch="node"),
        R("marlin.consumer.block_rebuilt", "block_rebuilt", branch="node"),
        R("marlin.consumer.dispute", "dispute", branch="node", detail="attrs.reason"),
        # distinct chunks, for chunks lost and missing acks (spark/report.py)
        R("marlin.producer.chunk_sent", step_sql="concat('c.sent:', CAST(attrs.chunk AS STRING))",
          when="attrs.chunk IS NOT NULL", hop=False),
        R("marlin.cluster.acknowledged", step_sql="concat('c.ack:', CAST(attrs.chunk AS STRING))",
          when="attrs.chunk IS NOT NULL", hop=False),
        R("marlin.consumer.chunk_received",
          step_sql="concat('c.recv:', CAST(attrs.chunk AS STRING))", branch="node",
          when="attrs.chunk IS NOT NULL", hop=False),
    ),
    stages=(
        S("rebuild", "chunk_sent", "block_rebuilt", e2e=True),
        S("member_to_consumer", "witnessed", "chunk_received"),
        S("to_cluster", "chunk_sent", "witnessed"),
        S("acknowledge", "chunk_sent", "acknowledged"),
        S("first_chunk", "chunk_sent", "chunk_received"),
        S("decode", "chunk_received", "block_rebuilt"),
    ),
    outcomes=Outcomes(
        start=("chunk_sent",), sent=("chunk_sent",), delivered=("chunk_received",),
        answered=("block_rebuilt",), expired=(), errored=("dispute", "rejected"),
        default_ttl_s=30.0),
)

PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (RMB, REMP, MARLIN)}

#: outcome classes in the delivery table, in precedence order after `sent`/`delivered`
FINAL_OUTCOMES = ("answered", "errored", "expired")


def _check() -> None:
    """Every rule names a catalogued event; every fixed stage endpoint is a step."""
    from spark.schema import known_events
    events = known_events()
    for p in PROTOCOLS.values():
        for r in p.rules:
            if r.event not in events:
                raise ValueError(f"{p.name}: step rule for uncatalogued event {r.event}")
            if not (r.step or r.step_sql):
                raise ValueError(f"{p.name}: rule for {r.event} names no step")


_check()
