"""Peer -> relay authentication token (DESIGN.md section 3; rmb-rs `token`).

The JWT is the whole query string of the WebSocket URL: ws://host:port/?<jwt>.
Header exactly {"alg":"RS512","typ":"JWT"} (the label is fixed whatever the key type).
Claims {"sub": twin_id, "sid": session id or null (never ""), "iat": now, "exp": now+ttl}
(unix seconds). Signed bytes: ASCII b64url(header) + "." + b64url(claims), no pre-hash.
Signature = 65-byte typed signature (b"e"/b"s" + 64 bytes), base64url without padding.

PyJWT does the JWS framing through a private PyJWS instance on which our typed-signature
algorithm is registered under the "RS512" label (the global PyJWT registry is untouched).
"""
from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import orjson

import jwt
from jwt.algorithms import Algorithm
from jwt.api_jws import PyJWS

from rmb_peer.errors import RmbRemoteError
from rmb_peer.identity import Identity, SignatureError, verify_typed

__all__ = ["TokenError", "make_token", "token_claims_unverified", "verify_token",
           "JWT_ALG", "MAX_TOKEN_SIZE", "MAX_TOKEN_JSON_DEPTH", "MAX_SID_BYTES"]

#: The algorithm label rmb-rs writes in the header, whatever the key type.
JWT_ALG = "RS512"

#: Upper bound for a token string, characters (query strings are short).
MAX_TOKEN_SIZE = 4096

#: Deepest nesting accepted in the token's header or claims JSON (both are flat objects in
#: rmb-rs, rmb-sdk-go and the TS client: depth 1; headroom for extra claims). A claims
#: object nested ~1,200 deep used to raise RecursionError out of json.loads (HTTP 500).
MAX_TOKEN_JSON_DEPTH = 4

#: Longest session id (the token's "sid"), UTF-8 bytes. rmb-rs sets no bound of its own
#: (`Claims.sid: Option<String>` in its src/token/mod.rs; its peer sends null, and the
#: official clients rmb-sdk-go and @threefold/rmb_direct_client send a caller-chosen name,
#: in practice a short label or a UUID); the sid is carried in every envelope's address
#: and names the session's offline queue in Redis, so the relay bounds it: 128 bytes keeps
#: every such name (a UUID is 36) and refuses the kilobyte ids a client could send.
MAX_SID_BYTES = 128


class TokenError(RmbRemoteError):
    """Authentication refused. `status`: HTTP status the relay answers (400 no query,
    401 bad/expired token or unknown twin, 500 lookup failure); `reason`: precise text."""

    def __init__(self, status: int, reason: str):
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


class TypedSignatureAlgorithm(Algorithm):
    """PyJWT algorithm: sign -> Identity.sign (65-byte typed signature); verify ->
    verify_typed with a 32-byte account key. Keys: Identity to sign, bytes to verify."""

    def prepare_key(self, key: Any) -> Any:
        if isinstance(key, Identity):
            return key
        if isinstance(key, (bytes, bytearray)) and len(key) == 32:
            return bytes(key)
        raise jwt.InvalidKeyError("key must be an Identity (sign) or a 32-byte account key (verify)")

    def sign(self, msg: bytes, key: Any) -> bytes:
        if not isinstance(key, Identity):
            raise jwt.InvalidKeyError("signing needs an Identity")
        return key.sign(msg)

    def verify(self, msg: bytes, key: Any, sig: bytes) -> bool:
        try:
            verify_typed(key.account if isinstance(key, Identity) else key, msg, sig)
        except SignatureError:
            return False
        return True

    @staticmethod
    def to_jwk(key_obj: Any, as_dict: bool = False):  # pragma: no cover - not used
        raise NotImplementedError("typed signatures have no JWK form")

    @staticmethod
    def from_jwk(jwk: Any):  # pragma: no cover - not used
        raise NotImplementedError("typed signatures have no JWK form")


_JWS = PyJWS(algorithms=[])
_JWS.register_algorithm(JWT_ALG, TypedSignatureAlgorithm())


def claims_json(twin_id: int, sid: str | None, iat: int, exp: int) -> bytes:
    """Compact JSON of the claims, in rmb-rs field order sub, sid, iat, exp."""
    return json.dumps({"sub": int(twin_id), "sid": sid, "iat": int(iat), "exp": int(exp)},
                      separators=(",", ":")).encode()


def make_token(identity: Identity, twin_id: int, sid: str | None, now: int, ttl: int = 60) -> str:
    """A JWT for twin `twin_id` and session `sid` (None = the rmb-peer session), valid from
    `now` (unix s) for `ttl` seconds. Raises ValueError for sid == "" (rmb-rs refuses it)
    or a sid longer than MAX_SID_BYTES (relays refuse it)."""
    if sid == "":
        raise ValueError('sid must be None or non-empty (rmb-rs refuses "")')
    if sid is not None and len(sid.encode("utf-8", "surrogatepass")) > MAX_SID_BYTES:
        raise ValueError(f"sid longer than {MAX_SID_BYTES} bytes (relays refuse it)")
    payload = claims_json(twin_id, sid, int(now), int(now) + int(ttl))
    return _JWS.encode(payload, identity, algorithm=JWT_ALG, headers={"typ": "JWT"})


def _depth(obj: Any) -> int:
    """Nesting depth of a parsed JSON value (scalars 0, {} / [] 1, ...), without recursion."""
    deepest = 0
    stack = [(obj, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = value.values()
        elif not isinstance(value, list):
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if deepest > MAX_TOKEN_JSON_DEPTH:
                return deepest
        stack.extend((v, depth) for v in value)
    return deepest


def _segment(part: str, what: str) -> Any:
    """One base64url JSON segment of the token, bounded: orjson (no Python recursion; it
    stops at depth 1024) and then MAX_TOKEN_JSON_DEPTH. Raises TokenError(401)."""
    try:
        raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        raise TokenError(401, f"undecodable token: {what} is not base64url") from None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TokenError(401, f"undecodable token: {what} is not JSON ({exc})") from None
    if _depth(obj) > MAX_TOKEN_JSON_DEPTH:
        raise TokenError(401, f"undecodable token: {what} nests deeper than {MAX_TOKEN_JSON_DEPTH}")
    return obj


def _split(token: str) -> dict:
    if not token:
        raise TokenError(400, "missing token")
    if not isinstance(token, str):
        raise TokenError(401, "token is not text")
    if len(token) > MAX_TOKEN_SIZE:
        raise TokenError(401, f"token too large: {len(token)} > {MAX_TOKEN_SIZE} chars")
    parts = token.split(".")
    if len(parts) != 3:
        raise TokenError(401, f"undecodable token: {len(parts)} segments, expected 3")
    if not token.isascii():
        raise TokenError(401, "undecodable token: not ASCII")
    header = _segment(parts[0], "header")
    claims = _segment(parts[1], "claims")
    if not isinstance(header, dict):
        raise TokenError(401, "undecodable token: header is not an object")
    if header.get("alg") != JWT_ALG:
        raise TokenError(401, f"unsupported token algorithm {header.get('alg')!r}")
    if not isinstance(claims, dict):
        raise TokenError(401, "token claims are not an object")
    sub = claims.get("sub")
    if not isinstance(sub, int) or isinstance(sub, bool) or not (0 < sub < 2**32):
        raise TokenError(401, "token has no valid sub (twin id)")
    sid = claims.get("sid")  # rmb-sdk-go omits "sid" for the default session
    claims["sid"] = sid
    if sid is not None and not isinstance(sid, str):
        raise TokenError(401, "token sid is not a string or null")
    if sid == "":
        raise TokenError(401, "token sid is empty")
    if sid is not None and len(sid.encode("utf-8", "surrogatepass")) > MAX_SID_BYTES:
        raise TokenError(401, f"token sid longer than {MAX_SID_BYTES} bytes")
    for name in ("iat", "exp"):
        val = claims.get(name)
        if not isinstance(val, int) or isinstance(val, bool):
            raise TokenError(401, f"token has no valid {name}")
    return claims


def token_claims_unverified(token: str) -> dict:
    """Decode the claims without checking the signature (the relay needs `sub` to look the
    twin up first). Returns {"sub": int, "sid": str|None, "iat": int, "exp": int} (a
    missing "sid", as rmb-sdk-go sends for the default session, reads as None).
    Raises TokenError(400) for an empty token, TokenError(401) for: longer than
    MAX_TOKEN_SIZE chars, not three base64url segments, header or claims not JSON or nested
    deeper than MAX_TOKEN_JSON_DEPTH, a header alg other than RS512, missing/invalid
    sub/iat/exp, sid == "" or longer than MAX_SID_BYTES. Never anything else (tests/test_rmb_fuzz.py)."""
    return _split(token)


def verify_token(token: str, account: bytes, now: int) -> tuple[int, str | None]:
    """Check `token` against the twin's 32-byte account key at `now` (unix s).
    Returns (twin_id, sid). Raises TokenError(401): "token expired" when now > exp,
    "invalid token signature" when the typed signature does not verify, or the decode
    reasons of token_claims_unverified."""
    claims = _split(token)
    if now > claims["exp"]:
        raise TokenError(401, "token expired")
    try:
        _JWS.decode_complete(token, key=bytes(account), algorithms=[JWT_ALG])
    except jwt.InvalidKeyError as exc:
        raise TokenError(401, f"bad account key: {exc}") from None
    except jwt.InvalidSignatureError:
        raise TokenError(401, "invalid token signature") from None
    except (jwt.InvalidTokenError, ValueError) as exc:
        raise TokenError(401, f"invalid token: {exc}") from None
    return claims["sub"], claims["sid"]
