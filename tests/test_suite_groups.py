"""The suite's pytest-xdist groups (tests/conftest.py) reach the scheduler: a worker's node
ids carry the `@group` suffix `--dist loadgroup` schedules by (scripts/test.sh). With
pytest-xdist 3.8 on pytest 9 they did not (the suffix was written where pytest no longer
reads it): nothing was grouped and the testnet modules ran on both workers at once."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_netns_tests_carry_their_group_under_loadgroup():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "1", "--dist",
                           "loadgroup", "-v", "tests/test_testnet.py", "-k", "unplaced_node"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "test_testnet.py::test_unplaced_node_and_unknown_topology@netns PASSED" in proc.stdout \
        or "PASSED tests/test_testnet.py::test_unplaced_node_and_unknown_topology@netns" in proc.stdout, \
        proc.stdout[-3000:]
