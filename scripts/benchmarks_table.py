"""Regenerates docs/benchmarks.md from the committed results in bench/results/*.json.

    python scripts/benchmarks_table.py            # rewrite docs/benchmarks.md
    python scripts/benchmarks_table.py --check    # exit 1 (and say so) when it is out of date

Each result file is one benchmark run as written by `bench/result_file.py` (`write_result`):
name, command, commit, date, cores, load_average, figures, baseline, ratio, source, notes.
The page has one section per benchmark (in the order of BENCHMARKS, then any other name):
what it measures and its baseline, a table of its runs (newest first) and a table of their
figures (one row per figure, one column per run; the newest MAX_RUNS runs). The output
depends only on the JSON files, so it is reproducible and a test checks it is up to date.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
OUT = REPO / "docs" / "benchmarks.md"
MAX_RUNS = 8

#: name -> (command, what it measures, baseline measured in the same run)
BENCHMARKS: dict[str, tuple[str, str, str]] = {
    "relay": ("bench/bench_relay.py",
              "RMB relay envelopes/s, 1 KiB payloads, local route; relay and baseline rounds "
              "alternate (ABAB); server CPU per envelope",
              "a raw websockets forwarder"),
    "roundtrip": ("bench/bench_roundtrip.py",
                  "app -> peer -> relay -> peer -> service and back: max requests/s (ABAB with "
                  "the echo), p50/p99 at 1,000/s, CPU per round trip per process, the bound the "
                  "protocol's mandatory work puts on the ratio",
                  "a bare Redis LPUSH/BRPOP echo"),
    "connections": ("bench/bench_connections.py",
                    "10,000 concurrent authenticated connections on one relay: RSS per "
                    "connection, control round trip p99",
                    "the same round trip on an idle relay"),
    "remp_propagation": ("bench/bench_remp_propagation.py",
                         "datagrams per external message to spread it through the RMQ, N = 4, 7, 16",
                         "the seed's 2N..3N target and naive N^2"),
    "remp_udp": ("bench/bench_remp_udp.py",
                 "REMP transport (authenticated, fragmenting) request/response p50/p99, max "
                 "rate; receipt delivery CPU",
                 "a raw asyncio UDP request/response"),
    "remp_daemon": ("bench/bench_remp_daemon.py",
                    "REMP network of processes (2 x 7 validators + full node): first receipt "
                    "and Finalized p50/p99, lost, datagrams per message, CPU per message over "
                    "every process",
                    "a raw asyncio UDP round trip"),
    "remp_fullnode": ("bench/bench_remp_fullnode.py",
                      "the full node's receipt path in one process: CPU per status, statuses/s "
                      "and messages/s on one core",
                      "one receipt packet's ed25519 verify + decode and one event-log line"),
    "remp_floor": ("bench/bench_remp_floor.py",
                   "the CPU the protocol's required per-message work costs, piece by piece, "
                   "and the rate that leaves on this machine's cores",
                   "none (each piece timed alone)"),
    "remp_sim": ("bench/bench_remp_sim.py",
                 "the REMP cores in one process on a fake clock: CPU per message, Finalized "
                 "p50/p99 in simulated time, datagrams per message",
                 "the run's own ed25519 verifies and signs, counted and timed"),
    "marlin_coding": ("bench/bench_marlin_coding.py",
                      "erasure coding of 1 MiB blocks through marlin_cluster.coding",
                      "pyeclib called directly"),
    "marlin_validate": ("bench/bench_marlin_validate.py",
                        "a consumer's Bitcoin block validation (block 413567, 1 MB)",
                        "python-bitcoinlib's deserialize + CheckBlock"),
    "marlin_relay": ("bench/bench_marlin_relay.py",
                     "a 1 MiB block producer -> member -> member -> consumer: p50/p99, highest "
                     "block rate with p99 <= 200 ms, CPU per block",
                     "raw TCP along the same hops"),
    "qa_saturation": ("qa/saturation.py",
                      "per protocol and topology (loopback with the topology's link model): the "
                      "highest rate whose p99 meets spark/sla.toml, then 80% of it: p50/p99, "
                      "lost, CPU per message per process",
                      "qa/baseline-<protocol>-<topology>.json (a change beyond 10% in CPU per "
                      "message or loss is a regression)"),
    "spark_report": ("bench/bench_spark_report.py",
                     "the Spark report's wall time on the demo's log size and, on local[2], "
                     "over 1 or 5 million events from compacted Parquet, with peak memory",
                     "DuckDB computing the same tables"),
}


def load_results(results_dir: Path = RESULTS) -> list[dict]:
    """Every bench/results/*.json, each with `_file` (its name) added; ValueError names a
    file that is not a result."""
    out = []
    for path in sorted(results_dir.glob("*.json")):
        try:
            r = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path.name}: not JSON ({e})") from None
        if not isinstance(r, dict) or not isinstance(r.get("name"), str) \
                or not isinstance(r.get("figures"), dict):
            raise ValueError(f"{path.name}: not a benchmark result (needs name and figures)")
        r["_file"] = path.name
        out.append(r)
    return out


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        a = abs(v)
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 100:
            return f"{v:.1f}"
        if a >= 10:
            return f"{v:.1f}"
        return f"{v:.3g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _commit(c) -> str:
    if not c:
        return "-"
    dirty = c.endswith("+dirty")
    h = c[:-6] if dirty else c
    return f"`{h[:10]}`" + (" +dirty" if dirty else "")


def _load(la) -> str:
    return " / ".join("-" if x is None else fmt(float(x)) for x in la) if la else "-"


def _cores(c) -> str:
    if isinstance(c, dict):
        n, u = c.get("count"), c.get("usable")
        return f"{n}" if u in (None, n) else f"{u} of {n}"
    return fmt(c)


def _source(r: dict) -> str:
    s = r.get("source") or "measured"
    cf = r.get("converted_from")
    if isinstance(cf, dict) and cf.get("file"):
        s += f" ({cf['file']} at `{str(cf.get('commit', ''))[:10]}`)"
    return s


def render(results: list[dict]) -> str:
    by_name: dict[str, list[dict]] = {}
    for r in results:
        by_name.setdefault(r["name"], []).append(r)
    names = [n for n in BENCHMARKS if n in by_name] + sorted(n for n in by_name if n not in BENCHMARKS)
    lines = [
        "# Benchmarks",
        "",
        "<!-- generated by scripts/benchmarks_table.py from bench/results/*.json: do not edit;",
        "     run `python scripts/benchmarks_table.py` after adding a result -->",
        "",
        "Every benchmark under `bench/` prints its figures next to a baseline measured in the same",
        "run and writes them to `bench/results/<name>-<UTC time>.json` (`bench/result_file.py`:",
        "command, commit, date, cores, load average, figures, baseline, ratio). Commit the results",
        "worth keeping and regenerate this page with `python scripts/benchmarks_table.py`",
        "(`tests/test_benchmarks_table.py` fails when it is out of date). Why a figure moved belongs",
        "in the commit message that moved it. Run benchmarks on a quiet machine (`flock` a shared",
        "lock file when several people share one) and read the load average beside each run.",
        "",
        "Figure names carry their unit (`_ms`, `_us`, `_s`, `_per_s`, `_mib_s`, `_mb`) and, after",
        "`@`, the parameter they were measured at. Results with the source \"converted from earlier",
        "prose\" were typed in from the documentation of the commit named, not measured again.",
        "",
        "| benchmark | command | runs | newest |",
        "|---|---|---|---|",
    ]
    for n in names:
        cmd = BENCHMARKS.get(n, ("-",))[0]
        runs = by_name[n]
        newest = max(r.get("date") or "" for r in runs)
        lines.append(f"| [{n}](#{n.replace('_', '-')}) | `{cmd}` | {len(runs)} | {newest[:10]} |")
    for n in names:
        runs = sorted(by_name[n], key=lambda r: (r.get("date") or "", r["_file"]), reverse=True)
        lines += ["", f"## {n.replace('_', '-')}", ""]
        if n in BENCHMARKS:
            cmd, what, base = BENCHMARKS[n]
            lines += [f"`{cmd}`: {what}. Baseline: {base}.", ""]
        shown = runs[:MAX_RUNS]
        lines += ["| run | date (UTC) | commit | cores | load 1 / 5 / 15 min | source | command |",
                  "|---|---|---|---|---|---|---|"]
        for i, r in enumerate(shown, 1):
            lines.append(f"| {i} | {(r.get('date') or '-').replace('T', ' ').rstrip('Z')} | "
                         f"{_commit(r.get('commit'))} | {_cores(r.get('cores'))} | "
                         f"{_load(r.get('load_average'))} | {_cell(_source(r))} | "
                         f"`{_cell(r.get('command') or '-')}` |")
        if len(runs) > len(shown):
            lines += ["", f"{len(runs) - len(shown)} older runs are in `bench/results/` ({n}-*.json)."]
        notes = [(i, r["notes"]) for i, r in enumerate(shown, 1) if r.get("notes")]
        if notes:
            lines.append("")
            lines += [f"- run {i}: {_cell(t)}" for i, t in notes]
        keys: list[tuple[str, str]] = []
        for kind in ("figures", "baseline", "ratio"):
            for r in shown:
                for k in (r.get(kind) or {}):
                    if (kind, k) not in keys:
                        keys.append((kind, k))
        lines += ["", "| figure | " + " | ".join(f"run {i}" for i in range(1, len(shown) + 1)) + " |",
                  "|---|" + "---|" * len(shown)]
        for kind, k in keys:
            label = k if kind == "figures" else f"{kind}: {k}"
            vals = [fmt((r.get(kind) or {}).get(k)) if k in (r.get(kind) or {}) else "" for r in shown]
            lines.append(f"| {_cell(label)} | " + " | ".join(vals) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/benchmarks.md is out of date")
    ap.add_argument("--results", type=Path, default=RESULTS, help="results directory (default bench/results)")
    ap.add_argument("--out", type=Path, default=OUT, help="page to write (default docs/benchmarks.md)")
    a = ap.parse_args(argv)
    text = render(load_results(a.results))
    if a.check:
        current = a.out.read_text() if a.out.exists() else ""
        if current != text:
            print(f"{a.out.name} is out of date: run python scripts/benchmarks_table.py", file=sys.stderr)
            return 1
        print(f"{a.out.name} is up to date")
        return 0
    a.out.write_text(text)
    print(f"wrote {a.out.relative_to(REPO) if a.out.is_relative_to(REPO) else a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
