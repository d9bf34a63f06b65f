#!/usr/bin/env bash
# Runs the whole test suite (the README's test command). Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
exec python -m pytest -q -p no:cacheprovider "$@"
