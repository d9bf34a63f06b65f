"""Per-destination link model (test only): one-way delay, jitter, loss, duplication and
reordering that a daemon's transport adapter applies to what it sends.

Why it exists: the kernel here has no `netem` qdisc, so delay and loss between network
namespaces cannot come from `tc`; the testnet (deploy/testnet.py) caps bandwidth with
`tbf` and hands every daemon a link model for the rest (docs/testnet.md). The model is pure:
it reads no clock and does no I/O; a decision takes the caller's `now` (seconds) and draws
from the model's own seeded `random.Random`, so a run is reproducible.

Spec text (`parse`): rules separated by ";", each rule "DEST key=value ..." where DEST is an
IPv4/IPv6 address, a CIDR network or "*" (every other destination); the most specific
matching network wins. A rule whose first token holds "=" sets model options (`seed=N`).

    198.18.1.0/24 delay_ms=10 jitter_ms=1; 198.18.2.0/24 delay_ms=60 jitter_ms=5 loss=0.01; seed=7

Link keys: delay_ms (one-way, >= 0), jitter_ms (uniform extra delay in [0, jitter_ms]),
loss, dup, reorder (probabilities in [0, 1]), reorder_ms (extra delay of a reordered
datagram, uniform in [0, reorder_ms], default 20). Errors: LinkModelError (a ValueError)
naming the bad rule or value.

Datagrams (`LinkModel.datagram`): lost with probability loss; else one copy (two with
probability dup), each delayed by delay + uniform(0, jitter) (+ a reorder delay with
probability reorder), so jitter reorders datagrams as a real path can.

Streams (`LinkModel.stream_release`, TCP and WebSocket frames): TCP never loses, duplicates or
reorders what it delivers, so a frame is delayed by delay + uniform(0, jitter), is never
released before the previous frame to the same destination (FIFO), and a "lost" frame is
delivered after a retransmission penalty of max(RTO_MIN, 3 x delay) instead (RTO_MIN = 0.2 s,
Linux's minimum retransmission timeout, RFC 6298 section 2.4 allows 1 s; a fast retransmit
takes about one round trip more). Duplicates are not modelled on streams (TCP drops them).

From the environment (`from_env`): the variable RELAY_SUITE_LINKS holds spec text or
"@PATH" of a file holding it; unset or empty means no model (the adapters then add nothing).
The adapters' hooks: `DatagramFaults` (the `plan(addr)` interface of remp_node.transport.udp.Faults),
`delay_transport(transport, host)` (an asyncio transport whose writes leave late, FIFO) and
`await pause(host)` (one request, e.g. an HTTP POST).
"""
from __future__ import annotations

import asyncio
import collections
import ipaddress
import logging
import os
import random
from dataclasses import dataclass
from typing import Iterable

__all__ = ["Link", "LinkModel", "LinkModelError", "parse", "from_env", "format_spec", "DatagramFaults",
           "delay_transport", "pause", "ENV", "RTO_MIN"]

#: environment variable naming the model of a daemon (spec text or @file)
ENV = "RELAY_SUITE_LINKS"
#: seconds: the retransmission penalty's floor on streams (Linux TCP_RTO_MIN)
RTO_MIN = 0.2

log = logging.getLogger("daemon_runtime.linkmodel")


class LinkModelError(ValueError):
    """A malformed link-model spec: names the rule and the value."""


@dataclass(frozen=True)
class Link:
    """One direction of a path. delay, jitter, reorder_delay in seconds; loss, dup, reorder
    probabilities in [0, 1]."""

    delay: float = 0.0
    jitter: float = 0.0
    loss: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    reorder_delay: float = 0.02

    def __post_init__(self):
        for name in ("loss", "dup", "reorder"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise LinkModelError(f"{name}={v} is not a probability in [0, 1]")
        for name in ("delay", "jitter", "reorder_delay"):
            v = getattr(self, name)
            if not 0.0 <= v <= 60.0:
                raise LinkModelError(f"{name}={v} s is outside [0, 60] s")

    def spec(self) -> str:
        """This link as the key=value tokens of a spec rule."""
        out = [f"delay_ms={self.delay * 1e3:g}"]
        if self.jitter:
            out.append(f"jitter_ms={self.jitter * 1e3:g}")
        for k in ("loss", "dup", "reorder"):
            if getattr(self, k):
                out.append(f"{k}={getattr(self, k):g}")
        if self.reorder:
            out.append(f"reorder_ms={self.reorder_delay * 1e3:g}")
        return " ".join(out)


_KEYS = {"delay_ms": ("delay", 1e-3), "jitter_ms": ("jitter", 1e-3), "loss": ("loss", 1.0),
         "dup": ("dup", 1.0), "reorder": ("reorder", 1.0), "reorder_ms": ("reorder_delay", 1e-3)}


class LinkModel:
    """rules: [(network or None for "*", Link)]; seed: the RNG seed. Counters in `stats`
    (sends seen, lost, duplicated, reordered, delayed; penalised for stream frames)."""

    def __init__(self, rules: Iterable[tuple[ipaddress._BaseNetwork | None, Link]], seed: int = 0):
        rules = list(rules)
        self.default: Link | None = next((lk for net, lk in rules if net is None), None)
        # most specific first: the first match wins
        self.rules = sorted(((n, lk) for n, lk in rules if n is not None), key=lambda r: -r[0].prefixlen)
        self.seed = seed
        self.rng = random.Random(seed)
        self.stats = {"sent": 0, "lost": 0, "duplicated": 0, "reordered": 0, "delayed": 0, "penalised": 0}
        self._cache: dict[str, Link | None] = {}
        self._last: dict[str, float] = {}

    def link_for(self, host: str) -> Link | None:
        """The Link toward `host` (an address string), or None (nothing applied)."""
        if host in self._cache:
            return self._cache[host]
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            found = self.default
        else:
            found = next((lk for net, lk in self.rules if addr.version == net.version and addr in net),
                         self.default)
        if len(self._cache) < 4096:
            self._cache[host] = found
        return found

    def _delay(self, lk: Link) -> float:
        d = lk.delay + (self.rng.uniform(0.0, lk.jitter) if lk.jitter else 0.0)
        if lk.reorder and self.rng.random() < lk.reorder:
            self.stats["reordered"] += 1
            d += self.rng.uniform(0.0, lk.reorder_delay)
        return d

    def datagram(self, host: str) -> list[float]:
        """Delays (s) of the copies of one datagram to `host` ([] = lost, [0.0] = untouched)."""
        lk = self.link_for(host)
        if lk is None:
            return [0.0]
        st = self.stats
        st["sent"] += 1
        if lk.loss and self.rng.random() < lk.loss:
            st["lost"] += 1
            return []
        out = [self._delay(lk)]
        if lk.dup and self.rng.random() < lk.dup:
            st["duplicated"] += 1
            out.append(self._delay(lk))
        if out[0] > 0:
            st["delayed"] += 1
        return out

    def stream_release(self, host: str, now: float, key: object = None) -> float:
        """When (same clock as `now`, s) a frame handed over at `now` to the stream toward
        `host` may be written: delay + jitter (+ the retransmission penalty with probability
        loss), never before the previous frame of the same stream (`key`, default `host`)."""
        lk = self.link_for(host)
        if lk is None:
            return now
        st = self.stats
        st["sent"] += 1
        d = lk.delay + (self.rng.uniform(0.0, lk.jitter) if lk.jitter else 0.0)
        if lk.loss and self.rng.random() < lk.loss:
            st["penalised"] += 1
            d += max(RTO_MIN, 3.0 * lk.delay)
        if d > 0:
            st["delayed"] += 1
        k = host if key is None else key
        at = max(now + d, self._last.get(k, now))
        self._last[k] = at
        return at

    def forget(self, key: object) -> None:
        """Drop the FIFO state of a closed stream."""
        self._last.pop(key, None)

    def spec(self) -> str:
        """The model as spec text (parse(m.spec()) gives an equal model)."""
        parts = [f"{net} {lk.spec()}" for net, lk in self.rules]
        if self.default is not None:
            parts.append(f"* {self.default.spec()}")
        parts.append(f"seed={self.seed}")
        return "; ".join(parts)


def parse(text: str) -> LinkModel:
    """Spec text (module doc) -> LinkModel. Raises LinkModelError."""
    rules: list[tuple[ipaddress._BaseNetwork | None, Link]] = []
    seed = 0
    seen: set = set()
    for raw in text.split(";"):
        tokens = raw.split()
        if not tokens:
            continue
        if "=" in tokens[0]:
            for tok in tokens:
                k, _, v = tok.partition("=")
                if k != "seed":
                    raise LinkModelError(f"unknown model option {tok!r} in {raw.strip()!r} (only seed=N)")
                try:
                    seed = int(v)
                except ValueError:
                    raise LinkModelError(f"seed={v!r} is not an integer") from None
            continue
        dest = tokens[0]
        if dest == "*":
            net = None
        else:
            try:
                net = ipaddress.ip_network(dest, strict=False)
            except ValueError:
                raise LinkModelError(f"destination {dest!r} in {raw.strip()!r} is not an address, "
                                     f"network or '*'") from None
        if net in seen:
            raise LinkModelError(f"destination {dest!r} given twice")
        seen.add(net)
        kw = {}
        for tok in tokens[1:]:
            k, sep, v = tok.partition("=")
            if not sep or k not in _KEYS:
                raise LinkModelError(f"bad item {tok!r} in {raw.strip()!r} (keys: {', '.join(_KEYS)})")
            field_name, scale = _KEYS[k]
            try:
                kw[field_name] = float(v) * scale
            except ValueError:
                raise LinkModelError(f"{k}={v!r} is not a number") from None
        rules.append((net, Link(**kw)))
    return LinkModel(rules, seed)


def format_spec(rules: Iterable[tuple[str, Link]], seed: int = 0) -> str:
    """[(dest, Link)] -> spec text; dest is a CIDR, an address or "*"."""
    parts = [f"{dest} {lk.spec()}" for dest, lk in rules]
    parts.append(f"seed={int(seed)}")
    return "; ".join(parts)


_env_model: LinkModel | None = None
_env_read = False


def from_env(environ: dict | None = None) -> LinkModel | None:
    """The process's model from RELAY_SUITE_LINKS (module doc), read once; None when unset.
    A malformed spec raises LinkModelError (the daemon must not run with a model it did not
    understand)."""
    global _env_model, _env_read
    if environ is None and _env_read:
        return _env_model
    env = os.environ if environ is None else environ
    text = env.get(ENV, "").strip()
    model = None
    if text:
        if text.startswith("@"):
            try:
                with open(text[1:], encoding="utf-8") as fh:
                    text = fh.read()
            except OSError as exc:
                raise LinkModelError(f"{ENV}={text}: cannot read the spec file: {exc.strerror}") from None
        model = parse(text)
        log.warning("TEST ONLY link model active (%s): %s", ENV, model.spec())
    if environ is None:
        _env_model, _env_read = model, True
    return model


class DatagramFaults:
    """The remp_node.transport.udp.Faults interface over a LinkModel: plan(addr) -> delays of the
    copies to send ([] = lost); `stats` the model's counters; outbound only."""

    inbound = False

    def __init__(self, model: LinkModel):
        self.model = model
        self.stats = model.stats

    def plan(self, addr=None) -> list[float]:
        if addr is None:
            return [0.0]
        return self.model.datagram(addr[0])


def delay_transport(transport, host: str, model: LinkModel | None = None) -> bool:
    """Make `transport` (an asyncio stream transport of the standard event loop) write each
    chunk at model.stream_release(host, now) (FIFO), and close only after the held-back
    chunks left. Returns False (and changes nothing) without a model, when already done,
    or for a transport whose methods cannot be replaced (uvloop: run the daemon with
    --event-loop asyncio under a link model)."""
    model = model or from_env()
    if model is None or transport is None or getattr(transport, "_linkmodel", False):
        return False
    if model.link_for(host) is None:
        return False
    loop = asyncio.get_event_loop()
    write, close = transport.write, transport.close
    key = id(transport)
    queue: collections.deque[tuple[float, bytes]] = collections.deque()
    state = {"timer": None, "closing": False}

    def _release() -> None:
        state["timer"] = None
        now = loop.time()
        out = []
        while queue and queue[0][0] <= now:
            out.append(queue.popleft()[1])
        if out:
            try:
                write(b"".join(out))
            except (RuntimeError, OSError):
                pass
        if queue:
            state["timer"] = loop.call_at(queue[0][0], _release)
        elif state["closing"]:
            close()

    def delayed_write(data) -> None:
        if not data or state["closing"]:
            return
        now = loop.time()
        at = model.stream_release(host, now, key)
        if at <= now and not queue:
            write(data)
            return
        queue.append((at, bytes(data)))
        if state["timer"] is None:
            state["timer"] = loop.call_at(queue[0][0], _release)

    def delayed_writelines(chunks) -> None:
        delayed_write(b"".join(chunks))

    def delayed_close() -> None:
        model.forget(key)
        if not queue:
            close()
        else:
            state["closing"] = True

    try:
        transport.write = delayed_write
        transport.writelines = delayed_writelines
        transport.close = delayed_close
        transport._linkmodel = True
    except (AttributeError, TypeError):
        log.warning("link model: cannot delay writes on %s (uvloop?): use --event-loop asyncio",
                    type(transport).__name__)
        return False
    return True


async def pause(host: str, model: LinkModel | None = None) -> None:
    """Sleep for one request's one-way delay toward `host` (jitter and the loss penalty
    included; no FIFO: independent requests). Returns at once without a model."""
    model = model or from_env()
    if model is None:
        return
    loop = asyncio.get_running_loop()
    now = loop.time()
    key = object()
    at = model.stream_release(host, now, key)
    model.forget(key)
    if at > now:
        await asyncio.sleep(at - now)
