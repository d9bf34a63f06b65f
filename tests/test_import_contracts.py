"""The allowed import directions, checked by import-linter (`lint-imports`) against the
contracts in pyproject.toml ([tool.importlinter]): daemon_runtime imports no protocol
package; no protocol package imports deploy, spark or bench; protocol cores import no
asyncio, aiohttp, redis, websockets or socket, directly or through another module
(DESIGN.md sections 1 and 2)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_lint_imports_keeps_every_contract():
    exe = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(exe), "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "0 broken" in out, out
