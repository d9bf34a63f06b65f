#!/usr/bin/env bash
# Runs the main job N times in a row on fresh work dirs; one line per run and a tally.
#   bash scripts/demo-repeat.sh N [--background-load F] [relay-suite-demo args...]
# --background-load F: an unrelated CPU-bound load of F cores during each run (see demo_repeat.py)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
exec python scripts/demo_repeat.py "$@"
