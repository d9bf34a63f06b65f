"""The two error bases of the RMB wire library (DESIGN.md section 2: "Local errors (we
misused the API) and remote errors (a peer sent garbage) are distinct types").

- `RmbRemoteError(ValueError)`: input from outside (a relay frame, a federation POST, a
  token, an app's JSON on Redis, a registry answer) is not acceptable. Every parser of the
  library raises a subclass of it and nothing else: EnvelopeError (rmb_peer.envelope),
  TokenError (rmb_peer.token), SignatureError (rmb_peer.identity), E2EError
  (rmb_peer.e2e), AppMessageError (rmb_peer.core), TwinRecordError (rmb_peer.twins).
  A daemon's entry-point guard turns it into an error reply, a logged drop or a close.
- `RmbLocalError(RuntimeError)`: this program misused the library (an impossible state
  transition, an unknown relay name). Never a ValueError, so a guard never mistakes it for
  bad input: it is logged as a bug.

Neither carries daemon code: the relay and the peer import them alike.
"""
from __future__ import annotations

__all__ = ["RmbRemoteError", "RmbLocalError"]


class RmbRemoteError(ValueError):
    """Remote input the RMB wire library refuses (see the module docstring). The message
    names the precise reason."""


class RmbLocalError(RuntimeError):
    """Local misuse of an RMB core or library API (a bug in the caller, not bad input)."""
