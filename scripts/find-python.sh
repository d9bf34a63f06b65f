#!/usr/bin/env bash
# Prints the first Python >= 3.11 on PATH ($PYTHON if set), nothing else; exit 1 if none.
# Probing is silent: a pyenv shim for a version that is not installed prints its
# "command not found" to stderr, which goes to /dev/null here.
for cand in ${PYTHON:-} python3.13 python3.12 python3.11 python3; do
  if command -v "$cand" >/dev/null 2>&1 &&
     "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
    echo "$cand"; exit 0
  fi
done
exit 1
