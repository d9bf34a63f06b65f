"""Driver-side pieces of the trace report that need no JVM: clock alignment, SLA evaluation,
the read schema built from the catalogues, and the stage model's consistency."""
from __future__ import annotations

import math

import pytest

from spark.clock import align
from spark.report import evaluate_sla, load_sla


# ------------------------------------------------------------------ clock

def test_clock_no_proof_no_correction():
    res = align({("r", "a"): 3.0, ("a", "r"): 4.0, ("r", "b"): 0.0})
    assert res.corrections == {} and res.proofs == [] and res.consistent


def test_clock_two_sided_proof_uses_midpoint():
    # b is 500 ms behind r; delays 4 ms each way
    res = align({("r", "b"): -496.0, ("b", "r"): 504.0, ("r", "a"): 3.0, ("a", "r"): 3.0})
    assert res.corrections == {"b": 500.0}
    assert res.proofs == [("b", "r", 504.0, -496.0)]


def test_clock_one_sided_proof_uses_the_bound_and_tightest_path():
    # a -> b only ever seen one way: the smallest shift that makes it non-negative
    assert align({("a", "b"): -5.0}).corrections == {"b": 5.0}
    # b ahead of a (b -> a negative): b's timestamps move back
    assert align({("b", "a"): -7.0}).corrections == {"b": -7.0}
    # c is linked to r tightly (no skew) and to b loosely: c is not moved
    res = align({("r", "b"): -496.0, ("b", "r"): 504.0, ("r", "c"): 3.0, ("c", "r"): 3.0,
                 ("c", "b"): -489.0})
    assert res.corrections == {"b": 500.0}


def test_clock_relaxation_keeps_every_causal_delta_non_negative():
    d = {("r", "b"): -496.0, ("b", "r"): 504.0, ("r", "c"): -10.0, ("c", "b"): -490.0}
    res = align(d)
    assert res.consistent
    x = res.corrections
    for (a, b), v in d.items():
        assert v + x.get(b, 0.0) - x.get(a, 0.0) >= -1e-9


def test_clock_contradiction_is_reported_not_applied():
    res = align({("a", "b"): -5.0, ("b", "a"): 3.0})   # interval [-3, -5] is empty
    assert res.consistent is False and res.corrections == {}
    assert res.proofs == [("a", "b", -5.0, 3.0)]


def test_clock_nodes_of_one_host_share_it():
    """The demo's case (a run on one host): a relay logs a batch's `delivered` after the
    peer already logged `received`, in both directions, beyond the tolerance. Without hosts
    that reads as contradictory skew; with the plan's hosts it is one clock, no correction,
    and the most negative delta is reported as the log order."""
    d = {("alice", "relay1"): 0.316, ("relay1", "alice"): -5.026, ("relay2", "bob"): -6.962,
         ("bob", "relay2"): 0.437, ("relay1", "relay2"): 2.0}
    assert align(d, 5.0).consistent is False                       # what the report said before
    hosts = {n: "box" for n in ("alice", "relay1", "relay2", "bob")}
    res = align(d, 5.0, hosts)
    assert res.consistent and res.corrections == {} and res.proofs == [] and res.cross_pairs == 0
    assert res.shared_hosts == {"box": ["alice", "bob", "relay1", "relay2"]}
    assert res.log_order == ("relay2", "bob", -6.962)


def test_clock_skew_between_hosts_moves_every_node_of_the_host():
    # host h2 (b, c) is 500 ms behind host h1 (r, a); a and r disagree by log order only
    d = {("r", "b"): -496.0, ("b", "r"): 504.0, ("a", "r"): -3.0, ("c", "a"): 510.0}
    res = align(d, 0.0, {"r": "h1", "a": "h1", "b": "h2", "c": "h2"})
    assert res.consistent and res.cross_pairs == 2          # (h1, h2) and (h2, h1)
    assert res.corrections == {"b": 500.0, "c": 500.0}
    assert res.domain_corrections == {"host:h2": 500.0}
    assert res.log_order == ("a", "r", -3.0)


def test_clock_text_says_one_host_shares_its_clock():
    from spark.page import _clock_text
    lab = {"1": "alice", "127.0.0.1:1": "relay1"}
    clock = {"consistent": True, "corrections_ms": {}, "tolerance_ms": 5.0, "proofs": [],
             "shared_hosts": {"box": ["1", "127.0.0.1:1"]}, "cross_pairs": 0,
             "log_order": {"from": "127.0.0.1:1", "to": "1", "min_delta_ms": -5.026}}
    text = _clock_text(clock, lambda n: lab.get(n, n))
    assert "share its clock" in text and "2 nodes on box" in text
    assert "-5.026 ms (relay1 -> alice)" in text and "contradict" not in text


# ------------------------------------------------------------------ SLA

def _lat(count, p99, over):
    return {"count": count, "quantiles": {0.5: p99, 0.9: p99, 0.99: p99}, "over": over}


def test_sla_quantile_rate_within_and_no_data():
    objectives = [
        {"name": "q", "protocol": "rmb", "stage": "round_trip", "quantile": 0.99, "max_ms": 100},
        {"name": "r", "protocol": "rmb", "rate": "answered", "min": 0.9},
        {"name": "w", "protocol": "remp", "stage": "finalized", "within_ms": 25000, "min": 0.5},
        {"name": "n", "protocol": "marlin", "stage": "rebuild", "quantile": 0.99, "max_ms": 1},
    ]
    latency = {("rmb", "round_trip"): _lat(200, 150.0, {100.0: 4})}
    delivery = {"rmb": {"branches": 21, "in_flight": 1, "answered": 19}}
    res = {r["name"]: r for r in evaluate_sla(
        objectives, {"all": {}, "unplanned": latency}, {"all": {}, "unplanned": delivery},
        {"all": {}, "unplanned": {2: (3, 4)}})}
    assert res["q"]["status"] == "fail" and res["q"]["actual"] == 150.0
    assert res["q"]["budget_used"] == pytest.approx((4 / 200) / 0.01)       # 2x the budget
    assert res["r"]["status"] == "pass" and res["r"]["actual"] == 0.95
    assert res["r"]["budget_used"] == pytest.approx(0.05 / 0.1)
    assert res["w"]["status"] == "pass" and res["w"]["budget_used"] == pytest.approx(0.25 / 0.5)
    assert res["n"]["status"] == "no data" and res["n"]["passed"] is None
    assert (res["q"]["unit"], res["q"]["target"], res["r"]["unit"]) == ("ms", 100.0, "ratio")
    # count = "all" reads the other scope
    allq = evaluate_sla([dict(objectives[0], count="all")], {"all": latency, "unplanned": {}},
                        {"all": {}, "unplanned": {}}, {"all": {}, "unplanned": {}})
    assert allq[0]["ok"] is False and allq[0]["counts"].startswith("all requests")


def test_default_sla_file_parses_and_names_known_stages():
    from spark.stages import PROTOCOLS
    sla = load_sla(None)
    assert set(sla["ttl_s"]) == set(PROTOCOLS)
    for ob in sla["objective"]:
        proto = PROTOCOLS[ob["protocol"]]
        if "stage" in ob:
            assert ob["stage"] in {s.name for s in proto.stages}, ob
        assert sum(k in ob for k in ("quantile", "within_ms", "rate")) == 1, ob


# ------------------------------------------------------------------ schema and stage model

def test_schema_has_every_catalogued_attr_with_its_type():
    pytest.importorskip("pyspark")
    from pyspark.sql import types as T

    from daemon_runtime.eventlog import LINE_FIELDS
    from spark.schema import CATALOGUES, CORRUPT, event_schema
    schema = event_schema()
    assert schema.fieldNames() == [n for n, _ in LINE_FIELDS] + [CORRUPT]
    assert isinstance(schema["ts"].dataType, T.TimestampType)
    attrs = schema["attrs"].dataType
    want = {"string": T.StringType(), "long": T.LongType(), "double": T.DoubleType(),
            "boolean": T.BooleanType()}
    for cat in CATALOGUES:
        for spec in cat:
            for name, typ in spec.attrs.items():
                assert attrs[name].dataType == want[typ], (spec.name, name)


def test_stage_model_endpoints_are_steps():
    from spark.stages import PROTOCOLS
    remp_kinds = {"SentToValidators", "RejectedByFullnode", "PutIntoQueue", "IncludedIntoBlock",
                  "IncludedIntoAcceptedBlock", "Finalized", "Timeout"}
    for p in PROTOCOLS.values():
        steps = p.step_names()
        if p.name == "remp":
            steps |= {f"{lvl}.{k}" for lvl in ("fullnode", "validator") for k in remp_kinds}
        for st in p.stages:
            assert st.from_step in steps and st.to_step in steps, (p.name, st)
        o = p.outcomes
        for s in o.start + o.sent + o.delivered + o.answered + o.expired + o.errored:
            assert s in steps, (p.name, s)
        assert math.isfinite(o.default_ttl_s) and o.default_ttl_s > 0
