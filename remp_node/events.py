"""The REMP event catalogue (DESIGN.md section 6). trace_id is the REMP message id (64 hex
digits). Every status a full node or validator produces or learns is one event, so a trace
shows each stage and where it was produced. Sizes in bytes, durations ms.

Add new EventSpecs at the end."""
from daemon_runtime.eventlog import Catalogue, EventSpec

E = EventSpec

REMP_EVENTS = Catalogue("remp", [
    E("remp.fullnode.received", "a user submitted an external message to the full node",
      {"size": "long", "shard": "string"}),
    E("remp.fullnode.status", "the full node produced or received a status for a message "
      "(kind = JSON kind, level = 0..4, peer = source key id prefix)",
      {"kind": "string", "level": "long", "peer": "string", "shard": "string",
       "block_seqno": "long", "block_id": "string", "reason": "string", "count": "long"}),
    E("remp.validator.status", "a validator produced a status for a message",
      {"kind": "string", "level": "long", "shard": "string", "block_seqno": "long",
       "block_id": "string", "reason": "string"}),
    E("remp.masterchain.committed", "a master block committed shard block ids",
      {"block_seqno": "long", "count": "long"}),
    # full node (REMP client, remp_node/core/client.py)
    E("remp.fullnode.sent", "the full node sent the message (tonNode.rempMessage) to a "
      "validator (peer = validator key id prefix, count = distinct validators reached so far, "
      "datagram = this datagram's number among the message's rempMessage datagrams, so that a "
      "resend to the same validator is a line of its own, not a duplicate)",
      {"peer": "string", "shard": "string", "size": "long", "count": "long", "datagram": "long"}),
    E("remp.fullnode.final", "the full node's final status for a message (outcome = finalized, "
      "rejected or timeout, kind = deciding JSON kind, reason = error texts, count = rempMessage "
      "datagrams sent for it, duration_ms = submit to final)",
      {"outcome": "string", "kind": "string", "reason": "string", "count": "long",
       "duration_ms": "double", "shard": "string"}),
    E("remp.fullnode.dropped", "the full node dropped a datagram from a validator (malformed, "
      "unknown source or bad signature; reason = exact error)",
      {"peer": "string", "reason": "string", "size": "long"}),
    # validator node (remp_node/core/validator.py events, mapped by remp_node/core/eventmap.py)
    E("remp.validator.blamed", "a catchain or consensus of this validator proved that `peer` "
      "(key id prefix) signed two blocks at one height (fork / equivocation); the source is blamed",
      {"peer": "string", "shard": "string", "session": "long"}),
    E("remp.validator.dropped", "the validator dropped remote input (channel = client, rmq, "
      "shard, master, announce or mux; peer = sender key id prefix; reason = exact error)",
      {"peer": "string", "channel": "string", "reason": "string"}),
    E("remp.validator.session", "the validator entered master session `session` (count = shards "
      "whose RMQ it serves; roles = shard:current|previous, comma separated)",
      {"session": "long", "count": "long", "roles": "string"}),
    E("remp.node.error", "a REMP daemon keeps running after an error: an unexpected exception "
      "caught at its boundary (a bug; reason = where, exception and the last frames; logged once "
      "per kind) or the full node's Redis unreachable (reason names the URL and the --redis flag)",
      {"reason": "string"}),
    E("remp.node.store_failed", "the daemon's SQLite store refused a write (disk full, read-only "
      "file, I/O; reason = SQLite's error): the rows stay queued in memory and what depends on "
      "them waits (the full node holds back that step's receipt acks, the validators resend; a "
      "validator holds the step's datagrams until its journal is written, the oldest beyond "
      "4,096 dropped and counted); "
      "count = failures so far; logged at most once per 10 s, remp_errors_total{where=\"store\"} "
      "counts every one", {"reason": "string", "count": "long"}),
    E("remp.shardchain.accepted", "a shard block was accepted by its group (count = messages "
      "in it)", {"shard": "string", "block_seqno": "long", "session": "long", "count": "long"}),
    E("remp.fullnode.refused", "the full node refused new messages for load (POST /messages 503 "
      "with Retry-After, postRequests BACKPRESSURE; reason = pending_full or client_rate): count = "
      "refusals of that reason since the previous line (at most one line per reason per second), "
      "retry_after = the last delay given (s); remp_api_refused_total counts each",
      {"reason": "string", "count": "long", "retry_after": "long"}),
])
