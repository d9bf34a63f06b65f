"""The Prometheus rules generated from spark/sla.toml (spark/promrules.py): the committed
files are what the generator makes, every objective has rules, each latency objective's
threshold is a bucket bound of the daemon histogram it reads, and promtool accepts the rules
and passes their unit tests (a healthy series fires nothing; an outage fires the fast-burn
alert within its window; a 10% degradation fires the slow-burn alert only). The unit tests
are shown to catch a broken rule. promtool comes with Debian's `prometheus` package
(scripts/test.sh installs it); without it those tests skip."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from spark import promrules

ROOT = Path(__file__).resolve().parent.parent
PROM = ROOT / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus; "
                             "scripts/test.sh installs it when run as root)")


def _buckets(metric: str) -> tuple[float, ...]:
    """The bucket bounds each daemon defines next to its histogram."""
    if metric == "rmb_peer_app_round_trip_seconds":
        from rmb_peer.daemon import ROUND_TRIP_BUCKETS
        return ROUND_TRIP_BUCKETS
    if metric == "remp_fullnode_first_receipt_seconds":
        from remp_node.daemon.node import FIRST_RECEIPT_BUCKETS
        return FIRST_RECEIPT_BUCKETS
    if metric == "remp_fullnode_finalized_seconds":
        from remp_node.daemon.node import FINALIZED_BUCKETS
        return FINALIZED_BUCKETS
    if metric == "marlin_consumer_rebuild_seconds":
        from marlin_cluster.daemon import REBUILD_BUCKETS
        return REBUILD_BUCKETS
    raise AssertionError(f"no bucket list known for {metric}")


def test_committed_files_are_generated():
    r = subprocess.run([sys.executable, "-m", "spark.promrules", "--check"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_check_refuses_a_stale_file(tmp_path):
    """--check can fail: a hand-edited copy is reported out of date."""
    for name in (promrules.RULES_FILE, promrules.TESTS_FILE):
        shutil.copy(PROM / name, tmp_path / name)
    assert promrules.main(["--check", "--out", str(tmp_path)]) == 0
    p = tmp_path / promrules.RULES_FILE
    p.write_text(p.read_text().replace("14.4", "15"))
    assert promrules.main(["--check", "--out", str(tmp_path)]) == 1


def test_every_objective_has_rules():
    sla = promrules.load_sla()
    got, missing = promrules.expressible(sla)
    assert missing == []
    doc = yaml.safe_load((PROM / promrules.RULES_FILE).read_text())
    alerts = {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r}
    recorded = {(r["record"], r["labels"]["slo"]) for g in doc["groups"] for r in g["rules"]
                if "record" in r}
    for o in sla["objective"]:
        name = promrules.camel(o["name"])
        assert {f"{name}BudgetBurnFast", f"{name}BudgetBurnSlow"} <= alerts
        for w in promrules.WINDOWS:
            assert (f"slo:sli_error:ratio_rate{w}", o["name"]) in recorded


def test_burn_thresholds_follow_the_workbook():
    """Fast: 1h and 5m above 14.4 x budget; slow: 6h and 30m above 6 x budget (budget = 1%
    for a p99 objective and for min = 0.99)."""
    doc = yaml.safe_load((PROM / promrules.RULES_FILE).read_text())
    rules = {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}
    fast = rules["RempFirstReceiptP99BudgetBurnFast"]["expr"]
    assert 'ratio_rate1h{slo="remp-first-receipt-p99"} > 0.144' in fast
    assert 'ratio_rate5m{slo="remp-first-receipt-p99"} > 0.144' in fast
    slow = rules["RmbDeliveryRateBudgetBurnSlow"]["expr"]
    assert 'ratio_rate6h{slo="rmb-delivery-rate"} > 0.06' in slow
    assert 'ratio_rate30m{slo="rmb-delivery-rate"} > 0.06' in slow


def test_latency_thresholds_are_bucket_bounds():
    """The rules read <histogram>_bucket{le="<threshold>"}: the threshold must be one of the
    daemon's bounds, written as prometheus_client writes it."""
    for o, src in promrules.expressible(promrules.load_sla())[0]:
        if isinstance(src, promrules.Latency):
            thr = o["max_ms"] / 1000.0
            assert thr in _buckets(src.metric), (o["name"], src.metric)
            expr = promrules.error_ratio_expr(o, src, "5m")
            reg = CollectorRegistry()
            from prometheus_client import Histogram
            Histogram(src.metric, "x",
                      buckets=_buckets(src.metric), registry=reg)
            text = generate_latest(reg).decode()
            le = expr.split('le="')[1].split('"')[0]
            assert f'{src.metric}_bucket{{le="{le}"}}' in text


def test_marlin_metrics_export_the_rebuild_histogram():
    """The consumer's histogram is on its registry with the bound the rule reads."""
    from marlin_cluster.daemon import Metrics
    from marlin_cluster.events import BlockRebuilt
    m = Metrics()
    reg = CollectorRegistry()
    reg.register(m)
    m.rebuild.observe(0.2)
    m.rebuild.observe(3.0)
    text = generate_latest(reg).decode()
    assert 'marlin_consumer_rebuild_seconds_bucket{le="1.0"} 1.0' in text
    assert "marlin_consumer_rebuild_seconds_count 2.0" in text
    assert BlockRebuilt.__dataclass_fields__["duration_ms"]


@needs_promtool
def test_promtool_check_rules_and_config():
    r = subprocess.run([PROMTOOL, "check", "rules", str(PROM / promrules.RULES_FILE)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([PROMTOOL, "check", "config", str(PROM / "prometheus.yml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_promtool_unit_tests_pass():
    r = subprocess.run([PROMTOOL, "test", "rules", promrules.TESTS_FILE], cwd=PROM,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr


@needs_promtool
def test_unit_tests_catch_a_fast_burn_alert_that_never_fires(tmp_path):
    """Raise the fast-burn threshold of every objective out of reach: the outage tests
    (expecting the fast-burn alert at minute 75) now fail."""
    text = (PROM / promrules.RULES_FILE).read_text().replace("> 0.144", "> 0.99")
    assert "> 0.99" in text
    (tmp_path / promrules.RULES_FILE).write_text(text)
    shutil.copy(PROM / promrules.TESTS_FILE, tmp_path / promrules.TESTS_FILE)
    r = subprocess.run([PROMTOOL, "test", "rules", promrules.TESTS_FILE], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "BudgetBurnFast" in r.stdout + r.stderr


def test_compose_targets_cover_the_compose_daemons():
    """Every relay-suite daemon service of docker-compose is a Prometheus target (its status
    port), and the prometheus service mounts the generated rules."""
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    targets = json.loads((PROM / "compose-targets.json").read_text())
    hosts = {t.split(":")[0] for g in targets for t in g["targets"]}
    for name, svc in compose["services"].items():
        if svc.get("image") != "relay-suite" or svc.get("restart") == "no":
            continue
        if svc.get("network_mode") == "service:remp-net":
            continue   # REMP nodes: 127.0.0.1 in remp-net's namespace, shared by prometheus
        assert name in hosts, name
    prom = compose["services"]["prometheus"]
    mounted = " ".join(prom["volumes"])
    assert "relay-suite.rules.yml" in mounted and "compose-targets.json" in mounted
