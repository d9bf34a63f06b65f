"""The relay's Prometheus metrics (own CollectorRegistry; names are the operators'
contract: docs/rmb-operations.md and the Prometheus rules)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily

__all__ = ["RelayMetrics"]


class _Count:
    """A plain counter for the per-envelope hot path (prometheus_client's Counter.inc takes
    a lock and checks labels on every call); exported by _HotCounters."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount


class _HotCounters:
    """Collector for the per-envelope counters: same metric names, labels and `_total`
    samples as prometheus_client Counters."""

    def __init__(self, families: list[tuple[str, str, str, dict[str, _Count]]]):
        self.families = families

    def describe(self):
        return []

    def collect(self):
        for name, doc, label, counts in self.families:
            fam = CounterMetricFamily(name, doc, labels=[label])
            for value, count in counts.items():
                fam.add_metric([value], count.value)
            yield fam


class RelayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rx_peer, self.rx_fed = _Count(), _Count()
        self.dl_live, self.dl_replay = _Count(), _Count()
        r.register(_HotCounters([
            ("rmb_relay_envelopes_received", "envelopes received", "via",
             {"peer": self.rx_peer, "federation": self.rx_fed}),
            ("rmb_relay_envelopes_delivered", "envelopes written to a local connection", "path",
             {"live": self.dl_live, "replay": self.dl_replay}),
        ]))
        self.queued = Counter("rmb_relay_envelopes_queued", "envelopes queued for offline twins",
                              registry=r)
        self.federated = Counter("rmb_relay_federation_accepted",
                                 "envelopes accepted by another relay", registry=r)
        self.fed_failed = Counter("rmb_relay_federation_attempts_failed",
                                  "federation attempts that failed", ["domain"], registry=r)
        self.rejected = Counter("rmb_relay_envelopes_rejected",
                                "envelopes answered with a relay error or dropped", ["reason"],
                                registry=r)
        self.expired = Counter("rmb_relay_envelopes_expired", "envelopes whose TTL ran out",
                               registry=r)
        self.auth_failed = Counter("rmb_relay_auth_failed", "refused connection attempts",
                                   ["status"], registry=r)
        self.bad_requests = Counter("rmb_relay_bad_requests", "HTTP requests the relay could "
                                    "not parse (answered 400 by the HTTP server), by error "
                                    "class", ["reason"], registry=r)
        self.connections = Gauge("rmb_relay_connections", "authenticated peer connections",
                                 registry=r)
        self.fed_saved = Counter("rmb_relay_federation_saved",
                                 "federation jobs the shutdown drain could not send within "
                                 "--grace and saved to this relay's Redis outbox (only its "
                                 "next start resumes them; rmb.relay.federation_saved lines)",
                                 registry=r)
        self.fed_jobs = Gauge("rmb_relay_federation_jobs", "envelopes waiting for federation",
                              registry=r)     # RelayServer sets its function
        self.queue_failed = Counter("rmb_relay_queue_failed",
                                    "envelopes for offline twins not queued because Redis "
                                    "failed or did not answer (the sender got an error)",
                                    ["reason"], registry=r)
        self.queue_full = Counter("rmb_relay_queue_full",
                                  "envelopes refused because the destination's offline queue "
                                  "was full (the sender got an error)", ["via"], registry=r)
        self.queue_full.labels("peer")   # exported at 0 from the start: increase() sees the first
        self.accept_failed = Counter("rmb_relay_accept_failed",
                                     "connections the relay could not accept (fd limit)",
                                     ["reason"], registry=r)
        self.suppressed = Counter("rmb_relay_log_suppressed",
                                  "warning lines withheld by the log rate limit", ["reason"],
                                  registry=r)
        self.open_fds = Gauge("rmb_relay_open_fds", "open file descriptors of the relay "
                              "(sampled every second)", registry=r)
        self.fd_limit = Gauge("rmb_relay_fd_limit", "RLIMIT_NOFILE soft limit of the relay",
                              registry=r)
        self.fed_refused = Counter("rmb_relay_federation_refused",
                                   "federation POSTs refused (bad signature, unknown twin, "
                                   "limits, ...)", ["reason"], registry=r)
        self.stale_served = Counter("rmb_relay_twin_stale_served",
                                    "twin records served past their TTL because the "
                                    "registry could not be reached", registry=r)
        self.circuit_opened = Counter("rmb_relay_federation_circuit_opened",
                                      "times a federation domain's circuit opened", ["domain"],
                                      registry=r)
        self.capacity_refused = Counter("rmb_relay_capacity_refused",
                                        "handshakes refused with 503 near the fd limit",
                                        registry=r)
