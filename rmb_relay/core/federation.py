"""Federation out: the relay ranker and the retry plan (no I/O, no clock).

seed: rmb.md "Federations"; rmb-rs v1.5.1 relay/ranker and federation/router.rs;
DESIGN.md section 3. `Ranker` orders a twin's relays by recent failures;
`FederationScheduler` plans the POSTs (passes in ranker order, jittered backoff, one
circuit per domain, per-domain caps) and hands each one out as a `PostFederation` command
(rmb_relay.core.commands), answered with `report(...)`.
"""
from __future__ import annotations

import collections
import heapq
import random
from dataclasses import dataclass, field
from typing import Any, Iterable

from rmb_peer.envelope import Envelope, message_kind, relay_error
from rmb_relay.core.commands import PostFederation
from rmb_relay.core.errors import (
    ERR_DOMAIN_FULL, ERR_EXPIRED, ERR_FEDERATION_FULL, RelayCoreError,
)

__all__ = [
    "Ranker",
    "FederationEvent",
    "FederationAccepted",
    "FederationAttemptFailed",
    "FederationRefused",
    "FederationExpired",
    "FederationCircuit",
    "FederationScheduler",
]

class Ranker:
    """Relay ranking by recent failures (seed: rmb.md "Federations"; rmb-rs relay/ranker).

    `downvote(domain, now)` records one failure. `failure_rate(domain, now)` is failures
    within the last `period` s per hour. `order(domains, now)` returns the domains sorted
    by ascending failure rate, ties in random order (`rng`, a random.Random). Ranks heal
    as failures age out of the period. Raises RelayCoreError for period <= 0.
    """

    def __init__(self, period: float = 3600.0, rng: random.Random | None = None):
        if period <= 0:
            raise RelayCoreError(f"ranker period must be > 0 s, got {period}")
        self.period = period
        self.rng = rng or random.Random()
        self._failures: dict[str, collections.deque[float]] = {}

    def downvote(self, domain: str, now: float) -> None:
        self._failures.setdefault(domain, collections.deque()).append(now)
        self._prune(domain, now)

    def _prune(self, domain: str, now: float) -> int:
        times = self._failures.get(domain)
        if not times:
            return 0
        while times and times[0] <= now - self.period:
            times.popleft()
        if not times:
            del self._failures[domain]
            return 0
        return len(times)

    def failures(self, domain: str, now: float) -> int:
        return self._prune(domain, now)

    def failure_rate(self, domain: str, now: float) -> float:
        """Failures per hour over the ranker period."""
        return self.failures(domain, now) / (self.period / 3600.0)

    def order(self, domains: Iterable[str], now: float) -> list[str]:
        keyed = [(self.failures(d, now), self.rng.random(), d) for d in domains]
        keyed.sort()
        return [d for _, _, d in keyed]


# --------------------------------------------------------------------------- federation

class FederationEvent:
    """Base class of the federation scheduler's events."""


@dataclass
class FederationAccepted(FederationEvent):
    """A relay accepted the envelope (HTTP 202). job: job id; uid: envelope uid;
    domain: the relay; attempt: 1-based attempt number; duration: s since submit."""
    job: int
    uid: str
    domain: str
    attempt: int
    duration: float


@dataclass
class FederationAttemptFailed(FederationEvent):
    """One attempt failed transiently (5xx, connection error, timeout); the domain was
    downvoted. status: HTTP status or 0; reason: short text."""
    job: int
    uid: str
    domain: str
    attempt: int
    status: int
    reason: str


@dataclass
class FederationRefused(FederationEvent):
    """A relay refused the envelope permanently (4xx); no more attempts. `reply` is the
    relay error for the sender when the envelope was a request, else None."""
    job: int
    uid: str
    domain: str
    attempt: int
    status: int
    reason: str
    context: Any
    reply: Envelope | None


@dataclass
class FederationExpired(FederationEvent):
    """The TTL ran out before any relay accepted. `reply` is the `message has expired`
    relay error for the sender when the envelope was a request, else None."""
    job: int
    uid: str
    attempts: int
    context: Any
    reply: Envelope | None


@dataclass
@dataclass
class FederationCircuit(FederationEvent):
    """A domain's circuit changed: state "open" (after `failures` consecutive failed
    attempts, attempts to it pause for `cooldown` s; jobs wait or use their other relays)
    or "closed" (an attempt got an answer again)."""
    domain: str
    state: str
    failures: int
    cooldown: float


@dataclass
class _Job:
    id: int
    env: Envelope
    data: bytes
    domains: list[str]
    deadline: float
    submitted: float
    context: Any
    state: str = "ready"
    passes: int = 0
    order: list[str] = field(default_factory=list)
    index: int = 0
    attempts: int = 0
    wake_at: float = 0.0
    domain: str = ""
    parked: bool = False


@dataclass
class _Circuit:
    failures: int = 0          # consecutive failed attempts
    open_until: float = 0.0    # attempts paused until then (0: closed)
    cooldown: float = 0.0      # current open period, s
    probing: bool = False      # the one half-open attempt is in flight
    probe_job: int = 0         # the job id of that attempt
    jobs: int = 0              # pending jobs that list this domain
    inflight: int = 0          # attempts in flight to this domain
    blocked: collections.deque = field(default_factory=collections.deque)  # job ids waiting for a slot


class FederationScheduler:
    """The federation retry plan (DESIGN.md section 3; rmb-rs federation/router.rs), with
    per-domain bounds (one twin pointing its relay at a dead address must not saturate the
    relay).

    A job is one envelope for a twin whose relays are not ours. Each pass tries the twin's
    relays once, in the ranker's order at the start of the pass. A 202 ends the job
    (`FederationAccepted`); a 4xx ends it (`FederationRefused`, permanent); a 5xx,
    connection error or timeout downvotes the domain and moves to the next relay
    (`FederationAttemptFailed`). After a failed pass the job waits a jittered backoff:
    the first `fast_passes` (3) passes are `base_backoff` * 2**(pass-1) s apart, later
    passes `slow_backoff` (5) s apart, each times a uniform jitter in [0.5, 1.5): short
    enough that a relay restart of a few seconds is bridged within a typical TTL. Passes
    repeat until the deadline: min(envelope timestamp + expiration, submit + max_job_ttl);
    then `FederationExpired` (reply `message has expired` for requests).

    Per-domain circuit: after `circuit_threshold` consecutive failed attempts a domain is
    open for a jittered cooldown (`circuit_base` s doubling up to `circuit_max`); no job
    attempts it meanwhile (a job skips to its next relay, or waits parked until the
    earliest of its circuits half-opens); then ONE probe attempt is let through: an answer
    closes the circuit, a failure re-opens it with a doubled cooldown. So a dead domain
    costs about one attempt per cooldown, whatever the number of jobs (`FederationCircuit`
    events). Per-domain cap: a job is refused (`submit` returns None, `refusal` says why)
    when every one of its domains already has `max_jobs_per_domain` pending jobs, so one
    dead domain cannot fill the table other routes need (`max_jobs` overall). At most
    `max_inflight_per_domain` attempts to one domain are in flight; further ready jobs for
    it wait for a slot (they are released one per finished attempt).

    States (table `_TRANSITIONS`): ready -dispatch-> in_flight; ready -park-> waiting;
    in_flight -accepted|refused-> done; in_flight -failed-> ready (more relays in this pass)
    | waiting (pass over) | done (deadline passed); waiting -wake-> ready;
    ready|waiting -expire-> done; ready|waiting -withdraw-> done (the twin moved to this
    relay). `retarget` points a job at the twin's new relays. An impossible transition (e.g. reporting a job that is
    not in flight) raises RelayCoreError naming the state and the input.
    Cost: attempts_due and handle_timer touch only due jobs (a ready queue and a timer heap).
    """

    _TRANSITIONS = {
        ("ready", "dispatch"): {"in_flight"},
        ("ready", "park"): {"waiting"},
        ("in_flight", "accepted"): {"done"},
        ("in_flight", "refused"): {"done"},
        ("in_flight", "failed"): {"ready", "waiting", "done"},
        ("waiting", "wake"): {"ready"},
        ("ready", "expire"): {"done"},
        ("waiting", "expire"): {"done"},
        ("ready", "withdraw"): {"done"},
        ("waiting", "withdraw"): {"done"},
    }

    def __init__(self, ranker: Ranker, rng: random.Random | None = None, *,
                 fast_passes: int = 3, base_backoff: float = 0.5, slow_backoff: float = 5.0,
                 attempt_timeout: float = 10.0, max_job_ttl: float = 3600.0,
                 max_jobs: int = 10000, max_jobs_per_domain: int = 2000,
                 circuit_threshold: int = 5, circuit_base: float = 2.0,
                 circuit_max: float = 60.0, max_inflight_per_domain: int = 32):
        self.ranker = ranker
        self.rng = rng or random.Random()
        self.fast_passes = fast_passes
        self.base_backoff = base_backoff
        self.slow_backoff = slow_backoff
        self.attempt_timeout = attempt_timeout
        self.max_job_ttl = max_job_ttl
        self.max_jobs = max_jobs
        self.max_jobs_per_domain = max_jobs_per_domain
        self.circuit_threshold = circuit_threshold
        self.circuit_base = circuit_base
        self.circuit_max = circuit_max
        self.max_inflight_per_domain = max_inflight_per_domain
        #: why the last submit returned None (ERR_FEDERATION_FULL or ERR_DOMAIN_FULL)
        self.refusal = ""
        self._jobs: dict[int, _Job] = {}
        self._circuits: dict[str, _Circuit] = {}
        self._ready: collections.deque[int] = collections.deque()
        self._heap: list[tuple[float, int]] = []
        self._next_id = 1
        self._events: collections.deque[FederationEvent] = collections.deque()

    # -- state machine
    def _move(self, job: _Job, inp: str, new: str) -> None:
        allowed = self._TRANSITIONS.get((job.state, inp))
        if allowed is None or new not in allowed:
            raise RelayCoreError(f"federation job {job.id}: no transition from state "
                                 f"{job.state!r} on input {inp!r}")
        job.state = new
        if new == "done":
            del self._jobs[job.id]
            self._release_circuits(job.domains)
        elif new == "ready":
            self._ready.append(job.id)
            heapq.heappush(self._heap, (job.deadline, job.id))
        elif new == "waiting":
            heapq.heappush(self._heap, (min(job.wake_at, job.deadline), job.id))

    # -- API
    def __len__(self) -> int:
        return len(self._jobs)

    def in_flight(self) -> int:
        return sum(1 for j in self._jobs.values() if j.state == "in_flight")

    def circuit_open(self, domain: str, now: float) -> bool:
        """True while attempts to `domain` are paused."""
        c = self._circuits.get(domain)
        return c is not None and (c.probing or now < c.open_until)

    def domain_jobs(self, domain: str) -> int:
        c = self._circuits.get(domain)
        return c.jobs if c is not None else 0

    def submit(self, env: Envelope, data: bytes, domains: list[str], now: float,
               context: Any = None) -> int | None:
        """Plans federation of `env` (serialized `data`) to the twin relays `domains`.
        `context` is handed back in Refused/Expired events (the daemon puts the sender
        session there). Returns the job id, or None when `max_jobs` jobs are pending or
        every domain has `max_jobs_per_domain` (then `refusal` holds the error text for
        the sender). Raises RelayCoreError for no domains."""
        if not domains:
            raise RelayCoreError("federation needs at least one relay domain")
        domains = list(dict.fromkeys(domains))
        if len(self._jobs) >= self.max_jobs:
            self.refusal = ERR_FEDERATION_FULL
            return None
        if all(self.domain_jobs(d) >= self.max_jobs_per_domain for d in domains):
            self.refusal = ERR_DOMAIN_FULL
            return None
        deadline = min(float(env.timestamp) + float(env.expiration), now + self.max_job_ttl)
        job = _Job(id=self._next_id, env=env, data=data, domains=domains,
                   deadline=deadline, submitted=now, context=context)
        self._next_id += 1
        self._jobs[job.id] = job
        for d in domains:
            self._circuits.setdefault(d, _Circuit()).jobs += 1
        self._start_pass(job, now)
        self._ready.append(job.id)
        heapq.heappush(self._heap, (job.deadline, job.id))
        return job.id

    def _start_pass(self, job: _Job, now: float) -> None:
        job.passes += 1
        job.order = self.ranker.order(job.domains, now)
        job.index = 0

    def _reply(self, job: _Job, text: str) -> Envelope | None:
        return relay_error(job.env, text) if message_kind(job.env) == "request" else None

    def _expire(self, job: _Job) -> None:
        self._events.append(FederationExpired(job.id, job.env.uid, job.attempts, job.context,
                                              self._reply(job, ERR_EXPIRED)))

    def _usable(self, domain: str, now: float) -> bool:
        c = self._circuits.get(domain)
        return c is None or (not c.probing and now >= c.open_until)

    def attempts_due(self, now: float) -> list[PostFederation]:
        """Every attempt to start now (ready jobs go in flight; a job whose remaining
        relays in this pass all have open circuits is parked until one half-opens). Jobs
        past their deadline expire instead (events)."""
        out: list[PostFederation] = []
        ready, self._ready = self._ready, collections.deque()
        while ready:
            job = self._jobs.get(ready.popleft())
            if job is None or job.state != "ready":
                continue
            if now >= job.deadline:
                self._move(job, "expire", "done")
                self._expire(job)
                continue
            while job.index < len(job.order) and not self._usable(job.order[job.index], now):
                job.index += 1
            if job.index >= len(job.order):
                # every remaining relay of this pass is paused: wait for the first to
                # half-open, then retry the pass from the start (not counted as a pass)
                reopen = min(self._circuits[d].open_until for d in job.order
                             if d in self._circuits)
                job.index = 0
                job.parked = True
                job.wake_at = min(max(reopen, now + 0.001) + self.rng.uniform(0, 0.25),
                                  job.deadline)
                self._move(job, "park", "waiting")
                continue
            job.domain = job.order[job.index]
            c = self._circuits.setdefault(job.domain, _Circuit())
            if c.inflight >= self.max_inflight_per_domain:
                c.blocked.append(job.id)               # stays ready; released by _slot_freed
                continue
            if c.open_until:
                c.probing = True                       # the one half-open probe
                c.probe_job = job.id
            c.inflight += 1
            job.attempts += 1
            self._move(job, "dispatch", "in_flight")
            out.append(PostFederation(job.id, job.env.uid, job.domain, job.attempts, job.data,
                               max(0.001, min(self.attempt_timeout, job.deadline - now))))
        return out

    def _slot_freed(self, domain: str) -> None:
        c = self._circuits.get(domain)
        if c is None:
            return
        c.inflight = max(0, c.inflight - 1)
        while c.blocked:
            job = self._jobs.get(c.blocked.popleft())
            if job is not None and job.state == "ready":
                self._ready.append(job.id)
                break

    def _answered(self, domain: str) -> None:
        c = self._circuits.get(domain)
        if c is None:
            return
        was_open = bool(c.open_until)
        c.failures, c.open_until, c.cooldown, c.probing = 0, 0.0, 0.0, False
        if was_open:
            self._events.append(FederationCircuit(domain, "closed", 0, 0.0))

    def _failed(self, domain: str, now: float, job_id: int) -> None:
        """Count a failed attempt; open the circuit at the threshold. While it is open only
        the half-open probe's failure re-opens it (doubling the cooldown): attempts that were
        already in flight when it opened and fail afterwards say nothing new about the
        domain (each used to double the cooldown: 2 s became ~30 s, replies were lost)."""
        c = self._circuits.setdefault(domain, _Circuit())
        c.failures += 1
        probe = c.probing and c.probe_job == job_id
        if c.open_until and not probe:
            return
        if probe or c.failures >= self.circuit_threshold:
            first = not c.open_until
            c.cooldown = min(self.circuit_max,
                             self.circuit_base if first else max(self.circuit_base, c.cooldown * 2))
            c.open_until = now + c.cooldown * self.rng.uniform(0.8, 1.2)
            c.probing = False
            if first:
                self._events.append(FederationCircuit(domain, "open", c.failures, c.cooldown))

    def report(self, job_id: int, outcome: str, now: float, status: int = 0, reason: str = "") -> None:
        """The result of the attempt in flight for `job_id`: outcome "accepted" (202),
        "refused" (4xx, permanent) or "failed" (5xx, connection error, timeout).
        Raises RelayCoreError for an unknown job, a job not in flight or a bad outcome."""
        job = self._jobs.get(job_id)
        if job is None:
            raise RelayCoreError(f"federation job {job_id}: unknown (state 'done'?) on input {outcome!r}")
        if outcome not in ("accepted", "refused", "failed"):
            raise RelayCoreError(f"federation job {job_id}: unknown outcome {outcome!r} "
                                 f"in state {job.state!r}")
        if job.state == "in_flight":
            self._slot_freed(job.domain)
        if outcome == "accepted":
            self._move(job, "accepted", "done")
            self._answered(job.domain)
            self._events.append(FederationAccepted(job.id, job.env.uid, job.domain, job.attempts,
                                                   now - job.submitted))
        elif outcome == "refused":
            self._move(job, "refused", "done")
            self._answered(job.domain)
            text = reason or f"relay {job.domain} refused the message (HTTP {status})"
            self._events.append(FederationRefused(job.id, job.env.uid, job.domain, job.attempts,
                                                  status, reason, job.context, self._reply(job, text)))
        elif outcome == "failed":
            if job.state != "in_flight":
                self._move(job, "failed", "ready")  # raises with state and input
            self.ranker.downvote(job.domain, now)
            self._failed(job.domain, now, job.id)
            self._events.append(FederationAttemptFailed(job.id, job.env.uid, job.domain,
                                                        job.attempts, status, reason))
            if now >= job.deadline:
                self._move(job, "failed", "done")
                self._expire(job)
                return
            job.index += 1
            if job.index < len(job.order):
                self._move(job, "failed", "ready")
                return
            if job.passes < self.fast_passes:
                delay = self.base_backoff * 2 ** (job.passes - 1)
            else:
                delay = self.slow_backoff
            delay *= self.rng.uniform(0.5, 1.5)
            job.wake_at = min(now + delay, job.deadline)
            job.parked = False
            self._move(job, "failed", "waiting")
        else:
            raise RelayCoreError(f"federation job {job_id}: unknown outcome {outcome!r} "
                                 f"in state {job.state!r}")

    def twin_of(self, job_id: int) -> int | None:
        """The destination twin of a pending job, or None."""
        job = self._jobs.get(job_id)
        return job.env.destination.twin if job is not None else None

    def jobs_for(self, twin: int) -> list[int]:
        """Ids of the pending jobs whose envelope is for twin `twin` (any state)."""
        return [j.id for j in self._jobs.values() if j.env.destination.twin == twin]

    def _release_circuits(self, domains: list[str]) -> None:
        """A job no longer counts on `domains`: each circuit loses one job and goes when it
        has none left and nothing probing or in flight."""
        for d in domains:
            c = self._circuits.get(d)
            if c is not None:
                c.jobs -= 1
                if c.jobs <= 0 and not c.probing and not c.inflight:
                    del self._circuits[d]

    def retarget(self, job_id: int, domains: list[str], now: float) -> bool:
        """The destination twin's record now lists `domains` (its twin moved relays, e.g.
        a relay was retired and a new one joined): the job's later attempts go there. A
        job waiting for its backoff or for a circuit starts a new pass over the new
        domains at once; a ready job starts it now; a job in flight keeps its attempt and
        uses the new domains from its next one. Returns False (nothing changed) when the
        domains are the ones the job already has or the job is unknown. Raises
        RelayCoreError for no domains. Without it a job kept retrying the relays it was
        submitted with until its TTL ran out, although the twin was reachable elsewhere."""
        if not domains:
            raise RelayCoreError("federation needs at least one relay domain")
        job = self._jobs.get(job_id)
        domains = list(dict.fromkeys(domains))
        if job is None or domains == job.domains:
            return False
        self._release_circuits(job.domains)
        job.domains = domains
        for d in domains:
            self._circuits.setdefault(d, _Circuit()).jobs += 1
        if job.state == "in_flight":
            job.order = [job.domain] + [d for d in domains if d != job.domain]
            job.index = 0
        elif job.state == "ready":
            job.passes -= 1
            self._start_pass(job, now)
            self._ready.append(job.id)              # also when it waited for a slot
        elif job.state == "waiting":
            job.wake_at = now
            job.parked = False
            job.passes = max(0, job.passes - 1)     # the new pass is not a retry
            heapq.heappush(self._heap, (min(job.wake_at, job.deadline), job.id))
        return True

    def twins(self) -> set[int]:
        """The destination twins of every pending job (any state)."""
        return {j.env.destination.twin for j in self._jobs.values()}

    def hurry(self, now: float) -> int:
        """The relay is shutting down: every job waiting for its backoff is due now (its
        next pass starts at the next handle_timer); jobs parked on an open circuit keep
        waiting for it to half-open. Returns the number of jobs woken. What is not sent
        before the drain's deadline is saved to the outbox (DESIGN.md section 2)."""
        woken = 0
        for job in self._jobs.values():
            if job.state == "waiting" and not job.parked and job.wake_at > now:
                job.wake_at = now
                heapq.heappush(self._heap, (min(job.wake_at, job.deadline), job.id))
                woken += 1
        return woken

    def withdraw(self, job_id: int) -> _Job | None:
        """Takes a job that is not in flight out of the plan without an event (the
        destination twin is now served by this relay: the caller delivers it) and
        returns it (fields env, data, context), or None when it is unknown or in flight."""
        job = self._jobs.get(job_id)
        if job is None or job.state == "in_flight":
            return None
        self._move(job, "withdraw", "done")
        return job

    def _top(self) -> float | None:
        heap = self._heap
        while heap:
            when, jid = heap[0]
            job = self._jobs.get(jid)
            if job is not None and ((job.state == "waiting" and when == min(job.wake_at, job.deadline))
                                    or (job.state == "ready" and when == job.deadline)):
                return when
            heapq.heappop(heap)                        # stale entry
        return None

    def get_timer(self) -> float | None:
        """The next time (unix s) handle_timer has work: a backoff ends or a deadline."""
        return self._top()

    def handle_timer(self, now: float) -> None:
        while True:
            when = self._top()
            if when is None or when > now:
                return
            _, jid = heapq.heappop(self._heap)
            job = self._jobs[jid]
            if now >= job.deadline:
                self._move(job, "expire", "done")
                self._expire(job)
            elif job.state == "waiting":
                self._move(job, "wake", "ready")
                if not job.parked:
                    self._start_pass(job, now)
                job.parked = False

    def next_event(self) -> FederationEvent | None:
        return self._events.popleft() if self._events else None


