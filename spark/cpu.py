"""CPU samples in the report: the timeline, and whether a missed objective was missed while
the host was saturated (deploy/events.py demo.cpu.*, written by the launcher's sampler,
deploy/cpu.py). Pure Python over the sample rows the report collects with the plan.

    cpu = timeline(rows)                    # rows: {ts_us, event, attrs} of demo.cpu.* events
    sat = judge(cpu, [(start_us, end_us), ...])   # the breach windows of one objective

A host sample at ts covers (ts - interval_ms, ts]; a process sample the same interval as the
host sample logged right after it (the sampler logs the processes, then the host). The host
was SATURATED during a breach when the mean of `cpu_pct` (percent of all its cores busy) over
the host samples overlapping the breach windows is >= SATURATED_PCT. The busiest processes
are ranked by their mean `core_pct` (percent of one core) over the same samples; a process
not logged in one of them counts 0 there (it was below the sampler's logging threshold).
"""
from __future__ import annotations

from dataclasses import dataclass, field

#: percent of all cores busy, on average over the breach, from which the host was saturated
SATURATED_PCT = 90.0
#: processes named per judged breach
BUSIEST = 5
#: a process sample belongs to the first host sample logged at most this long after it (us)
_PROC_TO_HOST_US = 500_000


@dataclass
class HostSample:
    ts_us: int            # end of the interval (the event's ts)
    interval_us: int
    cpu_pct: float        # percent of all cores busy
    demo_pct: float       # the demo's own processes, percent of all cores
    procs: dict[str, tuple[str, float]] = field(default_factory=dict)  # label -> (kind, core_pct)

    @property
    def start_us(self) -> int:
        return self.ts_us - self.interval_us


@dataclass
class CpuTimeline:
    cores: int = 0
    samples: list[HostSample] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.samples)

    def as_dict(self, max_points: int = 2000) -> dict:
        """summary.json's `cpu`: cores, the host samples (t_us, cpu_pct, demo_pct, and the
        three busiest processes of each), mean host and demo shares."""
        step = max(1, len(self.samples) // max_points)
        pts = []
        for s in self.samples[::step]:
            top = sorted(s.procs.items(), key=lambda kv: -kv[1][1])[:3]
            pts.append({"ts_us": s.ts_us, "cpu_pct": s.cpu_pct, "demo_pct": s.demo_pct,
                        "top": [{"name": n, "kind": k, "core_pct": p} for n, (k, p) in top]})
        n = len(self.samples)
        return {"cores": self.cores, "samples": pts, "saturated_pct": SATURATED_PCT,
                "mean_cpu_pct": round(sum(s.cpu_pct for s in self.samples) / n, 1) if n else None,
                "mean_demo_pct": round(sum(s.demo_pct for s in self.samples) / n, 1) if n else None}


def timeline(rows: list[dict]) -> CpuTimeline:
    """CpuTimeline from the demo.cpu.* rows ({ts_us, event, attrs}, any order); other rows
    are ignored."""
    rows = sorted((r for r in rows if (r.get("event") or "").startswith("demo.cpu.")),
                  key=lambda r: (r.get("ts_us") or 0, r["event"] != "demo.cpu.process"))
    out = CpuTimeline()
    pending: list[dict] = []
    for r in rows:
        a = r.get("attrs") or {}
        if r["event"] == "demo.cpu.process":
            pending.append(r)
            continue
        if r["event"] != "demo.cpu.host":
            continue
        ts = int(r.get("ts_us") or 0)
        s = HostSample(ts, int(float(a.get("interval_ms") or 1000.0) * 1000),
                       float(a.get("cpu_pct") or 0.0), float(a.get("demo_pct") or 0.0))
        for p in pending:
            pa = p.get("attrs") or {}
            if ts - int(p.get("ts_us") or 0) <= _PROC_TO_HOST_US and pa.get("target"):
                s.procs[pa["target"]] = (pa.get("kind") or "", float(pa.get("core_pct") or 0.0))
        pending = []
        out.cores = int(a.get("cores") or out.cores or 0)
        out.samples.append(s)
    return out


def merge(windows: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping or touching (start_us, end_us) windows merged, sorted."""
    out: list[list[int]] = []
    for a, b in sorted((int(a), int(max(a, b))) for a, b in windows):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def judge(cpu: CpuTimeline, windows: list[tuple[int, int]]) -> dict | None:
    """The host during the breach windows: {host_pct, demo_pct, samples, saturated,
    busiest: [{name, kind, core_pct}], windows: [[start_us, end_us], ...] merged}, or None
    when no host sample overlaps them (nothing to judge)."""
    merged = merge(windows)
    # a sample covers (start, ts]; a window [a, b] with a == b still hits the one covering it
    hit = [s for s in cpu.samples if any(s.start_us < max(b, a + 1) and s.ts_us > a for a, b in merged)]
    if not hit:
        return None
    host = sum(s.cpu_pct for s in hit) / len(hit)
    demo = sum(s.demo_pct for s in hit) / len(hit)
    totals: dict[str, list] = {}
    for s in hit:
        for name, (kind, pct) in s.procs.items():
            t = totals.setdefault(name, [kind, 0.0])
            t[1] += pct
    busiest = sorted(((n, k, p / len(hit)) for n, (k, p) in totals.items()), key=lambda x: -x[2])
    return {"host_pct": round(host, 1), "demo_pct": round(demo, 1), "samples": len(hit),
            "saturated": host >= SATURATED_PCT, "threshold_pct": SATURATED_PCT,
            "busiest": [{"name": n, "kind": k, "core_pct": round(p, 1)} for n, k, p in busiest[:BUSIEST]],
            "windows": [[a, b] for a, b in merged]}


def verdict(passed: bool | None, saturation: dict | None) -> str | None:
    """The objective's verdict: "met", "missed", "missed, host saturated" (a failure all the
    same: the words explain it, they excuse nothing), None without data."""
    if passed is None:
        return None
    if passed:
        return "met"
    return "missed, host saturated" if saturation and saturation["saturated"] else "missed"


def busiest_text(saturation: dict, n: int = 3) -> str:
    """'name 95% of a core, name 80%, ...' of the busiest processes."""
    items = saturation.get("busiest", [])[:n]
    return ", ".join(f"{b['name']}{'' if b['kind'] == 'demo' else ' (not the demo)'} "
                     f"{b['core_pct']:.0f}%" for b in items)
