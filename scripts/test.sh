#!/usr/bin/env bash
# Runs the whole test suite (the README's test command). Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
# the report-page screenshot test (tests/test_spark_screenshot.py) renders the page in
# headless Chromium, and the Prometheus rule tests (tests/test_prom_*.py) run promtool and
# prometheus: on a Debian machine where we are root, install Debian's chromium and prometheus
# (which brings promtool) once (~40 s; the output goes to $VENV/setup-apt.log); elsewhere, or
# with RELAYSUITE_NO_APT=1, those tests skip and say why
# (prometheus without its recommends: no node exporter; on a host run by systemd the package
# also starts its own service on :9090, which these tests do not use)
apt_missing=()
command -v chromium >/dev/null 2>&1 || apt_missing+=(chromium)
command -v promtool >/dev/null 2>&1 || apt_missing+=(prometheus)
if [ "${#apt_missing[@]}" -gt 0 ] && [ -z "${RELAYSUITE_NO_APT:-}" ] \
   && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing Debian's ${apt_missing[*]} for the screenshot and Prometheus tests (apt-get, once)" >&2
  { apt-get update -q \
    && { [[ " ${apt_missing[*]} " != *" chromium "* ]] \
         || DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } \
    && { [[ " ${apt_missing[*]} " != *" prometheus "* ]] \
         || DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; }; } \
    >"$VENV/setup-apt.log" 2>&1 \
    || echo "setup: note: ${apt_missing[*]} not installed (see $VENV/setup-apt.log); the tests that need them will skip" >&2
fi
# two pytest workers (pytest-xdist): most of the suite's wall time is daemons waiting on
# each other (sessions, retries), not CPU; tests that share one machine-wide resource (the
# namespace testnet) carry the same xdist_group and run on one worker.
# RELAYSUITE_TEST_WORKERS=0 runs everything in one process.
exec python -m pytest -q -p no:cacheprovider -n "${RELAYSUITE_TEST_WORKERS:-2}" --dist loadgroup "$@"
