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
    rows = [r for r in latency if r["count"]]
    if not rows:
        return "<p>No stage durations.</p>"
    labels = [f"{r['protocol']}:{r['stage']}" + (" (e2e)" if r["e2e"] else "") for r in rows]
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(rows) + 1.2))
    y = range(len(rows))
    floor = 0.001
    for key, colour, h, off in (("p99_ms", "#d62728", 0.26, -0.27), ("p90_ms", "#ff7f0e", 0.26, 0.0),
                                ("p50_ms", "#1f77b4", 0.26, 0.27)):
        ax.barh([i + off for i in y], [max(r[key] or 0, floor) for r in rows], height=h,
                color=colour, label=key.replace("_ms", ""))
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ms (log scale)")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("Latency per stage")
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
    ax.legend(fontsize=8, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    ax.set_title("Delivery outcome")
    return _svg(fig)


def waterfall(trace: dict) -> str:
    hops = trace["hops"]
    if not hops:
        return ""
    import datetime as dt
    t = [dt.datetime.fromisoformat(h["ts"].rstrip("Z")) for h in hops]
    t0 = min(t)
    start = [(x - t0).total_seconds() * 1000 for x in t]
    width = [h["spent_ms"] or 0 for h in hops]
    labels = [f"{h['step']} @{h['node']}" for h in hops]
    fig, ax = plt.subplots(figsize=(8, 0.25 * len(hops) + 1))
    ax.barh(range(len(hops)), [max(w, 0.0) for w in width], left=start, color="#1f77b4")
    ax.plot(start, range(len(hops)), "k|")
    ax.set_yticks(range(len(hops)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms since first hop")
    ax.set_title(f"{trace['protocol']} {trace['trace_id'][:24]} ({trace['stage']} "
                 f"{trace['duration_ms']:.1f} ms)", fontsize=9)
    return _svg(fig)


def _table(rows: list[dict], cols: list[str] | None = None) -> str:
    if not rows:
        return "<p>none</p>"
    cols = cols or list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in cols)
                   + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {x}" for k, x in v.items())
    return str(v)


_CSS = """body{font-family:sans-serif;margin:1.5em;max-width:1100px}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:2px 8px;
font-size:13px;text-align:right}th{background:#eee}.pass{color:#2ca02c}.fail{color:#d62728}"""


def render(summary: dict, slow_traces: list[dict]) -> str:
    """The whole page as a string (see module doc)."""
    sla_rows = [{**s, "status": s["status"]} for s in summary["sla"]]
    delivery_rows = [{"protocol": p, **{k: v for k, v in d.items() if k != "protocol"}}
                     for p, d in sorted(summary["delivery"].items())]
    ingest = summary["ingest"]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>relay-suite trace report"
        f"</title><style>{_CSS}</style></head><body>",
        "<h1>relay-suite trace and SLA report</h1>",
        f"<p>Inputs: {html.escape(', '.join(summary['inputs']))}</p>",
        f"<p>Traces: {html.escape(_fmt(summary['traces']))}</p>",
        "<h2>SLA</h2>",
        _table(sla_rows, ["name", "protocol", "stage", "target", "actual", "samples", "status",
                          "budget_used"]),
        "<h2>Latency</h2>", latency_chart(summary["latency"]),
        _table(summary["latency"]),
        "<h2>Delivery</h2>", delivery_chart(summary["delivery"]), _table(delivery_rows),
        "<h2>Clock alignment</h2>",
        f"<p>consistent: {summary['clock']['consistent']}; corrections (ms added to a node's "
        f"timestamps): {html.escape(_fmt(summary['clock']['corrections_ms']) or 'none')}</p>",
        _table(summary["clock"]["proofs"]),
        "<h2>Ingest</h2>",
        _table([{"torn lines": ingest["torn_lines"], "bad lines": ingest["bad_lines"],
                 "unknown events": ingest["unknown_events"],
                 "untraced events": ingest["untraced_events"]}]),
        "<h2>Slowest traces</h2>",
    ]
    for t in slow_traces:
        parts.append(waterfall(t))
    parts.append("</body></html>")
    return "\n".join(parts)
