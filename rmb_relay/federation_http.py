"""Federation between relays over HTTP (rmb-rs v1.5.1 federation/router.rs; DESIGN.md
section 3): the PostFederation executor (POST http://<domain>/ with the raw envelope;
202 accepted, 4xx refused, anything else failed) and POST / from other relays, which
RelayCore.receive_federation decides (authenticated and bounded) and answers with a
FederationAnswer. `FederationHttp(relay)` uses relay._http (the client session),
relay.runner (feed / execute: the core), relay.metrics and relay._warn.
"""
from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from daemon_runtime.linkmodel import pause as linkmodel_pause
from rmb_relay.core import ERR_OFFLINE
from rmb_relay.core.eventmap import refusal_of

__all__ = ["FederationHttp", "FED_CONTENT_TYPE", "FEDERATION_ANSWER_TIMEOUT"]

FED_CONTENT_TYPE = "application/x-protobuf"
#: longest a federation POST waits for the twin lookups its checks need, seconds
FEDERATION_ANSWER_TIMEOUT = 15.0


class FederationHttp:
    """See the module doc."""

    def __init__(self, relay) -> None:
        self.relay = relay

    async def post(self, att) -> None:
        """PostFederation executor."""
        status, reason = 0, ""
        try:
            await linkmodel_pause(att.domain.rpartition(":")[0])   # test only: RELAY_SUITE_LINKS
            async with self.relay._http.post(f"http://{att.domain}/", data=att.data,
                                       headers={"Content-Type": FED_CONTENT_TYPE},
                                       timeout=aiohttp.ClientTimeout(total=att.timeout)) as resp:
                status = resp.status
                if status != 202:
                    reason = (await resp.text(errors="replace")).strip()[:200]
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            reason = f"{type(exc).__name__}: {exc}"[:200]
        if self.relay._closing and status == 0 and not reason:
            return
        outcome = "accepted" if status == 202 else "refused" if 400 <= status < 500 else "failed"
        if status and status != 202 and not reason:
            reason = f"HTTP {status}"
        self.relay.runner.feed(lambda now: self.relay.core.federation_result(att.job, outcome, now, status=status,
                                                           reason=reason))
        await self.relay.runner.execute()

    async def handle_post(self, request: web.Request) -> web.Response:
        """Federation in: the guard of this entry point (anything unexpected is a logged
        bug and a 500, the daemon keeps serving)."""
        try:
            return await self._federation_in(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - one guard per entry point (DESIGN.md 2)
            self.relay.guard.bug(exc, "federation POST")
            return web.Response(status=500, text="internal error\n")

    def _refuse(self, status: int, text: str, origin: str) -> web.Response:
        """A POST refused before the core saw it (413): counted, one rate-limited line."""
        fx = refusal_of(status, text)
        self.relay.metrics.fed_refused.labels(fx.label).inc()
        self.relay._warn(fx.limit_key, "rmb.relay.rejected", None, reason=text[:200],
                   src=f"federation {origin}", dst="")
        return web.Response(status=status, text=text + "\n")

    async def _federation_in(self, request: web.Request) -> web.Response:
        """POST / from another relay: the core decides (RelayCore.receive_federation:
        authenticated and bounded); this executes its commands and
        answers with its FederationAnswer (413 for a body over --max-size is aiohttp's)."""
        if self.relay._closing:
            return web.Response(status=503, text="relay shutting down\n")
        origin = request.remote or "?"
        try:
            data = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(413, f"envelope too large: limit {self.relay.max_size} bytes",
                                    origin)
        self.relay.metrics.rx_fed.inc()
        answer = asyncio.get_running_loop().create_future()
        self.relay.runner.feed(self.relay.core.receive_federation, answer, data, origin)
        await self.relay.runner.execute()
        try:
            status, text = await asyncio.wait_for(answer, FEDERATION_ANSWER_TIMEOUT)
        except asyncio.TimeoutError:
            status, text = 503, "twin lookup timed out"
        # `destination offline` without a newline, as rmb-rs's fail-fast answer
        return web.Response(status=status, text=text if text == ERR_OFFLINE else text + "\n")
