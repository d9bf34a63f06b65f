#!/usr/bin/env bash
# Sourced by scripts/test.sh and scripts/demo.sh: makes .venv (Python >= 3.11) and installs
# the project with its test extras whenever pyproject.toml changed. Nothing else is needed
# on the machine but Python 3.11+ (and Java 17/21 for the Spark report).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RELAYSUITE_VENV:-$ROOT/.venv}"
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in python3.13 python3.12 python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      PY="$cand"; break
    fi
  done
fi
[ -n "$PY" ] || { echo "error: Python 3.11 or newer is required" >&2; exit 1; }
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV with $PY" >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.relaysuite-installed"
WANT="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "setup: installing relay-suite and its dependencies into $VENV" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q -e "$ROOT[test]" >&2
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"
export PYSPARK_PYTHON="$VENV/bin/python"
export PYSPARK_DRIVER_PYTHON="$VENV/bin/python"
