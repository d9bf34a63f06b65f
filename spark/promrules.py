"""Prometheus rules from the trace report's objectives (spark/sla.toml).

    python -m spark.promrules [--sla FILE] [--out DIR] [--check]

writes DIR/relay-suite.rules.yml (recording and alerting rules) and
DIR/relay-suite.rules.test.yml (`promtool test rules` unit tests of those alerts); DIR
defaults to deploy/prometheus. `--check` writes nothing and exits 1 when the committed files
differ from what the objectives generate now (the test suite runs it).

One definition of each objective, two engines: the Spark trace report judges spark/sla.toml
after a run from the event logs; Prometheus judges the same objectives live from the daemons'
/metrics with the multiwindow, multi-burn-rate alerts of Google's SRE workbook (chapter
"Alerting on SLOs", DESIGN.md section 8):

- SLI error ratio per objective over 5m, 30m, 1h and 6h, recorded as
  `slo:sli_error:ratio_rate<window>{slo, protocol}`. A latency objective (`quantile` with
  `max_ms`, or `within` with `within_ms`) counts an event as bad when it took longer than
  the threshold: 1 - rate(<histogram>_bucket{le=threshold}) / rate(<histogram>_count). A
  `rate` objective counts bad outcomes over all outcomes of a counter.
- Error budget = 1 - quantile (quantile) or 1 - min (within, rate).
- `<Objective>BudgetBurnFast` (severity page): the 1 h AND the 5 m error ratio both above
  14.4 x budget (2% of a 30-day budget spent in 1 h); `<Objective>BudgetBurnSlow` (severity
  page): 6 h AND 30 m above 6 x budget (5% in 6 h). The short window makes an alert stop
  soon after the burn stops.
- `slo:latency_seconds:p<q>_rate5m{slo, protocol}`: the objective's quantile over 5 m
  (for dashboards; the alerts do not use it).

Which metric expresses which objective is SOURCES, keyed by (protocol, stage) for latency
objectives and (protocol, rate) for rate objectives; an objective with no entry is listed as
not expressible in the rule file's header and gets no rules. A latency objective's threshold
must be a bucket bound of its histogram (le labels are matched as text, written the way
prometheus_client writes them: 1.0, 25.0); the buckets are defined next to each histogram
(remp_node/daemon/node.py, rmb_peer/daemon.py, marlin_cluster/daemon.py).

Differences from the trace report, by construction: Prometheus sees every message (the
report's default `count = "unplanned"` leaves out traffic hit by the demo's planned faults);
the Marlin histogram starts at the consumer's first chunk (the report's `rebuild` stage
starts at the producer's first chunk sent); the RMB round trip ends at the request's LAST
reply (per request, the report's is per destination).

HEALTH lists the alerts on what the daemons' /health reports (daemon down, Redis stalled or
down, twin records served stale because the registry is unreachable, offline queue full,
backpressure, store failures), each from the metric that mirrors the /health field.

Raises (load_sla / rules): OSError for an unreadable file, tomllib.TOMLDecodeError for bad
TOML, ValueError for an objective without a kind this module knows.
"""
from __future__ import annotations

import argparse
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import yaml
from prometheus_client.utils import floatToGoString

DEFAULT_SLA = Path(__file__).with_name("sla.toml")
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "deploy" / "prometheus"
RULES_FILE = "relay-suite.rules.yml"
TESTS_FILE = "relay-suite.rules.test.yml"

#: (long window, short window, burn-rate factor, alert suffix, severity): SRE workbook's
#: page alerts (2% of a 30-day budget in 1 h, 5% in 6 h)
BURNS = (("1h", "5m", 14.4, "Fast", "page"), ("6h", "30m", 6.0, "Slow", "page"))
WINDOWS = ("5m", "30m", "1h", "6h")
RUNBOOK = "docs/slo.md"


@dataclass(frozen=True)
class Latency:
    """A histogram (base name, seconds) whose events are the stage's samples; job: the
    scrape job of the daemons that export it."""
    metric: str
    job: str
    what: str


@dataclass(frozen=True)
class Ratio:
    """Outcome counter `metric`, outcome in label `label`: `good` and `bad` values (the
    bad-event ratio is bad / (good + bad)); job: the scrape job that exports it."""
    metric: str
    label: str
    good: tuple[str, ...]
    bad: tuple[str, ...]
    job: str
    what: str

    def selector(self, values: tuple[str, ...]) -> str:
        return f'{self.metric}{{{self.label}=~"{"|".join(values)}"}}'


#: (protocol, stage | rate) -> the daemons' metric that expresses the objective
SOURCES: dict[tuple[str, str], Latency | Ratio] = {
    ("rmb", "round_trip"): Latency(
        "rmb_peer_app_round_trip_seconds", "rmb-peer",
        "rmb-peer: an app's request sent -> its last reply (or expiry) pushed to the app"),
    ("rmb", "answered"): Ratio(
        "rmb_peer_events_total", "kind", ("app_answered",), ("app_errored", "app_expired"),
        "rmb-peer", "rmb-peer: replies to apps per (request, destination) by outcome"),
    ("remp", "first_receipt"): Latency(
        "remp_fullnode_first_receipt_seconds", "remp-fullnode",
        "full node: message received -> first status from a validator"),
    ("remp", "finalized"): Latency(
        "remp_fullnode_finalized_seconds", "remp-fullnode",
        "full node: message received -> Finalized"),
    ("remp", "answered"): Ratio(
        "remp_final_total", "outcome", ("finalized",), ("rejected", "timeout"),
        "remp-fullnode", "full node: final outcomes"),
    ("marlin", "rebuild"): Latency(
        "marlin_consumer_rebuild_seconds", "marlin-consumer",
        "consumer: first chunk of a block received -> block rebuilt"),
}


@dataclass(frozen=True)
class HealthAlert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    health: str          # the /health field it mirrors
    trigger: tuple[str, str, str] = ("", "", "")
    """unit test input: (series name, its extra labels, promtool values one per minute):
    quiet through minute 2, firing at minute 5"""


#: Daemons' jobs in the file_sd targets (deploy/prometheus.py) and prometheus.yml.
JOBS = 'job=~"rmb-.*|remp-.*|marlin-.*"'

HEALTH: tuple[HealthAlert, ...] = (
    HealthAlert("RelaySuiteDaemonDown", f"up{{{JOBS}}} == 0", "15s", "page",
                "{{ $labels.job }} {{ $labels.instance }} does not answer /metrics",
                "a /health that does not answer",
                trigger=("up", 'job="rmb-peer"', "1x2 0x6")),
    HealthAlert("RmbPeerRedisStalled", "rmb_peer_redis_write_wait_seconds >= 5", "0s", "page",
                "rmb-peer {{ $labels.instance }}: a Redis write has waited 5 s or more",
                "rmb-peer redis.stalled (write_wait_s >= --redis-stall-after, default 5 s)",
                trigger=("rmb_peer_redis_write_wait_seconds", 'job="rmb-peer"', "0x2 1 6x5")),
    HealthAlert("RmbPeerReadsPaused", "rmb_peer_reads_paused == 1", "30s", "ticket",
                "rmb-peer {{ $labels.instance }}: reading relays and local queues is paused "
                "for Redis (backpressure)", "rmb-peer redis.reads_paused",
                trigger=("rmb_peer_reads_paused", 'job="rmb-peer"', "0x2 1x6")),
    HealthAlert("RmbPeerNoRelay", "rmb_peer_relays_connected == 0", "30s", "page",
                "rmb-peer {{ $labels.instance }}: no relay connection is up", "rmb-peer ok = a relay is up",
                trigger=("rmb_peer_relays_connected", 'job="rmb-peer"', "2x2 0x6")),
    HealthAlert("RmbRelayRedisDown", "rmb_relay_redis_down_seconds > 0", "10s", "page",
                "rmb-relay {{ $labels.instance }}: Redis does not answer (offline queue unavailable)",
                "rmb-relay redis.answering / redis.down_s",
                trigger=("rmb_relay_redis_down_seconds", 'job="rmb-relay"', "0x2 3+60x6")),
    HealthAlert("RmbTwinRecordsStale",
                'increase(rmb_relay_twin_stale_served_total[5m]) > 0 '
                'or increase(rmb_peer_events_total{kind="twin_stale"}[5m]) > 0', "0s", "ticket",
                "{{ $labels.job }} {{ $labels.instance }}: twin records served past their TTL "
                "(the twin registry is unreachable)", "twin registry stale",
                trigger=("rmb_peer_events_total", 'job="rmb-peer", kind="twin_stale"', "0x2 1x6")),
    HealthAlert("RmbRelayQueueFull", "increase(rmb_relay_queue_full_total[5m]) > 0", "0s", "ticket",
                "rmb-relay {{ $labels.instance }}: envelopes refused, an offline queue is full",
                "offline queue full",
                trigger=("rmb_relay_queue_full_total", 'job="rmb-relay", via="peer"', "0x2 4x6")),
    HealthAlert("RmbRelayCapacityRefused", "increase(rmb_relay_capacity_refused_total[5m]) > 0", "0s",
                "ticket", "rmb-relay {{ $labels.instance }}: handshakes refused with 503 near the fd limit "
                "(backpressure)", "capacity (503 Retry-After)",
                trigger=("rmb_relay_capacity_refused_total", 'job="rmb-relay"', "0x2 1x6")),
    HealthAlert("RempStoreFailing", 'increase(remp_errors_total{where="store"}[5m]) > 0', "0s", "page",
                "{{ $labels.job }} {{ $labels.instance }}: store writes fail (the API answers 503)",
                "remp store_failures",
                trigger=("remp_errors_total", 'job="remp-fullnode", where="store"', "0x2 1x6")),
    HealthAlert("RempRedisStreamNotAppended", "increase(remp_redis_not_appended_total[5m]) > 0", "0s",
                "ticket", "remp-fullnode {{ $labels.instance }}: statuses not appended to the Redis "
                "stream (Redis unreachable or backlog full)", "remp redis.connected / redis.backlog",
                trigger=("remp_redis_not_appended_total", 'job="remp-fullnode"', "0x2 10x6")),
    HealthAlert("MarlinDeliveryErrors", "increase(marlin_delivery_errors_total[5m]) > 0", "0s", "ticket",
                "marlin consumer {{ $labels.instance }}: rebuilt blocks an output could not take",
                "marlin delivery_errors",
                trigger=("marlin_delivery_errors_total", 'job="marlin-consumer", output="redis"', "0x2 1x6")),
)


def load_sla(path: str | Path | None = None) -> dict:
    """The parsed objectives file (spark/sla.toml by default)."""
    with open(path or DEFAULT_SLA, "rb") as f:
        return tomllib.load(f)


def camel(name: str) -> str:
    """'remp-first-receipt-p99' -> 'RempFirstReceiptP99' (an alert name)."""
    return "".join(p[:1].upper() + p[1:] for p in re.split(r"[^A-Za-z0-9]+", name) if p)


def _shape(o: dict) -> tuple[str, str, float | None, float]:
    """(key kind, key, threshold seconds or None, error budget) of one objective."""
    if "quantile" in o:
        return "stage", o["stage"], o["max_ms"] / 1000.0, 1.0 - float(o["quantile"])
    if "within_ms" in o:
        return "stage", o["stage"], o["within_ms"] / 1000.0, 1.0 - float(o["min"])
    if "rate" in o:
        return "rate", o["rate"], None, 1.0 - float(o["min"])
    raise ValueError(f"objective {o.get('name')!r}: no quantile, within_ms or rate")


def _num(x: float) -> str:
    return f"{x:.6g}"


def expressible(sla: dict) -> tuple[list[tuple[dict, Latency | Ratio]], list[str]]:
    """(objectives with their metric source, names of those no metric expresses)."""
    got, missing = [], []
    for o in sla.get("objective", []):
        kind, key, _thr, _budget = _shape(o)
        src = SOURCES.get((o["protocol"], key))
        if src is None or (kind == "rate") != isinstance(src, Ratio):
            missing.append(o["name"])
        else:
            got.append((o, src))
    return got, missing


def error_ratio_expr(o: dict, src: Latency | Ratio, window: str) -> str:
    """PromQL of the objective's SLI error ratio over `window`."""
    _kind, _key, thr, _budget = _shape(o)
    if isinstance(src, Latency):
        le = floatToGoString(thr)
        return (f'1 - (sum(rate({src.metric}_bucket{{le="{le}"}}[{window}]))'
                f" / sum(rate({src.metric}_count[{window}])))")
    return (f"(sum(rate({src.selector(src.bad)}[{window}])) or vector(0))"
            f" / sum(rate({src.selector(src.good + src.bad)}[{window}]))")


def _labels(o: dict) -> dict:
    return {"slo": o["name"], "protocol": o["protocol"]}


def _burn_alert(o: dict, long_w: str, short_w: str, factor: float, suffix: str,
                severity: str) -> dict:
    budget = _shape(o)[3]
    sel = f'{{slo="{o["name"]}"}}'
    th = _num(factor * budget)
    return {
        "alert": f"{camel(o['name'])}BudgetBurn{suffix}",
        "expr": (f"slo:sli_error:ratio_rate{long_w}{sel} > {th}\n"
                 f"and\nslo:sli_error:ratio_rate{short_w}{sel} > {th}"),
        "labels": {"severity": severity, "window": f"{long_w}/{short_w}"},
        "annotations": _burn_annotations(o, long_w, short_w, factor),
    }


def _burn_annotations(o: dict, long_w: str, short_w: str, factor: float) -> dict:
    budget = _shape(o)[3]
    return {
        "summary": (f"{o['name']}: error budget burning at over {_num(factor)}x "
                    f"in {long_w} and {short_w}"),
        "description": (f"{_objective_text(o)}; error budget {_num(budget * 100)}% "
                        f"(spark/sla.toml). Bad-event ratio above {_num(factor * budget)} "
                        f"over both {long_w} and {short_w}."),
        "runbook": RUNBOOK,
    }


def _objective_text(o: dict) -> str:
    if "quantile" in o:
        return f"{o['stage']} p{_num(o['quantile'] * 100)} <= {o['max_ms']} ms"
    if "within_ms" in o:
        return f"{o['stage']} within {o['within_ms']} ms for >= {_num(o['min'] * 100)}%"
    return f"{o['rate']} >= {_num(o['min'] * 100)}%"


def rules(sla: dict) -> dict:
    """The rule file (as a dict for YAML): group `relay-suite-slo-recording`,
    `relay-suite-slo-alerts` and `relay-suite-health`."""
    got, _missing = expressible(sla)
    rec, alerts = [], []
    for o, src in got:
        for w in WINDOWS:
            rec.append({"record": f"slo:sli_error:ratio_rate{w}",
                        "expr": error_ratio_expr(o, src, w), "labels": _labels(o)})
        if "quantile" in o and isinstance(src, Latency):
            q = float(o["quantile"])
            rec.append({"record": f"slo:latency_seconds:p{_num(q * 100).replace('.', '_')}_rate5m",
                        "expr": f"histogram_quantile({_num(q)}, sum by (le) (rate({src.metric}_bucket[5m])))",
                        "labels": _labels(o)})
        for long_w, short_w, factor, suffix, sev in BURNS:
            alerts.append(_burn_alert(o, long_w, short_w, factor, suffix, sev))
    health = [{"alert": h.name, "expr": h.expr,
               **({"for": h.for_} if h.for_ != "0s" else {}),
               "labels": {"severity": h.severity},
               "annotations": {"summary": h.summary, "health": h.health, "runbook": RUNBOOK}}
              for h in HEALTH]
    return {"groups": [
        {"name": "relay-suite-slo-recording", "rules": rec},
        {"name": "relay-suite-slo-alerts", "rules": alerts},
        {"name": "relay-suite-health", "rules": health},
    ]}


def _input_series(o: dict, src: Latency | Ratio, good: str, total: str) -> list[dict]:
    """Series for one objective: `good` / `total` are promtool expanding notations of the
    cumulative good-event and all-event counts (one sample per minute)."""
    lab = f'job="{src.job}", instance="127.0.0.1:9000"'
    if isinstance(src, Latency):
        le = floatToGoString(_shape(o)[2])
        return [{"series": f'{src.metric}_bucket{{{lab}, le="{le}"}}', "values": good},
                {"series": f"{src.metric}_count{{{lab}}}", "values": total}]
    return [{"series": f'{src.metric}{{{lab}, {src.label}="{src.good[0]}"}}', "values": good},
            {"series": f'{src.metric}{{{lab}, {src.label}="{src.bad[-1]}"}}',
             "values": _bad(good, total)}]


def _bad(good: str, total: str) -> str:
    """Expanding notation of total - good for the two shapes unit_tests() uses."""
    return _BAD[(good, total)]


# (good, total) notations -> bad notation, one sample per minute
_HEALTHY = ("0+60x120", "0+60x120")          # 2 h, every event good
_OUTAGE = ("0+60x60 3600+0x30", "0+60x90")    # 1 h good, then 30 m of nothing good
_DEGRADED = ("0+54x120", "0+60x120")          # 10% bad for 2 h
_BAD = {_HEALTHY: "0+0x120", _OUTAGE: "0+0x60 0+60x30", _DEGRADED: "0+6x120"}


def unit_tests(sla: dict, rule_file: str = RULES_FILE) -> dict:
    """promtool test file: per objective, a healthy series fires nothing; an outage (from
    minute 60 no event is good: all slow or all failed) fires the fast-burn alert within
    15 minutes and not at minute 62; a 10% degradation fires the slow-burn alert, not the
    fast one. Each health alert: quiet at minute 2, firing at minute 5 on its trigger series."""
    got, _ = expressible(sla)
    tests = []
    for o, src in got:
        labels = _labels(o)
        name = camel(o["name"])

        def exp(suffix, window):
            long_w, short_w, factor = {b[3]: b[:3] for b in BURNS}[suffix]
            return {"exp_labels": {**labels, "severity": "page", "window": window},
                    "exp_annotations": _burn_annotations(o, long_w, short_w, factor)}

        tests.append({"interval": "1m", "input_series": _input_series(o, src, *_HEALTHY),
                      "alert_rule_test": [
                          {"eval_time": t, "alertname": f"{name}BudgetBurn{s}", "exp_alerts": []}
                          for t in ("30m", "2h") for s in ("Fast", "Slow")]})
        tests.append({"interval": "1m", "input_series": _input_series(o, src, *_OUTAGE),
                      "alert_rule_test": [
                          {"eval_time": "62m", "alertname": f"{name}BudgetBurnFast", "exp_alerts": []},
                          {"eval_time": "75m", "alertname": f"{name}BudgetBurnFast",
                           "exp_alerts": [exp("Fast", "1h/5m")]}]})
        tests.append({"interval": "1m", "input_series": _input_series(o, src, *_DEGRADED),
                      "alert_rule_test": [
                          {"eval_time": "2h", "alertname": f"{name}BudgetBurnFast", "exp_alerts": []},
                          {"eval_time": "2h", "alertname": f"{name}BudgetBurnSlow",
                           "exp_alerts": [exp("Slow", "6h/30m")]}]})
    for h in HEALTH:
        series, labels, values = h.trigger
        lab = dict(kv.split("=", 1) for kv in labels.split(", "))
        lab = {k: v.strip('"') for k, v in lab.items()}
        lab["instance"] = "127.0.0.1:9001"
        text = ", ".join(f'{k}="{v}"' for k, v in lab.items())
        summary = h.summary
        for k in ("job", "instance"):
            summary = summary.replace(f"{{{{ $labels.{k} }}}}", lab[k])
        tests.append({"interval": "1m", "input_series": [{"series": f"{series}{{{text}}}", "values": values}],
                      "alert_rule_test": [
                          {"eval_time": "2m", "alertname": h.name, "exp_alerts": []},
                          {"eval_time": "5m", "alertname": h.name, "exp_alerts": [
                              {"exp_labels": {**lab, "severity": h.severity},
                               "exp_annotations": {"summary": summary, "health": h.health,
                                                   "runbook": RUNBOOK}}]}]})
    return {"rule_files": [rule_file], "evaluation_interval": "1m", "tests": tests}


def _dump(doc: dict, header: str) -> str:
    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper, data):
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    _Dumper.add_representer(str, _str)
    return header + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000,
                              default_flow_style=False, allow_unicode=True)


def render(sla: dict, sla_name: str = "spark/sla.toml") -> dict[str, str]:
    """{file name: text} of the two generated files."""
    got, missing = expressible(sla)
    head = (f"# GENERATED by `python -m spark.promrules` from {sla_name}: do not edit by hand.\n"
            f"# Objectives with rules: {', '.join(o['name'] for o, _ in got) or 'none'}.\n"
            f"# Not expressible in the daemons' metrics: {', '.join(missing) or 'none'}.\n"
            f"# See {RUNBOOK}.\n")
    return {RULES_FILE: _dump(rules(sla), head),
            TESTS_FILE: _dump(unit_tests(sla), head.replace("do not edit by hand.",
                                                           "do not edit by hand (promtool test rules).", 1))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spark.promrules", description=__doc__.split("\n\n")[1])
    p.add_argument("--sla", metavar="FILE", help="objectives (default: spark/sla.toml)")
    p.add_argument("--out", metavar="DIR", default=str(DEFAULT_OUT),
                   help="where the two files go (default: deploy/prometheus)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 when the files in --out differ from the generated ones")
    args = p.parse_args(argv)
    files = render(load_sla(args.sla), args.sla or "spark/sla.toml")
    out = Path(args.out)
    stale = []
    for name, text in files.items():
        path = out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("out of date (run python -m spark.promrules): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
