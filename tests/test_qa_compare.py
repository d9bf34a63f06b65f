"""qa.compare: the regression verdict (a change beyond 10% in CPU per message or in loss),
on result files in bench/result_file.py's shape written to disk and read back by the CLI."""
from __future__ import annotations

import json

import pytest

from qa.compare import compare, main, regressed

BASE = {
    "name": "qa_saturation", "command": "python -m qa.saturation --topology lan", "commit": "abc",
    "date": "2026-11-28T08:00:00+00:00", "source": "measured",
    "figures": {
        "link_model": "loopback+links",
        "rmb.lan.saturation_per_s": 400.0,
        "rmb.lan.round_trip_p99_ms": 35.0,
        "rmb.lan.cpu_ms_per_message.peer_a": 0.170,
        "rmb.lan.cpu_ms_per_message.relay": 0.040,
        "rmb.lan.loss_ratio": 0.0,
        "remp.lan.cpu_ms_per_message.fullnode": 7.6,
        "remp.lan.loss_ratio": 0.002,
    },
}


def result(**changes) -> dict:
    out = json.loads(json.dumps(BASE))
    for k, v in changes.items():
        name = k.replace("__", ".")
        if v is None:
            del out["figures"][name]
        else:
            out["figures"][name] = v
    return out


def run_cli(tmp_path, new: dict, capsys) -> tuple[int, dict[str, str]]:
    (tmp_path / "new.json").write_text(json.dumps(new))
    (tmp_path / "base.json").write_text(json.dumps(BASE))
    rc = main([str(tmp_path / "new.json"), str(tmp_path / "base.json")])
    out = capsys.readouterr().out
    verdicts = {line.split()[0]: line.split()[-1] for line in out.splitlines()[1:-1]}
    return rc, verdicts


def test_equal_within_ten_percent_passes(tmp_path, capsys):
    new = result(rmb__lan__cpu_ms_per_message__peer_a=0.180,      # +5.9%
                 remp__lan__cpu_ms_per_message__fullnode=7.0,       # -7.9%
                 rmb__lan__round_trip_p99_ms=90.0)                  # latency: info only
    rc, v = run_cli(tmp_path, new, capsys)
    assert rc == 0
    assert v["rmb.lan.cpu_ms_per_message.peer_a"] == "equal"
    assert v["remp.lan.cpu_ms_per_message.fullnode"] == "equal"
    assert v["rmb.lan.round_trip_p99_ms"] == "info"
    assert v["rmb.lan.loss_ratio"] == "equal"


def test_cpu_per_message_beyond_ten_percent_is_a_regression(tmp_path, capsys):
    rc, v = run_cli(tmp_path, result(rmb__lan__cpu_ms_per_message__relay=0.045), capsys)   # +12.5%
    assert rc == 1
    assert v["rmb.lan.cpu_ms_per_message.relay"] == "regressed"
    assert v["rmb.lan.cpu_ms_per_message.peer_a"] == "equal"


def test_loss_appearing_from_zero_and_loss_growing_are_regressions(tmp_path, capsys):
    rc, v = run_cli(tmp_path, result(rmb__lan__loss_ratio=0.001, remp__lan__loss_ratio=0.0023), capsys)
    assert rc == 1
    assert v["rmb.lan.loss_ratio"] == "regressed"
    assert v["remp.lan.loss_ratio"] == "regressed"                 # +15%


def test_improvements_pass_and_are_named(tmp_path, capsys):
    rc, v = run_cli(tmp_path, result(rmb__lan__cpu_ms_per_message__peer_a=0.120, remp__lan__loss_ratio=0.0),
                    capsys)
    assert rc == 0
    assert v["rmb.lan.cpu_ms_per_message.peer_a"] == "improved"
    assert v["remp.lan.loss_ratio"] == "improved"


def test_a_missing_deciding_figure_fails_and_a_new_one_does_not(tmp_path, capsys):
    rc, v = run_cli(tmp_path, result(rmb__lan__cpu_ms_per_message__relay=None), capsys)
    assert rc == 1 and v["rmb.lan.cpu_ms_per_message.relay"] == "missing"
    rc, v = run_cli(tmp_path, result(marlin__lan__cpu_ms_per_message__consumer=17.5), capsys)
    assert rc == 0 and v["marlin.lan.cpu_ms_per_message.consumer"] == "new"


def test_unreadable_input_exits_2(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "base.json").write_text(json.dumps(BASE))
    assert main([str(tmp_path / "bad.json"), str(tmp_path / "base.json")]) == 2
    with pytest.raises(ValueError):
        compare({"no": "figures"}, BASE)
    assert not regressed(compare(BASE, BASE))
