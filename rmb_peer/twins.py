"""Twin directory: the client side of the twin registry (DESIGN.md section 3, "Twin lookup").

rmb-rs reads twins from tfchain; the suite ships a registry service (rmb_relay/registry.py)
instead. A twin is {id, account (32-byte public key), relays: [domains], pk: 33-byte
secp256k1 | null}. Writes are signed by the twin's account key over `write_challenge(...)`,
which carries a unix timestamp the registry checks against its replay window.

`TwinDirectory` is the asyncio adapter relays and peers use: HTTP (aiohttp) with a TTL cache
and one in-flight request per key (concurrent lookups of one twin share a request). When
the registry is unreachable (DirectoryError) the last known record is served for up to
`max_stale` seconds past its TTL (stale-if-error, reported through `on_stale`); an
unknown twin may be remembered for `negative_ttl` seconds; both tables are bounded.
"""
from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import aiohttp
import orjson

from rmb_peer.errors import RmbRemoteError
from rmb_peer.freshness import TwinFreshness
from rmb_peer.identity import Identity

__all__ = ["TwinFreshness", "Twin", "UnknownTwin", "DirectoryError", "RegistryRefused", "TwinDirectory",
           "TwinRecordError", "write_challenge", "signed_write_body", "validate_relays",
           "validate_pk", "MAX_RELAYS", "MAX_DOMAIN_LEN", "MAX_RECORD_BYTES"]

#: At most this many relay domains per twin (rmb-peer allows <= 4; headroom for tests).
MAX_RELAYS = 8
#: Longest accepted relay domain, characters.
MAX_DOMAIN_LEN = 253
_DOMAIN_RE = re.compile(r"^[A-Za-z0-9._\-\[\]:]+$")
#: Largest registry answer read, bytes (a twin record is < 1 KiB).
MAX_RECORD_BYTES = 64 * 1024


class TwinRecordError(RmbRemoteError):
    """A twin record (registry JSON, a persisted record) is malformed: names the field."""


@dataclass
class Twin:
    """A registered twin. id: uint32 twin id; account: 32-byte account (signing) key;
    relays: relay domains "host[:port]"; pk: 33-byte compressed secp256k1 key or None."""

    id: int
    account: bytes
    relays: list[str] = field(default_factory=list)
    pk: bytes | None = None

    def to_json(self) -> dict[str, Any]:
        """The registry's JSON form: {id, account: hex, relays: [..], pk: hex|null}."""
        return {"id": self.id, "account": self.account.hex(), "relays": list(self.relays),
                "pk": self.pk.hex() if self.pk is not None else None}

    @classmethod
    def from_json(cls, obj: Any) -> "Twin":
        """Inverse of to_json. Raises TwinRecordError (a ValueError) for a malformed record."""
        if not isinstance(obj, dict):
            raise TwinRecordError("twin record is not an object")
        tid = obj.get("id")
        if not isinstance(tid, int) or isinstance(tid, bool) or not (0 < tid < 2**32):
            raise TwinRecordError(f"bad twin id {str(tid)[:32]!r}")
        account = obj.get("account")
        try:
            account = bytes.fromhex(account) if isinstance(account, str) else b""
        except ValueError:
            raise TwinRecordError("twin account is not hex") from None
        if len(account) != 32:
            raise TwinRecordError("twin account is not 32 bytes")
        relays = validate_relays(obj.get("relays"))
        pk = validate_pk(obj.get("pk"))
        return cls(tid, account, relays, pk)


class UnknownTwin(LookupError):
    """The registry has no twin with this id / account (HTTP 404)."""


class DirectoryError(RuntimeError):
    """The registry could not be reached or answered something unusable (5xx, bad JSON)."""


class RegistryRefused(DirectoryError):
    """The registry refused a write (4xx). `status`: HTTP status; `reason`: its message."""

    def __init__(self, status: int, reason: str):
        super().__init__(f"registry refused ({status}): {reason}")
        self.status = status
        self.reason = reason


def validate_relays(relays: Any) -> list[str]:
    """A list of 0..MAX_RELAYS relay domains ("host" or "host:port", no spaces or commas).
    Raises ValueError naming the bad entry."""
    if not isinstance(relays, list):
        raise TwinRecordError("relays must be a list of domains")
    if len(relays) > MAX_RELAYS:
        raise TwinRecordError(f"too many relays: {len(relays)} > {MAX_RELAYS}")
    for r in relays:
        if not isinstance(r, str) or not r or len(r) > MAX_DOMAIN_LEN or not _DOMAIN_RE.match(r):
            raise TwinRecordError(f"bad relay domain {r!r}")
    if len(set(relays)) != len(relays):
        raise TwinRecordError("duplicate relay domain")
    return list(relays)


def validate_pk(pk: Any) -> bytes | None:
    """None, or hex of a 33-byte compressed secp256k1 point (prefix 02/03). Raises ValueError."""
    if pk is None:
        return None
    if isinstance(pk, (bytes, bytearray)):
        raw = bytes(pk)
    elif isinstance(pk, str):
        try:
            raw = bytes.fromhex(pk)
        except ValueError:
            raise TwinRecordError("pk is not hex") from None
    else:
        raise TwinRecordError("pk must be hex or null")
    if len(raw) != 33 or raw[0] not in (2, 3):
        raise TwinRecordError("pk must be a 33-byte compressed secp256k1 key")
    return raw


def write_challenge(op: str, twin_id: int, account: bytes, relays: list[str],
                    pk: bytes | None, timestamp: int) -> bytes:
    """Canonical bytes a registry write is signed over (the account key signs them whole):

        "rmb-registry/v1\\n" op "\\n" twin_id "\\n" account_hex "\\n" relays joined by ","
        "\\n" pk_hex (or "") "\\n" timestamp

    op: "create" (twin_id 0) or "update"; timestamp: unix seconds, decimal. Relay domains
    can hold neither "," nor "\\n" (validate_relays), so the encoding is unambiguous."""
    if op not in ("create", "update"):
        raise ValueError(f"unknown registry op {op!r}")
    return "\n".join([
        "rmb-registry/v1", op, str(int(twin_id)), bytes(account).hex(), ",".join(relays),
        pk.hex() if pk else "", str(int(timestamp)),
    ]).encode()


def signed_write_body(identity: Identity, op: str, twin_id: int, relays: list[str],
                      pk: bytes | None, timestamp: int) -> dict[str, Any]:
    """The JSON body of POST /twins (op "create") or PUT /twins/{id} (op "update"):
    {account, relays, pk, timestamp, signature: hex of the 65-byte typed signature}."""
    relays = validate_relays(list(relays))
    pk = validate_pk(pk)
    sig = identity.sign(write_challenge(op, twin_id, identity.account, relays, pk, timestamp))
    return {"account": identity.account.hex(), "relays": relays,
            "pk": pk.hex() if pk else None, "timestamp": int(timestamp), "signature": sig.hex()}


class TwinDirectory:
    """Async client of the twin registry with a TTL cache and stale-if-error.

    base_url: e.g. "http://127.0.0.1:8100"; cache_ttl: seconds a looked-up twin is reused;
    session: an aiohttp.ClientSession to share (else one is created and owned);
    clock: monotonic seconds source (tests may pass a fake one); timeout: seconds per request;
    max_stale: seconds past its TTL a record is still served when the registry cannot be
    reached or answers 5xx (DirectoryError), 0 = never; on_stale(twin, age_s, error) is
    called each time a stale record is served (log it); negative_ttl: seconds an unknown
    twin (404) is remembered, 0 = not remembered; max_records: records (and, separately,
    unknown ids) held, oldest dropped first.
    Lookups raise UnknownTwin (404) or DirectoryError (unreachable, 5xx, malformed answer,
    and no record young enough to serve stale).
    """

    def __init__(self, base_url: str, cache_ttl: float = 60.0,
                 session: aiohttp.ClientSession | None = None,
                 clock: Callable[[], float] = time.monotonic, timeout: float = 5.0,
                 max_stale: float = 3600.0,
                 on_stale: Callable[[Twin, float, Exception], None] | None = None,
                 negative_ttl: float = 0.0, max_records: int = 100_000):
        self.base_url = base_url.rstrip("/")
        self.freshness = TwinFreshness(cache_ttl, max_stale)
        self.on_stale = on_stale
        self.negative_ttl = negative_ttl
        self.max_records = max(1, int(max_records))
        self._session = session
        self._own_session = session is None
        self._clock = clock
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        #: key -> (twin, fetched at) on self._clock; oldest first
        self._by_id: OrderedDict[int, tuple[Twin, float]] = OrderedDict()
        self._by_account: OrderedDict[bytes, tuple[Twin, float]] = OrderedDict()
        #: lookup key -> unknown until (clock)
        self._unknown: OrderedDict[Any, float] = OrderedDict()
        self._inflight: dict[Any, asyncio.Future] = {}
        #: number of HTTP lookups made (cache misses), for tests and metrics
        self.fetches = 0
        #: number of times a stale record was served because the registry failed
        self.stale_served = 0

    @property
    def cache_ttl(self) -> float:
        return self.freshness.ttl

    @cache_ttl.setter
    def cache_ttl(self, value: float) -> None:
        self.freshness = TwinFreshness(value, self.freshness.max_stale)

    @property
    def max_stale(self) -> float:
        return self.freshness.max_stale

    @max_stale.setter
    def max_stale(self, value: float) -> None:
        self.freshness = TwinFreshness(self.freshness.ttl, value)

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
            self._own_session = True
        return self._session

    async def _request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        try:
            async with self._sess().request(method, self.base_url + path, json=body,
                                            timeout=self._timeout) as resp:
                raw = await resp.content.read(MAX_RECORD_BYTES + 1)
                if len(raw) > MAX_RECORD_BYTES:
                    raise DirectoryError(f"registry {self.base_url} answer larger than "
                                         f"{MAX_RECORD_BYTES} bytes")
                try:
                    data = orjson.loads(raw) if raw else None
                except orjson.JSONDecodeError:
                    data = None
                return resp.status, data
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            # str() reads as an operator expects ("Cannot connect to host ..."); a timeout's
            # str() is empty, so name the type then
            raise DirectoryError(f"registry {self.base_url} unreachable: "
                                 f"{str(exc) or type(exc).__name__}") from None

    @staticmethod
    def _put(table: OrderedDict, key: Any, value: Any, limit: int) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > limit:
            table.popitem(last=False)

    def _remember(self, twin: Twin) -> Twin:
        now = self._clock()
        self._put(self._by_id, twin.id, (twin, now), self.max_records)
        self._put(self._by_account, twin.account, (twin, now), self.max_records)
        self._unknown.pop(("id", twin.id), None)
        self._unknown.pop(("account", twin.account), None)
        return twin

    def _cached(self, table: dict, key: Any) -> Twin | None:
        hit = table.get(key)
        if hit is None or not self.freshness.fresh(self._clock() - hit[1]):
            return None   # kept: a stale record is still served if the registry fails
        return hit[0]

    def _stale(self, table: dict, key: Any, exc: Exception) -> Twin | None:
        hit = table.get(key)
        if hit is None:
            return None
        age = self._clock() - hit[1]
        if not self.freshness.servable(age):
            return None
        self.stale_served += 1
        if self.on_stale is not None:
            self.on_stale(hit[0], age, exc)
        return hit[0]

    async def _lookup(self, key: Any, path: str, what: str, table: dict, tkey: Any) -> Twin:
        fut = self._inflight.get(key)
        if fut is not None:
            return await asyncio.shield(fut)
        until = self._unknown.get(key)
        if until is not None:
            if until > self._clock():
                raise UnknownTwin(f"unknown twin {what} (remembered)")
            del self._unknown[key]
        fut = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            self.fetches += 1
            try:
                status, data = await self._request("GET", path)
                if status == 404:
                    table.pop(tkey, None)
                    if self.negative_ttl > 0:
                        self._put(self._unknown, key, self._clock() + self.negative_ttl,
                                  self.max_records)
                    raise UnknownTwin(f"unknown twin {what}")
                if status != 200:
                    reason = data.get("error") if isinstance(data, dict) else None
                    raise DirectoryError(f"registry answered {status} for twin {what}: "
                                         f"{str(reason)[:200]}")
                try:
                    twin = self._remember(Twin.from_json(data))
                except ValueError as exc:
                    raise DirectoryError(f"malformed twin record for {what}: {exc}") from None
            except DirectoryError as exc:
                twin = self._stale(table, tkey, exc)
                if twin is None:
                    raise
            fut.set_result(twin)
            return twin
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except BaseException as exc:
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # mark retrieved: waiters (if any) re-raise it
            raise
        finally:
            self._inflight.pop(key, None)

    async def get(self, twin_id: int, fresh: bool = False) -> Twin:
        """The twin with this id (cached for cache_ttl s; stale-if-error up to max_stale s
        more; fresh=True asks the registry even when the cached record is within its TTL,
        still serving it if the registry fails). Raises UnknownTwin / DirectoryError."""
        twin_id = int(twin_id)
        if not (0 < twin_id < 2**32):
            raise UnknownTwin(f"unknown twin {twin_id} (ids are 1..2^32-1)")
        hit = None if fresh else self._cached(self._by_id, twin_id)
        if hit is not None:
            return hit
        return await self._lookup(("id", twin_id), f"/twins/{twin_id}", str(twin_id),
                                  self._by_id, twin_id)

    async def get_by_account(self, account: bytes) -> Twin:
        """The twin registered with this 32-byte account key (cached like get()).
        Raises UnknownTwin / DirectoryError."""
        account = bytes(account)
        hit = self._cached(self._by_account, account)
        if hit is not None:
            return hit
        return await self._lookup(("account", account), f"/twins?account={account.hex()}",
                                  "with account " + account.hex(), self._by_account, account)

    async def _write(self, method: str, path: str, body: dict) -> Twin:
        status, data = await self._request(method, path, body)
        if status in (200, 201):
            try:
                return self._remember(Twin.from_json(data))
            except ValueError as exc:
                raise DirectoryError(f"malformed twin record in answer: {exc}") from None
        reason = data.get("error") if isinstance(data, dict) else f"HTTP {status}"
        if status == 404:
            raise UnknownTwin(str(reason))
        if 400 <= status < 500:
            raise RegistryRefused(status, str(reason))
        raise DirectoryError(f"registry answered {status}: {reason}")

    async def create(self, identity: Identity, relays: list[str], pk: bytes | None,
                     now: int | None = None) -> Twin:
        """Register a new twin for identity's account key (POST /twins, signed). `now`: unix
        s for the signed timestamp (default: the wall clock). Raises RegistryRefused
        (409 account already registered, 401 bad signature/stale, 400 malformed)."""
        ts = int(time.time()) if now is None else int(now)
        return await self._write("POST", "/twins",
                                 signed_write_body(identity, "create", 0, relays, pk, ts))

    async def update(self, identity: Identity, twin_id: int, relays: list[str],
                     pk: bytes | None, now: int | None = None) -> Twin:
        """Replace twin `twin_id`'s relays and pk (PUT /twins/{id}, signed by its account key).
        Raises UnknownTwin (404), RegistryRefused (401 wrong key/stale, 409 replayed)."""
        ts = int(time.time()) if now is None else int(now)
        self.invalidate(twin_id)
        return await self._write("PUT", f"/twins/{int(twin_id)}",
                                 signed_write_body(identity, "update", twin_id, relays, pk, ts))

    def invalidate(self, twin_id: int) -> None:
        """Forget the cached record of this twin (next get() asks the registry; nothing
        stale is left to serve if it fails)."""
        hit = self._by_id.pop(int(twin_id), None)
        self._unknown.pop(("id", int(twin_id)), None)
        if hit is not None:
            self._by_account.pop(hit[0].account, None)

    async def close(self) -> None:
        """Close the HTTP session if this directory created it."""
        if self._own_session and self._session is not None and not self._session.closed:
            await self._session.close()
