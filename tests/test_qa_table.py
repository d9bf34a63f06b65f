"""docs/qa.md's generated tables are current with the committed baselines and soak results
(python -m qa.table), and a soak result is shown with its verdict against the baseline."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from qa import table

REPO = Path(__file__).resolve().parent.parent


def test_docs_qa_is_current():
    assert table.main(["--check"]) == 0, "docs/qa.md is out of date: run python -m qa.table"


def test_a_soak_beyond_ten_percent_shows_as_a_regression(tmp_path):
    (tmp_path / "qa").mkdir()
    (tmp_path / "bench" / "results").mkdir(parents=True)
    base = {"date": "2026-11-28T09:00:00Z", "load_average": [3.0], "figures": {
        "rmb.lan.saturation_per_s": 200.0, "rmb.lan.saturation_bracketed": True, "rmb.lan.rate_per_s": 160.0,
        "rmb.lan.round_trip_p50_ms": 1.0, "rmb.lan.round_trip_p99_ms": 9.0,
        "rmb.lan.cpu_ms_per_message.relay": 0.040, "rmb.lan.lost": 0, "rmb.lan.loss_ratio": 0.0}}
    (tmp_path / "qa" / "baseline-rmb-lan.json").write_text(json.dumps(base))
    soak = json.loads(json.dumps(base))
    soak["figures"]["soak_s"] = 300.0
    soak["figures"]["rmb.lan.cpu_ms_per_message.relay"] = 0.050
    (tmp_path / "bench" / "results" / "qa_saturation-20261128T100000Z.json").write_text(json.dumps(soak))
    text = table.render(tmp_path)
    assert "| rmb | lan | 200 | requests/s | yes |" in text
    assert "REGRESSION: cpu_ms_per_message.relay regressed" in text
    soak["figures"]["rmb.lan.cpu_ms_per_message.relay"] = 0.041
    (tmp_path / "bench" / "results" / "qa_saturation-20261128T100000Z.json").write_text(json.dumps(soak))
    assert "| ok |" in table.render(tmp_path)
    shutil.rmtree(tmp_path / "bench")
