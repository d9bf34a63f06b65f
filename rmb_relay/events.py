"""Events rmb-relay emits beyond rmb_peer.events.RMB_EVENTS (DESIGN.md section 6): the
relay's hardening (refusals rate-limited, fd exhaustion, stale twin records, bugs
caught by an entry-point guard, federation circuits).

Kept next to the relay because rmb_peer/events.py belongs to the peer side; the relay's
EventLog is built with [RMB_EVENTS, RELAY_EVENTS]. Attribute names reuse the types they
have in the other catalogues (count long, reason string, twin long, stale_s double,
domain string).
"""
from daemon_runtime.eventlog import Catalogue, EventSpec

E = EventSpec

RELAY_EVENTS = Catalogue("rmb.relay", [
    E("rmb.relay.suppressed", "warnings of one kind beyond the rate limit were not logged "
      "one by one: `count` of them with this `reason` in the last window (their metrics "
      "still counted each)", {"reason": "string", "count": "long"}),
    E("rmb.relay.accept_failed", "the relay could not accept connections (file-descriptor "
      "limit, EMFILE/ENFILE); `count` failures since the last line",
      {"reason": "string", "count": "long"}),
    E("rmb.relay.twin_stale", "the registry could not be reached: a twin record older than "
      "its TTL was served (bounded by --twin-max-stale)",
      {"twin": "long", "stale_s": "double", "reason": "string"}),
    E("rmb.relay.circuit", "a federation domain's circuit changed state (open: attempts "
      "paused after consecutive failures; closed: an attempt succeeded)",
      {"domain": "string", "reason": "string", "count": "long"}),
    E("rmb.relay.retargeted", "a fresh record of `twin` lists other relays than its pending "
      "federation jobs were using (the twin moved): `count` jobs now go to `domain` "
      "(\"local\": the twin is served here and they were delivered here)",
      {"twin": "long", "count": "long", "domain": "string"}),
    E("rmb.relay.requeued", "a connection was lost without a close handshake (heartbeat "
      "without pong, transport error) or its twin replaced it with a newer connection (the "
      "twin's keepalive gave it up first): `count` deliveries written to it shortly before, "
      "which the dead link may have swallowed, were queued again for the session `src` "
      "and are replayed when it reconnects", {"src": "string", "count": "long",
                                               "reason": "string"}),
    E("rmb.relay.drained", "the relay drained on SIGTERM/SIGINT: `count` sessions were "
      "sent a 1001 close and their frames routed; `reason` says whether everything was "
      "routed within --grace or what was cut off", {"reason": "string", "count": "long",
                                                     "duration_ms": "double"}),
    E("rmb.relay.federation_outbox", "`count` pending federation jobs were saved to Redis at "
      "shutdown, or resumed from there at start (`reason`)",
      {"reason": "string", "count": "long"}),
    E("rmb.relay.federation_saved", "the shutdown drain could not federate this envelope "
      "(`uid`, for twin `dst` at relays `domain`) within --grace: it was saved to this "
      "relay's Redis federation outbox, which only this relay's next start resumes (a relay "
      "retired for good never sends it)",
      {"dst": "string", "domain": "string", "reason": "string"}),
    E("rmb.relay.bad_request", "an HTTP request the relay could not parse (request line or "
      "header over 8190 bytes, non-ASCII or malformed request line, bad method) was answered "
      "`status` 400 by the HTTP server; `reason`: the parser's error; `src`: the client "
      "address; rate-limited per error class", {"status": "long", "reason": "string",
                                                 "src": "string"}),
    E("rmb.relay.bug", "an entry point of the daemon caught an unexpected exception (a bug, "
      "not bad input); the daemon kept running", {"reason": "string", "src": "string"}),
])
