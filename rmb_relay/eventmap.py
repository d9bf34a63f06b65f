"""Relay core Log commands -> metrics and the log rate limit (pure: no I/O, no clock).

The relay core (rmb_relay.relay_core.RelayCore) says what happened as `Log` commands
(event name, level, attributes of the RMB catalogue, rmb_peer/events.py and
rmb_relay/events.py); this table says what each one counts and how its line is
rate-limited, so the adapter (rmb_relay.daemon.RelayServer._emit) only executes it.
Same shape as remp_node/core/eventmap.py (DESIGN.md section 2: logging stays out of cores).

| event | counter (RelayServer.metrics attribute, label) | rate-limit key |
|---|---|---|
| rmb.relay.rejected | rejected (reason_label(reason)) | reason_label(reason) |
| rmb.relay.rate_limited | rejected ("rate limit") | "rate limit" |
| rmb.relay.expired | expired | warnings: "<event> <reason[:60]>" |
| rmb.relay.queued | queued | warnings: as above |
| rmb.relay.federated | federated | warnings: as above |
| rmb.relay.federation_failed | fed_failed (domain) | "federation to <domain> failed" |
| rmb.relay.circuit | circuit_opened (domain), only when reason starts with "open" | warnings: as above |
| rmb.relay.twin_stale | stale_served | "stale twin <twin>" |
| anything else | none | warnings: "<event> <reason[:60]>"; info lines are not limited |
"""
from __future__ import annotations

from typing import NamedTuple

from rmb_relay.core import (
    ERR_DOMAIN_FULL, ERR_EXPIRED, ERR_FEDERATION_FULL, ERR_MISSING_DESTINATION, ERR_NO_RELAYS,
    ERR_OFFLINE, ERR_QUEUE_FULL, ERR_RATE_LIMIT, ERR_UNKNOWN_DESTINATION, ERR_WRONG_SOURCE,
)
from rmb_relay.relay_core import (
    ERR_BAD_SIGNATURE, ERR_FED_RATE, ERR_NOT_HERE, ERR_SHARE_FULL, ERR_UNKNOWN_SOURCE,
    ERR_UNSIGNED,
)

__all__ = ["Effects", "effects_of", "reason_label", "KNOWN_REASONS"]

#: reasons that are metric label values as they are (the relay's fixed error texts)
KNOWN_REASONS = frozenset({
    ERR_EXPIRED, ERR_FEDERATION_FULL, ERR_MISSING_DESTINATION, ERR_OFFLINE, ERR_QUEUE_FULL,
    ERR_SHARE_FULL, ERR_DOMAIN_FULL, ERR_UNSIGNED, ERR_NOT_HERE, ERR_UNKNOWN_SOURCE,
    ERR_FED_RATE, ERR_RATE_LIMIT, ERR_UNKNOWN_DESTINATION, ERR_WRONG_SOURCE, ERR_NO_RELAYS,
})


def reason_label(reason: str) -> str:
    """A bounded set of metric label values: a known reason as it is, reasons with variable
    text grouped by their fixed prefix, anything else "other"."""
    if reason in KNOWN_REASONS:
        return reason
    if reason.startswith(ERR_BAD_SIGNATURE):
        return ERR_BAD_SIGNATURE
    if reason.startswith("envelope too large"):
        return "envelope too large"
    if reason.startswith("failed to get twin details"):
        return "twin lookup failed"
    return "other"


class Effects(NamedTuple):
    """What one Log command does besides its line. `metric`: the RelayServer.metrics
    attribute to increment (None: nothing counted); `label`: its label value (None: the
    counter has no label); `limit_key`: the rate-limit key of the line (None: written
    without a limit)."""
    metric: str | None
    label: str | None
    limit_key: str | None


def _default_key(event: str, attrs: dict, level: str) -> str | None:
    return f"{event} {str(attrs.get('reason', ''))[:60]}" if level == "warning" else None


def effects_of(event: str, attrs: dict, level: str) -> Effects:
    """The Effects of a Log command (event name, its attributes, its level); see the
    module table."""
    if event == "rmb.relay.rejected":
        label = reason_label(attrs.get("reason", ""))
        return Effects("rejected", label, label)
    if event == "rmb.relay.rate_limited":
        return Effects("rejected", "rate limit", "rate limit")
    if event == "rmb.relay.federation_failed":
        domain = attrs.get("domain", "")
        return Effects("fed_failed", domain, f"federation to {domain} failed")
    if event == "rmb.relay.twin_stale":
        return Effects("stale_served", None, f"stale twin {attrs.get('twin')}")
    key = _default_key(event, attrs, level)
    if event == "rmb.relay.expired":
        return Effects("expired", None, key)
    if event == "rmb.relay.queued":
        return Effects("queued", None, key)
    if event == "rmb.relay.federated":
        return Effects("federated", None, key)
    if event == "rmb.relay.circuit" and str(attrs.get("reason", "")).startswith("open"):
        return Effects("circuit_opened", attrs.get("domain", ""), key)
    return Effects(None, None, key)
