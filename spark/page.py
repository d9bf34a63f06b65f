"""The report page: one self-contained HTML file, charts as inline SVG (matplotlib, Agg).

`render(summary, slow_traces) -> str`. No external URL, script, font or stylesheet: SVG
namespace declarations and matplotlib's RDF metadata are stripped (an HTML5 parser puts
inline <svg> in the SVG namespace by itself), so the file contains no `http://` at all.
"""
from __future__ import annotations

import html
import io
import re

import matplotlib

matplotlib.use("Agg")
from matplotlib import pyplot as plt  # noqa: E402

matplotlib.rcParams["svg.fonttype"] = "none"
matplotlib.rcParams["svg.hashsalt"] = "relay-trace-report"

_STRIP = [
    (re.compile(r"<\?xml[^>]*\?>\s*"), ""),
    (re.compile(r"<!DOCTYPE[^>]*>\s*", re.S), ""),
    (re.compile(r"<metadata>.*?</metadata>\s*", re.S), ""),
    (re.compile(r'\s+xmlns(:\w+)?="[^"]*"'), ""),
]


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    for rx, rep in _STRIP:
        text = rx.sub(rep, text)
    return text


def latency_chart(latency: list[dict]) -> str:
    """p50/p90/p99 per stage on a log axis. A stage whose figure is 0 ms (e.g. the relay's
    `forwarded`: received and delivered in one event) gets no bar, only a "0" mark: a log
    axis has no zero, and a bar to the axis floor would read as a real duration."""
    rows = [r for r in latency if r["count"]]
    if not rows:
        return "<p>No stage durations.</p>"
    labels = [f"{r['protocol']}:{r['stage']}" + (" (e2e)" if r["e2e"] else "") for r in rows]
    positive = [r[k] for r in rows for k in ("p50_ms", "p90_ms", "p99_ms") if (r[k] or 0) > 0]
    lo = min(positive) / 2 if positive else 0.01
    fig, ax = plt.subplots(figsize=(9, 0.36 * len(rows) + 1.6))
    y = range(len(rows))
    for key, colour, off in (("p99_ms", "#d62728", -0.27), ("p90_ms", "#ff7f0e", 0.0),
                             ("p50_ms", "#1f77b4", 0.27)):
        pos = [(i + off, r[key]) for i, r in zip(y, rows) if (r[key] or 0) > 0]
        ax.barh([p[0] for p in pos], [p[1] for p in pos], height=0.26, color=colour,
                label=key.replace("_ms", ""))
        for i, r in zip(y, rows):
            if r[key] is not None and r[key] <= 0:
                ax.text(lo, i + off, " 0", va="center", ha="left", fontsize=6, color=colour)
    ax.set_xscale("log")
    ax.set_xlim(left=lo)
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms (log scale; a '0' mark = 0 ms, no bar)")
    # legend above the axes, outside the data
    ax.legend(fontsize=8, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.set_title("Latency per stage", pad=22)
    return _svg(fig)


def delivery_chart(delivery: dict) -> str:
    if not delivery:
        return "<p>No traces.</p>"
    protos = sorted(delivery)
    keys = ("answered", "errored", "expired", "lost_or_stuck", "in_flight")
    colours = ("#2ca02c", "#d62728", "#9467bd", "#7f7f7f", "#bcbd22")
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(protos) + 1.2))
    left = [0] * len(protos)
    for key, colour in zip(keys, colours):
        vals = [delivery[p].get(key, 0) for p in protos]
        ax.barh(protos, vals, left=left, color=colour, label=key)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_xlabel("traces (per destination)")
    # legend above the axes, outside the data and clear of the axis label
    ax.legend(fontsize=8, ncol=5, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.set_title("Delivery outcome", pad=22)
    return _svg(fig)


_PROTO_COLOURS = {"rmb": "#1f77b4", "remp": "#ff7f0e", "marlin": "#2ca02c"}


def timeline_chart(timeline: list[dict], cpu: dict | None, sla: list[dict] | None = None) -> str:
    """Two panels over one time axis (seconds since the first point): the slowest
    end-to-end sample per second and stage (log ms) above, the host's CPU below (percent of
    all cores busy, the demo's own share filled, the saturation threshold dashed). The
    breach windows of objectives missed while the host was saturated are shaded red on
    both, labelled with the objective and its verdict."""
    samples = (cpu or {}).get("samples") or []
    if not timeline and not samples:
        return "<p>No latency samples and no CPU samples.</p>"
    t_all = [r["t_us"] for r in timeline] + [s["ts_us"] for s in samples]
    t0 = min(t_all)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 5.6), sharex=True,
                                   gridspec_kw={"height_ratios": [3, 2]})
    series: dict[tuple[str, str], list] = {}
    for r in timeline:
        series.setdefault((r["protocol"], r["stage"]), []).append(r)
    styles = ["-", "--", ":", "-."]
    for j, ((proto, stage), rows) in enumerate(sorted(series.items())):
        xs = [(r["t_us"] - t0) / 1e6 for r in rows]
        ys = [max(r["max_ms"], 0.01) for r in rows]
        ax1.plot(xs, ys, styles[j % len(styles)], marker=".", markersize=3, linewidth=1,
                 color=_PROTO_COLOURS.get(proto), label=f"{proto}:{stage}")
    if timeline:
        ax1.set_yscale("log")
    ax1.set_ylabel("slowest per s (ms)")
    ax1.set_title("Latency (end-to-end stages) and host CPU over time")
    ax1.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if samples:
        xs = [(s["ts_us"] - t0) / 1e6 for s in samples]
        ax2.fill_between(xs, [s["cpu_pct"] for s in samples], step="pre", color="#bbbbbb",
                         label="host: all processes")
        ax2.fill_between(xs, [min(s["demo_pct"], 100.0) for s in samples],
                         step="pre", color="#1f77b4", alpha=0.7, label="the demo's processes")
        thr = (cpu or {}).get("saturated_pct", 90)
        ax2.axhline(thr, color="#d62728", linestyle="--", linewidth=1,
                    label=f"saturated ({thr:g}% of the cores)")
        ax2.set_ylim(0, 105)
        cores = (cpu or {}).get("cores")
        ax2.set_ylabel(f"CPU, % of {cores} cores" if cores else "CPU, % of all cores")
        ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    else:
        ax2.text(0.5, 0.5, "no CPU samples in the logs", ha="center", va="center",
                 transform=ax2.transAxes, fontsize=9, color="#555")
    ax2.set_xlabel("seconds since the first sample")
    for res in sla or []:
        sat = res.get("saturation")
        if res.get("verdict") != "missed, host saturated" or not sat:
            continue
        for k, (a, b) in enumerate(sat.get("windows") or []):
            for ax in (ax1, ax2):
                ax.axvspan((a - t0) / 1e6, max((b - t0) / 1e6, (a - t0) / 1e6 + 0.2),
                           color="#d62728", alpha=0.12, linewidth=0)
            if k == 0:
                ax1.text((a - t0) / 1e6, 1.0, f" {res['name']}: {res.get('verdict')}",
                         transform=ax1.get_xaxis_transform(), fontsize=7, color="#d62728",
                         va="top")
    return _svg(fig)


def waterfall(trace: dict, labels: dict[str, str] | None = None) -> str:
    hops = trace["hops"]
    if not hops:
        return ""
    import datetime as dt
    labels = labels or {}
    t = [dt.datetime.fromisoformat(h["ts"].rstrip("Z")) for h in hops]
    t0 = min(t)
    start = [(x - t0).total_seconds() * 1000 for x in t]
    width = [h["spent_ms"] or 0 for h in hops]
    names = [f"{h['step']} @{labels.get(h['node'], h['node'])}" for h in hops]
    fig, ax = plt.subplots(figsize=(9, 0.25 * len(hops) + 1))
    ax.barh(range(len(hops)), [max(w, 0.0) for w in width], left=start, color="#1f77b4")
    ax.plot(start, range(len(hops)), "k|")
    ax.set_yticks(range(len(hops)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms since first hop")
    ax.set_title(f"{trace['protocol']} {trace['stage']} {trace['duration_ms']:.1f} ms", fontsize=9)
    return _svg(fig)


#: What the columns of the per-protocol tables count (spark/report.py, protocol_summary).
_PROTO_NOTES = {
    "remp": "outcomes: the final outcome per message; receipts_produced: distinct (message, "
            "validator, status) receipts the validators logged; receipts_delivered: those the "
            "full node logged from that validator; duplicates: statuses logged twice by one "
            "process.",
    "remp_fullnodes": "accepted: messages the full node took (202); refused_for_load: new "
                      "messages it refused at its bound (503 with Retry-After, GraphQL "
                      "BACKPRESSURE; by reason: pending_full = --max-pending, client_rate = "
                      "--client-rate). A refused message was not accepted: it is no failure, "
                      "the client retries it (often at another full node).",
    "marlin": "rebuilt: (block, consumer) pairs with a rebuilt block; chunks_sent / "
              "chunks_received / acks: counts of those events (a chunk relayed to several "
              "consumers is received several times, so received can exceed sent); "
              "chunks_lost: chunks a consumer "
              "that neither rebuilt nor disputed the block never received; missing_acks: "
              "chunks sent without an acknowledgement.",
}


def _table(rows: list[dict], cols: list[str] | None = None, left=(), raw=()) -> str:
    """HTML table; `left`: left-aligned columns (text); `raw`: columns already HTML."""
    if not rows:
        return "<p>none</p>"
    cols = cols or list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)

    def cell(r, c):
        v = r.get(c)
        text = str(v) if c in raw else html.escape(_fmt(v))
        return f"<td class='l'>{text}</td>" if c in left else f"<td>{text}</td>"
    body = "".join("<tr>" + "".join(cell(r, c) for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {x}" for k, x in v.items())
    return str(v)


_CSS = """body{font-family:sans-serif;margin:1.5em;max-width:1200px}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:2px 8px;
font-size:13px;text-align:right}th{background:#eee}.pass{color:#2ca02c}.fail{color:#d62728}
td.l{text-align:left}code{font-size:12px}.banner{padding:.6em 1em;border-radius:4px;
font-size:16px}.ok{background:#e6f4e6}.bad{background:#fbe3e3}.note{color:#555;font-size:13px}"""


def _clock_text(clock: dict, label) -> str:
    tol = clock.get("tolerance_ms", 0)
    shared = clock.get("shared_hosts") or {}
    text = ""
    if shared:
        hosts = "; ".join(f"{len(ns)} nodes on {html.escape(h)}" for h, ns in shared.items())
        text = (f"<p>Processes on one host share its clock, so their timestamps are never "
                f"corrected against each other ({hosts}; the demo plan names each node's host).")
        lo = clock.get("log_order")
        if lo:
            text += (f" The most negative receive - send delta between two of them, "
                     f"{lo['min_delta_ms']:.3f} ms ({html.escape(label(lo['from']))} -> "
                     f"{html.escape(label(lo['to']))}), is the order the two processes wrote "
                     f"their log lines (a daemon logs a batch's events after handling the "
                     f"batch), not skew.")
        text += "</p>"
        if clock.get("cross_pairs") == 0:     # every causal pair within one host
            return text
    return text + _skew_text(clock, label, tol)


def _skew_text(clock: dict, label, tol) -> str:
    if not clock["consistent"]:
        return ("<p>The causal pairs contradict each other (a clock stepped during the run?): "
                "no timestamps were corrected; durations across processes are as logged.</p>")
    if not clock["corrections_ms"]:
        return (f"<p>No clock skew proven: every message was logged as received after it was "
                f"logged as sent (within {tol:g} ms), so all timestamps are used as logged. "
                f"Processes on one host share its clock; a receive logged up to {tol:g} ms "
                f"before its send is the order two processes wrote their log lines, not skew."
                f"</p>")
    items = ", ".join(f"{html.escape(label(n))} {v:+.3f} ms" for n, v in clock["corrections_ms"].items())
    return (f"<p>Clock skew proven and corrected: {items} added to those nodes' timestamps. "
            f"Proof: a message was logged as received before it was logged as sent, by more "
            f"than {tol:g} ms; the correction is the midpoint of what both directions allow "
            f"(or the smallest shift that makes the fastest message take 0 ms). Rows below: "
            f"d = min(receive - send) from node to peer, d_back the other way.</p>")


def _verdict_text(s: dict) -> str:
    """'met', 'missed', or 'missed, host saturated (host 97% busy during the breach;
    busiest: a 95% of a core, ...)'."""
    v = s.get("verdict")
    if not v:
        return ""
    sat = s.get("saturation")
    if v == "missed, host saturated" and sat:
        from spark.cpu import busiest_text
        return (f"{v} (host {sat['host_pct']:.0f}% of its cores busy during the breach; "
                f"busiest, in % of one core: {busiest_text(sat)})")
    if v == "missed" and sat:
        return f"{v} (host {sat['host_pct']:.0f}% busy during the breach: not saturated)"
    return v


def _failure_rows(rows: list[dict], label) -> list[dict]:
    return [{"protocol": f["protocol"], "trace": f["trace_id"],
             "branch": label(f["branch"]) if f["branch"] else "",
             "outcome": f["outcome"] + (f" {f['error_code']}" if f.get("error_code") else ""),
             "late reply": "yes" if f.get("late") else ""} for f in rows]


def render_charts(summary: dict, slow_traces: list[dict]) -> dict[str, str]:
    """The page's charts (matplotlib, the slow part of the page) as SVG text, keyed
    `delivery`, `latency`, `timeline` and `trace:<id>`; reads only summary's `delivery`,
    `latency`, `timeline`, `cpu`, `sla` and plan labels, so the report renders them in a
    thread while Spark writes its outputs."""
    labels = summary.get("plan", {}).get("labels", {})
    out = {"delivery": delivery_chart(summary["delivery"]),
           "latency": latency_chart(summary["latency"]),
           "timeline": timeline_chart(summary.get("timeline") or [], summary.get("cpu"),
                                      summary.get("sla"))}
    for t in slow_traces:
        if t.get("chart"):
            out["trace:" + t["trace_id"]] = waterfall(t, labels)
    return out


def render(summary: dict, slow_traces: list[dict], charts: dict[str, str] | None = None) -> str:
    """The whole page as a string (see module doc); charts: render_charts' result for this
    summary (computed here when None)."""
    labels = summary.get("plan", {}).get("labels", {})
    if charts is None:
        charts = render_charts(summary, slow_traces)

    def label(n):
        return labels.get(n, n) if n is not None else ""
    sla = summary["sla"]
    failed = [s for s in sla if s["status"] == "fail"]
    judged = [s for s in sla if s["status"] in ("pass", "fail")]
    fails = summary.get("failures", {"planned": [], "unplanned": []})
    sla_rows = [{"objective": s["name"], "counts": s.get("counts"),
                 "target": s.get("target_text"), "value": s["actual"], "unit": s.get("unit"),
                 "samples": s["samples"], "status": s["status"],
                 "verdict": _verdict_text(s),
                 "error budget spent (x budget)": s["budget_used"]} for s in sla]
    delivery_rows = []
    for p, d in sorted(summary["delivery"].items()):
        for scope in ("unplanned", "planned"):
            part = d.get(scope) or {}
            delivery_rows.append({"protocol": p, "traffic": scope, **{
                k: part.get(k) for k in ("sent", "delivered", "answered", "errored", "expired",
                                         "lost_or_stuck", "in_flight", "late")},
                "errored by code": part.get("errored_by_code")})
    ingest = summary["ingest"]
    if not judged:
        banner = "<p class='banner'>No SLA objective had data.</p>"
    elif failed:
        banner = (f"<p class='banner bad'>{len(failed)} of {len(judged)} SLA objectives FAIL: "
                  f"{html.escape(', '.join(s['name'] for s in failed))}. Unplanned failures: "
                  f"{len(fails['unplanned'])}.</p>")
        saturated = [s for s in failed if s.get("verdict") == "missed, host saturated"]
        if saturated:
            banner += "".join(
                f"<p class='banner bad saturated'>{html.escape(s['name'])}: "
                f"{html.escape(_verdict_text(s))}.</p>" for s in saturated)
    else:
        banner = (f"<p class='banner ok'>All {len(judged)} SLA objectives with data pass. "
                  f"Unplanned failures: {len(fails['unplanned'])}; planned (the demo's injected "
                  f"faults): {len(fails['planned'])}.</p>")
    extra = []
    for proto in ("remp", "marlin"):
        if proto in summary:
            extra += [f"<h3>{proto.upper()}</h3>", _table([summary[proto]]),
                      f"<p class='note'>{_PROTO_NOTES[proto]}</p>"]
        if proto == "remp" and summary.get("remp_fullnodes"):
            extra += ["<h4>REMP full nodes</h4>",
                      _table(summary["remp_fullnodes"], left=("full_node",)),
                      f"<p class='note'>{_PROTO_NOTES['remp_fullnodes']}</p>"]
    faults = [{"fault": f["fault"], "target": f["target"], "from": f["start"], "to": f["end"]}
              for f in summary.get("plan", {}).get("faults", [])]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>relay-suite trace report"
        f"</title><style>{_CSS}</style></head><body>",
        "<h1>relay-suite trace and SLA report</h1>", banner,
        f"<p>Traces: {html.escape(_fmt(summary['traces']))}</p>",
        f"<details><summary>Inputs ({len(summary['inputs'])} files)</summary><ul>"
        + "".join(f"<li><code>{html.escape(i)}</code></li>" for i in summary["inputs"])
        + "</ul></details>",
        "<h2>SLA</h2>",
        "<p class='note'>Objectives judge unplanned traffic unless their counts column says "
        "otherwise. Error budget spent: the fraction of the objective's error budget used "
        "(1 = all of it; over 1 = exceeded).</p>",
        _table(sla_rows, left=("objective", "counts", "target", "unit", "status", "verdict")),
        "<h2>Latency and CPU over time</h2>",
        "<p class='note'>Above: the slowest end-to-end sample per second of each stage (every "
        "message, the planned faults' included, as in the latency table below). "
        "Below: the host's CPU (percent of all its cores busy, every process of the machine) "
        "and the demo's own processes' share, sampled every second by the launcher. "
        f"An objective missed while the host was at or above "
        f"{_fmt((summary.get('cpu') or {}).get('saturated_pct', 90))}% on average during its "
        "breach (the samples over its limit: the red spans) is reported as "
        "\"missed, host saturated\" with the busiest processes: still a failure.</p>",
        charts.get("timeline", ""),
        "<h2>Failures</h2>",
        "<h3>Unplanned</h3>",
        _table(_failure_rows(fails["unplanned"], label), left=("protocol", "trace", "branch", "outcome")),
        "<h3>Planned (the demo's injected faults)</h3>",
        _table(faults) if faults else "",
        _table(_failure_rows(fails["planned"], label), left=("protocol", "trace", "branch", "outcome")),
        "<h2>Delivery</h2>", charts["delivery"],
        _table(delivery_rows, left=("protocol", "traffic")),
        *extra,
        "<h2>Latency</h2>",
        "<p class='note'>Every message, the demo's planned faults included (a request held "
        "across a relay restart counts here); the SLA objectives above judge unplanned traffic "
        "unless their counts column says otherwise, so an objective's value can be far below "
        "this table's p99. e2e: an end-to-end "
        "stage (what a user waits for: a round trip, a first receipt, a rebuilt block); the "
        "others are its hops.</p>",
        charts["latency"],
        _table(summary["latency"], left=("protocol", "stage")),
        "<h2>Slowest traces</h2>",
        "<p class='note'>Look one up: <code>relay-trace-report --out DIR --trace ID</code>.</p>",
        _table([{"protocol": t["protocol"], "trace": f"<a href='#trace-{html.escape(t['trace_id'])}'>"
                 f"{html.escape(t['trace_id'])}</a>", "stage": t["stage"],
                 "ms": t["duration_ms"], "hops": len(t["hops"])} for t in slow_traces],
               left=("protocol", "trace", "stage"), raw=("trace",)),
    ]
    for t in slow_traces:
        parts.append(f"<section id='trace-{html.escape(t['trace_id'])}'><h3>{html.escape(t['protocol'])} "
                     f"<code>{html.escape(t['trace_id'])}</code></h3>")
        parts.append(_table([{**h, "node": label(h["node"]), "branch": label(h["branch"])}
                             for h in t["hops"]], ["seq", "step", "branch", "node", "ts", "spent_ms"],
                            left=("step", "branch", "node", "ts")))
        if t.get("chart"):
            parts.append(charts["trace:" + t["trace_id"]])
        parts.append("</section>")
    parts += [
        "<h2>Clock alignment</h2>", _clock_text(summary["clock"], label),
        _table([{**p, "node": label(p["node"]), "peer": label(p["peer"])}
                for p in summary["clock"]["proofs"]]) if summary["clock"]["proofs"] else "",
        "<h2>Ingest</h2>",
        _table([{"torn lines": ingest["torn_lines"], "bad lines": ingest["bad_lines"],
                 "unknown events": ingest["unknown_events"],
                 "untraced events": ingest["untraced_events"]}]),
        "</body></html>"]
    return "\n".join(parts)
