"""The relay core's error texts, close codes and error types (no I/O, no clock).

Texts are the ones rmb-rs v1.5.1 answers (relay/api.rs, federation/router.rs; DESIGN.md
section 3) or ours where rmb-rs has none (marked). Errors: `RelayCoreError` (local misuse:
impossible transition, bad argument), never for remote input; `RelayStateError` names the
state and the input of an impossible transition.
"""
from __future__ import annotations

from rmb_peer.errors import RmbLocalError

__all__ = [
    "ERR_WRONG_SOURCE",
    "ERR_RATE_LIMIT",
    "ERR_MISSING_DESTINATION",
    "ERR_UNKNOWN_DESTINATION",
    "ERR_NO_RELAYS",
    "ERR_EXPIRED",
    "ERR_OFFLINE",
    "ERR_FEDERATION_FULL",
    "ERR_QUEUE_FULL",
    "ERR_DOMAIN_FULL",
    "ERR_TOO_LARGE",
    "TAG_FAIL_FAST",
    "RelayCoreError",
    "ERR_UNSIGNED",
    "ERR_NOT_HERE",
    "ERR_UNKNOWN_SOURCE",
    "ERR_BAD_SIGNATURE",
    "ERR_FED_RATE",
    "ERR_SHARE_FULL",
    "CLOSE_UNSUPPORTED",
    "CLOSE_INVALID",
    "CLOSE_REPLACED",
    "RelayStateError",
]

#: relay error texts (rmb-rs v1.5.1 relay/api.rs and federation/router.rs; DESIGN.md section 3)
ERR_WRONG_SOURCE = "message wrong source"
ERR_RATE_LIMIT = "exceeded rate limits, dropping message"
ERR_MISSING_DESTINATION = "message with missing destination"
ERR_UNKNOWN_DESTINATION = "unknown twin destination"
ERR_NO_RELAYS = "relay info is not set for this twin"
ERR_EXPIRED = "message has expired"
ERR_OFFLINE = "destination offline"
ERR_FEDERATION_FULL = "federation queue is full, dropping message"
#: our texts (rmb-rs drops the oldest silently instead)
ERR_QUEUE_FULL = "destination offline queue is full, dropping message"
ERR_DOMAIN_FULL = "federation queue for the destination's relay is full, dropping message"
ERR_TOO_LARGE = "envelope too large"
#: the envelope tag that asks for `destination offline` instead of queueing
TAG_FAIL_FAST = "fail-fast"


class RelayCoreError(RmbLocalError):
    """Local misuse of the relay core (an impossible state transition, a bad argument).
    Remote input never raises this. The RMB protocol's one local-error base is
    rmb_peer.errors.RmbLocalError (RuntimeError); its one remote-error base is
    RmbRemoteError (ValueError: EnvelopeError, SignatureError, TokenError, ...), which the
    relay's entry-point guards turn into an error reply, a logged drop or a close."""


#: federation-in refusals (our texts; rmb-rs accepts every parsable POST)
ERR_UNSIGNED = "federated envelope has no source twin (unsigned envelopes are not federated)"
ERR_NOT_HERE = "destination twin is not served by this relay"
ERR_UNKNOWN_SOURCE = "unknown source twin"
ERR_BAD_SIGNATURE = "bad envelope signature"
ERR_FED_RATE = "federation rate limit of this source relay exceeded"
#: one sender's share of a twin's offline queue is used up (--queue-per-source)
ERR_SHARE_FULL = "your share of the destination offline queue is full, dropping message"

CLOSE_UNSUPPORTED = 1003
CLOSE_INVALID = 1007
CLOSE_REPLACED = 4000


class RelayStateError(RelayCoreError):
    """An impossible per-session transition (local misuse); names the state and input."""

