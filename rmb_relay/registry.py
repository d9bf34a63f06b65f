"""rmb-registry: the twin registry service (DESIGN.md section 3, "Twin lookup").

Stands in for tfchain's twin storage: HTTP JSON (aiohttp), records kept durably in SQLite
(rmb_relay/registry_store.py) under --data-dir, which defaults to `default_data_dir()`
(systemd's $STATE_DIRECTORY, else $XDG_STATE_HOME/relay-suite/rmb-registry, else
~/.local/state/relay-suite/rmb-registry: the XDG Base Directory rule for state), or in
Redis (redis.asyncio) only when `--redis URL` is given without --data-dir; that mode is durable
only if the Redis runs with AOF, and the registry says which at start (event
rmb.registry.storage) and in /health (`durable`). Operator guide: docs/rmb-operations.md.

A twin is {id, account: hex of the 32-byte account key, relays: [domains], pk: hex of the
33-byte secp256k1 key | null}.

Routes:
  POST /twins                 create; body = rmb_peer.twins.signed_write_body(op="create")
                              -> 201 twin | 400 malformed | 401 bad signature / stale
                              timestamp | 409 account already registered
  GET  /twins/{id}            -> 200 twin | 400 bad id | 404 unknown twin
  GET  /twins?account=<hex>   -> 200 twin | 400 bad account | 404 unknown twin
  PUT  /twins/{id}            update relays and pk; body signed by the twin's stored account
                              key (op="update") -> 200 twin | 400 | 401 | 404 | 409 replayed
                              or out-of-order (timestamp older than the last accepted write)
  GET  /health, GET /metrics

Writes are signed over rmb_peer.twins.write_challenge(op, id, account, relays, pk,
timestamp); the timestamp must lie within --replay-window seconds of the registry's clock
and, for updates, not older than the twin's last write; an exact signature already
accepted within the window is refused as a replay (sr25519 signatures are randomized and
ed25519 ones are deterministic over distinct content, so a fresh write always differs). Twin ids are allocated with Redis INCR. Errors are JSON {"error": "<reason>"}.

Redis keys: rmb.registry.next_id (INCR counter), rmb.registry.twin.<id> (hash: account,
relays (JSON), pk, ts), rmb.registry.account.<hex> -> id, rmb.registry.seen.<sha256 of
signature> (EX 2 x window) for replay detection.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import redis.asyncio as aioredis
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from daemon_runtime.eventlog import EventLog
from rmb_peer.events import RMB_EVENTS
from rmb_peer.identity import SignatureError, verify_typed
from rmb_peer.twins import Twin, validate_pk, validate_relays, write_challenge
from rmb_relay.registry_store import RedisTwinStore, SqliteTwinStore, StoreError

__all__ = ["RegistryServer", "create_app", "main", "default_data_dir", "DEFAULT_REPLAY_WINDOW",
           "KEY_PREFIX"]

#: Accepted distance between a write's timestamp and the registry clock, seconds.
DEFAULT_REPLAY_WINDOW = 300
#: Largest accepted request body, bytes.
MAX_BODY = 64 * 1024
KEY_PREFIX = "rmb.registry."



def default_data_dir(env: dict[str, str] | None = None) -> Path:
    """The registry's data directory when --data-dir is not given (a daemon's state must
    survive restarts of anything else, so the default is a durable directory, never Redis):

    1. `$STATE_DIRECTORY` (the first entry): set by systemd for a unit with
       `StateDirectory=` (deploy/systemd/rmb-registry.service: /var/lib/relay-suite/registry);
    2. `$XDG_STATE_HOME/relay-suite/rmb-registry` (XDG Base Directory spec: "state data
       that should persist between (application) restarts");
    3. `~/.local/state/relay-suite/rmb-registry` (the spec's default for $XDG_STATE_HOME).

    `env`: the environment to read (default os.environ). Relative values of the variables
    are ignored, as the XDG spec requires."""
    env = os.environ if env is None else env
    state_dir = env.get("STATE_DIRECTORY", "").split(":")[0]
    if state_dir and os.path.isabs(state_dir):
        return Path(state_dir)
    xdg = env.get("XDG_STATE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path(
        env.get("HOME") or os.path.expanduser("~")) / ".local" / "state"
    return base / "relay-suite" / "rmb-registry"


class Refused(Exception):
    """A request the registry refuses: `status` (4xx) and a precise `reason`."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _twin_from_record(twin_id: int, h: dict[str, str]) -> Twin:
    pk_hex = h.get("pk", "")
    return Twin(twin_id, bytes.fromhex(h["account"]),
                json.loads(h.get("relays", "[]")), bytes.fromhex(pk_hex) if pk_hex else None)


def _parse_id(text: str) -> int:
    if not text.isdigit() or len(text) > 10:
        raise Refused(400, f"bad twin id {text[:32]!r}")
    tid = int(text)
    if not 0 < tid < 2**32:
        raise Refused(400, f"twin id {tid} out of range 1..2^32-1")
    return tid


def _parse_account(text: Any) -> bytes:
    try:
        raw = bytes.fromhex(text) if isinstance(text, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise Refused(400, "account must be hex of a 32-byte public key")
    return raw


class _Body:
    """The validated fields of a signed write body."""

    def __init__(self, obj: Any):
        if not isinstance(obj, dict):
            raise Refused(400, "body must be a JSON object")
        self.account = _parse_account(obj.get("account"))
        try:
            self.relays = validate_relays(obj.get("relays"))
            self.pk = validate_pk(obj.get("pk"))
        except ValueError as exc:
            raise Refused(400, str(exc)) from None
        ts = obj.get("timestamp")
        if not isinstance(ts, int) or isinstance(ts, bool) or ts < 0:
            raise Refused(400, "timestamp must be unix seconds (integer)")
        self.timestamp = ts
        sig = obj.get("signature")
        try:
            self.signature = bytes.fromhex(sig) if isinstance(sig, str) else b""
        except ValueError:
            self.signature = b""
        if not self.signature:
            raise Refused(400, "signature must be hex of a typed signature")


def create_app(store, events: EventLog, *,
               replay_window: int = DEFAULT_REPLAY_WINDOW,
               clock: Callable[[], float] = time.time,
               metrics: CollectorRegistry | None = None,
               storage: dict[str, Any] | None = None) -> web.Application:
    """The registry's aiohttp application over `store` (a registry_store store, or an
    aioredis.Redis, wrapped in RedisTwinStore; see the module docstring).
    `clock`: unix seconds for the replay window; `metrics`: Prometheus registry to fill;
    `storage`: {"store", "durable"} shown in /health (read at each request)."""
    metrics = metrics or CollectorRegistry()
    requests = Counter("rmb_registry_requests", "registry HTTP requests by route and status",
                       ["route", "status"], registry=metrics)
    redis_up = Gauge("rmb_registry_redis_up", "1 when the last Redis call succeeded",
                     registry=metrics)
    redis_up.set(1)
    state = {"redis_ok": True}
    if isinstance(store, aioredis.Redis):
        store = RedisTwinStore(store)

    def check_fresh(ts: int) -> None:
        now = int(clock())
        if abs(now - ts) > replay_window:
            raise Refused(401, f"stale timestamp {ts}: registry time is {now}, "
                               f"window is {replay_window} s")

    def check_sig(account: bytes, message: bytes, signature: bytes) -> None:
        try:
            verify_typed(account, message, signature)
        except SignatureError as exc:
            raise Refused(401, f"bad signature: {exc}") from None

    async def load(twin_id: int) -> Twin:
        h = await store.load(twin_id)
        if not h:
            raise Refused(404, f"unknown twin {twin_id}")
        return _twin_from_record(twin_id, h)

    async def read_json(request: web.Request) -> Any:
        try:
            return json.loads(await request.read())
        except (ValueError, UnicodeDecodeError):
            raise Refused(400, "body is not valid JSON") from None

    async def post_twin(request: web.Request) -> web.Response:
        body = _Body(await read_json(request))
        check_fresh(body.timestamp)
        check_sig(body.account, write_challenge("create", 0, body.account, body.relays,
                                                body.pk, body.timestamp), body.signature)
        tid = await store.create(body.account.hex(), json.dumps(body.relays),
                                 body.pk.hex() if body.pk else "", body.timestamp)
        if tid == 0:
            raise Refused(409, f"account {body.account.hex()} is already registered")
        twin = Twin(int(tid), body.account, body.relays, body.pk)
        events.emit("rmb.registry.twin_created", twin=twin.id)
        return web.json_response(twin.to_json(), status=201)

    async def put_twin(request: web.Request) -> web.Response:
        tid = _parse_id(request.match_info["id"])
        body = _Body(await read_json(request))
        check_fresh(body.timestamp)
        twin = await load(tid)
        if body.account != twin.account:
            raise Refused(401, f"account {body.account.hex()} does not own twin {tid}")
        check_sig(twin.account, write_challenge("update", tid, twin.account, body.relays,
                                                body.pk, body.timestamp), body.signature)
        done = await store.update(tid, body.timestamp, json.dumps(body.relays),
                                  body.pk.hex() if body.pk else "",
                                  hashlib.sha256(body.signature).hexdigest(),
                                  2 * replay_window, clock())
        if done == -1:
            raise Refused(404, f"unknown twin {tid}")
        if done == 0:
            raise Refused(409, f"out-of-order write: timestamp {body.timestamp} is older "
                               f"than twin {tid}'s last write")
        if done == -2:
            raise Refused(409, "replayed write: this signed update was already applied")
        twin = Twin(tid, twin.account, body.relays, body.pk)
        events.emit("rmb.registry.twin_updated", twin=tid)
        return web.json_response(twin.to_json())

    async def get_twin(request: web.Request) -> web.Response:
        return web.json_response((await load(_parse_id(request.match_info["id"]))).to_json())

    async def find_twin(request: web.Request) -> web.Response:
        if "account" not in request.query:
            raise Refused(400, "query parameter account=<hex> is required")
        account = _parse_account(request.query["account"])
        tid = await store.find(account.hex())
        if tid is None:
            raise Refused(404, f"no twin with account {account.hex()}")
        return web.json_response((await load(int(tid))).to_json())

    def route(name: str, handler):
        async def wrapped(request: web.Request) -> web.Response:
            try:
                resp = await handler(request)
                state["redis_ok"] = True
                redis_up.set(1)
            except Refused as exc:
                events.emit("rmb.registry.refused", level="warning",
                            status=exc.status, reason=exc.reason)
                resp = web.json_response({"error": exc.reason}, status=exc.status)
            except web.HTTPRequestEntityTooLarge:
                events.emit("rmb.registry.refused", level="warning", status=413,
                            reason="body too large")
                resp = web.json_response({"error": f"body larger than {MAX_BODY} bytes"},
                                         status=413)
            except (StoreError, aioredis.RedisError, OSError) as exc:
                state["redis_ok"] = False
                redis_up.set(0)
                events.emit("rmb.registry.refused", level="error", status=503,
                            reason=str(exc)[:200] if isinstance(exc, StoreError)
                            else f"redis: {type(exc).__name__}")
                resp = web.json_response({"error": "registry storage unavailable"}, status=503)
            requests.labels(name, str(resp.status)).inc()
            return resp
        return wrapped

    from daemon_runtime.lifecycle import add_status_routes

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post("/twins", route("create", post_twin))
    app.router.add_get("/twins", route("find", find_twin))
    app.router.add_get("/twins/{id}", route("get", get_twin))
    app.router.add_put("/twins/{id}", route("update", put_twin))
    add_status_routes(app, metrics, lambda: {"ok": state["redis_ok"], "redis": state["redis_ok"],
                                             **(storage or {})})
    return app


class RegistryServer:
    """The registry bound to host:port (0 = any free port) over Redis at redis_url.

        server = RegistryServer("127.0.0.1", 0, redis_url, events)
        port = await server.start()       # base URL http://127.0.0.1:<port>
        ...; await server.close()
    """

    def __init__(self, host: str, port: int, redis_url: str | None, events: EventLog, *,
                 replay_window: int = DEFAULT_REPLAY_WINDOW,
                 clock: Callable[[], float] = time.time, data_dir: str | None = None):
        self.host, self.port = host, port
        self.redis_url = redis_url
        self.data_dir = data_dir
        if data_dir is not None:
            self.store = SqliteTwinStore(data_dir)     # raises StoreError naming the path
        elif redis_url:
            self.store = RedisTwinStore(aioredis.Redis.from_url(redis_url))
        else:
            raise ValueError("the registry needs --data-dir DIR or --redis URL")
        self.events = events
        self.metrics = CollectorRegistry()
        #: {"store": "sqlite"|"redis", "durable": bool | None}, in /health once started
        self.storage: dict[str, Any] = {"store": "sqlite" if data_dir is not None else "redis",
                                        "durable": True if data_dir is not None else None}
        self.app = create_app(self.store, events, replay_window=replay_window, clock=clock,
                              metrics=self.metrics, storage=self.storage)
        self._runner: web.AppRunner | None = None
        self._closed = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> int:
        """Bind and serve; returns the bound port. Raises StoreError when the storage
        cannot be reached, OSError if the port is taken. Fills `storage`: in Redis mode,
        durable is Redis's own `appendonly` setting (CONFIG GET)."""
        try:
            await self.store.ping()
        except StoreError as exc:
            where = (f"Redis at {self.redis_url} (set it with --redis URL)"
                     if self.data_dir is None else f"{self.data_dir} (--data-dir)")
            raise StoreError(f"cannot reach the registry storage, {where}: {exc}") from None
        if self.data_dir is None:
            self.storage["durable"] = await self.store.durable()
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # no public accessor in aiohttp
        return self.port

    def log_storage(self) -> None:
        """Emits rmb.registry.storage (warning level when not durable); call after start()
        (the console script does, after its READY line)."""
        durable = self.storage["durable"]
        self.events.emit("rmb.registry.storage", level="info" if durable else "warning",
                         store=self.storage["store"],
                         path=str(self.data_dir) if self.data_dir is not None
                         else str(self.redis_url), durable=durable)

    async def close(self) -> None:
        """Stop accepting, finish in-flight requests (aiohttp's shutdown), close Redis."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if not self._closed:
            self._closed = True
            await self.store.close()


def build_parser() -> argparse.ArgumentParser:
    from daemon_runtime.config import add_common_args

    parser = argparse.ArgumentParser(
        prog="rmb-registry",
        description="Twin registry for RMB (stands in for tfchain's twin storage): "
                    "HTTP JSON API over a durable SQLite store (or Redis with --redis); writes "
                    "are signed by the twin's account key.")
    parser.add_argument("--listen", metavar="HOST:PORT", default="127.0.0.1:8100",
                        help="address to serve HTTP on; port 0 picks a free port, announced on "
                             "stdout as 'READY {\"port\": N}' (default: 127.0.0.1:8100)")
    parser.add_argument("--data-dir", metavar="DIR", default=None,
                        help="directory of the registry's durable store (SQLite file "
                             "registry.sqlite3, every write fsync'ed). Default when neither "
                             "--data-dir nor --redis is given: $STATE_DIRECTORY (systemd), else "
                             "$XDG_STATE_HOME/relay-suite/rmb-registry, else "
                             "~/.local/state/relay-suite/rmb-registry")
    parser.add_argument("--redis", metavar="URL", default=None,
                        help="keep twin records in this Redis instead (only when --data-dir is "
                             "not given); durable only if that Redis runs with appendonly yes: "
                             "the registry checks it at start and reports it in /health "
                             "(durable) and a warning line (default: unset, SQLite is used)")
    parser.add_argument("--replay-window", metavar="SECONDS", type=int,
                        default=DEFAULT_REPLAY_WINDOW,
                        help="accepted distance between a signed write's timestamp and the "
                             f"registry clock, seconds (default: {DEFAULT_REPLAY_WINDOW})")
    add_common_args(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console script `rmb-registry` (see --help). Exit 0 after SIGTERM/SIGINT."""
    from daemon_runtime.config import load_args
    from daemon_runtime.lifecycle import Ready, parse_hostport, run_daemon

    parser = build_parser()
    args = load_args(parser, argv, env_prefix="RMB_REGISTRY_")
    try:
        host, port = parse_hostport(args.listen)
    except ValueError as exc:
        parser.error(f"--listen: {exc}")
    if args.replay_window <= 0:
        parser.error("--replay-window must be positive")

    async def run(stop: asyncio.Event) -> None:
        events = EventLog("rmb-registry", args.listen, [RMB_EVENTS], sink=args.log,
                          min_level=args.log_level)
        data_dir = args.data_dir
        if data_dir is None and not args.redis:
            data_dir = str(default_data_dir())
        server = RegistryServer(host, port, args.redis, events,
                                replay_window=args.replay_window, data_dir=data_dir)
        try:
            bound = await server.start()
            events.node = f"{host}:{bound}"
            Ready(service="rmb-registry", host=host, port=bound).announce()
            server.log_storage()
            await stop.wait()
        finally:
            await server.close()
            events.close()

    return run_daemon(run)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
