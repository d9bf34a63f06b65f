#!/usr/bin/env bash
# Regenerates requirements.lock: every dependency of relay-suite, test extras included, at
# the exact version pip resolves today from pyproject.toml, installed into a fresh
# throw-away venv and frozen (the project itself left out). Run it when pyproject.toml's
# dependencies change or to upgrade deliberately, then run the tests and commit the lock.
#   bash scripts/lock.sh            # writes requirements.lock
#   bash scripts/lock.sh OUT        # writes OUT instead
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/requirements.lock}"
PY="$(bash "$ROOT/scripts/find-python.sh")" || { echo "error: Python 3.11 or newer is required" >&2; exit 1; }
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
echo "lock: resolving pyproject.toml [test] in a fresh venv ($("$PY" --version))" >&2
"$PY" -m venv "$TMP/venv"
if ! "$TMP/venv/bin/python" -m pip install -q "$ROOT[test]" >"$TMP/pip.log" 2>&1; then
  tail -20 "$TMP/pip.log" >&2; echo "error: pip could not install relay-suite[test]" >&2; exit 1
fi
{
  echo "# requirements.lock: exact versions of every dependency of relay-suite (test extras"
  echo "# included), as installed by scripts/lock.sh into a fresh venv. scripts/setup.sh installs"
  echo "# from it. Upgrade deliberately: bash scripts/lock.sh, run the tests, commit."
  echo "# python: $("$TMP/venv/bin/python" -c 'import sys; print(".".join(map(str, sys.version_info[:3])))')"
  echo "# pyproject.toml sha256: $(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
  "$TMP/venv/bin/python" -m pip freeze --exclude relay-suite | LC_ALL=C sort -f
} >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "lock: wrote $OUT ($(grep -vc '^#' "$OUT") packages)" >&2
