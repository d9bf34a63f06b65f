#!/usr/bin/env bash
# Runs the main job (the README's demo command): a local cluster on 127.0.0.1 carrying real
# traffic, then the Spark trace report. Extra arguments go to relay-suite-demo (see --help).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$ROOT"
exec relay-suite-demo "$@"
