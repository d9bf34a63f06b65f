"""The RMB relay core: every relay decision, without I/O and without a clock
(DESIGN.md section 2; seed: rmb.md; reference: threefoldtech/rmb-rs v1.5.1).

`now` is float unix seconds from the caller (envelope expiry compares with the envelopes'
unix timestamps). `RelayCore` (relay.py) is the one core the daemon feeds; its parts:

- errors.py      error texts, close codes, RelayCoreError / RelayStateError
- limits.py      FixedWindowLimiter / NoLimit (--limit, --federation-limit)
- routing.py     ConnectionTable, RelayRouter (per-envelope verdicts, local vs federation)
- federation.py  Ranker and FederationScheduler (the federation retry plan)
- commands.py    what RelayCore.next_event() hands the adapter (WriteFrame, Enqueue, ...)
- eventmap.py    what each Log command counts and how its line is rate-limited
- relay.py       RelayCore: sessions, offline replay, twin table, federation in and out

This package re-exports the public names of those modules.
"""
from daemon_runtime.ratelimit import LogLimiter  # noqa: F401  (the relay's warning limiter)
from rmb_relay.core.commands import *  # noqa: F401,F403
from rmb_relay.core.commands import __all__ as _commands
from rmb_relay.core.errors import *  # noqa: F401,F403
from rmb_relay.core.errors import __all__ as _errors
from rmb_relay.core.federation import *  # noqa: F401,F403
from rmb_relay.core.federation import __all__ as _federation
from rmb_relay.core.limits import *  # noqa: F401,F403
from rmb_relay.core.limits import __all__ as _limits
from rmb_relay.core.relay import RelayCore
from rmb_relay.core.routing import *  # noqa: F401,F403
from rmb_relay.core.routing import __all__ as _routing

__all__ = ["LogLimiter", "RelayCore", *_errors, *_limits, *_routing, *_federation, *_commands]
