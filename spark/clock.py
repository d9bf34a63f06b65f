"""Clock alignment from what the logs prove (pure Python, runs on the driver).

Input: for each ordered pair of nodes (A, B) the minimum observed delta d(A->B) = ts_B - ts_A
in ms over every causal pair of events (A's event happens-before B's event in real time:
a stage edge with `clock=True` in spark/stages.py, e.g. a relay's `delivered` and the peer's
`received` of the same envelope). A clock domain is the event log's `node` field (a peer and
the app services of one twin share it).

With observed = true + offset, d(A->B) = delay + (off_B - off_A) >= off_B - off_A, so
off_B - off_A lies in [-d(B->A), d(A->B)]. The logs PROVE skew between A and B only when
that interval excludes 0, i.e. d(A->B) < 0 or d(B->A) < 0; no other pair is touched.

Correction x[node] (ms, added to the node's timestamps):
1. Per pair, the estimate of off_B - off_A: 0 when the interval contains 0 (nothing proven,
   nothing corrected); else the interval's midpoint when both directions were observed
   (NTP's symmetric-delay estimate), else the bound itself (the smallest shift that makes the
   fastest message take 0 ms: a lower bound on the real skew).
2. Per connected component, a spanning tree over the TIGHTEST evidence (Prim, by interval
   width; one-sided intervals last) from a reference node (x = 0): the node agreeing with
   the most others (pairs that prove nothing), then the most links, then by name; x_B = x_A - estimate(A, B) along the tree.
3. Relaxation over ALL observed pairs (x_B = max(x_B, x_A - d(A->B)), Bellman-Ford style)
   so no corrected causal delta stays negative; if that does not converge in |nodes| passes
   the evidence is contradictory (e.g. a clock stepped mid-log): no correction at all is
   applied and `consistent` is False.

Nodes of one host share its clock (`hosts`: node -> host name, from the demo plan's
`demo.plan.node` host): they are one clock domain, named `host:<name>`. Pairs inside a domain
prove nothing about skew; a receive logged before its send there is the order two processes
wrote their log lines (a daemon logs a batch's events after handling the batch) and is
reported as such (`log_order`). Steps 1-3 run over the domains; a domain's correction applies
to each of its nodes.
"""
from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class ClockResult:
    """corrections: node -> ms added to its timestamps (only nodes with proven skew);
    proofs: (a, b, d(a->b) ms, d(b->a) ms or None) for each proving pair; consistent: False if
    the evidence contradicts itself (then corrections is empty)."""

    corrections: dict[str, float] = field(default_factory=dict)
    proofs: list[tuple[str, str, float, float | None]] = field(default_factory=list)
    consistent: bool = True
    #: host name -> the nodes of that host seen in a causal pair with another node of it
    shared_hosts: dict[str, list[str]] = field(default_factory=dict)
    #: the most negative receive - send delta (ms) between two nodes of one host, as
    #: (from, to, ms), None when none is negative: the log-writing order, not skew
    log_order: tuple[str, str, float] | None = None
    #: clock domain (a node, or `host:<name>`) -> ms, as `proofs` name them
    domain_corrections: dict[str, float] = field(default_factory=dict)
    #: ordered pairs of distinct clock domains observed (0: every pair within one host)
    cross_pairs: int = 0


def _interval(d, a, b):
    """(lo, hi) bounds of off_b - off_a from the observed minimum deltas."""
    fwd, back = d.get((a, b)), d.get((b, a))
    return (-back if back is not None else -math.inf, fwd if fwd is not None else math.inf)


def _estimate(lo: float, hi: float) -> float:
    if lo <= 0.0 <= hi:
        return 0.0
    if math.isfinite(lo) and math.isfinite(hi):
        return (lo + hi) / 2.0
    return hi if hi < 0 else lo


def align(pair_min: dict[tuple[str, str], float], tolerance_ms: float = 0.0,
          hosts: dict[str, str] | None = None) -> ClockResult:
    """pair_min: (from_node, to_node) -> min observed delta ms (from != to). See module doc.
    tolerance_ms: negative deltas down to -tolerance_ms are read as 0 (not proof of skew):
    a sender that logs `sent` after the write can be overtaken by the receiver's log line by
    a few ms (the logging order, not skew). hosts: node -> host name for the nodes whose host
    is known; nodes of one host are one clock domain (never corrected against each other)."""
    hosts = hosts or {}

    def domain(n: str) -> str:
        return f"host:{hosts[n]}" if n in hosts else n

    shared: dict[str, set[str]] = defaultdict(set)
    cross: dict[tuple[str, str], float] = {}
    log_order = None
    for (a, b), v in pair_min.items():
        if a == b:
            continue
        da, db = domain(a), domain(b)
        if da == db:
            shared[hosts[a]].update((a, b))
            if v < 0 and (log_order is None or v < log_order[2]):
                log_order = (a, b, float(v))
        else:
            cross[(da, db)] = min(float(v), cross.get((da, db), math.inf))
    result = _align(cross, tolerance_ms)
    result.shared_hosts = {h: sorted(ns) for h, ns in sorted(shared.items())}
    result.log_order = log_order
    result.domain_corrections = dict(result.corrections)
    result.cross_pairs = len(cross)
    if result.corrections and hosts:
        nodes = {n for pair in pair_min for n in pair} | set(hosts)
        per_domain = result.corrections
        result.corrections = {n: per_domain[domain(n)] for n in sorted(nodes) if domain(n) in per_domain}
    return result


def _align(pair_min: dict[tuple[str, str], float], tolerance_ms: float) -> ClockResult:
    """Steps 1-3 of the module doc over clock domains (pair_min keys are domains)."""
    d = {k: (0.0 if -tolerance_ms <= float(v) < 0 else float(v))
         for k, v in pair_min.items() if k[0] != k[1]}
    links: dict[str, set[str]] = defaultdict(set)
    for a, b in d:
        links[a].add(b)
        links[b].add(a)
    proofs, seen = [], set()
    for (a, b), v in sorted(d.items()):
        back = d.get((b, a))
        if (v < 0 or (back is not None and back < 0)) and frozenset((a, b)) not in seen:
            seen.add(frozenset((a, b)))
            proofs.append((a, b, v, back))
    result = ClockResult(proofs=proofs)
    if not proofs:
        return result

    agree = {n: sum(1 for m in links[n] if frozenset((n, m)) not in seen) for n in links}
    x: dict[str, float] = {}
    for ref in sorted(links, key=lambda n: (-agree[n], -len(links[n]), n)):
        if ref in x:
            continue
        x[ref] = 0.0
        heap: list = []

        def push(a):
            for b in links[a]:
                if b not in x:
                    lo, hi = _interval(d, a, b)
                    heapq.heappush(heap, (hi - lo, a, b))

        push(ref)
        while heap:
            _, a, b = heapq.heappop(heap)
            if b in x:
                continue
            x[b] = x[a] - _estimate(*_interval(d, a, b))
            push(b)

    for _ in range(len(x) + 1):
        changed = False
        for (a, b), v in d.items():
            need = x[a] - v
            if x[b] < need - 1e-9:
                x[b] = need
                changed = True
        if not changed:
            break
    else:
        result.consistent = False
        return result
    result.corrections = {n: round(v, 3) for n, v in sorted(x.items()) if abs(v) > 1e-9}
    return result
