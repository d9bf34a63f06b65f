"""The RMB event catalogue (DESIGN.md section 6): every event rmb-relay, rmb-peer,
rmb-registry and RMB app services emit. trace_id is the envelope uid wherever a message is
involved (null for connection events). Sizes in bytes, durations in ms, ttl in seconds.

The Spark trace report builds its schema from this catalogue; add events here, never inline.
Attribute names are shared across protocols with one type each (tests check).
"""
from daemon_runtime.eventlog import Catalogue, EventSpec

E = EventSpec

RMB_EVENTS = Catalogue("rmb", [
    # app services (service = app name), through rmb_peer.client
    E("rmb.app.requested", "an app pushed a request to msgbus.system.local",
      {"cmd": "string", "dst": "string", "count": "long", "size": "long", "ttl": "long"}),
    E("rmb.app.replied", "an app got one reply on its return queue",
      {"src": "string", "code": "long", "size": "long", "duration_ms": "double"}),
    E("rmb.app.handled", "a service handled an incoming request and pushed its reply",
      {"cmd": "string", "src": "string", "code": "long", "duration_ms": "double"}),
    # rmb-peer
    E("rmb.peer.sent", "the peer sent an envelope to a relay",
      {"kind": "string", "dst": "string", "size": "long", "encrypted": "boolean", "relay": "string"}),
    E("rmb.peer.received", "the peer received an envelope from a relay",
      {"kind": "string", "src": "string", "size": "long", "relay": "string"}),
    E("rmb.peer.delivered", "an incoming request was pushed to msgbus.<cmd> for a service",
      {"cmd": "string", "src": "string"}),
    E("rmb.peer.answered", "a response was pushed to the app's return queue",
      {"src": "string", "code": "long"}),
    E("rmb.peer.expired", "a request's backlog expired before all replies came",
      {"dst": "string", "code": "long"}),
    E("rmb.peer.rejected", "the peer refused input (app JSON, envelope, signature, e2e)",
      {"code": "long", "reason": "string", "src": "string"}),
    E("rmb.peer.twin_lookup_failed", "a twin lookup failed (registry unreachable, 5xx or "
      "no answer); logged once per failure streak of a twin",
      {"twin": "long", "reason": "string"}),
    E("rmb.peer.twin_stale", "the registry fails: a twin record past its TTL is served "
      "(stale-if-error, bounded by --twin-max-stale); logged once per failure streak",
      {"twin": "long", "stale_s": "double"}),
    E("rmb.peer.twin_recovered", "a twin lookup succeeded again after failing; stale_s: "
      "seconds since the first failure", {"twin": "long", "stale_s": "double"}),
    E("rmb.peer.started_offline", "the registry was unreachable at start: the peer runs on "
      "the last known twin records of its --data-dir", {"twin": "long", "reason": "string"}),
    E("rmb.peer.registry_wait", "the peer started with no twin record of its own (the "
      "registry unreachable, nothing in --data-dir): it runs what needs no record (/health "
      "not ok, /metrics), keeps apps' requests in Redis and retries the registry with "
      "backoff; logged at the first failure and every tenth (`count` attempts so far, next "
      "in `retry_s` s); rmb.peer.twin_recovered follows when the registry answers",
      {"reason": "string", "count": "long", "retry_s": "double"}),
    E("rmb.peer.redis_stalled", "a Redis write has waited --redis-stall-after s without an "
      "answer (the server hangs); nothing is dropped: writes wait, and reading from relays "
      "and local queues pauses once --redis-max-pending operations wait; logged once per "
      "stall", {"redis": "string", "waited_s": "double", "pending": "long", "paused": "boolean"}),
    E("rmb.peer.redis_recovered", "Redis answered again after a logged stall; stalled_s: "
      "seconds the write waited in all", {"redis": "string", "stalled_s": "double",
                                          "pending": "long"}),
    E("rmb.peer.connected", "a relay connection opened", {"relay": "string"}),
    E("rmb.peer.disconnected", "a relay connection closed or went silent",
      {"relay": "string", "reason": "string"}),
    # rmb-relay
    E("rmb.relay.received", "an envelope arrived from a connected peer",
      {"kind": "string", "src": "string", "dst": "string", "size": "long"}),
    E("rmb.relay.federation_received", "an envelope arrived by federation POST",
      {"kind": "string", "src": "string", "dst": "string", "size": "long"}),
    E("rmb.relay.delivered", "an envelope was written to a local connection (after a "
      "lookup, a federation POST or from the offline queue)",
      {"kind": "string", "src": "string", "dst": "string", "size": "long",
       "queued_ms": "double"}),
    E("rmb.relay.forwarded", "the live local route: an envelope from a connected peer was "
      "written at once to its destination's connection on the same relay (received and "
      "delivered in one loop pass: one event, read as both steps by the trace report)",
      {"kind": "string", "src": "string", "dst": "string", "size": "long"}),
    E("rmb.relay.queued", "the destination is offline: the envelope was queued",
      {"kind": "string", "src": "string", "dst": "string", "size": "long"}),
    E("rmb.relay.federated", "an envelope was accepted (202) by another relay",
      {"domain": "string", "attempt": "long", "duration_ms": "double"}),
    E("rmb.relay.federation_failed", "a federation attempt failed",
      {"domain": "string", "attempt": "long", "status": "long", "reason": "string"}),
    E("rmb.relay.expired", "an envelope's TTL ran out in the relay (kind and src when the "
      "envelope is at hand)",
      {"kind": "string", "src": "string", "dst": "string", "reason": "string"}),
    E("rmb.relay.rejected", "the relay answered or dropped an envelope with an error",
      {"reason": "string", "src": "string", "dst": "string"}),
    E("rmb.relay.rate_limited", "a twin exceeded --limit; the envelope was dropped",
      {"src": "string", "size": "long"}),
    E("rmb.relay.connected", "a peer connection was authenticated", {"src": "string"}),
    E("rmb.relay.disconnected", "a peer connection closed", {"src": "string", "reason": "string"}),
    E("rmb.relay.auth_failed", "a connection attempt was refused",
      {"status": "long", "reason": "string"}),
    E("rmb.relay.answered", "the relay answered an envelope itself (Pong to a Ping)",
      {"kind": "string", "dst": "string"}),
    E("rmb.relay.queue_error", "the offline queue (Redis) failed or did not answer within "
      "--redis-timeout; the envelope was not queued (the sender got an error) or replay stopped "
      "(resumed on the same connection once Redis answers)",
      {"dst": "string", "reason": "string"}),
    E("rmb.relay.redis_recovered", "Redis answered the relay's probe again after not answering "
      "within --redis-timeout; down_s: seconds since it first did not",
      {"redis": "string", "down_s": "double"}),
    # rmb-registry
    E("rmb.registry.twin_created", "a twin was registered", {"twin": "long"}),
    E("rmb.registry.twin_updated", "a twin's relays or pk changed", {"twin": "long"}),
    E("rmb.registry.refused", "a registry request was refused", {"status": "long", "reason": "string"}),
    E("rmb.registry.storage", "where the registry keeps the twin table, logged once at "
      "start: store sqlite (path: its data directory, durable) or redis (path: the URL; "
      "durable true only when that Redis has appendonly on; false: a Redis restart erases "
      "every twin; null: the Redis refused CONFIG GET)",
      {"store": "string", "path": "string", "durable": "boolean"}),
])
