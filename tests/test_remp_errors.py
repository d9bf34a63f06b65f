"""REMP's two error bases (remp_node/errors.py; DESIGN.md section 2): every error type of
the REMP codecs and cores derives from exactly one of RempRemoteError (a ValueError: a peer
sent something we drop) and RempLocalError (never a ValueError: we misused an API); every
remote error's reason is a metric label; the consensus core uses no exception for control
flow (a refused datagram is a returned verdict, not a raised one)."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path
import importlib
import pkgutil

import pytest

import remp_node
from remp_node import errors
from remp_node.core import catchain, consensus, rmq, validator
from remp_node.wire import tl
from remp_node.wire import packets as wire
from remp_node.errors import REASON_RE, RempLocalError, RempRemoteError

#: every module of remp_node (the wire codecs, the cores, the transport, the daemons, the API)
MODULES = [importlib.import_module(m.name)
           for m in pkgutil.walk_packages(remp_node.__path__, "remp_node.")]

def _error_classes(mod) -> list[type]:
    return [c for _, c in inspect.getmembers(mod, inspect.isclass)
            if issubclass(c, BaseException) and c.__module__ == mod.__name__
            and c not in (RempRemoteError, RempLocalError)]


@pytest.mark.parametrize("mod", MODULES, ids=lambda m: m.__name__)
def test_every_error_type_has_exactly_one_remp_base(mod):
    for cls in _error_classes(mod):
        remote, local = issubclass(cls, RempRemoteError), issubclass(cls, RempLocalError)
        assert remote != local, f"{cls.__qualname__}: remote={remote} local={local}"
        assert issubclass(cls, ValueError) == remote, cls.__qualname__
        if remote:
            assert REASON_RE.match(cls.reason), (cls.__qualname__, cls.reason)


def test_the_bases_are_disjoint_and_a_local_error_is_no_value_error():
    assert issubclass(RempRemoteError, ValueError)
    assert not issubclass(RempLocalError, ValueError)
    assert RempRemoteError("x", "bad_signature").reason == "bad_signature"
    assert RempRemoteError("x").reason == "malformed"


def test_catchain_remote_error_keeps_its_reason_and_detail():
    exc = catchain.CatchainRemoteError("rate_limited", "getDifference too often")
    assert isinstance(exc, RempRemoteError)
    assert exc.reason == "rate_limited" and exc.detail == "getDifference too often"
    assert str(exc) == "rate_limited: getDifference too often"
    assert isinstance(catchain.CatchainUsageError("x"), RempLocalError)


def _literal_first_args(path: Path, names: set[str]) -> list[str]:
    """The string literal first arguments of every call to one of `names` in a module."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                out.append(node.args[0].value)
    return out


def test_message_rejected_is_a_remote_error_whose_reason_is_its_tag():
    from remp_node.core import state
    from remp_node.wire import messages
    with pytest.raises(RempRemoteError) as info:
        messages.parse_external_message(b"not a boc")
    exc = info.value
    assert isinstance(exc, messages.MessageRejected)
    assert exc.reason == exc.code == "deserialize"
    assert str(exc) == exc.text and exc.text.startswith("Can't deserialize message")
    codes = _literal_first_args(Path(messages.__file__), {"MessageRejected"})
    codes += _literal_first_args(Path(state.__file__), {"MessageRejected"})
    assert {"deserialize", "not_external_in", "too_big", "too_deep", "bad_workchain", "unknown_account",
            "pre_execution"} <= set(codes)
    for c in codes:
        assert REASON_RE.match(c), c


def test_every_drop_reason_in_the_cores_is_a_metric_label():
    reasons = _literal_first_args(Path(catchain.__file__), {"CatchainRemoteError"})
    reasons += _literal_first_args(Path(consensus.__file__), {"_Drop"})
    assert len(reasons) >= 10
    for r in reasons:
        assert REASON_RE.match(r), r


@pytest.mark.parametrize("mod", MODULES, ids=lambda m: m.__name__)
def test_no_private_exception_types_for_control_flow(mod):
    private = [c.__qualname__ for c in _error_classes(mod) if c.__name__.startswith("_")]
    assert private == []
    assert not issubclass(consensus._Drop, BaseException)


def test_codec_misuse_is_local_and_short_input_is_remote():
    from remp_node.wire.keys import NodeKey
    key = NodeKey.from_seed(bytes(32))
    with pytest.raises(RempLocalError) as info:
        wire.encode_remp_message(b"x", b"short id", 0, key)
    assert not isinstance(info.value, ValueError)
    with pytest.raises(validator.PayloadError) as info:
        validator.demux(b"\x01" * 5)
    assert info.value.reason == "short_datagram" and "shorter than" in str(info.value)
