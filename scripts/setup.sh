#!/usr/bin/env bash
# Sourced by scripts/test.sh and scripts/demo.sh: makes .venv (Python >= 3.11) and installs
# the exact versions pinned in requirements.lock, then the project itself (editable, with
# its console scripts), whenever pyproject.toml or the lock changed. Nothing else is needed
# on the machine but Python 3.11+ (and Java 17/21 for the Spark report).
# pip's output goes to $VENV/setup.log; on failure its tail is shown.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RELAYSUITE_VENV:-$ROOT/.venv}"
LOCK="$ROOT/requirements.lock"
PY="$(bash "$ROOT/scripts/find-python.sh")" || { echo "error: Python 3.11 or newer is required (set PYTHON=/path/to/python3.11)" >&2; exit 1; }
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV with $PY" >&2
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.relaysuite-installed"
WANT="$(cat "$ROOT/pyproject.toml" "$LOCK" 2>/dev/null | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  LOG="$VENV/setup.log"
  : >"$LOG"
  setup_fail() { tail -20 "$LOG" >&2; echo "error: setup: $1 failed; the full pip output is in $LOG" >&2; exit 1; }
  if [ -f "$LOCK" ]; then
    echo "setup: installing the pinned dependencies (requirements.lock) and relay-suite into $VENV" >&2
    "$VENV/bin/python" -m pip install -r "$LOCK" >>"$LOG" 2>&1 || setup_fail "pip install -r requirements.lock"
    # the project and its console scripts; -c keeps every dependency at its pinned version
    # (a dependency newer than the lock is still installed, and named below)
    "$VENV/bin/python" -m pip install -c "$LOCK" -e "$ROOT[test]" >>"$LOG" 2>&1 || setup_fail "pip install -e .[test]"
    LOCKED_FOR="$(sed -n 's/^# pyproject.toml sha256: //p' "$LOCK")"
    if [ "$LOCKED_FOR" != "$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)" ]; then
      echo "setup: note: requirements.lock was made from another pyproject.toml; run bash scripts/lock.sh and commit the lock" >&2
    fi
  else
    echo "setup: no requirements.lock; installing relay-suite with the newest allowed versions into $VENV" >&2
    "$VENV/bin/python" -m pip install -e "$ROOT[test]" >>"$LOG" 2>&1 || setup_fail "pip install -e .[test]"
  fi
  echo "$WANT" > "$STAMP"
fi
# the trace report's class-data-sharing archive (spark/cds.py: a short report's JVM starts
# from pre-parsed classes), built once per JDK + Spark when Java is present (~1 min)
if [ -z "${RELAYSUITE_NO_CDS:-}" ] && { [ -n "${JAVA_HOME:-}" ] || command -v java >/dev/null 2>&1; }; then
  CDS="$(cd "$ROOT" && "$VENV/bin/python" -m spark.cds --path 2>/dev/null || true)"
  if [ -n "$CDS" ] && [ "$CDS" != "no java" ] && [ ! -f "$CDS" ]; then
    echo "setup: building the trace report's JVM class archive ($CDS, once)" >&2
    (cd "$ROOT" && "$VENV/bin/python" -m spark.cds >>"$VENV/setup.log" 2>&1) \
      || echo "setup: note: the JVM class archive was not built (see $VENV/setup.log); reports run without it" >&2
  fi
fi
export PATH="$VENV/bin:$PATH"
export VIRTUAL_ENV="$VENV"
export PYSPARK_PYTHON="$VENV/bin/python"
export PYSPARK_DRIVER_PYTHON="$VENV/bin/python"
