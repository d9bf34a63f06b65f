"""The shape figures of docs/layers.md (scripts/layers_counts.py) for the RMB daemons:
every RMB adapter class within 400 lines, one loop around a core (the shared runner's
dispatch), one error guard, one LogRecord, one rate-limited logger, one in-memory test
network; the section renders."""
from __future__ import annotations

from pathlib import Path
from tests.script_module import load

REPO = Path(__file__).resolve().parent.parent


def _script():
    return load("scripts/layers_counts.py")


def test_rmb_adapters_are_small_and_run_on_the_shared_runner():
    lc = _script()
    rows = {(m, c): n for m, c, n in lc.adapter_classes()}
    assert rows[("rmb_relay/daemon.py", "RelayServer")] <= 400
    assert rows[("rmb_peer/daemon.py", "PeerDaemon")] <= 400
    over = [(m, c, n) for (m, c), n in rows.items() if m.startswith("rmb_") and n > 400]
    assert over == []
    assert lc.loops() == ["daemon_runtime/runner.py:dispatch"]     # REMP's sub-cores too
    assert lc.guards() == ["daemon_runtime/guard.py:bug"]
    assert lc.log_records() == ["daemon_runtime/eventlog.py:LogRecord"]
    assert lc.log_limiters() == ["daemon_runtime/ratelimit.py:LogLimiter"]
    assert lc.test_networks() == ["daemon_runtime/memnet.py:MemNetwork"]
    text = lc.section()
    assert text.startswith(lc.BEGIN) and text.endswith(lc.END) and "| `RelayServer` |" in text
