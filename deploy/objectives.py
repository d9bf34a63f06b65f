"""Service-level objectives for a testnet topology, derived from its links (not hand-typed).

    objectives(topo, regions) -> list[dict]   the SLA file's [[objective]] entries
    sla_toml(topo, regions, base=None) -> str a complete SLA file (spark/report.py format)
    job_regions(topo, protocols) -> {node: region} where the testnet job puts its nodes

Each derived entry is a quantile objective of spark/report.py (protocol, stage, quantile,
max_ms) plus `derived`, the formula with its figures, e.g.
"2 x 160 ms (largest RTT fullnode1 -> validator, eu <-> ap) + 200 ms". Inputs are the
topology's one-way delays (both directions of a path, so an asymmetric path counts once
each way), its path and node-link bandwidths (bits/s) and the job's node placement.

Formulas (ms; RTT = one way there + one way back, jitter left out):
- remp-first-receipt-p99 <= 2 x the largest RTT full node <-> validator + the loopback
  objective (spark/sla.toml: 1,000). The doubled RTT covers the message and the status
  crossing the path with one retransmission of the UDP datagram; the loopback objective is
  what the validators take on one shared host (the seed's 100-200 ms acknowledgement is for
  validators on their own hosts: with 200 ms instead, a wan run measured p99 573 ms against
  520 ms, its p50 220 ms where the nearest validator is 20 ms away).
- remp-finalized-p99 <= 25,000 + 20 x the largest RTT validator <-> validator: the REMP
  docs' Finalized bound (5-25 s on one host) plus twenty consensus round trips over the
  slowest validator pair (block candidate, approvals and signatures per masterchain block).
- marlin-rebuild-p50 <= propagation + serialization + 30. Propagation: the largest
  producer -> member -> consumer one-way delay (two hops) over the placed nodes;
  serialization: what the producer's link carries for a 1 MB block (the largest block of
  ../shared/data): every fragment, 1 MB x NUM_CHUNKS / MIN_CHUNKS (marlin_cluster/params.py
  defaults, 12 / 8), at the slowest bandwidth on that path (node links and inter-region
  paths). Anchor: FIBRE delivers 85 % of blocks
  within 7.5 ms of the light-propagation time; 30 ms is our allowance for erasure coding
  and the rebuild.
- marlin-rebuild-p99 <= the loopback objective (spark/sla.toml: 1,000) + propagation + serialization +
  the stream transports' loss penalty max(200, 3 x the largest one-way delay) when a path
  loses (daemon_runtime/linkmodel.py: TCP delivers a "lost" frame that much later).
- rmb-round-trip-p99 <= 2 x the largest RTT between the requesting twin's region and a
  destination twin's region + 1,000 (the relay hops' processing and one loss penalty per
  hop). Twins: alice asks, bob and carol answer (deploy/testnet_job.py).

Rate objectives (delivery ratios) do not depend on the links and are kept from the base
SLA file (spark/sla.toml). Raises KeyError when a needed node is not placed.
"""
from __future__ import annotations

import json
import tomllib
from pathlib import Path

__all__ = ["objectives", "sla_toml", "job_regions", "BLOCK_BYTES", "DEFAULT_SLA"]

DEFAULT_SLA = Path(__file__).resolve().parent.parent / "spark" / "sla.toml"
#: the Marlin payload the serialization term is computed for (1 MB, the Bitcoin block of ../shared/data)
BLOCK_BYTES = 1_000_000


def job_regions(topo, protocols=("rmb", "remp", "marlin")) -> dict[str, str]:
    """{node name: region} as the testnet job places its nodes (Testnet's own placement,
    computed without building anything)."""
    from deploy.testnet import Testnet
    from deploy.testnet_job import DEFAULTS, job_nodes
    net = Testnet(topo, job_nodes(list(protocols), DEFAULTS))
    return {n.name: n.region for n in net.nodes.values()}


def _one_way_ms(topo, a: str, b: str) -> float:
    return topo.link(a, b).delay * 1e3


def _rtt_ms(topo, a: str, b: str) -> float:
    return _one_way_ms(topo, a, b) + _one_way_ms(topo, b, a)


def _bits(topo, region_a: str, region_b: str) -> int:
    if region_a == region_b:
        return topo.regions[region_a].bandwidth
    return topo.paths[(region_a, region_b)].bandwidth


def _largest_rtt(topo, regions: dict[str, str], src: list[str], dst: list[str]) -> tuple[float, str, str]:
    best = (-1.0, "", "")
    for a in src:
        for b in dst:
            if a != b:
                r = _rtt_ms(topo, regions[a], regions[b])
                if r > best[0]:
                    best = (r, a, b)
    return best


def _pair(regions: dict[str, str], a: str, b: str) -> str:
    return f"{regions[a]} <-> {regions[b]}"


def _max_loss_penalty_ms(topo) -> float:
    links = [r.link for r in topo.regions.values()] + [p.link for p in topo.paths.values()]
    if not any(lk.loss > 0 for lk in links):
        return 0.0
    return max(200.0, 3 * max(lk.delay * 1e3 for lk in links))


def _base(path: str | Path | None = None) -> dict:
    with open(path or DEFAULT_SLA, "rb") as fh:
        return tomllib.load(fh)


def _loopback_ms(name: str, base: str | Path | None = None) -> float:
    for ob in _base(base).get("objective", []):
        if ob.get("name") == name and "max_ms" in ob:
            return float(ob["max_ms"])
    raise KeyError(f"the base SLA file has no latency objective {name!r}")


def objectives(topo, regions: dict[str, str], base: str | Path | None = None) -> list[dict]:
    """The derived quantile objectives (module doc) for the nodes placed in `regions`
    (node name -> region); only the protocols whose nodes are placed get objectives.
    `base`: the loopback SLA file (default spark/sla.toml)."""
    from marlin_cluster.params import ChannelParams
    out: list[dict] = []
    names = list(regions)
    validators = [n for n in names if n.startswith("v") and n[1:].isdigit()]
    fullnodes = [n for n in names if n.startswith("fullnode")]
    if validators and fullnodes:
        rtt, a, b = _largest_rtt(topo, regions, fullnodes, validators)
        host = _loopback_ms("remp-first-receipt-p99", base)
        out.append({"name": "remp-first-receipt-p99", "protocol": "remp", "stage": "first_receipt",
                    "quantile": 0.99, "max_ms": round(2 * rtt + host, 1),
                    "derived": f"2 x {rtt:g} ms (largest RTT full node -> validator, {a} -> {b}, "
                               f"{_pair(regions, a, b)}) + {host:g} ms (loopback objective)"})
        vv = _largest_rtt(topo, regions, validators, validators)
        rtt_v = max(vv[0], 0.0)
        out.append({"name": "remp-finalized-p99", "protocol": "remp", "stage": "finalized",
                    "quantile": 0.99, "max_ms": round(25000 + 20 * rtt_v, 1),
                    "derived": f"25000 ms (REMP docs) + 20 x {rtt_v:g} ms (largest RTT validator <-> "
                               f"validator{', ' + _pair(regions, vv[1], vv[2]) if vv[1] else ''})"})
    producers = [n for n in names if n.startswith("producer")]
    members = [n for n in names if n.startswith("c") and "m" in n and n[1:].replace("m", "").isdigit()]
    consumers = [n for n in names if n.startswith("consumer")]
    if producers and members and consumers:
        best = None
        for p in producers:
            for m in members:
                for c in consumers:
                    prop = _one_way_ms(topo, regions[p], regions[m]) + _one_way_ms(topo, regions[m], regions[c])
                    if best is None or prop > best[0]:
                        best = (prop, p, m, c)
        prop, p, m, c = best
        bits = min(topo.bandwidth_of(p, regions[p]), topo.bandwidth_of(m, regions[m]),
                   topo.bandwidth_of(c, regions[c]), _bits(topo, regions[p], regions[m]),
                   _bits(topo, regions[m], regions[c]))
        ch = ChannelParams()
        ser = BLOCK_BYTES * ch.num_chunks / ch.min_chunks * 8 / bits * 1e3
        path = f"{p} ({regions[p]}) -> {m} ({regions[m]}) -> {c} ({regions[c]})"
        out.append({"name": "marlin-rebuild-p50", "protocol": "marlin", "stage": "rebuild",
                    "quantile": 0.5, "max_ms": round(prop + ser + 30, 1),
                    "derived": f"propagation {prop:g} ms ({path}) + serialization {ser:g} ms "
                               f"(1 MB x {ch.num_chunks}/{ch.min_chunks} fragments at {bits / 1e6:g} Mbit/s) + 30 ms"})
        pen = _max_loss_penalty_ms(topo)
        host = _loopback_ms("marlin-rebuild-p99", base)
        out.append({"name": "marlin-rebuild-p99", "protocol": "marlin", "stage": "rebuild",
                    "quantile": 0.99, "max_ms": round(host + prop + ser + pen, 1),
                    "derived": f"{host:g} ms (loopback objective) + propagation {prop:g} ms + serialization "
                               f"{ser:g} ms + loss penalty {pen:g} ms"})
    if all(t in regions for t in ("alice", "bob", "carol")):
        rtt, a, b = _largest_rtt(topo, regions, ["alice"], ["bob", "carol"])
        out.append({"name": "rmb-round-trip-p99", "protocol": "rmb", "stage": "round_trip",
                    "quantile": 0.99, "max_ms": round(2 * rtt + 1000, 1),
                    "derived": f"2 x {rtt:g} ms (largest RTT {a} -> {b}, {_pair(regions, a, b)}) + 1000 ms"})
    return out


def _toml_value(v) -> str:
    # TOML basic strings, floats and integers are written as JSON writes them
    return json.dumps(v)


def sla_toml(topo, regions: dict[str, str], base: str | Path | None = None) -> str:
    """A complete SLA file: `base`'s [ttl_s] and rate objectives, then the derived quantile
    objectives (module doc) in place of base's quantile / within ones."""
    doc = _base(base)
    lines = [f"# SLA objectives for topology {topo.name}, derived from its links by deploy/objectives.py",
             "", "[ttl_s]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in doc.get("ttl_s", {}).items()]
    kept = [o for o in doc.get("objective", []) if "rate" in o]
    for ob in kept + objectives(topo, regions, base):
        lines += ["", "[[objective]]"] + [f"{k} = {_toml_value(v)}" for k, v in ob.items()]
    return "\n".join(lines) + "\n"
