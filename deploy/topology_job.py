"""relay-suite-demo --topology NAME: the main job on a namespace testnet, then the Spark
trace and SLA report with objectives derived from the topology's links.

    run_topology(args) -> exit code   (args: relay-suite-demo's parsed options)

Steps: the testnet job (deploy/testnet_job.py run_async: every node in its own network
namespace, the topology's links, the planned faults of deploy/testnet_job.py: the last
region partitioned `--partition` s and healed, an asymmetric link, a relay's host
unreachable, a relay rotated; every outcome accounted for) for the protocols `--only` / `--no-remp` / `--no-marlin` leave;
the SLA file WORKDIR/sla-<topology>.toml (deploy/objectives.py: the rate objectives of
spark/sla.toml, the latency objectives derived from the links and the nodes' placement);
the report (spark/report.py run) over WORKDIR/logs with that file, as the main job runs it.

Printed: the link model (regions, paths: one-way delay, jitter, loss, bandwidth), the faults,
the job's figures and its verdict rows, the report's stage latencies (p50/p90/p99/max, all
traffic) per protocol, and each objective's derived target, its derivation and the measured
figure (unplanned traffic, spark/plan.py). WORKDIR/launcher.json holds the same (topology,
rows, stages, sla, exit); WORKDIR/testnet.json the job's result.

Exit status: 2 when the testnet cannot run here (deploy.testnet.unavailable(): not root, no
ip/tc, no namespaces) or the topology does not load; 130 on SIGINT / SIGTERM; 0 when every
verdict row is ok and every objective passes (an objective of a protocol that ran with no
data fails); 1 otherwise. Every namespace and link is removed on every exit path.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

__all__ = ["run_topology", "stage_lines"]


def stage_lines(summary: dict) -> list[str]:
    """The report's stage latencies (summary.json `latency`), one line per (protocol, stage)."""
    out = []
    for r in summary.get("latency") or []:
        if not r.get("count"):
            continue

        def ms(v):
            return "-" if v is None else f"{v:.0f}"
        out.append(f"  {r['protocol']:7} {r['stage']:22} n={r['count']:<5} p50 {ms(r['p50_ms']):>6} "
                   f"p90 {ms(r['p90_ms']):>6} p99 {ms(r['p99_ms']):>6} max {ms(r['max_ms']):>6} ms"
                   + ("" if r.get("e2e") else "  (hop)"))
    return out


def run_topology(args) -> int:
    from daemon_runtime.daemons import LaunchError
    from deploy import launcher
    from deploy.objectives import objectives, sla_toml
    from deploy.testnet import (TestnetError, _install_signals, _lock_holder, guarded, leftovers,
                                load_topology, unavailable)
    from deploy.testnet_job import run_and_record

    why = unavailable()
    if why:
        print(f"relay-suite-demo: {why}", file=sys.stderr)
        return 2
    try:
        topo = load_topology(args.topology)
        protocols = [p for p in ("remp", "marlin", "rmb") if p in launcher.chosen_protocols(args)]
        if not args.no_report and not launcher.java_available():
            raise LaunchError("Java is missing: the Spark report needs a JDK 17 or 21 "
                              "(Debian: apt-get install openjdk-17-jre-headless), or pass --no-report")
        cfg = launcher.load_config(args.config)
    except TestnetError as exc:
        print(f"relay-suite-demo: {exc}", file=sys.stderr)
        return 2
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    workdir = Path(args.workdir or Path(cfg["cluster"]["workdir"]) / f"{time.strftime('%Y%m%d-%H%M%S')}-{topo.name}")
    _install_signals()
    result = guarded("relay-suite-demo", lambda: run_and_record(topo, protocols, workdir, float(args.partition)),
                     (TestnetError, LaunchError))
    if isinstance(result, int):
        return result
    rows = [{"name": k, "ok": bool(ok), "detail": detail} for k, (ok, detail) in result["verdict"].items()]
    regions = {name: n["region"] for name, n in result["topology"]["nodes"].items()}
    derived = {o["name"]: o for o in objectives(topo, regions)}
    sla_path = workdir / f"sla-{topo.name}.toml"
    sla_path.write_text(sla_toml(topo, regions))
    out = {"topology": result["topology"], "rows": rows, "stages": [], "sla": [], "exit": 0,
           "rmb_expired": (result.get("rmb") or {}).get("expired")}
    failed = [r["name"] for r in rows if not r["ok"]]
    if not args.no_report:
        import spark.report as spark_report
        if hasattr(spark_report, "quiet_jvm"):
            spark_report.quiet_jvm()
        rep = workdir / "report"
        summary = spark_report.run([str(p) for p in sorted((workdir / "logs").glob("*.jsonl"))], str(rep),
                                   args.master, str(sla_path))
        out["stages"] = summary.get("latency") or []
        print(f"\nstage latencies on topology {topo.name} (report, all traffic, ms):")
        print("\n".join(stage_lines(summary)))
        print(f"\nSLA objectives ({sla_path.name}: derived from the links of {topo.name}; unplanned traffic):")
        for name, ok in launcher.sla_results(summary, set(protocols)):
            entry = next((e for e in summary.get("sla") or [] if (e.get("objective") or e.get("name")) == name), {})
            verdict = "no data" if ok is None else "pass" if ok else "FAIL"
            how = derived.get(name, {}).get("derived", "spark/sla.toml")
            print(f"  {name:26} {verdict:7} measured {entry.get('actual')} (n={entry.get('samples')}) "
                  f"vs {entry.get('target_text')}  <- {how}")
            out["sla"].append({"objective": name, "ok": ok, "actual": entry.get("actual"),
                               "target": entry.get("target"), "derived": how})
            if ok is False:
                failed.append(name)
        print(f"\nreport: {rep / 'report.html'}\nsummary: {rep / 'summary.json'}")
    out["exit"] = 1 if failed else 0
    (workdir / "launcher.json").write_text(json.dumps(out, indent=1, sort_keys=True, default=str))
    # a testnet started by someone else once this one released the lock is theirs
    left = leftovers() if not _lock_holder() else []
    if left:
        failed.append(f"left behind: {left}")
        out["exit"] = 1
    exp = out["rmb_expired"]
    expired = (f"; RMB expired {exp['expired']}: {exp['inside']} inside planned fault windows, "
               f"{exp['outside']} outside, {exp['outlived']} outlived their window" if exp else "")
    print(f"result: {'FAIL: ' + ', '.join(failed) if failed else 'ok'} (rows {sum(r['ok'] for r in rows)}/"
          f"{len(rows)} ok, SLA {sum(1 for s in out['sla'] if s['ok'])}/{len(out['sla'])} pass; "
          f"topology {topo.name}, partition {args.partition:g} s{expired})")
    return out["exit"]
