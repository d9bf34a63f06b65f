"""RMB protocol library: identities, envelope signatures, tokens, e2e, envelope parsing."""
from __future__ import annotations

import pytest

from rmb_peer.challenge import challenge, sign_envelope, verify_envelope
from rmb_peer.e2e import E2EError, decrypt, encrypt
from rmb_peer.envelope import (
    MAX_ENVELOPE_SIZE, Envelope, EnvelopeError, address_str, is_expired, message_kind,
    new_uid, parse_envelope, relay_error,
)
from rmb_peer.identity import E2EKey, Identity, SignatureError, verify_typed
from rmb_peer.token import TokenError, make_token, token_claims_unverified, verify_token

MNEMONIC = "bottom drive obey lake curtain smoke basket hold race lonely fit walk"
KEYS = {kt: Identity.from_seed(bytes([i]) * 32, kt) for i, kt in ((1, "ed25519"), (2, "sr25519"))}


def request_env() -> Envelope:
    env = Envelope(uid=new_uid(), timestamp=1000, expiration=60, schema="application/json")
    env.source.twin = 11
    env.destination.twin = 22
    env.destination.connection = "sid-1"
    env.request.command = "calc.add"
    env.plain = b"[1,2]"
    return env


@pytest.mark.parametrize("kt", ["ed25519", "sr25519"])
def test_sign_verify_and_tamper(kt):
    ident = KEYS[kt]
    env = request_env()
    sign_envelope(env, ident)
    assert env.signature[:1] == {"ed25519": b"e", "sr25519": b"s"}[kt]
    verify_envelope(env, ident.account)
    wire = parse_envelope(env.SerializeToString())
    verify_envelope(wire, ident.account)
    for mutate in (lambda e: setattr(e, "plain", b"[1,3]"),
                   lambda e: setattr(e, "expiration", 61),
                   lambda e: setattr(e.destination, "connection", "sid-2"),
                   lambda e: setattr(e.request, "command", "calc.sub"),
                   lambda e: e.relays.append("r.example"),
                   lambda e: setattr(e, "tags", "fail-fast")):
        bad = Envelope.FromString(env.SerializeToString())
        mutate(bad)
        assert challenge(bad) != challenge(env)
        with pytest.raises(SignatureError, match=f"invalid {kt} signature"):
            verify_envelope(bad, ident.account)


def test_wrong_key_and_malformed_signatures():
    env = request_env()
    sign_envelope(env, KEYS["sr25519"])
    with pytest.raises(SignatureError, match="invalid sr25519"):
        verify_envelope(env, KEYS["ed25519"].account)
    with pytest.raises(SignatureError, match="unknown signature type 0x78"):
        verify_typed(KEYS["sr25519"].account, b"m", b"x" + bytes(64))
    with pytest.raises(SignatureError, match="bad signature length 64"):
        verify_typed(KEYS["sr25519"].account, b"m", bytes(64))
    with pytest.raises(SignatureError, match="bad account key length 31"):
        verify_typed(b"\x01" * 31, b"m", KEYS["sr25519"].sign(b"m"))
    # an ed25519 signature relabelled as sr25519 fails (and the reverse)
    sig = KEYS["ed25519"].sign(b"m")
    with pytest.raises(SignatureError):
        verify_typed(KEYS["ed25519"].account, b"m", b"s" + sig[1:])
    unsigned = request_env()
    with pytest.raises(SignatureError, match="not signed"):
        verify_envelope(unsigned, KEYS["ed25519"].account)


def test_identity_inputs():
    a = Identity.from_seed("0x" + "01" * 32, "ed25519")
    assert a.account == KEYS["ed25519"].account
    assert Identity.from_mnemonic("  " + MNEMONIC.replace(" ", "  ") + "\n").account == \
        Identity.from_mnemonic(MNEMONIC).account
    with pytest.raises(ValueError, match="invalid mnemonic"):
        Identity.from_mnemonic("bottom drive obey lake curtain smoke basket hold race lonely fit fit")
    with pytest.raises(ValueError, match="unknown key type"):
        Identity.from_seed(bytes(32), "secp256k1")
    with pytest.raises(ValueError, match="32 bytes"):
        Identity.from_seed(bytes(31))
    hexseed = "0x" + "01" * 32
    assert Identity.from_secret(hexseed, "ed25519").account == KEYS["ed25519"].account
    assert Identity.from_secret(MNEMONIC).account == Identity.from_mnemonic(MNEMONIC).account
    assert E2EKey.from_secret(hexseed).pk == E2EKey.from_seed(b"\x01" * 32).pk
    assert E2EKey.from_secret(MNEMONIC).pk == E2EKey.from_mnemonic(MNEMONIC).pk
    # E2E key is derived from the same mini-secret but is unrelated to the account key
    assert E2EKey.from_mnemonic(MNEMONIC).pk[1:] != Identity.from_mnemonic(MNEMONIC).account


@pytest.mark.parametrize("kt", ["ed25519", "sr25519"])
def test_token_round_trip_and_expiry(kt):
    ident = KEYS[kt]
    tok = make_token(ident, 5, "browser-1", now=1000, ttl=60)
    assert token_claims_unverified(tok) == {"sub": 5, "sid": "browser-1", "iat": 1000, "exp": 1060}
    assert verify_token(tok, ident.account, now=1060) == (5, "browser-1")
    with pytest.raises(TokenError) as exc:
        verify_token(tok, ident.account, now=1061)
    assert (exc.value.status, exc.value.reason) == (401, "token expired")
    other = KEYS["sr25519" if kt == "ed25519" else "ed25519"]
    with pytest.raises(TokenError) as exc:
        verify_token(tok, other.account, now=1000)
    assert (exc.value.status, exc.value.reason) == (401, "invalid token signature")
    # a claims segment swapped in from another token no longer matches the signature
    h, _, s = tok.split(".")
    other_claims = make_token(ident, 6, "browser-1", now=1000).split(".")[1]
    with pytest.raises(TokenError, match="invalid token signature"):
        verify_token(f"{h}.{other_claims}.{s}", ident.account, now=1000)


def test_token_refusals():
    ident = KEYS["ed25519"]
    with pytest.raises(ValueError):
        make_token(ident, 5, "", now=1000)
    with pytest.raises(TokenError) as exc:
        token_claims_unverified("")
    assert exc.value.status == 400
    for garbage in ("abc", "a.b.c", "x" * 5000):
        with pytest.raises(TokenError) as exc:
            token_claims_unverified(garbage)
        assert exc.value.status == 401
    # sid == "" built by hand with a valid signature is still refused
    import base64, json
    enc = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
    h = enc(b'{"alg":"RS512","typ":"JWT"}')
    for claims, reason in (({"sub": 5, "sid": "", "iat": 1, "exp": 2}, "sid is empty"),
                           ({"sid": None, "iat": 1, "exp": 2}, "no valid sub"),
                           ({"sub": 5, "sid": None, "iat": 1}, "no valid exp")):
        c = enc(json.dumps(claims).encode())
        tok = f"{h}.{c}.{enc(ident.sign(f'{h}.{c}'.encode()))}"
        with pytest.raises(TokenError, match=reason):
            verify_token(tok, ident.account, now=1)
    # another algorithm label is refused
    h2 = enc(b'{"alg":"HS256","typ":"JWT"}')
    c = enc(b'{"sub":5,"sid":null,"iat":1,"exp":2}')
    with pytest.raises(TokenError, match="unsupported token algorithm"):
        token_claims_unverified(f"{h2}.{c}.{enc(ident.sign(f'{h2}.{c}'.encode()))}")


def test_e2e_round_trip_tamper_and_wrong_key():
    a, b, c = E2EKey.from_mnemonic(MNEMONIC), E2EKey.from_seed(b"\x05" * 32), E2EKey.from_seed(b"\x06" * 32)
    assert len(a.pk) == 33 and a.pk[0] in (2, 3)
    msg = b"\x00" * 3 + b"payload" * 100
    cipher = encrypt(a, b.pk, msg)
    assert decrypt(b, a.pk, cipher) == msg
    assert encrypt(a, b.pk, msg)[:12] != cipher[:12]  # fresh nonce each time
    for i in (0, 12, len(cipher) - 1):  # nonce, ciphertext, tag
        bad = bytearray(cipher)
        bad[i] ^= 0x01
        with pytest.raises(E2EError, match="decryption failed"):
            decrypt(b, a.pk, bytes(bad))
    with pytest.raises(E2EError, match="decryption failed"):
        decrypt(c, a.pk, cipher)
    with pytest.raises(E2EError, match="too short"):
        decrypt(b, a.pk, cipher[:27])
    with pytest.raises(E2EError, match="bad peer public key"):
        encrypt(a, b"\x04" + bytes(32), msg)


def test_parse_envelope_errors():
    with pytest.raises(EnvelopeError, match="undecodable"):
        parse_envelope(b"\xff\xff\xff\xff")
    with pytest.raises(EnvelopeError, match="empty"):
        parse_envelope(b"")
    big = request_env()
    big.plain = bytes(MAX_ENVELOPE_SIZE)
    with pytest.raises(EnvelopeError, match="too large"):
        parse_envelope(big.SerializeToString())
    with pytest.raises(EnvelopeError, match="too large: 40 bytes > limit 32"):
        parse_envelope(b"\x00" * 40, max_size=32)
    no_dst = Envelope(uid="u", timestamp=1)
    with pytest.raises(EnvelopeError, match="no destination"):
        parse_envelope(no_dst.SerializeToString())
    no_uid = Envelope()
    no_uid.destination.twin = 3
    with pytest.raises(EnvelopeError, match="no uid"):
        parse_envelope(no_uid.SerializeToString())
    with pytest.raises(EnvelopeError, match="not bytes|must be bytes"):
        parse_envelope("text frame")  # type: ignore[arg-type]
    assert issubclass(EnvelopeError, ValueError)


def test_kinds_expiry_addresses():
    env = request_env()
    assert message_kind(env) == "request"
    assert message_kind(Envelope()) == "none"
    p = Envelope()
    p.pong.SetInParent()
    assert message_kind(p) == "pong"
    assert not is_expired(env, 1059.9) and is_expired(env, 1060)
    assert address_str(env.destination) == "22:sid-1" and address_str(env.source) == "11"
    assert len(new_uid()) == 36 and new_uid() != new_uid()


def test_relay_error_shape():
    env = request_env()
    env.source.connection = "peer-sid"
    sign_envelope(env, KEYS["sr25519"])
    err = relay_error(env, "message wrong source")
    wire = Envelope.FromString(err.SerializeToString())
    assert wire.uid == env.uid
    assert not wire.HasField("source") and wire.source.twin == 0
    assert wire.destination.twin == 11 and wire.destination.connection == "peer-sid"
    assert message_kind(wire) == "error"
    assert (wire.error.code, wire.error.message) == (0, "message wrong source")
    assert not wire.HasField("signature")
    assert wire.WhichOneof("payload") is None
    assert parse_envelope(err.SerializeToString()).uid == env.uid


def test_remote_garbage_raises_only_the_documented_errors():
    """Random bytes/strings never escape as anything but EnvelopeError / TokenError."""
    import random
    rng = random.Random(7)
    valid = request_env().SerializeToString()
    parsed = 0
    for _ in range(3000):
        if rng.random() < 0.5:
            data = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 48)))
        else:  # bit flips in a valid envelope
            data = bytearray(valid)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            data = bytes(data)
        try:
            env = parse_envelope(data)
        except EnvelopeError:
            continue
        parsed += 1
        assert env.uid and env.destination.twin
    assert parsed > 0  # the bit-flip half yields some decodable envelopes
    tok = make_token(KEYS["sr25519"], 5, None, now=1000)
    for _ in range(1000):
        chars = list(tok)
        for _ in range(rng.randint(1, 3)):
            chars[rng.randrange(len(chars))] = rng.choice("A_-.=x0{}")
        try:
            verify_token("".join(chars), KEYS["sr25519"].account, now=1000)
        except TokenError as exc:
            assert exc.status == 401


def _b64url(raw: bytes) -> str:
    import base64
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.mark.parametrize("where", ["claims", "claims-member", "header"])
def test_deeply_nested_token_is_a_401_not_a_recursion_error(where):
    """Finding 7: a JWT whose claims nest ~1,200 deep raised RecursionError out of
    json.loads (the relay answered HTTP 500). Now every depth past MAX_TOKEN_JSON_DEPTH,
    and anything orjson refuses, is TokenError(401), in both entry points."""
    from rmb_peer.token import MAX_TOKEN_JSON_DEPTH, MAX_TOKEN_SIZE
    deep = b"[" * 1200 + b"]" * 1200
    header = b'{"alg":"RS512","typ":"JWT"}'
    claims = b'{"sub":5,"sid":null,"iat":1,"exp":2}'
    if where == "claims":
        claims = deep
    elif where == "claims-member":
        claims = b'{"sub":5,"sid":null,"iat":1,"exp":2,"x":' + deep + b"}"
    else:
        header = deep
    tok = f"{_b64url(header)}.{_b64url(claims)}.{_b64url(b'e' * 65)}"
    assert len(tok) <= MAX_TOKEN_SIZE  # it is the depth that is refused, not the size
    for call in (token_claims_unverified, lambda t: verify_token(t, KEYS["ed25519"].account, 1)):
        with pytest.raises(TokenError) as exc:
            call(tok)
        assert exc.value.status == 401
    # just past the documented depth is refused too; at the depth a token still decodes
    over = b'{"sub":5,"sid":null,"iat":1,"exp":2,"x":' + b"[" * MAX_TOKEN_JSON_DEPTH + b"]" * MAX_TOKEN_JSON_DEPTH + b"}"
    hdr = _b64url(b'{"alg":"RS512"}')
    with pytest.raises(TokenError, match="nests deeper"):
        token_claims_unverified(f"{hdr}.{_b64url(over)}.x")
    at = b'{"sub":5,"sid":null,"iat":1,"exp":2,"x":' + b"[" * (MAX_TOKEN_JSON_DEPTH - 1) + b"]" * (MAX_TOKEN_JSON_DEPTH - 1) + b"}"
    assert token_claims_unverified(f"{hdr}.{_b64url(at)}.x")["sub"] == 5


def test_ping_with_destination_twin_0():
    """Finding 8: the official TS client pings with destination twin 0 (or none); rmb-rs
    answers a ping before its destination check. parse_envelope lets a relay do the same
    (allow_ping_without_destination) and keeps refusing every other kind."""
    for with_dst in (True, False):
        ping = Envelope(uid=new_uid(), timestamp=1000, expiration=60)
        ping.source.twin = 11
        if with_dst:
            ping.destination.twin = 0
            ping.destination.connection = "x"  # keep the field present on the wire
        ping.ping.SetInParent()
        data = ping.SerializeToString()
        with pytest.raises(EnvelopeError, match="destination"):
            parse_envelope(data)  # the default is unchanged
        env = parse_envelope(data, allow_ping_without_destination=True)
        assert message_kind(env) == "ping" and env.uid == ping.uid
    req = request_env()
    req.destination.twin = 0
    with pytest.raises(EnvelopeError, match="destination twin is 0"):
        parse_envelope(req.SerializeToString(), allow_ping_without_destination=True)


def test_error_bases():
    """One remote-error base (a ValueError) for every parser, one local-error base that
    is not a ValueError (DESIGN.md section 2)."""
    from rmb_peer.core import AppMessageError, PeerStateError
    from rmb_peer.errors import RmbLocalError, RmbRemoteError
    for cls in (EnvelopeError, TokenError, SignatureError, E2EError, AppMessageError):
        assert issubclass(cls, RmbRemoteError) and issubclass(cls, ValueError)
    assert issubclass(PeerStateError, RmbLocalError) and not issubclass(PeerStateError, ValueError)
