"""The allowed import directions, checked by import-linter (`lint-imports`) against the
contracts in pyproject.toml ([tool.importlinter]): daemon_runtime imports no protocol
package; no protocol package imports deploy, spark or bench; protocol cores import no
asyncio, aiohttp, redis, websockets or socket, directly or through another module
(DESIGN.md sections 1 and 2); REMP's subpackages are layered and its codecs and cores read no
clock and open no file (docs/layers.md)."""
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


def test_remp_layer_contracts_are_declared():
    """REMP's layering and its no-clock / no-I/O rule stay contracts: wire codecs at the
    bottom, cores and transport above them, daemons and API above those, test networks on
    top; the codecs and cores import no clock, file, process, thread or network module."""
    import tomllib
    contracts = {c["id"]: c for c in
                 tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]}
    layers = contracts["remp-layers"]
    assert layers["type"] == "layers" and layers["containers"] == ["remp_node"]
    assert layers["layers"] == ["testnet", "daemon : api", "core | transport", "wire", "errors | events"]
    io = contracts["remp-cores-no-clock-no-files"]
    assert {"remp_node.wire", "remp_node.core"} <= set(io["source_modules"])
    assert {"time", "os", "pathlib", "sqlite3", "socket", "asyncio", "threading"} <= set(io["forbidden_modules"])
