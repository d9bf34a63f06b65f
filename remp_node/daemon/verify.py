"""`remp-node verify` / `python -m remp_node.daemon.verify`: check REMP receipts offline.

    python -m remp_node.daemon.verify --validators NET/network.json receipts.jsonl
    curl -s http://fullnode/messages/<id> | python -m remp_node.daemon.verify --validators keys.json -

Reads receipt JSON (the seed's shape, receipts.to_json) from files or stdin ("-" or no
file): one JSON object, a JSON array of objects, JSON lines, or an object with a
"receipts" array (the full node's `GET /messages/{id}` answer). Reads the network's key set
from `--validators` FILE, any of:
- the network file `remp-node init` writes (network.json: {"zerostate": {"validators":
  [{"public_key": hex}, ...]}, "nodes": [{"role", "public_key", "label"}, ...]}): validator
  keys, plus the full nodes' keys (their own statuses: SentToValidators, RejectedByFullnode,
  the full node's Finalized/Timeout) unless --validators-only;
- a zerostate config ({"validators": [{"public_key": hex}, ...]});
- a JSON list of public keys (64 hex digits) or of {"public_key": hex} objects.

Each receipt is verified by the seed's procedure (seeds/remp-protocol-b.txt, "Checking the
signature of the status"; receipts.verify_receipt_json): JSON -> tonNode.rempReceipt ->
boxed TL bytes -> the key whose key id (sha256 of boxed pub.ed25519) equals source_id ->
ed25519 verify. A JSON without mc_block_* fields gets ever-block's BlockIdExt::default()
as master_id (receipts.NO_MASTER_BLOCK_ID). Unlike the reference snippet, an unknown
source_id is an error here, not a silent pass.

Output: one line per receipt, `ok <kind> <message_id> <source>` or `bad: <reason>: <detail>
(<where>)`, where reason is malformed | unknown_source | bad_signature. Then a summary on
stderr. Exit status: 0 when every receipt is ok, 1 when any is bad, 2 for unusable input
(unreadable file, no receipts, bad key set).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Iterable, TextIO

from ..errors import RempRemoteError
from ..wire.keys import key_id
from ..wire.receipts import ReceiptError, verify_receipt_json

__all__ = ["main", "load_keys", "parse_receipts", "verify_all", "build_parser", "VerifyInputError"]

#: largest input accepted (bytes): a full run's receipts fit easily
MAX_INPUT_BYTES = 256 << 20


class VerifyInputError(RempRemoteError):
    """Unusable input: a key set or receipt source that cannot be read or parsed."""


def _hex_key(value: Any, where: str) -> bytes:
    if isinstance(value, dict):
        value = value.get("public_key")
    if not isinstance(value, str):
        raise VerifyInputError(f"{where}: a public key must be 64 hex digits")
    try:
        pk = bytes.fromhex(value)
    except ValueError:
        raise VerifyInputError(f"{where}: public key {value[:16]!r}... is not hex") from None
    if len(pk) != 32:
        raise VerifyInputError(f"{where}: public key must be 32 bytes, got {len(pk)}")
    return pk


def load_keys(obj: Any, *, validators_only: bool = False) -> dict[bytes, str]:
    """Public keys (32 bytes) -> label ("validator 3", "fullnode fullnode1") from a parsed
    key-set file (see module doc). Raises VerifyInputError."""
    out: dict[bytes, str] = {}
    if isinstance(obj, list):
        for i, v in enumerate(obj):
            out[_hex_key(v, f"key {i}")] = (v.get("label") if isinstance(v, dict) and v.get("label")
                                            else f"validator {i}")
    elif isinstance(obj, dict):
        zs = obj.get("zerostate", obj)
        vals = zs.get("validators") if isinstance(zs, dict) else None
        if isinstance(vals, list):
            for i, v in enumerate(vals):
                out[_hex_key(v, f"validator {i}")] = f"validator {i}"
        nodes = obj.get("nodes")
        if isinstance(nodes, list):
            for i, n in enumerate(nodes):
                if not isinstance(n, dict):
                    raise VerifyInputError(f"node {i} is not an object")
                role = n.get("role", "")
                if role == "fullnode" and validators_only:
                    continue
                pk = _hex_key(n, f"node {i}")
                out[pk] = f"{role or 'node'} {n.get('label', i)}"
        if not out:
            raise VerifyInputError("no 'validators' (zerostate) or 'nodes' (network file) with public keys")
    else:
        raise VerifyInputError("key set must be a JSON list or object")
    if not out:
        raise VerifyInputError("the key set is empty")
    return out


def parse_receipts(text: str, name: str) -> list[tuple[str, Any]]:
    """[(where, receipt JSON value)] from one input's text: a JSON value (object, array, or
    {"receipts": [...]}) or JSON lines. A line that is not JSON becomes a bad entry (its
    `where` names the line), so one broken line does not hide the others."""
    text = text.strip()
    if not text:
        return []
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
        out = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                out.append((f"{name}:{n}", json.loads(line)))
            except json.JSONDecodeError as exc:
                out.append((f"{name}:{n}", _Unparsable(f"not JSON: {exc.msg} at column {exc.colno}")))
        return out
    if isinstance(value, dict) and isinstance(value.get("receipts"), list):
        value = value["receipts"]
    if isinstance(value, list):
        return [(f"{name}[{i}]", v) for i, v in enumerate(value)]
    return [(name, value)]


class _Unparsable:
    def __init__(self, why: str):
        self.why = why


def verify_all(entries: Iterable[tuple[str, Any]], keys: dict[bytes, str], out: TextIO, *,
               quiet: bool = False) -> tuple[int, int]:
    """Verify each entry, print one line each to `out` (only the bad ones when quiet);
    returns (ok count, bad count)."""
    pks = list(keys)
    labels = {key_id(pk): label for pk, label in keys.items()}
    good = bad = 0
    for where, obj in entries:
        if isinstance(obj, _Unparsable):
            print(f"bad: malformed: {obj.why} ({where})", file=out)
            bad += 1
            continue
        try:
            r = verify_receipt_json(obj, pks)
        except ReceiptError as exc:
            print(f"bad: {exc.reason}: {exc.detail} ({where})", file=out)
            bad += 1
            continue
        if not quiet:
            print(f"ok {r.kind} {r.message_id.hex()} {labels.get(r.source_id, r.source_id.hex()[:16])}", file=out)
        good += 1
    return good, bad


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(
        prog="remp-node verify", description="Verify REMP receipt JSON against the network's keys "
        "(seed remp-protocol-b, 'Checking the signature of the status'). Exit 0 all ok, 1 any bad, 2 bad input.")
    p.add_argument("files", nargs="*", metavar="FILE",
                   help="receipt JSON files (object, array, JSON lines, or {\"receipts\": [...]}); "
                        "'-' or none reads stdin")
    p.add_argument("--validators", required=True, metavar="FILE",
                   help="the key set: network.json from `remp-node init`, a zerostate config, "
                        "or a JSON list of public keys (hex)")
    p.add_argument("--validators-only", action="store_true",
                   help="ignore the full nodes' keys of a network file (their own statuses then fail)")
    p.add_argument("--quiet", "-q", action="store_true", help="print only the bad receipts")
    return p


def _read(path: str, stdin: TextIO) -> str:
    if path == "-":
        text = stdin.read(MAX_INPUT_BYTES + 1)
    else:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read(MAX_INPUT_BYTES + 1)
        except (OSError, UnicodeDecodeError) as exc:
            raise VerifyInputError(f"cannot read {path}: {exc}") from None
    if len(text) > MAX_INPUT_BYTES:
        raise VerifyInputError(f"{path} is larger than {MAX_INPUT_BYTES} bytes")
    return text


def main(argv: list[str] | None = None, *, stdin: TextIO | None = None, stdout: TextIO | None = None,
         stderr: TextIO | None = None) -> int:
    """Run the verifier (see module doc); returns the exit status."""
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    args = build_parser().parse_args(argv)
    try:
        try:
            keyobj = json.loads(_read(args.validators, stdin))
        except json.JSONDecodeError as exc:
            raise VerifyInputError(f"{args.validators} is not JSON: {exc}") from None
        keys = load_keys(keyobj, validators_only=args.validators_only)
        entries: list[tuple[str, Any]] = []
        for f in (args.files or ["-"]):
            entries.extend(parse_receipts(_read(f, stdin), "stdin" if f == "-" else f))
        if not entries:
            raise VerifyInputError("no receipts in the input")
    except VerifyInputError as exc:
        print(f"remp-node verify: {exc}", file=stderr)
        return 2

    good, bad = verify_all(entries, keys, stdout, quiet=args.quiet)
    print(f"{good} ok, {bad} bad, {len(keys)} keys", file=stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
