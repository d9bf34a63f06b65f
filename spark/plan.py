"""The demo's plan as the trace report reads it (deploy/events.py: demo.plan.*).

The launcher logs what it intends to break BEFORE it breaks it. From those events:

- labels: raw `node` value -> readable label (`demo.plan.node`: peer -> target), so the
  report says "alice" and "relay1" instead of "1" or "127.0.0.1:40231";
- hosts: raw `node` value -> the host name it ran on (`demo.plan.node` host): nodes of one
  host share its clock, so the report never "corrects" one against the other;
- expected: trace ids the plan expects not to be delivered (`demo.plan.expect`);
- faults: (fault, target label, raw node, start us, end us): a `demo.plan.fault` and the
  matching `demo.plan.recovered` (same fault and target), else start + duration_ms, else
  open until the end of the logs.

A failure is PLANNED when its trace has a `demo.plan.expect`, or when it hit a planned
fault's target inside the fault's window: the (trace, branch)'s destination (its branch),
any node that logged one of its steps, or any node a step of the trace was sent to or came
from (its `peer` attribute: a REMP message sent to the killed validator, a Marlin chunk sent
to the killed member) is the target, and the (trace, branch)'s life overlaps the window: from its
start to when its outcome was decided (its first answered / errored / expired step), or to
its deadline while undecided (spark/stages.py outcome_sql `end_us`). A message finalized
before a validator was killed was not touched by the kill, even though its TTL (the REMP
default is 60 s) outlasts it: with [start, deadline] every REMP message of a demo could be
labelled planned and the REMP objectives judged no message at all. Everything else is unplanned; the SLA objectives judge
unplanned traffic unless an objective says `count = "all"` (spark/report.py module doc).
Pure Python; `planned_sql` renders the rule as SQL over a (trace, branch) row.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Fault:
    fault: str
    target: str        # readable label
    node: str          # raw node value (the label itself when no demo.plan.node names it)
    start_us: int
    end_us: int | None  # None: not recovered in the logs (open until the logs end)

    def as_dict(self) -> dict:
        return {"fault": self.fault, "target": self.target, "node": self.node,
                "start_us": self.start_us, "end_us": self.end_us}


@dataclass
class Plan:
    labels: dict[str, str] = field(default_factory=dict)
    hosts: dict[str, str] = field(default_factory=dict)
    expected: dict[str, dict] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)

    def label(self, node: str | None) -> str | None:
        """The readable label of a raw node value (the value itself when unnamed)."""
        if node is None:
            return None
        return self.labels.get(node, node)

    def planned_sql(self, trace_col: str = "trace_id", branch_col: str = "branch",
                    nodes_col: str = "nodes", start: str = "start_us",
                    end: str = "end_us") -> str:
        """SQL boolean: this (trace, branch) row is planned (module doc). The row's columns:
        trace id, branch, nodes (array of raw node values of its steps), start and end of its
        life (us)."""
        parts = []
        if self.expected:
            ids = ", ".join(_q(t) for t in sorted(self.expected))
            parts.append(f"{trace_col} IN ({ids})")
        for f in self.faults:
            hit = f"({branch_col} = {_q(f.node)} OR array_contains({nodes_col}, {_q(f.node)}))"
            window = f"{end} >= {f.start_us}"
            if f.end_us is not None:
                window += f" AND {start} <= {f.end_us}"
            parts.append(f"({hit} AND {window})")
        return "(" + " OR ".join(parts) + ")" if parts else "false"


def _q(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def parse(rows: list[dict]) -> Plan:
    """rows: {ts_us, event, trace_id, attrs} of every demo.plan.* event (any order)."""
    plan = Plan()
    rows = sorted(rows, key=lambda r: (r.get("ts_us") or 0, r.get("event") or ""))
    for r in rows:
        a = r.get("attrs") or {}
        if r["event"] == "demo.plan.node" and a.get("peer") and a.get("target"):
            plan.labels[a["peer"]] = a["target"]
            if a.get("host"):
                plan.hosts[a["peer"]] = a["host"]
    raw_of = {label: raw for raw, label in plan.labels.items()}
    open_faults: dict[tuple[str, str], Fault] = {}
    for r in rows:
        a = r.get("attrs") or {}
        ev = r["event"]
        if ev == "demo.plan.expect" and r.get("trace_id"):
            plan.expected[r["trace_id"]] = {"outcome": a.get("outcome"), "fault": a.get("fault")}
        elif ev == "demo.plan.fault":
            target = a.get("target") or ""
            dur = a.get("duration_ms") or 0.0
            f = Fault(a.get("fault") or "", target, raw_of.get(target, target), r["ts_us"],
                      r["ts_us"] + int(dur * 1000) if dur else None)
            plan.faults.append(f)
            open_faults[(f.fault, target)] = f
        elif ev == "demo.plan.recovered":
            f = open_faults.pop((a.get("fault") or "", a.get("target") or ""), None)
            if f is not None:
                f.end_us = max(r["ts_us"], f.end_us or 0)
    return plan
