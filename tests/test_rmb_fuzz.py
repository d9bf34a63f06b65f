"""Property tests (hypothesis) over everything the RMB wire library and the peer core
parse from outside: envelope bytes, relay tokens, app/service JSON on the Redis queues
(msgbus.system.local / msgbus.system.reply), twin records, signatures and e2e ciphers.
Only the documented error types escape (all RmbRemoteError subclasses, i.e. ValueError),
and the core's queue inputs never raise at all (they answer or log)."""
from __future__ import annotations

import base64
import json

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from rmb_peer.challenge import verify_envelope
from rmb_peer.core import AppMessageError, PeerCore, PushQueue, _loads_object
from rmb_peer.e2e import E2EError, decrypt
from rmb_peer.envelope import Envelope, EnvelopeError, parse_envelope
from rmb_peer.errors import RmbRemoteError
from rmb_peer.identity import E2EKey, Identity, SignatureError
from rmb_peer.token import TokenError, make_token, token_claims_unverified, verify_token
from rmb_peer.twins import Twin, TwinRecordError

FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
IDENT = Identity.from_seed(bytes([9]) * 32, "ed25519")
E2E = E2EKey.from_seed(bytes([10]) * 32)

# any JSON value, nested up to ~8 deep
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20)


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@st.composite
def envelopes(draw) -> bytes:
    """A serialized Envelope with arbitrary field values, optionally bit-flipped/truncated."""
    env = Envelope(uid=draw(st.text(max_size=300)), timestamp=draw(st.integers(0, 2**64 - 1)),
                   expiration=draw(st.integers(0, 2**64 - 1)))
    if draw(st.booleans()):
        env.tags = draw(st.text(max_size=10))
    for field in ("source", "destination"):
        if draw(st.booleans()):
            addr = getattr(env, field)
            addr.twin = draw(st.integers(0, 2**32 - 1))
            if draw(st.booleans()):
                addr.connection = draw(st.text(max_size=10))
    kind = draw(st.sampled_from(["request", "response", "error", "ping", "pong", None]))
    if kind == "request":
        env.request.command = draw(st.text(max_size=20))
    elif kind == "error":
        env.error.code = draw(st.integers(0, 2**32 - 1))
        env.error.message = draw(st.text(max_size=20))
    elif kind is not None:
        getattr(env, kind).SetInParent()
    payload = draw(st.sampled_from(["plain", "cipher", None]))
    if payload:
        setattr(env, payload, draw(st.binary(max_size=64)))
    if draw(st.booleans()):
        env.signature = draw(st.binary(max_size=70))
    data = bytearray(env.SerializeToString())
    for flip in draw(st.lists(st.integers(0, 10_000), max_size=3)):
        if data:
            data[flip % len(data)] ^= 1 << (flip % 8)
    cut = draw(st.integers(0, len(data)))
    return bytes(data[:cut]) if draw(st.booleans()) else bytes(data)


@FUZZ
@given(st.binary(max_size=300) | envelopes(), st.booleans())
def test_parse_envelope_raises_only_envelope_error(data, allow_ping):
    try:
        env = parse_envelope(data, max_size=4096, allow_ping_without_destination=allow_ping)
    except EnvelopeError:
        return
    assert env.uid and len(env.uid) <= 256
    assert env.WhichOneof("message") == "ping" and allow_ping or env.destination.twin != 0
    try:   # what the receiving peer does next: verify the signature
        verify_envelope(env, IDENT.account)
    except SignatureError:
        pass


@FUZZ
@given(st.text(max_size=600) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_any_text_as_a_token_is_a_token_error(token):
    for call in (token_claims_unverified, lambda t: verify_token(t, IDENT.account, 1000)):
        try:
            call(token)
        except TokenError as exc:
            assert exc.status in (400, 401)


@FUZZ
@given(json_values, json_values, st.binary(max_size=80), st.integers(1, 1500))
def test_tokens_with_any_json_segments_are_token_errors(header, claims, sig, depth):
    """Arbitrary header/claims JSON, plus claims nested `depth` deep (finding 7: 1,200)."""
    deep = b"[" * depth + b"]" * depth
    for h, c in ((header, claims), ({"alg": "RS512", "typ": "JWT"}, claims),
                 ({"alg": "RS512"}, None)):
        hb = orjson.dumps(h, option=orjson.OPT_PASSTHROUGH_SUBCLASS) if _dumpable(h) else b"{}"
        cb = deep if c is None else (orjson.dumps(c) if _dumpable(c) else b"{}")
        tok = f"{b64url(hb)}.{b64url(cb)}.{b64url(sig)}"
        for call in (token_claims_unverified, lambda t: verify_token(t, IDENT.account, 1000)):
            try:
                call(tok)
            except TokenError as exc:
                assert exc.status == 401


def _dumpable(value) -> bool:
    try:
        orjson.dumps(value)
        return True
    except TypeError:
        return False


@FUZZ
@given(st.integers(1, 2**32 - 1), st.one_of(st.none(), st.text(min_size=1, max_size=20)),
       st.integers(0, 2**31))
def test_valid_tokens_still_verify(twin, sid, now):
    """The bounds refuse nothing rmb-rs, the Go SDK or the TS client send."""
    tok = make_token(IDENT, twin, sid, now)
    assert verify_token(tok, IDENT.account, now) == (twin, sid)


def _core() -> PeerCore:
    return PeerCore(5, IDENT, E2E, ["r1"])


APP_KEYS = ["ver", "ref", "cmd", "exp", "dat", "tag", "dst", "ret", "shm", "now", "err", "src"]


@st.composite
def app_json(draw) -> bytes:
    """msgbus.system.local / msgbus.system.reply JSON: the protocol's keys with arbitrary
    values, plausible values, or raw bytes."""
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return draw(st.binary(max_size=200))
    obj = {}
    for key in draw(st.lists(st.sampled_from(APP_KEYS), max_size=len(APP_KEYS), unique=True)):
        plausible = {
            "ver": st.just(1), "ref": st.text(max_size=300), "cmd": st.text(max_size=300),
            "exp": st.integers(-5, 4000), "dat": st.binary(max_size=30).map(
                lambda b: base64.b64encode(b).decode()) | st.text(max_size=10),
            "dst": st.lists(st.integers(-1, 2**33), max_size=3) | st.text(max_size=12).map(
                lambda t: "7:" + t),
            "ret": st.text(max_size=10), "now": st.integers(-1, 2**40),
            "err": st.fixed_dictionaries({"code": st.integers(-1, 2**33),
                                          "message": json_values}),
        }.get(key, json_values)
        obj[key] = draw(plausible if draw(st.booleans()) else json_values)
    return json.dumps(obj).encode()


@FUZZ
@given(app_json())
def test_app_and_service_json_never_escape_the_core(raw):
    core = _core()
    core.start(1000.0)
    core.handle_timer(1000.0)
    try:
        obj = _loads_object(raw)
    except AppMessageError:
        obj = None
    else:
        assert isinstance(obj, dict)
    # the core's queue inputs answer or log, they never raise for remote input
    core.receive_local(raw, 1000.0)
    core.receive_service_reply(raw, 1000.0)
    req = core.app_message(raw, 1000.0)
    rep = core.service_message(raw, 1000.0)
    if rep is not None:
        assert len(rep.uid) <= 256
        core.send_response(rep, Twin(rep.dst_twin, IDENT.account, [], E2E.pk), 1000.0)
    if req is not None:
        core.send_request(req, {d: None for d in req.dst}, 1000.0)
    while (ev := core.next_event()) is not None:
        if isinstance(ev, PushQueue):
            assert isinstance(orjson.loads(ev.payload), dict)


@FUZZ
@given(st.binary(max_size=80), st.binary(max_size=70))
def test_e2e_decrypt_raises_only_e2e_error(cipher, pk):
    for peer_pk in (pk, E2E.pk):
        try:
            decrypt(E2E, peer_pk, cipher)
        except E2EError:
            pass


@FUZZ
@given(json_values | st.fixed_dictionaries({
    "id": json_values | st.integers(-1, 2**33), "account": json_values | st.text(max_size=70),
    "relays": json_values | st.lists(st.text(max_size=20), max_size=10),
    "pk": json_values | st.binary(max_size=40).map(bytes.hex)}))
def test_twin_records_raise_only_twin_record_error(obj):
    try:
        twin = Twin.from_json(obj)
    except TwinRecordError:
        return
    assert 0 < twin.id < 2**32 and len(twin.account) == 32


def test_every_documented_error_is_a_remote_error():
    for cls in (EnvelopeError, TokenError, SignatureError, E2EError, AppMessageError,
                TwinRecordError):
        assert issubclass(cls, RmbRemoteError)
