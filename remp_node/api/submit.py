"""A client that spreads external messages over several full nodes of one REMP network.

Users add full nodes to serve more messages (every full node has its own API, data
directory and REMP client; validators send each message's receipts to the full node(s)
that sent it to them). This client takes the base URLs of the full nodes it may use and
talks to them only through the documented HTTP API (docs/remp-fullnode.md):
`POST /messages` (body: the BOC in base64) and `GET /messages/{id}`.

Placing one message (`Submitter.submit`):

- the full nodes are tried round robin, skipping those that refused (until their
  Retry-After has passed) or did not answer (for `down_for` seconds);
- 202 (accepted) or 409 (already final there) places it; 400 / 413 / 422 (the message
  itself is refused: undecodable, too large, RejectedByFullnode) end it without a retry,
  since every full node of the network checks the same rules against the same chain;
- 503 or 429 is a refusal for load: that full node is skipped until its `Retry-After`
  (RFC 9110 section 10.2.3: delay-seconds or an HTTP-date; 1 s when absent) and the next
  one is tried at once; when every full node refuses or is down, the client sleeps until
  the earliest one may be tried again, so a refused message is retried after its
  Retry-After;
- no answer (connection refused or reset, `request_timeout` s without a response) or
  another 5xx: that full node counts as down for `down_for` s and the next is tried;
- at most `max_attempts` tries and `max_wait` s of sleeping per message; past either the
  message is reported as not placed (`Submitter.unplaced`), with the last answer.

Following a message (`Submitter.outcome`, `Submitter.wait_final`): `GET /messages/{id}` at
the full node that took it. When that full node does not answer (or no longer knows the
message: 404) the message is placed again on another full node (failover); the validators'
message cache (DESIGN.md section 4: a copy is answered `Duplicate`, never queued twice) and
the chain keep it to one execution, and the new full node learns the outcome from the
validators' receipts and from the chain it follows.

Figures (`Submitter.report()`): per full node, messages placed, refusals by reason
(`pending_full`, `client_rate`, ... as the 503 body names them), failed tries; failovers;
messages not placed.

Errors: nothing raises for a full node's answer; `ValueError` for an empty URL list.
"""
from __future__ import annotations

import asyncio
import base64
import email.utils
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

__all__ = ["Submitter", "Placed", "Unplaced", "parse_retry_after", "NodeState"]

#: statuses that end a message without a retry (the message itself is refused)
FINAL_REFUSALS = (400, 413, 422)
#: statuses that are a refusal for load (retry after Retry-After)
LOAD_REFUSALS = (429, 503)


def parse_retry_after(value: str | None, now_unix: float, default: float = 1.0) -> float:
    """Seconds to wait from a Retry-After header value (RFC 9110 section 10.2.3:
    delay-seconds, or an HTTP-date compared with `now_unix`, Unix seconds); `default` when
    the header is absent or malformed; never negative."""
    if value is None:
        return default
    v = value.strip()
    if v.isdigit():
        return float(int(v))
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError, IndexError):
        return default
    if when is None:
        return default
    return max(0.0, when.timestamp() - now_unix)


@dataclass
class NodeState:
    """One full node as the client sees it. url: base URL; free_at: monotonic seconds before
    which it is not tried (a refusal's Retry-After, or `down_for` after no answer); counts."""

    url: str
    free_at: float = 0.0
    placed: int = 0
    refused: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)


@dataclass(frozen=True)
class Placed:
    """A message a full node took (202) or already held as final (409), or refused for
    what it is (400 / 413 / 422: `status` says which; message_id is "" for a 400).
    node: the full node's base URL; doc: its JSON answer; attempts: tries it took."""

    message_id: str
    node: str
    status: int
    doc: dict
    attempts: int


@dataclass(frozen=True)
class Unplaced:
    """A message no full node took within the bounds: attempts made, the last answer
    (`last`: "503 pending_full", "ClientConnectorError", ...)."""

    attempts: int
    last: str


class Submitter:
    """Submitter(urls, session=None, *, max_attempts=20, max_wait=300.0, down_for=2.0,
    request_timeout=10.0). urls: base URLs of the full nodes ("http://127.0.0.1:8001");
    session: an aiohttp.ClientSession to use (one is made, and closed by close(), when
    None). Times in seconds. See the module doc for the rules."""

    def __init__(self, urls: list[str], session: aiohttp.ClientSession | None = None, *,
                 max_attempts: int = 20, max_wait: float = 300.0, down_for: float = 2.0,
                 request_timeout: float = 10.0):
        if not urls:
            raise ValueError("Submitter needs at least one full node URL")
        self.nodes = [NodeState(u.rstrip("/")) for u in urls]
        self._rr = itertools.cycle(range(len(self.nodes)))
        self._session = session
        self._own_session = session is None
        self.max_attempts = max_attempts
        self.max_wait = max_wait
        self.down_for = down_for
        self.timeout = aiohttp.ClientTimeout(total=request_timeout)
        self.where: dict[str, NodeState] = {}        # message id -> the full node following it
        self.bocs: dict[str, bytes] = {}             # message id -> BOC, until final
        self.outcomes: dict[str, dict] = {}          # message id -> GET's `outcome` once final
        self.unplaced: list[Unplaced] = []
        self.failovers = 0

    async def __aenter__(self) -> "Submitter":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    def _s(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    def _pick(self, now: float, avoid: NodeState | None) -> NodeState | None:
        """The next full node in round-robin order that may be tried now (not `avoid` when
        another one may); None when none may."""
        fallback = None
        for _ in range(len(self.nodes)):
            n = self.nodes[next(self._rr)]
            if n.free_at > now:
                continue
            if n is avoid and len(self.nodes) > 1:
                fallback = n
                continue
            return n
        return fallback

    # -- placing --------------------------------------------------------------------------
    async def submit(self, boc: bytes, avoid: str | None = None) -> Placed | Unplaced:
        """Place one message (module doc). avoid: a full node URL not to use while another
        one may be tried (failover). Returns Placed or Unplaced (also kept in .unplaced)."""
        body = base64.b64encode(boc)
        attempts, waited, last = 0, 0.0, "no full node tried"
        skip = next((n for n in self.nodes if n.url == (avoid or "").rstrip("/")), None)
        while attempts < self.max_attempts:
            now = time.monotonic()
            node = self._pick(now, skip)
            if node is None:
                wait = max(0.01, min(n.free_at for n in self.nodes) - now)
                if waited + wait > self.max_wait:
                    break
                await asyncio.sleep(wait)
                waited += wait
                continue
            attempts += 1
            try:
                async with self._s().post(node.url + "/messages", data=body, timeout=self.timeout) as r:
                    status = r.status
                    retry_after = r.headers.get("Retry-After")
                    try:
                        doc = await r.json(content_type=None)
                    except ValueError:
                        doc = {}
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                node.errors[type(exc).__name__] += 1
                node.free_at = time.monotonic() + self.down_for
                last = f"{node.url}: {type(exc).__name__}"
                continue
            doc = doc if isinstance(doc, dict) else {}
            if status in (202, 409):
                mid = doc.get("message_id", "")
                node.placed += 1
                if mid:
                    self.where[mid] = node
                    if status == 409 and isinstance(doc.get("outcome"), dict):
                        self.outcomes[mid] = doc["outcome"]
                    else:
                        self.bocs[mid] = boc
                return Placed(mid, node.url, status, doc, attempts)
            if status in FINAL_REFUSALS:
                if doc.get("message_id"):       # the full node holds this outcome (GET)
                    self.where[doc["message_id"]] = node
                return Placed(doc.get("message_id", ""), node.url, status, doc, attempts)
            if status in LOAD_REFUSALS:
                delay = parse_retry_after(retry_after, time.time())
                node.refused[str(doc.get("reason") or status)] += 1
                node.free_at = time.monotonic() + delay
                last = f"{node.url}: {status} {doc.get('reason', '')}".rstrip()
                continue
            node.errors[str(status)] += 1
            node.free_at = time.monotonic() + self.down_for
            last = f"{node.url}: {status}"
        u = Unplaced(attempts, last)
        self.unplaced.append(u)
        return u

    # -- following --------------------------------------------------------------------------
    async def outcome(self, message_id: str) -> dict | None:
        """GET's `outcome` for a placed message once final (then kept), else None. When the
        full node following it does not answer or no longer knows it, the message is placed
        on another full node (a failover; counted) and None is returned."""
        if message_id in self.outcomes:
            return self.outcomes[message_id]
        node = self.where.get(message_id)
        if node is None:
            raise KeyError(f"message {message_id} was not placed by this client")
        try:
            async with self._s().get(f"{node.url}/messages/{message_id}", timeout=self.timeout) as r:
                status = r.status
                doc = await r.json(content_type=None) if status in (200, 404) else {}
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            node.errors[type(exc).__name__] += 1
            node.free_at = max(node.free_at, time.monotonic() + self.down_for)
            status, doc = 0, {}
        if status == 200 and isinstance(doc, dict):
            out = doc.get("outcome") or {}
            if out.get("final"):
                self.outcomes[message_id] = out
                self.bocs.pop(message_id, None)
                return out
            return None
        if status in (0, 404) and message_id in self.bocs:
            self.failovers += 1
            res = await self.submit(self.bocs[message_id], avoid=node.url)
            if isinstance(res, Placed) and res.status in FINAL_REFUSALS:
                # the other full node refused it for what it is (e.g. the transfer's
                # valid_until passed meanwhile): that is its outcome there
                self.outcomes[message_id] = {"final": True, "outcome": "rejected",
                                             "kind": res.doc.get("kind", str(res.status)),
                                             "reason": res.doc.get("reason") or res.doc.get("error", "")}
                self.bocs.pop(message_id, None)
                return self.outcomes[message_id]
        return None

    async def wait_final(self, ids, deadline: float, poll: float = 1.0) -> dict[str, dict]:
        """Outcomes of `ids` (message ids placed by this client), polling every `poll` s until
        all are final or time.monotonic() passes `deadline`; returns those final so far."""
        ids = list(ids)
        while True:
            todo = [m for m in ids if m not in self.outcomes]
            for m in todo:
                await self.outcome(m)
            if all(m in self.outcomes for m in ids) or time.monotonic() >= deadline:
                return {m: self.outcomes[m] for m in ids if m in self.outcomes}
            await asyncio.sleep(poll)

    def report(self) -> dict:
        """{"nodes": {url: {"placed", "refused": {reason: n}, "errors": {what: n}}},
        "failovers": n, "unplaced": n}."""
        return {"nodes": {n.url: {"placed": n.placed, "refused": dict(n.refused), "errors": dict(n.errors)}
                          for n in self.nodes},
                "failovers": self.failovers, "unplaced": len(self.unplaced)}
