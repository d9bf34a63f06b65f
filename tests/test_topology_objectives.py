"""The per-topology SLA objectives are derived from the committed topology files' links and
the testnet job's placement (deploy/objectives.py); no root needed."""
from __future__ import annotations

import tomllib

import pytest

from deploy.objectives import job_regions, objectives, sla_toml
from deploy.testnet import TOPOLOGIES, load_topology
from spark.report import DEFAULT_SLA, load_sla


def _by_name(topo_name: str) -> dict[str, dict]:
    topo = load_topology(topo_name)
    return {o["name"]: o for o in objectives(topo, job_regions(topo))}


def test_wan_targets_follow_the_links():
    obs = _by_name("wan")
    # full node in eu, a validator in ap: RTT 80 + 80 ms
    # plus the loopback objective of spark/sla.toml (1,000 ms: the validators on one host)
    assert obs["remp-first-receipt-p99"]["max_ms"] == 2 * 160 + 1000
    assert "eu <-> ap" in obs["remp-first-receipt-p99"]["derived"]
    assert obs["remp-finalized-p99"]["max_ms"] == 25000 + 20 * 160
    # producer eu -> member ap (80 ms) -> consumer us (60 ms); 1 MB as 12 fragments of
    # which 8 rebuild it = 1.5 MB at 100 Mbit/s = 120 ms
    assert obs["marlin-rebuild-p50"]["max_ms"] == 140 + 120 + 30
    assert obs["marlin-rebuild-p50"]["quantile"] == 0.5
    # loss 1 % between regions: the stream penalty max(200, 3 x 80 ms)
    assert obs["marlin-rebuild-p99"]["max_ms"] == 1000 + 140 + 120 + 240
    # alice (eu) -> carol (ap)
    assert obs["rmb-round-trip-p99"]["max_ms"] == 2 * 160 + 1000


def test_lan_and_thin_differ_where_their_links_do():
    lan, wan, thin = _by_name("lan"), _by_name("wan"), _by_name("thin")
    # lan: 0.2 ms one way, 1 Gbit/s, no loss
    assert lan["remp-first-receipt-p99"]["max_ms"] == pytest.approx(1000.8)
    assert lan["marlin-rebuild-p50"]["max_ms"] == pytest.approx(0.4 + 12 + 30)
    assert lan["marlin-rebuild-p99"]["max_ms"] == pytest.approx(1000 + 0.4 + 12)
    # thin: wan's delays, 10 Mbit/s producer and consumer links -> 1,200 ms to serialize 1.5 MB
    assert thin["remp-first-receipt-p99"] == wan["remp-first-receipt-p99"]
    assert thin["marlin-rebuild-p50"]["max_ms"] == 140 + 1200 + 30
    assert "10 Mbit/s" in thin["marlin-rebuild-p50"]["derived"]


def test_an_edited_link_moves_the_target(tmp_path):
    text = (TOPOLOGIES / "wan.toml").read_text()
    slower = text.replace("delay_ms = 80", "delay_ms = 150")
    path = tmp_path / "slow.toml"
    path.write_text(slower)
    topo = load_topology(path)
    obs = {o["name"]: o for o in objectives(topo, job_regions(topo))}
    assert obs["remp-first-receipt-p99"]["max_ms"] == 2 * 300 + 1000
    assert obs["rmb-round-trip-p99"]["max_ms"] == 2 * 300 + 1000


def test_only_placed_protocols_get_objectives():
    topo = load_topology("wan")
    names = {o["name"] for o in objectives(topo, job_regions(topo, ["rmb"]))}
    assert names == {"rmb-round-trip-p99"}


@pytest.mark.parametrize("name", ["lan", "wan", "thin"])
def test_sla_file_loads_in_the_report(name, tmp_path):
    topo = load_topology(name)
    path = tmp_path / "sla.toml"
    path.write_text(sla_toml(topo, job_regions(topo)))
    doc = load_sla(path)
    base = tomllib.loads(DEFAULT_SLA.read_text())
    rates = [o["name"] for o in base["objective"] if "rate" in o]
    got = {o["name"]: o for o in doc["objective"]}
    assert set(rates) <= set(got)
    assert doc["ttl_s"] == base["ttl_s"]
    derived = [o for o in doc["objective"] if "derived" in o]
    assert {o["name"] for o in derived} == {"remp-first-receipt-p99", "remp-finalized-p99", "marlin-rebuild-p50",
                                            "marlin-rebuild-p99", "rmb-round-trip-p99"}
    assert all(o["max_ms"] > 0 and o["stage"] for o in derived)


def test_a_slower_loopback_objective_moves_the_host_term(tmp_path):
    base = tmp_path / "base.toml"
    base.write_text(DEFAULT_SLA.read_text().replace("max_ms = 1000                 # seed",
                                                    "max_ms = 1500                 # seed"))
    topo = load_topology("wan")
    obs = {o["name"]: o for o in objectives(topo, job_regions(topo), base)}
    assert obs["remp-first-receipt-p99"]["max_ms"] == 2 * 160 + 1500
    assert "1500 ms (loopback objective)" in obs["remp-first-receipt-p99"]["derived"]
