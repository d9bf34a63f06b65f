#!/usr/bin/env bash
# Runs the whole test suite (the README's test command). Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
# the report-page screenshot test (tests/test_spark_screenshot.py) renders the page in
# headless Chromium: on a Debian machine where we are root, install Debian's chromium once
# (~40 s; its output goes to $VENV/setup-apt.log); elsewhere, or with RELAYSUITE_NO_APT=1,
# that one test skips and says why
if ! command -v chromium >/dev/null 2>&1 && [ -z "${RELAYSUITE_NO_APT:-}" ] \
   && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing Debian's chromium for the report-page screenshot test (apt-get, once)" >&2
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } \
    >"$VENV/setup-apt.log" 2>&1 \
    || echo "setup: note: chromium was not installed (see $VENV/setup-apt.log); the screenshot test will skip" >&2
fi
exec python -m pytest -q -p no:cacheprovider "$@"
