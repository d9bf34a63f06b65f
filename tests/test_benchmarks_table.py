"""Benchmark figures are data: every bench/results/*.json is a result as
bench/result_file.py writes it, docs/benchmarks.md is exactly what
scripts/benchmarks_table.py makes of them, and write_result round-trips."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.script_module import load

REPO = Path(__file__).resolve().parent.parent




table = load("scripts/benchmarks_table.py")
result_file = load("bench/result_file.py")

FIELDS = {"name", "command", "commit", "date", "cores", "load_average", "figures", "baseline",
          "ratio", "source", "notes"}


def test_committed_results_are_results():
    results = table.load_results()
    assert results, "bench/results/ holds no result: docs/benchmarks.md would be empty"
    for r in results:
        assert FIELDS <= set(r), f"{r['_file']} lacks {sorted(FIELDS - set(r))}"
        assert r["_file"].startswith(r["name"] + "-"), r["_file"]
        assert r["date"] and r["date"].endswith("Z"), f"{r['_file']}: date must be UTC"
        for kind in ("figures", "baseline", "ratio"):
            for k, v in (r[kind] or {}).items():
                assert v is None or isinstance(v, (int, float, str, bool)), (r["_file"], kind, k)


def test_benchmarks_page_is_generated_from_the_results():
    """Fails when a result was added or changed without `python scripts/benchmarks_table.py`."""
    page = (REPO / "docs" / "benchmarks.md").read_text()
    assert page == table.render(table.load_results()), \
        "docs/benchmarks.md is out of date: run python scripts/benchmarks_table.py"
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "benchmarks_table.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_check_mode_reports_a_stale_page(tmp_path):
    (tmp_path / "results").mkdir()
    r = result_file.build_result("demo_bench", {"x_ms": 1.5}, argv=["bench/x.py"],
                                 commit="0" * 40, date="2026-01-02T03:04:05Z")
    (tmp_path / "results" / "demo_bench-20260102T030405Z.json").write_text(json.dumps(r))
    page = tmp_path / "benchmarks.md"
    args = ["--results", str(tmp_path / "results"), "--out", str(page)]
    assert table.main(args + ["--check"]) == 1                 # no page yet
    assert table.main(args) == 0
    assert table.main(args + ["--check"]) == 0
    assert "| x_ms | 1.5 |" in page.read_text()


def test_write_result_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAY_BENCH_RESULTS", str(tmp_path))
    argv = [sys.executable, str(REPO / "bench" / "bench_relay.py"), "--rounds", "3"]
    path = result_file.write_result("relay", {"envelopes_per_s": 12345, "p99_ms": 3.25},
                                    baseline={"raw_per_s": 20000}, ratio={"relay/raw": 0.617},
                                    argv=argv)
    r = json.loads(path.read_text())
    assert path.name.startswith("relay-") and path.suffix == ".json"
    assert set(r) == FIELDS
    assert r["command"] == "python bench/bench_relay.py --rounds 3"   # no machine path
    assert result_file.clean_command(["python", "x.py", "--dir", "/" + "home/ann/run", "--out=/" + "work/a/b",
                                      "--tmp", "/tmp/relay-bench"]) \
        == "python x.py --dir <path>/run --out=<path>/b --tmp /tmp/relay-bench"
    assert r["figures"] == {"envelopes_per_s": 12345, "p99_ms": 3.25}
    assert r["ratio"] == {"relay/raw": 0.617} and r["baseline"] == {"raw_per_s": 20000}
    assert r["commit"] is None or len(r["commit"].split("+")[0]) == 40
    assert r["source"] == "measured" and r["cores"]["count"] >= 1
    assert len(r["load_average"]) == 3
    second = result_file.write_result("relay", {"envelopes_per_s": 1}, argv=argv)
    assert second != path or second.exists()


def test_write_result_refuses_what_would_not_load_back(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAY_BENCH_RESULTS", str(tmp_path))
    with pytest.raises(ValueError, match="not a number"):
        result_file.write_result("relay", {"rows": [1, 2]}, argv=["x"])
    with pytest.raises(ValueError, match="benchmark name"):
        result_file.write_result("Relay Bench", {"x": 1}, argv=["x"])
    monkeypatch.setenv("RELAY_BENCH_RESULTS", "off")
    assert result_file.write_result("relay", {"x": 1}, argv=["x"]) is None
