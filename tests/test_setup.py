"""The two README commands' set-up: interpreter probing is silent, and requirements.lock pins
every dependency of pyproject.toml (test extras included) exactly, for the pyproject.toml
in the tree (scripts/lock.sh regenerates it)."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "requirements.lock"


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_probing_interpreters_prints_nothing_but_the_choice(tmp_path):
    # a pyenv shim for versions that are not installed: prints to stderr, exits 127
    shims = tmp_path / "shims"
    shims.mkdir()
    for v in ("python3.13", "python3.12"):
        shim = shims / v
        shim.write_text(f"#!/bin/sh\necho 'pyenv: {v}: command not found' >&2\nexit 127\n")
        shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env["PATH"] = f"{shims}:{Path(sys.executable).parent}:{env['PATH']}"
    proc = subprocess.run(["bash", str(REPO / "scripts" / "find-python.sh")], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 0 and proc.stderr == ""
    chosen = proc.stdout.strip()
    version = subprocess.run([chosen, "-c", "import sys; print(sys.version_info >= (3, 11))"],
                             capture_output=True, text=True, env=env, timeout=60).stdout.strip()
    assert version == "True"


def test_no_interpreter_is_one_error_line(tmp_path):
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert "find-python.sh" in setup
    bin_dir = tmp_path / "bin"   # the shell tools setup.sh needs, and no python at all
    bin_dir.mkdir()
    for tool in ("bash", "dirname"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    proc = subprocess.run([str(bin_dir / "bash"), "-c", f"source {REPO / 'scripts' / 'setup.sh'}"],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": str(bin_dir), "HOME": str(tmp_path),
                               "RELAYSUITE_VENV": str(tmp_path / "venv")})
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "error: Python 3.11 or newer is required (set PYTHON=/path/to/python3.11)"]
    assert not (tmp_path / "venv").exists()


def test_the_lock_pins_every_dependency_exactly_for_this_pyproject():
    text = LOCK.read_text()
    pins = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][^\s;]*)", line.strip())
        assert m, f"not an exact pin: {line!r}"
        pins[canon(m.group(1))] = m.group(2)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"]) + [d for ds in project["optional-dependencies"].values() for d in ds]
    direct = {canon(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", d).group(0)) for d in wanted}
    assert direct - set(pins) == set(), "run bash scripts/lock.sh"
    assert "relay-suite" not in pins
    stamp = re.search(r"^# pyproject.toml sha256: ([0-9a-f]{64})$", text, re.M)
    assert stamp and stamp.group(1) == hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest(), \
        "requirements.lock was made from another pyproject.toml: run bash scripts/lock.sh"
