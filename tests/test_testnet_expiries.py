"""The testnet job's attribution of expired RMB requests to the planned fault windows
(deploy.testnet_job.rmb_expiries): pure, no namespaces."""
from __future__ import annotations

from deploy.testnet import RTO_MAX_MS
from deploy.testnet_job import fault_windows, rmb_expiries, verdict

T = 1_000_000.0
FAULTS = [
    {"fault": "region_partition", "target": "ap", "at": T + 4, "duration_s": 30, "healed": T + 34,
     "planned_for": ["ap", "carol"]},
    {"fault": "relay_rotation", "target": "relay2", "at": T + 46, "duration_s": 12, "took_s": 3.0,
     "planned_for": ["relay2", "relay3", "bob", "carol"]},
]


def test_windows_end_at_the_heal_plus_the_retransmission_ceiling_or_the_rotation_window():
    w = {name: (a, b) for name, a, b, _ in fault_windows(FAULTS)}
    assert w["region_partition"] == (T + 4, T + 34 + RTO_MAX_MS / 1e3)
    assert w["relay_rotation"] == (T + 46, T + 58)


def test_expiries_inside_a_window_planned_for_the_destination_and_outside():
    sent = {("1", "carol"): T + 5, ("2", "bob"): T + 5, ("3", "bob"): T + 20, ("4", "bob"): T + 70,
            ("5", "carol"): T + 6, ("6", "carol"): T + 30}
    outcomes = {("1", "carol"): "expired", ("2", "bob"): "expired", ("3", "bob"): "expired",
                ("4", "bob"): "expired", ("5", "carol"): "answered", ("6", "carol"): "expired"}
    e = rmb_expiries(outcomes, sent, 40.0, FAULTS)
    # carol #1 lived 5..45 s, #6 30..70 s: the partition (4..39 s) and the rotation (46..58
    # s, carol moved too); bob #2 lived 5..45 s: no window planned for bob; bob #3 lived
    # 20..60 s: the rotation; bob #4 was sent after every window
    assert (e["expired"], e["inside"], e["outside"]) == (5, 3, 2)
    assert e["by_fault"] == {"region_partition": 2, "relay_rotation": 1}
    assert [(r["request"], r["dst"], r["sent_s"]) for r in e["outside_requests"]] == \
        [("2", "bob", 0.0), ("4", "bob", 65.0)]
    # carol's under the partition, which hit them first; #1's deadline (45 s) and #6's (70 s)
    # are past the partition's window (39 s): the fault alone does not explain them; #3
    # (60 s) outlived the rotation's window (58 s)
    assert [(r["request"], r["fault"], r["past_end_s"]) for r in e["outlived_requests"]] == \
        [("1", "region_partition", 6.0), ("3", "relay_rotation", 2.0), ("6", "region_partition", 31.0)]


def test_a_partitioned_twins_window_lasts_until_its_peer_replaced_the_silenced_connection():
    # the peer pings a relay silent for 20 s and declares it dead 10 s later (30 s after
    # its last frame), then reconnects 1 s later: a 30 s cut that began at 4 s keeps a
    # twin in the cut region planned until 35 s (before: 40 s of silence, 45 s); the heal
    # + retransmission ceiling (39 s) is later, so the window ends there
    from deploy.testnet_job import peer_reconnected_by
    from rmb_peer.core import BACKOFF_MIN, DEAD_AFTER
    back = peer_reconnected_by(T + 4, T + 34)
    assert back == T + 4 + DEAD_AFTER + BACKOFF_MIN == T + 35
    w = {name: (a, b) for name, a, b, _ in
         fault_windows([dict(FAULTS[0], peers_back=back), FAULTS[1]])}
    assert w["region_partition"] == (T + 4, T + 39)
    # a 40 s cut from 4 s: the peer declared the relay dead at 34 s, inside the cut; its
    # first reconnect's SYNs (35, 36, 38, 42 s) met the cut and it failed at 45 s; the
    # next begins 2 s later: back at 47 s
    assert peer_reconnected_by(T + 4, T + 44) == T + 47
    # a cut shorter than the detection: the old rule
    assert peer_reconnected_by(T + 4, T + 20) == T + 35
    back = T + 45                           # the windows below: a peer back at 45 s
    faults = [dict(FAULTS[0], peers_back=back), FAULTS[1]]
    w = {name: (a, b) for name, a, b, _ in fault_windows(faults)}
    assert w["region_partition"] == (T + 4, T + 45)
    # carol #1 lived 5..45 s: its whole life lay inside the partition's window now
    e = rmb_expiries({("1", "carol"): "expired"}, {("1", "carol"): T + 5}, 40.0, faults)
    assert (e["inside"], e["outlived"]) == (1, 0)


def test_the_verdict_fails_an_expiry_that_a_planned_fault_does_not_explain():
    """Expiries are accounted for (every_request_accounted), but one that outlived its window
    or fell outside every window fails its own row: the fault alone does not explain it."""
    def rows(outcomes, sent):
        e = rmb_expiries(outcomes, sent, 40.0, FAULTS)
        counts = {"answered": sum(o == "answered" for o in outcomes.values()),
                  "expired": e["expired"]}
        return verdict({"rmb": {"counts": counts, "requests": len(outcomes) // 2,
                                "destinations": 2, "expired": e}})
    # carol #1 sent 5 s in, expired: its deadline (45 s) was past the partition's window
    r = rows({("1", "carol"): "expired", ("1", "bob"): "answered"},
             {("1", "carol"): T + 5, ("1", "bob"): T + 5})
    assert r["rmb.every_request_accounted"][0]
    assert r["rmb.expiries_explained_by_faults"] == (
        False, "1 expired: 0 outside planned fault windows, 1 outlived their window")
    # the same request answered: the row passes
    r = rows({("1", "carol"): "answered", ("1", "bob"): "answered"},
             {("1", "carol"): T + 5, ("1", "bob"): T + 5})
    assert r["rmb.expiries_explained_by_faults"][0]
