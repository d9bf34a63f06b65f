"""The demo plan catalogue: what the launcher (relay-suite-demo) intends to break, logged
before it breaks it, so the trace report can tell planned failures from unplanned ones
(DESIGN.md section 6: planned faults labelled in the event log).

service = "relay-suite-demo", node = "launcher".

- `demo.plan.fault`: a planned fault starts (fault = kind, e.g. "twin_offline",
  "relay_restart", "validator_kill", "member_kill"; target = the node label it hits, e.g.
  "dave", "relay1"; duration_ms = how long it is planned to last, 0 if instantaneous).
  trace_id is null.
- `demo.plan.recovered`: that fault ended (same fault and target).
- `demo.plan.expect`: one message that the plan expects to fail or end other than
  delivered (trace_id = the message's trace id in its protocol: RMB envelope uid, REMP
  message id hex, Marlin "message_id:producer"; outcome = the planned outcome, e.g.
  "expired", "error", "rejected", "dispute"; fault = why, e.g. "expiring_request",
  "corrupted_block", "negative_boc").
- `demo.plan.node`: a readable name for a node as it appears in other events' `node`
  field (target = the readable label, e.g. "alice", "relay1", "v3"; peer = the raw node
  value, e.g. "42" or "127.0.0.1:40231"; kind = the service; host = the host name of the
  machine it runs on). The report labels nodes with it, and never corrects the timestamps
  of two nodes of one host against each other: they share that host's clock.
"""
from daemon_runtime.eventlog import Catalogue, EventSpec

E = EventSpec

DEMO_EVENTS = Catalogue("demo", [
    E("demo.plan.fault", "the launcher starts a planned fault (fault = kind, target = node "
      "label, duration_ms = planned length, 0 if instantaneous)",
      {"fault": "string", "target": "string", "duration_ms": "double"}),
    E("demo.plan.recovered", "a planned fault ended (fault, target as in demo.plan.fault)",
      {"fault": "string", "target": "string"}),
    E("demo.plan.expect", "a message the plan expects not to be delivered (trace_id = the "
      "message; outcome = planned outcome; fault = the planned cause)",
      {"outcome": "string", "fault": "string"}),
    E("demo.plan.node", "a readable label for a node (target = label, peer = the raw `node` "
      "value in other events, kind = its service, host = the host name it runs on: nodes "
      "of one host share its clock)",
      {"target": "string", "peer": "string", "kind": "string", "host": "string"}),
])
