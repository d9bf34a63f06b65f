"""One twin-record freshness rule (rmb_peer.freshness.TwinFreshness, DESIGN.md section 3
"Twin lookup") for every twin table: the peer core's, the relay core's and the registry
client's serve a record whose lookup failed at exactly the same ages, and both cores ask
for lookups with the one LookupTwin shape."""
from __future__ import annotations

import base64
import json

import pytest

from rmb_peer.core import PeerCore, PushQueue
from rmb_peer.freshness import LookupTwin, TwinFreshness
from rmb_peer.identity import E2EKey, Identity
from rmb_peer.twins import DirectoryError, Twin, TwinDirectory
from rmb_relay.core import Log, RelayCommand, RelayCore
from rmb_relay.core import LookupTwin as RelayLookupTwin

T0 = 1_700_000_000.0
TTL, MAX_STALE = 60.0, 100.0
#: just fresh, just stale, the last servable instant, one second too old
AGES = (TTL - 1, TTL, TTL + MAX_STALE, TTL + MAX_STALE + 1)


def _twin(tid: int) -> Twin:
    ident = Identity.from_seed(bytes([tid]) * 32, "ed25519")
    return Twin(tid, ident.account, ["r1"], E2EKey.from_seed(bytes([tid + 50]) * 32).pk)


def _drain(core) -> list:
    out = []
    while (ev := core.next_event()) is not None:
        out.append(ev)
    return out


def peer_serves(age: float) -> bool:
    """The peer core holds twin 3's record `age` s old, the registry is down: is the
    app's request to twin 3 sent (True) or answered with error 500 (False)?"""
    core = PeerCore(1, Identity.from_seed(b"\x01" * 32, "ed25519"),
                    E2EKey.from_seed(b"\x33" * 32), ["r1"])
    core.twin_ttl, core.twin_max_stale = TTL, MAX_STALE
    core.start(T0)
    core.load_twins([(_twin(3), age)], T0)
    _drain(core)
    core.receive_local(json.dumps({"ver": 1, "ref": "r", "cmd": "calc.add", "exp": 60,
                                   "dat": base64.b64encode(b"x").decode(), "dst": [3],
                                   "ret": "app.ret", "now": int(T0)}), T0)
    asked = [ev for ev in _drain(core) if isinstance(ev, LookupTwin)]
    if asked:
        assert asked == [LookupTwin(3, asked[0].refresh)]
        core.twin_lookup_failed(3, "registry down", T0)
    errors = [ev for ev in _drain(core) if isinstance(ev, PushQueue) and b'"err"' in
              (ev.payload if isinstance(ev.payload, bytes) else ev.payload.encode())]
    return not errors


def relay_serves(age: float) -> bool:
    """The relay core fetched twin 3's record `age` s ago; a lookup fails now: does it
    keep serving the record (rmb.relay.twin_stale)?"""
    core = RelayCore(["r1"], twin_ttl=TTL, twin_max_stale=MAX_STALE)
    core.twin_resolved(3, _twin(3), T0 - age)
    _drain(core)
    core.twin_resolved(3, DirectoryError("registry down"), T0)
    return any(isinstance(ev, Log) and ev.event == "rmb.relay.twin_stale" for ev in _drain(core))


def directory_serves(age: float) -> bool:
    now = [T0 - age]
    d = TwinDirectory("http://127.0.0.1:9", cache_ttl=TTL, max_stale=MAX_STALE,
                      clock=lambda: now[0])
    d._remember(_twin(3))
    now[0] = T0
    return d._stale(d._by_id, 3, DirectoryError("registry down")) is not None


@pytest.mark.parametrize("age", AGES)
def test_every_twin_table_serves_a_failed_lookups_record_at_the_same_ages(age):
    rule = TwinFreshness(TTL, MAX_STALE)
    want = rule.servable(age)
    assert want == (age <= TTL + MAX_STALE)
    assert (peer_serves(age), relay_serves(age), directory_serves(age)) == (want, want, want)


def test_one_lookup_command_shape_for_both_cores():
    assert RelayLookupTwin is LookupTwin
    assert isinstance(LookupTwin(7), RelayCommand)       # a relay command (the fuzz rule)
    core = RelayCore(["r1"])
    assert LookupTwin(7) == LookupTwin(7, refresh=False)
    assert core.freshness == TwinFreshness(core.twin_ttl, core.freshness.max_stale)


def test_peer_refreshes_ahead_at_half_the_ttl_and_serves_while_fresh():
    rule = TwinFreshness(TTL, MAX_STALE, refresh_ahead=0.5)
    assert not rule.refresh_due(TTL / 2 - 1) and rule.refresh_due(TTL / 2)
    assert rule.fresh(TTL - 1) and not rule.fresh(TTL)
    assert rule.servable(TTL + 15, within=15) and not rule.servable(TTL + 16, within=15)
    core = PeerCore(1, Identity.from_seed(b"\x01" * 32, "ed25519"),
                    E2EKey.from_seed(b"\x33" * 32), ["r1"])
    assert core.freshness.refresh_ahead == 0.5
    core.twin_ttl = TTL
    assert core.freshness == TwinFreshness(TTL, core.twin_max_stale, 0.5)
