"""The demo catalogue: what the launcher (relay-suite-demo) intends to break, logged before
it breaks it, so the trace report can tell planned failures from unplanned ones (DESIGN.md
section 6), and the CPU it samples while the demo runs.

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

The launcher's CPU samples (deploy/cpu.py), one set per second, in `<logdir>/demo-cpu.jsonl`
(trace_id null). The report draws them as a CPU timeline and uses them to tell an objective
missed while the host was saturated from one missed on an idle host:

- `demo.cpu.host`: the whole host over the last interval (cpu_pct = percent of ALL its
  cores busy, 0..100, psutil.cpu_percent; cores = logical cores; demo_pct = the demo's own
  processes (the launcher and every process it started, recursively), percent of all
  cores; interval_ms = the interval measured).
- `demo.cpu.process`: one process over the same interval (target = its label: the daemon
  name for the demo's daemons, e.g. "rmb-relay-relay1", "launcher" for the launcher
  itself, else "<process name>[<pid>]"; kind = "demo" for the demo's processes, "other"
  for any other process of the host; pid; core_pct = percent of ONE core, so 200 = two
  cores busy). The demo's processes are logged when they used >= 1% of a core, the host's
  other processes only the busiest few (>= 5% of a core).
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
    E("demo.cpu.host", "host CPU over the last sampling interval (cpu_pct = percent of all "
      "cores busy, 0..100; cores = logical cores; demo_pct = the demo's own processes, "
      "percent of all cores; interval_ms = the interval)",
      {"cpu_pct": "double", "cores": "long", "demo_pct": "double", "interval_ms": "double"}),
    E("demo.cpu.process", "one process's CPU over the last sampling interval (target = its "
      "label, kind = demo | other, pid, core_pct = percent of one core: 200 = two cores)",
      {"target": "string", "kind": "string", "pid": "long", "core_pct": "double"}),
])
