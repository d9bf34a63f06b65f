"""rmb_relay.eventmap: what each relay Log command counts and how its line is rate-limited
(the table the relay adapter executes; pure functions, no I/O)."""
from __future__ import annotations

from rmb_relay.core import ERR_OFFLINE, ERR_RATE_LIMIT
from rmb_relay.core.eventmap import Effects, effects_of, reason_label
from rmb_relay.core import ERR_BAD_SIGNATURE


def test_refusals_count_by_bounded_reason_and_are_rate_limited():
    assert effects_of("rmb.relay.rejected", {"reason": ERR_OFFLINE}, "warning") == \
        Effects("rejected", ERR_OFFLINE, ERR_OFFLINE)
    assert effects_of("rmb.relay.rejected", {"reason": ERR_BAD_SIGNATURE + ": x"}, "warning") \
        == Effects("rejected", ERR_BAD_SIGNATURE, ERR_BAD_SIGNATURE)
    assert effects_of("rmb.relay.rejected", {"reason": "surprise 42"}, "warning").label == "other"
    assert effects_of("rmb.relay.rate_limited", {"src": "7"}, "warning") == \
        Effects("rejected", "rate limit", "rate limit")
    assert reason_label(ERR_RATE_LIMIT) == ERR_RATE_LIMIT
    assert reason_label("envelope too large: 9 bytes") == "envelope too large"


def test_counters_and_limit_keys_of_the_other_events():
    assert effects_of("rmb.relay.expired", {"reason": "expired in the offline queue"},
                      "info") == Effects("expired", None, None)
    assert effects_of("rmb.relay.expired", {"reason": "r" * 100}, "warning") == \
        Effects("expired", None, "rmb.relay.expired " + "r" * 60)
    assert effects_of("rmb.relay.queued", {}, "info") == Effects("queued", None, None)
    assert effects_of("rmb.relay.federated", {}, "info") == Effects("federated", None, None)
    assert effects_of("rmb.relay.federation_failed", {"domain": "r2:1"}, "warning") == \
        Effects("fed_failed", "r2:1", "federation to r2:1 failed")
    assert effects_of("rmb.relay.circuit", {"domain": "r2:1", "reason": "open after 5"},
                      "warning").metric == "circuit_opened"
    assert effects_of("rmb.relay.circuit", {"domain": "r2:1", "reason": "closed"},
                      "info") == Effects(None, None, None)
    assert effects_of("rmb.relay.twin_stale", {"twin": 9}, "warning") == \
        Effects("stale_served", None, "stale twin 9")
    assert effects_of("rmb.relay.delivered", {}, "info") == Effects(None, None, None)


def test_federation_in_refusals_are_counted_but_offline_and_expired_answers_are_not():
    from rmb_relay.core import ERR_EXPIRED, ERR_UNKNOWN_SOURCE
    from rmb_relay.core.eventmap import refusal_of
    assert refusal_of(202, "") is None
    assert refusal_of(404, ERR_OFFLINE) is None and refusal_of(400, ERR_EXPIRED) is None
    assert refusal_of(401, ERR_UNKNOWN_SOURCE) == Effects(
        "fed_refused", ERR_UNKNOWN_SOURCE, "federation in: " + ERR_UNKNOWN_SOURCE)
    assert refusal_of(413, "envelope too large: limit 10 bytes").label == "envelope too large"
